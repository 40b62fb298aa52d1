/* The counter-based generator of include/kiln/base.h. The arithmetic lives
 * in philox.h, shared with the CUDA kernels; this file is the C API over
 * it: positions in a stream, splitting, reserving draws. */
#include "base/philox.h"
#include "kiln/base.h"

void kiln_philox4x32_10(const uint32_t key[2], const uint32_t counter[4], uint32_t out[4]) {
    kiln_philox4x32_10_block(key[0], key[1], counter, out);
}

kiln_rng kiln_rng_make(uint64_t seed) { return (kiln_rng){.seed = seed, .subsequence = 0, .offset = 0}; }

/* splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64-bit
 * words with full avalanche, so distinct inputs give distinct, unrelated
 * subsequences. */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The child's subsequence hashes the parent's and the id. Hashing the
 * parent first keeps the children of different parents apart: child id of
 * parent a and child id' of parent b collide only if
 * splitmix64(a) ^ id == splitmix64(b) ^ id'. Children start at offset 0 of
 * their own subsequence, whatever the parent's offset. */
kiln_rng kiln_rng_split(kiln_rng parent, uint64_t id) {
    uint64_t sub = splitmix64(splitmix64(parent.subsequence) ^ id);
    return (kiln_rng){.seed = parent.seed, .subsequence = sub, .offset = 0};
}

uint32_t kiln_rng_u32_at(const kiln_rng *rng, uint64_t index) {
    return kiln_philox_u32_at(rng->seed, rng->subsequence, rng->offset, index);
}

void kiln_rng_shuffle(const kiln_rng *rng, int64_t *perm, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t w =
            ((uint64_t)kiln_rng_u32_at(rng, 2 * (uint64_t)i) << 32) | kiln_rng_u32_at(rng, 2 * (uint64_t)i + 1);
        int64_t j = (int64_t)(w % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

float kiln_rng_u32_to_uniform(uint32_t word) { return kiln_philox_uniform(word); }

float kiln_rng_normal_at(const kiln_rng *rng, uint64_t index) {
    return kiln_philox_normal_at(rng->seed, rng->subsequence, rng->offset, index);
}

/* Draws start on a block boundary, so a draw of n words takes ceil(n/4)
 * blocks and the next draw never shares a block with it. */
kiln_rng kiln_rng_advance(kiln_rng *rng, uint64_t n_words) {
    kiln_rng start = *rng;
    rng->offset += n_words / 4 + (n_words % 4 != 0);
    return start;
}
