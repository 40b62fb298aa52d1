/* The profiler: recording, the schedule and the counters API.
 *
 * Each thread appends to its own buffer (one uncontended lock per record),
 * created on first use and kept for the life of the process, so a thread
 * never sees its buffer vanish. A generation number stamps each buffer's
 * contents: clearing a buffer bumps it, and a record opened before the
 * clear is dropped when it closes. Collecting (at the last active step or
 * at stop) merges every buffer into one result, resolving device times
 * from the events recorded around each kernel. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/error.h"
#include "kernels/nn_geometry.h"
#include "base/nvtx.h"
#include "diag/profiler_internal.h"
#include "ops/op_registry.h"
#include "runtime/counters.h"
#include "runtime/runtime_internal.h"

#define PROF_MAX_DEPTH 128

/* A record being written; device events are pending until collected. */
typedef struct prof_event {
    prof_record r;
    bool open;
    kiln_event *ev_start, *ev_end; /* devices other than the CPU */
} prof_event;

typedef struct prof_thread {
    pthread_mutex_t lock;
    uint64_t tid;
    uint32_t gen;
    prof_event *ev;
    size_t n, cap;
    int64_t stack[PROF_MAX_DEPTH]; /* indices of open records */
    int depth;
    struct prof_thread *next;
} prof_thread;

/* A device's clock anchor: host time when a reference event was recorded. */
typedef struct prof_anchor {
    kiln_event *ev;
    uint64_t host_ns;
} prof_anchor;

static _Atomic int recording;      /* the current step profiles */
static _Atomic uint32_t generation = 1;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static prof_thread *threads;
static bool running;
static kiln_profiler_opts options;
static int64_t step_num;
static kiln_profiler_action action;
static kiln_counters step_start_counters, last_step_counters;
static prof_anchor anchors[KILN_DEVICE_TYPE_COUNT][KILN_MAX_DEVICES];
static pthread_mutex_t result_lock = PTHREAD_MUTEX_INITIALIZER;
static prof_result result;
static _Thread_local prof_thread *tls_thread;

/* ---- Per-thread buffers ---------------------------------------------------------- */

static prof_thread *this_thread(void) {
    if (tls_thread) return tls_thread;
    prof_thread *t = KILN_CALLOC(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->lock, NULL);
    t->tid = (uint64_t)syscall(SYS_gettid);
    pthread_mutex_lock(&state_lock);
    t->gen = atomic_load(&generation);
    t->next = threads;
    threads = t;
    pthread_mutex_unlock(&state_lock);
    tls_thread = t;
    return t;
}

/* Drop a buffer's contents. Called with t->lock held. */
static void thread_clear(prof_thread *t, uint32_t gen) {
    for (size_t i = 0; i < t->n; i++) {
        free(t->ev[i].r.name);
        kiln_event_destroy(t->ev[i].ev_start);
        kiln_event_destroy(t->ev[i].ev_end);
    }
    t->n = 0;
    t->depth = 0;
    t->gen = gen;
}

/* Clear every buffer. Called with state_lock held. */
static void clear_all(void) {
    uint32_t gen = atomic_fetch_add(&generation, 1) + 1;
    for (prof_thread *t = threads; t; t = t->next) {
        pthread_mutex_lock(&t->lock);
        thread_clear(t, gen);
        pthread_mutex_unlock(&t->lock);
    }
}

/* Open a record on this thread; returns a token for close (0: none). The
 * token packs the generation and the index, so a stale one is recognised. */
static uint64_t open_record(const char *name, prof_kind kind, uint64_t start_ns) {
    prof_thread *t = this_thread();
    if (!t) return 0;
    uint64_t token = 0;
    pthread_mutex_lock(&t->lock);
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        prof_event *ev = KILN_REALLOC(t->ev, cap * sizeof *ev);
        if (!ev) goto out;
        t->ev = ev, t->cap = cap;
    }
    char *copy = strdup(name ? name : "(null)");
    if (!copy) goto out;
    int64_t idx = (int64_t)t->n++;
    prof_event *e = &t->ev[idx];
    memset(e, 0, sizeof *e);
    e->r.name = copy;
    e->r.kind = kind;
    e->r.tid = t->tid;
    e->r.parent = t->depth > 0 ? t->stack[t->depth - 1] : -1;
    e->r.start_ns = start_ns ? start_ns : kiln_now_ns();
    e->open = true;
    if (kind == PROF_ASYNC) e->r.parent = -1;
    if (kind != PROF_SYNC && kind != PROF_ASYNC && t->depth < PROF_MAX_DEPTH) t->stack[t->depth++] = idx;
    token = ((uint64_t)t->gen << 32) | (uint64_t)(idx + 1);
out:
    pthread_mutex_unlock(&t->lock);
    return token;
}

/* The open record behind a token, with t->lock held; NULL when stale. */
static prof_event *record_of(prof_thread *t, uint64_t token) {
    if (!token || (uint32_t)(token >> 32) != t->gen) return NULL;
    size_t idx = (size_t)(token & 0xffffffffu) - 1;
    return idx < t->n ? &t->ev[idx] : NULL;
}

static void close_record(uint64_t token, uint64_t out_bytes, uint64_t flops) {
    prof_thread *t = tls_thread;
    if (!t || !token) return;
    uint64_t now = kiln_now_ns();
    pthread_mutex_lock(&t->lock);
    prof_event *e = record_of(t, token);
    if (e && e->open) {
        e->open = false;
        e->r.end_ns = now;
        e->r.out_bytes = out_bytes;
        e->r.flops = flops;
        int64_t idx = e - t->ev;
        /* Ranges popped out of order close everything opened above them. */
        for (int d = t->depth - 1; d >= 0; d--)
            if (t->stack[d] == idx) {
                t->depth = d;
                break;
            }
    }
    pthread_mutex_unlock(&t->lock);
}

/* ---- Dispatcher hook and observer ---------------------------------------------------- */

static kiln_status hook_begin(kiln_op_call *c) {
    c->hook_state[KILN_HOOK_PROFILER] = NULL;
    if (!atomic_load_explicit(&recording, memory_order_relaxed)) return KILN_OK;
    c->hook_state[KILN_HOOK_PROFILER] = (void *)(uintptr_t)open_record(c->info->name, PROF_OP, 0);
    return KILN_OK;
}

static uint64_t output_bytes(const kiln_op_call *c) {
    if (c->info->flags & OPF_VIEW) return 0;
    uint64_t bytes = 0;
    for (int i = 0; i < c->n_out; i++) {
        if (!c->out[i] || (i == 0 && (c->info->flags & OPF_INPLACE))) continue;
        bytes += (uint64_t)kiln_numel(c->out[i]) * kiln_dtype_size(kiln_dtype_of(c->out[i]));
    }
    return bytes;
}

static double numel_of(const kiln_tensor *t) { return t ? (double)kiln_numel(t) : 0; }

static int64_t dim_of(const kiln_tensor *t, int d) {
    return t && d < kiln_ndim(t) ? kiln_size(t, d) : 0;
}

/* The op's floating-point operations, a multiply-add counting 2 (as
 * PyTorch's profiler counts with with_flops=True), for the ops that carry
 * a step's arithmetic: convolutions in their three passes and matrix
 * products. Every pass of a convolution does 2 x (elements of the output
 * of the forward) x (C/groups x kH x kW) multiply-adds' worth. 0 otherwise. */
static uint64_t op_flops(const kiln_op_call *c) {
    const kiln_tensor *a = c->in[0], *b = c->n_in > 1 ? c->in[1] : NULL, *y = c->out[0];
    if (!a || !y) return 0;
    double f = 0;
    switch (c->op) {
    case KILN_OP_CONV2D:
    case KILN_OP_CONV2D_RELU: /* (x, weight (O, C/g, kH, kW)) -> y */
        if (b && dim_of(b, 0) > 0) f = 2.0 * numel_of(y) * (numel_of(b) / (double)dim_of(b, 0));
        break;
    case KILN_OP_CONV2D_RELU_MAX_POOL2D: /* the convolution's output is (N, O, Ho, Wo) before the pooling */
        if (b && dim_of(b, 0) > 0 && kiln_ndim(a) == 4 && kiln_ndim(b) == 4) {
            kiln_conv_geom g = kiln_conv_geom_of(c->attrs);
            double hw = (double)kiln_conv_out_size(dim_of(a, 2), dim_of(b, 2), g.stride[0], g.padding[0], g.dilation[0]) *
                        (double)kiln_conv_out_size(dim_of(a, 3), dim_of(b, 3), g.stride[1], g.padding[1], g.dilation[1]);
            f = 2.0 * (double)dim_of(a, 0) * (double)dim_of(b, 0) * hw * (numel_of(b) / (double)dim_of(b, 0));
        }
        break;
    case KILN_OP_CONV2D_GRAD_INPUT: /* (grad_out, weight) -> grad_input */
        if (b && dim_of(b, 0) > 0) f = 2.0 * numel_of(a) * (numel_of(b) / (double)dim_of(b, 0));
        break;
    case KILN_OP_CONV2D_GRAD_WEIGHT: /* (grad_out, input) -> grad_weight (O, C/g, kH, kW) */
        if (dim_of(y, 0) > 0) f = 2.0 * numel_of(a) * (numel_of(y) / (double)dim_of(y, 0));
        break;
    case KILN_OP_MM: /* (M, K) x (K, N) */
        f = 2.0 * numel_of(y) * (double)dim_of(a, 1);
        break;
    case KILN_OP_BMM: /* (B, M, K) x (B, K, N) */
        f = 2.0 * numel_of(y) * (double)dim_of(a, 2);
        break;
    case KILN_OP_LINEAR:
    case KILN_OP_LINEAR_ACT: /* (..., in) x weight (out, in) */
        if (b) f = 2.0 * numel_of(y) * (double)dim_of(b, 1);
        break;
    default:
        break;
    }
    return f > 0 ? (uint64_t)f : 0;
}

static kiln_status hook_end(kiln_op_call *c, kiln_status status) {
    uint64_t token = (uint64_t)(uintptr_t)c->hook_state[KILN_HOOK_PROFILER];
    if (token) close_record(token, status ? 0 : output_bytes(c), status ? 0 : op_flops(c));
    return KILN_OK;
}

/* The anchor of a device: a reference event and the host time beside it,
 * recorded once per recording. Called with state_lock held. */
static prof_anchor *anchor_for(kiln_device d, kiln_stream *s) {
    prof_anchor *a = &anchors[d.type][d.index];
    if (a->ev) return a;
    if (kiln_event_create(d, KILN_EVENT_TIMING, &a->ev)) return NULL;
    if (kiln_event_record(a->ev, s)) {
        kiln_event_destroy(a->ev);
        a->ev = NULL;
        return NULL;
    }
    a->host_ns = kiln_now_ns();
    return a;
}

/* On the CPU device the kernel runs on the calling thread: its device time
 * is the time around it (what CPU events would record). Elsewhere events
 * on the stream are recorded now and read when the recording is collected. */
static void observe_kernel(kiln_op_call *c, bool before) {
    uint64_t token = (uint64_t)(uintptr_t)c->hook_state[KILN_HOOK_PROFILER];
    prof_thread *t = tls_thread;
    if (!token || !t) return;
    uint64_t now = kiln_now_ns();
    kiln_stream *s = kiln_current_stream(c->device);
    if (!s) return;
    bool on_cpu = c->device.type == KILN_DEVICE_CPU;
    kiln_event *ev = NULL;
    if (!on_cpu) {
        pthread_mutex_lock(&state_lock);
        prof_anchor *a = anchor_for(c->device, s);
        pthread_mutex_unlock(&state_lock);
        if (!a || kiln_event_create(c->device, KILN_EVENT_TIMING, &ev)) return;
        if (kiln_event_record(ev, s)) {
            kiln_event_destroy(ev);
            return;
        }
    }
    pthread_mutex_lock(&t->lock);
    prof_event *e = record_of(t, token);
    if (!e) {
        kiln_event_destroy(ev);
    } else if (before) {
        e->r.launch_ns = now;
        e->r.dev_start_ns = on_cpu ? now : 0;
        e->r.device = c->device;
        e->r.stream_id = kiln_stream_id(s);
        e->ev_start = ev;
    } else {
        e->r.dev_end_ns = on_cpu ? now : 0;
        e->ev_end = ev;
    }
    pthread_mutex_unlock(&t->lock);
}

/* A record that has already ended: a host sync, or asynchronous work. */
static void record_ended(const char *what, prof_kind kind, uint64_t start_ns, uint64_t end_ns) {
    if (!atomic_load_explicit(&recording, memory_order_relaxed)) return;
    uint64_t token = open_record(what, kind, start_ns);
    prof_thread *t = tls_thread;
    if (!token || !t) return;
    pthread_mutex_lock(&t->lock);
    prof_event *e = record_of(t, token);
    if (e) e->open = false, e->r.end_ns = end_ns;
    pthread_mutex_unlock(&t->lock);
}

static void observe_sync(const char *what, uint64_t start_ns, uint64_t end_ns) {
    record_ended(what, PROF_SYNC, start_ns, end_ns);
}

void kiln_profiler_record_async(const char *name, uint64_t start_ns, uint64_t end_ns) {
    record_ended(name, PROF_ASYNC, start_ns ? start_ns : end_ns, end_ns);
}

/* User ranges keep their token on a per-thread stack of their own, so a
 * pop closes the latest push even with ops still open around it. */
static _Thread_local uint64_t range_tokens[PROF_MAX_DEPTH];
static _Thread_local int range_depth;

void kiln_range_push(const char *name) {
    KILN_NVTX_PUSH(name);
    if (!atomic_load_explicit(&recording, memory_order_relaxed)) {
        if (range_depth < PROF_MAX_DEPTH) range_tokens[range_depth] = 0;
        range_depth++;
        return;
    }
    uint64_t token = open_record(name, PROF_RANGE, 0);
    if (range_depth < PROF_MAX_DEPTH) range_tokens[range_depth] = token;
    range_depth++;
}

void kiln_range_pop(void) {
    if (range_depth <= 0) return;
    KILN_NVTX_POP();
    range_depth--;
    if (range_depth < PROF_MAX_DEPTH && range_tokens[range_depth]) close_record(range_tokens[range_depth], 0, 0);
}

void kiln_profiler_init(void) {
    static const kiln_dispatch_hook hook = {hook_begin, hook_end};
    static const kiln_op_observer observer = {observe_kernel, kiln_range_push, kiln_range_pop};
    kiln_dispatch_set_hook(KILN_HOOK_PROFILER, &hook);
    kiln_dispatch_set_observer(&observer);
}

/* ---- Collecting ----------------------------------------------------------------------- */

static uint64_t device_time(const prof_anchor *a, kiln_event *ev) {
    float ms = 0;
    if (!a || !a->ev || kiln_event_synchronize(ev) || kiln_event_elapsed_ms(a->ev, ev, &ms)) return 0;
    return a->host_ns + (uint64_t)((double)ms * 1e6);
}

/* Move a thread's finished records into result, from offset base.
 * Called with state_lock, result_lock and t->lock held. */
static void collect_thread(prof_thread *t, size_t base, uint64_t now) {
    for (size_t i = 0; i < t->n; i++) {
        prof_event *e = &t->ev[i];
        prof_record *r = &result.rec[base + i];
        *r = e->r;
        e->r.name = NULL;
        if (r->parent >= 0) r->parent += (int64_t)base;
        if (e->open) r->end_ns = now; /* still open: cut at the collection */
        if (e->ev_start && e->ev_end) {
            const prof_anchor *a = &anchors[r->device.type][r->device.index];
            r->dev_start_ns = device_time(a, e->ev_start);
            r->dev_end_ns = device_time(a, e->ev_end);
        }
    }
}

static void result_free(void) {
    for (size_t i = 0; i < result.n; i++) free(result.rec[i].name);
    free(result.rec);
    result.rec = NULL;
    result.n = 0;
}

/* Replace the result with every buffer's records, then clear the buffers.
 * Called with state_lock held. */
static void collect_all(void) {
    /* Waiting for device events is the profiler's own sync, not the user's. */
    uint64_t syncs_before = atomic_load(&kiln_counter_values[KILN_COUNTER_HOST_SYNCS]);
    kiln_counters_set_sync_observer(NULL);
    uint64_t now = kiln_now_ns();
    pthread_mutex_lock(&result_lock);
    result_free();
    size_t total = 0;
    for (prof_thread *t = threads; t; t = t->next) {
        pthread_mutex_lock(&t->lock);
        total += t->n;
        pthread_mutex_unlock(&t->lock);
    }
    result.rec = total ? KILN_CALLOC(total, sizeof *result.rec) : NULL;
    size_t base = 0;
    for (prof_thread *t = threads; t && result.rec; t = t->next) {
        pthread_mutex_lock(&t->lock);
        size_t n = t->n <= total - base ? t->n : total - base; /* records added meanwhile wait */
        size_t keep = t->n;
        t->n = n;
        collect_thread(t, base, now);
        t->n = keep;
        base += n;
        pthread_mutex_unlock(&t->lock);
    }
    result.n = base;
    pthread_mutex_unlock(&result_lock);
    clear_all();
    for (int ty = 0; ty < KILN_DEVICE_TYPE_COUNT; ty++)
        for (int i = 0; i < KILN_MAX_DEVICES; i++) {
            kiln_event_destroy(anchors[ty][i].ev);
            anchors[ty][i].ev = NULL;
        }
    uint64_t syncs_after = atomic_load(&kiln_counter_values[KILN_COUNTER_HOST_SYNCS]);
    atomic_fetch_sub(&kiln_counter_values[KILN_COUNTER_HOST_SYNCS], syncs_after - syncs_before);
    if (running) kiln_counters_set_sync_observer(observe_sync);
}

const prof_result *kiln_profiler_result_lock(void) {
    pthread_mutex_lock(&result_lock);
    return &result;
}

void kiln_profiler_result_unlock(void) { pthread_mutex_unlock(&result_lock); }

/* ---- Schedule ------------------------------------------------------------------------- */

kiln_profiler_action kiln_profiler_schedule_action(const kiln_profiler_schedule *s, int64_t step) {
    if (!s || s->wait + s->warmup + s->active <= 0) return KILN_PROFILER_RECORD;
    if (step < s->skip_first) return KILN_PROFILER_NONE;
    int64_t n = step - s->skip_first, cycle = (int64_t)s->wait + s->warmup + s->active;
    if (s->repeat > 0 && n / cycle >= s->repeat) return KILN_PROFILER_NONE;
    int64_t m = n % cycle;
    if (m < s->wait) return KILN_PROFILER_NONE;
    if (m < s->wait + s->warmup) return KILN_PROFILER_WARMUP;
    return m < cycle - 1 ? KILN_PROFILER_RECORD : KILN_PROFILER_RECORD_AND_SAVE;
}

static bool has_schedule(void) {
    const kiln_profiler_schedule *s = &options.schedule;
    return s->wait + s->warmup + s->active > 0;
}

static uint64_t step_token;

/* Enter step step_num: set the recording flag and open ProfilerStep#N.
 * Called with state_lock held. */
static void enter_step(void) {
    action = kiln_profiler_schedule_action(&options.schedule, step_num);
    atomic_store(&recording, action != KILN_PROFILER_NONE);
    step_token = 0;
    if (action == KILN_PROFILER_NONE) return;
    char name[48];
    snprintf(name, sizeof name, "ProfilerStep#%lld", (long long)step_num);
    pthread_mutex_unlock(&state_lock); /* open_record may register this thread */
    step_token = open_record(name, PROF_RANGE, 0);
    pthread_mutex_lock(&state_lock);
}

static void leave_step(void) {
    if (step_token) close_record(step_token, 0, 0);
    step_token = 0;
}

kiln_status kiln_profiler_start(const kiln_profiler_opts *opts) {
    this_thread();
    pthread_mutex_lock(&state_lock);
    if (running) {
        pthread_mutex_unlock(&state_lock);
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_profiler_stop first", "kiln_profiler_start: already started");
    }
    options = opts ? *opts : (kiln_profiler_opts){0};
    running = true;
    step_num = 0;
    clear_all();
    kiln_counters_get(&step_start_counters);
    memset(&last_step_counters, 0, sizeof last_step_counters);
    kiln_counters_set_sync_observer(observe_sync);
    enter_step();
    pthread_mutex_unlock(&state_lock);
    return KILN_OK;
}

static void trace_ready(void) {
    if (options.on_trace_ready) options.on_trace_ready(options.user);
}

kiln_status kiln_profiler_step(void) {
    pthread_mutex_lock(&state_lock);
    if (!running) {
        pthread_mutex_unlock(&state_lock);
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_profiler_start first", "kiln_profiler_step: not started");
    }
    kiln_counters now;
    kiln_counters_get(&now);
    kiln_counters_diff(&now, &step_start_counters, &last_step_counters);
    step_start_counters = now;
    leave_step();
    kiln_profiler_action prev = action;
    bool ready = false;
    if (prev == KILN_PROFILER_RECORD_AND_SAVE) {
        collect_all();
        ready = true;
    }
    step_num++;
    kiln_profiler_action next = kiln_profiler_schedule_action(&options.schedule, step_num);
    /* Warmup is profiled and thrown away; a new cycle starts clean. */
    if (prev != KILN_PROFILER_RECORD && next != KILN_PROFILER_NONE && !ready) clear_all();
    enter_step();
    pthread_mutex_unlock(&state_lock);
    if (ready) trace_ready();
    return KILN_OK;
}

kiln_status kiln_profiler_stop(void) {
    pthread_mutex_lock(&state_lock);
    if (!running) {
        pthread_mutex_unlock(&state_lock);
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_profiler_start first", "kiln_profiler_stop: not started");
    }
    leave_step();
    atomic_store(&recording, 0);
    running = false;
    bool ready = action == KILN_PROFILER_RECORD || action == KILN_PROFILER_RECORD_AND_SAVE;
    if (ready) collect_all();
    kiln_counters_set_sync_observer(NULL);
    clear_all();
    pthread_mutex_unlock(&state_lock);
    if (ready && (has_schedule() || options.on_trace_ready)) trace_ready();
    return KILN_OK;
}

bool kiln_profiler_is_running(void) {
    pthread_mutex_lock(&state_lock);
    bool r = running;
    pthread_mutex_unlock(&state_lock);
    return r;
}

void kiln_profiler_step_counters(kiln_counters *out) {
    pthread_mutex_lock(&state_lock);
    *out = last_step_counters;
    pthread_mutex_unlock(&state_lock);
}

/* ---- Counters ------------------------------------------------------------------------- */

void kiln_counters_get(kiln_counters *out) {
    uint64_t v[KILN_COUNTER_COUNT];
    kiln_counters_read(v);
    out->kernel_launches = v[KILN_COUNTER_KERNEL_LAUNCHES];
    out->host_syncs = v[KILN_COUNTER_HOST_SYNCS];
    out->raw_allocs = v[KILN_COUNTER_RAW_ALLOCS];
    out->pageable_copies = v[KILN_COUNTER_PAGEABLE_COPIES];
    out->bytes_h2d = v[KILN_COUNTER_BYTES_H2D];
    out->bytes_d2h = v[KILN_COUNTER_BYTES_D2H];
}

void kiln_counters_reset(void) { kiln_counters_zero(); }

void kiln_counters_diff(const kiln_counters *after, const kiln_counters *before, kiln_counters *out) {
    out->kernel_launches = after->kernel_launches - before->kernel_launches;
    out->host_syncs = after->host_syncs - before->host_syncs;
    out->raw_allocs = after->raw_allocs - before->raw_allocs;
    out->pageable_copies = after->pageable_copies - before->pageable_copies;
    out->bytes_h2d = after->bytes_h2d - before->bytes_h2d;
    out->bytes_d2h = after->bytes_d2h - before->bytes_d2h;
}
