/* kiln train across processes: `mpirun -np N kiln train ...` trains with
 * DDP (include/kiln/dist.h; docs/distributed.md, "kiln train under
 * mpirun").
 *
 * --batch stays the global batch. Each epoch's order is the one process's
 * (kiln_loader_permutation), padded by the distributed sampler's rule and
 * cut into global batches; rank r trains positions r, r + N, ... of each
 * (kiln_dist_sampler_batch_indices, fed to its loader with
 * kiln_loader_set_indices), so its share is ceil((B - r) / N) and the
 * ranks' k-th batches together are the one process's k-th batch. DDP
 * averages the gradients weighted by each rank's sample count: the step's
 * gradient, and with it the learning rate, is the one process's. The step
 * loss recorded is the global batch's mean: each rank adds its mean loss
 * times its share of the batch, and the window's sums are all-reduced when
 * the window closes (with the correct counts), so rank 0's records are the
 * one process's, up to the order of f32 additions.
 *
 * Rank 0 alone prints, and writes metrics, checkpoints and weights. The
 * other ranks' stdout and stderr go to a temporary file, printed (each line
 * naming the rank) only when the rank fails. Every rank loads --resume's
 * checkpoint, and every decision that ends the loop is the same on every
 * rank (--max-steps; an interrupt is all-reduced each step; a non-finite
 * loss is seen in the reduced window), so no rank waits on a collective
 * another rank left. A rank that fails exits non-zero without MPI_Finalize;
 * the others' next wait names it (or times out: KILN_DIST_TIMEOUT). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "kiln/kiln.h"
#include "ranks.h"
#include "train.h"
#include "train_run.h"

/* ---- The world and the quiet ranks ----------------------------------------------------------- */

/* Ranks other than 0: stdout and stderr into a temporary file. */
static int capture_output(train_run *r) {
    FILE *f = tmpfile();
    fflush(stdout);
    fflush(stderr);
    int out = f ? dup(1) : -1, err = out >= 0 ? dup(2) : -1;
    if (!f || err < 0 || dup2(fileno(f), 1) < 0 || dup2(fileno(f), 2) < 0) {
        fprintf(stderr,
                "kiln train: rank %d: cannot redirect its output to a temporary file (TMPDIR full?)\n",
                r->rank);
        if (f) fclose(f);
        if (out >= 0) close(out);
        if (err >= 0) close(err);
        return 1;
    }
    r->capture = f;
    r->saved_stdout = out, r->saved_stderr = err;
    return 0;
}

/* The real stdout and stderr back; a failed rank's captured output onto
 * stderr, each line naming the rank. A rank that succeeded stays quiet. */
static void release_output(train_run *r, int rc) {
    if (!r->capture) return;
    fflush(stdout);
    fflush(stderr);
    dup2(r->saved_stdout, 1);
    dup2(r->saved_stderr, 2);
    close(r->saved_stdout);
    close(r->saved_stderr);
    /* A usage error (2) is every rank's alike: rank 0 said it. */
    if (rc != 0 && rc != 2 && rc != 130 && fseek(r->capture, 0, SEEK_SET) == 0) {
        fprintf(stderr, "kiln train: rank %d of %d failed (exit %d); its output:\n", r->rank, r->world, rc);
        char line[4096];
        bool line_start = true;
        while (fgets(line, sizeof line, r->capture)) {
            if (line_start) fprintf(stderr, "  rank %d: ", r->rank);
            fputs(line, stderr);
            line_start = strchr(line, '\n') != NULL;
        }
        fflush(stderr);
    }
    fclose(r->capture);
    r->capture = NULL;
}

/* Every rank's default is every core: N ranks on one host would run N
 * times the threads there are cores, and OpenMP's spinning threads then
 * crawl (measured: 17 img/s instead of 226, 2 ranks of 2 threads on 2
 * busy cores). Unless --threads or KILN_NUM_THREADS / OMP_NUM_THREADS
 * chose, a rank takes its share of the host's cores, as torchrun sets
 * OMP_NUM_THREADS=1. */
static void share_cores(train_run *r) {
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long cores = sysconf(_SC_NPROCESSORS_ONLN), ranks = local ? strtol(local, NULL, 10) : 1;
    int n = tool_rank_threads(ranks);
    if (!n || n >= kiln_num_threads() || kiln_set_num_threads(n) != KILN_OK) return;
    if (r->rank == 0)
        fprintf(stderr,
                "kiln train: %ld ranks on this host of %ld cores: %d compute thread%s each (--threads N "
                "chooses)\n",
                ranks, cores, n, n == 1 ? "" : "s");
}

int train_dist_init(train_run *r) {
    r->world = 1;
    kiln_dist_init_opts o = {.world_size = r->a.world};
    kiln_dist_group *g = NULL;
    if (kiln_dist_init_with(&o, &g) != KILN_OK) {
        const kiln_error *e = kiln_error_last();
        fprintf(stderr, "kiln train: %s\n", e->message);
        if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
        return e->status == KILN_ERR_INVALID_ARGUMENT ? 2 : 1;
    }
    r->dist_up = true;
    r->rank = kiln_dist_rank(g);
    r->world = kiln_dist_world_size(g);
    r->a.world = r->world; /* the run configuration stores it */
    if (r->world == 1) return 0;
    r->group = g;
    share_cores(r);
    if (r->rank == 0) return 0;
    /* Their files would collide with rank 0's in the one --out. */
    r->a.profile_steps = 0;
    r->a.monitor = r->a.memory_history = false;
    return capture_output(r);
}

void train_dist_finish(train_run *r, int rc) {
    release_output(r, rc);
    /* MPI_Finalize waits for every rank: after a failure the others may
     * never come, so a failed rank leaves without it (mpirun ends the job). */
    if (r->dist_up && (rc == 0 || rc == 130 || r->world == 1)) kiln_dist_shutdown();
}

/* ---- The flags that meet DDP ----------------------------------------------------------------- */

static int refuse(const train_run *r, const char *flag, const char *why) {
    fprintf(stderr, "kiln train: %s with %d ranks: %s\n", flag, r->world, why);
    return 2;
}

int train_dist_check(train_run *r) {
    if (r->world == 1) return 0;
    train_args *a = &r->a;
    if (a->devices)
        return refuse(r, "--devices",
                      "DataParallel inside a rank is not combined with DDP across ranks; drop "
                      "--devices (one device per rank)");
    if (a->split)
        return refuse(r, "--split",
                      "pipeline stages inside a rank are not combined with DDP across ranks; drop "
                      "--split");
    if (r->dev.type == KILN_DEVICE_CUDA) {
        /* One device per process: the rank's local rank picks it (NCCL
         * reduces the gradients, kiln_dist_backend says so). */
        int n = kiln_device_count(KILN_DEVICE_CUDA);
        int local = kiln_dist_local_rank(r->group);
        if (n < 1) return refuse(r, "--device", "this process sees no CUDA device; pass --device cpu");
        r->dev = r->out_dev = (kiln_device){KILN_DEVICE_CUDA, local % n};
        if (r->rank == 0)
            fprintf(
                stderr,
                "kiln train: %d ranks on CUDA: each rank on cuda:(its local rank mod %d), gradients through "
                "%s%s\n",
                r->world, n, kiln_dist_backend(r->group, r->dev),
                r->world > n ? " (more ranks than devices: NCCL on GPUs refuses two ranks on one device)"
                             : "");
    } else if (r->dev.type != KILN_DEVICE_CPU) {
        return refuse(r, "--device", "DDP reduces CPU and CUDA tensors; pass --device cpu or cuda");
    }
    if (!a->no_auto_batch) {
        /* The recovery halves the micro-batch on the rank that ran out; the
         * others would go on into the gradient all-reduce with a step it
         * repeats. An out-of-memory ends the run on every rank instead. */
        if (r->rank == 0)
            fprintf(stderr,
                    "kiln train: the out-of-memory recovery is off with %d ranks: an out-of-memory ends the "
                    "run (lower --batch, or add ranks)\n",
                    r->world);
        a->no_auto_batch = true;
    }
    return 0;
}

/* ---- Data ------------------------------------------------------------------------------------ */

int64_t train_dist_rank_batch(const train_run *r) {
    return r->world == 1 ? r->a.batch : (r->a.batch - r->rank + r->world - 1) / r->world;
}

/* The training loader's list for `epoch`: this rank's part of each global batch. */
kiln_status train_dist_epoch_begin(train_run *r, int epoch) {
    if (r->world == 1) return KILN_OK;
    int64_t *idx = NULL, count = 0;
    KILN_TRY(kiln_dist_sampler_batch_indices(kiln_dataset_length(r->train_ds), r->world, r->rank, r->a.batch,
                                             epoch, r->a.seed, true, &idx, &count, &r->padded));
    kiln_status st = kiln_loader_set_indices(r->train_ld, idx, count);
    free(idx);
    return st;
}

int train_dist_loaders(train_run *r) {
    if (r->world == 1) return 0;
    if (r->a.batch < r->world) {
        if (r->rank == 0)
            fprintf(stderr,
                    "kiln train: --batch %lld over %d ranks: every rank needs a sample in each step; give "
                    "--batch %d or more\n",
                    (long long)r->a.batch, r->world, r->world);
        return 2;
    }
    if (train_dist_epoch_begin(r, r->start_epoch) != KILN_OK)
        return train_fail("train", "distributed sampler");
    /* The test set split without padding (each image counted once): rank r
     * evaluates r, r + N, ... */
    int64_t n = kiln_dataset_length(r->test_ds),
            mine = n > r->rank ? (n - r->rank + r->world - 1) / r->world : 0;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(mine > 0 ? mine : 1));
    if (!idx) return train_fail("train", "test split");
    for (int64_t k = 0; k < mine; k++) idx[k] = r->rank + k * r->world;
    kiln_status st = kiln_loader_set_indices(r->test_ld, idx, mine);
    free(idx);
    if (st != KILN_OK) return train_fail("train", "test split");
    if (r->rank == 0) {
        int64_t b = r->a.batch / r->world, extra = r->a.batch % r->world;
        char shares[96];
        if (extra == 1)
            snprintf(shares, sizeof shares, "%lld on rank 0, %lld on the others", (long long)b + 1,
                     (long long)b);
        else if (extra)
            snprintf(shares, sizeof shares, "%lld on ranks 0..%lld, %lld on the others", (long long)b + 1,
                     (long long)extra - 1, (long long)b);
        else
            snprintf(shares, sizeof shares, "%lld per rank", (long long)b);
        fprintf(
            stderr,
            "kiln train: %d ranks (DDP over MPI): global batch %lld = %s; the gradient is the global batch's "
            "(sample-weighted average), so the effective learning rate is --lr %g, as one process with batch "
            "%lld (not scaled by the ranks); the epoch's order is padded to %lld samples "
            "(docs/distributed.md)\n",
            r->world, (long long)r->a.batch, shares, r->a.lr, (long long)r->a.batch, (long long)r->padded);
    }
    return 0;
}

/* ---- The step -------------------------------------------------------------------------------- */

int train_dist_wrap(train_run *r) {
    if (r->world == 1) return 0;
    if (kiln_ddp_wrap(r->model, r->group, NULL, &r->ddp) != KILN_OK) return train_fail("train", "DDP");
    return 0;
}

int64_t train_dist_step_rows(const train_run *r, int64_t batch_index) {
    int64_t left = r->padded - batch_index * r->a.batch;
    return left < r->a.batch ? left : r->a.batch;
}

/* --accum under DDP. The micro-batches accumulate locally (no_sync), then
 * one backward of zero times the sum of every parameter fires each
 * parameter's hook once, adding zeros to the accumulated gradient, and the
 * hooks reduce it: PyTorch's "synchronise on the last micro-batch", without
 * splitting kiln_accumulate_backward's loop (whose micro-batch weights,
 * their share of the rank's batch, stay as they are). Costs one backward
 * through a sum per parameter. */
static kiln_status sync_accumulated(train_run *r) {
    kiln_tensor **params = NULL;
    int np = 0;
    KILN_TRY(kiln_module_parameters(r->model, &params, &np));
    kiln_scope_begin();
    kiln_tensor *total = NULL;
    kiln_status st = KILN_OK;
    for (int i = 0; i < np && st == KILN_OK; i++) {
        kiln_tensor *sum = kiln_sum(params[i], 0, NULL, false);
        kiln_tensor *zero = sum ? kiln_mul_scalar(sum, 0.0) : NULL;
        total = !zero ? NULL : total ? kiln_add(total, zero) : zero;
        if (!total) st = kiln_error_last()->status;
    }
    if (st == KILN_OK && total) st = kiln_backward(total, NULL, false);
    kiln_scope_end();
    free(params);
    return st;
}

kiln_status train_dist_backward(train_run *r, int64_t batch_index, kiln_tensor *x, kiln_tensor *y,
                                kiln_tensor **loss, kiln_tensor **hits) {
    if (!r->ddp) return train_oom_backward(r, x, y, loss, hits);
    int64_t rows = kiln_size(x, 0), total = train_dist_step_rows(r, batch_index);
    KILN_TRY(kiln_ddp_set_sample_count(r->ddp, rows));
    /* BatchNorm's running statistics: rank 0's before each forward
     * (PyTorch's broadcast_buffers); nothing to send for a model without. */
    KILN_TRY(kiln_ddp_broadcast_buffers(r->ddp));
    bool accum = r->accum_live > 1;
    if (accum) KILN_TRY(kiln_ddp_set_sync(r->ddp, false));
    kiln_status st = train_amp_backward(r, x, y, loss, hits);
    if (accum) {
        kiln_status on = kiln_ddp_set_sync(r->ddp, true);
        if (st == KILN_OK) st = on;
        if (st == KILN_OK) st = sync_accumulated(r);
    }
    KILN_TRY(st);
    KILN_TRY(kiln_ddp_finish_grads(r->ddp));
    /* This rank's part of the global batch's mean loss. */
    kiln_tensor *part = kiln_mul_scalar(*loss, (double)rows / (double)total);
    if (!part) return kiln_error_last()->status;
    *loss = part; /* both in the step's scope */
    return KILN_OK;
}

kiln_status train_dist_reduce_window(train_run *r, kiln_tensor *loss_sum, kiln_tensor *hits) {
    if (!r->ddp) return KILN_OK;
    if (loss_sum) KILN_TRY(kiln_dist_all_reduce(r->group, loss_sum, KILN_DIST_SUM, NULL));
    if (hits) KILN_TRY(kiln_dist_all_reduce(r->group, hits, KILN_DIST_SUM, NULL));
    return KILN_OK;
}

kiln_status train_dist_agree_stop(train_run *r, bool *stop) {
    if (!r->ddp) return KILN_OK;
    kiln_scope_begin();
    kiln_tensor *flag = kiln_full(KILN_SHAPE(1), *stop ? 1.0 : 0.0, KILN_I32, KILN_CPU);
    kiln_status st =
        flag ? kiln_dist_all_reduce(r->group, flag, KILN_DIST_SUM, NULL) : kiln_error_last()->status;
    double any = 0;
    if (st == KILN_OK) st = kiln_item(flag, &any);
    kiln_scope_end();
    if (st == KILN_OK) *stop = any > 0;
    return st;
}

/* ---- Evaluation ------------------------------------------------------------------------------ */

kiln_status train_dist_evaluate(train_run *r, int64_t epoch, double *loss, double *acc) {
    if (!r->ddp) return train_evaluate(r->net, r->test_ld, epoch, loss, acc, NULL);
    /* Every rank evaluates rank 0's model (its BatchNorm statistics too). */
    KILN_TRY(kiln_ddp_broadcast_buffers(r->ddp));
    double l = 0, a = 0;
    int64_t seen = 0;
    KILN_TRY(train_evaluate(r->net, r->test_ld, epoch, &l, &a, &seen));
    kiln_scope_begin();
    /* Sums of losses, hits and images over the ranks, in f64. */
    kiln_tensor *sums = kiln_empty(KILN_SHAPE(3), KILN_F64, KILN_CPU);
    kiln_status st = sums ? KILN_OK : kiln_error_last()->status;
    if (st == KILN_OK) {
        double *p = kiln_data_ptr(sums);
        p[0] = l * (double)seen, p[1] = (double)llround(a * (double)seen), p[2] = (double)seen;
        st = kiln_dist_all_reduce(r->group, sums, KILN_DIST_SUM, NULL);
    }
    if (st == KILN_OK) {
        const double *p = kiln_data_ptr(sums);
        *loss = p[2] > 0 ? p[0] / p[2] : 0;
        *acc = p[2] > 0 ? p[1] / p[2] : 0;
    }
    kiln_scope_end();
    return st;
}
