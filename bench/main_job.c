/* `kiln bench main-job`: the main job -- Kiln's default `kiln train`
 * (the tutorial CNN on Fashion-MNIST, the default recipe: one-cycle Adam
 * peaking at 3e-3, label smoothing 0.1, batch 128) -- against the same
 * recipe in PyTorch, bench/peer/fmnist_train.py --recipe onecycle,
 * interleaved: each round runs both, Kiln first on even rounds and PyTorch
 * first on odd ones, so that both see the same minutes of a shared machine.
 *
 * Compared: training-loop seconds per epoch (the steps only; the test-set
 * evaluation is timed apart on both sides: Kiln's epoch records' train_s,
 * the peer's train_s) and the final test accuracy. Reported: median
 * [min-max] over the rounds of each side's mean seconds per epoch, the
 * kiln/PyTorch ratio of the medians against issue 22's bar (<= 0.25), the
 * median final accuracies and their difference (the bar asks for equal or
 * better), the CPU used by other processes meanwhile, and a last stdout
 * line of JSON. Round r seeds both sides with r (kiln train --seed r, the
 * peer's --seed r): one seed's accuracy moves by 0.1-0.3 points with the
 * seed on either side, so the medians compare recipes over several seeds,
 * not two draws.
 *
 *   kiln bench main-job [--epochs N] [--rounds N] [--limit N] [--threads N]
 *                       [--no-peer] [--python PATH] [--peer-script PATH]
 *
 * Kiln runs as a child: this binary (/proc/self/exe) with `train --out DIR
 * --seed r --epochs N --threads T [--limit N]`, DIR a fresh temporary directory
 * removed afterwards; its metrics.jsonl gives the epoch records. --limit N
 * trains and tests on the first N images on both sides (kiln train's
 * meaning). Threads: both get T = Kiln's compute threads; a peer that
 * reports another count is left out. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "cnn_peer.h"
#include "cpu_peak.h"

#define MJ_MAX_ROUNDS 16
#define MJ_MAX_EPOCHS 100
#define MJ_BAR_TIME   0.25 /* Kiln's seconds per epoch / PyTorch's, at most */

typedef struct mj_config {
    int epochs, rounds;
    long long limit; /* 0: the whole dataset */
    bool peer;
    const char *python, *peer_script;
} mj_config;

/* One side's figures of one round. */
typedef struct mj_run {
    bool ok;
    double s_per_epoch; /* mean training-loop seconds per epoch */
    double eval_s;      /* mean test-evaluation seconds per epoch */
    double test_acc;    /* after the last epoch */
} mj_run;

typedef struct mj_side {
    mj_run r[MJ_MAX_ROUNDS];
    int n;
    char reason[1200]; /* why a round has no figures */
} mj_side;

/* ---- Kiln's side ------------------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The epoch records of metrics.jsonl: train_s and epoch_s summed, the last test_acc. */
static bool read_kiln_metrics(const char *path, int epochs, mj_run *out, char *why, size_t why_n) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, why_n, "kiln train left no %.300s: %s", path, strerror(errno));
        return false;
    }
    char line[8192];
    int n = 0;
    double train = 0, epoch_s = 0, acc = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"event\":\"epoch\"")) continue;
        cJSON *rec = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rec, "train_s");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(rec, "epoch_s");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(rec, "test_acc");
        if (cJSON_IsNumber(t) && cJSON_IsNumber(e) && cJSON_IsNumber(a)) {
            train += t->valuedouble, epoch_s += e->valuedouble, acc = a->valuedouble;
            n++;
        }
        cJSON_Delete(rec);
    }
    fclose(f);
    if (n != epochs || train <= 0) {
        snprintf(why, why_n,
                 "%.300s holds %d epoch records with train_s, epoch_s and test_acc, not the %d trained", path,
                 n, epochs);
        return false;
    }
    *out = (mj_run){.ok = true, .s_per_epoch = train / n, .eval_s = (epoch_s - train) / n, .test_acc = acc};
    return true;
}

static void run_kiln(const mj_config *cfg, int seed, mj_run *out, char *why, size_t why_n) {
    memset(out, 0, sizeof *out);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(why, why_n, "cannot find this binary (/proc/self/exe): %s", strerror(errno));
        return;
    }
    exe[len] = '\0';
    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX], run_dir[PATH_MAX + 8], metrics[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/kiln_main_job.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(why, why_n,
                 "cannot create a temporary directory %.300s: %s (set TMPDIR to a writable directory)", dir,
                 strerror(errno));
        return;
    }
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
    char e[16], t[16], l[32], sd[16];
    snprintf(e, sizeof e, "%d", cfg->epochs);
    snprintf(t, sizeof t, "%d", kiln_num_threads());
    snprintf(l, sizeof l, "%lld", cfg->limit);
    snprintf(sd, sizeof sd, "%d", seed);
    char *const argv[] = {exe,
                          "train",
                          "--out",
                          run_dir,
                          "--seed",
                          sd,
                          "--epochs",
                          e,
                          "--threads",
                          t,
                          "--progress",
                          "lines",
                          "--device", /* against the peer's CPU loop, also where a GPU is */
                          "cpu",
                          cfg->limit ? "--limit" : NULL,
                          l,
                          NULL};
    char result[64], last[400];
    int code;
    int err = bench_peer_spawn(argv, result, sizeof result, last, sizeof last, &code);
    if (err)
        snprintf(why, why_n, "cannot run %.300s train: %s", exe, strerror(err));
    else if (code != 0)
        snprintf(why, why_n, "%.300s train exited with status %d: %s", exe, code, last);
    else
        read_kiln_metrics(metrics, cfg->epochs, out, why, why_n);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- PyTorch's side ---------------------------------------------------------------------- */

/* The peer's RESULT: {"threads": T, "epochs": [{"train_s", "eval_s", "test_acc"}, ...]}. */
static bool parse_peer(const char *json, int epochs, mj_run *out, char *why, size_t why_n) {
    cJSON *root = cJSON_Parse(json);
    const cJSON *threads = cJSON_GetObjectItemCaseSensitive(root, "threads");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "epochs");
    bool ok = cJSON_IsNumber(threads) && cJSON_IsArray(list) && cJSON_GetArraySize(list) == epochs;
    if (!ok) snprintf(why, why_n, "its RESULT lacks threads or a list of %d epochs", epochs);
    if (ok && (int)threads->valuedouble != kiln_num_threads()) {
        snprintf(why, why_n, "it ran on %d threads, not the %d asked for", (int)threads->valuedouble,
                 kiln_num_threads());
        ok = false;
    }
    double train = 0, eval = 0, acc = 0;
    const cJSON *ep = NULL;
    cJSON_ArrayForEach(ep, list) {
        if (!ok) break;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(ep, "train_s");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ep, "eval_s");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(ep, "test_acc");
        if (!cJSON_IsNumber(t) || !cJSON_IsNumber(v) || !cJSON_IsNumber(a) || t->valuedouble <= 0) {
            snprintf(why, why_n, "an epoch of its RESULT lacks a positive train_s, eval_s or test_acc");
            ok = false;
            break;
        }
        train += t->valuedouble, eval += v->valuedouble, acc = a->valuedouble;
    }
    cJSON_Delete(root);
    if (ok)
        *out = (mj_run){.ok = true, .s_per_epoch = train / epochs, .eval_s = eval / epochs, .test_acc = acc};
    return ok;
}

static void run_peer(const mj_config *cfg, const char *script, int seed, mj_run *out, char *why, size_t why_n) {
    memset(out, 0, sizeof *out);
    char e[16], t[16], l[32], sd[16];
    snprintf(e, sizeof e, "%d", cfg->epochs);
    snprintf(t, sizeof t, "%d", kiln_num_threads());
    snprintf(l, sizeof l, "%lld", cfg->limit);
    snprintf(sd, sizeof sd, "%d", seed);
    char *const argv[] = {(char *)cfg->python,
                          (char *)script,
                          "--recipe",
                          "onecycle",
                          "--seed",
                          sd,
                          "--epochs",
                          e,
                          "--threads",
                          t,
                          cfg->limit ? "--limit" : NULL,
                          l,
                          NULL};
    char result[16384], last[400];
    int code;
    int err = bench_peer_spawn(argv, result, sizeof result, last, sizeof last, &code);
    char detail[200] = "no RESULT line";
    if (err)
        snprintf(why, why_n, "cannot run %.300s: %s (install python3-torch, or pass --python PATH)",
                 cfg->python, strerror(err));
    else if (code != 0)
        snprintf(why, why_n, "%.200s %.300s exited with status %d: %s%s", cfg->python, script, code, last,
                 strstr(last, "No module named 'torch'") ? " (install python3-torch)" : "");
    else if (!result[0] || !parse_peer(result, cfg->epochs, out, detail, sizeof detail))
        snprintf(why, why_n, "%.200s %.300s: %s", cfg->python, script, detail);
}

/* ---- Report ------------------------------------------------------------------------------ */

/* The median over the rounds with figures of one field, with min and max; false when none. */
static bool side_stat(const mj_side *s, size_t field, double *med, double *lo, double *hi) {
    double v[MJ_MAX_ROUNDS];
    int n = 0;
    for (int i = 0; i < s->n; i++)
        if (s->r[i].ok) v[n++] = *(const double *)((const char *)&s->r[i] + field);
    if (!n) return false;
    *lo = *hi = v[0];
    for (int i = 1; i < n; i++) *lo = v[i] < *lo ? v[i] : *lo, *hi = v[i] > *hi ? v[i] : *hi;
    *med = tool_median(v, n);
    return true;
}

static void print_side(const char *who, const mj_side *s, int rounds) {
    double t = 0, tl = 0, th = 0, a = 0, al = 0, ah = 0, ev = 0, el = 0, eh = 0;
    if (!side_stat(s, offsetof(mj_run, s_per_epoch), &t, &tl, &th)) {
        printf("%-8s %28s\n", who, "-");
        return;
    }
    side_stat(s, offsetof(mj_run, test_acc), &a, &al, &ah);
    side_stat(s, offsetof(mj_run, eval_s), &ev, &el, &eh);
    int ok = 0;
    for (int i = 0; i < s->n; i++) ok += s->r[i].ok;
    char range[64];
    snprintf(range, sizeof range, "%.2f [%.2f-%.2f]", t, tl, th);
    printf("%-8s %28s %10.2f %10.2f%% %5d/%d\n", who, range, ev, 100 * a, ok, rounds);
}

static void json_side(const char *key, const mj_side *s) {
    double t = 0, tl = 0, th = 0, a = 0, al = 0, ah = 0, ev = 0, el = 0, eh = 0;
    printf("\"%s\":", key);
    if (!side_stat(s, offsetof(mj_run, s_per_epoch), &t, &tl, &th)) {
        printf("null");
        return;
    }
    side_stat(s, offsetof(mj_run, test_acc), &a, &al, &ah);
    side_stat(s, offsetof(mj_run, eval_s), &ev, &el, &eh);
    printf(
        "{\"s_per_epoch\":%.3f,\"s_per_epoch_range\":[%.3f,%.3f],\"eval_s_per_epoch\":%.3f,\"test_acc\":%.5f,"
        "\"test_acc_range\":[%.5f,%.5f],\"rounds\":[",
        t, tl, th, ev, a, al, ah);
    for (int i = 0; i < s->n; i++)
        if (s->r[i].ok)
            printf("%s{\"s_per_epoch\":%.3f,\"test_acc\":%.5f}", i ? "," : "", s->r[i].s_per_epoch,
                   s->r[i].test_acc);
        else
            printf("%snull", i ? "," : "");
    printf("]}");
}

static void json_string(const char *key, const char *s) {
    printf("\"%s\":", key);
    if (!s || !s[0]) {
        printf("null");
        return;
    }
    putchar('"');
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    putchar('"');
}

static void report(const mj_config *cfg, const mj_side *k, const mj_side *p, double foreign) {
    printf("\n%-8s %28s %10s %11s %7s\n", "who", "s/epoch median [min-max]", "eval s", "test acc", "rounds");
    print_side("kiln", k, cfg->rounds);
    if (cfg->peer) print_side("pytorch", p, cfg->rounds);
    double kt = 0, pt = 0, ka = 0, pa = 0, lo = 0, hi = 0;
    bool have = side_stat(k, offsetof(mj_run, s_per_epoch), &kt, &lo, &hi) &&
                side_stat(p, offsetof(mj_run, s_per_epoch), &pt, &lo, &hi);
    if (have) {
        side_stat(k, offsetof(mj_run, test_acc), &ka, &lo, &hi);
        side_stat(p, offsetof(mj_run, test_acc), &pa, &lo, &hi);
        printf(
            "bar: training-loop time per epoch kiln / pytorch %.3fx, bar <= %.2fx: %s; test accuracy %+.2f "
            "points (bar: equal or better): %s\n",
            kt / pt, MJ_BAR_TIME, kt / pt <= MJ_BAR_TIME ? "met" : "not met", 100 * (ka - pa),
            ka >= pa ? "met" : "not met");
    }
    if (k->reason[0]) printf("kiln figures missing: %s\n", k->reason);
    if (p->reason[0]) printf("peer figures missing: %s\n", p->reason);
    printf("other processes used %.2f cores meanwhile%s\n", foreign,
           foreign > 0.1 ? " (above 0.1: the figures are disturbed, run again)" : "");
    printf("{\"bench\":\"main-job\",\"threads\":%d,\"epochs\":%d,\"rounds\":%d,\"limit\":%lld,",
           kiln_num_threads(), cfg->epochs, cfg->rounds, cfg->limit);
    json_side("kiln", k);
    printf(",");
    json_side("peer", p);
    if (have)
        printf(",\"ratio_s_per_epoch\":%.4f,\"bar_ratio\":%.2f,\"acc_delta\":%.5f", kt / pt, MJ_BAR_TIME,
               ka - pa);
    else
        printf(",\"ratio_s_per_epoch\":null,\"bar_ratio\":%.2f,\"acc_delta\":null", MJ_BAR_TIME);
    printf(",");
    json_string("kiln_reason", k->reason);
    printf(",");
    json_string("peer_reason", p->reason);
    printf(",\"foreign_cores\":%.3f}\n", foreign);
}

/* ---- Driver ------------------------------------------------------------------------------ */

static void usage(void) {
    fprintf(stderr,
            "usage: kiln bench main-job [--epochs N] [--rounds N] [--limit N] [--threads N] [--no-peer]\n"
            "                           [--python PATH] [--peer-script PATH]\n"
            "--epochs N: epochs per run (default 3, the default recipe's); --rounds N: interleaved rounds\n"
            "(default 3); --limit N: train and test on the first N images (a quick run; default all)\n");
}

/* A whole number in [lo, hi] into *out, or false. */
static bool parse_count(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* 0, or 2 on a usage error (said). */
static int parse_args(int argc, char **argv, mj_config *c) {
    *c = (mj_config){.epochs = 3, .rounds = 3, .peer = true, .python = "/usr/bin/python3"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        long long v = 0;
        if (!strcmp(a, "--no-peer")) {
            c->peer = false;
        } else if (!strcmp(a, "--python") && has_value) {
            c->python = argv[++i];
        } else if (!strcmp(a, "--peer-script") && has_value) {
            c->peer_script = argv[++i];
        } else if (!strcmp(a, "--epochs") && has_value) {
            if (!parse_count(argv[++i], 1, MJ_MAX_EPOCHS, &v)) goto bad;
            c->epochs = (int)v;
        } else if (!strcmp(a, "--rounds") && has_value) {
            if (!parse_count(argv[++i], 1, MJ_MAX_ROUNDS, &v)) goto bad;
            c->rounds = (int)v;
        } else if (!strcmp(a, "--limit") && has_value) {
            if (!parse_count(argv[++i], 1, 1000000000, &v)) goto bad;
            c->limit = v;
        } else {
            usage();
            return 2;
        }
        continue;
    bad:
        fprintf(
            stderr,
            "kiln bench main-job: %s %s: need --epochs from 1 to %d, --rounds from 1 to %d, --limit from 1 "
            "to 1000000000\n",
            a, argv[i], MJ_MAX_EPOCHS, MJ_MAX_ROUNDS);
        return 2;
    }
    return 0;
}

int kiln_bench_main_job(int argc, char **argv) {
    mj_config cfg;
    int rc = parse_args(argc, argv, &cfg);
    if (rc) return rc;
    if (kiln_init()) {
        fprintf(stderr, "kiln bench main-job: %s\n", kiln_error_message());
        return 1;
    }
    static mj_side k, p; /* zeroed; a few kB each */
    char script_buf[4096];
    const char *script = NULL;
    if (cfg.peer)
        script = bench_peer_find("fmnist_train.py", cfg.peer_script, script_buf, sizeof script_buf, p.reason,
                                 sizeof p.reason);
    else
        snprintf(p.reason, sizeof p.reason, "--no-peer");
    printf(
        "kiln bench main-job: kiln train (default recipe: tutorial CNN, Fashion-MNIST, one-cycle Adam 3e-3, "
        "label smoothing 0.1, batch 128) against %s%s; %d epoch%s, %d interleaved round%s, "
        "%d threads (both), %s\n",
        script ? script : "no peer", script ? " --recipe onecycle" : "", cfg.epochs,
        cfg.epochs == 1 ? "" : "s", cfg.rounds, cfg.rounds == 1 ? "" : "s", kiln_num_threads(),
        cfg.limit ? "--limit (train and test on the first images)" : "the whole dataset");
    fflush(stdout);
    double busy0 = bench_cpu_busy_s(), own0 = bench_cpu_own_s(), t0 = tool_now_s();
    for (int i = 0; i < cfg.rounds; i++) {
        for (int j = 0; j < 2; j++) {
            bool kiln_turn = (j == 0) == (i % 2 == 0);
            if (!kiln_turn && !script) continue;
            mj_side *side = kiln_turn ? &k : &p;
            mj_run *run = &side->r[side->n++];
            if (kiln_turn)
                run_kiln(&cfg, i, run, k.reason, sizeof k.reason);
            else
                run_peer(&cfg, script, i, run, p.reason, sizeof p.reason);
            /* A run takes minutes: say each as it ends. */
            if (run->ok)
                fprintf(
                    stderr,
                    "round %d (seed %d): %s %.2f s/epoch (training loop), %.2f s evaluation, test accuracy "
                    "%.2f%%\n",
                    i + 1, i, kiln_turn ? "kiln" : "pytorch", run->s_per_epoch, run->eval_s, 100 * run->test_acc);
            else
                fprintf(stderr, "round %d: %s gave no figures: %s\n", i + 1, kiln_turn ? "kiln" : "pytorch",
                        side->reason);
        }
        fprintf(stderr, "round %d/%d done\n", i + 1, cfg.rounds);
    }
    double busy1 = bench_cpu_busy_s(), wall = tool_now_s() - t0;
    double foreign =
        busy0 >= 0 && busy1 >= 0 && wall > 0 ? (busy1 - busy0 - (bench_cpu_own_s() - own0)) / wall : -1;
    if (foreign < 0 && busy0 >= 0 && busy1 >= 0) foreign = 0; /* clock-tick rounding */
    report(&cfg, &k, &p, foreign);
    int kiln_ok = 0;
    for (int i = 0; i < k.n; i++) kiln_ok += k.r[i].ok;
    return kiln_ok == cfg.rounds ? 0 : 1;
}
