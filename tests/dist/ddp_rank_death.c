/* The worker of tests/dist/rank_death.sh: DDP training that one rank
 * leaves by dying.
 *
 * Every rank trains a small MLP under DDP on a fixed batch, step after
 * step (at most 100000 steps, far more than a run lasts: the surviving
 * ranks are meant to be stopped by the lost rank's error, and the driver's
 * bound catches a hang). The rank named by KILN_TEST_DIE_RANK sends itself
 * SIGKILL after the forward of step KILN_TEST_DIE_STEP -- `kill -9` from
 * inside, at a known point: the other ranks are then in backward or in
 * kiln_ddp_finish_grads, waiting on that step's bucket all-reduce. A rank
 * whose step fails prints
 *
 *   rank R: step S failed: <the library's message>
 *
 * and exits 1 without kiln_dist_shutdown (MPI_Finalize would wait for the
 * dead rank), as a training program should. Each rank prints "rank R:
 * step S done" after its first steps so the driver's log shows how far
 * they got. With KILN_TEST_CUDA=1 the model and the batch are on the CUDA
 * device of the rank's local rank, and the gradients go through NCCL (the
 * emulator's in the emulation build). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/dist.h"
#include "kiln/kiln.h"

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : fallback;
}

static int fail(int rank, int step, const char *what) {
    fprintf(stderr, "rank %d: step %d failed: %s: %s\n", rank, step, what, kiln_error_message());
    fflush(stderr);
    return 1;
}

/* One DDP step on (x, y); rank `die_rank` dies after the forward of step `die_step`. */
static kiln_status step(kiln_ddp *ddp, kiln_optimizer *opt, kiln_tensor *x, kiln_tensor *y, bool die) {
    kiln_scope_begin();
    kiln_status st = kiln_optimizer_zero_grad(opt, true);
    kiln_tensor *out = st ? NULL : kiln_ddp_forward(ddp, x);
    if (out && die) {
        fflush(stdout);
        raise(SIGKILL);
    }
    kiln_tensor *loss = out ? kiln_cross_entropy(out, y, NULL) : NULL;
    if (!st && !loss) st = kiln_error_last()->status;
    if (!st) st = kiln_backward(loss, NULL, false);
    if (!st) st = kiln_ddp_finish_grads(ddp);
    if (!st) st = kiln_optimizer_step(opt);
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (kiln_init()) return 1;
    kiln_dist_group *world = NULL;
    if (kiln_dist_init(&world)) return fail(0, 0, "kiln_dist_init");
    int rank = kiln_dist_rank(world);
    int die_rank = env_int("KILN_TEST_DIE_RANK", 1), die_step = env_int("KILN_TEST_DIE_STEP", 3);
    kiln_manual_seed(1 + (uint64_t)rank);
    kiln_module *layers[] = {kiln_nn_linear(64, 256, true), kiln_nn_relu(), kiln_nn_linear(256, 256, true),
                             kiln_nn_relu(), kiln_nn_linear(256, 10, true)};
    kiln_module *m = kiln_nn_sequential(5, layers);
    if (!m) return fail(rank, 0, "model");
    kiln_device dev = KILN_CPU;
    if (env_int("KILN_TEST_CUDA", 0)) {
        int n = kiln_device_count(KILN_DEVICE_CUDA);
        if (n < 1) {
            fprintf(stderr, "rank %d: KILN_TEST_CUDA=1 but this build sees no CUDA device\n", rank);
            return 1;
        }
        dev = (kiln_device){KILN_DEVICE_CUDA, kiln_dist_local_rank(world) % n};
        if (kiln_module_to(m, dev)) return fail(rank, 0, "kiln_module_to");
    }
    printf("rank %d: gradients of %s go through %s\n", rank, dev.type == KILN_DEVICE_CUDA ? "cuda" : "cpu",
           kiln_dist_backend(world, dev));
    kiln_ddp_opts o = kiln_ddp_opts_default();
    o.first_bucket_mb = 0.01; /* several buckets, so backward is mid-way through them */
    o.bucket_cap_mb = 0.1;
    kiln_ddp *ddp = NULL;
    if (kiln_ddp_wrap(m, world, &o, &ddp)) return fail(rank, 0, "kiln_ddp_wrap");
    kiln_tensor **params = NULL;
    int np = 0;
    if (kiln_module_parameters(m, &params, &np)) return fail(rank, 0, "parameters");
    kiln_optimizer *opt = kiln_adam(params, np, NULL);
    free(params);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(32, 64), KILN_F32, dev);
    kiln_tensor *y = kiln_zeros(KILN_SHAPE(32), KILN_I64, dev);
    if (!opt || !x || !y) return fail(rank, 0, "setup");
    for (int s = 1; s <= 100000; s++) {
        if (step(ddp, opt, x, y, rank == die_rank && s == die_step)) return fail(rank, s, "training");
        if (s <= die_step + 1) printf("rank %d: step %d done\n", rank, s);
    }
    fprintf(stderr, "rank %d: trained 100000 steps and no rank died (KILN_TEST_DIE_RANK=%d is not a rank?)\n",
            rank, die_rank);
    return 1;
}
