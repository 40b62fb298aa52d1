/* The distributed sampler: each rank's share of an epoch's order
 * (PyTorch's DistributedSampler: pad by repeating the first indices, or
 * drop the tail; rank r takes every world-th position from r). */
#include <stdlib.h>

#include "base/error.h"
#include "kiln/dist.h"

#define SAMPLER_TAG 0x44535052ULL /* "DSPR": the sampler's own random stream */

/* Fisher-Yates over words of the stream keyed by (seed, "DSPR", epoch): the
 * same permutation on every rank and machine. */
static void permute(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch) {
    kiln_rng r = kiln_rng_split(kiln_rng_split(kiln_rng_make(seed), SAMPLER_TAG), (uint64_t)epoch);
    kiln_rng_shuffle(&r, perm, n);
}

kiln_status kiln_dist_sampler_indices(int64_t n, int world, int rank, int64_t epoch, uint64_t seed,
                                      bool shuffle, bool drop_last, int64_t **out, int64_t *count) {
    if (!out || !count)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_sampler_indices: NULL output");
    *out = NULL;
    *count = 0;
    if (world < 1 || rank < 0 || rank >= world)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass kiln_dist_rank and kiln_dist_world_size of the group",
                          "kiln_dist_sampler_indices: rank %d is not in a world of %d", rank, world);
    if (n < 0 || n > ((int64_t)1 << 40))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give the dataset's length",
                          "kiln_dist_sampler_indices: dataset length %lld is out of range [0, 2^40]",
                          (long long)n);
    if (n == 0 || (drop_last && n < world)) return KILN_OK;
    /* per rank: ceil(n / world) padded, floor(n / world) with drop_last */
    int64_t per_rank = drop_last ? n / world : (n + world - 1) / world;
    int64_t *perm = KILN_MALLOC(sizeof(int64_t) * (size_t)n);
    int64_t *mine = KILN_MALLOC(sizeof(int64_t) * (size_t)per_rank);
    if (!perm || !mine) {
        free(perm), free(mine);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (shuffle) permute(perm, n, seed, epoch);
    /* Position p of the padded order is perm[p mod n]: the padding repeats
     * the first indices (more than once when n < world). */
    for (int64_t k = 0; k < per_rank; k++) mine[k] = perm[(rank + k * (int64_t)world) % n];
    free(perm);
    *out = mine;
    *count = per_rank;
    return KILN_OK;
}
