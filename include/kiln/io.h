/* Kiln io: safetensors files of a module's state dict.
 *
 * The format is Hugging Face's safetensors: an 8-byte little-endian header
 * length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} (offsets into the data that follows the
 * header), then the raw little-endian data. Kiln writes the tensors in
 * state-dict order, names as kiln_module_state_dict gives them (PyTorch's),
 * so `safetensors.torch.load_file` reads a Kiln file and
 * `model.load_state_dict` accepts it for the same architecture. */
#ifndef KILN_IO_H
#define KILN_IO_H

#include "kiln/nn.h"
#include "kiln/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write m's state dict (parameters and buffers) to `path` atomically: into
 * a temporary file next to it, fsync'd, then renamed over `path`, so a
 * crash or an error leaves either the old file or the complete new one,
 * never a partial file (the temporary is removed on error). Copies every
 * tensor to the host (blocks). Errors: KILN_ERR_IO naming the path and the
 * system's reason. */
kiln_status kiln_safetensors_save(const char *path, kiln_module *m);
/* Load a safetensors file into m (strict: the file's names must be exactly
 * m's state-dict names; dtypes and shapes must match). The header is
 * validated before anything is copied: its length, the JSON, each dtype,
 * shape and data range (inside the file, of the size the dtype and shape
 * need). Errors (KILN_ERR_IO) name the file and what was wrong; a file of
 * another model lists the missing and unexpected names. On error the
 * module may be partly loaded only when the copy itself fails. Blocks. */
kiln_status kiln_safetensors_load(const char *path, kiln_module *m);

/* ---- Reading tensors by name --------------------------------------------------------
 * Any safetensors file (Kiln's, PyTorch's, a Hugging Face checkpoint's), read
 * one named tensor at a time, without a module:
 *
 *   kiln_safetensors *f = NULL;
 *   KILN_TRY(kiln_safetensors_open("model.safetensors", &f));
 *   for (int i = 0; i < kiln_safetensors_tensor_count(f); i++)
 *       puts(kiln_safetensors_tensor_name(f, i));
 *   kiln_tensor *w = kiln_safetensors_get(f, "0.weight", KILN_CPU); // NULL + error
 *   kiln_safetensors_close(f);                                       // w stays valid
 *
 * A handle holds the parsed header and an open file descriptor; the data
 * stays on disk until kiln_safetensors_get reads one tensor's bytes. */
typedef struct kiln_safetensors kiln_safetensors;

/* Open `path` and validate its header: the file is a regular file
 * (directories, pipes and devices are refused), the 8-byte header length
 * fits the file and 100 MiB, the JSON is an object of {dtype, shape,
 * data_offsets} entries plus an optional "__metadata__" map of strings,
 * every dtype is one Kiln holds, every range lies inside the file with
 * exactly the bytes its dtype and shape need, no two ranges overlap and no
 * name repeats. Only the header is read, never the data. *out gets a
 * handle the caller closes with kiln_safetensors_close. Errors:
 * KILN_ERR_IO naming the file and what was wrong. Blocks (file I/O). */
kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out);
/* Close the file and free the handle (NULL is a no-op). Every string the
 * handle lent (names, metadata) dies with it; tensors returned by
 * kiln_safetensors_get do not. */
void kiln_safetensors_close(kiln_safetensors *f);
/* The number of tensors in the file (the "__metadata__" entry is not
 * one). */
int kiln_safetensors_tensor_count(const kiln_safetensors *f);
/* The name of tensor i (0 <= i < count, in the header's order), borrowed
 * from the handle; NULL when i is out of range. */
const char *kiln_safetensors_tensor_name(const kiln_safetensors *f, int i);
/* Dtype and shape of tensor `name` from the header, without reading data
 * (either out pointer may be NULL). KILN_ERR_INVALID_ARGUMENT naming the
 * tensor and the file when the file has no such tensor. Does not block. */
kiln_status kiln_safetensors_tensor_info(const kiln_safetensors *f, const char *name, kiln_dtype *dtype,
                                         kiln_shape *shape);
/* Read tensor `name` into a new contiguous tensor on `device` (KILN_CPU,
 * or a CUDA device), of the file's dtype and shape. Returns a new
 * reference the caller releases (kiln_release), or NULL with the error set:
 * KILN_ERR_INVALID_ARGUMENT naming the tensor and the file for an unknown name,
 * KILN_ERR_IO when the read fails, out of memory on the device. Reads the
 * tensor's bytes from disk into host memory and copies them to the device
 * before returning: blocks the host. Calls on one handle from several
 * threads are safe (each reads with pread into its own buffer). */
kiln_tensor *kiln_safetensors_get(kiln_safetensors *f, const char *name, kiln_device device);
/* The number of "__metadata__" entries and the key of entry i (borrowed;
 * NULL when out of range), in the header's order. */
int kiln_safetensors_metadata_count(const kiln_safetensors *f);
const char *kiln_safetensors_metadata_key(const kiln_safetensors *f, int i);
/* The "__metadata__" value of `key`, borrowed from the handle, or NULL
 * when the file has no such key. Does not block. */
const char *kiln_safetensors_metadata(const kiln_safetensors *f, const char *key);

/* ---- Training checkpoints ------------------------------------------------------------
 * A checkpoint is a safetensors file that any safetensors reader opens:
 *   - the module's state dict under its names ("0.weight", ...);
 *   - the optimizer's state as "optimizer.<param>.<slot>" (slot exp_avg,
 *     exp_avg_sq, max_exp_avg_sq for Adam/AdamW, momentum_buffer for SGD;
 *     <param> the parameter's state-dict name) and "optimizer.steps" (i64,
 *     the update count of each parameter, in optimizer order);
 *   - in the header's __metadata__ string map (keys "kiln.*"): the format
 *     version (kiln.checkpoint), epoch, step, batch position in the epoch,
 *     data seed, the device generator (seed, subsequence, offset), the
 *     deterministic flag, the CPU kernel table in force (fast or
 *     reference), the convolution autotuner switches (conv_autotune,
 *     cudnn_benchmark), the optimizer's kind, lr and step count, the model
 *     spec text and input shape when given (kiln eval / kiln export
 *     rebuild the model from them), with mixed precision the AMP mode and
 *     the loss scaler's scale and growth tracker (kiln.amp, kiln.amp.scale,
 *     kiln.amp.growth_tracker), and from format 2 on the epoch's and the
 *     open metrics window's running sums (kiln.epoch_loss_sum, ...) and
 *     the caller's run configuration (kiln.run_config).
 *
 * Every value is untrusted on load: each is parsed whole and checked
 * against its range below before anything uses it, and an error names the
 * file, the key, the value and the range. See docs/training.md,
 * "Checkpoint format". */

/* The format version kiln_checkpoint_save writes ("kiln.checkpoint").
 * Load reads 1 (no running sums, no run configuration: they load as 0 and
 * NULL) and 2; any other version is refused. */
#define KILN_CHECKPOINT_FORMAT 2
/* Ranges of the training position, checked on save and on load: epochs
 * (kiln.epoch, kiln.epochs_done) in [0, KILN_CHECKPOINT_MAX_EPOCH]; steps,
 * batches and images (kiln.step, kiln.batch_in_epoch, the optimizer's
 * step counts, the running sums' counts) in [0, KILN_CHECKPOINT_MAX_COUNT],
 * where doubles still hold every integer (2^53). */
#define KILN_CHECKPOINT_MAX_EPOCH 1000000
#define KILN_CHECKPOINT_MAX_COUNT 9007199254740992LL

/* What a training loop needs, besides weights and optimizer, to continue
 * exactly where it stopped. Saved from and loaded into this struct;
 * `rng_*`, `deterministic`, `cpu_kernels` and `format_version` are filled
 * by kiln_checkpoint_save itself (the values in force) and by load.
 * Save refuses (KILN_ERR_INVALID_ARGUMENT) values load would refuse:
 *   0 <= epochs_done <= epoch <= KILN_CHECKPOINT_MAX_EPOCH;
 *   step, batch_in_epoch, epoch_images in [0, KILN_CHECKPOINT_MAX_COUNT];
 *   window_steps <= batch_in_epoch, window_images <= epoch_images;
 *   the loss sums any double (inf and NaN included: they are reported, never
 *   trained on), 0 <= epoch_correct <= epoch_images - window_images
 *   and 0 <= window_correct <= window_images;
 *   the input shape all 0 (not recorded) or each of c, h, w in [1, 2^20];
 *   with amp, amp_scale finite and > 0 and amp_growth_tracker >= 0. */
typedef struct kiln_train_state {
    int64_t epoch;          /* the epoch in progress (0-based) */
    int64_t step;           /* optimizer steps taken in total */
    int64_t batch_in_epoch; /* batches of `epoch` already trained: the data order position */
    int64_t epochs_done;    /* epochs fully trained and evaluated */
    uint64_t data_seed;     /* the loader's shuffle/transform seed */
    uint64_t rng_seed, rng_subsequence, rng_offset; /* the device generator at save time */
    bool deterministic;     /* kiln_deterministic() at save time */
    char cpu_kernels[16];   /* "fast" or "reference": the CPU kernel table at save time */
    int64_t input_c, input_h, input_w; /* the model's input shape (0: not recorded) */
    /* Save: the model spec text to embed (may be NULL), borrowed. Load: a
     * malloc'd copy the caller frees (NULL when the file has none). */
    char *model_spec;
    /* Mixed precision: "f16" or "bf16" (empty: off, nothing saved) and the
     * grad scaler's state (kiln/amp.h) at save time. */
    char amp[8];
    double amp_scale;
    int64_t amp_growth_tracker;
    /* Load: the file's format version (1 or KILN_CHECKPOINT_FORMAT). */
    int format_version;
    /* The running sums of `epoch` at the save point (format 2; 0 at an
     * epoch boundary), so a resumed epoch reports what an uninterrupted
     * one would: the loss and correct sums of the epoch's batches whose
     * metrics windows were closed, and the images of all its batches. */
    double epoch_loss_sum, epoch_correct;
    int64_t epoch_images;
    /* The metrics window open at the save point (format 2): its steps,
     * images and sums, not in the epoch's sums yet. A resumed loop carries
     * them on, so the window that straddles the stop closes with exactly
     * the sums of the uninterrupted run. */
    int64_t window_steps, window_images;
    double window_loss_sum, window_correct;
    /* Save: the caller's run configuration (any text, e.g. a JSON object
     * of the flags a run was started with; NULL: none), borrowed, stored
     * as kiln.run_config. Load: a malloc'd copy the caller frees (NULL
     * when the file has none). The library does not interpret it. */
    char *run_config;
} kiln_train_state;

/* Write a checkpoint of m, opt (NULL: weights only) and *state (NULL:
 * none) to `path`, atomically like kiln_safetensors_save (temporary file in
 * the same directory, fsync, rename, fsync of the directory). The device
 * generator recorded is that of m's first parameter's device. Copies every
 * tensor to the host: blocks. Borrows everything. Errors:
 * KILN_ERR_INVALID_ARGUMENT naming the field of *state outside its range
 * (kiln_train_state), KILN_ERR_IO naming the path and the reason; nothing
 * is left behind on error. */
kiln_status kiln_checkpoint_save(const char *path, kiln_module *m, kiln_optimizer *opt,
                                 const kiln_train_state *state);
/* Load a checkpoint into m, opt (NULL: optimizer state ignored) and
 * *state (NULL: ignored; else filled, its model_spec and run_config
 * malloc'd for the caller to free; both NULL after an error). The header is
 * validated first (the file's type and size, lengths, JSON, dtypes,
 * shapes, data offsets indexing the data section exactly), then the
 * format version and, with opt or state, every metadata value against its
 * range (kiln_train_state; the optimizer's lr finite and >= 0, its step
 * count and each parameter's in [0, KILN_CHECKPOINT_MAX_COUNT]) before
 * anything is changed; the module's names must match exactly (the error
 * lists the missing and unexpected names: a checkpoint of another model),
 * every shape and dtype is checked before anything is copied. With opt,
 * the optimizer must be of the saved kind over the same parameters; its
 * state, lr and step counts are replaced. With state, the device
 * generator is restored (kiln_manual_seed + advance), so dropout draws
 * continue where they stopped; the deterministic flag is NOT changed
 * (compare state->deterministic). Errors: KILN_ERR_IO naming the file and
 * the key or tensor at fault. On error the module may be partly loaded
 * only when a copy itself fails. Blocks (reads the file). */
kiln_status kiln_checkpoint_load(const char *path, kiln_module *m, kiln_optimizer *opt, kiln_train_state *state);
/* The __metadata__ value of `key` in the safetensors file `path`: *value
 * gets a malloc'd copy (free()), or NULL when the key is absent (still
 * KILN_OK). Validates the header; blocks (reads the header, not the
 * tensors). */
kiln_status kiln_checkpoint_read_meta(const char *path, const char *key, char **value);

#ifdef __cplusplus
}
#endif
#endif /* KILN_IO_H */
