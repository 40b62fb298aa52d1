/* Philox4x32-10 and the maps from its words to floats: the one
 * implementation shared by the C library (src/base/rng.c, the CPU kernels)
 * and the CUDA kernels, so every backend computes the same numbers for the
 * same (seed, subsequence, offset).
 *
 * Philox is from Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
 * as easy as 1, 2, 3" (SC 2011); the constants and the round function are
 * those of Random123, and rng.c's tests check its known-answer vectors.
 *
 * Everything here is a pure function of its arguments: no state, no
 * allocation, no errors. Under nvcc the functions are __host__ __device__. */
#ifndef KILN_SRC_BASE_PHILOX_H
#define KILN_SRC_BASE_PHILOX_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

#define KILN_PHILOX_M0 0xD2511F53u /* multiplier of counter word 0 */
#define KILN_PHILOX_M1 0xCD9E8D57u /* multiplier of counter word 2 */
#define KILN_PHILOX_W0 0x9E3779B9u /* key bump: golden ratio */
#define KILN_PHILOX_W1 0xBB67AE85u /* key bump: sqrt(3) - 1 */

/* One of the ten rounds: two 32x32->64 multiplies whose halves are mixed
 * with the other two counter words and the round key. */
static inline KILN_HD void kiln_philox_round(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
    uint64_t p0 = (uint64_t)KILN_PHILOX_M0 * ctr[0];
    uint64_t p1 = (uint64_t)KILN_PHILOX_M1 * ctr[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = hi1 ^ c1 ^ k0;
    ctr[1] = lo1;
    ctr[2] = hi0 ^ c3 ^ k1;
    ctr[3] = lo0;
}

/* Philox4x32-10: out = the 4 words for `key` and `counter` (out may alias
 * counter). */
static inline KILN_HD void kiln_philox4x32_10_block(uint32_t k0, uint32_t k1, const uint32_t counter[4],
                                                    uint32_t out[4]) {
    uint32_t ctr[4] = {counter[0], counter[1], counter[2], counter[3]};
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += KILN_PHILOX_W0;
            k1 += KILN_PHILOX_W1;
        }
        kiln_philox_round(ctr, k0, k1);
    }
    out[0] = ctr[0];
    out[1] = ctr[1];
    out[2] = ctr[2];
    out[3] = ctr[3];
}

/* Block `block` of the stream (seed, subsequence): key = (seed lo, seed
 * hi), counter = (block lo, block hi, subsequence lo, subsequence hi).
 * Word w of a stream is out[w % 4] of block w / 4. */
static inline KILN_HD void kiln_philox_stream_block(uint64_t seed, uint64_t subsequence, uint64_t block,
                                                    uint32_t out[4]) {
    uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)subsequence,
                           (uint32_t)(subsequence >> 32)};
    kiln_philox4x32_10_block((uint32_t)seed, (uint32_t)(seed >> 32), counter, out);
}

/* Uniform float in [0, 1): the top 24 bits of `word` times 2^-24, exact in
 * f32 (so 1.0 is never produced before a caller's own rounding). */
static inline KILN_HD float kiln_philox_uniform(uint32_t word) {
    return (float)(word >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
}

/* Standard normal from two words by Box-Muller: u1 in (0, 1] (never 0, so
 * log is finite), u2 in [0, 1); z = sqrt(-2 ln u1) cos(2 pi u2).
 *
 * Computed in double and rounded once to float: glibc and CUDA's double
 * log/cos differ by at most an ulp of double, so the float results agree
 * except when a double result falls within an ulp of a float rounding
 * boundary (about one value in 2^29). Float arithmetic would not: logf/cosf
 * on the GPU are several float ulps from glibc's. */
static inline KILN_HD float kiln_philox_normal(uint32_t word0, uint32_t word1) {
    double u1 = ((double)(word0 >> 8) + 1.0) * 5.9604644775390625e-08; /* (0, 1] */
    double u2 = (double)(word1 >> 8) * 5.9604644775390625e-08;         /* [0, 1) */
    double radius = sqrt(-2.0 * log(u1));
    return (float)(radius * cos(6.283185307179586 * u2));
}

/* Word `index` of the draw that starts at block `offset`. */
static inline KILN_HD uint32_t kiln_philox_u32_at(uint64_t seed, uint64_t subsequence, uint64_t offset,
                                                  uint64_t index) {
    uint32_t words[4];
    kiln_philox_stream_block(seed, subsequence, offset + index / 4, words);
    return words[index % 4];
}

/* Normal element `index` of the draw that starts at block `offset`: words
 * 2*index and 2*index+1, which always share a Philox block. */
static inline KILN_HD float kiln_philox_normal_at(uint64_t seed, uint64_t subsequence, uint64_t offset,
                                                  uint64_t index) {
    uint32_t words[4];
    kiln_philox_stream_block(seed, subsequence, offset + index / 2, words);
    unsigned lane = (unsigned)(index % 2) * 2;
    return kiln_philox_normal(words[lane], words[lane + 1]);
}

#endif /* KILN_SRC_BASE_PHILOX_H */
