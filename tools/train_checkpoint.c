/* kiln train --checkpoint N | auto --memory-budget SIZE: gradient
 * checkpointing of the model's Sequential in segments placed by measured
 * memory (kiln_nn_sequential_checkpoint_by_memory), the count given or,
 * with auto, the fewest whose step kiln plan predicts within the budget
 * (reserved bytes on the device at the peak of the first step and the
 * steady state: parameters, gradients, Adam's state, the batch and the
 * activations; tools/train_plan.c). Nothing runs to choose. */
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

int train_checkpoint_setup(train_run *r) {
    if (!r->a.checkpoint_auto) {
        if (r->a.checkpoint <= 1) return 0;
        if (place_segments(r, r->a.checkpoint) != KILN_OK) return fail("--checkpoint");
        if (kiln_nn_sequential_checkpoint_segments(r->model) > 1) print_segments(r);
        else fprintf(stderr, "kiln train: --checkpoint %d: the model's memory allows no split into segments; "
                             "checkpointing is off\n", r->a.checkpoint);
        return 0;
    }
    /* Each count planned (kiln plan's step, steps 2, with this run's
     * model, batch, device, --amp and --accum); nothing runs. */
    int layers = kiln_module_num_children(r->model);
    int max_segments = layers < KILN_NN_MAX_CHECKPOINT_SEGMENTS ? layers : KILN_NN_MAX_CHECKPOINT_SEGMENTS;
    int64_t best = INT64_MAX;
    char best_label[32] = "";
    char line[1024];
    int len = 0;
    for (int s = 1; s <= max_segments; s++) {
        kiln_plan p;
        if (train_plan_run(r, r->a.accum, s == 1 ? 0 : s, &p) != KILN_OK) return fail("--checkpoint auto: planning");
        int64_t peak = p.memory[0].reserved_peak;
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
                    "kiln train: --checkpoint auto: step peak (planned, reserved on %s, incl. parameters, gradients "
                    "and Adam state): %s; budget %.*f MiB: %s\n",
                    p.memory[0].name, line, prec(r->a.memory_budget), mib(r->a.memory_budget),
                    s == 1 ? "no checkpointing needed" : "checkpointing in the fewest segments that fit");
            if (s > 1) print_segments(r);
            return 0;
        }
    }
    place_segments(r, 0);
    fprintf(stderr,
            "kiln train: --checkpoint auto: no segment count keeps the step under --memory-budget %.*f MiB "
            "(planned: %s; lowest %.*f MiB, %s); raise --memory-budget or lower --batch\n",
            prec(r->a.memory_budget), mib(r->a.memory_budget), line, prec(best), mib(best), best_label);
    return 1;
}
