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
/* The tutorial's CIFAR-10 model, under models/. */
#define CIFAR10_MODEL "tutorial_cnn_32x32x3.txt"
/* Where CIFAR-10 comes from and the layout --data must have (a hint). */
#define CIFAR10_WHERE                                                                                        \
    "download the binary version, https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz (162 MiB), "    \
    "unpack it (tar xzf) and pass --data DIR, where DIR (or DIR/cifar-10-batches-bin) holds data_batch_1.bin " \
    ".. data_batch_5.bin and test_batch.bin: records of 1 label byte and 3072 image bytes (R, G, B planes of " \
    "32x32)"

/* kiln train --dataset (recorded in the run configuration of each
 * checkpoint; kiln eval reads it from there). */
typedef enum train_dataset { TRAIN_DATASET_FASHION_MNIST = 0, TRAIN_DATASET_CIFAR10, TRAIN_DATASET_COUNT } train_dataset;
/* --augment: auto is the dataset's recipe (CIFAR-10: crop-flip;
 * Fashion-MNIST: none); crop-flip is a random 32x32 crop of the image
 * zero-padded by 4 (torchvision's RandomCrop(32, padding=4)) and a
 * horizontal flip with probability 0.5. The test split is never augmented. */
typedef enum train_augment {
    TRAIN_AUGMENT_AUTO = 0,
    TRAIN_AUGMENT_NONE,
    TRAIN_AUGMENT_FLIP,
    TRAIN_AUGMENT_CROP_FLIP
} train_augment;
const char *train_dataset_name(train_dataset kind);
bool train_dataset_parse(const char *s, train_dataset *out);
const char *train_augment_name(train_augment a);
bool train_augment_parse(const char *s, train_augment *out);
/* auto as the dataset's recipe; any other value as it is. */
train_augment train_augment_resolve(train_dataset kind, train_augment a);
/* The model file under models/ for the dataset. */
const char *train_dataset_default_model(train_dataset kind);

/* Open a split ("train" or "test") of the dataset from `data` (NULL: the
 * Debian package's directory for Fashion-MNIST; CIFAR-10 needs a
 * directory), keeping its first `limit` samples when limit > 0. A missing
 * dataset gets a hint saying where the files come from and their layout. */
kiln_status train_open_split(train_dataset kind, const char *data, int64_t limit, const char *split,
                             kiln_dataset **out);
/* The (first) images file of `split` ("train" or "test") under `data`
 * (NULL: the Debian package's directory), .gz when that one exists, into buf. */
void train_split_file(train_dataset kind, const char *data, const char *split, char *buf, size_t size);
/* The two splits' images must have one size (a model takes one): else a
 * message naming both files and shapes, and 1. */
int train_check_splits(train_dataset kind, const char *data, kiln_dataset *train, kiln_dataset *test);
/* A loader with the dataset's normalisation and the augmentation `augment`
 * (pass TRAIN_AUGMENT_NONE for a test split). */
kiln_status train_make_loader(train_dataset kind, train_augment augment, kiln_dataset *ds, kiln_device dev,
                              int64_t batch, bool shuffle, uint64_t seed, int workers, kiln_loader **out);
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
/* The path of the model spec `file` (DEFAULT_MODEL, CIFAR10_MODEL) under
 * models/ next to the install or the source tree into buf, or NULL. */
const char *train_default_model(const char *file, char *buf, size_t size);

#endif
