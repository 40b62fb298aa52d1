#ifndef KILN_SRC_BASE_LOG_INTERNAL_H
#define KILN_SRC_BASE_LOG_INTERNAL_H
#include "kiln/base.h"
/* Read KILN_LOG from the environment (called by kiln_init). */
void kiln_log_init_from_env(void);
/* Log `message` once per process for `key` (a static string's address). */
void kiln_log_once(const void *key, kiln_log_level level, const char *message);
#endif
