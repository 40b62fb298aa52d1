/* The data layer's file readers, split so that every byte of a file is
 * parsed by a function that takes memory, not a FILE: the file readers
 * load (and for gzip, decompress) a file and hand the bytes to these, and
 * the fuzz targets in tests/fuzz/ hand them arbitrary bytes. Nothing here
 * reads outside [bytes, bytes + size), whatever those bytes hold.
 *
 * Every error is KILN_ERR_IO (KILN_ERR_INVALID_ARGUMENT for a bad argument
 * such as a class count) with a message naming the file, the byte offset
 * and what was expected there. `name` is only used in messages. */
#ifndef KILN_SRC_DATA_READERS_H
#define KILN_SRC_DATA_READERS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/data.h"

/* Refuse to hold (or decompress to) more than this many bytes of one file:
 * far above any dataset Kiln reads whole, low enough that a hostile gzip
 * stream cannot exhaust memory. */
#define KILN_DATA_MAX_FILE_BYTES ((size_t)4 << 30)

/* A decoded labelled image set, all in one allocation: `buffer` holds the
 * images followed by the labels; `images` and `labels` point into it. */
typedef struct kiln_image_set {
    uint8_t *buffer;
    const uint8_t *images; /* (count, channels, height, width) u8 */
    const uint8_t *labels; /* (count) */
    int64_t count;
    int channels, height, width;
    int num_classes; /* every label is in [0, num_classes) */
} kiln_image_set;

void kiln_image_set_free(kiln_image_set *set);

/* A dataset over `set`, taking it over (its buffer is freed with the
 * dataset; *set is zeroed). On failure *set is freed too. */
kiln_status kiln_dataset_from_image_set(kiln_image_set *set, kiln_dataset **out);

/* ---- Files and gzip (file_read.c) ---------------------------------------------- */

/* Read a whole regular file into a new buffer (free with free()); refuses
 * files above `limit` bytes, and anything that is not a regular file (a
 * directory, a FIFO, a device: checked with fstat after a non-blocking
 * open, so a FIFO never blocks). Errors name the path and the errno. */
kiln_status kiln_file_read_all(const char *path, size_t limit, uint8_t **out, size_t *out_size);
/* "a directory", "a FIFO (named pipe)", ... for a stat st_mode, for
 * messages about a path that is not a regular file. */
const char *kiln_file_type_name(unsigned mode);
/* True when bytes start with the gzip magic 1f 8b. */
int kiln_is_gzip(const uint8_t *bytes, size_t size);
/* Decompress gzip data (one or more members) into a new buffer (free with
 * free()). More than `limit` bytes of output is an error, unless
 * `prefix_only`, in which case decoding stops after `limit` bytes without
 * error (used to read a header and learn how large the whole must be). */
kiln_status kiln_gunzip_memory(const char *name, const uint8_t *src, size_t size, size_t limit,
                               int prefix_only, uint8_t **out, size_t *out_size);

/* ---- IDX (idx_reader.c) -------------------------------------------------------- */

#define KILN_IDX_IMAGES_MAGIC 0x00000803u /* unsigned bytes, 3 dimensions */
#define KILN_IDX_LABELS_MAGIC 0x00000801u /* unsigned bytes, 1 dimension */

/* One IDX array, borrowed from the bytes it was parsed from. */
typedef struct kiln_idx_array {
    int ndim;            /* 1 (labels) or 3 (images) */
    int64_t dims[3];     /* dims[0] is the sample count */
    size_t header_bytes; /* 4 + 4 * ndim: where data starts */
    size_t data_bytes;   /* product of dims */
    const uint8_t *data; /* (dims...) u8, borrowed */
} kiln_idx_array;

/* Validate an IDX header in the first `size` bytes (which may be only a
 * prefix of the file) and compute the file's total size from it. `ndim` is
 * 1 for a labels file, 3 for an images file. */
kiln_status kiln_idx_header_parse(const char *name, const uint8_t *bytes, size_t size, int ndim,
                                  kiln_idx_array *out, size_t *total_size);
/* Parse a whole IDX file held in memory: header, then exactly the data
 * the header declares (no more, no less). */
kiln_status kiln_idx_parse_memory(const char *name, const uint8_t *bytes, size_t size, int ndim,
                                  kiln_idx_array *out);
/* An image set from an images file and a labels file held in memory. The
 * counts must agree and every label must be below num_classes; with
 * num_classes 0 it is taken as the largest label + 1. */
kiln_status kiln_idx_build_memory(const char *images_name, const uint8_t *images, size_t images_size,
                                  const char *labels_name, const uint8_t *labels, size_t labels_size,
                                  int num_classes, kiln_image_set *out);
/* The bytes of one IDX file as read from disk (`raw`, malloc'd; taken
 * over) made ready to parse: returned as they are, or gunzipped when they
 * start with the gzip magic, decompressing at most what the decoded header
 * declares. `shown` is as for kiln_idx_load_file. */
kiln_status kiln_idx_decode(const char *path, uint8_t *raw, size_t raw_size, int ndim, uint8_t **out,
                            size_t *out_size, char *shown, size_t shown_size);
/* Load one IDX file (raw or gzip) from disk, decompressing at most what
 * its header says it holds; free *out with free(). `shown` receives the
 * name to use in later messages about these bytes: the path, marked as
 * decompressed when it was gzip (offsets then count decompressed bytes). */
kiln_status kiln_idx_load_file(const char *path, int ndim, uint8_t **out, size_t *out_size, char *shown,
                               size_t shown_size);
/* kiln_dataset_open_idx with a class count (0: largest label + 1). */
kiln_status kiln_idx_open(const char *images_path, const char *labels_path, int num_classes,
                          kiln_dataset **out);

/* ---- CIFAR (cifar_reader.c) ---------------------------------------------------- */

#define KILN_CIFAR_IMAGE_BYTES 3072 /* (3, 32, 32) u8 */

/* Bytes of one record: the label bytes (1 for CIFAR-10, 2 for CIFAR-100)
 * then the image. 0 when num_classes is neither 10 nor 100. */
size_t kiln_cifar_record_bytes(int num_classes);
/* Validate one batch file in memory (whole records, every label in range)
 * and return its record count. */
kiln_status kiln_cifar_check_memory(const char *name, const uint8_t *bytes, size_t size, int num_classes,
                                    int64_t *count);
/* An image set from one batch held in memory, validated as by
 * kiln_cifar_check_memory. */
kiln_status kiln_cifar_parse_memory(const char *name, const uint8_t *bytes, size_t size, int num_classes,
                                    kiln_image_set *out);

#endif
