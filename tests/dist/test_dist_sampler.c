/* The distributed sampler (a pure function: no launcher needed): PyTorch's
 * DistributedSampler shares — padding by repeating the first indices, or
 * drop_last — disjoint across ranks, the same permutation for the same
 * (seed, epoch), another for another epoch. */
#include "test_util.h"

/* All ranks' shares of one epoch; *per gets the share size. */
static int64_t *all_shares(int64_t n, int world, int64_t epoch, uint64_t seed, bool shuffle, bool drop_last,
                           int64_t *per) {
    int64_t *all = NULL;
    *per = -1;
    for (int r = 0; r < world; r++) {
        int64_t *idx = NULL, count = 0;
        CHECK_OK(kiln_dist_sampler_indices(n, world, r, epoch, seed, shuffle, drop_last, &idx, &count));
        if (*per < 0) {
            *per = count;
            all = calloc((size_t)(world * count + 1), sizeof *all);
        }
        CHECK_EQ_I(count, *per);
        for (int64_t k = 0; k < count && k < *per; k++) all[r * *per + k] = idx[k];
        free(idx);
    }
    return all;
}

static void test_padding(void) {
    /* 10 samples, 3 ranks: 4 each, the 2 extra positions repeat the first two. */
    int64_t per;
    int64_t *a = all_shares(10, 3, 0, 1, false, false, &per);
    CHECK_EQ_I(per, 4);
    /* Without shuffle rank r takes r, r + 3, ... of 0..9, 0, 1. */
    int64_t want[3][4] = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 4; k++) CHECK_EQ_I(a[r * 4 + k], want[r][k]);
    free(a);
    /* drop_last: 3 each, 9 distinct, the last index dropped. */
    a = all_shares(10, 3, 0, 1, false, true, &per);
    CHECK_EQ_I(per, 3);
    int seen[10] = {0};
    for (int i = 0; i < 9; i++) seen[a[i]]++;
    for (int i = 0; i < 9; i++) CHECK_EQ_I(seen[i], 1);
    CHECK_EQ_I(seen[9], 0);
    free(a);
    /* Fewer samples than ranks: padding wraps more than once. */
    a = all_shares(2, 5, 0, 1, false, false, &per);
    CHECK_EQ_I(per, 1);
    for (int r = 0; r < 5; r++) CHECK_EQ_I(a[r], r % 2);
    free(a);
    int64_t *none = NULL, count = -1;
    CHECK_OK(kiln_dist_sampler_indices(2, 5, 4, 0, 1, false, true, &none, &count));
    CHECK(none == NULL && count == 0);
}

static void test_shuffle(void) {
    const int64_t n = 101;
    int64_t per;
    int64_t *e0 = all_shares(n, 4, 0, 42, true, false, &per);
    int64_t *e0b = all_shares(n, 4, 0, 42, true, false, &per);
    int64_t *e1 = all_shares(n, 4, 1, 42, true, false, &per);
    CHECK_EQ_I(per, 26);
    CHECK(!memcmp(e0, e0b, sizeof(int64_t) * 4 * 26));
    CHECK(memcmp(e0, e1, sizeof(int64_t) * 4 * 26) != 0);
    /* Every index once, plus 3 padding positions repeating the epoch's
     * first 3 (the first 3 positions of the permutation: rank 0, 1, 2's
     * first entries). */
    int seen[101] = {0};
    for (int i = 0; i < 4 * 26; i++) seen[e0[i]]++;
    int twice = 0;
    for (int i = 0; i < n; i++) {
        CHECK(seen[i] >= 1 && seen[i] <= 2);
        twice += seen[i] == 2;
    }
    CHECK_EQ_I(twice, 3);
    /* Positions 101, 102, 103 (rank 1, 2, 3 at k = 25) repeat positions 0, 1, 2 (ranks 0, 1, 2 at k = 0). */
    CHECK_EQ_I(e0[1 * 26 + 25], e0[0]);
    CHECK_EQ_I(e0[2 * 26 + 25], e0[1 * 26]);
    CHECK_EQ_I(e0[3 * 26 + 25], e0[2 * 26]);
    /* Shuffled at all. */
    int in_place = 0;
    for (int k = 0; k < 25; k++) in_place += e0[k] == 4 * k;
    CHECK(in_place < 10);
    free(e0), free(e0b), free(e1);
}

static void test_errors(void) {
    int64_t *idx = NULL, count = 0;
    CHECK_FAILS(kiln_dist_sampler_indices(10, 2, 2, 0, 0, false, false, &idx, &count),
                KILN_ERR_INVALID_ARGUMENT, "rank 2 is not in a world of 2");
    CHECK_FAILS(kiln_dist_sampler_indices(-1, 2, 0, 0, 0, false, false, &idx, &count),
                KILN_ERR_INVALID_ARGUMENT, "dataset length");
    CHECK_FAILS(kiln_dist_sampler_indices(10, 0, 0, 0, 0, false, false, &idx, &count),
                KILN_ERR_INVALID_ARGUMENT, "world of 0");
}

/* kiln train's shards (kiln_dist_sampler_batch_indices): global batch k of
 * the padded order is the union of the ranks' k-th batches, read in
 * batches of ceil((B - r) / W); every rank counts the same batches with at
 * least one sample each; with B a multiple of W it is the plain shard; the
 * order is kiln_loader's. */
static void check_batches(int64_t n, int world, int64_t B, uint64_t seed) {
    int64_t *mine[8], count[8], padded = 0, nb = -1;
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)n);
    kiln_loader_permutation(n, true, seed, 3, perm);
    for (int r = 0; r < world; r++) {
        CHECK_OK(kiln_dist_sampler_batch_indices(n, world, r, B, 3, seed, true, &mine[r], &count[r], &padded));
        int64_t b = (B - r + world - 1) / world, batches = (count[r] + b - 1) / b;
        CHECK_MSG(nb < 0 || batches == nb, "n %lld W %d B %lld: rank %d has %lld batches, rank 0 %lld", (long long)n,
                  world, (long long)B, r, (long long)batches, (long long)nb);
        nb = batches;
    }
    CHECK(padded >= n && padded - n < 2 * world);
    CHECK_EQ_I(nb, (padded + B - 1) / B);
    for (int64_t k = 0; k < nb; k++) {
        int64_t lo = k * B, len = padded - lo < B ? padded - lo : B;
        for (int r = 0; r < world; r++) {
            int64_t b = (B - r + world - 1) / world, first = k * b;
            int64_t rows = count[r] - first < b ? count[r] - first : b;
            CHECK(rows >= 1);
            CHECK_EQ_I(rows, (len - r + world - 1) / world);
            for (int64_t j = 0; j < rows; j++) CHECK_EQ_I(mine[r][first + j], perm[(lo + r + j * world) % n]);
        }
    }
    if (B % world == 0)
        for (int r = 0; r < world; r++) {
            int64_t *plain = NULL, pc = 0;
            CHECK_OK(kiln_dist_sampler_indices(n, world, r, 3, seed, true, false, &plain, &pc));
            CHECK_EQ_I(pc, count[r]);
            CHECK(pc == count[r] && !memcmp(plain, mine[r], sizeof(int64_t) * (size_t)pc));
            free(plain);
        }
    for (int r = 0; r < world; r++) free(mine[r]);
    free(perm);
}

static void test_batches(void) {
    check_batches(256, 2, 64, 0);  /* kiln train's test: no padding */
    check_batches(101, 4, 32, 7);  /* padded to 104 */
    check_batches(10, 2, 3, 1);    /* uneven shares (2 + 1); the last batch padded up to 2 positions */
    check_batches(13, 3, 5, 2);
    check_batches(5, 4, 4, 0);     /* fewer samples than ranks' padding */
    int64_t *idx = NULL, count = 0;
    CHECK_FAILS(kiln_dist_sampler_batch_indices(10, 4, 0, 3, 0, 0, true, &idx, &count, NULL),
                KILN_ERR_INVALID_ARGUMENT, "global batch 3 over 4 ranks");
}

int main(void) {
    if (kiln_init()) return 1;
    test_padding();
    test_shuffle();
    test_errors();
    test_batches();
    kiln_shutdown();
    return kt_finish();
}
