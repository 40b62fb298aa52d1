/* Efficiency counters and host-synchronisation accounting. */
#include "runtime/counters.h"

#include <time.h>

_Atomic uint64_t kiln_counter_values[KILN_COUNTER_COUNT];

static _Atomic(kiln_sync_observer) sync_observer;
static _Thread_local int sync_depth;

void kiln_counters_read(uint64_t *out) {
    for (int i = 0; i < KILN_COUNTER_COUNT; i++)
        out[i] = atomic_load_explicit(&kiln_counter_values[i], memory_order_relaxed);
}

void kiln_counters_zero(void) {
    for (int i = 0; i < KILN_COUNTER_COUNT; i++)
        atomic_store_explicit(&kiln_counter_values[i], 0, memory_order_relaxed);
}

uint64_t kiln_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kiln_counters_set_sync_observer(kiln_sync_observer fn) { atomic_store(&sync_observer, fn); }

uint64_t kiln_sync_enter(void) {
    if (sync_depth++ > 0) return 0;
    /* The clock is read only when someone records the sync's time. */
    return atomic_load_explicit(&sync_observer, memory_order_relaxed) ? kiln_now_ns() : 0;
}

void kiln_sync_leave(const char *what, uint64_t start_ns) {
    if (--sync_depth > 0) return;
    kiln_counter_add(KILN_COUNTER_HOST_SYNCS, 1);
    kiln_sync_observer fn = atomic_load_explicit(&sync_observer, memory_order_relaxed);
    if (fn && start_ns) fn(what, start_ns, kiln_now_ns());
}
