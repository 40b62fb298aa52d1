/* `kiln bench ddp --model-scaling`: a cost model of data-parallel training,
 * fitted here and used to predict scaling past one machine.
 *
 * Per synchronised step of one rank:
 *   compute   C: forward + backward + optimizer, measured (one process);
 *   backward  B = b x C, the share b measured with the same timer;
 *   gradients G bytes, in DDP's buckets (reverse parameter order, the
 *             first 1 MiB, the others `cap`);
 *   a ring all-reduce of S bytes over N ranks takes
 *             t(S) = 2(N-1)/N x S / bandwidth + 2(N-1) x latency
 *             (2(N-1) steps, each moving S/N bytes);
 *   comm      = sum of t over the buckets;
 *   exposed   = comm without overlap; with overlap (buckets start from the
 *             gradient hooks while backward runs) max(t(last bucket),
 *             comm - B): the last bucket starts when backward ends, and
 *             what does not fit inside backward waits after it;
 *   efficiency = C / (C + exposed).
 * The transport's latency and bandwidth come from an MPI ping-pong between
 * two ranks here; the model is checked against `kiln bench ddp`'s measured
 * 1- and N-rank runs (efficiency and the hidden share). For GPUs the
 * compute is scaled by peak FLOP/s (the GPU is assumed to run the step at
 * the share of its FP32 peak that Kiln reaches of this CPU's FMA peak,
 * measured), and the fabrics' bandwidths and latencies are assumptions,
 * printed with the results. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "bench.h"
#include "cnn_peer.h"
#include "cpu_peak.h"
#include "ddp_model.h"
#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "kiln_config.h"

#if KILN_WITH_MPI
#include <mpi.h>
#endif

#define PP_SIZES         6
#define MAX_BUCKETS      4096
#define GPU_PEAK_GFLOP_S 19500.0 /* A100 FP32 (non-tensor) peak: the assumed GPU */

/* ---- The ping-pong ------------------------------------------------------------------- */

int ddp_pingpong_worker(void) {
#if KILN_WITH_MPI
    kiln_dist_group *world = NULL;
    if (kiln_dist_init(&world) || kiln_dist_world_size(world) != 2) {
        fprintf(stderr, "kiln bench ddp --pingpong: needs exactly 2 ranks under mpirun: %s\n",
                kiln_error_message());
        return 1;
    }
    int rank = kiln_dist_rank(world);
    static const int sizes[PP_SIZES] = {8, 1024, 64 << 10, 1 << 20, 8 << 20, 32 << 20};
    static const int reps[PP_SIZES] = {2000, 1000, 200, 40, 8, 4};
    char *buf = malloc((size_t)(32 << 20));
    if (!buf) return 1;
    memset(buf, 1, (size_t)(32 << 20));
    double one_way[PP_SIZES];
    for (int k = 0; k < PP_SIZES; k++) {
        double best = INFINITY;
        for (int trial = 0; trial < 4; trial++) { /* the first warms up; the best of the rest */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int r = 0; r < reps[k]; r++) {
                if (rank == 0) {
                    MPI_Send(buf, sizes[k], MPI_BYTE, 1, 7, MPI_COMM_WORLD);
                    MPI_Recv(buf, sizes[k], MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, sizes[k], MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, sizes[k], MPI_BYTE, 0, 7, MPI_COMM_WORLD);
                }
            }
            double t = (MPI_Wtime() - t0) / reps[k] / 2;
            if (trial > 0 && t < best) best = t;
        }
        one_way[k] = best;
    }
    free(buf);
    if (rank == 0) {
        double lat = one_way[0], bw = (sizes[PP_SIZES - 1] - sizes[0]) / (one_way[PP_SIZES - 1] - one_way[0]);
        printf("RESULT {\"latency_us\":%.3f,\"bandwidth_gbs\":%.4f,\"bytes\":[", 1e6 * lat, 1e-9 * bw);
        for (int k = 0; k < PP_SIZES; k++) printf("%s%d", k ? "," : "", sizes[k]);
        printf("],\"one_way_us\":[");
        for (int k = 0; k < PP_SIZES; k++) printf("%s%.3f", k ? "," : "", 1e6 * one_way[k]);
        printf("]}\n");
        fflush(stdout);
    }
    return kiln_dist_shutdown() == KILN_OK ? 0 : 1;
#else
    fprintf(stderr, "kiln bench ddp --pingpong: this build has no MPI (KILN_WITH_MPI=OFF)\n");
    return 1;
#endif
}

typedef struct pingpong {
    double latency_s, bandwidth; /* bytes/s */
    double one_way_us[PP_SIZES];
    int bytes[PP_SIZES];
} pingpong;

static int run_pingpong(const ddp_model_measured *m, pingpong *out) {
    char *argv[] = {(char *)m->mpirun, "--oversubscribe", "--bind-to", "none",       "-np", "2",
                    (char *)m->exe,    "bench",           "ddp",       "--pingpong", NULL};
    char result[2048], last[400];
    int code = 0;
    int err = bench_peer_spawn(argv, result, sizeof result, last, sizeof last, &code);
    if (err || code || !result[0]) {
        fprintf(stderr, "kiln bench ddp --model-scaling: the ping-pong job failed (%s, status %d): %s\n",
                err ? strerror(err) : "ran", code, last);
        return 1;
    }
    cJSON *o = cJSON_Parse(result);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "latency_us");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "bandwidth_gbs");
    const cJSON *ow = cJSON_GetObjectItemCaseSensitive(o, "one_way_us");
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(o, "bytes");
    bool ok = cJSON_IsNumber(l) && cJSON_IsNumber(b) && cJSON_GetArraySize(ow) == PP_SIZES &&
              cJSON_GetArraySize(by) == PP_SIZES && b->valuedouble > 0;
    if (ok) {
        out->latency_s = 1e-6 * l->valuedouble, out->bandwidth = 1e9 * b->valuedouble;
        for (int k = 0; k < PP_SIZES; k++) {
            out->one_way_us[k] = cJSON_GetArrayItem(ow, k)->valuedouble;
            out->bytes[k] = cJSON_GetArrayItem(by, k)->valueint;
        }
    }
    cJSON_Delete(o);
    if (!ok)
        fprintf(stderr, "kiln bench ddp --model-scaling: the ping-pong's RESULT does not parse: %s\n",
                result);
    return ok ? 0 : 1;
}

/* ---- The models: gradients and compute ------------------------------------------------- */

typedef struct model_facts {
    const char *name;
    double grad_bytes;
    double bucket_params[MAX_BUCKETS]; /* per-parameter bytes, reverse order */
    int n_params;
    double step_s, backward_s; /* measured here, one process */
} model_facts;

/* The small ResNet's spec: models/ under the working directory, or one or
 * two levels above the kiln binary. */
static bool find_resnet(const char *exe, char *buf, size_t n) {
    const char *rel = "models/resnet_small_cifar10.txt";
    if (access(rel, R_OK) == 0) return snprintf(buf, n, "%s", rel) > 0;
    char dir[3072];
    snprintf(dir, sizeof dir, "%s", exe);
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash) break;
        *slash = '\0';
        if (snprintf(buf, n, "%.3071s/%s", dir, rel) >= (int)n) return false;
        if (access(buf, R_OK) == 0) return true;
    }
    return false;
}

/* Parameter bytes (reverse order) and the median step and backward times
 * of `steps` Adam steps at `batch` after two warm-up steps. */
static kiln_status measure_model(kiln_module *m, int batch, int steps, model_facts *f) {
    kiln_tensor **params = NULL;
    int np = 0;
    KILN_TRY(kiln_module_parameters(m, &params, &np));
    f->n_params = 0, f->grad_bytes = 0;
    for (int i = np - 1; i >= 0 && f->n_params < MAX_BUCKETS; i--) {
        double b = (double)kiln_numel(params[i]) * (double)kiln_dtype_size(kiln_dtype_of(params[i]));
        f->bucket_params[f->n_params++] = b;
        f->grad_bytes += b;
    }
    kiln_optimizer *opt = kiln_adam(params, np, NULL);
    free(params);
    if (!opt) return kiln_error_last()->status;
    kiln_manual_seed(5);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(batch, 3, 32, 32), KILN_F32, KILN_CPU);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(batch), KILN_I64, KILN_CPU);
    double step[16], back[16];
    kiln_status st = x && y ? KILN_OK : kiln_error_last()->status;
    for (int s = 0; s < steps + 2 && !st; s++) {
        kiln_scope_begin();
        double t0 = tool_now_s();
        st = kiln_optimizer_zero_grad(opt, true);
        kiln_tensor *loss = st ? NULL : kiln_cross_entropy(kiln_module_forward(m, x), y, NULL);
        if (!st && !loss) st = kiln_error_last()->status;
        double t1 = tool_now_s();
        if (!st) st = kiln_backward(loss, NULL, false);
        double t2 = tool_now_s();
        if (!st) st = kiln_optimizer_step(opt);
        double t3 = tool_now_s();
        kiln_scope_end();
        if (s >= 2) step[s - 2] = t3 - t0, back[s - 2] = t2 - t1;
    }
    kiln_optimizer_free(opt);
    kiln_release(x), kiln_release(y);
    if (st) return st;
    f->step_s = tool_median(step, steps);
    f->backward_s = tool_median(back, steps);
    return KILN_OK;
}

/* ---- The model ---------------------------------------------------------------------------- */

typedef struct fabric {
    const char *name;
    double bandwidth, latency_s; /* bytes/s, s */
} fabric;

typedef struct prediction {
    double comm_s, exposed_s, efficiency, efficiency_no_overlap;
    int buckets;
} prediction;

static double ring_s(double bytes, int n, const fabric *fb) {
    if (n < 2 || bytes <= 0) return 0.0;
    return 2.0 * (n - 1) / n * bytes / fb->bandwidth + 2.0 * (n - 1) * fb->latency_s;
}

/* DDP's buckets over f's parameters (reverse order: the first 1 MiB, then
 * `cap_mib`), gradients scaled by `scale` (compression), step compute
 * `compute_s` with backward `backward_s`. */
static prediction predict(const model_facts *f, int n, const fabric *fb, double cap_mib, double scale,
                          double compute_s, double backward_s) {
    prediction p = {0};
    double first = 1.0 * 1024 * 1024, cap = cap_mib * 1024 * 1024, bytes = 0, last = 0;
    for (int i = 0; i < f->n_params; i++) {
        double limit = p.buckets <= 1 ? first : cap;
        if (p.buckets == 0 || bytes >= limit) {
            if (p.buckets) p.comm_s += ring_s(bytes * scale, n, fb);
            p.buckets++;
            bytes = 0;
        }
        bytes += f->bucket_params[i];
    }
    last = ring_s(bytes * scale, n, fb);
    p.comm_s += last;
    double over = p.comm_s - backward_s;
    p.exposed_s = last > over ? last : over;
    if (p.exposed_s > p.comm_s) p.exposed_s = p.comm_s;
    p.efficiency = compute_s / (compute_s + p.exposed_s);
    p.efficiency_no_overlap = compute_s / (compute_s + p.comm_s);
    return p;
}

static const fabric fabrics[] = {
    {"NVLink (8 GPUs, 1 machine)", 200e9, 10e-6},
    {"InfiniBand HDR 200 Gb/s", 23e9, 10e-6},
    {"Ethernet 25 Gb/s (TCP)", 2.5e9, 50e-6},
};

int ddp_model_scaling(const ddp_model_measured *m) {
    pingpong pp;
    if (run_pingpong(m, &pp)) return 1;
    static model_facts facts[2];
    memset(facts, 0, sizeof facts);
    facts[0].name = "tutorial CNN", facts[1].name = "small ResNet";
    char resnet[4096];
    kiln_module *models[2] = {kiln_bench_cnn_model(), NULL};
    if (!find_resnet(m->exe, resnet, sizeof resnet)) {
        fprintf(stderr,
                "kiln bench ddp --model-scaling: models/resnet_small_cifar10.txt not found (run from the "
                "source tree)\n");
        return 1;
    }
    if (!models[0] || kiln_model_spec_load(resnet, 3, 32, 32, &models[1])) {
        fprintf(stderr, "kiln bench ddp --model-scaling: %s\n", kiln_error_message());
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        if (measure_model(models[i], m->batch, i == 0 ? 8 : 4, &facts[i])) {
            fprintf(stderr, "kiln bench ddp --model-scaling: timing the %s: %s\n", facts[i].name,
                    kiln_error_message());
            return 1;
        }
        kiln_module_free(models[i]);
    }
    bench_fma_peak peak;
    bench_fma_peak_measure(m->threads, 0.5, &peak);
    double gpu_factor = peak.gflop_s > 0 ? peak.gflop_s / GPU_PEAK_GFLOP_S : 0.01;

    /* The check: the CNN at N ranks here, compute from the 1-process run. */
    fabric here = {"MPI here (ping-pong)", pp.bandwidth, pp.latency_s};
    double c1 = m->batch / m->img_s_1, b_share = facts[0].backward_s / facts[0].step_s;
    prediction chk = predict(&facts[0], m->ranks, &here, 25.0, 1.0, c1, b_share * c1);
    double eff_meas = m->img_s_n / (m->ranks * m->img_s_1);
    double hid_pred = chk.comm_s > 0 ? 1.0 - chk.exposed_s / chk.comm_s : 0.0;

    printf("\nkiln bench ddp --model-scaling (%s, %d thread%s per rank)\n", m->cpu, m->threads,
           m->threads == 1 ? "" : "s");
    printf("ping-pong (MPI_Send/Recv, 2 ranks here), one-way:");
    for (int k = 0; k < PP_SIZES; k++) printf(" %d B %.1f us;", pp.bytes[k], pp.one_way_us[k]);
    printf("\n  fit: latency %.2f us, bandwidth %.2f GB/s\n", 1e6 * pp.latency_s, 1e-9 * pp.bandwidth);
    for (int i = 0; i < 2; i++)
        printf("%s: %.2f MB of gradients (%d tensors), step %.1f ms at batch %d (backward %.0f%%), measured "
               "here\n",
               facts[i].name, 1e-6 * facts[i].grad_bytes, facts[i].n_params, 1e3 * facts[i].step_s, m->batch,
               100 * facts[i].backward_s / facts[i].step_s);
    printf("\ncheck against the measured runs (tutorial CNN, %d ranks, 25 MiB buckets):\n", m->ranks);
    printf("  predicted: all-reduce %.3f ms/step, exposed %.3f ms, hidden %.1f%%, efficiency %.3f\n",
           1e3 * chk.comm_s, 1e3 * chk.exposed_s, 100 * hid_pred, chk.efficiency);
    printf("  measured:  all-reduce %.3f ms/step (start to seen complete), hidden %.1f%%, efficiency %.3f\n",
           m->allreduce_ms, 100 * m->hidden, eff_meas);
    printf("  the rest of the measured loss (%.1f%% of the step) is the ranks sharing %ld cores and their "
           "memory "
           "bandwidth, which the model does not describe\n",
           100 * (chk.efficiency - eff_meas) / chk.efficiency, sysconf(_SC_NPROCESSORS_ONLN));

    printf(
        "\npredictions (assumptions: per-GPU batch %d; a GPU runs the step at the share of its %.1f TFLOP/s "
        "FP32 peak that Kiln reaches of this CPU's %.0f GFLOP/s FMA peak, i.e. %.0fx faster; fabrics "
        "below):\n",
        m->batch, 1e-3 * GPU_PEAK_GFLOP_S, peak.gflop_s, 1.0 / gpu_factor);
    printf("%-14s %-28s %9s %5s %9s %9s %9s %8s %10s %9s\n", "model", "fabric (assumed GB/s, us)", "", "N",
           "step ms", "comm ms", "exposed", "eff", "no overlap", "grads/4");
    cJSON *json = cJSON_CreateObject();
    cJSON_AddStringToObject(json, "bench", "ddp-model-scaling");
    cJSON_AddNumberToObject(json, "threads", m->threads);
    cJSON_AddStringToObject(json, "cpu", m->cpu);
    cJSON_AddNumberToObject(json, "latency_us", 1e6 * pp.latency_s);
    cJSON_AddNumberToObject(json, "bandwidth_gbs", 1e-9 * pp.bandwidth);
    cJSON *jc = cJSON_AddObjectToObject(json, "check");
    cJSON_AddNumberToObject(jc, "efficiency_predicted", chk.efficiency);
    cJSON_AddNumberToObject(jc, "efficiency_measured", eff_meas);
    cJSON_AddNumberToObject(jc, "hidden_predicted", hid_pred);
    cJSON_AddNumberToObject(jc, "hidden_measured", m->hidden);
    cJSON *jp = cJSON_AddArrayToObject(json, "predictions");
    for (int i = 0; i < 2; i++) {
        double c = facts[i].step_s * gpu_factor, b = facts[i].backward_s * gpu_factor;
        for (size_t fi = 0; fi < sizeof fabrics / sizeof fabrics[0]; fi++) {
            static const int ns_nv[] = {8}, ns_net[] = {2, 8, 64};
            const int *ns = fi == 0 ? ns_nv : ns_net;
            int count = fi == 0 ? 1 : 3;
            for (int k = 0; k < count; k++) {
                prediction p = predict(&facts[i], ns[k], &fabrics[fi], 25.0, 1.0, c, b);
                prediction q = predict(&facts[i], ns[k], &fabrics[fi], 25.0, 0.25, c, b);
                char fab[64];
                snprintf(fab, sizeof fab, "%s", fabrics[fi].name);
                printf("%-14s %-28s %4.0f/%-4.0f %5d %9.3f %9.3f %9.3f %8.3f %10.3f %9.3f\n", facts[i].name,
                       fab, 1e-9 * fabrics[fi].bandwidth, 1e6 * fabrics[fi].latency_s, ns[k], 1e3 * c,
                       1e3 * p.comm_s, 1e3 * p.exposed_s, p.efficiency, p.efficiency_no_overlap,
                       q.efficiency);
                cJSON *r = cJSON_CreateObject();
                cJSON_AddStringToObject(r, "model", facts[i].name);
                cJSON_AddStringToObject(r, "fabric", fabrics[fi].name);
                cJSON_AddNumberToObject(r, "ranks", ns[k]);
                cJSON_AddNumberToObject(r, "efficiency", p.efficiency);
                cJSON_AddNumberToObject(r, "efficiency_no_overlap", p.efficiency_no_overlap);
                cJSON_AddNumberToObject(r, "efficiency_grads_quarter", q.efficiency);
                cJSON_AddItemToArray(jp, r);
            }
        }
    }
    printf("\nbucket size (small ResNet, efficiency with overlap; buckets in brackets):\n%-34s", "");
    static const double caps[] = {0.25, 1, 5, 25, 100};
    for (int j = 0; j < 5; j++) printf(" %10.2f MiB", caps[j]);
    printf("\n");
    static const struct { int fabric, n; } sweep[] = {{0, 8}, {1, 64}, {2, 8}, {2, 64}};
    for (size_t s = 0; s < sizeof sweep / sizeof sweep[0]; s++) {
        const fabric *fb = &fabrics[sweep[s].fabric];
        char label[80];
        snprintf(label, sizeof label, "%s, N=%d", fb->name, sweep[s].n);
        printf("%-34s", label);
        for (int j = 0; j < 5; j++) {
            prediction p = predict(&facts[1], sweep[s].n, fb, caps[j], 1.0, facts[1].step_s * gpu_factor,
                                   facts[1].backward_s * gpu_factor);
            printf("  %6.3f [%3d]", p.efficiency, p.buckets);
        }
        printf("\n");
    }
    printf(
        "\nhow to read it: 'no overlap' is every all-reduce after backward; 'grads/4' sends a quarter of the "
        "bytes (8-bit or top-k compression, its cost not counted); ZeRO-1/2 replace the all-reduce by a "
        "reduce-scatter and an all-gather of the same total bytes, so the same time: they save memory, "
        "not communication (ZeRO-3 adds a parameter all-gather in backward: 1.5x the bytes)\n");
    char *text = cJSON_PrintUnformatted(json);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(json);
    return 0;
}
