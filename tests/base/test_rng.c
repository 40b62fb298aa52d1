/* The counter-based RNG: Philox4x32-10 against Random123's published
 * known-answer vectors, the word layout of a stream, reproducibility in any
 * order, splitting, advancing, and loose distribution checks. */
#include <stdint.h>

#include "base/philox.h"
#include "test_util.h"

static void check_vector(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                         uint32_t e0, uint32_t e1, uint32_t e2, uint32_t e3) {
    const uint32_t key[2] = {k0, k1};
    const uint32_t counter[4] = {c0, c1, c2, c3};
    uint32_t out[4];
    kiln_philox4x32_10(key, counter, out);
    CHECK_MSG(out[0] == e0 && out[1] == e1 && out[2] == e2 && out[3] == e3,
              "got %08x %08x %08x %08x, want %08x %08x %08x %08x", out[0], out[1], out[2], out[3], e0, e1, e2,
              e3);
}

/* Random123's kat_vectors for philox4x32_10: counter, key -> output. */
static void test_known_answers(void) {
    check_vector(0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
    check_vector(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
                 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
    check_vector(0xa4093822, 0x299f31d0, 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xd16cfe09,
                 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

/* Word i of a draw is word (offset*4 + i) of the stream keyed by the seed,
 * with counter (block lo, block hi, subsequence lo, subsequence hi). */
static void test_word_layout(void) {
    kiln_rng rng = {.seed = 0x0123456789ABCDEFull,
                    .subsequence = 0xFEDCBA9876543210ull,
                    .offset = 0xFFFFFFFEull}; /* the block counter crosses 2^32 below */
    const uint32_t key[2] = {0x89ABCDEFu, 0x01234567u};
    int bad = 0;
    for (uint64_t i = 0; i < 16; i++) {
        uint64_t block = rng.offset + i / 4;
        const uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0x76543210u, 0xFEDCBA98u};
        uint32_t out[4];
        kiln_philox4x32_10(key, counter, out);
        bad += kiln_rng_u32_at(&rng, i) != out[i % 4];
    }
    CHECK_EQ_I(bad, 0);

    /* Normal element i is Box-Muller over words 2i and 2i+1 of the draw. */
    bad = 0;
    for (uint64_t i = 0; i < 64; i++) {
        float want = kiln_philox_normal(kiln_rng_u32_at(&rng, 2 * i), kiln_rng_u32_at(&rng, 2 * i + 1));
        bad += kiln_rng_normal_at(&rng, i) != want;
    }
    CHECK_EQ_I(bad, 0);

    /* Uniform: the top 24 bits times 2^-24. */
    CHECK(kiln_rng_u32_to_uniform(0) == 0.0f);
    CHECK(kiln_rng_u32_to_uniform(0xFF) == 0.0f);
    CHECK(kiln_rng_u32_to_uniform(0x100) == 5.9604644775390625e-8f);
    CHECK(kiln_rng_u32_to_uniform(0x80000000u) == 0.5f);
    CHECK(kiln_rng_u32_to_uniform(0xFFFFFFFFu) == 1.0f - 5.9604644775390625e-8f);
    CHECK(kiln_rng_u32_to_uniform(0xFFFFFFFFu) < 1.0f);

    /* Box-Muller's log never sees 0: the smallest first word gives a finite
     * value, the largest a zero radius. */
    float extreme = kiln_philox_normal(0, 0);
    CHECK(isfinite(extreme));
    CHECK(fabsf(extreme - (float)sqrt(-2.0 * log(5.9604644775390625e-8))) < 1e-5f);
    CHECK(kiln_philox_normal(0xFFFFFFFFu, 0x12345678u) == 0.0f);
}

static void test_reproducible(void) {
    enum { N = 1000 };
    static uint32_t a[N], b[N];
    kiln_rng r1 = kiln_rng_make(42), r2 = kiln_rng_make(42), r3 = kiln_rng_make(43);
    CHECK(r1.seed == 42 && r1.subsequence == 0 && r1.offset == 0);
    int same_seed_differs = 0, other_seed_equal = 0;
    for (uint64_t i = 0; i < N; i++) {
        a[i] = kiln_rng_u32_at(&r1, i);
        same_seed_differs += a[i] != kiln_rng_u32_at(&r2, i);
        other_seed_equal += a[i] == kiln_rng_u32_at(&r3, i);
    }
    CHECK_EQ_I(same_seed_differs, 0);
    CHECK(other_seed_equal < 3);

    /* Computed backwards: same words. */
    for (uint64_t i = N; i-- > 0;) b[i] = kiln_rng_u32_at(&r1, i);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* Computed in chunks reserved with advance: each chunk is a draw of
     * its own that starts where the previous one's blocks end. Chunk sizes
     * that are multiples of 4 tile the stream exactly. */
    kiln_rng gen = kiln_rng_make(42);
    static const uint64_t chunks[] = {4, 96, 400, 300, 200};
    uint64_t pos = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        kiln_rng draw = kiln_rng_advance(&gen, chunks[c]);
        for (uint64_t i = 0; i < chunks[c]; i++) b[pos + i] = kiln_rng_u32_at(&draw, i);
        pos += chunks[c];
    }
    CHECK_EQ_I(pos, N);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* Normals likewise: any order gives the same values. */
    int bad = 0;
    for (uint64_t i = 0; i < 100; i++) {
        uint64_t j = (i * 37) % 100;
        kiln_rng copy = r1;
        bad += kiln_rng_normal_at(&r1, j) != kiln_rng_normal_at(&copy, j);
    }
    CHECK_EQ_I(bad, 0);

    /* The high half of the seed matters (it is key word 1). */
    kiln_rng lo = kiln_rng_make(7), hi = kiln_rng_make(7 | (1ull << 40));
    CHECK(kiln_rng_u32_at(&lo, 0) != kiln_rng_u32_at(&hi, 0) ||
          kiln_rng_u32_at(&lo, 1) != kiln_rng_u32_at(&hi, 1));
}

static void test_advance(void) {
    kiln_rng gen = kiln_rng_make(5);
    kiln_rng d0 = kiln_rng_advance(&gen, 0);
    CHECK(d0.offset == 0 && gen.offset == 0);
    kiln_rng d1 = kiln_rng_advance(&gen, 1); /* one word still takes a whole block */
    CHECK(d1.offset == 0 && gen.offset == 1);
    kiln_rng d2 = kiln_rng_advance(&gen, 8);
    CHECK(d2.offset == 1 && gen.offset == 3);
    kiln_rng d3 = kiln_rng_advance(&gen, 9);
    CHECK(d3.offset == 3 && gen.offset == 6);
    CHECK(d3.seed == 5 && d3.subsequence == 0);
    /* Draws never overlap: the first word of d3 is word 12 of the stream. */
    kiln_rng start = kiln_rng_make(5);
    CHECK(kiln_rng_u32_at(&d3, 0) == kiln_rng_u32_at(&start, 12));
    CHECK(kiln_rng_u32_at(&d2, 7) == kiln_rng_u32_at(&start, 11));
    /* No overflow in the rounding for huge requests. */
    kiln_rng big = kiln_rng_make(1);
    kiln_rng_advance(&big, UINT64_MAX);
    CHECK(big.offset == UINT64_MAX / 4 + 1);
}

static void test_split(void) {
    kiln_rng root = kiln_rng_make(1234);
    root.offset = 77;
    kiln_rng c0 = kiln_rng_split(root, 0), c1 = kiln_rng_split(root, 1);
    kiln_rng c0_again = kiln_rng_split(root, 0);
    CHECK(c0.seed == 1234 && c1.seed == 1234);
    CHECK(c0.offset == 0 && c1.offset == 0);
    CHECK(c0.subsequence == c0_again.subsequence);
    CHECK(c0.subsequence != c1.subsequence);
    CHECK(c0.subsequence != root.subsequence && c1.subsequence != root.subsequence);
    /* Grandchildren differ from children and from each other's cousins. */
    kiln_rng g00 = kiln_rng_split(c0, 0), g10 = kiln_rng_split(c1, 0);
    CHECK(g00.subsequence != g10.subsequence);
    CHECK(g00.subsequence != c0.subsequence && g10.subsequence != c1.subsequence);
    /* Many ids, all distinct. */
    enum { IDS = 512 };
    static uint64_t subs[IDS];
    int collisions = 0;
    for (uint64_t id = 0; id < IDS; id++) {
        subs[id] = kiln_rng_split(root, id).subsequence;
        for (uint64_t j = 0; j < id; j++) collisions += subs[j] == subs[id];
    }
    CHECK_EQ_I(collisions, 0);
    /* The streams differ word by word. */
    int equal = 0;
    kiln_rng r0 = kiln_rng_make(1234);
    for (uint64_t i = 0; i < 256; i++) {
        uint32_t w0 = kiln_rng_u32_at(&c0, i), w1 = kiln_rng_u32_at(&c1, i);
        equal += (w0 == w1) + (w0 == kiln_rng_u32_at(&r0, i));
    }
    CHECK(equal < 3);
}

static void test_distributions(void) {
    enum { N = 100000 };
    kiln_rng rng = kiln_rng_split(kiln_rng_make(2024), 3);
    double sum = 0, sum2 = 0;
    int out_of_range = 0;
    for (uint64_t i = 0; i < N; i++) {
        float u = kiln_rng_u32_to_uniform(kiln_rng_u32_at(&rng, i));
        out_of_range += !(u >= 0.0f && u < 1.0f);
        sum += u;
        sum2 += (double)u * u;
    }
    double mean = sum / N, var = sum2 / N - mean * mean;
    CHECK_EQ_I(out_of_range, 0);
    CHECK_MSG(fabs(mean - 0.5) < 0.01, "uniform mean %f", mean);
    CHECK_MSG(fabs(var - 1.0 / 12) < 0.005, "uniform variance %f", var);

    sum = sum2 = 0;
    double sum3 = 0;
    int not_finite = 0, beyond_3sigma = 0;
    for (uint64_t i = 0; i < N; i++) {
        float z = kiln_rng_normal_at(&rng, i);
        not_finite += !isfinite(z);
        beyond_3sigma += fabsf(z) > 3.0f;
        sum += z;
        sum2 += (double)z * z;
        sum3 += (double)z * z * z;
    }
    mean = sum / N;
    var = sum2 / N - mean * mean;
    CHECK_EQ_I(not_finite, 0);
    CHECK_MSG(fabs(mean) < 0.02, "normal mean %f", mean);
    CHECK_MSG(fabs(var - 1.0) < 0.03, "normal variance %f", var);
    CHECK_MSG(fabs(sum3 / N) < 0.05, "normal skew %f", sum3 / N);
    /* P(|z| > 3) = 0.0027: about 270 of 1e5. */
    CHECK_MSG(beyond_3sigma > 170 && beyond_3sigma < 370, "%d beyond 3 sigma", beyond_3sigma);
}

int main(void) {
    test_known_answers();
    test_word_layout();
    test_reproducible();
    test_advance();
    test_split();
    test_distributions();
    return kt_finish();
}
