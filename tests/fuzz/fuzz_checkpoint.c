/* libFuzzer target for training-checkpoint metadata: the input is a whole
 * checkpoint file, loaded with kiln_checkpoint_load into a tiny model
 * (FUZZ_SPEC on 1x4x4 inputs), its Adam optimizer and a training state,
 * from a memfd (a regular file, named by /proc/self/fd/N, never on disk).
 * Errors are the expected outcome for almost every input; a load that
 * succeeds must hand out only values inside the ranges of kiln/io.h
 * (abort otherwise), and no input may crash, leak or hang.
 *
 * The seed corpus (tests/fuzz/corpus/checkpoint/) holds checkpoints of
 * this model: good.safetensors (a state mid-epoch, with running sums and
 * a run configuration, after two Adam steps), amp.safetensors (with the
 * f16 loss scaler's state), format1.safetensors (a format-1 checkpoint:
 * no running sums), weights.safetensors (no optimizer, no state), and
 * edge cases: negative_epoch, negative_steps (an optimizer.steps entry of
 * -5), trailing_bytes, unknown_version. */
#define _GNU_SOURCE
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "optim/optim_internal.h"

#define FUZZ_SPEC "conv 2 k3 p1\nrelu\nflatten\nlinear 3\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kiln_module *model;
static kiln_optimizer *opt;
static int fd = -1;
static char path[64];

static void setup(void) {
    if (kiln_init() != KILN_OK) abort();
    kiln_log_set_level(KILN_LOG_ERROR);
    if (kiln_model_spec_parse(FUZZ_SPEC, "fuzz.txt", 1, 4, 4, &model) != KILN_OK) abort();
    kiln_tensor **params = NULL;
    int n = 0;
    if (kiln_module_parameters(model, &params, &n) != KILN_OK) abort();
    kiln_adam_opts o = kiln_adam_defaults();
    opt = kiln_adam(params, n, &o);
    free(params);
    fd = memfd_create("fuzz_checkpoint", MFD_CLOEXEC);
    if (!opt || fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
}

static void check(const kiln_train_state *s) {
    if (s->epoch < 0 || s->epoch > KILN_CHECKPOINT_MAX_EPOCH || s->epochs_done < 0 || s->epochs_done > s->epoch ||
        s->step < 0 || s->step > KILN_CHECKPOINT_MAX_COUNT || s->batch_in_epoch < 0 ||
        s->batch_in_epoch > KILN_CHECKPOINT_MAX_COUNT || s->epoch_images < 0 || s->window_images < 0 ||
        s->window_images > s->epoch_images || s->window_steps < 0 || s->window_steps > s->batch_in_epoch ||
        !(s->epoch_correct >= 0) ||
        !(s->window_correct >= 0) || s->window_correct > (double)s->window_images ||
        (s->format_version != 1 && s->format_version != KILN_CHECKPOINT_FORMAT))
        abort();
    if (s->amp[0] && (!(isfinite(s->amp_scale) && s->amp_scale > 0) || s->amp_growth_tracker < 0)) abort();
    if (s->input_c < 0 || s->input_h < 0 || s->input_w < 0) abort();
    if (opt->step_count < 0 || opt->step_count > KILN_CHECKPOINT_MAX_COUNT || !isfinite(opt->lr) || opt->lr < 0) abort();
    for (int i = 0; i < opt->n; i++)
        if (opt->steps[i] < 0 || opt->steps[i] > KILN_CHECKPOINT_MAX_COUNT) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!model) setup();
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    kiln_train_state s;
    if (kiln_checkpoint_load(path, model, opt, &s) == KILN_OK) {
        check(&s);
        free(s.model_spec);
        free(s.run_config);
    } else if (s.model_spec || s.run_config) {
        abort(); /* a failed load hands out nothing */
    }
    kiln_error_clear();
    /* Weights only: the path eval and export take. */
    kiln_checkpoint_load(path, model, NULL, NULL);
    kiln_error_clear();
    return 0;
}
