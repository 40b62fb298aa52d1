/* The distributed sampler: each rank's share of an epoch's order
 * (PyTorch's DistributedSampler: pad by repeating the first indices, or
 * drop the tail; rank r takes every world-th position from r). The order
 * is kiln_loader's own (kiln_loader_permutation), so the ranks together
 * visit what one process's loader visits. */
#include <stdlib.h>

#include "base/error.h"
#include "kiln/data.h"
#include "kiln/dist.h"

static kiln_status check_args(const char *fn, int64_t n, int world, int rank) {
    if (world < 1 || rank < 0 || rank >= world)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "pass kiln_dist_rank and kiln_dist_world_size of the group",
                          "%s: rank %d is not in a world of %d", fn, rank, world);
    if (n < 0 || n > ((int64_t)1 << 40))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give the dataset's length",
                          "%s: dataset length %lld is out of range [0, 2^40]", fn, (long long)n);
    return KILN_OK;
}

kiln_status kiln_dist_sampler_indices(int64_t n, int world, int rank, int64_t epoch, uint64_t seed,
                                      bool shuffle, bool drop_last, int64_t **out, int64_t *count) {
    if (!out || !count)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_sampler_indices: NULL output");
    *out = NULL;
    *count = 0;
    KILN_TRY(check_args("kiln_dist_sampler_indices", n, world, rank));
    if (n == 0 || (drop_last && n < world)) return KILN_OK;
    /* per rank: ceil(n / world) padded, floor(n / world) with drop_last */
    int64_t per_rank = drop_last ? n / world : (n + world - 1) / world;
    int64_t *perm = KILN_MALLOC(sizeof(int64_t) * (size_t)n);
    int64_t *mine = KILN_MALLOC(sizeof(int64_t) * (size_t)per_rank);
    if (!perm || !mine) {
        free(perm), free(mine);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    kiln_loader_permutation(n, shuffle, seed, epoch, perm);
    /* Position p of the padded order is perm[p mod n]: the padding repeats
     * the first indices (more than once when n < world). */
    for (int64_t k = 0; k < per_rank; k++) mine[k] = perm[(rank + k * (int64_t)world) % n];
    free(perm);
    *out = mine;
    *count = per_rank;
    return KILN_OK;
}

/* The padded length of an epoch of n samples cut into global batches of
 * `batch` over `world` ranks: n up to a multiple of world (PyTorch's rule),
 * then, if the last batch holds fewer than world positions (batch not a
 * multiple of world), up to world positions there, so that every rank has
 * a sample in every batch and all ranks count the same batches. */
static int64_t padded_length(int64_t n, int world, int64_t batch) {
    int64_t p = (n + world - 1) / world * world;
    int64_t last = p - (p - 1) / batch * batch;
    return last < world ? p + (world - last) : p;
}

kiln_status kiln_dist_sampler_batch_indices(int64_t n, int world, int rank, int64_t batch, int64_t epoch,
                                            uint64_t seed, bool shuffle, int64_t **out, int64_t *count,
                                            int64_t *padded) {
    if (!out || !count)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_sampler_batch_indices: NULL output");
    *out = NULL;
    *count = 0;
    if (padded) *padded = 0;
    KILN_TRY(check_args("kiln_dist_sampler_batch_indices", n, world, rank));
    if (batch < world || batch > ((int64_t)1 << 40))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a global batch of at least one sample per rank",
                          "kiln_dist_sampler_batch_indices: global batch %lld over %d ranks",
                          (long long)batch, world);
    if (n == 0) return KILN_OK;
    int64_t p = padded_length(n, world, batch);
    /* Rank r takes positions r, r + world, ... of each batch [k B, k B + len_k). */
    int64_t mine_n = 0;
    for (int64_t lo = 0; lo < p; lo += batch) {
        int64_t len = p - lo < batch ? p - lo : batch;
        mine_n += (len - rank + world - 1) / world;
    }
    int64_t *perm = KILN_MALLOC(sizeof(int64_t) * (size_t)n);
    int64_t *mine = KILN_MALLOC(sizeof(int64_t) * (size_t)mine_n);
    if (!perm || !mine) {
        free(perm), free(mine);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    kiln_loader_permutation(n, shuffle, seed, epoch, perm);
    int64_t k = 0;
    for (int64_t lo = 0; lo < p; lo += batch) {
        int64_t hi = p - lo < batch ? p : lo + batch;
        for (int64_t pos = lo + rank; pos < hi; pos += world) mine[k++] = perm[pos % n];
    }
    KILN_ASSERT(k == mine_n);
    free(perm);
    *out = mine;
    *count = mine_n;
    if (padded) *padded = p;
    return KILN_OK;
}
