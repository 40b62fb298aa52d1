/* Simulated raw memory for the meta device: a private address range handed
 * out top-down (the highest free range that fits, from its top end, as
 * Linux's mmap places the large host allocations a CPU segment is), so the
 * caching allocator above it sees the same sizes, pools, splits, segment
 * counts and segment order as on a real device, while no byte is ever
 * touched. The addresses are never dereferenced (host_accessible is
 * false). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/caching_allocator.h"

/* Far from anything malloc or mmap return on common 64-bit systems, so a
 * simulated address mistaken for a real one stands out in a debugger. */
#define SIM_BASE  ((uintptr_t)1 << (sizeof(uintptr_t) * 8 - 12))
#define SIM_ALIGN ((size_t)512)

typedef struct sim_extent {
    uintptr_t start;
    size_t size;
} sim_extent;

typedef struct sim_memory {
    size_t capacity, used;
    sim_extent *holes; /* free ranges sorted by start, never adjacent */
    size_t n_holes, cap_holes;
    char name[32];
} sim_memory;

static bool holes_reserve(sim_memory *m, size_t n) {
    if (n <= m->cap_holes) return true;
    size_t cap = m->cap_holes ? m->cap_holes * 2 : 16;
    while (cap < n) cap *= 2;
    sim_extent *h = KILN_REALLOC(m->holes, cap * sizeof *h);
    if (!h) return false;
    m->holes = h;
    m->cap_holes = cap;
    return true;
}

static kiln_status sim_alloc(void *ctx, size_t bytes, void **ptr) {
    sim_memory *m = ctx;
    size_t size = (bytes + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    if (size < bytes || size == 0) return KILN_ERR_OUT_OF_MEMORY;
    /* Top-down: the allocator breaks ties between equal free blocks by the
     * lowest address, so segment order decides which block a request takes
     * and how the cache fragments; bottom-up addresses made the planned
     * small ResNet step reserve 10% more than the real one on the CPU. */
    for (size_t i = m->n_holes; i-- > 0;) {
        sim_extent *h = &m->holes[i];
        if (h->size < size) continue;
        *ptr = (void *)(h->start + h->size - size);
        h->size -= size;
        if (h->size == 0) {
            memmove(h, h + 1, (m->n_holes - i - 1) * sizeof *h);
            m->n_holes--;
        }
        m->used += size;
        return KILN_OK;
    }
    return KILN_ERR_OUT_OF_MEMORY;
}

static void sim_free(void *ctx, void *ptr, size_t bytes) {
    sim_memory *m = ctx;
    uintptr_t start = (uintptr_t)ptr;
    size_t size = (bytes + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;
    size_t i = 0;
    while (i < m->n_holes && m->holes[i].start < start) i++;
    m->used -= size;
    bool join_prev = i > 0 && m->holes[i - 1].start + m->holes[i - 1].size == start;
    bool join_next = i < m->n_holes && start + size == m->holes[i].start;
    if (join_prev && join_next) {
        m->holes[i - 1].size += size + m->holes[i].size;
        memmove(&m->holes[i], &m->holes[i + 1], (m->n_holes - i - 1) * sizeof *m->holes);
        m->n_holes--;
    } else if (join_prev) {
        m->holes[i - 1].size += size;
    } else if (join_next) {
        m->holes[i].start = start;
        m->holes[i].size += size;
    } else {
        /* Cannot fail in practice (holes never outnumber allocations + 1);
         * if it does, the range is lost to the simulation, not to the host. */
        if (!holes_reserve(m, m->n_holes + 1)) return;
        memmove(&m->holes[i + 1], &m->holes[i], (m->n_holes - i) * sizeof *m->holes);
        m->holes[i] = (sim_extent){start, size};
        m->n_holes++;
    }
}

static kiln_status sim_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
    sim_memory *m = ctx;
    *free_bytes = m->capacity - m->used;
    *total_bytes = m->capacity;
    return KILN_OK;
}

/* Simulated work finishes at once: events are complete when recorded. The
 * token is any non-NULL value. */
static kiln_status sim_event_record(void *ctx, kiln_alloc_stream stream, void **event) {
    (void)stream;
    *event = ctx;
    return KILN_OK;
}

static bool sim_event_query(void *ctx, void *event) {
    (void)ctx, (void)event;
    return true;
}

static void sim_event_noop(void *ctx, void *event) { (void)ctx, (void)event; }

kiln_raw_ops kiln_simulated_raw_ops(size_t capacity, const char *device_name) {
    kiln_raw_ops ops = {0};
    sim_memory *m = KILN_CALLOC(1, sizeof *m);
    if (!m || !holes_reserve(m, 16)) {
        free(m);
        return ops; /* alloc is NULL: kiln_caching_allocator_create refuses it */
    }
    capacity = capacity / SIM_ALIGN * SIM_ALIGN;
    m->capacity = capacity;
    if (capacity) m->holes[m->n_holes++] = (sim_extent){SIM_BASE, capacity};
    snprintf(m->name, sizeof m->name, "%s", device_name ? device_name : "meta");
    ops.ctx = m;
    ops.device_name = m->name;
    ops.host_accessible = false;
    ops.alloc = sim_alloc;
    ops.free = sim_free;
    ops.mem_info = sim_mem_info;
    ops.event_record = sim_event_record;
    ops.event_query = sim_event_query;
    ops.event_synchronize = sim_event_noop;
    ops.event_destroy = sim_event_noop;
    return ops;
}

void kiln_simulated_raw_ops_destroy(kiln_raw_ops *ops) {
    if (!ops || !ops->ctx) return;
    sim_memory *m = ops->ctx;
    free(m->holes);
    free(m);
    *ops = (kiln_raw_ops){0};
}
