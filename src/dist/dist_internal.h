/* Process groups and work handles, shared by the collectives and DDP. */
#ifndef KILN_SRC_DIST_DIST_INTERNAL_H
#define KILN_SRC_DIST_DIST_INTERNAL_H

#include "kiln/dist.h"
#include "kiln_config.h"

#if KILN_WITH_MPI
#include <mpi.h>
#endif

typedef enum dist_kind {
    DIST_ALL_REDUCE = 0,
    DIST_BROADCAST,
    DIST_ALL_GATHER,
    DIST_REDUCE_SCATTER,
    DIST_BARRIER,
    DIST_KIND_COUNT
} dist_kind;

/* Who a rank is, all-gathered at kiln_dist_init (peers.c). */
typedef struct dist_peer {
    int32_t pid;
    uint64_t start_ticks; /* the process's start time (/proc/<pid>/stat); 0: unknown */
    uint64_t pid_ns;      /* inode of /proc/self/ns/pid; 0: unknown */
    char host[64];
} dist_peer;

struct kiln_dist_group {
    int rank, world, local_rank;
    double timeout_s;
    bool debug;
    bool is_world;
    uint64_t seq;      /* collectives started on this group (same on every rank) */
    int64_t in_flight; /* works started and not yet completed */
    dist_peer *peers;  /* world entries, rank order; owned by the world group, NULL in a singleton */
#if KILN_WITH_MPI
    MPI_Comm comm; /* MPI_COMM_NULL in a singleton world */
#endif
};

struct kiln_dist_work {
    kiln_dist_group *group;
    dist_kind kind;
    kiln_dist_reduce_op op;
    uint64_t seq;
    uint64_t start_ns; /* when it was started (kiln_now_ns), for the profiler */
    kiln_dtype dtype;
    kiln_shape shape;    /* of the tensor named in messages (in, or t) */
    kiln_tensor *target; /* the caller's output (written at completion), own ref */
    kiln_tensor *buffer; /* what MPI writes: target itself, or a contiguous copy */
    kiln_tensor *input;  /* all_gather / reduce_scatter input (contiguous), own ref */
    bool done;
    kiln_status result;
#if KILN_WITH_MPI
    MPI_Request request;
#endif
};

const char *kiln_dist_kind_name(dist_kind kind);

/* Wait with an explicit watchdog bound (seconds). */
kiln_status kiln_dist_work_wait_s(kiln_dist_work *w, double seconds);
/* Wait until `deadline` (kiln_clock_now_s seconds), at least one test of
 * the request: several works waited in turn share one watchdog bound
 * instead of each getting a full one. */
kiln_status kiln_dist_work_wait_until(kiln_dist_work *w, double deadline);

#if KILN_WITH_MPI
/* All-gather the ranks' processes into g->peers (collective, blocking). */
kiln_status kiln_dist_peers_exchange(kiln_dist_group *g);
/* How many other ranks of g have a process on this host that is gone
 * (exited, killed, a zombie); buf gets "rank 1 (pid 1234 on host)" for
 * each. Ranks on other hosts are never counted. Does not block. */
int kiln_dist_peers_lost(const kiln_dist_group *g, char *buf, size_t size);
#endif

#endif
