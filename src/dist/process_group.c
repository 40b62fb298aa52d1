/* Process groups: joining the world (MPI under mpirun, a singleton
 * otherwise), duplicating and freeing groups, their timeout and debug
 * settings.
 *
 * The one piece of process-wide state is `dist_state`: MPI is initialised
 * once per process and the world group lives until kiln_dist_shutdown. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dist/dist_internal.h"

#define DIST_DEFAULT_TIMEOUT_S 300.0

static struct {
    bool initialised;
    bool mpi_ours;   /* kiln_dist_init called MPI_Init_thread */
    bool used_mpi;   /* MPI cannot be initialised twice in a process */
    int live_groups; /* groups from kiln_dist_group_dup not yet freed */
    kiln_dist_group *world;
} dist_state;

/* An integer environment variable set by the launcher: *out, or -1 when it
 * is not set. */
static kiln_status env_int(const char *name, int *out) {
    const char *s = getenv(name);
    *out = -1;
    if (!s) return KILN_OK;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > INT_MAX)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "start the program with mpirun, which sets it",
                          "kiln_dist_init: %s='%s' is not a rank count or number", name, s);
    *out = (int)v;
    return KILN_OK;
}

static kiln_status env_settings(double *timeout_s, bool *debug) {
    *timeout_s = DIST_DEFAULT_TIMEOUT_S;
    *debug = false;
    const char *t = getenv("KILN_DIST_TIMEOUT");
    if (t && *t) {
        char *end = NULL;
        errno = 0;
        double v = strtod(t, &end);
        if (errno || end == t || *end || !isfinite(v) || v <= 0.0 || v > 1e7)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give seconds, e.g. KILN_DIST_TIMEOUT=300",
                              "kiln_dist_init: KILN_DIST_TIMEOUT='%s' is not a positive number of seconds",
                              t);
        *timeout_s = v;
    }
    const char *d = getenv("KILN_DIST_DEBUG");
    if (d && *d) {
        if (strcmp(d, "1") && strcmp(d, "0"))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use KILN_DIST_DEBUG=1 (on) or 0 (off)",
                              "kiln_dist_init: KILN_DIST_DEBUG='%s' is not 0 or 1", d);
        *debug = d[0] == '1';
    }
    return KILN_OK;
}

#if KILN_WITH_MPI
static kiln_status mpi_error(int rc, const char *call) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return KILN_RAISE(KILN_ERR_DEVICE, NULL, "kiln_dist: %s failed: %s (MPI error %d)", call, text, rc);
}
#define MPI_TRY(call)                                                                                        \
    do {                                                                                                     \
        int mpi_rc_ = (call);                                                                                \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_error(mpi_rc_, #call);                                        \
    } while (0)

/* MPI_Init_thread (unless the program initialised MPI), then the world's
 * rank and size. Errors on the world communicator are returned, not fatal. */
static kiln_status mpi_join(kiln_dist_group *g, int local_rank) {
    int inited = 0;
    MPI_TRY(MPI_Initialized(&inited));
    if (!inited) {
        int provided = 0;
#ifdef OPEN_MPI
        /* Open MPI's non-blocking all-reduce (libnbc) as a ring, unless the
         * user chose: its own choice took 2.0-2.7 ms for DDP's 4.4 MiB of
         * the tutorial CNN's gradients between 2 ranks on one host, the
         * ring 0.7-1.0 ms (docs/distributed.md, "Where the bars stand"). */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
#endif
        MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
        dist_state.mpi_ours = true;
        if (provided < MPI_THREAD_SERIALIZED) {
            MPI_Finalize();
            dist_state.mpi_ours = false;
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "use an MPI built with thread support (Open MPI is)",
                              "kiln_dist_init: MPI provides thread level %d, below MPI_THREAD_SERIALIZED",
                              provided);
        }
    }
    dist_state.used_mpi = true;
    MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &g->comm));
    MPI_TRY(MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN));
    MPI_TRY(MPI_Comm_rank(g->comm, &g->rank));
    MPI_TRY(MPI_Comm_size(g->comm, &g->world));
    g->local_rank = local_rank >= 0 ? local_rank : 0;
    return g->world > 1 ? kiln_dist_peers_exchange(g) : KILN_OK;
}
#endif

/* This process's command line, arguments joined by spaces; a line longer
 * than the buffer ends in "...". */
static void own_command(char *buf, size_t n) {
    FILE *f = fopen("/proc/self/cmdline", "r");
    size_t len = f ? fread(buf, 1, n - 1, f) : 0;
    bool cut = f && len == n - 1 && fgetc(f) != EOF;
    if (f) fclose(f);
    while (len > 0 && buf[len - 1] == '\0') len--;
    if (len == 0) {
        snprintf(buf, n, "PROGRAM");
        return;
    }
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\0') buf[i] = ' ';
    if (cut && len > 3) memcpy(buf + len - 3, "...", 3);
}

/* The ranks asked for: opts->world_size, else KILN_WORLD_SIZE, else 0 (any). */
static kiln_status wanted_world(const kiln_dist_init_opts *opts, int *want) {
    *want = 0;
    if (opts && opts->world_size < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give a rank count >= 1, or 0 for the launcher's",
                          "kiln_dist_init: world_size %d is negative", opts->world_size);
    if (opts && opts->world_size > 0) {
        *want = opts->world_size;
        return KILN_OK;
    }
    const char *s = getenv("KILN_WORLD_SIZE");
    if (!s || !*s) return KILN_OK;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1 << 20)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                          "give the number of ranks, e.g. KILN_WORLD_SIZE=4, or unset it",
                          "kiln_dist_init: KILN_WORLD_SIZE='%s' is not a rank count in [1, 1048576]", s);
    *want = (int)v;
    return KILN_OK;
}

/* A world of `want` ranks was asked for, and `started` (-1: no launcher)
 * is what this process is part of: the error that says how to launch it. */
static kiln_status launch_error(int want, int started, const char *command) {
    char own[512];
    if (!command) own_command(own, sizeof own), command = own;
#if !KILN_WITH_MPI
    (void)started;
    return KILN_RAISE(
        KILN_ERR_UNSUPPORTED, "rebuild with -DKILN_WITH_MPI=ON (Debian: libopenmpi-dev)",
        "kiln_dist_init: %d ranks were asked for, but this build has no MPI (KILN_WITH_MPI=OFF) "
        "and runs a world of 1 only; rebuilt with MPI, start it as: mpirun -np %d %s",
        want, want, command);
#else
    const char *hint = "add --oversubscribe for more ranks than cores; as root set OMPI_ALLOW_RUN_AS_ROOT=1 "
                       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1";
    if (started < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                          "kiln_dist_init: %d ranks were asked for, but no launcher started this process "
                          "(alone it is a world of 1); start it as: mpirun -np %d %s",
                          want, want, command);
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                      "kiln_dist_init: %d ranks were asked for, but the launcher started %d; start it as: "
                      "mpirun -np %d %s",
                      want, started, want, command);
#endif
}

kiln_status kiln_dist_init(kiln_dist_group **world) { return kiln_dist_init_with(NULL, world); }

kiln_status kiln_dist_init_with(const kiln_dist_init_opts *opts, kiln_dist_group **world) {
    if (!world) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_init: world is NULL");
    *world = NULL;
    if (dist_state.initialised)
        return KILN_RAISE(KILN_ERR_STATE, "use the group it returned, or call kiln_dist_shutdown first",
                          "kiln_dist_init: already initialised");
    if (dist_state.used_mpi)
        return KILN_RAISE(KILN_ERR_STATE, "initialise once per process",
                          "kiln_dist_init: MPI was finalised by kiln_dist_shutdown and cannot start again");
    int size = -1, local = -1;
    KILN_TRY(env_int("OMPI_COMM_WORLD_SIZE", &size));
    if (size < 0) KILN_TRY(env_int("PMI_SIZE", &size));
    KILN_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", &local));
    if (local < 0) KILN_TRY(env_int("MPI_LOCALRANKID", &local));
    int want = 0;
    KILN_TRY(wanted_world(opts, &want));
    if (want > 0 && want != (size < 0 ? 1 : size))
        return launch_error(want, size, opts ? opts->command : NULL);
    double timeout_s;
    bool debug;
    KILN_TRY(env_settings(&timeout_s, &debug));
    kiln_dist_group *g = KILN_CALLOC(1, sizeof *g);
    if (!g) return KILN_ERR_OUT_OF_MEMORY;
    *g = (kiln_dist_group){
        .rank = 0, .world = 1, .local_rank = 0, .timeout_s = timeout_s, .debug = debug, .is_world = true};
#if KILN_WITH_MPI
    g->comm = MPI_COMM_NULL;
    if (size >= 0) {
        kiln_status st = mpi_join(g, local);
        if (st) {
            free(g);
            return st;
        }
    }
#else
    if (size > 1) {
        free(g);
        return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                          "rebuild with -DKILN_WITH_MPI=ON (Debian: libopenmpi-dev), or run one process",
                          "kiln_dist_init: started with a world of %d ranks, but this build has no MPI "
                          "(KILN_WITH_MPI=OFF) and runs a world of 1 only",
                          size);
    }
#endif
    dist_state.initialised = true;
    dist_state.world = g;
    *world = g;
    return KILN_OK;
}

kiln_status kiln_dist_shutdown(void) {
    if (!dist_state.initialised) return KILN_OK;
    kiln_dist_group *g = dist_state.world;
    if (dist_state.live_groups > 0)
        return KILN_RAISE(KILN_ERR_STATE, "free them with kiln_dist_group_free first",
                          "kiln_dist_shutdown: %d group(s) made by kiln_dist_group_dup are still alive",
                          dist_state.live_groups);
    if (g->in_flight > 0)
        return KILN_RAISE(KILN_ERR_STATE, "wait for the work (kiln_dist_work_wait) and free it first",
                          "kiln_dist_shutdown: %lld collective(s) on the world group are still in flight",
                          (long long)g->in_flight);
    kiln_dist_nccl_free(g);
    kiln_dist_sync_bn_free_all();
#if KILN_WITH_MPI
    if (g->comm != MPI_COMM_NULL) MPI_TRY(MPI_Comm_free(&g->comm));
    if (dist_state.mpi_ours) MPI_TRY(MPI_Finalize());
    dist_state.mpi_ours = false;
#endif
    free(g->peers);
    free(g);
    dist_state.world = NULL;
    dist_state.initialised = false;
    return KILN_OK;
}

int kiln_dist_rank(const kiln_dist_group *g) { return g ? g->rank : -1; }
int kiln_dist_world_size(const kiln_dist_group *g) { return g ? g->world : 0; }
int kiln_dist_local_rank(const kiln_dist_group *g) { return g ? g->local_rank : -1; }

kiln_status kiln_dist_group_dup(kiln_dist_group *g, kiln_dist_group **out) {
    if (!g || !out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_group_dup: NULL argument");
    *out = NULL;
    kiln_dist_group *d = KILN_CALLOC(1, sizeof *d);
    if (!d) return KILN_ERR_OUT_OF_MEMORY;
    *d = (kiln_dist_group){.rank = g->rank,
                           .world = g->world,
                           .local_rank = g->local_rank,
                           .timeout_s = g->timeout_s,
                           .debug = g->debug,
                           .is_world = false,
                           .peers = g->peers};
#if KILN_WITH_MPI
    d->comm = MPI_COMM_NULL;
    if (g->comm != MPI_COMM_NULL) {
        int rc = MPI_Comm_dup(g->comm, &d->comm);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
        if (rc != MPI_SUCCESS) {
            if (d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
            free(d);
            return mpi_error(rc, "MPI_Comm_dup");
        }
    }
#endif
    dist_state.live_groups++;
    *out = d;
    return KILN_OK;
}

kiln_status kiln_dist_group_free(kiln_dist_group *g) {
    if (!g) return KILN_OK;
    if (g->is_world)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "kiln_dist_shutdown frees it",
                          "kiln_dist_group_free: this is the world group");
    if (g->in_flight > 0)
        return KILN_RAISE(KILN_ERR_STATE, "wait for the work (kiln_dist_work_wait) and free it first",
                          "kiln_dist_group_free: %lld collective(s) on the group are still in flight",
                          (long long)g->in_flight);
    kiln_dist_nccl_free(g);
#if KILN_WITH_MPI
    if (g->comm != MPI_COMM_NULL) MPI_TRY(MPI_Comm_free(&g->comm));
#endif
    dist_state.live_groups--;
    free(g);
    return KILN_OK;
}

kiln_status kiln_dist_group_set_timeout(kiln_dist_group *g, double seconds) {
    if (!g) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dist_group_set_timeout: group is NULL");
    if (!isfinite(seconds) || seconds <= 0.0 || seconds > 1e7)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give seconds in (0, 1e7]",
                          "kiln_dist_group_set_timeout: %g is not a positive number of seconds", seconds);
    g->timeout_s = seconds;
    return KILN_OK;
}

double kiln_dist_group_timeout(const kiln_dist_group *g) { return g ? g->timeout_s : 0.0; }

void kiln_dist_group_set_debug(kiln_dist_group *g, bool debug) {
    if (g) g->debug = debug;
}

bool kiln_dist_group_debug(const kiln_dist_group *g) { return g && g->debug; }
