/* Collectives on CPU tensors, run both as a singleton (no launcher: a world
 * of 1, no MPI call) and under `mpirun -np 2` (tests/CMakeLists.txt):
 * exact values for sum, average, broadcast, all-gather and reduce-scatter
 * on odd sizes and several dtypes, a non-contiguous tensor, polling; the
 * KILN_DIST_DEBUG shape check (ranks calling different shapes fail on
 * every rank, naming both); the watchdog (one rank skips a collective:
 * the waiting rank gets an error naming the collective and the rank, after
 * KILN_DIST_TIMEOUT seconds, and the work still completes when the late
 * rank joins); the distributed sampler's shards across real ranks. The
 * 2-rank run is repeated with KILN_DIST_DEBUG=1: every collective then
 * passes the cross-rank check first. */
#include <time.h>

#include "kiln_config.h"
#include "test_util.h"

static kiln_dist_group *world;
static int rank, size;

static void test_all_reduce(void) {
    /* f32 (7): rank r holds r * 10 + i; the sum is exact in f32. */
    float v[7];
    for (int i = 0; i < 7; i++) v[i] = (float)(rank * 10 + i);
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(7), KILN_F32, KILN_CPU, v);
    CHECK_OK(kiln_dist_all_reduce(world, t, KILN_DIST_SUM, NULL));
    const float *s = kiln_data_ptr(t);
    for (int i = 0; i < 7; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += r * 10 + i;
        CHECK_MSG(s[i] == (float)want, "sum[%d] = %g, want %g", i, s[i], want);
    }
    /* f64 (3, 3) average of r + 0.25 i. */
    double d[9];
    for (int i = 0; i < 9; i++) d[i] = rank + 0.25 * i;
    kiln_tensor *a = kiln_from_data(KILN_SHAPE(3, 3), KILN_F64, KILN_CPU, d);
    CHECK_OK(kiln_dist_all_reduce(world, a, KILN_DIST_AVG, NULL));
    const double *av = kiln_data_ptr(a);
    for (int i = 0; i < 9; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += r + 0.25 * i;
        want /= size;
        CHECK_MSG(fabs(av[i] - want) < 1e-12, "avg[%d] = %g, want %g", i, av[i], want);
    }
    /* i64 sum of large values (exact), and average refused for integers. */
    int64_t big[5];
    for (int i = 0; i < 5; i++) big[i] = ((int64_t)1 << 40) + rank * 3 + i;
    kiln_tensor *b = kiln_from_data(KILN_SHAPE(5), KILN_I64, KILN_CPU, big);
    CHECK_OK(kiln_dist_all_reduce(world, b, KILN_DIST_SUM, NULL));
    const int64_t *bs = kiln_data_ptr(b);
    for (int i = 0; i < 5; i++) {
        int64_t want = 0;
        for (int r = 0; r < size; r++) want += ((int64_t)1 << 40) + r * 3 + i;
        CHECK_EQ_I(bs[i], want);
    }
    CHECK_FAILS(kiln_dist_all_reduce(world, b, KILN_DIST_AVG, NULL), KILN_ERR_INVALID_ARGUMENT, "integer");
    kiln_tensor *h = kiln_zeros(KILN_SHAPE(3), KILN_F16, KILN_CPU);
    CHECK_FAILS(kiln_dist_all_reduce(world, h, KILN_DIST_SUM, NULL), KILN_ERR_UNSUPPORTED, "f16");
    /* A non-contiguous view (the transpose of a (3, 5)) is reduced through a
     * copy written back at completion; polled, then waited. */
    float base[15];
    for (int i = 0; i < 15; i++) base[i] = (float)(i + 100 * rank);
    kiln_tensor *m = kiln_from_data(KILN_SHAPE(3, 5), KILN_F32, KILN_CPU, base);
    kiln_tensor *tr = kiln_transpose(m, 0, 1);
    CHECK(!kiln_is_contiguous(tr));
    kiln_dist_work *w = NULL;
    CHECK_OK(kiln_dist_all_reduce(world, tr, KILN_DIST_SUM, &w));
    bool done = false;
    for (int i = 0; i < 100 && !done; i++) CHECK_OK(kiln_dist_work_poll(w, &done));
    CHECK_OK(kiln_dist_work_wait(w));
    CHECK_OK(kiln_dist_work_poll(w, &done));
    CHECK(done);
    CHECK_OK(kiln_dist_work_free(w));
    const float *ms = kiln_data_ptr(m);
    for (int i = 0; i < 15; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += i + 100 * r;
        CHECK_MSG(ms[i] == (float)want, "strided sum[%d] = %g, want %g", i, ms[i], want);
    }
}

static void test_broadcast_gather_scatter(void) {
    int root = size - 1;
    int32_t v[11];
    for (int i = 0; i < 11; i++) v[i] = rank == root ? 7 * i + 1 : -1;
    kiln_tensor *t = kiln_from_data(KILN_SHAPE(11), KILN_I32, KILN_CPU, v);
    CHECK_OK(kiln_dist_broadcast(world, t, root, NULL));
    const int32_t *tv = kiln_data_ptr(t);
    for (int i = 0; i < 11; i++) CHECK_EQ_I(tv[i], 7 * i + 1);
    CHECK_FAILS(kiln_dist_broadcast(world, t, size, NULL), KILN_ERR_INVALID_ARGUMENT, "root");

    /* all_gather of 5 floats per rank into (size, 5). */
    float in[5];
    for (int i = 0; i < 5; i++) in[i] = (float)(rank * 1000 + i) + 0.5f;
    kiln_tensor *x = kiln_from_data(KILN_SHAPE(5), KILN_F32, KILN_CPU, in);
    kiln_tensor *out = kiln_full(KILN_SHAPE(size, 5), -1.0, KILN_F32, KILN_CPU);
    CHECK_OK(kiln_dist_all_gather(world, out, x, NULL));
    const float *ov = kiln_data_ptr(out);
    for (int r = 0; r < size; r++)
        for (int i = 0; i < 5; i++) CHECK(ov[r * 5 + i] == (float)(r * 1000 + i) + 0.5f);
    kiln_tensor *wrong = kiln_zeros(KILN_SHAPE(size * 5 + 1), KILN_F32, KILN_CPU);
    CHECK_FAILS(kiln_dist_all_gather(world, wrong, x, NULL), KILN_ERR_INVALID_ARGUMENT, "world size");

    /* reduce_scatter: (size * 3) in, rank r gets chunk r of the sum. */
    int n = size * 3;
    double *rs = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) rs[i] = (double)(i * (rank + 1));
    kiln_tensor *rin = kiln_from_data(KILN_SHAPE(n), KILN_F64, KILN_CPU, rs);
    kiln_tensor *rout = kiln_zeros(KILN_SHAPE(3), KILN_F64, KILN_CPU);
    CHECK_OK(kiln_dist_reduce_scatter(world, rout, rin, KILN_DIST_SUM, NULL));
    const double *rv = kiln_data_ptr(rout);
    int wsum = size * (size + 1) / 2;
    for (int i = 0; i < 3; i++) CHECK(rv[i] == (double)((rank * 3 + i) * wsum));
    CHECK_OK(kiln_dist_reduce_scatter(world, rout, rin, KILN_DIST_AVG, NULL));
    for (int i = 0; i < 3; i++) CHECK(fabs(rv[i] - (double)((rank * 3 + i) * wsum) / size) < 1e-12);
    free(rs);
    kiln_dist_work *bw = NULL;
    CHECK_OK(kiln_dist_barrier(world, &bw));
    CHECK_OK(kiln_dist_work_wait(bw));
    CHECK_OK(kiln_dist_work_free(bw));
}

/* KILN_DIST_DEBUG on a group of its own: equal shapes pass; rank r using
 * (3, 4 + r) fails on every rank with both shapes named. */
static void test_debug_mismatch(void) {
    kiln_dist_group *g = NULL;
    CHECK_OK(kiln_dist_group_dup(world, &g));
    kiln_dist_group_set_debug(g, true);
    kiln_tensor *same = kiln_ones(KILN_SHAPE(3, 4), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_dist_all_reduce(g, same, KILN_DIST_SUM, NULL));
    CHECK(((float *)kiln_data_ptr(same))[5] == (float)size);
    if (size > 1) {
        kiln_tensor *t = kiln_ones(KILN_SHAPE(3, 4 + rank), KILN_F32, KILN_CPU);
        CHECK_FAILS(kiln_dist_all_reduce(g, t, KILN_DIST_SUM, NULL), KILN_ERR_INVALID_ARGUMENT, "[3, 4]");
        CHECK_MSG(strstr(kiln_error_message(), "rank 1 calls all_reduce #1 of f32 [3, 5]") != NULL,
                  "error: %s", kiln_error_message());
        CHECK_MSG(strstr(kiln_error_message(), "rank 0 calls all_reduce #1 of f32 [3, 4]") != NULL,
                  "error: %s", kiln_error_message());
        /* Nothing was started: the group still works. */
        CHECK_OK(kiln_dist_all_reduce(g, same, KILN_DIST_SUM, NULL));
    }
    CHECK_OK(kiln_dist_group_free(g));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The watchdog: on a group with the timeout from KILN_DIST_TIMEOUT (the
 * CTest entry sets 2 s), rank 0 starts an all-reduce the others skip. */
static void test_timeout(double env_timeout) {
    if (size < 2) return;
    kiln_dist_group *g = NULL;
    CHECK_OK(kiln_dist_group_dup(world, &g));
    CHECK_OK(kiln_dist_group_set_timeout(g, env_timeout));
    kiln_dist_group_set_debug(g, false); /* the work must start for rank 0 to wait on it */
    kiln_tensor *t = kiln_full(KILN_SHAPE(6), rank + 1.0, KILN_F32, KILN_CPU);
    kiln_dist_work *w = NULL;
    if (rank == 0) {
        CHECK_OK(kiln_dist_all_reduce(g, t, KILN_DIST_SUM, &w));
        double t0 = now_s();
        CHECK_FAILS(kiln_dist_work_wait(w), KILN_ERR_DEVICE,
                    "all_reduce #0 of f32 [6] (sum) did not complete");
        double waited = now_s() - t0;
        CHECK_MSG(strstr(kiln_error_message(), "waiting on rank 1") != NULL, "error: %s",
                  kiln_error_message());
        CHECK_MSG(waited >= env_timeout * 0.99 && waited < env_timeout + 30, "waited %.2f s", waited);
        CHECK_FAILS(kiln_dist_work_free(w), KILN_ERR_STATE, "still in flight");
        CHECK_FAILS(kiln_dist_group_free(g), KILN_ERR_STATE, "in flight");
    }
    /* The late ranks join after rank 0 has given up (with a generous bound
     * now: only the wait above is meant to time out). */
    CHECK_OK(kiln_dist_group_set_timeout(g, 60.0));
    CHECK_OK(kiln_dist_barrier(world, NULL));
    if (rank != 0) CHECK_OK(kiln_dist_all_reduce(g, t, KILN_DIST_SUM, NULL));
    if (rank == 0) {
        CHECK_OK(kiln_dist_work_wait_timeout(w, 60.0));
        CHECK_OK(kiln_dist_work_free(w));
    }
    double want = size * (size + 1) / 2.0;
    CHECK_MSG(((float *)kiln_data_ptr(t))[3] == (float)want, "late sum %g, want %g",
              ((float *)kiln_data_ptr(t))[3], want);
    CHECK_OK(kiln_dist_group_free(g));
}

/* Each real rank's sampler shard: all_gather them; together they cover
 * 0..n-1, overlapping only in the padding. */
static void test_sampler_across_ranks(void) {
    const int64_t n = 23;
    int64_t *idx = NULL, count = 0;
    CHECK_OK(kiln_dist_sampler_indices(n, size, rank, 3, 42, true, false, &idx, &count));
    int64_t per = (n + size - 1) / size;
    CHECK_EQ_I(count, per);
    kiln_tensor *mine = kiln_from_data(KILN_SHAPE(per), KILN_I64, KILN_CPU, idx);
    kiln_tensor *all = kiln_zeros(KILN_SHAPE(size * per), KILN_I64, KILN_CPU);
    CHECK_OK(kiln_dist_all_gather(world, all, mine, NULL));
    int seen[23] = {0};
    const int64_t *v = kiln_data_ptr(all);
    for (int64_t i = 0; i < size * per; i++) {
        CHECK(v[i] >= 0 && v[i] < n);
        if (v[i] >= 0 && v[i] < n) seen[v[i]]++;
    }
    int repeats = 0;
    for (int i = 0; i < n; i++) {
        CHECK_MSG(seen[i] >= 1, "index %d is on no rank", i);
        repeats += seen[i] > 1 ? seen[i] - 1 : 0;
    }
    CHECK_EQ_I(repeats, size * per - n);
    free(idx);
}

/* A build without MPI runs a world of 1 only: started by a launcher that
 * asks for 2 ranks it refuses, naming the build option. */
static void test_without_mpi(void) {
#if !KILN_WITH_MPI
    if (getenv("OMPI_COMM_WORLD_SIZE")) return;
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    kiln_dist_group *g = NULL;
    CHECK_FAILS(kiln_dist_init(&g), KILN_ERR_UNSUPPORTED, "KILN_WITH_MPI=OFF");
    CHECK(g == NULL);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    printf("without MPI: a world of 2 is refused\n");
#endif
}

int main(void) {
    if (kiln_init()) return 1;
    test_without_mpi();
    /* A bad setting fails before anything starts; the next init works. */
    const char *env = getenv("KILN_DIST_TIMEOUT");
    char *saved = env ? strdup(env) : NULL;
    setenv("KILN_DIST_TIMEOUT", "soon", 1);
    CHECK_FAILS(kiln_dist_init(&world), KILN_ERR_INVALID_ARGUMENT, "KILN_DIST_TIMEOUT='soon'");
    CHECK(world == NULL);
    if (saved)
        setenv("KILN_DIST_TIMEOUT", saved, 1);
    else
        unsetenv("KILN_DIST_TIMEOUT");
    free(saved);
    CHECK_OK(kiln_dist_init(&world));
    if (!world) return kt_finish();
    rank = kiln_dist_rank(world);
    size = kiln_dist_world_size(world);
    env = getenv("KILN_DIST_TIMEOUT");
    double env_timeout = env ? atof(env) : 300.0;
    CHECK(kiln_dist_group_timeout(world) == env_timeout);
    const char *debug_env = getenv("KILN_DIST_DEBUG");
    CHECK(kiln_dist_group_debug(world) == (debug_env && debug_env[0] == '1'));
    /* The world group waits generously; the short bound is for test_timeout. */
    CHECK_OK(kiln_dist_group_set_timeout(world, 60.0));
    kiln_dist_group *again = NULL;
    CHECK_FAILS(kiln_dist_init(&again), KILN_ERR_STATE, "already initialised");
    printf("rank %d of %d (local rank %d)\n", rank, size, kiln_dist_local_rank(world));

    kiln_scope_begin();
    test_all_reduce();
    test_broadcast_gather_scatter();
    test_debug_mismatch();
    test_timeout(env_timeout < 60.0 ? env_timeout : 2.0);
    test_sampler_across_ranks();
    kiln_scope_end();

    CHECK_OK(kiln_dist_shutdown());
    kiln_shutdown();
    return kt_finish();
}
