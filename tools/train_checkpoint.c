/* kiln train --checkpoint N | auto --memory-budget SIZE: gradient
 * checkpointing of the model's Sequential in segments placed by measured
 * memory (kiln_nn_sequential_checkpoint_by_memory), the count given or
 * chosen from the allocator's peak over one measured step per candidate. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kiln/kiln.h"
#include "runtime/runtime_internal.h"
#include "train_run.h"

bool train_parse_size(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return false;
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1},          {"B", 1},          {"K", 1024},       {"KiB", 1024},         {"KB", 1e3},
                 {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},      {"G", 1073741824.0},   {"GiB", 1073741824.0},
                 {"GB", 1e9},      {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) != 0) continue;
        double bytes = v * units[i].scale;
        if (bytes < 1 || bytes > 9.0e18) return false;
        *out = (int64_t)bytes;
        return true;
    }
    return false;
}

static int fail(const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln train: %s: %s\n", what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

static double mib(int64_t b) { return (double)b / 1048576.0; }

/* "%.*f": one decimal below 10 MiB. */
static int prec(int64_t b) { return mib(b) < 10 ? 1 : 0; }

/* The allocator's peak over one forward + backward of a full batch of
 * zeros through train_amp_backward (the training step's path: its
 * micro-batches, --amp's autocast and loss scaling), plus Adam's two
 * moment buffers when the optimizer has not allocated them yet (its first
 * step does). The model's running statistics, the generators and the
 * gradients are put back afterwards, so the run trains exactly as it
 * would have without the measurement. */
/* Segments placed by memory, measured on a batch of 2 zeros. */
static kiln_status place_segments(train_run *r, int segments) {
    kiln_scope_begin();
    kiln_tensor *sample = kiln_zeros(KILN_SHAPE(2, r->info.channels, r->info.height, r->info.width), KILN_F32, r->dev);
    kiln_status st = sample ? kiln_nn_sequential_checkpoint_by_memory(r->model, sample, segments, NULL)
                            : kiln_error_last()->status;
    kiln_scope_end();
    return st;
}

/* "3 segments starting at layers 0 (Conv2d), 3 (Residual, its body in 2
 * segments), 4 (Residual)" */
static void print_segments(train_run *r) {
    int start[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
    int count = kiln_nn_sequential_checkpoint_starts(r->model, start, KILN_NN_MAX_CHECKPOINT_SEGMENTS);
    fprintf(stderr, "kiln train: gradient checkpointing: %d segments of the model's %d layers, placed by measured "
                    "memory, starting at layers",
            count, kiln_module_num_children(r->model));
    for (int k = 0; k < count; k++) {
        kiln_module *layer = kiln_module_child_at(r->model, start[k], NULL);
        kiln_module *body = kiln_module_child(layer, "body");
        int inner = body ? kiln_nn_sequential_checkpoint_segments(body) : 0;
        fprintf(stderr, "%s %d (%s", k ? "," : "", start[k], kiln_module_kind(layer));
        if (inner > 1) fprintf(stderr, ", its body in %d segments", inner);
        fprintf(stderr, ")");
    }
    fprintf(stderr, "; all but the last are recomputed in backward\n");
}

static kiln_status measure_step(train_run *r, int segments, int64_t *peak) {
    kiln_status st = place_segments(r, segments);
    if (st) return st;
    kiln_named_tensor *bufs = NULL;
    int nb = 0;
    if ((st = kiln_module_named_buffers(r->model, &bufs, &nb))) return st;
    kiln_scope_begin();
    kiln_tensor **saved = calloc((size_t)(nb ? nb : 1), sizeof *saved);
    for (int i = 0; saved && i < nb && !st; i++)
        if (!(saved[i] = kiln_to(bufs[i].tensor, r->dev, kiln_dtype_of(bufs[i].tensor), KILN_COPY)))
            st = kiln_error_last()->status;
    if (!saved) st = KILN_ERR_OUT_OF_MEMORY;
    kiln_device cpu = {KILN_DEVICE_CPU, 0};
    kiln_rng rng_dev = kiln_device_rng_reserve(r->dev, 0), rng_cpu = kiln_device_rng_reserve(cpu, 0);
    kiln_tensor *x = NULL, *y = NULL, *loss = NULL, *hits = NULL;
    if (!st) {
        x = kiln_zeros(KILN_SHAPE(r->a.batch, r->info.channels, r->info.height, r->info.width), KILN_F32, r->dev);
        y = x ? kiln_zeros(KILN_SHAPE(r->a.batch), KILN_I64, r->dev) : NULL;
        if (!y) st = kiln_error_last()->status;
    }
    if (!st) st = kiln_optimizer_zero_grad(r->opt, true);
    if (!st) st = kiln_device_synchronize(r->dev);
    if (!st) st = kiln_memory_reset_peak(r->dev);
    if (!st) st = train_amp_backward(r, x, y, &loss, &hits); /* with --amp's autocast and scaler */
    if (!st) st = kiln_device_synchronize(r->dev);
    kiln_memory_stats ms;
    if (!st) st = kiln_memory_stats_get(r->dev, &ms);
    if (!st) {
        *peak = ms.allocated_bytes[KILN_POOL_ALL].peak;
        kiln_error_clear();
        kiln_tensor *m0 = kiln_optimizer_state(r->opt, 0, "exp_avg");
        if (!m0) {
            kiln_tensor **params = NULL;
            int np = 0;
            if (kiln_module_parameters(r->model, &params, &np) == KILN_OK)
                for (int i = 0; i < np; i++)
                    *peak += 2 * kiln_numel(params[i]) * (int64_t)kiln_dtype_size(kiln_dtype_of(params[i]));
            free(params);
        }
        kiln_release(m0);
        kiln_error_clear();
    }
    kiln_status st2 = kiln_optimizer_zero_grad(r->opt, true);
    for (int i = 0; saved && i < nb; i++)
        if (saved[i] && !st2) st2 = kiln_copy_(bufs[i].tensor, saved[i], 0);
    kiln_device_rng_set(r->dev, rng_dev);
    kiln_device_rng_set(cpu, rng_cpu);
    kiln_scope_end();
    free(saved);
    free(bufs);
    return st ? st : st2;
}

int train_checkpoint_setup(train_run *r) {
    if (!r->a.checkpoint_auto) {
        if (r->a.checkpoint <= 1) return 0;
        if (place_segments(r, r->a.checkpoint) != KILN_OK) return fail("--checkpoint");
        if (kiln_nn_sequential_checkpoint_segments(r->model) > 1) print_segments(r);
        else fprintf(stderr, "kiln train: --checkpoint %d: the model's memory allows no split into segments; "
                             "checkpointing is off\n", r->a.checkpoint);
        return 0;
    }
    int layers = kiln_module_num_children(r->model);
    int max_segments = layers < KILN_NN_MAX_CHECKPOINT_SEGMENTS ? layers : KILN_NN_MAX_CHECKPOINT_SEGMENTS;
    int64_t best = INT64_MAX;
    char best_label[32] = "";
    char line[1024];
    int len = 0;
    for (int s = 1; s <= max_segments; s++) {
        int64_t peak = 0;
        if (measure_step(r, s, &peak) != KILN_OK) return fail("--checkpoint auto: measuring a step");
        char label[32];
        if (s == 1) snprintf(label, sizeof label, "none");
        else snprintf(label, sizeof label, "%d segments", s);
        if (len < (int)sizeof line - 1)
            len += snprintf(line + len, sizeof line - (size_t)len, "%s%s %.*f MiB", len ? ", " : "", label, prec(peak),
                            mib(peak));
        if (len > (int)sizeof line - 1) len = (int)sizeof line - 1;
        if (peak < best) {
            best = peak;
            snprintf(best_label, sizeof best_label, "%s", s == 1 ? "without checkpointing" : label);
        }
        if (peak <= r->a.memory_budget) {
            if (place_segments(r, s) != KILN_OK) return fail("--checkpoint auto");
            fprintf(stderr,
                    "kiln train: --checkpoint auto: step peak (measured, incl. parameters, gradients and Adam "
                    "state): %s; budget %.*f MiB: %s\n",
                    line, prec(r->a.memory_budget), mib(r->a.memory_budget),
                    s == 1 ? "no checkpointing needed" : "checkpointing in the fewest segments that fit");
            if (s > 1) print_segments(r);
            return 0;
        }
    }
    place_segments(r, 0);
    fprintf(stderr,
            "kiln train: --checkpoint auto: no segment count keeps the step under --memory-budget %.*f MiB "
            "(measured: %s; lowest %.*f MiB, %s); raise --memory-budget or lower --batch\n",
            prec(r->a.memory_budget), mib(r->a.memory_budget), line, prec(best), mib(best), best_label);
    return 1;
}
