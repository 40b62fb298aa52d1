/* Process groups and work handles, shared by the collectives and DDP. */
#ifndef KILN_SRC_DIST_DIST_INTERNAL_H
#define KILN_SRC_DIST_DIST_INTERNAL_H

#include "kiln/dist.h"
#include "kiln_config.h"

#if KILN_WITH_MPI
#include <mpi.h>
#endif

/* CUDA tensors go through NCCL (src/dist/nccl.c): the real library in the
 * nvcc build with KILN_WITH_NCCL, the emulator's (src/emu/nccl.cpp) in the
 * emulation build. Without it they are staged through pinned host memory
 * and reduced over MPI. */
#if defined(KILN_WITH_CUDA) && (KILN_WITH_NCCL || defined(KILN_CUDA_EMULATION))
#define KILN_DIST_NCCL 1
#else
#define KILN_DIST_NCCL 0
#endif

struct dist_nccl;

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
    uint64_t seq;           /* collectives started on this group (same on every rank) */
    int64_t in_flight;      /* works started and not yet completed */
    dist_peer *peers;       /* world entries, rank order; owned by the world group, NULL in a singleton */
    struct dist_nccl *nccl; /* NCCL communicators, made at the first CUDA collective (nccl.c) */
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
    kiln_error error;  /* result's error, raised again by later waits */
    bool staged;       /* CUDA tensors reduced over MPI through pinned host copies */
    int nccl_device;   /* >= 0: an NCCL collective on this CUDA device */
    kiln_event *event; /* recorded on the communication stream after the NCCL call */
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
/* Test `req` until it completes, `seconds` pass or a rank's process on this
 * host is gone (the last two set *timed_out and leave it in flight). */
kiln_status kiln_dist_wait_request(kiln_dist_group *g, MPI_Request *req, double seconds, const char *what,
                                   bool *timed_out);
#endif

/* ---- NCCL (nccl.c; the calls themselves in nccl_cuda.c) ---- */

/* The NCCL and CUDA runtime calls, made by nccl_cuda.c: on the CUDA side
 * of the build (compiled with the CUDA backend, so inside libkiln_cuda.so
 * when the backend is a module; libkiln itself calls neither NCCL nor
 * cudart). Each raises a Kiln error naming the call on failure. `id` is an
 * ncclUniqueId (DIST_NCCL_ID_BYTES); `stream` a cudaStream_t. */
#define DIST_NCCL_ID_BYTES 128
typedef struct dist_nccl_ops {
    kiln_status (*unique_id)(void *id);
    /* Blocks until every rank joined. */
    kiln_status (*comm_init)(void **comm, int device, int world, int rank, const void *id);
    /* Between ncclGroupStart and ncclGroupEnd, on `stream`. count: elements
     * of out (all_reduce, broadcast, reduce_scatter) or of in (all_gather). */
    kiln_status (*launch)(void *comm, dist_kind kind, kiln_dist_reduce_op op, kiln_dtype dtype,
                          const void *in, void *out, size_t count, int root, void *stream);
    /* ncclCommGetAsyncError: KILN_OK, or the error (KILN_ERR_DEVICE). */
    kiln_status (*async_error)(void *comm, int device, int rank, int world);
    void (*abort)(void *comm);
    void (*destroy)(void *comm);
} dist_nccl_ops;
/* The CUDA side's table (nccl_cuda.c). A module build registers it from
 * the module as it loads (kiln_dist_nccl_register); otherwise libkiln
 * calls kiln_dist_nccl_cuda_ops directly. */
const dist_nccl_ops *kiln_dist_nccl_cuda_ops(void);
void kiln_dist_nccl_register(const dist_nccl_ops *ops);

/* Whether CUDA tensors go through NCCL in this build and process
 * (KILN_DIST_NCCL=0 in the environment turns it off: staged over MPI). */
bool kiln_dist_nccl_enabled(void);
/* Launch w's collective on the communication stream of its device, after
 * the compute stream's work, keeping its tensors alive (record_stream);
 * records w->event. Makes the device's communicator at first use
 * (collective: the unique id is broadcast over MPI). */
kiln_status kiln_dist_nccl_start(kiln_dist_work *w, int root);
/* Never blocks: *done when w->event has completed; an NCCL asynchronous
 * error is returned (KILN_ERR_DEVICE, naming it) with *failed set. */
kiln_status kiln_dist_nccl_query(kiln_dist_work *w, bool *done, bool *failed);
/* ncclCommAbort the communicator of `device` (the watchdog: a dead or
 * stuck rank must never hang this one); later collectives on it fail. */
void kiln_dist_nccl_abort(kiln_dist_group *g, int device);
/* The compute stream waits for w's event. */
kiln_status kiln_dist_nccl_finish(kiln_dist_work *w);
/* Destroy g's communicators and streams (no work in flight). */
void kiln_dist_nccl_free(kiln_dist_group *g);

/* Free the SyncBatchNorm layers' configurations (kiln_dist_shutdown). */
void kiln_dist_sync_bn_free_all(void);

#if KILN_WITH_MPI
/* All-gather the ranks' processes into g->peers (collective, blocking). */
kiln_status kiln_dist_peers_exchange(kiln_dist_group *g);
/* How many other ranks of g have a process on this host that is gone
 * (exited, killed, a zombie); buf gets "rank 1 (pid 1234 on host)" for
 * each. Ranks on other hosts are never counted. Does not block. */
int kiln_dist_peers_lost(const kiln_dist_group *g, char *buf, size_t size);
#endif

#endif
