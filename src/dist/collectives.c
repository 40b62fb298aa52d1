/* Collectives on CPU tensors over MPI's non-blocking calls, their work
 * handles and the watchdog that bounds every wait.
 *
 * A collective is started at once (MPI_I*) and completes in
 * kiln_dist_work_wait / _poll, which drive MPI's progress: Open MPI moves a
 * non-blocking collective forward only inside MPI calls of the process, so
 * a waiter tests its request in a loop, sleeping a little longer each turn
 * (up to 1 ms: ranks often share cores) until it completes or the deadline
 * passes. Completion finishes the host-side part: the division of an
 * average, the copy back into a non-contiguous tensor. */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "dist/dist_internal.h"
#include "kiln/diag.h"
#include "runtime/counters.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

static const char *const kind_names[DIST_KIND_COUNT] = {"all_reduce", "broadcast", "all_gather",
                                                        "reduce_scatter", "barrier"};

const char *kiln_dist_kind_name(dist_kind kind) {
    return kind >= 0 && kind < DIST_KIND_COUNT ? kind_names[kind] : "collective";
}

static bool dtype_supported(kiln_dtype dt) {
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_I32 || dt == KILN_I64;
}

#if KILN_WITH_MPI
static MPI_Datatype mpi_type(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
        return MPI_FLOAT;
    case KILN_F64:
        return MPI_DOUBLE;
    case KILN_I32:
        return MPI_INT32_T;
    default:
        return MPI_INT64_T;
    }
}

static kiln_status mpi_fail(int rc, const char *call, const kiln_dist_group *g) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return KILN_RAISE(KILN_ERR_DEVICE, NULL, "kiln_dist: %s failed on rank %d of %d: %s (MPI error %d)", call,
                      g->rank, g->world, text, rc);
}

static bool group_uses_mpi(const kiln_dist_group *g) { return g->comm != MPI_COMM_NULL; }
#endif

/* "f32 [3, 5]" */
static const char *describe(kiln_dtype dt, const kiln_shape *s, char *buf, size_t size) {
    char shape[160];
    snprintf(buf, size, "%s %s", kiln_dtype_name(dt), kiln_shape_format(s->ndim, s->d, shape, sizeof shape));
    return buf;
}

static kiln_status check_tensor(const char *fn, const char *what, kiln_tensor *t) {
    if (!t) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: %s is NULL", fn, what);
    kiln_device d = kiln_get_device(t);
    if (d.type != KILN_DEVICE_CPU && d.type != KILN_DEVICE_CUDA) {
        char name[32];
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "move it with kiln_to(t, KILN_CPU, dtype, 0)",
                          "%s: %s is on %s; collectives take CPU tensors (MPI) and CUDA tensors (NCCL)", fn,
                          what, kiln_device_str(d, name, sizeof name));
    }
    kiln_dtype dt = kiln_dtype_of(t);
    if (!dtype_supported(dt))
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "convert it with kiln_to(t, KILN_CPU, KILN_F32, 0)",
                          "%s: %s has dtype %s; collectives take f32, f64, i32 or i64", fn, what,
                          kiln_dtype_name(dt));
    if (kiln_numel(t) > INT32_MAX)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "split it into pieces below 2^31 elements",
                          "%s: %s has %lld elements, more than one MPI call carries", fn, what,
                          (long long)kiln_numel(t));
    return KILN_OK;
}

#if KILN_WITH_MPI
/* ---- Debug mode: every rank describes the collective it is about to start ------------ */

enum {
    DESC_SEQ,
    DESC_KIND,
    DESC_DTYPE,
    DESC_OP,
    DESC_ROOT,
    DESC_NDIM,
    DESC_DIMS,
    DESC_LEN = DESC_DIMS + KILN_MAX_DIMS
};

static void desc_text(const int64_t *desc, char *buf, size_t size) {
    kiln_shape s = {.ndim = (int)desc[DESC_NDIM]};
    for (int i = 0; i < s.ndim && i < KILN_MAX_DIMS; i++) s.d[i] = desc[DESC_DIMS + i];
    char what[200];
    int kind = (int)desc[DESC_KIND];
    if (kind == DIST_BARRIER) {
        snprintf(buf, size, "barrier #%lld", (long long)desc[DESC_SEQ]);
        return;
    }
    describe((kiln_dtype)desc[DESC_DTYPE], &s, what, sizeof what);
    snprintf(buf, size, "%s #%lld of %s%s%s", kiln_dist_kind_name((dist_kind)kind), (long long)desc[DESC_SEQ],
             what,
             kind == DIST_ALL_REDUCE || kind == DIST_REDUCE_SCATTER ? (desc[DESC_OP] ? " (avg)" : " (sum)")
                                                                    : "",
             kind == DIST_BROADCAST ? " from the root given" : "");
}

#define wait_request kiln_dist_wait_request

static kiln_status debug_exchange(kiln_dist_group *g, dist_kind kind, kiln_dist_reduce_op op, int root,
                                  kiln_dtype dt, const kiln_shape *s) {
    int64_t mine[DESC_LEN] = {0};
    mine[DESC_SEQ] = (int64_t)g->seq, mine[DESC_KIND] = kind, mine[DESC_DTYPE] = dt, mine[DESC_OP] = op;
    mine[DESC_ROOT] = root, mine[DESC_NDIM] = s->ndim;
    for (int i = 0; i < s->ndim; i++) mine[DESC_DIMS + i] = s->d[i];
    int64_t *all = KILN_MALLOC(sizeof(int64_t) * DESC_LEN * (size_t)g->world);
    if (!all) return KILN_ERR_OUT_OF_MEMORY;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, DESC_LEN, MPI_INT64_T, all, DESC_LEN, MPI_INT64_T, g->comm, &req);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(rc, "MPI_Iallgather (KILN_DIST_DEBUG)", g);
    }
    char what[256];
    desc_text(mine, what, sizeof what);
    bool timed_out = false;
    kiln_status st = wait_request(g, &req, g->timeout_s, what, &timed_out);
    if (timed_out) {
        /* The exchange stays in flight: the buffer must outlive it. */
        g->in_flight++;
        return st;
    }
    for (int r = 1; r < g->world && !st; r++) {
        if (!memcmp(all, all + (size_t)r * DESC_LEN, sizeof mine)) continue;
        char a[256], b[256];
        desc_text(all, a, sizeof a);
        desc_text(all + (size_t)r * DESC_LEN, b, sizeof b);
        st = KILN_RAISE(
            KILN_ERR_INVALID_ARGUMENT,
            "every rank must call the same collectives in the same order with the same dtype and shape",
            "KILN_DIST_DEBUG: the ranks disagree on collective #%llu: rank 0 calls %s, rank %d calls %s "
            "(root %lld vs %lld)",
            (unsigned long long)g->seq, a, r, b, (long long)all[DESC_ROOT],
            (long long)all[(size_t)r * DESC_LEN + DESC_ROOT]);
    }
    free(all);
    return st;
}

#endif

/* Who this rank waits on: every other rank (MPI does not say which one is
 * missing). */
static void other_ranks(const kiln_dist_group *g, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int r = 0, n = 0; r < g->world && used + 16 < size; r++) {
        if (r == g->rank) continue;
        if (n == 16) {
            snprintf(buf + used, size - used, ", ...");
            break;
        }
        int k = snprintf(buf + used, size - used, n ? ", %d" : "%d", r);
        if (k > 0) used += (size_t)k;
        n++;
    }
}

/* How often a wait looks whether the other ranks' processes still exist. */
#define DIST_PEER_CHECK_S 0.1

/* A rank of the collective is gone (peers.c): the error that names it. */
static kiln_status lost_rank(const kiln_dist_group *g, const char *what, const char *lost, int n_lost) {
    return KILN_RAISE(
        KILN_ERR_DEVICE,
        "a rank that dies ends the job: its own output (or the kernel log, for the out-of-memory "
        "killer) says why; exit non-zero here too, so mpirun ends the other ranks, and restart "
        "from the last checkpoint",
        "kiln_dist: %s is lost: %s has exited or was killed, so %s can never complete on "
        "rank %d of %d",
        lost, n_lost > 1 ? "their processes" : "its process", what, g->rank, g->world);
}

static kiln_status timeout_error(const kiln_dist_group *g, const char *what, double seconds) {
    char others[128];
    other_ranks(g, others, sizeof others);
    return KILN_RAISE(KILN_ERR_DEVICE,
                      "the other ranks skipped or reordered this collective, or are stuck or dead; raise "
                      "KILN_DIST_TIMEOUT if they are only slow",
                      "kiln_dist: %s did not complete within %.3g s on rank %d of %d: waiting on rank%s %s "
                      "(one or more of them did not join it)",
                      what, seconds, g->rank, g->world, g->world > 2 ? "s" : "", others);
}

/* How many ranks of g are known lost (peers.c, MPI worlds only). */
static int lost_peers(const kiln_dist_group *g, char *buf, size_t size) {
#if KILN_WITH_MPI
    if (g->peers) return kiln_dist_peers_lost(g, buf, size);
#endif
    (void)g, (void)buf, (void)size;
    return 0;
}

/* The error of a failed NCCL collective: a rank known lost is named
 * (whatever NCCL said), else NCCL's own error `st`. Aborts the device's
 * communicator, which ends the collective on this rank. */
static kiln_status device_failure(kiln_dist_work *w, kiln_status st, const char *what) {
    char lost[512];
    int n_lost = lost_peers(w->group, lost, sizeof lost);
    if (n_lost > 0) st = lost_rank(w->group, what, lost, n_lost);
    kiln_dist_nccl_abort(w->group, w->nccl_device); /* keeps the error */
    return st;
}

/* The pause between two polls of a collective in flight. For the first
 * DIST_SPIN_S it only yields the core: Open MPI moves a non-blocking
 * collective only inside MPI calls (a ring all-reduce takes a round of
 * calls per step), so a sleep there delays every round, and between ranks
 * that keep pace the collective ends within it. After that, sleeps from
 * 50 us doubling to 1 ms: a rank far ahead of the others (or waiting out a
 * lost one) does not hold a core its peers may need. Measured with
 * `kiln bench ddp --threads 1` (docs/distributed.md): sleeping from the
 * first poll cost each rank several ms per step. */
#define DIST_SPIN_S 0.005
static void poll_pause(double waited, long *sleep_ns) {
    if (waited < DIST_SPIN_S) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, *sleep_ns};
    nanosleep(&ts, NULL);
    if (*sleep_ns < 1000000) *sleep_ns *= 2;
}

/* An NCCL collective: poll its event and the communicator's asynchronous
 * error until it completes or `seconds` pass or a rank is lost. Any failure
 * aborts the device's communicator (ncclCommAbort), which ends the
 * collective here: the work is then done, with the error. */
static kiln_status wait_device(kiln_dist_work *w, double seconds, const char *what) {
    kiln_dist_group *g = w->group;
    double start = kiln_clock_now_s(), next_check = DIST_PEER_CHECK_S;
    long sleep_ns = 50000;
    for (;;) {
        bool done = false, failed = false;
        kiln_status st = kiln_dist_nccl_query(w, &done, &failed);
        if (done) return KILN_OK;
        double waited = kiln_clock_now_s() - start;
        if (!failed && waited >= next_check) {
            char lost[512];
            int n_lost = lost_peers(g, lost, sizeof lost);
            if (n_lost > 0) st = lost_rank(g, what, lost, n_lost), failed = true;
            next_check = waited + DIST_PEER_CHECK_S;
        }
        if (!failed && waited >= seconds) st = timeout_error(g, what, seconds), failed = true;
        if (failed) return device_failure(w, st, what);
        poll_pause(waited, &sleep_ns);
    }
}

#if KILN_WITH_MPI
/* Test `req` until it completes or `seconds` pass, or a rank's process on
 * this host is gone. Either failure leaves it in flight and sets
 * *timed_out. */
kiln_status wait_request(kiln_dist_group *g, MPI_Request *req, double seconds, const char *what,
                         bool *timed_out) {
    *timed_out = false;
    double start = kiln_clock_now_s(), next_check = DIST_PEER_CHECK_S;
    long sleep_ns = 50000;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Test", g);
        if (flag) return KILN_OK;
        double waited = kiln_clock_now_s() - start;
        if (waited >= next_check) {
            char lost[512];
            int n_lost = kiln_dist_peers_lost(g, lost, sizeof lost);
            if (n_lost > 0) {
                *timed_out = true;
                return lost_rank(g, what, lost, n_lost);
            }
            next_check = waited + DIST_PEER_CHECK_S;
        }
        if (waited >= seconds) {
            *timed_out = true;
            return timeout_error(g, what, seconds);
        }
        poll_pause(waited, &sleep_ns);
    }
}
#endif

/* ---- Work ------------------------------------------------------------------------------- */

static void work_what(const kiln_dist_work *w, char *buf, size_t size) {
    char d[200];
    if (w->kind == DIST_BARRIER) {
        snprintf(buf, size, "barrier #%llu", (unsigned long long)w->seq);
        return;
    }
    describe(w->dtype, &w->shape, d, sizeof d);
    snprintf(buf, size, "%s #%llu of %s%s", kiln_dist_kind_name(w->kind), (unsigned long long)w->seq, d,
             w->kind == DIST_ALL_REDUCE || w->kind == DIST_REDUCE_SCATTER
                 ? (w->op == KILN_DIST_AVG ? " (avg)" : " (sum)")
                 : "");
}

static void scale(kiln_tensor *t, double factor) {
    int64_t n = kiln_numel(t);
    if (kiln_dtype_of(t) == KILN_F32) {
        float *p = kiln_data_ptr(t), f = (float)factor;
        for (int64_t i = 0; i < n; i++) p[i] *= f;
    } else {
        double *p = kiln_data_ptr(t);
        for (int64_t i = 0; i < n; i++) p[i] *= factor;
    }
}

/* w ends with error st (the current error). */
static kiln_status fail_work(kiln_dist_work *w, kiln_status st) {
    w->done = true, w->result = st, w->error = *kiln_error_last();
    w->group->in_flight--;
    return st;
}

/* A completed work's result again, its error raised again. */
static kiln_status work_result(const kiln_dist_work *w) {
    if (!w->result) return KILN_OK;
    const kiln_error *e = &w->error;
    return kiln_error_raise(e->status, e->file, e->line, e->hint[0] ? e->hint : NULL, "%s", e->message);
}

/* The host-side end of a collective whose MPI part is done. The profiler
 * gets it as "mpi:<kind>" from its start to now (when this rank saw it
 * complete): DDP's overlap with backward is read from these. */
static kiln_status complete(kiln_dist_work *w) {
    bool nccl = w->nccl_device >= 0;
    if (kiln_profiler_is_running()) {
        char name[48];
        snprintf(name, sizeof name, "%s:%s", nccl ? "nccl" : "mpi", kiln_dist_kind_name(w->kind));
        kiln_profiler_record_async(name, w->start_ns, kiln_now_ns());
    }
    kiln_status st = nccl ? kiln_dist_nccl_finish(w) : KILN_OK;
    if (w->buffer && !st) {
        /* NCCL averages itself (ncclAvg). */
        if (!nccl && w->op == KILN_DIST_AVG && w->group->world > 1) scale(w->buffer, 1.0 / w->group->world);
        if (w->buffer != w->target) {
            kiln_api_enter();
            st = kiln_copy_(w->target, w->buffer, 0);
            kiln_api_leave();
        } else {
            kiln_tensor_bump_version(w->target);
        }
    }
    if (st) return fail_work(w, st);
    w->done = true;
    w->result = KILN_OK;
    w->group->in_flight--;
    return st;
}

kiln_status kiln_dist_work_wait_s(kiln_dist_work *w, double seconds) {
    if (!w) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_work_wait: work is NULL");
    if (!isfinite(seconds) || seconds <= 0.0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give seconds > 0",
                          "kiln_dist_work_wait_timeout: %g is not a positive number of seconds", seconds);
    if (w->done) return work_result(w);
    if (w->nccl_device >= 0) {
        char what[256];
        work_what(w, what, sizeof what);
        kiln_status st = wait_device(w, seconds, what);
        /* Failed: the communicator was aborted, the collective is over. */
        return st ? fail_work(w, st) : complete(w);
    }
#if KILN_WITH_MPI
    char what[256];
    work_what(w, what, sizeof what);
    bool timed_out = false;
    kiln_status st = wait_request(w->group, &w->request, seconds, what, &timed_out);
    if (timed_out) return st;
    if (st) return fail_work(w, st);
#endif
    return complete(w);
}

kiln_status kiln_dist_work_wait_until(kiln_dist_work *w, double deadline) {
    double left = deadline - kiln_clock_now_s();
    return kiln_dist_work_wait_s(w, left > 1e-3 ? left : 1e-3);
}

kiln_status kiln_dist_work_wait(kiln_dist_work *w) {
    if (!w) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_work_wait: work is NULL");
    return kiln_dist_work_wait_s(w, w->group->timeout_s);
}

kiln_status kiln_dist_work_wait_timeout(kiln_dist_work *w, double seconds) {
    return kiln_dist_work_wait_s(w, seconds);
}

kiln_status kiln_dist_work_poll(kiln_dist_work *w, bool *done) {
    if (!w || !done) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_work_poll: NULL argument");
    *done = w->done;
    if (w->done) return work_result(w);
    if (w->nccl_device >= 0) {
        bool failed = false;
        kiln_status st = kiln_dist_nccl_query(w, done, &failed);
        if (failed) {
            char what[256];
            work_what(w, what, sizeof what);
            *done = true;
            return fail_work(w, device_failure(w, st, what));
        }
        return *done ? complete(w) : KILN_OK;
    }
#if KILN_WITH_MPI
    int flag = 0;
    int rc = MPI_Test(&w->request, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        *done = true;
        return fail_work(w, mpi_fail(rc, "MPI_Test", w->group));
    }
    if (!flag) return KILN_OK;
#endif
    *done = true;
    return complete(w);
}

kiln_status kiln_dist_work_free(kiln_dist_work *w) {
    if (!w) return KILN_OK;
    if (!w->done) {
        char what[256];
        work_what(w, what, sizeof what);
        return KILN_RAISE(KILN_ERR_STATE, "wait for it first (kiln_dist_work_wait)",
                          "kiln_dist_work_free: %s is still in flight", what);
    }
    if (w->buffer && w->buffer != w->target) kiln_tensor_drop(w->buffer);
    kiln_tensor_drop(w->target);
    kiln_tensor_drop(w->input);
    if (w->event) kiln_event_destroy(w->event);
    free(w);
    return KILN_OK;
}

/* ---- Starting a collective ------------------------------------------------------------ */

typedef struct start_args {
    const char *fn;
    dist_kind kind;
    kiln_dist_reduce_op op;
    int root;
    kiln_tensor *target; /* written */
    kiln_tensor *input;  /* read (all_gather, reduce_scatter) */
} start_args;

#if KILN_WITH_MPI
static kiln_status mpi_start(kiln_dist_work *w, const start_args *a) {
    kiln_dist_group *g = w->group;
    void *out = w->buffer ? kiln_data_ptr(w->buffer) : NULL;
    const void *in = w->input ? kiln_data_ptr(w->input) : NULL;
    MPI_Datatype type = mpi_type(w->dtype);
    int rc;
    const char *call;
    switch (a->kind) {
    case DIST_ALL_REDUCE:
        call = "MPI_Iallreduce";
        rc = MPI_Iallreduce(MPI_IN_PLACE, out, (int)kiln_numel(w->buffer), type, MPI_SUM, g->comm,
                            &w->request);
        break;
    case DIST_BROADCAST:
        call = "MPI_Ibcast";
        rc = MPI_Ibcast(out, (int)kiln_numel(w->buffer), type, a->root, g->comm, &w->request);
        break;
    case DIST_ALL_GATHER:
        call = "MPI_Iallgather";
        rc = MPI_Iallgather(in, (int)kiln_numel(w->input), type, out, (int)kiln_numel(w->input), type,
                            g->comm, &w->request);
        break;
    case DIST_REDUCE_SCATTER:
        call = "MPI_Ireduce_scatter_block";
        rc = MPI_Ireduce_scatter_block(in, out, (int)kiln_numel(w->buffer), type, MPI_SUM, g->comm,
                                       &w->request);
        break;
    default:
        call = "MPI_Ibarrier";
        rc = MPI_Ibarrier(g->comm, &w->request);
        break;
    }
    return rc == MPI_SUCCESS ? KILN_OK : mpi_fail(rc, call, g);
}
#endif

/* A pinned host copy of CUDA tensor t (contiguous), for MPI. Blocks the
 * host until the copy is done (the device's work on t first). */
static kiln_tensor *stage(kiln_tensor *t, kiln_status *st) {
    kiln_tensor *h = kiln_empty_pinned(kiln_shape_of(t), kiln_dtype_of(t));
    if (!h) {
        *st = kiln_error_last()->status;
        return NULL;
    }
    *st = kiln_copy_(h, t, 0);
    if (*st) {
        kiln_tensor_drop(h);
        return NULL;
    }
    return h;
}

/* A world of 1: the results are the inputs. */
static kiln_status local_start(kiln_dist_work *w) {
    if (w->input && w->buffer) {
        memcpy(kiln_data_ptr(w->buffer), kiln_data_ptr(w->input),
               (size_t)kiln_numel(w->input) * kiln_dtype_size(w->dtype));
    }
    return KILN_OK;
}

static kiln_status start(kiln_dist_group *g, const start_args *a, kiln_dist_work **work) {
    if (work) *work = NULL;
    if (!g)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "call kiln_dist_init first", "%s: group is NULL", a->fn);
    kiln_tensor *named = a->input ? a->input : a->target;
    kiln_dist_work *w = KILN_CALLOC(1, sizeof *w);
    if (!w) return KILN_ERR_OUT_OF_MEMORY;
    w->group = g, w->kind = a->kind, w->op = a->op, w->seq = g->seq++;
    if (named) w->dtype = kiln_dtype_of(named), w->shape = kiln_shape_of(named);
    kiln_status st = KILN_OK;
#if KILN_WITH_MPI
    if (g->debug && group_uses_mpi(g)) {
        g->seq--; /* the exchange names the collective's own number */
        st = debug_exchange(g, a->kind, a->op, a->root, w->dtype, &w->shape);
        g->seq++;
    }
#endif
    w->nccl_device = -1;
    bool on_cuda = named && kiln_get_device(named).type == KILN_DEVICE_CUDA;
    bool nccl = on_cuda && kiln_dist_nccl_enabled();
    /* CUDA tensors without NCCL: staged through pinned host copies. */
    w->staged = on_cuda && !nccl;
    kiln_api_enter();
    if (!st && a->target) {
        w->target = kiln_retain(a->target);
        if (w->staged)
            w->buffer = stage(a->target, &st);
        else
            w->buffer = kiln_is_contiguous(a->target) ? w->target : kiln_contiguous(a->target);
        if (!w->buffer && !st) st = kiln_error_last()->status;
    }
    if (!st && a->input) {
        if (w->staged)
            w->input = stage(a->input, &st);
        else
            w->input = kiln_is_contiguous(a->input) ? kiln_retain(a->input) : kiln_contiguous(a->input);
        if (!w->input && !st) st = kiln_error_last()->status;
    }
    kiln_api_leave();
    if (!st) {
        g->in_flight++;
        w->start_ns = kiln_now_ns();
        if (nccl) {
            st = kiln_dist_nccl_start(w, a->root);
            if (st) g->in_flight--;
        } else
#if KILN_WITH_MPI
            if (group_uses_mpi(g)) {
            st = mpi_start(w, a);
            if (st) g->in_flight--;
        } else
#endif
        {
            st = local_start(w);
            if (st)
                g->in_flight--;
            else
                st = complete(w);
        }
    }
    if (st) {
        w->done = true;
        kiln_dist_work_free(w);
        return st;
    }
    if (work) {
        *work = w;
        return KILN_OK;
    }
    st = kiln_dist_work_wait(w);
    if (st && !w->done) {
        /* Timed out: MPI still owns the buffers. The work cannot be freed; it
         * is left to the process (the group reports it in flight). */
        return st;
    }
    kiln_dist_work_free(w);
    return st;
}

static kiln_status check_op(const char *fn, kiln_tensor *t, kiln_dist_reduce_op op) {
    if (op != KILN_DIST_SUM && op != KILN_DIST_AVG)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_DIST_SUM or KILN_DIST_AVG",
                          "%s: unknown op %d", fn, (int)op);
    if (op == KILN_DIST_AVG && !kiln_dtype_is_floating(kiln_dtype_of(t)))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "sum, then divide where you need to",
                          "%s: KILN_DIST_AVG of an integer tensor (%s)", fn,
                          kiln_dtype_name(kiln_dtype_of(t)));
    return KILN_OK;
}

kiln_status kiln_dist_all_reduce(kiln_dist_group *g, kiln_tensor *t, kiln_dist_reduce_op op,
                                 kiln_dist_work **work) {
    const char *fn = "kiln_dist_all_reduce";
    if (work) *work = NULL;
    KILN_TRY(check_tensor(fn, "the tensor", t));
    KILN_TRY(check_op(fn, t, op));
    return start(g, &(start_args){fn, DIST_ALL_REDUCE, op, 0, t, NULL}, work);
}

kiln_status kiln_dist_broadcast(kiln_dist_group *g, kiln_tensor *t, int root, kiln_dist_work **work) {
    const char *fn = "kiln_dist_broadcast";
    if (work) *work = NULL;
    KILN_TRY(check_tensor(fn, "the tensor", t));
    if (g && (root < 0 || root >= g->world))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a rank in [0, world size)",
                          "%s: root %d is not a rank of a world of %d", fn, root, g->world);
    return start(g, &(start_args){fn, DIST_BROADCAST, KILN_DIST_SUM, root, t, NULL}, work);
}

static kiln_status check_pair(const char *fn, const kiln_dist_group *g, kiln_tensor *big,
                              const char *big_name, kiln_tensor *small, const char *small_name) {
    KILN_TRY(check_tensor(fn, big_name, big));
    KILN_TRY(check_tensor(fn, small_name, small));
    if (!g) return KILN_OK;
    if (kiln_dtype_of(big) != kiln_dtype_of(small))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give both the same dtype", "%s: %s is %s but %s is %s",
                          fn, big_name, kiln_dtype_name(kiln_dtype_of(big)), small_name,
                          kiln_dtype_name(kiln_dtype_of(small)));
    if (kiln_numel(big) != (int64_t)g->world * kiln_numel(small)) {
        char a[160], b[160];
        kiln_shape sa = kiln_shape_of(big), sb = kiln_shape_of(small);
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "size it world size times the other",
                          "%s: %s %s has %lld elements, not world size %d x %lld (%s %s)", fn, big_name,
                          kiln_shape_format(sa.ndim, sa.d, a, sizeof a), (long long)kiln_numel(big), g->world,
                          (long long)kiln_numel(small), small_name,
                          kiln_shape_format(sb.ndim, sb.d, b, sizeof b));
    }
    kiln_device db = kiln_get_device(big), ds = kiln_get_device(small);
    if (db.type != ds.type || db.index != ds.index) {
        char a[32], b[32];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "put both on one device",
                          "%s: %s is on %s but %s is on %s", fn, big_name, kiln_device_str(db, a, sizeof a),
                          small_name, kiln_device_str(ds, b, sizeof b));
    }
    if (kiln_shares_storage(big, small))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use separate tensors", "%s: %s and %s share storage",
                          fn, big_name, small_name);
    return KILN_OK;
}

kiln_status kiln_dist_all_gather(kiln_dist_group *g, kiln_tensor *out, kiln_tensor *in,
                                 kiln_dist_work **work) {
    const char *fn = "kiln_dist_all_gather";
    if (work) *work = NULL;
    KILN_TRY(check_pair(fn, g, out, "out", in, "in"));
    return start(g, &(start_args){fn, DIST_ALL_GATHER, KILN_DIST_SUM, 0, out, in}, work);
}

kiln_status kiln_dist_reduce_scatter(kiln_dist_group *g, kiln_tensor *out, kiln_tensor *in,
                                     kiln_dist_reduce_op op, kiln_dist_work **work) {
    const char *fn = "kiln_dist_reduce_scatter";
    if (work) *work = NULL;
    KILN_TRY(check_pair(fn, g, in, "in", out, "out"));
    KILN_TRY(check_op(fn, out, op));
    return start(g, &(start_args){fn, DIST_REDUCE_SCATTER, op, 0, out, in}, work);
}

kiln_status kiln_dist_barrier(kiln_dist_group *g, kiln_dist_work **work) {
    if (work) *work = NULL;
    return start(g, &(start_args){"kiln_dist_barrier", DIST_BARRIER, KILN_DIST_SUM, 0, NULL, NULL}, work);
}
