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

struct kiln_dist_group {
    int rank, world, local_rank;
    double timeout_s;
    bool debug;
    bool is_world;
    uint64_t seq;      /* collectives started on this group (same on every rank) */
    int64_t in_flight; /* works started and not yet completed */
#if KILN_WITH_MPI
    MPI_Comm comm; /* MPI_COMM_NULL in a singleton world */
#endif
};

struct kiln_dist_work {
    kiln_dist_group *group;
    dist_kind kind;
    kiln_dist_reduce_op op;
    uint64_t seq;
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

#endif
