/* The NCCL and CUDA runtime calls of the NCCL process-group backend
 * (src/dist/nccl.c keeps the communicators, streams and events). Built
 * with the CUDA backend: against the real NCCL in the nvcc build
 * (KILN_WITH_NCCL; inside libkiln_cuda.so when the backend is a module,
 * which registers this table as it loads), against the emulator's
 * (src/emu/nccl.cpp) in the emulation build. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "dist/dist_internal.h"

#if KILN_DIST_NCCL
#include <cuda_runtime_api.h>
/* The real nccl.h declares `ncclGroupStart()` and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "runtime/cuda_device.h"

_Static_assert(sizeof(ncclUniqueId) == DIST_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");

static kiln_status nccl_fail(ncclResult_t r, const char *call, ncclComm_t comm) {
    const char *detail = ncclGetLastError(comm);
    return KILN_RAISE(KILN_ERR_DEVICE, NULL, "kiln_dist: %s failed: %s (NCCL error %d)%s%s", call,
                      ncclGetErrorString(r), (int)r, detail && *detail ? ": " : "", detail ? detail : "");
}

static ncclDataType_t nccl_type(kiln_dtype dt) {
    switch (dt) {
    case KILN_F32:
        return ncclFloat32;
    case KILN_F64:
        return ncclFloat64;
    case KILN_I32:
        return ncclInt32;
    default:
        return ncclInt64;
    }
}

static kiln_status unique_id(void *id) {
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)id);
    return r == ncclSuccess ? KILN_OK : nccl_fail(r, "ncclGetUniqueId", NULL);
}

static kiln_status comm_init(void **out, int device, int world, int rank, const void *id) {
    int previous = -1;
    if (kiln_cuda_device_switch(device, &previous) != KILN_OK) {
        return KILN_RAISE(KILN_ERR_DEVICE, NULL,
                          "kiln_dist: cannot make cuda:%d current for its NCCL communicator", device);
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, world, uid, rank);
    kiln_cuda_device_restore(device, previous);
    if (r != ncclSuccess) return nccl_fail(r, "ncclCommInitRank", comm);
    *out = comm;
    return KILN_OK;
}

static kiln_status launch(void *c, dist_kind kind, kiln_dist_reduce_op op, kiln_dtype dtype, const void *in,
                          void *out, size_t count, int root, void *stream) {
    ncclComm_t comm = c;
    cudaStream_t s = (cudaStream_t)stream;
    ncclDataType_t type = nccl_type(dtype);
    ncclRedOp_t rop = op == KILN_DIST_AVG ? ncclAvg : ncclSum;
    const char *call;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(r, "ncclGroupStart", comm);
    switch (kind) {
    case DIST_ALL_REDUCE:
        call = "ncclAllReduce";
        r = ncclAllReduce(out, out, count, type, rop, comm, s);
        break;
    case DIST_BROADCAST:
        call = "ncclBroadcast";
        r = ncclBroadcast(out, out, count, type, root, comm, s);
        break;
    case DIST_ALL_GATHER:
        call = "ncclAllGather";
        r = ncclAllGather(in, out, count, type, comm, s);
        break;
    case DIST_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        r = ncclReduceScatter(in, out, count, type, rop, comm, s);
        break;
    default:
        ncclGroupEnd();
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_dist: %s has no NCCL form",
                          kiln_dist_kind_name(kind));
    }
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_fail(r, call, comm);
    if (end != ncclSuccess) return nccl_fail(end, "ncclGroupEnd", comm);
    return KILN_OK;
}

static kiln_status async_error(void *c, int device, int rank, int world) {
    ncclComm_t comm = c;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess) async = r;
    if (async == ncclSuccess || async == ncclInProgress) return KILN_OK;
    const char *detail = ncclGetLastError(comm);
    return KILN_RAISE(
        KILN_ERR_DEVICE,
        "a rank that dies ends the job: its own output says why; restart from the last checkpoint",
        "kiln_dist: NCCL reports an asynchronous error on cuda:%d, rank %d of %d: %s (NCCL error %d)%s%s",
        device, rank, world, ncclGetErrorString(async), (int)async, detail && *detail ? ": " : "",
        detail ? detail : "");
}

static void comm_abort(void *c) { ncclCommAbort((ncclComm_t)c); }
static void comm_destroy(void *c) { ncclCommDestroy((ncclComm_t)c); }

static const dist_nccl_ops ops = {unique_id, comm_init, launch, async_error, comm_abort, comm_destroy};

const dist_nccl_ops *kiln_dist_nccl_cuda_ops(void) { return &ops; }

#if defined(KILN_CUDA_MODULE_SIDE)
/* Inside libkiln_cuda.so: hand the table to libkiln as the module loads. */
__attribute__((constructor)) static void register_ops(void) { kiln_dist_nccl_register(&ops); }
#endif

#endif
