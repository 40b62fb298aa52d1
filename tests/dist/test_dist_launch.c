/* Asking for a world size (kiln_dist_init_with, KILN_WORLD_SIZE): run as a
 * singleton and as 2 ranks under mpirun (tests/CMakeLists.txt).
 *
 * Without a launcher, a request for N > 1 ranks fails before MPI is touched
 * with a message that says how to start the program: `mpirun -np N` and
 * this process's own command line (or the one given); 1 rank, or no
 * request, is a world of 1. Under mpirun -np 2 a request for 3 fails
 * naming both counts and the same command, a request for 2 (or none)
 * joins. Bad KILN_WORLD_SIZE values are refused by name. After each
 * refusal init works again, so the refusal really left MPI alone. */
#include <stdlib.h>

#include "kiln/dist.h"
#include "kiln_config.h"
#include "test_util.h"

/* A build without MPI refuses the same requests as unsupported, with the
 * same launch command after the rebuild option. */
#if KILN_WITH_MPI
#define LAUNCH_REFUSED KILN_ERR_INVALID_ARGUMENT
#define NO_LAUNCHER    "no launcher started this process"
#else
#define LAUNCH_REFUSED KILN_ERR_UNSUPPORTED
#define NO_LAUNCHER    "this build has no MPI (KILN_WITH_MPI=OFF)"
#endif

/* Init with opts, expect a world of `expect`, shut down. */
static void joins(const kiln_dist_init_opts *opts, int expect) {
    kiln_dist_group *w = NULL;
    CHECK_OK(kiln_dist_init_with(opts, &w));
    CHECK_EQ_I(kiln_dist_world_size(w), expect);
    CHECK_OK(kiln_dist_shutdown());
}

static void refused_as(const kiln_dist_init_opts *opts, kiln_status status, const char *needle) {
    kiln_dist_group *w = (kiln_dist_group *)&w;
    CHECK_FAILS(kiln_dist_init_with(opts, &w), status, needle);
    CHECK(w == NULL);
}

/* A launch request refused: the status depends on the build. */
static void refused(const kiln_dist_init_opts *opts, const char *needle) {
    refused_as(opts, LAUNCH_REFUSED, needle);
}

static void singleton(void) {
    /* The command line shown is this process's own (/proc/self/cmdline). */
    refused(&(kiln_dist_init_opts){.world_size = 4}, NO_LAUNCHER);
    refused(&(kiln_dist_init_opts){.world_size = 4}, "start it as: mpirun -np 4 ");
    refused(&(kiln_dist_init_opts){.world_size = 4}, "test_dist_launch");
    refused(&(kiln_dist_init_opts){.world_size = 2, .command = "kiln train --world 2 --epochs 3"},
            "start it as: mpirun -np 2 kiln train --world 2 --epochs 3");
    refused_as(&(kiln_dist_init_opts){.world_size = -1}, KILN_ERR_INVALID_ARGUMENT,
               "world_size -1 is negative");
    CHECK(setenv("KILN_WORLD_SIZE", "3", 1) == 0);
    refused(NULL, "3 ranks were asked for");
    refused(NULL, "mpirun -np 3 ");
    /* opts->world_size takes precedence over the variable. */
    joins(&(kiln_dist_init_opts){.world_size = 1}, 1);
    CHECK(setenv("KILN_WORLD_SIZE", "zero", 1) == 0);
    refused_as(NULL, KILN_ERR_INVALID_ARGUMENT, "KILN_WORLD_SIZE='zero' is not a rank count");
    CHECK(setenv("KILN_WORLD_SIZE", "0", 1) == 0);
    refused_as(NULL, KILN_ERR_INVALID_ARGUMENT, "KILN_WORLD_SIZE='0' is not a rank count");
    CHECK(setenv("KILN_WORLD_SIZE", "1", 1) == 0);
    joins(NULL, 1);
    CHECK(unsetenv("KILN_WORLD_SIZE") == 0);
    joins(NULL, 1);
}

static void under_mpirun(int started) {
    char want[96];
    snprintf(want, sizeof want, "%d ranks were asked for, but the launcher started %d", started + 1, started);
    refused(&(kiln_dist_init_opts){.world_size = started + 1}, want);
    snprintf(want, sizeof want, "start it as: mpirun -np %d ", started + 1);
    refused(&(kiln_dist_init_opts){.world_size = started + 1}, want);
    CHECK(setenv("KILN_WORLD_SIZE", "1", 1) == 0);
    refused(NULL, "1 ranks were asked for, but the launcher started");
    CHECK(unsetenv("KILN_WORLD_SIZE") == 0);
    /* The last init joins MPI, which can start once per process. */
    joins(&(kiln_dist_init_opts){.world_size = started}, started);
}

int main(void) {
    if (kiln_init()) return 1;
    const char *launched = getenv("OMPI_COMM_WORLD_SIZE");
    if (launched)
        under_mpirun(atoi(launched));
    else
        singleton();
    kiln_shutdown();
    return kt_finish();
}
