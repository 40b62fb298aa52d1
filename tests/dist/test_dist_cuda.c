/* Collectives and DDP on CUDA tensors: through NCCL (the emulator's in the
 * emulation build, the real one on GPUs) and, with KILN_DIST_NCCL=0,
 * staged through pinned host memory over MPI. Run as a singleton and as 2
 * ranks under mpirun (tests/CMakeLists.txt); each rank drives the device
 * of its local rank (cuda:0, cuda:1 on a host with two, cuda:0 for both
 * with one). Skipped without a CUDA device.
 *
 *   - all-reduce (sum, avg; f32 over 1.2 MB so several shared-memory
 *     rounds; i64), broadcast from the last rank, all-gather and
 *     reduce-scatter give the values computed on the host, both ways;
 *   - the collective is ordered after the compute stream: with the compute
 *     stream held (emulation only), an all-reduce of a tensor whose fill is
 *     still queued there does not complete, and after release it reduces
 *     the filled values;
 *   - DDP on the device (64 + 64, and 70 + 58 sample-weighted with a bucket
 *     per parameter) against one process on the whole batch on the same
 *     device: parameters and last gradients within 2e-5 normwise after 5
 *     Adam steps, as tests/dist/test_dist_ddp.c does on the CPU. */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/runtime_internal.h"
#include "test_util.h"
#ifdef KILN_CUDA_EMULATION
#include "emu/kiln_emu_api.h"
#endif

#define N_ALL 128
#define STEPS 5

static kiln_dist_group *world;
static int rank, size;
static kiln_device dev;

/* Host value of element i on rank r. */
static double value(int r, int64_t i) { return sin((double)i * 0.013 + r) + 0.25 * r; }

static kiln_tensor *filled(int64_t n, kiln_dtype dt, int r) {
    kiln_tensor *h = kiln_empty(KILN_SHAPE(n), dt, KILN_CPU);
    for (int64_t i = 0; i < n; i++) {
        if (dt == KILN_F32)
            ((float *)kiln_data_ptr(h))[i] = (float)value(r, i);
        else if (dt == KILN_F64)
            ((double *)kiln_data_ptr(h))[i] = value(r, i);
        else
            ((int64_t *)kiln_data_ptr(h))[i] = i * 3 + r * 1000;
    }
    return kiln_to(h, dev, dt, 0);
}

static double host_at(kiln_tensor *t, int64_t i) {
    kiln_tensor *h = kiln_to(t, KILN_CPU, KILN_F64, KILN_COPY);
    return ((double *)kiln_data_ptr(h))[i];
}

/* Largest |t[i] - want(i)| over t (read back as f64). */
static double max_err(kiln_tensor *t, double (*want)(int64_t, void *), void *ctx) {
    kiln_tensor *h = kiln_to(t, KILN_CPU, KILN_F64, KILN_COPY);
    const double *p = kiln_data_ptr(h);
    double e = 0;
    for (int64_t i = 0; i < kiln_numel(h); i++) e = fmax(e, fabs(p[i] - want(i, ctx)));
    return e;
}

static double want_sum(int64_t i, void *ctx) {
    double s = 0;
    for (int r = 0; r < size; r++) s += value(r, i);
    return ctx ? s / size : s;
}
static double want_root(int64_t i, void *ctx) {
    (void)ctx;
    return (float)value(size - 1, i); /* the tensor is f32 */
}
static double want_gather(int64_t i, void *ctx) {
    int64_t n = *(int64_t *)ctx;
    return value((int)(i / n), i % n);
}
static double want_scatter(int64_t i, void *ctx) {
    int64_t n = *(int64_t *)ctx;
    return want_sum(rank * n + i, NULL);
}

static void collectives(const char *how) {
    kiln_scope_begin();
    const int64_t n = 300001; /* f32: 1.2 MB, more than one 1 MiB round */
    kiln_tensor *t = filled(n, KILN_F32, rank);
    kiln_dist_work *w = NULL;
    CHECK_OK(kiln_dist_all_reduce(world, t, KILN_DIST_SUM, &w));
    CHECK_OK(kiln_dist_work_wait(w));
    CHECK_OK(kiln_dist_work_free(w));
    double e = max_err(t, want_sum, NULL);
    CHECK_MSG(e < 1e-5, "%s: f32 all_reduce sum off by %g", how, e);

    kiln_tensor *a = filled(1001, KILN_F64, rank);
    CHECK_OK(kiln_dist_all_reduce(world, a, KILN_DIST_AVG, NULL));
    e = max_err(a, want_sum, (void *)1);
    CHECK_MSG(e < 1e-12, "%s: f64 all_reduce avg off by %g", how, e);

    kiln_tensor *k = filled(77, KILN_I64, rank);
    CHECK_OK(kiln_dist_all_reduce(world, k, KILN_DIST_SUM, NULL));
    int64_t rs = 0;
    for (int r = 0; r < size; r++) rs += r * 1000;
    CHECK_MSG(host_at(k, 5) == (double)(5 * 3 * size + rs), "%s: i64 all_reduce gives %g", how,
              host_at(k, 5));

    kiln_tensor *b = filled(4099, KILN_F32, rank);
    CHECK_OK(kiln_dist_broadcast(world, b, size - 1, NULL));
    e = max_err(b, want_root, NULL);
    CHECK_MSG(e == 0, "%s: broadcast off by %g", how, e);

    int64_t m = 513;
    kiln_tensor *in = filled(m, KILN_F64, rank);
    kiln_tensor *out = kiln_zeros(KILN_SHAPE(size * m), KILN_F64, dev);
    CHECK_OK(kiln_dist_all_gather(world, out, in, NULL));
    e = max_err(out, want_gather, &m);
    CHECK_MSG(e == 0, "%s: all_gather off by %g", how, e);

    kiln_tensor *big = filled(size * m, KILN_F64, rank);
    kiln_tensor *part = kiln_zeros(KILN_SHAPE(m), KILN_F64, dev);
    CHECK_OK(kiln_dist_reduce_scatter(world, part, big, KILN_DIST_SUM, NULL));
    e = max_err(part, want_scatter, &m);
    CHECK_MSG(e < 1e-12, "%s: reduce_scatter off by %g", how, e);
    kiln_scope_end();
    printf("rank %d: collectives on %s %s: ok\n", rank, kiln_device_str(dev, (char[32]){0}, 32), how);
}

/* The communication stream must wait for the compute stream. */
static void test_ordered_after_compute(void) {
#ifdef KILN_CUDA_EMULATION
    kiln_scope_begin();
    /* A stream of its own as the compute stream: its handle names it alone
     * (the default stream's handle is resolved by the calling thread's
     * current device). */
    kiln_stream *compute = NULL;
    CHECK_OK(kiln_stream_create(dev, 0, &compute));
    kiln_stream_guard guard = kiln_stream_guard_begin(compute);
    kiln_tensor *t = kiln_zeros(KILN_SHAPE(1000), KILN_F32, dev);
    CHECK_OK(kiln_stream_synchronize(compute));
    cudaStream_t h = (cudaStream_t)kiln_stream_handle(compute);
    CHECK(kiln_emu_hold_stream(h, true) == cudaSuccess);
    kiln_tensor *src = kiln_full(KILN_SHAPE(1000), 2.0 + rank, KILN_F32, dev);
    CHECK_OK(kiln_copy_(t, src, 0)); /* queued behind the hold */
    kiln_dist_work *w = NULL;
    CHECK_OK(kiln_dist_all_reduce(world, t, KILN_DIST_SUM, &w));
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    bool done = true;
    CHECK_OK(kiln_dist_work_poll(w, &done));
    CHECK_MSG(!done, "the all-reduce completed while the compute stream that fills its tensor was held");
    CHECK(kiln_emu_hold_stream(h, false) == cudaSuccess);
    CHECK_OK(kiln_dist_work_wait(w));
    CHECK_OK(kiln_dist_work_free(w));
    double want = 0;
    for (int r = 0; r < size; r++) want += 2.0 + r;
    CHECK_MSG(host_at(t, 999) == want, "the all-reduce read %g, not the compute stream's values (%g)",
              host_at(t, 999), want);
    CHECK_OK(kiln_stream_synchronize(compute));
    kiln_stream_guard_end(&guard);
    kiln_scope_end();
    CHECK_OK(kiln_stream_destroy(compute));
#endif
}

/* ---- DDP on the device against one process ---- */

static void full_batch(kiln_tensor **x, kiln_tensor **y) {
    static float xs[N_ALL * 36];
    int64_t ys[N_ALL];
    for (int i = 0; i < N_ALL * 36; i++) xs[i] = sinf((float)i * 0.37f) + 0.1f * (float)(i % 7);
    for (int i = 0; i < N_ALL; i++) ys[i] = (i * 7 + i / 3) % 4;
    *x = kiln_from_data(KILN_SHAPE(N_ALL, 1, 6, 6), KILN_F32, KILN_CPU, xs);
    *y = kiln_from_data(KILN_SHAPE(N_ALL), KILN_I64, KILN_CPU, ys);
}

typedef struct net {
    kiln_module *m;
    kiln_tensor **params;
    int n;
    kiln_optimizer *opt;
    kiln_ddp *ddp;
} net;

static net make(uint64_t seed, const kiln_ddp_opts *o, bool wrap) {
    net r = {0};
    kiln_manual_seed(seed);
    kiln_module *layers[] = {
        kiln_nn_conv2d(1, 4, 3, 1, 1, 1, 1, true), kiln_nn_relu(), kiln_nn_flatten(1, -1),
        kiln_nn_linear(4 * 36, 16, true),          kiln_nn_relu(), kiln_nn_linear(16, 4, true)};
    r.m = kiln_nn_sequential(6, layers);
    CHECK(r.m != NULL);
    CHECK_OK(kiln_module_to(r.m, dev));
    CHECK_OK(kiln_module_parameters(r.m, &r.params, &r.n));
    if (wrap) CHECK_OK(kiln_ddp_wrap(r.m, world, o, &r.ddp));
    kiln_adam_opts ao = kiln_adam_defaults();
    ao.lr = 1e-2;
    r.opt = kiln_adam(r.params, r.n, &ao);
    CHECK(r.opt != NULL);
    return r;
}

static void drop(net *r) {
    kiln_ddp_free(r->ddp);
    kiln_optimizer_free(r->opt);
    free(r->params);
    kiln_module_free(r->m);
}

static void train_step(net *r, int64_t lo, int64_t hi) {
    kiln_scope_begin();
    kiln_tensor *x, *y;
    full_batch(&x, &y);
    CHECK_OK(kiln_optimizer_zero_grad(r->opt, true));
    kiln_tensor *xs = kiln_to(kiln_narrow(x, 0, lo, hi - lo), dev, KILN_F32, 0);
    kiln_tensor *ys = kiln_to(kiln_narrow(y, 0, lo, hi - lo), dev, KILN_I64, 0);
    if (r->ddp) CHECK_OK(kiln_ddp_set_sample_count(r->ddp, hi - lo));
    kiln_tensor *out = r->ddp ? kiln_ddp_forward(r->ddp, xs) : kiln_module_forward(r->m, xs);
    CHECK(out != NULL);
    CHECK_OK(kiln_backward(kiln_cross_entropy(out, ys, NULL), NULL, false));
    if (r->ddp) CHECK_OK(kiln_ddp_finish_grads(r->ddp));
    CHECK_OK(kiln_optimizer_step(r->opt));
    kiln_scope_end();
}

static double rel_distance(const net *a, const net *b, bool grads) {
    double d2 = 0, a2 = 0;
    kiln_scope_begin();
    for (int i = 0; i < a->n; i++) {
        kiln_tensor *ta = grads ? kiln_grad(a->params[i]) : a->params[i];
        kiln_tensor *tb = grads ? kiln_grad(b->params[i]) : b->params[i];
        CHECK(ta && tb);
        if (!ta || !tb) continue;
        const double *p = kiln_data_ptr(kiln_to(ta, KILN_CPU, KILN_F64, KILN_COPY));
        const double *q = kiln_data_ptr(kiln_to(tb, KILN_CPU, KILN_F64, KILN_COPY));
        for (int64_t j = 0; j < kiln_numel(ta); j++) {
            d2 += (p[j] - q[j]) * (p[j] - q[j]);
            a2 += p[j] * p[j];
        }
    }
    kiln_scope_end();
    return sqrt(d2) / (sqrt(a2) + 1e-30);
}

static void ddp_case(const char *name, bool uneven, bool small_buckets) {
    kiln_ddp_opts o = kiln_ddp_opts_default();
    if (small_buckets) o.bucket_cap_mb = o.first_bucket_mb = 1e-9;
    net ref = make(7, NULL, false);
    net dp = make(7 + (uint64_t)rank * 1000, &o, true);
    int64_t lo = (int64_t)N_ALL * rank / size, hi = (int64_t)N_ALL * (rank + 1) / size;
    if (uneven && size == 2) lo = rank == 0 ? 0 : 70, hi = rank == 0 ? 70 : N_ALL;
    for (int s = 0; s < STEPS; s++) {
        train_step(&ref, 0, N_ALL);
        train_step(&dp, lo, hi);
    }
    double p = rel_distance(&ref, &dp, false), g = rel_distance(&ref, &dp, true);
    printf("rank %d: DDP on the device vs one process, %s: parameters after %d Adam steps %.3g, last "
           "gradients %.3g\n",
           rank, name, STEPS, p, g);
    CHECK_MSG(p < 2e-5, "%s: parameters differ by %g", name, p);
    CHECK_MSG(g < 2e-5, "%s: gradients differ by %g", name, g);
    drop(&ref);
    drop(&dp);
}

int main(void) {
    if (kiln_init()) return 1;
    int ndev = kiln_device_count(KILN_DEVICE_CUDA);
    if (ndev < 1) kt_skip("no CUDA device");
    CHECK_OK(kiln_dist_init(&world));
    if (!world) return kt_finish();
    rank = kiln_dist_rank(world);
    size = kiln_dist_world_size(world);
    dev = (kiln_device){KILN_DEVICE_CUDA, kiln_dist_local_rank(world) % ndev};
    CHECK_OK(kiln_dist_group_set_timeout(world, 60.0));
    kiln_scope_begin();
    collectives("through NCCL");
    test_ordered_after_compute();
    ddp_case("64+64", false, false);
    ddp_case("70+58 weighted, a bucket per parameter", true, true);
    setenv("KILN_DIST_NCCL", "0", 1);
    collectives("staged through pinned memory over MPI");
    ddp_case("70+58 weighted, staged", true, false);
    kiln_scope_end();
    CHECK_OK(kiln_dist_shutdown());
    kiln_shutdown();
    return kt_finish();
}
