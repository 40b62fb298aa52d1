/* Efficiency counters: always on, one relaxed atomic add each, so they cost
 * next to nothing on the paths they count. The diag layer reads them
 * (kiln_counters_get) and may observe host synchronisations as they happen
 * (the profiler records each as an event). Counters are process-wide. */
#ifndef KILN_SRC_RUNTIME_COUNTERS_H
#define KILN_SRC_RUNTIME_COUNTERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_counter_id {
    KILN_COUNTER_KERNEL_LAUNCHES = 0, /* kernels run by the dispatcher */
    KILN_COUNTER_HOST_SYNCS,          /* the host thread blocked on a device */
    KILN_COUNTER_RAW_ALLOCS,          /* the caching allocator went to the backend */
    KILN_COUNTER_PAGEABLE_COPIES,     /* host<->device copies from/to pageable memory */
    KILN_COUNTER_BYTES_H2D,
    KILN_COUNTER_BYTES_D2H,
    KILN_COUNTER_COUNT
} kiln_counter_id;

extern _Atomic uint64_t kiln_counter_values[KILN_COUNTER_COUNT];

static inline void kiln_counter_add(kiln_counter_id id, uint64_t n) {
    atomic_fetch_add_explicit(&kiln_counter_values[id], n, memory_order_relaxed);
}

/* Copies all counters into out[KILN_COUNTER_COUNT]; reset zeroes them. */
void kiln_counters_read(uint64_t *out);
void kiln_counters_zero(void);

/* Host synchronisations. Wrap the blocking part of a call:
 *     uint64_t t0 = kiln_sync_enter();  ...block...  kiln_sync_leave("name", t0);
 * Nested syncs (kiln_item doing a blocking copy) count once, as the outermost.
 * When an observer is set, it gets each outermost sync with its start and
 * end (CLOCK_MONOTONIC ns) on the thread that blocked. */
typedef void (*kiln_sync_observer)(const char *what, uint64_t start_ns, uint64_t end_ns);
void kiln_counters_set_sync_observer(kiln_sync_observer fn);
uint64_t kiln_sync_enter(void);
void kiln_sync_leave(const char *what, uint64_t start_ns);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t kiln_now_ns(void);

#endif
