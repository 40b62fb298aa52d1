/* `kiln bench cnn`'s FLOP count, table and JSON line (cnn_bench.h).
 *
 * The table has one row per precision, mode and side (Kiln, PyTorch eager,
 * PyTorch best), with Kiln's rows carrying both ratios, and a bar line per
 * Kiln row: issue 22's bars are against PyTorch's best setup of the same
 * precision (f32: >= 4.0x; bf16: >= 2.0x), and Kiln's f32 GFLOP/s against
 * the measured FMA peak (training >= 65%, inference >= 75%). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "cnn_bench.h"

static const char *const PRECISION_NAME[CNN_PRECISIONS] = {"f32", "bf16"};
static const char *const MODE_NAME[CNN_MODES] = {"train", "infer"};
static const char *const WHO_NAME[CNN_WHO] = {"kiln", "torch eager", "torch best"};
static const char *const WHO_KEY[CNN_WHO] = {"kiln", "eager", "best"};
/* The bars: Kiln / PyTorch best, per precision; share of the FMA peak per mode (f32). */
static const double BAR_VS_BEST[CNN_PRECISIONS] = {4.0, 2.0};
static const double BAR_PEAK_SHARE[CNN_MODES] = {0.65, 0.75};

/* ---- FLOPs ------------------------------------------------------------------------------- */

/* The weight's shape into dims[4] (unused ones 1); false when it is missing. */
static bool weight_shape(kiln_module *m, const char *name, int64_t dims[4]) {
    kiln_tensor *w = kiln_module_state_get(m, name);
    if (!w) return false;
    int nd = kiln_ndim(w);
    for (int i = 0; i < 4; i++) dims[i] = i < nd ? kiln_size(w, i) : 1;
    kiln_release(w);
    return nd == 2 || nd == 4;
}

kiln_status cnn_flops(kiln_module *model, int batch, double *gflop_fwd, double *gflop_train) {
    static const char *const convs[3] = {"conv1.weight", "conv2.weight", "conv3.weight"};
    static const char *const fcs[2] = {"fc1.weight", "fc2.weight"};
    double b = (double)batch, fwd = 0, first_conv = 0;
    int64_t side = CNN_SIDE, w[4];
    for (int i = 0; i < 3; i++) {
        if (!weight_shape(model, convs[i], w))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "build the benchmark's model with kiln_bench_cnn_model",
                              "the CNN has no 4-d %s to count FLOPs from", convs[i]);
        int64_t out = side + 2 * CNN_PAD - w[2] + 1; /* (B, Cout, out, out), stride 1 */
        double f = 2.0 * b * (double)w[0] * (double)(out * out) * (double)w[1] * (double)(w[2] * w[3]);
        if (i == 0) first_conv = f;
        fwd += f;
        side = out / 2; /* max-pool 2 */
    }
    for (int i = 0; i < 2; i++) {
        if (!weight_shape(model, fcs[i], w))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                              "build the benchmark's model with kiln_bench_cnn_model",
                              "the CNN has no 2-d %s to count FLOPs from", fcs[i]);
        fwd += 2.0 * b * (double)w[0] * (double)w[1]; /* (out, in) */
    }
    *gflop_fwd = fwd * 1e-9;
    *gflop_train = (3.0 * fwd - first_conv) * 1e-9;
    return KILN_OK;
}

/* ---- Series ------------------------------------------------------------------------------ */

double cnn_series_median(const cnn_series *s) {
    double v[CNN_MAX_REPEATS];
    memcpy(v, s->v, sizeof(double) * (size_t)s->n);
    return tool_median(v, s->n);
}

bool cnn_series_has_figures(const cnn_series *s) { return s->n > 0 && !s->missing; }

static double series_min(const cnn_series *s) {
    double m = s->v[0];
    for (int i = 1; i < s->n; i++) m = s->v[i] < m ? s->v[i] : m;
    return m;
}

static double series_max(const cnn_series *s) {
    double m = s->v[0];
    for (int i = 1; i < s->n; i++) m = s->v[i] > m ? s->v[i] : m;
    return m;
}

/* Kiln's median over the peer's, or 0 when either has no figures. */
static double ratio(const cnn_series *k, const cnn_series *p) {
    return cnn_series_has_figures(k) && cnn_series_has_figures(p)
               ? cnn_series_median(k) / cnn_series_median(p)
               : 0;
}

/* ---- Table ------------------------------------------------------------------------------- */

static void print_row(const char *prec, const char *mode, const char *who, const cnn_series *s, double gflop,
                      int batch, const cnn_series *eager, const cnn_series *best) {
    if (!cnn_series_has_figures(s)) {
        printf("%-5s %-6s %-12s %30s\n", prec, mode, who, "-");
        return;
    }
    double med = cnn_series_median(s);
    char range[64];
    snprintf(range, sizeof range, "%.1f [%.1f-%.1f]", med, series_min(s), series_max(s));
    printf("%-5s %-6s %-12s %30s %9.1f %8.2f", prec, mode, who, range, 1e3 * batch / med,
           med * gflop / batch);
    if (eager || best) {
        double re = eager ? ratio(s, eager) : 0, rb = best ? ratio(s, best) : 0;
        if (re > 0)
            printf(" %9.2fx", re);
        else
            printf(" %10s", "-");
        if (rb > 0)
            printf(" %9.2fx", rb);
        else
            printf(" %10s", "-");
    }
    printf("\n");
}

static void print_machine(const cnn_results *r) {
    printf("machine: %s; flags: %s; %ld cores online; %d threads (kiln and peer)\n", r->cpu.model,
           r->cpu.flags, sysconf(_SC_NPROCESSORS_ONLN), kiln_num_threads());
    if (r->peak.gflop_s > 0)
        printf("measured f32 FMA peak: %.1f GFLOP/s on %d thread%s (%s, %.1f per thread)\n", r->peak.gflop_s,
               r->peak.threads, r->peak.threads == 1 ? "" : "s", r->peak.isa, r->peak.per_thread);
    else
        printf("measured f32 FMA peak: none (the CPU has no FMA this benchmark can time)\n");
}

/* The bar lines under the table: each Kiln ratio to PyTorch best against
 * its bar, and the f32 share of the peak against its bar. */
static void print_bars(const cnn_config *cfg, const cnn_results *r) {
    for (int p = 0; p < CNN_PRECISIONS; p++)
        for (int m = 0; m < CNN_MODES; m++) {
            if (!cfg->precision[p] || !cfg->mode[m]) continue;
            double rb = ratio(&r->s[p][m][CNN_KILN], &r->s[p][m][CNN_BEST]);
            if (rb > 0)
                printf("bar: %s %s kiln / torch best %.2fx, bar >= %.1fx: %s\n", PRECISION_NAME[p],
                       MODE_NAME[m], rb, BAR_VS_BEST[p], rb >= BAR_VS_BEST[p] ? "met" : "not met");
        }
    for (int m = 0; m < CNN_MODES; m++) {
        const cnn_series *k = &r->s[CNN_F32][m][CNN_KILN];
        if (!cfg->mode[m] || !cfg->precision[CNN_F32] || !cnn_series_has_figures(k) || r->peak.gflop_s <= 0)
            continue;
        double g = m == CNN_TRAIN ? r->gflop_train : r->gflop_fwd;
        double share = cnn_series_median(k) * g / cfg->batch / r->peak.gflop_s;
        printf("bar: f32 %s at %.1f%% of the FMA peak (%.2f GFLOP per %s at batch %d), bar >= %.0f%%: %s\n",
               MODE_NAME[m], 100 * share, g, m == CNN_TRAIN ? "step" : "forward", cfg->batch,
               100 * BAR_PEAK_SHARE[m], share >= BAR_PEAK_SHARE[m] ? "met" : "not met");
    }
}

/* The peak resident sets: this process (every mode and precision it ran:
 * with --mode train, the training alone) against each peer setup's
 * process, and the footprint bar (training, against PyTorch's best setup:
 * at most 0.3x). */
static void print_rss(const cnn_config *cfg, const cnn_results *r) {
    if (!r->kiln_rss_kib) return;
    printf("peak resident set: kiln %.0f MiB (this process, %s)", r->kiln_rss_kib / 1024.0,
           cfg->mode[CNN_INFER] ? "training and inference" : "training");
    for (int p = 0; p < CNN_PRECISIONS; p++)
        for (int m = 0; m < CNN_MODES; m++)
            for (int w = CNN_EAGER; w < CNN_WHO; w++)
                if (r->peer_rss_kib[p][m][w])
                    printf("; %s %s %s %.0f MiB", WHO_NAME[w], PRECISION_NAME[p], MODE_NAME[m],
                           r->peer_rss_kib[p][m][w] / 1024.0);
    long best = r->peer_rss_kib[CNN_F32][CNN_TRAIN][CNN_BEST];
    if (best && !cfg->mode[CNN_INFER])
        printf("\nbar: f32 train kiln / torch best resident set %.2fx, bar <= 0.30x: %s", (double)r->kiln_rss_kib / best,
               (double)r->kiln_rss_kib / best <= 0.30 ? "met" : "not met");
    printf("\n");
}

void cnn_print_table(const cnn_config *cfg, const cnn_results *r) {
    printf("\n");
    print_machine(r);
    printf("%-5s %-6s %-12s %30s %9s %8s %10s %10s\n", "prec", "mode", "who", "img/s median [min-max]",
           "ms/step", "GFLOP/s", "vs eager", "vs best");
    for (int p = 0; p < CNN_PRECISIONS; p++) {
        if (!cfg->precision[p]) continue;
        for (int m = 0; m < CNN_MODES; m++) {
            if (!cfg->mode[m]) continue;
            double g = m == CNN_TRAIN ? r->gflop_train : r->gflop_fwd;
            const cnn_series *row = r->s[p][m];
            const char *kiln = p == CNN_F32 && m == CNN_TRAIN && cfg->data ? "kiln loader" : "kiln";
            print_row(PRECISION_NAME[p], MODE_NAME[m], kiln, &row[CNN_KILN], g, cfg->batch,
                      cfg->peer ? &row[CNN_EAGER] : NULL, cfg->peer ? &row[CNN_BEST] : NULL);
            if (p == CNN_F32 && m == CNN_TRAIN && cfg->data)
                print_row(PRECISION_NAME[p], MODE_NAME[m], "kiln preld", &r->train_pre, g, cfg->batch,
                          &row[CNN_EAGER], &row[CNN_BEST]);
            if (!cfg->peer) continue;
            print_row(PRECISION_NAME[p], MODE_NAME[m], WHO_NAME[CNN_EAGER], &row[CNN_EAGER], g, cfg->batch,
                      NULL, NULL);
            print_row(PRECISION_NAME[p], MODE_NAME[m], WHO_NAME[CNN_BEST], &row[CNN_BEST], g, cfg->batch,
                      NULL, NULL);
        }
    }
    if (r->bf16_reason[0]) printf("bf16: %s\n", r->bf16_reason);
    print_bars(cfg, r);
    if (r->wait_frac >= 0) {
        double rel = cnn_series_has_figures(&r->train_pre)
                         ? 100.0 * cnn_series_median(&r->s[CNN_F32][CNN_TRAIN][CNN_KILN]) /
                               cnn_series_median(&r->train_pre)
                         : 0.0;
        if (cfg->data == CNN_DATA_HOST)
            printf("--data host: loader steps (%d worker%s, pinned batches) ran at %.1f%% of the preloaded "
                   "steps' "
                   "images/s and waited for batches %.1f%% of their time\n",
                   cfg->workers, cfg->workers == 1 ? "" : "s", rel, 100.0 * r->wait_frac);
        else
            printf("--data device: loader steps (dataset on the device, batches made by ops) ran at %.1f%% "
                   "of the "
                   "preloaded steps' images/s; making the batches took %.1f%% of their time\n",
                   rel, 100.0 * r->wait_frac);
    }
    if (r->peer_reason[0]) printf("peer figures missing: %s\n", r->peer_reason);
    print_rss(cfg, r);
    printf("load average (1 min): %.2f before, %.2f after; other processes used %.2f cores meanwhile%s\n",
           r->load_before, r->load_after, r->foreign_cores,
           r->foreign_cores > 0.1 ? " (above 0.1: the figures are disturbed, run again)" : "");
}

/* ---- JSON -------------------------------------------------------------------------------- */

static void json_number(const char *key, double v, bool ok, bool comma) {
    if (ok)
        printf("\"%s\":%.3f", key, v);
    else
        printf("\"%s\":null", key);
    if (comma) printf(",");
}

static void json_figure(const char *key, const cnn_series *s, bool comma) {
    json_number(key, cnn_series_has_figures(s) ? cnn_series_median(s) : 0, cnn_series_has_figures(s), comma);
}

static void json_escaped(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void json_string_or_null(const char *key, const char *s) {
    printf("\"%s\":", key);
    if (s && s[0])
        json_escaped(s);
    else
        printf("null");
}

/* "f32":{"train":{"kiln":..,"eager":..,"best":..,"vs_eager":..,"vs_best":..,"ranges":{..},"gflop_s":..,
 * "peak_share":..},"infer":{..}} */
static void json_precision(const cnn_config *cfg, const cnn_results *r, int p) {
    printf("\"%s\":", PRECISION_NAME[p]);
    if (!cfg->precision[p]) {
        printf("null");
        return;
    }
    printf("{");
    for (int m = 0; m < CNN_MODES; m++) {
        const cnn_series *row = r->s[p][m];
        printf("%s\"%s\":{", m ? "," : "", MODE_NAME[m]);
        for (int w = 0; w < CNN_WHO; w++) json_figure(WHO_KEY[w], &row[w], true);
        double re = ratio(&row[CNN_KILN], &row[CNN_EAGER]), rb = ratio(&row[CNN_KILN], &row[CNN_BEST]);
        json_number("vs_eager", re, re > 0, true);
        json_number("vs_best", rb, rb > 0, true);
        json_number("bar_vs_best", BAR_VS_BEST[p], true, true);
        double g = m == CNN_TRAIN ? r->gflop_train : r->gflop_fwd;
        bool k = cnn_series_has_figures(&row[CNN_KILN]);
        double gs = k ? cnn_series_median(&row[CNN_KILN]) * g / cfg->batch : 0;
        json_number("kiln_gflop_s", gs, k, true);
        json_number("peak_share", r->peak.gflop_s > 0 ? gs / r->peak.gflop_s : 0, k && r->peak.gflop_s > 0,
                    true);
        printf("\"ranges\":{");
        bool first = true;
        for (int w = 0; w < CNN_WHO; w++) {
            if (!cnn_series_has_figures(&row[w])) continue;
            printf("%s\"%s\":[%.2f,%.2f]", first ? "" : ",", WHO_KEY[w], series_min(&row[w]),
                   series_max(&row[w]));
            first = false;
        }
        printf("}}");
    }
    printf("}");
}

void cnn_print_json(const cnn_config *cfg, const cnn_results *r) {
    const cnn_series(*f32)[CNN_WHO] = r->s[CNN_F32];
    printf("{\"bench\":\"cnn\",\"threads\":%d,", kiln_num_threads());
    /* The f32 figures under their first names (Kiln against PyTorch eager). */
    json_figure("train_img_s", &f32[CNN_TRAIN][CNN_KILN], true);
    json_figure("infer_img_s", &f32[CNN_INFER][CNN_KILN], true);
    json_figure("peer_train_img_s", &f32[CNN_TRAIN][CNN_EAGER], true);
    json_figure("peer_infer_img_s", &f32[CNN_INFER][CNN_EAGER], true);
    for (int m = 0; m < CNN_MODES; m++) {
        bool k = cnn_series_has_figures(&f32[m][CNN_KILN]);
        double g = m == CNN_TRAIN ? r->gflop_train : r->gflop_fwd;
        json_number(m == CNN_TRAIN ? "train_gflop_s" : "infer_gflop_s",
                    k ? cnn_series_median(&f32[m][CNN_KILN]) * g / cfg->batch : 0, k, true);
    }
    printf("\"ratios\":{");
    double rt = ratio(&f32[CNN_TRAIN][CNN_KILN], &f32[CNN_TRAIN][CNN_EAGER]);
    double ri = ratio(&f32[CNN_INFER][CNN_KILN], &f32[CNN_INFER][CNN_EAGER]);
    json_number("train", rt, rt > 0, true);
    json_number("infer", ri, ri > 0, false);
    printf("},\"precisions\":{");
    json_precision(cfg, r, CNN_F32);
    printf(",");
    json_precision(cfg, r, CNN_BF16);
    printf("},");
    json_string_or_null("bf16_reason", r->bf16_reason);
    printf(",\"cpu\":{");
    json_string_or_null("model", r->cpu.model);
    printf(",\"avx2\":%s,\"avx512f\":%s,\"avx512_bf16\":%s,\"amx_bf16\":%s,\"native_bf16\":%s,\"cores\":%ld,",
           r->cpu.avx2 ? "true" : "false", r->cpu.avx512f ? "true" : "false",
           r->cpu.avx512_bf16 ? "true" : "false", r->cpu.amx_bf16 ? "true" : "false",
           r->cpu.native_bf16 ? "true" : "false", sysconf(_SC_NPROCESSORS_ONLN));
    json_number("fma_peak_gflop_s", r->peak.gflop_s, r->peak.gflop_s > 0, true);
    printf("\"fma_peak_threads\":%d,\"fma_isa\":\"%s\",\"kiln_bf16_fast_kernels\":%s},", r->peak.threads,
           r->peak.isa, r->kiln_bf16_fast ? "true" : "false");
    printf("\"train_preloaded_img_s\":");
    if (cnn_series_has_figures(&r->train_pre))
        printf("%.2f,\"loader_vs_preloaded\":%.4f,", cnn_series_median(&r->train_pre),
               cnn_series_median(&f32[CNN_TRAIN][CNN_KILN]) / cnn_series_median(&r->train_pre));
    else
        printf("null,\"loader_vs_preloaded\":null,");
    json_number("data_wait_frac", r->wait_frac, r->wait_frac >= 0, true);
    json_number("kiln_rss_mib", r->kiln_rss_kib / 1024.0, r->kiln_rss_kib > 0, true);
    json_number("peer_best_train_rss_mib", r->peer_rss_kib[CNN_F32][CNN_TRAIN][CNN_BEST] / 1024.0,
                r->peer_rss_kib[CNN_F32][CNN_TRAIN][CNN_BEST] > 0, true);
    json_string_or_null("peer_reason", r->peer_reason);
    static const char *const passes[] = CNN_PASS_NAMES;
    printf(",\"passes_gflop_s\":{");
    for (int i = 0; i < CNN_PASSES; i++) {
        printf("%s\"%s\":", i ? "," : "", passes[i]);
        if (r->pass_gflop_s[i] > 0) printf("%.2f", r->pass_gflop_s[i]);
        else printf("null");
    }
    printf("}");
    printf(",\"config\":{\"batch\":%d,\"steps\":%d,\"repeats\":%d,\"warmup\":%d,\"mode\":\"%s\",\"data\":%s,"
           "\"workers\":%d,\"peer\":%s,\"peer_threads\":%d,",
           cfg->batch, cfg->steps, cfg->repeats, cfg->warmup,
           cfg->mode[CNN_TRAIN] && cfg->mode[CNN_INFER] ? "both"
           : cfg->mode[CNN_TRAIN]                       ? "train"
                                                        : "infer",
           cfg->data == CNN_DATA_HOST     ? "\"host\""
           : cfg->data == CNN_DATA_DEVICE ? "\"device\""
                                          : "null",
           cfg->data == CNN_DATA_HOST ? cfg->workers : 0, cfg->peer ? "true" : "false", kiln_num_threads());
    json_string_or_null("torch", r->torch_version);
    printf(",\"gflop_train_step\":%.3f,\"gflop_forward\":%.3f,\"loadavg_before\":%.2f,"
           "\"loadavg_after\":%.2f,\"foreign_cores\":%.3f}}\n",
           r->gflop_train, r->gflop_fwd, r->load_before, r->load_after, r->foreign_cores);
}
