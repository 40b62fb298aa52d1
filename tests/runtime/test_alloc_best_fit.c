/* The caching allocator's free-block index (size bins, a bitmap, a treap
 * per bin; docs/memory.md, "Implementation and speed") against PyTorch's
 * rules: directed cases for best fit across bins, ties, the large bins and
 * many streams, then randomized traces checked, address by address and
 * statistic by statistic, against a naive reference model written here
 * (every block in one array, best fit by a full scan). */
#include <stdint.h>

#include "runtime/caching_allocator.h"
#include "test_util.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* A fake device: bump addresses (never touched), so the model can predict
 * every segment's base; events complete when the test says so. */
typedef struct fake_dev {
    uintptr_t next_addr;
    int n_alloc, n_free;
    bool events_done;
} fake_dev;

static kiln_status fake_alloc(void *ctx, size_t bytes, void **ptr) {
    fake_dev *d = ctx;
    d->n_alloc++;
    *ptr = (void *)d->next_addr;
    d->next_addr += bytes;
    return KILN_OK;
}

static void fake_free(void *ctx, void *ptr, size_t bytes) {
    (void)ptr, (void)bytes;
    ((fake_dev *)ctx)->n_free++;
}

static kiln_status fake_event_record(void *ctx, kiln_alloc_stream stream, void **event) {
    (void)ctx;
    *event = (void *)stream;
    return KILN_OK;
}

static bool fake_event_query(void *ctx, void *event) {
    (void)event;
    return ((fake_dev *)ctx)->events_done;
}

static void fake_event_nop(void *ctx, void *event) { (void)ctx, (void)event; }

static kiln_caching_allocator *make(fake_dev *d, const kiln_alloc_config *cfg) {
    *d = (fake_dev){.next_addr = (uintptr_t)1 << 32};
    kiln_raw_ops ops = {.ctx = d,
                        .device_name = "fake:0",
                        .alloc = fake_alloc,
                        .free = fake_free,
                        .event_record = fake_event_record,
                        .event_query = fake_event_query,
                        .event_synchronize = fake_event_nop,
                        .event_destroy = fake_event_nop};
    kiln_alloc_config def = kiln_alloc_config_default();
    kiln_caching_allocator *a = kiln_caching_allocator_create(&ops, cfg ? cfg : &def);
    CHECK(a != NULL);
    return a;
}

static char *alloc_on(kiln_caching_allocator *a, size_t size, kiln_alloc_stream stream) {
    void *p = NULL;
    CHECK_OK(kiln_caching_allocator_malloc(a, size, stream, &p));
    return p;
}

static kiln_memory_stats stats_of(kiln_caching_allocator *a) {
    kiln_memory_stats s;
    kiln_caching_allocator_stats(a, &s);
    return s;
}

/* ---- Directed cases --------------------------------------------------------------- */

/* Small pool: holes of 4, 1, 3, 1 and 2 KiB between live spacers, in one
 * 2 MiB segment. Each request takes the smallest hole that fits, the
 * lowest address among equal ones; the segment's tail is the largest. */
static void test_small_best_fit(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, NULL);
    const size_t hole[5] = {4 * KIB, 1 * KIB, 3 * KIB, 1 * KIB, 2 * KIB};
    char *h[5], *spacer[5];
    for (int i = 0; i < 5; i++) {
        h[i] = alloc_on(a, hole[i], 1);
        spacer[i] = alloc_on(a, 512, 1);
    }
    CHECK_EQ_I(d.n_alloc, 1);
    for (int i = 0; i < 5; i++) CHECK_OK(kiln_caching_allocator_free(a, h[i]));
    CHECK_EQ_I(stats_of(a).inactive_split[KILN_POOL_SMALL].current, 6); /* five holes and the tail */

    CHECK(alloc_on(a, 1000, 1) == h[1]);          /* 1 KiB: the lower of the two */
    CHECK(alloc_on(a, 1024, 1) == h[3]);          /* then the other */
    CHECK(alloc_on(a, 1025, 1) == h[4]);          /* 1.5 KiB: the 2 KiB hole, split */
    CHECK(alloc_on(a, 512, 1) == h[4] + 1536);    /* its 512-byte rest, an exact fit */
    CHECK(alloc_on(a, 2 * KIB + 1, 1) == h[2]);   /* 2.5 KiB: the 3 KiB hole */
    CHECK(alloc_on(a, 3 * KIB + 512, 1) == h[0]); /* 3.5 KiB: the 4 KiB one, not the tail */
    char *tail_start = spacer[4] + 512;
    CHECK(alloc_on(a, 5 * KIB, 1) == tail_start); /* nothing else fits: the tail */
    CHECK_EQ_I(d.n_alloc, 1);
    /* 1 MiB (the largest small request) still comes from the tail. */
    CHECK(alloc_on(a, MIB, 1) == tail_start + 5 * KIB);
    kiln_caching_allocator_destroy(a);
}

/* Large pool: bins are 64 KiB wide, so one bin holds several sizes and the
 * lookup inside it is a lower bound; from 256 MiB up one bin holds all. */
static void test_large_bins(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, NULL);
    /* Segments of exactly these sizes (>= 10 MiB: rounded to 2 MiB), each
     * a whole free block once freed. The three largest share the last bin,
     * where the lookup is a lower bound by size. */
    const size_t sz[6] = {12 * MIB, 14 * MIB, 12 * MIB, 300 * MIB, 260 * MIB, 512 * MIB};
    char *p[6];
    for (int i = 0; i < 6; i++) p[i] = alloc_on(a, sz[i], 1);
    for (int i = 0; i < 6; i++) CHECK_OK(kiln_caching_allocator_free(a, p[i]));
    CHECK_EQ_I(d.n_alloc, 6);
    CHECK(alloc_on(a, 11 * MIB, 1) == p[0]); /* two 12 MiB blocks: the lower address */
    CHECK(alloc_on(a, 12 * MIB, 1) == p[2]);
    CHECK(alloc_on(a, 12 * MIB + 1, 1) == p[1]); /* 14 MiB, one bin up */
    /* 270 MiB: 260 is too small though in the same bin; 300 fits best. */
    CHECK(alloc_on(a, 270 * MIB, 1) == p[3]);
    CHECK(alloc_on(a, 257 * MIB, 1) == p[4]);
    CHECK(alloc_on(a, 400 * MIB, 1) == p[5]);
    CHECK_EQ_I(d.n_alloc, 6);
    kiln_memory_stats s = stats_of(a);
    /* 11 and 12 MiB in the 12 MiB blocks leave rests <= 1 MiB, not split;
     * the other four leave rests > 1 MiB, split off. */
    CHECK_EQ_I(s.segment[KILN_POOL_LARGE].current, 6);
    CHECK_EQ_I(s.inactive_split[KILN_POOL_LARGE].current, 4); /* 14, 300, 260 and 512 MiB split */
    kiln_caching_allocator_destroy(a);
}

/* Blocks of one stream never serve another, however many streams there
 * are; the per-stream index goes with the stream's last segment. */
static void test_many_streams(void) {
    enum { STREAMS = 40 };
    fake_dev d;
    kiln_caching_allocator *a = make(&d, NULL);
    char *p[STREAMS], *q[STREAMS];
    for (int s = 0; s < STREAMS; s++)
        p[s] = alloc_on(a, 4096 * (size_t)(s + 1), (kiln_alloc_stream)(100 + s));
    CHECK_EQ_I(d.n_alloc, STREAMS);
    for (int s = 0; s < STREAMS; s++) CHECK_OK(kiln_caching_allocator_free(a, p[s]));
    /* In reverse, so the stream looked up last is never the next one. */
    for (int s = STREAMS - 1; s >= 0; s--) {
        q[s] = alloc_on(a, 4096 * (size_t)(s + 1), (kiln_alloc_stream)(100 + s));
        CHECK_MSG(q[s] == p[s], "stream %d got another stream's block", s);
    }
    CHECK_EQ_I(d.n_alloc, STREAMS);
    for (int s = 0; s < STREAMS; s++) CHECK_OK(kiln_caching_allocator_free(a, q[s]));
    CHECK_OK(kiln_caching_allocator_empty_cache(a));
    CHECK_EQ_I(d.n_free, STREAMS);
    /* Streams come back after their records went. */
    char *r = alloc_on(a, 4096, 107), *t = alloc_on(a, 4096, 108);
    CHECK(r != NULL && t != NULL && r != t);
    CHECK_OK(kiln_caching_allocator_free(a, r));
    CHECK(alloc_on(a, 4096, 108) != r);
    CHECK(alloc_on(a, 4096, 107) == r);
    kiln_caching_allocator_destroy(a);
}

/* active = allocated + awaiting events, kept apart from the hot path: its
 * peak while blocks wait, and its totals across an accumulated reset. */
static void test_active_while_pending(void) {
    fake_dev d;
    kiln_caching_allocator *a = make(&d, NULL);
    char *p = alloc_on(a, 4096, 1);
    CHECK_OK(kiln_caching_allocator_record_stream(a, p, 2));
    d.events_done = false;
    CHECK_OK(kiln_caching_allocator_free(a, p)); /* waits: active 1, allocation 0 */
    char *q = alloc_on(a, 8192, 1);              /* active 2 */
    kiln_memory_stats s = stats_of(a);
    CHECK_EQ_I(s.active[KILN_POOL_SMALL].current, 2);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].peak, 2);
    CHECK_EQ_I(s.active_bytes[KILN_POOL_ALL].peak, 4096 + 8192);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].peak, 1);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].freed, 0);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].freed, 1);
    kiln_caching_allocator_reset_accumulated(a);
    kiln_caching_allocator_reset_peak(a);
    d.events_done = true;
    char *r = alloc_on(a, 512, 1); /* polls: p stops waiting */
    s = stats_of(a);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].current, 2); /* q and r */
    CHECK_EQ_I(s.active[KILN_POOL_ALL].freed, 1);   /* p left active after the reset */
    CHECK_EQ_I(s.active[KILN_POOL_ALL].allocated, 1);
    CHECK_EQ_I(s.allocation[KILN_POOL_ALL].freed, 0);
    CHECK_EQ_I(s.active[KILN_POOL_ALL].peak, 2);
    CHECK_EQ_I(s.active_bytes[KILN_POOL_ALL].peak, 4096 + 8192);
    CHECK_EQ_I(s.active_bytes[KILN_POOL_ALL].current, 8192 + 512);
    CHECK_OK(kiln_caching_allocator_free(a, q));
    CHECK_OK(kiln_caching_allocator_free(a, r));
    kiln_caching_allocator_destroy(a);
}

/* ---- The reference model ---------------------------------------------------------- */

enum { M_LARGE = 0, M_SMALL = 1, M_MAX_BLOCKS = 8192, M_MAX_SEGS = 1024, M_STATS = 9 };

typedef struct mblock {
    uintptr_t ptr;
    size_t size, requested;
    int seg;
    bool live;
} mblock;

typedef struct mseg {
    uintptr_t base;
    size_t size;
    kiln_alloc_stream stream;
    int pool;
    bool gone;
} mseg;

/* The per-pool stat arrays in kiln_memory_stats order: allocation,
 * allocated_bytes, requested_bytes, segment, reserved_bytes, active,
 * active_bytes, inactive_split, inactive_split_bytes. */
typedef struct model {
    mblock *b; /* (M_MAX_BLOCKS) every block of every segment, by address */
    int n;
    mseg seg[M_MAX_SEGS];
    int n_seg;
    uintptr_t next_addr;
    uint64_t max_split;
    kiln_stat st[M_STATS][KILN_POOL_KIND_COUNT];
    int64_t oversize_alloc_cur, oversize_alloc_peak, oversize_seg_cur, oversize_seg_peak;
} model;

static size_t m_round(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

static bool m_oversize(const model *m, size_t n) { return (uint64_t)n >= m->max_split; }

static void m_current(const model *m, int64_t cur[M_STATS][2]) {
    memset(cur, 0, sizeof(int64_t) * M_STATS * 2);
    for (int s = 0; s < m->n_seg; s++) {
        if (m->seg[s].gone) continue;
        cur[3][m->seg[s].pool] += 1;
        cur[4][m->seg[s].pool] += (int64_t)m->seg[s].size;
    }
    for (int i = 0; i < m->n; i++) {
        const mblock *x = &m->b[i];
        int pool = m->seg[x->seg].pool;
        bool split = (i > 0 && m->b[i - 1].seg == x->seg) || (i + 1 < m->n && m->b[i + 1].seg == x->seg);
        if (x->live) {
            cur[0][pool] += 1, cur[1][pool] += (int64_t)x->size, cur[2][pool] += (int64_t)x->requested;
            cur[5][pool] += 1, cur[6][pool] += (int64_t)x->size;
        } else if (split) {
            cur[7][pool] += 1, cur[8][pool] += (int64_t)x->size;
        }
    }
}

/* After each operation: every stat moved by its net change (PyTorch's
 * inactive-split accounting); totals and peaks follow from the currents. */
static void m_account(model *m, int64_t before[M_STATS][2]) {
    int64_t after[M_STATS][2];
    m_current(m, after);
    for (int k = 0; k < M_STATS; k++) {
        for (int p = 0; p < 2; p++) {
            kiln_stat *x = &m->st[k][KILN_POOL_LARGE + p];
            int64_t dlt = after[k][p] - before[k][p];
            x->current = after[k][p];
            x->allocated += dlt > 0 ? dlt : 0;
            x->freed += dlt < 0 ? -dlt : 0;
            x->peak = x->current > x->peak ? x->current : x->peak;
        }
        kiln_stat *all = &m->st[k][KILN_POOL_ALL], *l = &m->st[k][KILN_POOL_LARGE],
                  *sm = &m->st[k][KILN_POOL_SMALL];
        all->current = l->current + sm->current;
        all->allocated = l->allocated + sm->allocated;
        all->freed = l->freed + sm->freed;
        all->peak = all->current > all->peak ? all->current : all->peak;
    }
    m->oversize_alloc_cur = m->oversize_seg_cur = 0;
    for (int i = 0; i < m->n; i++) m->oversize_alloc_cur += m->b[i].live && m_oversize(m, m->b[i].size);
    for (int s = 0; s < m->n_seg; s++)
        m->oversize_seg_cur += !m->seg[s].gone && m_oversize(m, m->seg[s].size);
    if (m->oversize_alloc_cur > m->oversize_alloc_peak) m->oversize_alloc_peak = m->oversize_alloc_cur;
    if (m->oversize_seg_cur > m->oversize_seg_peak) m->oversize_seg_peak = m->oversize_seg_cur;
}

static void m_insert(model *m, int at, mblock x) {
    memmove(&m->b[at + 1], &m->b[at], (size_t)(m->n - at) * sizeof *m->b);
    m->b[at] = x;
    m->n++;
}

static void m_erase(model *m, int at) {
    memmove(&m->b[at], &m->b[at + 1], (size_t)(m->n - at - 1) * sizeof *m->b);
    m->n--;
}

static uintptr_t m_malloc(model *m, size_t size, kiln_alloc_stream stream) {
    int64_t before[M_STATS][2];
    m_current(m, before);
    size_t r = m_round(size);
    int pool = r <= MIB ? M_SMALL : M_LARGE;
    int best = -1;
    for (int i = 0; i < m->n; i++) {
        const mblock *x = &m->b[i];
        const mseg *sg = &m->seg[x->seg];
        if (x->live || sg->stream != stream || sg->pool != pool || x->size < r) continue;
        if (best < 0 || x->size < m->b[best].size || (x->size == m->b[best].size && x->ptr < m->b[best].ptr))
            best = i;
    }
    if (best >= 0 && !m_oversize(m, r) && m_oversize(m, m->b[best].size)) best = -1;
    if (best >= 0 && m_oversize(m, r) && m->b[best].size >= r + 20 * MIB) best = -1;
    if (best < 0) { /* a new segment, at the fake device's next address */
        size_t ss = kiln_alloc_segment_size(r);
        m->seg[m->n_seg] = (mseg){m->next_addr, ss, stream, pool, false};
        mblock x = {m->next_addr, ss, 0, m->n_seg, false};
        m->n_seg++;
        m->next_addr += ss;
        best = 0;
        while (best < m->n && m->b[best].ptr < x.ptr) best++;
        m_insert(m, best, x);
    }
    mblock *x = &m->b[best];
    size_t rest = x->size - r;
    bool split = pool == M_SMALL ? rest >= 512 : !m_oversize(m, r) && rest > MIB;
    if (split) {
        x->size = r;
        m_insert(m, best + 1, (mblock){x->ptr + r, rest, 0, x->seg, false});
        x = &m->b[best];
    }
    x->live = true;
    x->requested = size;
    m_account(m, before);
    return x->ptr;
}

static void m_free(model *m, uintptr_t ptr) {
    int64_t before[M_STATS][2];
    m_current(m, before);
    int i = 0;
    while (m->b[i].ptr != ptr) i++;
    m->b[i].live = false;
    m->b[i].requested = 0;
    if (i + 1 < m->n && !m->b[i + 1].live && m->b[i + 1].seg == m->b[i].seg) {
        m->b[i].size += m->b[i + 1].size;
        m_erase(m, i + 1);
    }
    if (i > 0 && !m->b[i - 1].live && m->b[i - 1].seg == m->b[i].seg) {
        m->b[i - 1].size += m->b[i].size;
        m_erase(m, i);
    }
    m_account(m, before);
}

/* empty_cache: every segment that is one free block goes. */
static void m_empty_cache(model *m) {
    int64_t before[M_STATS][2];
    m_current(m, before);
    for (int i = m->n - 1; i >= 0; i--) {
        mblock *x = &m->b[i];
        if (!x->live && x->size == m->seg[x->seg].size) {
            m->seg[x->seg].gone = true;
            m_erase(m, i);
        }
    }
    m_account(m, before);
}

static void m_reset_peak(model *m) {
    for (int k = 0; k < M_STATS; k++)
        for (int p = 0; p < KILN_POOL_KIND_COUNT; p++) m->st[k][p].peak = m->st[k][p].current;
    m->oversize_alloc_peak = m->oversize_alloc_cur;
    m->oversize_seg_peak = m->oversize_seg_cur;
}

static void m_reset_accumulated(model *m) {
    for (int k = 0; k < M_STATS; k++)
        for (int p = 0; p < KILN_POOL_KIND_COUNT; p++) m->st[k][p].allocated = m->st[k][p].freed = 0;
}

static const char *const m_stat_names[M_STATS] = {"allocation",   "allocated_bytes", "requested_bytes",
                                                  "segment",      "reserved_bytes",  "active",
                                                  "active_bytes", "inactive_split",  "inactive_split_bytes"};

static int m_compare(const model *m, kiln_caching_allocator *a, int step) {
    kiln_memory_stats s = stats_of(a);
    const kiln_stat(*got)[KILN_POOL_KIND_COUNT] = &s.allocation;
    int bad = 0;
    static const char *const field[4] = {"current", "peak", "allocated", "freed"};
    for (int k = 0; k < M_STATS; k++) {
        for (int p = 0; p < KILN_POOL_KIND_COUNT; p++) {
            const int64_t g[4] = {got[k][p].current, got[k][p].peak, got[k][p].allocated, got[k][p].freed};
            const int64_t w[4] = {m->st[k][p].current, m->st[k][p].peak, m->st[k][p].allocated,
                                  m->st[k][p].freed};
            for (int f = 0; f < 4; f++) {
                if (g[f] == w[f]) continue;
                if (bad++ < 5)
                    fprintf(stderr, "step %d: %s[%d].%s = %lld, model %lld\n", step, m_stat_names[k], p,
                            field[f], (long long)g[f], (long long)w[f]);
            }
        }
    }
    bad += s.oversize_allocations.current != m->oversize_alloc_cur;
    bad += s.oversize_allocations.peak != m->oversize_alloc_peak;
    bad += s.oversize_segments.current != m->oversize_seg_cur;
    bad += s.oversize_segments.peak != m->oversize_seg_peak;
    return bad;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *s = x;
}

/* A random trace of mallocs (1 B to `max_mib` MiB, log-uniform, three
 * streams), frees in random order, and now and then empty_cache and the
 * two resets, on the allocator and the model side by side. */
static void check_against_model(uint64_t seed, uint64_t max_split, int max_mib) {
    enum { SLOTS = 96, OPS = 6000 };
    fake_dev d;
    kiln_alloc_config cfg = kiln_alloc_config_default();
    if (max_split) cfg.max_split_size = max_split;
    kiln_caching_allocator *a = make(&d, &cfg);
    model *m = calloc(1, sizeof *m);
    m->b = calloc(M_MAX_BLOCKS, sizeof *m->b);
    m->next_addr = (uintptr_t)1 << 32;
    m->max_split = max_split ? max_split : UINT64_MAX;
    void *live[SLOTS] = {0};
    uint64_t rng = seed;
    int addr_bad = 0, stat_bad = 0;
    double log_max = log((double)max_mib * (double)MIB);
    for (int step = 0; step < OPS && m->n < M_MAX_BLOCKS - 4 && m->n_seg < M_MAX_SEGS - 2; step++) {
        uint64_t r = rng_next(&rng);
        int slot = (int)(r % SLOTS);
        if (r % 997 == 0) {
            CHECK_OK(kiln_caching_allocator_empty_cache(a));
            m_empty_cache(m);
        } else if (r % 499 == 0) {
            kiln_caching_allocator_reset_peak(a);
            m_reset_peak(m);
        } else if (r % 503 == 0) {
            kiln_caching_allocator_reset_accumulated(a);
            m_reset_accumulated(m);
        } else if (live[slot]) {
            CHECK_OK(kiln_caching_allocator_free(a, live[slot]));
            m_free(m, (uintptr_t)live[slot]);
            live[slot] = NULL;
        } else {
            double u = (double)(rng_next(&rng) >> 11) / 9007199254740992.0;
            size_t size = (size_t)exp(u * log_max) + 1;
            kiln_alloc_stream stream = 1 + (r >> 32) % 3;
            live[slot] = alloc_on(a, size, stream);
            uintptr_t want = m_malloc(m, size, stream);
            if ((uintptr_t)live[slot] != want && addr_bad++ < 5)
                fprintf(stderr, "seed %llu step %d: malloc(%zu) on stream %llu returned %#llx, model %#llx\n",
                        (unsigned long long)seed, step, size, (unsigned long long)stream,
                        (unsigned long long)(uintptr_t)live[slot], (unsigned long long)want);
            if ((uintptr_t)live[slot] != want) break; /* the traces have diverged */
        }
        if (step % 97 == 0) stat_bad += m_compare(m, a, step);
    }
    for (int s = 0; s < SLOTS && !addr_bad; s++) {
        if (!live[s]) continue;
        CHECK_OK(kiln_caching_allocator_free(a, live[s]));
        m_free(m, (uintptr_t)live[s]);
    }
    if (!addr_bad) stat_bad += m_compare(m, a, OPS);
    CHECK_MSG(addr_bad == 0, "seed %llu: %d addresses differ from the model", (unsigned long long)seed,
              addr_bad);
    CHECK_MSG(stat_bad == 0, "seed %llu: %d statistics differ from the model", (unsigned long long)seed,
              stat_bad);
    CHECK(m->st[0][KILN_POOL_ALL].allocated > 100 || m->st[0][KILN_POOL_ALL].peak > 10);
    free(m->b);
    free(m);
    kiln_caching_allocator_destroy(a);
}

static void test_against_model(void) {
    for (uint64_t seed = 1; seed <= 4; seed++) check_against_model(seed * 7919, 0, 48);
    /* With max_split_size: requests up to 120 MiB around a 40 MiB limit. */
    for (uint64_t seed = 5; seed <= 6; seed++) check_against_model(seed * 7919, 40 * MIB, 120);
}

int main(void) {
    test_small_best_fit();
    test_large_bins();
    test_many_streams();
    test_active_while_pending();
    test_against_model();
    return kt_finish();
}
