/* Collectives on CUDA tensors through NCCL: one communicator per group and
 * device, made at the first collective on that device (rank 0's
 * ncclGetUniqueId broadcast over MPI, then ncclCommInitRank on the
 * device), and one communication stream per device.
 *
 * A collective is ordered after the work already queued on the device's
 * current (compute) stream -- the communication stream waits on an event
 * recorded there -- and launched between ncclGroupStart and ncclGroupEnd
 * on the communication stream. Its tensors are recorded on that stream
 * (kiln_record_stream), so the caching allocator does not hand their
 * memory out before the collective is done with it, whatever the caller
 * drops. An event recorded after it is what the work handle polls;
 * completion makes the compute stream wait on it.
 *
 * The watchdog (collectives.c) polls that event and ncclCommGetAsyncError;
 * on an asynchronous error, a lost rank or a timeout it calls
 * ncclCommAbort, which ends the collective in flight on this rank instead
 * of letting it wait forever for a peer that is gone. The communicator is
 * then unusable: later collectives on that device fail, naming why.
 *
 * The NCCL and CUDA calls themselves are in nccl_cuda.c (the CUDA side of
 * the build), behind a table of functions: the real NCCL (nvcc build,
 * KILN_WITH_NCCL) or the emulator's (src/emu/nccl.cpp, for CI). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dist/dist_internal.h"

static const dist_nccl_ops *registered_ops;

void kiln_dist_nccl_register(const dist_nccl_ops *ops) { registered_ops = ops; }

/* The CUDA side's table; NULL when this build or process has none. */
static const dist_nccl_ops *nccl_ops(void) {
#if KILN_DIST_NCCL && !defined(KILN_CUDA_MODULE)
    return kiln_dist_nccl_cuda_ops();
#else
    return registered_ops;
#endif
}

bool kiln_dist_nccl_enabled(void) {
    const char *e = getenv("KILN_DIST_NCCL");
    return nccl_ops() != NULL && !(e && !strcmp(e, "0"));
}

#include "runtime/runtime_internal.h"

const char *kiln_dist_backend(const kiln_dist_group *g, kiln_device device) {
    if (device.type == KILN_DEVICE_CUDA)
        return kiln_dist_nccl_enabled() ? "nccl" : "mpi, staged through pinned host memory";
#if KILN_WITH_MPI
    if (g && g->comm != MPI_COMM_NULL) return "mpi";
#endif
    (void)g;
    return "local";
}

#define DIST_NCCL_DEVICES 64

typedef struct nccl_dev {
    void *comm; /* an ncclComm_t */
    kiln_stream *stream;
    bool aborted;
    char why[1024]; /* why it was aborted */
} nccl_dev;

struct dist_nccl {
    nccl_dev dev[DIST_NCCL_DEVICES];
};

/* The communicator of `device`, made now if this is its first collective.
 * Collective over the group's ranks. */
static kiln_status get_dev(kiln_dist_group *g, int device, nccl_dev **out) {
    const dist_nccl_ops *ops = nccl_ops();
    if (!ops) return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_dist: NCCL is not in this build or process");
    if (device < 0 || device >= DIST_NCCL_DEVICES)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL,
                          "kiln_dist: cuda:%d is past the %d devices NCCL groups keep", device,
                          DIST_NCCL_DEVICES);
    if (!g->nccl) {
        g->nccl = KILN_CALLOC(1, sizeof *g->nccl);
        if (!g->nccl) return KILN_ERR_OUT_OF_MEMORY;
    }
    nccl_dev *d = &g->nccl->dev[device];
    if (d->aborted)
        return KILN_RAISE(
            KILN_ERR_STATE, "end the job and restart it from the last checkpoint",
            "kiln_dist: the NCCL communicator of cuda:%d on rank %d was aborted after an earlier "
            "error (%s); no collective can run on it",
            device, g->rank, d->why);
    if (d->comm) {
        *out = d;
        return KILN_OK;
    }
    unsigned char id[DIST_NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    if (g->rank == 0) KILN_TRY(ops->unique_id(id));
#if KILN_WITH_MPI
    if (g->world > 1) {
        MPI_Request req;
        int rc = MPI_Ibcast(id, (int)sizeof id, MPI_BYTE, 0, g->comm, &req);
        if (rc != MPI_SUCCESS)
            return KILN_RAISE(KILN_ERR_DEVICE, NULL,
                              "kiln_dist: MPI_Ibcast of the NCCL unique id failed (MPI error %d)", rc);
        bool timed_out = false;
        KILN_TRY(
            kiln_dist_wait_request(g, &req, g->timeout_s, "the broadcast of the NCCL unique id", &timed_out));
    }
#endif
    void *comm = NULL;
    KILN_TRY(ops->comm_init(&comm, device, g->world, g->rank, id));
    kiln_status st = kiln_stream_create((kiln_device){KILN_DEVICE_CUDA, device}, 0, &d->stream);
    if (st) {
        ops->destroy(comm);
        return st;
    }
    d->comm = comm;
    *out = d;
    return KILN_OK;
}

kiln_status kiln_dist_nccl_start(kiln_dist_work *w, int root) {
    kiln_dist_group *g = w->group;
    kiln_tensor *named = w->input ? w->input : w->buffer;
    int device = kiln_get_device(named).index;
    nccl_dev *d = NULL;
    KILN_TRY(get_dev(g, device, &d));
    kiln_device dev = {KILN_DEVICE_CUDA, device};
    kiln_stream *compute = kiln_current_stream(dev);
    KILN_TRY(kiln_stream_wait_stream(d->stream, compute));
    if (w->buffer) KILN_TRY(kiln_record_stream(w->buffer, d->stream));
    if (w->input) KILN_TRY(kiln_record_stream(w->input, d->stream));
    void *out = w->buffer ? kiln_data_ptr(w->buffer) : NULL;
    const void *in = w->input ? kiln_data_ptr(w->input) : out;
    size_t count = (size_t)kiln_numel(w->kind == DIST_ALL_GATHER ? w->input : w->buffer);
    KILN_TRY(nccl_ops()->launch(d->comm, w->kind, w->op, w->dtype, in, out, count, root,
                                kiln_stream_handle(d->stream)));
    KILN_TRY(kiln_event_create(dev, 0, &w->event));
    KILN_TRY(kiln_event_record(w->event, d->stream));
    w->nccl_device = device;
    return KILN_OK;
}

kiln_status kiln_dist_nccl_query(kiln_dist_work *w, bool *done, bool *failed) {
    *done = false, *failed = false;
    kiln_dist_group *g = w->group;
    nccl_dev *d = g->nccl ? &g->nccl->dev[w->nccl_device] : NULL;
    if (!d || !d->comm) {
        *failed = true;
        return KILN_RAISE(KILN_ERR_STATE, NULL,
                          "kiln_dist: the NCCL communicator of cuda:%d on rank %d is gone (%s)",
                          w->nccl_device, g->rank, d ? d->why : "never made");
    }
    /* The event first: a collective that an error ended early also
     * completes, and its error is set before that. */
    bool event_done = kiln_event_query(w->event);
    kiln_status st = nccl_ops()->async_error(d->comm, w->nccl_device, g->rank, g->world);
    if (st) {
        *failed = true;
        return st;
    }
    *done = event_done;
    return KILN_OK;
}

void kiln_dist_nccl_abort(kiln_dist_group *g, int device) {
    if (!g->nccl || device < 0 || device >= DIST_NCCL_DEVICES) return;
    nccl_dev *d = &g->nccl->dev[device];
    if (!d->comm) return;
    nccl_ops()->abort(d->comm);
    d->comm = NULL;
    d->aborted = true;
    memcpy(d->why, kiln_error_last()->message, sizeof d->why);
    d->why[sizeof d->why - 1] = 0;
}

kiln_status kiln_dist_nccl_finish(kiln_dist_work *w) {
    return kiln_stream_wait_event(kiln_current_stream((kiln_device){KILN_DEVICE_CUDA, w->nccl_device}),
                                  w->event);
}

void kiln_dist_nccl_free(kiln_dist_group *g) {
    if (!g->nccl) return;
    for (int i = 0; i < DIST_NCCL_DEVICES; i++) {
        nccl_dev *d = &g->nccl->dev[i];
        if (d->stream) kiln_stream_synchronize(d->stream);
        if (d->comm) nccl_ops()->destroy(d->comm);
        if (d->stream) kiln_stream_destroy(d->stream);
    }
    free(g->nccl);
    g->nccl = NULL;
}
