/* Checked arithmetic for sizes and counts that come from outside the
 * program: file headers, model specs, checkpoints, metrics records,
 * command-line flags. Every product or sum of such numbers goes through
 * these, so an absurd value is an error the caller reports (naming the
 * file and field), never a wrapped size or undefined behaviour.
 *
 * kiln_checked_*: true and *out set when the result fits, false when it
 *   would overflow (*out is then unspecified).
 * kiln_sat_*: the result, or INT64_MAX where it would not fit, for counts
 *   compared against a limit afterwards (a model's parameter total). */
#ifndef KILN_BASE_CHECKED_H
#define KILN_BASE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool kiln_checked_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_checked_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline bool kiln_checked_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool kiln_checked_add_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Saturating, for non-negative operands. */
static inline int64_t kiln_sat_mul_i64(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}
static inline int64_t kiln_sat_add_i64(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

#endif
