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

#ifdef __cplusplus
}
#endif
#endif /* KILN_IO_H */
