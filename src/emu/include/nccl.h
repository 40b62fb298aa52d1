/* Kiln CUDA emulator: the NCCL calls Kiln makes (src/dist/nccl.c),
 * implemented by src/emu/nccl.cpp across the processes of one host through
 * POSIX shared memory, for CI without GPUs. The declarations, types and
 * values are NCCL 2.28's (nccl.h), so the same Kiln source compiles against
 * either; the real CUDA build links the real NCCL and never sees this file.
 * Valid C and C++. Only on the include path of the emulation build.
 *
 * What it does, in NCCL's terms:
 *   - ncclGetUniqueId names a shared-memory segment ("/kiln-nccl-...");
 *     ncclCommInitRank maps it, each rank writes its pid there and it
 *     blocks until all nranks have joined (then rank 0 unlinks the name:
 *     nothing is left in /dev/shm, even after a crash).
 *   - A collective is queued on the emulated `stream` like a kernel and
 *     runs there, in the order the host issued it on its communicator:
 *     chunks of at most 1 MiB per rank pass through the segment between
 *     two shared barriers. Sums run in rank order, so every rank gets the
 *     same bits. Types: ncclInt32, ncclInt64, ncclFloat32, ncclFloat64;
 *     ops: ncclSum, ncclAvg (floating types).
 *   - While a collective waits at a barrier it checks the other ranks'
 *     processes (/proc): one that is gone sets the communicator's async
 *     error to ncclRemoteError and ends the collective (its output is
 *     then undefined), as a lost connection does in NCCL.
 *     ncclCommGetAsyncError reads it; ncclCommAbort makes collectives in
 *     flight end at once and frees the communicator without waiting for the
 *     other ranks.
 *   - ncclGroupStart/End: calls between them are queued at the outermost
 *     ncclGroupEnd, in call order.
 * Not emulated: timing, bandwidth, NVLink/IB, ncclCommSplit, send/recv. */
#ifndef KILN_EMU_NCCL_H
#define KILN_EMU_NCCL_H

#include <stddef.h>

#include "driver_types.h"

#define NCCL_MAJOR        2
#define NCCL_MINOR        28
#define NCCL_PATCH        0
#define NCCL_VERSION_CODE 22800

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
/* Blocks until all nranks ranks called it with the same id (or one of
 * them is gone: ncclSystemError). The communicator belongs to the calling
 * thread's current device (cudaSetDevice). */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);
/* The last error's explanation ("" if none). */
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif
