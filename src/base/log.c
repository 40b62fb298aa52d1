/* The logger: one mutex serialises sinks, so lines never interleave. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log_internal.h"

static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static kiln_log_sink log_sink;
static void *log_user;
static _Atomic int log_level = KILN_LOG_WARN;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void kiln_log_set_sink(kiln_log_sink sink, void *user) {
    pthread_mutex_lock(&log_mutex);
    log_sink = sink;
    log_user = user;
    pthread_mutex_unlock(&log_mutex);
}

void kiln_log_set_level(kiln_log_level level) {
    if ((unsigned)level > KILN_LOG_OFF) level = KILN_LOG_WARN;
    atomic_store(&log_level, (int)level);
}

kiln_log_level kiln_log_get_level(void) { return (kiln_log_level)atomic_load(&log_level); }

void kiln_log_init_from_env(void) {
    const char *env = getenv("KILN_LOG");
    if (!env || !*env) return;
    for (int i = 0; i <= KILN_LOG_OFF; i++) {
        if (strcasecmp(env, level_names[i]) == 0) {
            kiln_log_set_level((kiln_log_level)i);
            return;
        }
    }
    kiln_log_write(KILN_LOG_WARN, "KILN_LOG=%s not understood (use debug, info, warn, error or off); keeping %s",
             env, level_names[kiln_log_get_level()]);
}

void kiln_log_write(kiln_log_level level, const char *fmt, ...) {
    if ((int)level < atomic_load(&log_level) || level >= KILN_LOG_OFF) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mutex);
    if (log_sink) log_sink(level, line, log_user);
    else fprintf(stderr, "kiln %s: %s\n", level_names[level], line);
    pthread_mutex_unlock(&log_mutex);
}

void kiln_log_once(const void *key, kiln_log_level level, const char *message) {
    /* A small fixed table is enough: one-time warnings are few and static. */
    static const void *seen[256];
    static int n_seen;
    pthread_mutex_lock(&log_mutex);
    for (int i = 0; i < n_seen; i++) {
        if (seen[i] == key) {
            pthread_mutex_unlock(&log_mutex);
            return;
        }
    }
    if (n_seen < 256) seen[n_seen++] = key;
    pthread_mutex_unlock(&log_mutex);
    kiln_log_write(level, "%s", message);
}
