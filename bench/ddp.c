/* `kiln bench ddp`: data-parallel training of the tutorial CNN across
 * processes (DDP over MPI, CPU tensors), against PyTorch's
 * DistributedDataParallel over gloo (bench/peer/torch_ddp_bench.py).
 *
 * Weak scaling, as PyTorch's DDP benchmark measures it: every rank trains
 * the same per-rank batch (--batch, default 64) on T compute threads
 * (kiln --threads T), so N ranks train N x batch images per step. Reported:
 *   rate(1)     images/s of one process without DDP (the model of `kiln
 *               bench cnn`, Adam, cross-entropy, a fixed randn batch);
 *   rate(N)     images/s of all N ranks together, under DDP (default
 *               buckets), started as `mpirun -np N kiln bench ddp --worker`;
 *   efficiency  rate(N) / (N x rate(1)): 1 is perfect scaling;
 *   hidden      the share of the gradient all-reduces' time that ran while
 *               backward was still computing, on rank 0, from the profiler
 *               (kiln_dist records each collective as "mpi:all_reduce", from
 *               its start in a gradient hook to the hook or wait that saw it
 *               complete; backward is the worker's "backward" range), over
 *               --profile-steps steps after the timed ones;
 * and the same rates and efficiency for the PyTorch peer when
 * /usr/bin/python3 (--python) imports torch, with the two ratios of the
 * issue's bar: Kiln's efficiency / PyTorch's, and Kiln's N-process images/s
 * / PyTorch's.
 *
 * Each round runs every measurement once, in a fresh process (Kiln 1 and N,
 * the peer's 1 and N), the order rotated from round to round so a shared
 * machine's slow minutes spread over all of them; each process times
 * --steps steps after --warmup untimed ones, between barriers. Medians of
 * --rounds rounds [min-max], then one JSON line.
 *
 *   kiln bench ddp [--ranks N] [--batch B] [--steps S] [--warmup W]
 *                  [--rounds R] [--profile-steps P] [--no-peer]
 *                  [--python PATH] [--peer-script PATH] [--threads T]
 *                  [--model-scaling]
 *
 * --model-scaling then fits a cost model on these measurements and an MPI
 * ping-pong, and predicts scaling past this machine (bench/ddp_model.c).
 *
 * Exit 77 (with the reason) when mpirun is not on PATH or the build has no
 * MPI: the N-process rate cannot be measured. mpirun is run with
 * --oversubscribe --bind-to none (ranks x threads may exceed the cores:
 * say so beside the figures) and, as root, the allow-run-as-root
 * variables. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "bench.h"
#include "cnn_peer.h"
#include "ddp_model.h"
#include "../tools/ranks.h"
#include "diag/profiler_internal.h"
#include "kiln/dist.h"
#include "kiln/kiln.h"
#include "kiln_config.h"

#define DDP_MAX_ROUNDS 32
#define DDP_PEER_REL   "bench/peer/torch_ddp_bench.py"

typedef struct ddp_config {
    int ranks, batch, steps, warmup, rounds, profile_steps, threads;
    bool peer, worker, pingpong, model_scaling;
    const char *python, *peer_script;
} ddp_config;

/* What one measured process reported (its RESULT line). */
typedef struct ddp_run {
    double img_s;
    double hidden;      /* share of all-reduce time inside backward; < 0: none */
    double ar_ms;       /* all-reduce time per step (start to seen complete) */
    double wait_ms;     /* kiln_ddp_finish_grads per step */
    double backward_ms; /* backward per step */
    double buckets;     /* DDP's gradient buckets (0 in a world of 1) */
} ddp_run;

/* ---- The worker: one rank's training --------------------------------------------------- */

typedef struct ddp_worker {
    kiln_dist_group *world;
    kiln_module *model;
    kiln_ddp *ddp; /* NULL in a world of 1: plain training, as the peer's */
    kiln_optimizer *opt;
    kiln_tensor *x, *y; /* (B, 3, 32, 32) f32, (B) i64 */
} ddp_worker;

static kiln_status worker_step(ddp_worker *w) {
    kiln_scope_begin();
    kiln_status st = kiln_optimizer_zero_grad(w->opt, true);
    kiln_tensor *out = st       ? NULL
                       : w->ddp ? kiln_ddp_forward(w->ddp, w->x)
                                : kiln_module_forward(w->model, w->x);
    kiln_tensor *loss = out ? kiln_cross_entropy(out, w->y, NULL) : NULL;
    if (!st && !loss) st = kiln_error_last()->status;
    kiln_range_push("backward");
    if (!st) st = kiln_backward(loss, NULL, false);
    kiln_range_pop();
    kiln_range_push("ddp:finish_grads");
    if (!st && w->ddp) st = kiln_ddp_finish_grads(w->ddp);
    kiln_range_pop();
    if (!st) st = kiln_optimizer_step(w->opt);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

static kiln_status worker_setup(ddp_worker *w, const ddp_config *c) {
    KILN_TRY(kiln_dist_init(&w->world));
    kiln_manual_seed(0);
    w->model = kiln_bench_cnn_model();
    if (!w->model) return kiln_error_last()->status;
    if (kiln_dist_world_size(w->world) > 1) KILN_TRY(kiln_ddp_wrap(w->model, w->world, NULL, &w->ddp));
    kiln_tensor **params = NULL;
    int n = 0;
    KILN_TRY(kiln_module_parameters(w->model, &params, &n));
    w->opt = kiln_adam(params, n, NULL);
    free(params);
    if (!w->opt) return kiln_error_last()->status;
    kiln_manual_seed(1000 + (uint64_t)kiln_dist_rank(w->world)); /* each rank its own batch */
    w->x = kiln_randn(KILN_SHAPE(c->batch, 3, 32, 32), KILN_F32, KILN_CPU);
    w->y = w->x ? kiln_empty(KILN_SHAPE(c->batch), KILN_I64, KILN_CPU) : NULL;
    if (!w->y) return kiln_error_last()->status;
    int64_t *labels = kiln_data_ptr(w->y);
    uint64_t s = 88172645463325252ull + (uint64_t)kiln_dist_rank(w->world);
    for (int i = 0; i < c->batch; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        labels[i] = (int64_t)(s % 10);
    }
    return KILN_OK;
}

/* Sum of the overlap of [s, e) with the "backward" ranges of the profile. */
static uint64_t inside_backward(const prof_result *res, uint64_t s, uint64_t e) {
    uint64_t sum = 0;
    for (size_t i = 0; i < res->n; i++) {
        const prof_record *b = &res->rec[i];
        if (b->kind != PROF_RANGE || strcmp(b->name, "backward")) continue;
        uint64_t lo = s > b->start_ns ? s : b->start_ns, hi = e < b->end_ns ? e : b->end_ns;
        if (hi > lo) sum += hi - lo;
    }
    return sum;
}

/* The profile of the last steps: the hidden share and the times per step. */
static void read_profile(int steps, ddp_run *r) {
    const prof_result *res = kiln_profiler_result_lock();
    uint64_t ar = 0, hidden = 0, wait = 0, backward = 0;
    for (size_t i = 0; i < res->n; i++) {
        const prof_record *p = &res->rec[i];
        uint64_t d = p->end_ns > p->start_ns ? p->end_ns - p->start_ns : 0;
        if (p->kind == PROF_ASYNC && !strcmp(p->name, "mpi:all_reduce")) {
            ar += d;
            hidden += inside_backward(res, p->start_ns, p->end_ns);
        } else if (p->kind == PROF_RANGE && !strcmp(p->name, "ddp:finish_grads")) {
            wait += d;
        } else if (p->kind == PROF_RANGE && !strcmp(p->name, "backward")) {
            backward += d;
        }
    }
    kiln_profiler_result_unlock();
    r->hidden = ar ? (double)hidden / (double)ar : -1.0;
    r->ar_ms = 1e-6 * (double)ar / steps;
    r->wait_ms = 1e-6 * (double)wait / steps;
    r->backward_ms = 1e-6 * (double)backward / steps;
}

static kiln_status worker_measure(ddp_worker *w, const ddp_config *c, ddp_run *r) {
    int world = kiln_dist_world_size(w->world), rank = kiln_dist_rank(w->world);
    for (int i = 0; i < c->warmup; i++) KILN_TRY(worker_step(w));
    if (world > 1) KILN_TRY(kiln_dist_barrier(w->world, NULL));
    double t0 = tool_now_s();
    for (int i = 0; i < c->steps; i++) KILN_TRY(worker_step(w));
    if (world > 1) KILN_TRY(kiln_dist_barrier(w->world, NULL));
    r->img_s = (double)world * c->batch * c->steps / (tool_now_s() - t0);
    r->hidden = -1.0;
    if (world == 1 || c->profile_steps == 0) return KILN_OK;
    /* Every rank runs the profiled steps; rank 0 records them. */
    if (rank == 0) KILN_TRY(kiln_profiler_start(NULL));
    kiln_status st = KILN_OK;
    for (int i = 0; i < c->profile_steps && !st; i++) st = worker_step(w);
    if (rank == 0) {
        kiln_status stop = kiln_profiler_stop();
        if (!st) st = stop;
        if (!st) read_profile(c->profile_steps, r);
    }
    return st;
}

static int run_worker(const ddp_config *c) {
    ddp_worker w = {0};
    ddp_run r = {0};
    kiln_status st = worker_setup(&w, c);
    if (!st) st = worker_measure(&w, c, &r);
    if (st) {
        /* Exit without kiln_dist_shutdown: the other ranks may be gone. */
        fprintf(stderr, "kiln bench ddp --worker: rank %d: %s\n", kiln_dist_rank(w.world),
                kiln_error_message());
        return 1;
    }
    kiln_ddp_stats ds = {0};
    if (w.ddp) kiln_ddp_stats_get(w.ddp, &ds);
    if (kiln_dist_rank(w.world) == 0) {
        printf("RESULT {\"world\":%d,\"threads\":%d,\"img_s\":%.3f,\"hidden\":%.4f,\"allreduce_ms\":%.3f,"
               "\"wait_ms\":%.3f,\"backward_ms\":%.3f,\"buckets\":%d}\n",
               kiln_dist_world_size(w.world), kiln_num_threads(), r.img_s, r.hidden, r.ar_ms, r.wait_ms,
               r.backward_ms, ds.num_buckets);
        fflush(stdout);
    }
    kiln_ddp_free(w.ddp);
    kiln_optimizer_free(w.opt);
    kiln_module_free(w.model);
    kiln_release(w.x);
    kiln_release(w.y);
    return kiln_dist_shutdown() == KILN_OK ? 0 : 1;
}

/* ---- The parent: processes, rounds, table ---------------------------------------------- */

/* Run argv (argv[0] a path) through bench_peer_spawn: the RESULT line's
 * JSON into result (empty if none). False with the reason (the exit status,
 * 128+N for signal N, and the child's last line that is not one of
 * mpirun's rules) when it fails. */
static bool run_child(char *const argv[], char *result, size_t result_n, char *why, size_t why_n) {
    char last[400];
    int code = 0;
    int err = bench_peer_spawn(argv, result, result_n, last, sizeof last, &code);
    if (err) {
        snprintf(why, why_n, "cannot run %s: %s", argv[0], strerror(err));
        return false;
    }
    if (code == 0 && result[0]) return true;
    snprintf(why, why_n, "%s exited with status %d%s%s%s", argv[0], code,
             result[0] ? "" : " and no RESULT line", last[0] ? ": " : "", last);
    return false;
}

/* A number from the RESULT object, or `fallback`. */
static double json_num(const cJSON *o, const char *key, double fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}

/* Parse a RESULT line into r; `rate_key`: the images/s field; the peer's
 * thread count must be `threads` (it says threads_per_rank). */
static bool parse_run(const char *json, const char *rate_key, const char *threads_key, int threads,
                      ddp_run *r, char *why, size_t why_n) {
    cJSON *o = cJSON_Parse(json);
    *r = (ddp_run){.img_s = json_num(o, rate_key, -1),
                   .hidden = json_num(o, "hidden", -1),
                   .ar_ms = json_num(o, "allreduce_ms", 0),
                   .wait_ms = json_num(o, "wait_ms", 0),
                   .backward_ms = json_num(o, "backward_ms", 0),
                   .buckets = json_num(o, "buckets", 0)};
    int t = (int)json_num(o, threads_key, -1);
    cJSON_Delete(o);
    if (r->img_s <= 0)
        snprintf(why, why_n, "its RESULT line has no positive %s: %.300s", rate_key, json);
    else if (t != threads)
        snprintf(why, why_n, "it ran on %d threads per rank, not the %d asked for", t, threads);
    return r->img_s > 0 && t == threads;
}

/* `name` on PATH into buf; false when it is not there. */
static bool find_on_path(const char *name, char *buf, size_t n) {
    const char *path = getenv("PATH");
    for (const char *p = path; p && *p;) {
        size_t len = strcspn(p, ":");
        if (len > 0 && (size_t)snprintf(buf, n, "%.*s/%s", (int)len, p, name) < n && access(buf, X_OK) == 0)
            return true;
        p += len + (p[len] == ':');
    }
    return false;
}

/* The peer script: --peer-script, else bench/peer/torch_ddp_bench.py under
 * the working directory or beside this source file (CMake compiles with
 * absolute paths). NULL with the places tried in why. */
static const char *find_peer_script(const char *given, char *buf, size_t n, char *why, size_t why_n) {
    if (given) {
        snprintf(buf, n, "%s", given);
        if (access(buf, R_OK) == 0) return buf;
        snprintf(why, why_n, "--peer-script %s is not readable", given);
        return NULL;
    }
    snprintf(buf, n, "%s", DDP_PEER_REL);
    if (access(buf, R_OK) == 0) return buf;
    const char *slash = strrchr(__FILE__, '/');
    if (slash &&
        (size_t)snprintf(buf, n, "%.*s/peer/torch_ddp_bench.py", (int)(slash - __FILE__), __FILE__) < n &&
        access(buf, R_OK) == 0)
        return buf;
    snprintf(why, why_n, "%s not found (run from the checkout or pass --peer-script PATH)", DDP_PEER_REL);
    return NULL;
}

/* Whether the python imports torch with torch.distributed; the reason if not. */
static bool peer_available(const char *python, char *why, size_t why_n) {
    char *const argv[] = {
        (char *)python, "-c",
        "import torch, torch.distributed as d; assert d.is_gloo_available(); print('RESULT {}')", NULL};
    char result[64], reason[512];
    if (run_child(argv, result, sizeof result, reason, sizeof reason)) return true;
    snprintf(why, why_n, "%s", strstr(reason, "No module named") ? "no torch" : reason);
    return false;
}

typedef struct ddp_series {
    double img_s[DDP_MAX_ROUNDS], hidden[DDP_MAX_ROUNDS], ar_ms[DDP_MAX_ROUNDS], wait_ms[DDP_MAX_ROUNDS];
    double backward_ms[DDP_MAX_ROUNDS];
    int n, buckets;
} ddp_series;

static void series_add(ddp_series *s, const ddp_run *r) {
    s->img_s[s->n] = r->img_s, s->hidden[s->n] = r->hidden, s->ar_ms[s->n] = r->ar_ms;
    s->wait_ms[s->n] = r->wait_ms, s->backward_ms[s->n] = r->backward_ms;
    s->buckets = (int)r->buckets;
    s->n++;
}

static double med(const double *v, int n) {
    double copy[DDP_MAX_ROUNDS];
    memcpy(copy, v, sizeof(double) * (size_t)n);
    return n ? tool_median(copy, n) : 0.0;
}

static double lo_of(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

static double hi_of(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        line[strcspn(line, "\n")] = '\0';
        snprintf(buf, n, "%s", colon + 2);
        break;
    }
    if (f) fclose(f);
}

static void usage(void) {
    fprintf(stderr,
            "usage: kiln bench ddp [--ranks N] [--batch B] [--steps S] [--warmup W] [--rounds R]\n"
            "                      [--profile-steps P] [--no-peer] [--python PATH] [--peer-script PATH]\n"
            "                      [--threads T] [--model-scaling]\n"
            "--threads T: compute threads of each rank (and of each PyTorch rank)\n"
            "--model-scaling: then fit the cost model (MPI ping-pong, both models' steps timed) and\n"
            "                 predict scaling on NVLink, InfiniBand and Ethernet (bench/ddp_model.c)\n");
}

/* 0 on success, 2 on a usage error. */
static int parse_args(int argc, char **argv, ddp_config *c) {
    *c = (ddp_config){.ranks = 2,
                      .batch = 64,
                      .steps = 10,
                      .warmup = 3,
                      .rounds = 3,
                      .profile_steps = 3,
                      .peer = true,
                      .python = "/usr/bin/python3",
                      .threads = kiln_num_threads()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool v = i + 1 < argc;
        if (!strcmp(a, "--worker"))
            c->worker = true;
        else if (!strcmp(a, "--pingpong"))
            c->pingpong = true;
        else if (!strcmp(a, "--model-scaling"))
            c->model_scaling = true;
        else if (!strcmp(a, "--no-peer"))
            c->peer = false;
        else if (!strcmp(a, "--ranks") && v)
            c->ranks = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && v)
            c->batch = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && v)
            c->steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && v)
            c->warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--rounds") && v)
            c->rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--profile-steps") && v)
            c->profile_steps = atoi(argv[++i]);
        else if (!strcmp(a, "--python") && v)
            c->python = argv[++i];
        else if (!strcmp(a, "--peer-script") && v)
            c->peer_script = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    if (c->ranks < 2 || c->ranks > 1024 || c->batch < 1 || c->batch > 65536 || c->steps < 1 ||
        c->warmup < 0 || c->rounds < 1 || c->rounds > DDP_MAX_ROUNDS || c->profile_steps < 0) {
        fprintf(
            stderr,
            "kiln bench ddp: need 2 <= --ranks <= 1024, 1 <= --batch <= 65536, --steps >= 1, --warmup >= 0, "
            "1 <= --rounds <= %d, --profile-steps >= 0\n",
            DDP_MAX_ROUNDS);
        return 2;
    }
    /* Each rank takes its share of the cores, as kiln train under mpirun
     * does (tools/ranks.h): every core per rank oversubscribed the host
     * (both sides' efficiency fell to 0.30 at 2 ranks x 2 threads on 2
     * cores). */
    int share = c->worker || c->pingpong ? 0 : tool_rank_threads(c->ranks);
    if (share && share < c->threads && kiln_set_num_threads(share) == KILN_OK) {
        c->threads = share;
        printf("kiln bench ddp: %d ranks on %ld cores: %d compute thread%s per rank (--threads T chooses)\n",
               c->ranks, sysconf(_SC_NPROCESSORS_ONLN), share, share == 1 ? "" : "s");
    }
    return 0;
}

enum { RUN_KILN_1, RUN_KILN_N, RUN_PEER_1, RUN_PEER_N, RUN_KINDS };

typedef struct ddp_bench {
    ddp_config cfg;
    char exe[PATH_MAX], mpirun[PATH_MAX], script[PATH_MAX];
    char num[5][16]; /* ranks, batch, steps, warmup, profile steps */
    char threads[16];
    bool peer;          /* the peer runs */
    char peer_why[512]; /* why it does not */
    ddp_series s[RUN_KINDS];
} ddp_bench;

/* One measurement of kind k: a fresh process (or mpirun job) and its RESULT. */
static bool run_one(ddp_bench *b, int k, char *why, size_t why_n) {
    char *kiln1[] = {b->exe,      "bench",    "ddp",      "--worker", "--batch",         b->num[1],
                     "--steps",   b->num[2],  "--warmup", b->num[3],  "--profile-steps", b->num[4],
                     "--threads", b->threads, NULL};
    char *kilnn[32] = {b->mpirun, "--oversubscribe", "--bind-to", "none", "-np", b->num[0]};
    int n = 6;
    for (int i = 0; kiln1[i]; i++) kilnn[n++] = kiln1[i];
    kilnn[n] = NULL;
    char *peer[] = {(char *)b->cfg.python,
                    b->script,
                    "--world",
                    k == RUN_PEER_1 ? "1" : b->num[0],
                    "--batch",
                    b->num[1],
                    "--steps",
                    b->num[2],
                    "--warmup",
                    b->num[3],
                    "--repeats",
                    "1",
                    "--threads",
                    b->threads,
                    NULL};
    char *const *argv = k == RUN_KILN_1 ? kiln1 : k == RUN_KILN_N ? kilnn : peer;
    char result[2048];
    ddp_run r;
    bool is_peer = k >= RUN_PEER_1;
    if (!run_child(argv, result, sizeof result, why, why_n) ||
        !parse_run(result, is_peer ? "img_s_median" : "img_s", is_peer ? "threads_per_rank" : "threads",
                   b->cfg.threads, &r, why, why_n))
        return false;
    series_add(&b->s[k], &r);
    return true;
}

static int measure(ddp_bench *b) {
    int kinds = b->peer ? RUN_KINDS : RUN_PEER_1;
    for (int round = 0; round < b->cfg.rounds; round++) {
        for (int j = 0; j < kinds; j++) {
            int k = (j + round) % kinds;
            if (k >= RUN_PEER_1 && !b->peer) continue;
            char why[1024];
            if (run_one(b, k, why, sizeof why)) continue;
            if (k < RUN_PEER_1) {
                fprintf(stderr, "kiln bench ddp: the %s run failed: %s\n",
                        k == RUN_KILN_1 ? "1-process" : "N-rank", why);
                return 1;
            }
            b->peer = false;
            snprintf(b->peer_why, sizeof b->peer_why, "%.511s", why);
        }
    }
    return 0;
}

static void print_rate(const ddp_series *s) {
    char cell[64];
    snprintf(cell, sizeof cell, "%.1f [%.1f-%.1f]", med(s->img_s, s->n), lo_of(s->img_s, s->n),
             hi_of(s->img_s, s->n));
    printf(" %26s", cell);
}

static void print_table(const ddp_bench *b, const char *cpu) {
    const ddp_config *c = &b->cfg;
    const ddp_series *k1 = &b->s[RUN_KILN_1], *kn = &b->s[RUN_KILN_N], *p1 = &b->s[RUN_PEER_1],
                     *pn = &b->s[RUN_PEER_N];
    printf(
        "kiln bench ddp: tutorial CNN 3x32x32, Adam, weak scaling: %d images per rank per step, %d compute "
        "thread%s per rank\n%d ranks under mpirun --oversubscribe --bind-to none, on %ld cores (%s); medians "
        "of %d rounds [min-max], each run a fresh process timing %d steps after %d warm-up\n\n",
        c->batch, c->threads, c->threads == 1 ? "" : "s", c->ranks, sysconf(_SC_NPROCESSORS_ONLN), cpu,
        c->rounds, c->steps, c->warmup);
    char head_n[32];
    snprintf(head_n, sizeof head_n, "%d processes img/s", c->ranks);
    printf("%-22s %26s %26s %11s\n", "", "1 process img/s", head_n, "efficiency");
    double ek = med(kn->img_s, kn->n) / (c->ranks * med(k1->img_s, k1->n));
    printf("%-22s", "kiln (DDP over MPI)");
    print_rate(k1);
    print_rate(kn);
    printf(" %11.3f\n", ek);
    if (b->peer && p1->n && pn->n) {
        double ep = med(pn->img_s, pn->n) / (c->ranks * med(p1->img_s, p1->n));
        printf("%-22s", "pytorch DDP (gloo)");
        print_rate(p1);
        print_rate(pn);
        printf(" %11.3f\n", ep);
        printf("%-22s %26.3f %26.3f %11.3f\n", "kiln / pytorch",
               med(k1->img_s, k1->n) / med(p1->img_s, p1->n), med(kn->img_s, kn->n) / med(pn->img_s, pn->n),
               ek / ep);
        printf("the issue's bar: efficiency kiln/pytorch %.3f, %d-process images/s kiln/pytorch %.3f\n",
               ek / ep, c->ranks, med(kn->img_s, kn->n) / med(pn->img_s, pn->n));
    } else {
        printf("peer: skipped (%s)\n", b->peer_why);
    }
    if (c->profile_steps > 0 && med(kn->hidden, kn->n) >= 0)
        printf("\nkiln, rank 0, profiler over %d steps: %.1f%% [%.1f-%.1f%%] of the all-reduce time hidden "
               "behind backward; all-reduce of %d buckets %.1f ms/step (start to seen complete), backward "
               "%.1f ms/step, kiln_ddp_finish_grads %.1f ms/step\n",
               c->profile_steps, 100 * med(kn->hidden, kn->n), 100 * lo_of(kn->hidden, kn->n),
               100 * hi_of(kn->hidden, kn->n), kn->buckets, med(kn->ar_ms, kn->n),
               med(kn->backward_ms, kn->n), med(kn->wait_ms, kn->n));
}

static void print_json(const ddp_bench *b, const char *cpu) {
    const ddp_config *c = &b->cfg;
    const ddp_series *k1 = &b->s[RUN_KILN_1], *kn = &b->s[RUN_KILN_N], *p1 = &b->s[RUN_PEER_1],
                     *pn = &b->s[RUN_PEER_N];
    double r1 = med(k1->img_s, k1->n), rn = med(kn->img_s, kn->n);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "bench", "ddp");
    cJSON_AddNumberToObject(o, "threads", c->threads);
    cJSON_AddNumberToObject(o, "ranks", c->ranks);
    cJSON_AddNumberToObject(o, "batch_per_rank", c->batch);
    cJSON_AddNumberToObject(o, "steps", c->steps);
    cJSON_AddNumberToObject(o, "rounds", c->rounds);
    cJSON_AddNumberToObject(o, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddStringToObject(o, "cpu", cpu);
    cJSON *k = cJSON_AddObjectToObject(o, "kiln");
    cJSON_AddNumberToObject(k, "img_s_1", r1);
    cJSON_AddNumberToObject(k, "img_s_n", rn);
    cJSON_AddNumberToObject(k, "efficiency", rn / (c->ranks * r1));
    if (med(kn->hidden, kn->n) >= 0)
        cJSON_AddNumberToObject(k, "allreduce_hidden", med(kn->hidden, kn->n));
    else
        cJSON_AddNullToObject(k, "allreduce_hidden"); /* --profile-steps 0, or no all-reduce seen */
    cJSON_AddNumberToObject(k, "allreduce_ms", med(kn->ar_ms, kn->n));
    cJSON_AddNumberToObject(k, "backward_ms", med(kn->backward_ms, kn->n));
    cJSON_AddNumberToObject(k, "finish_grads_ms", med(kn->wait_ms, kn->n));
    cJSON_AddNumberToObject(k, "buckets", kn->buckets);
    if (b->peer && p1->n && pn->n) {
        double q1 = med(p1->img_s, p1->n), qn = med(pn->img_s, pn->n);
        cJSON *p = cJSON_AddObjectToObject(o, "peer");
        cJSON_AddNumberToObject(p, "img_s_1", q1);
        cJSON_AddNumberToObject(p, "img_s_n", qn);
        cJSON_AddNumberToObject(p, "efficiency", qn / (c->ranks * q1));
        cJSON *v = cJSON_AddObjectToObject(o, "kiln_vs_peer");
        cJSON_AddNumberToObject(v, "efficiency", (rn / (c->ranks * r1)) / (qn / (c->ranks * q1)));
        cJSON_AddNumberToObject(v, "img_s_n", rn / qn);
    } else {
        cJSON_AddNullToObject(o, "peer");
        cJSON_AddStringToObject(o, "peer_skipped", b->peer_why);
    }
    char *text = cJSON_PrintUnformatted(o);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
}

/* Paths, the root-allowing variables, the peer's availability. 0, or 77
 * with the reason when the N-rank run cannot happen, or 1. */
static int prepare(ddp_bench *b) {
    const ddp_config *c = &b->cfg;
#if !KILN_WITH_MPI
    fprintf(stderr, "kiln bench ddp: skipped: this build has no MPI (KILN_WITH_MPI=OFF); rebuild with "
                    "-DKILN_WITH_MPI=ON (Debian: libopenmpi-dev)\n");
    return 77;
#endif
    if (!find_on_path("mpirun", b->mpirun, sizeof b->mpirun)) {
        fprintf(stderr,
                "kiln bench ddp: skipped: mpirun is not on PATH, so the %d-rank run cannot start "
                "(install Open MPI: apt-get install openmpi-bin libopenmpi-dev)\n",
                c->ranks);
        return 77;
    }
    ssize_t len = readlink("/proc/self/exe", b->exe, sizeof b->exe - 1);
    if (len <= 0) {
        fprintf(stderr, "kiln bench ddp: cannot find its own binary (/proc/self/exe): %s\n", strerror(errno));
        return 1;
    }
    b->exe[len] = '\0';
    int vals[5] = {c->ranks, c->batch, c->steps, c->warmup, c->profile_steps};
    for (int i = 0; i < 5; i++) snprintf(b->num[i], sizeof b->num[i], "%d", vals[i]);
    snprintf(b->threads, sizeof b->threads, "%d", c->threads);
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    unsetenv("KILN_WORLD_SIZE"); /* the runs choose their own worlds */
    b->peer = false;
    if (!c->peer)
        snprintf(b->peer_why, sizeof b->peer_why, "--no-peer");
    else if (find_peer_script(c->peer_script, b->script, sizeof b->script, b->peer_why, sizeof b->peer_why))
        b->peer = peer_available(c->python, b->peer_why, sizeof b->peer_why);
    return 0;
}

int kiln_bench_ddp(int argc, char **argv) {
    static ddp_bench b;
    memset(&b, 0, sizeof b);
    int rc = parse_args(argc, argv, &b.cfg);
    if (rc) return rc;
    if (b.cfg.worker) return run_worker(&b.cfg);
    if (b.cfg.pingpong) return ddp_pingpong_worker();
    rc = prepare(&b);
    if (rc) return rc;
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    rc = measure(&b);
    if (rc) return rc;
    print_table(&b, cpu);
    print_json(&b, cpu);
    if (!b.cfg.model_scaling) return 0;
    const ddp_series *k1 = &b.s[RUN_KILN_1], *kn = &b.s[RUN_KILN_N];
    ddp_model_measured mm = {.ranks = b.cfg.ranks,
                             .batch = b.cfg.batch,
                             .threads = b.cfg.threads,
                             .rounds = b.cfg.rounds,
                             .img_s_1 = med(k1->img_s, k1->n),
                             .img_s_n = med(kn->img_s, kn->n),
                             .hidden = med(kn->hidden, kn->n),
                             .backward_ms = med(kn->backward_ms, kn->n),
                             .allreduce_ms = med(kn->ar_ms, kn->n),
                             .cpu = cpu,
                             .exe = b.exe,
                             .mpirun = b.mpirun};
    return ddp_model_scaling(&mm);
}
