/* `kiln bench loader`: batches/s and MB/s of the whole pipeline (read,
 * shuffle, transform, assemble in pinned buffers) for 0, 1 and 2 workers.
 *
 * Two datasets: Fashion-MNIST train (60000 x 1x28x28 u8; normalise only),
 * when installed, and a CIFAR-sized synthetic tensor dataset (10000 x
 * 3x32x32 u8) with the CIFAR-10 recipe: reflect-pad-4 random crop, random
 * flip, normalise. The consumer takes each batch and releases it at once
 * (no training step), so the figures are what the loader can supply, the
 * upper bound of what it can feed. One warm-up epoch (it fills the pinned
 * pool), then the best of `repeats` timed epochs. MB/s counts the f32
 * batch bytes delivered. A last row per dataset ("on-device") is the
 * dataset-on-device mode on the CPU device: the dataset as one tensor,
 * batches made by ops on the consumer's thread (no workers).
 *   kiln bench loader [--batch N] [--repeats N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kiln/data.h"
#include "kiln/kiln.h"

typedef struct loader_result {
    double batches_per_s, mb_per_s, wait_frac;
    int64_t batches;
} loader_result;

/* One epoch: returns seconds, or a negative value on error. */
static double run_epoch(kiln_loader *l, int64_t epoch, int64_t *batches, double *bytes, double *wait_s) {
    if (kiln_loader_epoch_begin(l, epoch)) return -1;
    double t0 = tool_now_s();
    *batches = 0;
    *bytes = 0;
    for (;;) {
        kiln_tensor *x = NULL, *y = NULL;
        if (kiln_loader_next(l, &x, &y)) return -1;
        if (!x) break;
        *bytes += (double)kiln_numel(x) * 4.0;
        (*batches)++;
        kiln_release(x);
        kiln_release(y);
    }
    double secs = tool_now_s() - t0;
    kiln_loader_stats st;
    kiln_loader_stats_get(l, &st);
    *wait_s = st.wait_s;
    return secs;
}

static int measure(kiln_dataset *ds, kiln_loader_opts opts, int repeats, loader_result *out) {
    kiln_loader *l = NULL;
    if (kiln_loader_create(ds, &opts, &l)) return -1;
    int64_t batches;
    double bytes, wait_s, best = -1;
    if (run_epoch(l, 0, &batches, &bytes, &wait_s) < 0) goto fail;
    for (int r = 0; r < repeats; r++) {
        double w, secs = run_epoch(l, 1 + r, &batches, &bytes, &w);
        if (secs < 0) goto fail;
        if (best < 0 || secs < best) best = secs, wait_s = w;
    }
    out->batches = batches;
    out->batches_per_s = (double)batches / best;
    out->mb_per_s = bytes / best / 1e6;
    out->wait_frac = wait_s / best;
    kiln_loader_free(l);
    return 0;
fail:
    fprintf(stderr, "kiln bench loader: %s\n", kiln_error_message());
    kiln_loader_free(l);
    return -1;
}

static void print_row(const char *name, int workers, const loader_result *r) {
    char w[16];
    snprintf(w, sizeof w, workers < 0 ? "on-dev" : "%d", workers);
    printf("%-14s %7s %9lld %12.1f %10.1f %9.1f%%\n", name, w, (long long)r->batches, r->batches_per_s,
           r->mb_per_s, 100.0 * r->wait_frac);
}

int kiln_bench_loader(int argc, char **argv) {
    int64_t batch = 256;
    int repeats = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoll(argv[++i]);
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: kiln bench loader [--batch N] [--repeats N]\n");
            return 2;
        }
    }
    if (batch < 1 || repeats < 1) {
        fprintf(stderr, "kiln bench loader: --batch and --repeats must be positive\n");
        return 2;
    }
    if (kiln_init()) {
        fprintf(stderr, "kiln bench loader: %s\n", kiln_error_message());
        return 1;
    }
    kiln_dataset *sets[2] = {NULL, NULL};
    const char *names[2] = {"fashion-mnist", "cifar-synth"};
    char skipped[1200] = "";
    if (kiln_dataset_open_fashion_mnist(NULL, "train", &sets[0]))
        snprintf(skipped, sizeof skipped, "%s", kiln_error_message());
    sets[1] = kiln_bench_synthetic_cifar(10000);
    if (!sets[1]) {
        fprintf(stderr, "kiln bench loader: %s\n", kiln_error_message());
        kiln_dataset_free(sets[0]);
        return 1;
    }
    printf("loader pipeline, batch %lld, pinned batches, best of %d epochs\n", (long long)batch, repeats);
    printf("%-14s %7s %9s %12s %10s %10s\n", "dataset", "workers", "batches", "batches/s", "MB/s", "waited");
    loader_result res[2][4];
    memset(res, 0, sizeof res);
    int rc = 0;
    for (int d = 0; d < 2 && !rc; d++) {
        if (!sets[d]) {
            printf("%-14s skipped: %s\n", names[d], skipped);
            continue;
        }
        kiln_loader_opts o = kiln_loader_opts_default();
        o.batch_size = batch;
        o.shuffle = true;
        o.seed = 1;
        o.pin_memory = true;
        o.transforms.normalize = true;
        if (d == 0) {
            o.transforms.mean[0] = 0.2860f, o.transforms.std[0] = 0.3530f;
        } else {
            const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, sd[3] = {0.2470f, 0.2435f, 0.2616f};
            for (int c = 0; c < 3; c++) o.transforms.mean[c] = mean[c], o.transforms.std[c] = sd[c];
            o.transforms.crop_padding = 4;
            o.transforms.pad_mode = KILN_PAD_REFLECT;
            o.transforms.flip_p = 0.5f;
        }
        for (int w = 0; w <= 2 && !rc; w++) {
            o.num_workers = w;
            rc = measure(sets[d], o, repeats, &res[d][w]);
            if (!rc) print_row(names[d], w, &res[d][w]);
        }
        o.num_workers = 0;
        o.pin_memory = false;
        o.on_device = KILN_DATA_ON_DEVICE_ON;
        if (!rc) rc = measure(sets[d], o, repeats, &res[d][3]);
        if (!rc) print_row(names[d], -1, &res[d][3]);
    }
    if (!rc) {
        printf("{\"bench\":\"loader\",\"threads\":%d,\"batch\":%lld,\"fashion_mnist\":", kiln_num_threads(), (long long)batch);
        if (sets[0])
            printf("{\"batches_per_s\":[%.1f,%.1f,%.1f],\"mb_per_s\":[%.1f,%.1f,%.1f],"
                   "\"on_device_batches_per_s\":%.1f}",
                   res[0][0].batches_per_s, res[0][1].batches_per_s, res[0][2].batches_per_s,
                   res[0][0].mb_per_s, res[0][1].mb_per_s, res[0][2].mb_per_s, res[0][3].batches_per_s);
        else
            printf("null");
        printf(",\"cifar_synth\":{\"batches_per_s\":[%.1f,%.1f,%.1f],\"mb_per_s\":[%.1f,%.1f,%.1f],"
               "\"on_device_batches_per_s\":%.1f},\"workers\":[0,1,2]}\n",
               res[1][0].batches_per_s, res[1][1].batches_per_s, res[1][2].batches_per_s, res[1][0].mb_per_s,
               res[1][1].mb_per_s, res[1][2].mb_per_s, res[1][3].batches_per_s);
    }
    kiln_dataset_free(sets[0]);
    kiln_dataset_free(sets[1]);
    return rc ? 1 : 0;
}
