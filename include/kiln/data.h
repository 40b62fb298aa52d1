/* Kiln data: datasets, transforms and the loader.
 *
 * A dataset is a table of samples; each sample is an image (or any fixed-
 * size record) plus an integer label. Readers validate files completely
 * when they open them, so a bad file is an error naming the file, the byte
 * offset and what was expected — never a crash or a read past a buffer.
 *
 * Ownership: kiln_dataset_* objects are created by an open/create call and
 * freed with kiln_dataset_free. Blocking: opening reads (and for gzip
 * files, decompresses) the whole file on the calling thread. */
#ifndef KILN_DATA_H
#define KILN_DATA_H

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_dataset kiln_dataset;

/* What one sample looks like. Samples are stored as `dtype` elements in
 * (channels, height, width) order. */
typedef struct kiln_sample_info {
    kiln_dtype dtype; /* KILN_U8 for image files */
    int channels, height, width;
    int num_classes; /* labels are in [0, num_classes) */
} kiln_sample_info;

/* The dataset interface, for users who bring their own data (see
 * docs/data.md, "Adding a dataset"). `length` returns the sample count,
 * fixed while a loader uses the dataset. `get` writes sample `index`
 * (0 <= index < length, checked by Kiln) into `dst` (kiln_sample_bytes(info)
 * bytes) and its label into *label; several loader threads call it at
 * once, so it must be thread-safe. `free` releases `ctx` (may be NULL). */
typedef struct kiln_dataset_ops {
    int64_t (*length)(void *ctx);
    kiln_status (*get)(void *ctx, int64_t index, void *dst, int64_t *label);
    void (*free)(void *ctx);
} kiln_dataset_ops;

/* A dataset over user callbacks. On success it owns ctx (ops->free runs in
 * kiln_dataset_free); on failure (a NULL callback, a sample shape with a
 * size below 1, num_classes < 1: KILN_ERR_INVALID_ARGUMENT) ctx is still
 * the caller's. *ops is copied. */
kiln_status kiln_dataset_create(const kiln_dataset_ops *ops, void *ctx, kiln_sample_info info, kiln_dataset **out);
/* An in-memory dataset over `data` and `labels`, strided CPU tensors: data
 * (N, C, H, W), (N, H, W) or (N, D) (D channels of 1x1) of any dtype, and
 * labels (N) i64, every label checked against num_classes. Holds its own
 * references to both (a non-contiguous `data` is copied once, here), so the
 * caller may release its references right away. Later in-place writes to
 * the tensors are seen by kiln_dataset_get. */
kiln_status kiln_dataset_from_tensors(kiln_tensor *data, kiln_tensor *labels, int num_classes, kiln_dataset **out);
/* MNIST-style IDX files (raw or gzip; detected by content, not by name):
 * images (magic 0x00000803, u8 (N, rows, cols)) and labels (0x00000801,
 * u8 (N)). Samples are u8 (1, rows, cols); num_classes is the largest label
 * + 1, as IDX files do not record it. Errors: KILN_ERR_IO naming the file,
 * the offset and what was expected. */
kiln_status kiln_dataset_open_idx(const char *images_path, const char *labels_path, kiln_dataset **out);
/* CIFAR-10 (num_classes 10; 1 label byte) or CIFAR-100 (100; 2 label bytes:
 * coarse, fine — the fine label is returned) binary batches, raw or gzip;
 * the `paths` are concatenated in order. Samples are u8 (3, 32, 32). Every
 * label byte is checked. */
kiln_status kiln_dataset_open_cifar(int n_paths, const char *const *paths, int num_classes, kiln_dataset **out);
/* Fashion-MNIST "train" (60000) or "test" (10000) from `dir`, or from where
 * Debian's dataset-fashion-mnist installs it when dir is NULL
 * (/usr/share/datasets/fashion-mnist). Each file is looked for as .gz and
 * unpacked; 10 classes, every label checked. When files are missing the
 * error names every place tried. */
kiln_status kiln_dataset_open_fashion_mnist(const char *dir, const char *split, kiln_dataset **out);
/* Frees the dataset and what it holds (runs ops->free). NULL is a no-op. */
void kiln_dataset_free(kiln_dataset *ds);

/* Sample count (0 for NULL). */
int64_t kiln_dataset_length(const kiln_dataset *ds);
/* The sample shape, dtype and class count (all zero for NULL). */
kiln_sample_info kiln_dataset_info(const kiln_dataset *ds);
/* Bytes of one sample: channels * height * width * dtype size; 0 when a
 * size is below 1, the dtype is invalid or the product overflows. */
size_t kiln_sample_bytes(kiln_sample_info info);
/* Copy sample `index` to dst (kiln_sample_bytes bytes) and its label to
 * *label (label may be NULL). Thread-safe for the built-in datasets and
 * for user datasets whose `get` is; never blocks on a device. Errors: an
 * index outside [0, length) (KILN_ERR_INVALID_ARGUMENT), a label from a
 * user `get` outside [0, num_classes) (KILN_ERR_STATE), or the user's
 * error. */
kiln_status kiln_dataset_get(const kiln_dataset *ds, int64_t index, void *dst, int64_t *label);

/* ---- Transforms ------------------------------------------------------------
 *
 * Per-sample image transforms, run on the CPU by the loader (or directly
 * with kiln_transform_apply) while a batch is assembled. One fused pass per
 * sample: each output pixel is read from its source position (crop offset,
 * flip), converted to f32 (u8 divided by 255 when scale_u8), normalised,
 * then cut out. Every random choice is a pure function of (seed, epoch,
 * sample index) through the counter-based RNG, so the result does not
 * depend on which thread made it or in what order. */

#define KILN_TRANSFORM_MAX_CHANNELS 8

typedef enum kiln_pad_mode {
    KILN_PAD_ZERO = 0, /* padding pixels are raw 0 (black), normalised like any pixel */
    KILN_PAD_REFLECT,  /* mirror without repeating the edge: -1 -> 1, W -> W-2 */
} kiln_pad_mode;

/* A pipeline description; zero-initialised means "convert to f32, nothing
 * else" (kiln_transform_opts_default gives exactly that). */
typedef struct kiln_transform_opts {
    bool scale_u8;  /* u8 input: divide by 255 before normalising (default true) */
    bool normalize; /* (x - mean[c]) / std[c] per channel */
    float mean[KILN_TRANSFORM_MAX_CHANNELS];
    float std[KILN_TRANSFORM_MAX_CHANNELS];
    int crop_padding;       /* random crop of the original size from the image
                             * padded by this many pixels each side; 0: off.
                             * Must be < height and < width for reflect. */
    kiln_pad_mode pad_mode;
    float flip_p;           /* random horizontal flip with probability flip_p */
    bool alternating_flip;  /* flip iff (epoch + bit(seed, index)) is odd:
                             * every image is flipped on alternate epochs */
    int cutout;             /* side of a zeroed square (in the normalised
                             * output) centred uniformly in the image and
                             * clipped at its borders; 0: off */
} kiln_transform_opts;

/* scale_u8 on, everything else off. */
kiln_transform_opts kiln_transform_opts_default(void);
/* Check `opts` against samples of `info` (dtype u8 or f32, channels within
 * KILN_TRANSFORM_MAX_CHANNELS when normalising, std != 0, crop padding
 * within the image for reflect, flip_p in [0, 1], cutout >= 0). Errors name
 * the option and the value. */
kiln_status kiln_transform_check(const kiln_transform_opts *opts, kiln_sample_info info);
/* Transform one sample: `src` holds kiln_sample_bytes(info) bytes in
 * (C, H, W) order; `dst` receives C*H*W floats (C, H, W). src and dst must
 * not overlap. The options must have passed kiln_transform_check. Pure and
 * thread-safe; does not block. */
void kiln_transform_apply(const kiln_transform_opts *opts, kiln_sample_info info, const void *src, float *dst,
                          uint64_t seed, int64_t epoch, int64_t index);

/* ---- Loader ------------------------------------------------------------------
 *
 * Batches of (x f32 (B, C, H, W), y i64 (B)) from a dataset, assembled by
 * worker threads (or the calling thread) into pooled buffers, delivered in
 * order. See docs/data.md, "Transforms and loader", for costs and the
 * prefetch path. */

typedef struct kiln_loader kiln_loader;

/* Dataset-on-device mode (docs/data.md, "Dataset on the device"). The whole
 * dataset is uploaded once at kiln_loader_create (as stored, u8 or f32,
 * already padded for the random crop; labels i64), and each batch is made
 * by ops queued on the caller's current stream of opts.device: a lookup of
 * the cropped (and, from the mirrored copy, flipped) image rows, conversion
 * to f32, normalisation and cutout. No
 * worker threads and no per-pixel host work; the host computes the epoch's
 * permutation (as the host path does) and, per batch, a few random
 * parameters per sample, uploaded with one small non-blocking copy from a
 * pinned buffer. Batches equal the host path's bit for bit, for every
 * transform (nothing falls back to the host). Device memory: the padded
 * images, twice when the transforms flip (a mirrored copy), + 8 bytes per
 * label. On a CPU device the dataset is one CPU tensor and the same ops
 * make the batches. */
typedef enum kiln_data_on_device {
    KILN_DATA_ON_DEVICE_OFF = 0, /* host path: workers, pooled buffers, prefetch */
    KILN_DATA_ON_DEVICE_AUTO,    /* on the device when the upload fits in
                                  * on_device_fraction of its free memory;
                                  * the choice and its reason are logged (info) */
    KILN_DATA_ON_DEVICE_ON,      /* always; an upload that does not fit fails
                                  * kiln_loader_create (KILN_ERR_OUT_OF_MEMORY) */
} kiln_data_on_device;

typedef struct kiln_loader_opts {
    int64_t batch_size;   /* > 0 */
    bool shuffle;         /* a permutation per epoch keyed by (seed, epoch) */
    uint64_t seed;        /* shuffling and random transforms */
    bool drop_last;       /* drop a last batch smaller than batch_size */
    int num_workers;      /* 0: batches are made in kiln_loader_next; < 0: auto
                           * (kiln_num_loader_workers(), reported) */
    int prefetch_factor;  /* batches in flight per worker; 0 means 2 */
    bool pin_memory;      /* assemble batches in pinned host memory */
    kiln_device device;   /* where batches are consumed; CPU: they stay on the host */
    bool prefetch_to_device; /* use the copy-stream prefetch path even when
                              * device is the CPU (on by itself for other devices) */
    kiln_transform_opts transforms;
    kiln_data_on_device on_device; /* default off; in device mode num_workers,
                                    * prefetch_factor, pin_memory and
                                    * prefetch_to_device do not apply */
    double on_device_fraction;     /* AUTO: the most of the device's free memory
                                    * the upload may take, in (0, 1]; 0 means 0.25 */
} kiln_loader_opts;

/* batch_size 64, no shuffle, seed 0, keep the last batch, 0 workers,
 * prefetch_factor 2, no pinning, the calling thread's kiln_current_device()
 * (the CPU when that is meta), default transforms, dataset on the host
 * (on_device off, fraction 0.25). A loader for a CUDA device without
 * pin_memory logs once (KILN_LOG=info) that its copies block the host. */
kiln_loader_opts kiln_loader_opts_default(void);

/* Per-epoch statistics (kiln_loader_stats). */
typedef struct kiln_loader_stats {
    int64_t epoch;             /* as given to kiln_loader_epoch_begin */
    int64_t batches;           /* delivered so far this epoch */
    int64_t batches_per_epoch;
    double wait_s;             /* time the consumer was blocked in kiln_loader_next */
    double elapsed_s;          /* since kiln_loader_epoch_begin */
    double batches_per_s;      /* batches delivered / elapsed_s */
    int64_t buffers_allocated; /* host batch buffers ever allocated (the pool) */
    int num_workers;           /* after resolving auto (0 in device mode) */
    bool on_device;            /* dataset-on-device mode is in use */
    int64_t device_bytes;      /* device mode: bytes the uploaded dataset takes */
} kiln_loader_stats;

/* Create a loader over `dataset` (borrowed: it must outlive the loader).
 * Starts num_workers threads, which wait for kiln_loader_epoch_begin.
 * Errors: bad options (named, with the value), a transform that does not
 * fit the samples, an unavailable device, thread creation failure. */
kiln_status kiln_loader_create(kiln_dataset *dataset, const kiln_loader_opts *opts, kiln_loader **out);
/* Start epoch `epoch` (any value; shuffling and random transforms are keyed
 * by it). An epoch still running is abandoned: batches not yet taken are
 * dropped. Does not block on devices; waits only for workers to finish the
 * batch each is making. */
kiln_status kiln_loader_epoch_begin(kiln_loader *loader, int64_t epoch);
/* The next batch in order: *x f32 (B, C, H, W) and *y i64 (B) on
 * opts.device, new references the caller releases (registered with the
 * caller's scope like any returned tensor). At the end of the epoch
 * returns KILN_OK with *x and *y NULL. Blocks the host while the batch is
 * not ready (the time is counted in wait_s). In device mode the batch's
 * ops are queued on the caller's current stream of opts.device and the call
 * returns without waiting for them (on a CPU device they run in the call);
 * it blocks only to reuse a pinned parameter buffer whose copy, queued four
 * batches earlier, has not run yet. On the prefetch path the
 * batch is ready on the caller's current stream of opts.device (which
 * waits on the copy's event: device-side, no host block), and the next
 * batch's copy is already queued on the loader's copy stream. Pooled host
 * buffers are reused only after every reference to them (views included)
 * is gone and any copy queued from them has finished. A worker's error
 * (a dataset read failing) is returned for the batch it concerns. */
kiln_status kiln_loader_next(kiln_loader *loader, kiln_tensor **x, kiln_tensor **y);
/* The order a loader over n samples visits in `epoch`: 0..n-1, or with
 * shuffle the permutation keyed by (seed, epoch) that kiln_loader makes
 * (Fisher-Yates over a Philox stream; the same on every machine). `out`
 * holds n entries. Pure and thread-safe; does not block. The distributed
 * sampler (kiln/dist.h) shards this order, so ranks together visit what
 * one process's loader would. */
void kiln_loader_permutation(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t *out);
/* Make the loader's epochs visit the dataset samples indices[0..count) in
 * that order (a sampler's choice: one rank's shard, a subset, repeats
 * allowed), in batches of batch_size (the last one ragged unless
 * drop_last), instead of the whole dataset in the loader's own order;
 * opts.shuffle no longer applies (the list is the order), while the random
 * transforms stay keyed by (seed, epoch, index). The list is copied. An
 * epoch in progress is abandoned (as by kiln_loader_epoch_begin): call
 * kiln_loader_epoch_begin next; the list stays for every later epoch until
 * changed. kiln_loader_num_batches counts it at once. indices NULL with
 * count 0: the whole dataset again. Errors: an index outside the dataset
 * (named with its position), count < 0. Waits only for workers to finish
 * the batch each is making. */
kiln_status kiln_loader_set_indices(kiln_loader *loader, const int64_t *indices, int64_t count);
/* Statistics of the current epoch. Does not block on workers. */
kiln_status kiln_loader_stats_get(const kiln_loader *loader, kiln_loader_stats *out);
/* Number of batches an epoch yields. */
int64_t kiln_loader_num_batches(const kiln_loader *loader);
/* Stop the workers (each finishes the batch it is making), join them and
 * free the pool. Safe at any point, mid-epoch included. Batches the caller
 * still holds stay valid. NULL is a no-op. */
void kiln_loader_free(kiln_loader *loader);

#ifdef __cplusplus
}
#endif
#endif
