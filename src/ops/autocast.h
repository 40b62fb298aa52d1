/* Autocast internals: registration with the dispatcher, the backward
 * engine's suspension, and counters for tests. Public API: kiln/amp.h. */
#ifndef KILN_SRC_OPS_AUTOCAST_H
#define KILN_SRC_OPS_AUTOCAST_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/amp.h"

/* Register the KILN_HOOK_AUTOCAST hook (kiln_init). */
void kiln_autocast_init(void);
/* Turn autocast off for every device type on this thread until the
 * matching resume (the backward engine brackets kiln_backward with them,
 * so formulas run in their inputs' dtypes). Nestable; never fails. */
void kiln_autocast_suspend(void);
void kiln_autocast_resume(void);
/* This thread's weight-cast cache: entries held now, and the lookups it
 * answered since the thread started (tests check reuse). */
void kiln_autocast_cache_stats(size_t *entries, uint64_t *hits);

#endif
