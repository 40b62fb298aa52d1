/* How many threads the process computes with, and how many loader workers
 * a loader left on auto starts: one place decides both, so the two never
 * add up to more than the machine has.
 *
 * Compute threads are OpenMP's: the fast CPU kernels' loops, oneDNN and
 * OpenBLAS all run on libgomp's one pool (CMakeLists.txt links that runtime
 * only), so omp_set_num_threads sizes all three. The count comes from, in
 * order: kiln_set_num_threads (kiln --threads N), KILN_NUM_THREADS read by
 * kiln_init (empty: unset), OMP_NUM_THREADS when the user set it, else
 * every online core.
 *
 * Loader workers on auto take the cores the compute threads leave (0 when
 * they take all: batches are then made on the training thread between
 * steps). Measured on an idle 2-core machine (docs/training.md, "Threads"):
 * 2 compute threads + 0 workers trained 1.8x faster than 1 + 1 and as fast
 * as 2 + 1; on a machine shared with other work, one compute thread is
 * steadier (--threads 1). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.h"
#include "kiln/runtime.h"
#include "runtime/runtime_internal.h"

static _Atomic int compute_threads; /* 0: not decided yet */

static int online_cores(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > KILN_MAX_THREADS ? KILN_MAX_THREADS : (int)cores;
}

static int default_threads(void) {
    const char *omp = getenv("OMP_NUM_THREADS");
#ifdef _OPENMP
    if (omp && *omp) return omp_get_max_threads() < KILN_MAX_THREADS ? omp_get_max_threads() : KILN_MAX_THREADS;
#else
    (void)omp;
#endif
    return online_cores();
}

kiln_status kiln_num_threads_parse(const char *text, const char *what, int *out) {
    char *end = NULL;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || v < 1 || v > KILN_MAX_THREADS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a whole number from 1 to 1024",
                          "%s '%s' is not a thread count", what, text ? text : "");
    if (out) *out = (int)v;
    return KILN_OK;
}

kiln_status kiln_set_num_threads(int n) {
    if (n < 1 || n > KILN_MAX_THREADS)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a whole number from 1 to 1024",
                          "kiln_set_num_threads: %d is not a thread count", n);
    compute_threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    return KILN_OK;
}

int kiln_num_threads(void) {
    int n = compute_threads;
    return n > 0 ? n : default_threads();
}

int kiln_num_loader_workers(void) {
    int spare = online_cores() - kiln_num_threads();
    return spare > 0 ? spare : 0;
}

kiln_status kiln_threads_init(void) {
    const char *env = getenv("KILN_NUM_THREADS");
    int n = compute_threads; /* kiln_set_num_threads before kiln_init wins */
    if (env && *env) KILN_TRY(kiln_num_threads_parse(env, "KILN_NUM_THREADS", n ? NULL : &n));
    return kiln_set_num_threads(n ? n : default_threads());
}
