/* Kiln dist: data-parallel training across processes (MPI, CPU tensors).
 *
 * One process per rank, started by `mpirun -np N prog` (Open MPI). The
 * process group is the set of ranks; collectives on CPU tensors go through
 * MPI's non-blocking calls (MPI_Iallreduce, ...) and return a work handle
 * that is polled or waited on. Every wait has a watchdog: a collective
 * that does not complete within the group's timeout (KILN_DIST_TIMEOUT
 * seconds, default 300) is an error naming the collective and the ranks
 * it waits on, never a hang. DDP (kiln_ddp_*) wraps a module: rank 0's
 * state is broadcast at wrap, gradients are all-reduced in buckets
 * started by the post-accumulate gradient hooks while backward runs.
 * Collectives on CUDA tensors go through NCCL, with a communication stream
 * per device; a wait that fails (a lost rank, an NCCL asynchronous error,
 * the timeout) aborts the communicator (ncclCommAbort). docs/distributed.md
 * describes it all.
 *
 * Environment:
 *   KILN_WORLD_SIZE=N     the number of ranks the program must run as:
 *                         kiln_dist_init fails, saying `mpirun -np N ...`,
 *                         when no launcher (or one with another count)
 *                         started it
 *   KILN_DIST_TIMEOUT=S   watchdog bound of every wait, seconds (> 0)
 *   KILN_DIST_NCCL=0      CUDA tensors are staged through pinned host
 *                         memory over MPI instead of NCCL
 *   KILN_DIST_DEBUG=1     before each collective the ranks exchange its
 *                         number, kind, dtype and shape; a mismatch is an
 *                         error on every rank naming both ranks' shapes
 *
 * Everything here is called from one thread per process (MPI is
 * initialised with MPI_THREAD_SERIALIZED). */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include "kiln/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_dist_group kiln_dist_group;
typedef struct kiln_dist_work kiln_dist_work;

/* ---- Process groups -------------------------------------------------------------------- */

/* Join the world. Started by mpirun (OMPI_COMM_WORLD_SIZE in the
 * environment), MPI is initialised (MPI_Init_thread, unless the program
 * did so already) and rank, world size and local rank come from
 * MPI_COMM_WORLD; started without a launcher it is a world of 1 (rank 0)
 * and no MPI call is made. A build without MPI (KILN_WITH_MPI off) started
 * with a world > 1 fails with KILN_ERR_UNSUPPORTED. *world is owned by
 * the library until kiln_dist_shutdown. A second init without shutdown is
 * KILN_ERR_STATE. A bad KILN_DIST_TIMEOUT is KILN_ERR_INVALID_ARGUMENT.
 * Blocks until every rank has called it (MPI's initialisation). */
kiln_status kiln_dist_init(kiln_dist_group **world);
/* What a program asks of the world it joins. */
typedef struct kiln_dist_init_opts {
    /* Ranks wanted (> 0); 0: KILN_WORLD_SIZE if set, else whatever the
     * launcher started (1 without one). */
    int world_size;
    /* The program's command line, for the launch command an error shows
     * ("mpirun -np 4 <command>"); NULL: this process's own (/proc/self/cmdline). */
    const char *command;
} kiln_dist_init_opts;

/* kiln_dist_init, holding the world to a size: asked for N > 1 ranks
 * (opts->world_size, or KILN_WORLD_SIZE=N in the environment) without a
 * launcher, or from a launcher that started another number, it fails
 * before touching MPI with KILN_ERR_INVALID_ARGUMENT whose message says
 * how to start it: `mpirun -np N <command>` (plus --oversubscribe past the
 * host's cores and, as root, the allow-run-as-root variables). In a build
 * without MPI, N > 1 is KILN_ERR_UNSUPPORTED naming the build option.
 * After such an error init may be called again. opts NULL: as
 * kiln_dist_init. Blocks as kiln_dist_init. */
kiln_status kiln_dist_init_with(const kiln_dist_init_opts *opts, kiln_dist_group **world);
/* Free the world group and finalise MPI when kiln_dist_init initialised
 * it. Groups made by kiln_dist_group_dup must be freed first, and no work
 * may be in flight (KILN_ERR_STATE otherwise, and MPI stays up). Blocks
 * until every rank calls it. No-op when not initialised. */
kiln_status kiln_dist_shutdown(void);

/* Rank of this process in g, number of ranks, and the rank among the
 * processes on this host (OMPI_COMM_WORLD_LOCAL_RANK; 0 in a singleton).
 * -1 / 0 for a NULL group. Never block. */
int kiln_dist_rank(const kiln_dist_group *g);
int kiln_dist_world_size(const kiln_dist_group *g);
int kiln_dist_local_rank(const kiln_dist_group *g);

/* A new group over the same ranks with its own communicator (MPI_Comm_dup):
 * collectives on it never match those on g. It inherits g's timeout and
 * debug mode. Collective: every rank of g calls it; blocks until they
 * have. Free with kiln_dist_group_free (the world group is freed by
 * kiln_dist_shutdown only). */
kiln_status kiln_dist_group_dup(kiln_dist_group *g, kiln_dist_group **out);
/* KILN_ERR_STATE while work on the group is in flight; NULL: no-op. */
kiln_status kiln_dist_group_free(kiln_dist_group *g);

/* The watchdog bound of waits on g (seconds, > 0, finite), and the current
 * value. Affects later waits. */
kiln_status kiln_dist_group_set_timeout(kiln_dist_group *g, double seconds);
double kiln_dist_group_timeout(const kiln_dist_group *g);
/* Turn debug mode (KILN_DIST_DEBUG) on or off for g. Every rank must use
 * the same setting: it adds an exchange before each collective. */
void kiln_dist_group_set_debug(kiln_dist_group *g, bool debug);
bool kiln_dist_group_debug(const kiln_dist_group *g);

/* How collectives on tensors of `device` travel in group g: "mpi" (CPU
 * tensors), "nccl" (CUDA tensors, NCCL built: the real library, or its
 * emulation in the emulation build), "mpi, staged through pinned host
 * memory" (CUDA tensors without NCCL, or KILN_DIST_NCCL=0), "local" (a
 * world of 1 without a launcher, CPU tensors). A static string. Does not
 * block. */
const char *kiln_dist_backend(const kiln_dist_group *g, kiln_device device);

/* ---- Collectives ---------------------------------------------------------------------
 * On CPU and CUDA tensors of dtype f32, f64, i32 or i64 (others:
 * KILN_ERR_UNSUPPORTED naming the dtype). CPU tensors go through MPI.
 * CUDA tensors go through NCCL (kiln_dist_backend): the collective is
 * queued on the device's communication stream after the work already
 * queued on its current stream (an event), its tensors are kept alive
 * for it (kiln_record_stream), and completion makes the current stream
 * wait for it; the call itself does not wait for the device. Without
 * NCCL they are copied to pinned host memory (blocking), reduced over
 * MPI and copied back at completion. The first CUDA collective of a group
 * on a device makes its NCCL communicator: collective, blocking.
 * Every rank of the group must call the same collectives in the same order
 * with the same dtype and shape (KILN_DIST_DEBUG checks it). A tensor that
 * is not contiguous is reduced through a contiguous copy written back when
 * the work completes.
 *
 * `work`: where to put the handle of the started collective (the caller
 * frees it with kiln_dist_work_free after it completed); NULL: the call
 * waits for completion itself, under the watchdog (after a timeout there
 * is no handle to wait on again: the collective stays in flight and its
 * group can no longer be freed; the same holds for a timeout in the debug
 * exchange). The work holds its own
 * references to the tensors; the caller must not read or write them until
 * the work completed. In debug mode the call blocks until every rank has
 * reached the collective (the exchange), then starts it. */
typedef enum kiln_dist_reduce_op {
    KILN_DIST_SUM = 0,
    KILN_DIST_AVG, /* sum / world size; floating dtypes only */
} kiln_dist_reduce_op;

/* t = op over ranks of t, in place. */
kiln_status kiln_dist_all_reduce(kiln_dist_group *g, kiln_tensor *t, kiln_dist_reduce_op op,
                                 kiln_dist_work **work);
/* t on every rank = t on `root`, in place. */
kiln_status kiln_dist_broadcast(kiln_dist_group *g, kiln_tensor *t, int root, kiln_dist_work **work);
/* out = the ranks' `in` concatenated in rank order: out has world * numel(in)
 * elements (any shape with that count, (world, ...in) or in's shape with dim 0
 * times world), in's dtype. */
kiln_status kiln_dist_all_gather(kiln_dist_group *g, kiln_tensor *out, kiln_tensor *in,
                                 kiln_dist_work **work);
/* out = the rank-th of world equal chunks of op over ranks of `in`
 * (numel(in) == world * numel(out)). */
kiln_status kiln_dist_reduce_scatter(kiln_dist_group *g, kiln_tensor *out, kiln_tensor *in,
                                     kiln_dist_reduce_op op, kiln_dist_work **work);
/* Completes once every rank has called it. */
kiln_status kiln_dist_barrier(kiln_dist_group *g, kiln_dist_work **work);

/* Wait for the work under the group's timeout (kiln_dist_work_wait) or an
 * explicit one (seconds > 0). Blocks the host, driving MPI's progress. On
 * timeout: KILN_ERR_DEVICE with a message naming the collective (its kind,
 * number, dtype, shape), this rank and the ranks that did not join; the
 * work stays in flight (a late rank may still join: wait again) and
 * neither it nor its group can be freed until it completes. A rank whose
 * process on this host has exited or was killed fails the wait the same
 * way within about 0.1 s, its message naming that rank, pid and host
 * ("rank 1 (pid 1234 on host) is lost"); ranks on other hosts are bounded
 * by the timeout only. Waiting on completed work returns its result
 * again. */
kiln_status kiln_dist_work_wait(kiln_dist_work *w);
kiln_status kiln_dist_work_wait_timeout(kiln_dist_work *w, double seconds);
/* *done: whether the work has completed (its results written). Never
 * blocks; drives MPI's progress once. */
kiln_status kiln_dist_work_poll(kiln_dist_work *w, bool *done);
/* Release a completed work and its tensor references (NULL: no-op).
 * KILN_ERR_STATE, freeing nothing, while it is in flight. */
kiln_status kiln_dist_work_free(kiln_dist_work *w);

/* ---- Distributed data parallel ------------------------------------------------------- */

typedef struct kiln_ddp kiln_ddp;

typedef struct kiln_ddp_opts {
    double bucket_cap_mb;        /* gradient bytes per bucket, in MiB; 0 means 25 */
    double first_bucket_mb;      /* the first bucket (the last parameters), MiB; 0 means 1 */
    bool find_unused_parameters; /* a parameter without a gradient in a
                                  * synchronised backward is reduced as zeros
                                  * instead of being an error */
    bool broadcast_buffers;      /* kiln_ddp_forward broadcasts rank 0's buffers */
    bool static_bucket_order;    /* keep the wrap-time (reverse parameter) order: no
                                  * rebuild, and no broadcast for it, after the first
                                  * synchronised step */
} kiln_ddp_opts;
/* PyTorch's defaults: 25 MiB buckets, a 1 MiB first bucket, unused
 * parameters an error, buffers broadcast at each forward. */
kiln_ddp_opts kiln_ddp_opts_default(void);

/* Wrap module m (borrowed: it must outlive the handle, and must not be
 * moved with kiln_module_to/_to_dtype afterwards) for data-parallel
 * training over g (borrowed). Collective: every rank calls it. First the
 * ranks compare their parameter lists (names, dtypes, shapes); a
 * difference fails on every rank (KILN_ERR_INVALID_ARGUMENT naming the
 * first differing parameter on both ranks). Then rank 0's parameters and
 * buffers are broadcast to every rank, the gradient buckets are built (in
 * reverse parameter order) and a post-accumulate hook is registered on
 * each parameter. After the first synchronised step the buckets are
 * rebuilt in the order rank 0's gradients arrived in (PyTorch's
 * rebuild_buckets; kiln_ddp_bucket_of shows the result): a model whose
 * parameters are registered in another order than backward produces
 * them still starts its first bucket early. Parameters must be tensors of one floating dtype
 * per bucket (f32 or f64), all on the CPU or all on one CUDA device (one
 * process per device: NCCL). opts NULL: defaults. *out is freed with
 * kiln_ddp_free. Blocks until the broadcasts are done. */
kiln_status kiln_ddp_wrap(kiln_module *m, kiln_dist_group *g, const kiln_ddp_opts *opts, kiln_ddp **out);
/* Unregister the hooks and free the buckets (NULL: no-op). Waits (under
 * the watchdog) for bucket reductions still in flight. */
void kiln_ddp_free(kiln_ddp *d);

/* Broadcast rank 0's buffers (BatchNorm running statistics) to every rank,
 * in place. Collective; blocks until done. */
kiln_status kiln_ddp_broadcast_buffers(kiln_ddp *d);
/* kiln_ddp_broadcast_buffers when opts.broadcast_buffers, then
 * kiln_module_forward: a new reference, NULL with an error. Collective.
 * Each rank normalises with its own batch's statistics (no SyncBatchNorm):
 * with BatchNorm, DDP is not the one-process computation on the union. */
kiln_tensor *kiln_ddp_forward(kiln_ddp *d, kiln_tensor *x);

/* This rank's number of samples in the coming synchronised step (> 0).
 * The gradients are averaged weighted by it, so ranks with unequal batches
 * (each taking the mean loss over its own batch) get the gradient of the
 * mean over the union. Default 1 on every rank: the plain average. Stays
 * until changed. Does not block. */
kiln_status kiln_ddp_set_sample_count(kiln_ddp *d, int64_t n);

/* no_sync: while off, backward accumulates gradients locally and the hooks
 * communicate nothing; the first synchronised backward after it reduces the
 * accumulated gradients. Does not block. */
kiln_status kiln_ddp_set_sync(kiln_ddp *d, bool sync);
bool kiln_ddp_is_sync(const kiln_ddp *d);

/* Call after a synchronised backward, before the optimizer step: starts
 * the buckets backward has not started (find_unused_parameters: parameters
 * without a gradient as zeros), waits under the watchdog for every bucket
 * still in flight, and writes the averaged gradients into each parameter's
 * .grad (a parameter without .grad gets a new one). Errors: a parameter
 * without a gradient (named; not with find_unused_parameters), a gradient
 * delivered twice in one backward (named), no backward since the last
 * call, a timeout. After an error the next backward starts afresh. The
 * first call that succeeds also broadcasts rank 0's gradient order and
 * rebuilds the buckets in it (not with opts.static_bucket_order). In
 * no_sync mode it does nothing. Blocks the host. */
kiln_status kiln_ddp_finish_grads(kiln_ddp *d);

/* Debug counters of the last synchronised backward, for tests and
 * tuning. */
typedef struct kiln_ddp_stats {
    int num_buckets;
    int num_parameters;
    int64_t hooks_fired;              /* post-accumulate hooks in the last synchronised backward */
    int buckets_started_in_backward;  /* all-reduces started from a hook */
    int64_t hooks_before_first_start; /* hooks fired when bucket 0 was started; -1: not yet */
    int64_t synced_steps;             /* kiln_ddp_finish_grads calls that reduced */
    bool buckets_rebuilt;             /* the buckets were rebuilt after the first step */
} kiln_ddp_stats;
kiln_status kiln_ddp_stats_get(const kiln_ddp *d, kiln_ddp_stats *out);
/* Bucket index of the i-th parameter (kiln_module_parameters' order), -1
 * if out of range. */
int kiln_ddp_bucket_of(const kiln_ddp *d, int param_index);

/* ---- SyncBatchNorm ------------------------------------------------------------------- */

/* BatchNorm2d over num_features channels whose training statistics are the
 * union batch's across the ranks of g (PyTorch's nn.SyncBatchNorm): the
 * forward all-reduces each channel's sum, sum of squares and count, the
 * backward the sums of dy and dy * x_hat, so DDP over it trains as one
 * process on the union batch. The same parameters and buffers as
 * kiln_nn_batch_norm2d (weight, bias, running_mean, running_var,
 * num_batches_tracked: state dicts interchange); eval mode normalises with
 * the running statistics, without communication. Every rank must run its
 * forward and backward (collectives, blocking). Parameters are f32 on the
 * CPU at creation (kiln_module_to moves them). g is borrowed and must
 * outlive the module; the module is usable until kiln_dist_shutdown. NULL
 * with an error for a bad argument. */
kiln_module *kiln_nn_sync_batch_norm2d(int64_t num_features, double eps, double momentum, kiln_dist_group *g);

/* ---- Distributed sampler --------------------------------------------------------------- */

/* The dataset indices rank `rank` of `world` visits in `epoch`
 * (PyTorch's DistributedSampler). The epoch's order is 0..n-1, or with
 * shuffle the permutation keyed by (seed, epoch) -- the same on every rank
 * for the same seed, and kiln_loader's (kiln_loader_permutation). Without
 * drop_last it is padded by repeating its first indices up to a multiple
 * of world (every rank gets ceil(n / world)); with
 * drop_last the tail is dropped (floor(n / world) each). Rank r takes the
 * positions r, r + world, r + 2 world, ...: the ranks' shares are disjoint
 * apart from the padding. *out is a malloc'd array of *count indices the
 * caller frees with free() (NULL when *count is 0). Does not block. */
kiln_status kiln_dist_sampler_indices(int64_t n, int world, int rank, int64_t epoch, uint64_t seed,
                                      bool shuffle, bool drop_last, int64_t **out, int64_t *count);
/* Rank `rank`'s share of an epoch trained with a global batch of `batch`
 * samples over `world` ranks (kiln train under mpirun). The epoch's order
 * (as kiln_dist_sampler_indices: kiln_loader_permutation, padded to a
 * multiple of world by repeating its first indices -- and further, up to
 * world positions in the last batch when batch is not a multiple of world,
 * so that every rank has a sample in every batch) is cut into global
 * batches of `batch`; rank r takes positions r, r + world, ... of each.
 * Loaded in batches of ceil((batch - rank) / world) (this rank's share of
 * a full batch), the rank's k-th batch is its part of global batch k, and
 * every rank has the same number of batches. When batch is a multiple of
 * world the result is kiln_dist_sampler_indices's (no drop_last): the
 * same shard. batch must be at least world. *out (malloc'd, *count
 * entries) is the caller's to free(); *padded (NULL: not wanted) gets the
 * epoch's positions over all ranks after padding. Does not block. */
kiln_status kiln_dist_sampler_batch_indices(int64_t n, int world, int rank, int64_t batch, int64_t epoch,
                                            uint64_t seed, bool shuffle, int64_t **out, int64_t *count,
                                            int64_t *padded);

#ifdef __cplusplus
}
#endif
#endif /* KILN_DIST_H */
