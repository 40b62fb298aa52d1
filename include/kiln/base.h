/* Kiln base layer: status codes, the thread-local error object, logging,
 * the counter-based random number generator and half-precision conversion.
 *
 * Nothing in this header allocates memory the caller must free, and nothing
 * blocks the host beyond the work it does itself. */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

/* ---- Status and errors ------------------------------------------------ */

/* What a fallible call returns. KILN_OK is zero so `if (st)` means failure. */
typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARGUMENT, /* a value the caller passed is wrong */
    KILN_ERR_OUT_OF_MEMORY,    /* a device or host allocation failed */
    KILN_ERR_DEVICE,           /* device missing, driver error, launch failure */
    KILN_ERR_UNSUPPORTED,      /* valid request this build or device cannot do */
    KILN_ERR_STATE,            /* calls in the wrong order, released twice, ... */
    KILN_ERR_IO,               /* file system or parse failure */
    KILN_ERR_INTERNAL,         /* a bug in Kiln: please report it */
    KILN_STATUS_COUNT
} kiln_status;

/* The last error raised on the calling thread. `message` names the thing and
 * the value; `hint` says what to try; `file`/`line` locate where Kiln raised
 * it. Owned by the library; valid until the next failing call on this
 * thread. */
typedef struct kiln_error {
    kiln_status status;
    const char *file;
    int line;
    char message[1024];
    char hint[512];
} kiln_error;

/* Returns the calling thread's last error (status KILN_OK if none). Never
 * NULL. Does not block. */
const kiln_error *kiln_error_last(void);
/* Shorthand for kiln_error_last()->message. */
const char *kiln_error_message(void);
/* Forget the calling thread's last error. */
void kiln_error_clear(void);
/* Static name of a status ("KILN_ERR_OUT_OF_MEMORY"); never NULL. */
const char *kiln_status_name(kiln_status status);

/* ---- Logging ----------------------------------------------------------- */

typedef enum kiln_log_level {
    KILN_LOG_DEBUG = 0,
    KILN_LOG_INFO,
    KILN_LOG_WARN,
    KILN_LOG_ERROR,
    KILN_LOG_OFF
} kiln_log_level;

/* A log sink receives one complete line (no trailing newline). `message` is
 * valid only during the call. Sinks may be called from any thread, but never
 * concurrently: the logger serialises them. */
typedef void (*kiln_log_sink)(kiln_log_level level, const char *message, void *user);

/* Redirect log lines to `sink` (NULL restores the default: stderr). */
void kiln_log_set_sink(kiln_log_sink sink, void *user);
/* Lines below `level` are dropped. Default: KILN_LOG_WARN, or the value of
 * the environment variable KILN_LOG (debug, info, warn, error, off). */
void kiln_log_set_level(kiln_log_level level);
kiln_log_level kiln_log_get_level(void);
/* Log a printf-style line at `level`. Thread-safe. */
void kiln_log_write(kiln_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- Counter-based random numbers (Philox4x32-10) ---------------------- */

/* One Philox4x32-10 block: 4 random 32-bit words from a 64-bit key and a
 * 128-bit counter. A pure function, so every backend computes the same
 * numbers for the same (key, counter). */
void kiln_philox4x32_10(const uint32_t key[2], const uint32_t counter[4], uint32_t out[4]);

/* A position in a random stream. Element i of a draw made at (seed,
 * subsequence, offset) is word (offset*4 + i) of the stream keyed by seed
 * and subsequence, so draws can be computed in any order, on any device. */
typedef struct kiln_rng {
    uint64_t seed;
    uint64_t subsequence;
    uint64_t offset; /* in 4-word Philox blocks */
} kiln_rng;

/* A generator at the start of the stream for `seed`. */
kiln_rng kiln_rng_make(uint64_t seed);
/* An independent generator for child `id` (a device, a stream, a worker):
 * same seed, a subsequence derived from the parent's and `id`. */
kiln_rng kiln_rng_split(kiln_rng parent, uint64_t id);
/* The `index`-th 32-bit word of the draw starting at `rng` (no state change). */
uint32_t kiln_rng_u32_at(const kiln_rng *rng, uint64_t index);
/* Shuffle perm[0..n) in place (Fisher-Yates; position i swaps with word
 * pair 2i, 2i+1 of the draw at `rng` taken modulo i + 1): the same order
 * on every machine for the same generator. No state change, no block. */
void kiln_rng_shuffle(const kiln_rng *rng, int64_t *perm, int64_t n);
/* Uniform float in [0, 1) from a 32-bit word (24 random bits). */
float kiln_rng_u32_to_uniform(uint32_t word);
/* Standard normal for element `index` of a draw (Box-Muller over the words
 * 2*index and 2*index+1). */
float kiln_rng_normal_at(const kiln_rng *rng, uint64_t index);
/* Reserve `n_words` words: returns the draw's start and advances `rng`. */
kiln_rng kiln_rng_advance(kiln_rng *rng, uint64_t n_words);

/* ---- Half precision ----------------------------------------------------- */

/* IEEE binary16 and bfloat16 stored as raw 16-bit patterns. Conversions from
 * f32 round to nearest even; NaN stays NaN; overflow becomes infinity. */
uint16_t kiln_f32_to_f16(float value);
float kiln_f16_to_f32(uint16_t bits);
uint16_t kiln_f32_to_bf16(float value);
float kiln_bf16_to_f32(uint16_t bits);
/* Bulk forms; use F16C instructions when the CPU has them and give the same
 * bits as the scalar forms. */
void kiln_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void kiln_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void kiln_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void kiln_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);
/* True when the bulk f16 forms run on F16C. */
bool kiln_cpu_has_f16c(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_BASE_H */
