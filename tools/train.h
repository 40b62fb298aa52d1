/* kiln train, eval and export: the main job (see tools/train.c,
 * tools/train_eval.c and docs/training.md). */
#ifndef KILN_TOOLS_TRAIN_H
#define KILN_TOOLS_TRAIN_H

#include "kiln/kiln.h"

/* argv holds the options after the command's name. Each returns the
 * process exit code: 0 done, 1 a library error (printed), 2 a usage
 * error, 130 interrupted (train: a checkpoint was written). */
int kiln_cmd_train(int argc, char **argv);
int kiln_cmd_eval(int argc, char **argv);
int kiln_cmd_export(int argc, char **argv);

/* ---- Shared by train and eval/export (tools/train*.c) ----------------------- */

/* The main job's model, under models/. */
#define DEFAULT_MODEL "tutorial_cnn_28x28x1.txt"
/* The Debian package dataset-fashion-mnist's directory, kiln train's default --data. */
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Print the library's last error as "kiln CMD: WHAT: message" + hint; 1. */
int train_fail(const char *cmd, const char *what);
/* Open a Fashion-MNIST split from `data` (NULL: the Debian package's
 * directory), keeping its first `limit` samples when limit > 0. A missing
 * dataset gets a hint naming the package and --data. */
kiln_status train_open_split(const char *data, int64_t limit, const char *split, kiln_dataset **out);
/* The images file of `split` ("train" or "test") under `data` (NULL: the
 * Debian package's directory), .gz when that one exists, into buf. */
void train_split_file(const char *data, const char *split, char *buf, size_t size);
/* The two splits' images must have one size (a model takes one): else a
 * message naming both files and shapes, and 1. */
int train_check_splits(const char *data, kiln_dataset *train, kiln_dataset *test);
/* A loader with kiln train's normalisation. */
kiln_status train_make_loader(kiln_dataset *ds, kiln_device dev, int64_t batch, bool shuffle, uint64_t seed,
                              int workers, kiln_loader **out);
/* Test-set loss and accuracy in eval mode without autograd. */
kiln_status train_evaluate(kiln_module *model, kiln_loader *ld, int64_t epoch, double *loss, double *acc,
                           int64_t *images);
/* The spec text of `path`, malloc'd (NULL with a message printed). */
char *train_read_text(const char *cmd, const char *path);
/* Parse `spec` (named `name` in errors) as the model for (c, h, w) within
 * the one budget of docs/training.md (KILN_MAX_PARAMETERS and
 * KILN_MAX_ACTIVATION raise it). When it came from the checkpoint `ckpt`
 * (else NULL), its parameters may also not outnumber what the file can
 * hold, two bytes each at the least (f16, bf16): an edited or damaged spec
 * is refused before it allocates. Prints the error; returns 0 or 1. */
int train_parse_spec(const char *cmd, const char *spec, const char *name, const char *ckpt, int64_t c, int64_t h,
                     int64_t w, kiln_module **m);
/* The default model spec's path (models/ next to the install or the
 * source tree) into buf, or NULL. */
const char *train_default_model(char *buf, size_t size);

#endif
