/* Kiln CUDA emulator: NCCL across the processes of one host through POSIX
 * shared memory (include/nccl.h says what is emulated). For CI only: the
 * real CUDA build links NCCL itself and compiles none of this.
 *
 * The segment: a header (join count, barrier count, each rank's pid), then
 * one slot of kSlot bytes per rank. Every collective moves its data in
 * rounds; a round is
 *   1. each rank writes its part into its own slot,
 *   2. barrier,
 *   3. each rank reads what it needs from the slots (sums in rank order),
 *   4. barrier (the slots may be written again).
 * The barrier is one counter that only grows: the k-th barrier of the
 * communicator is passed once it reaches k * nranks. A rank waiting there
 * sleeps in growing steps (up to 1 ms) and looks every 50 ms whether the
 * other ranks' processes still exist. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "include/nccl.h"
#include "streams_internal.h"

namespace {

using namespace kiln_emu;

constexpr size_t kSlot = (size_t)1 << 20;
constexpr int kMaxRanks = 256;
constexpr size_t kHeader = 4096;
constexpr double kJoinTimeoutS = 120.0;

struct shm_header {
    std::atomic<uint64_t> joined;
    std::atomic<uint64_t> arrived;
    int32_t pids[kMaxRanks];
};
static_assert(sizeof(shm_header) <= kHeader, "the header fits its page");

struct comm_impl {
    int rank = 0, nranks = 0, device = 0;
    char name[NCCL_UNIQUE_ID_BYTES] = "";
    shm_header *hdr = nullptr;
    unsigned char *base = nullptr;
    size_t map_size = 0;
    uint64_t barriers = 0; /* touched only by the collective running now */
    std::atomic<int> async_error{ncclSuccess};
    std::atomic<bool> aborted{false};
    std::mutex m;
    std::condition_variable cv;
    uint64_t issued = 0, next_run = 0; /* tickets: collectives run in issue order */
    char last_error[256] = "";

    ~comm_impl() {
        if (base) munmap(base, map_size);
    }
    unsigned char *slot(int r) { return base + kHeader + (size_t)r * kSlot; }
};
using comm_ptr = std::shared_ptr<comm_impl>;

} // namespace

struct ncclComm {
    comm_ptr impl;
};

namespace {

thread_local char tls_last[256];

void set_last(comm_impl *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void set_last(comm_impl *c, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    snprintf(tls_last, sizeof tls_last, "%s", buf);
    if (c) {
        std::lock_guard<std::mutex> lock(c->m);
        snprintf(c->last_error, sizeof c->last_error, "%s", buf);
    }
}

/* The process is gone: no such pid, or a zombie. */
bool pid_gone(int32_t pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* A rank other than c->rank whose process is gone, or -1. */
int lost_rank(comm_impl *c) {
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && pid_gone(c->hdr->pids[r])) return r;
    return -1;
}

void nap(long *ns) {
    struct timespec ts = {0, *ns};
    nanosleep(&ts, nullptr);
    if (*ns < 1000000) *ns *= 2;
}

/* The communicator's next barrier. false: aborted, or a rank is gone (the
 * async error is set). */
bool barrier(comm_impl *c) {
    uint64_t target = ++c->barriers * (uint64_t)c->nranks;
    c->hdr->arrived.fetch_add(1);
    long ns = 1000;
    auto last_check = clock_type::now();
    while (c->hdr->arrived.load() < target) {
        if (c->aborted.load()) return false;
        if (std::chrono::duration<double>(clock_type::now() - last_check).count() > 0.05) {
            last_check = clock_type::now();
            int r = lost_rank(c);
            if (r >= 0) {
                set_last(c,
                         "NCCL (emulated): rank %d (pid %d) of the communicator is gone: its process exited",
                         r, (int)c->hdr->pids[r]);
                c->async_error.store(ncclRemoteError);
                return false;
            }
        }
        nap(&ns);
    }
    return true;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* dst[i] = sum over ranks of their slot at `off` (rank order), / nranks for avg. */
template <typename T> void reduce_slots(comm_impl *c, size_t off, size_t n, T *dst, bool avg) {
    for (size_t i = 0; i < n; i++) {
        T s = ((const T *)(c->slot(0) + off))[i];
        for (int r = 1; r < c->nranks; r++) s += ((const T *)(c->slot(r) + off))[i];
        dst[i] = avg ? (T)(s / (T)c->nranks) : s;
    }
}

void reduce_any(comm_impl *c, ncclDataType_t t, size_t off, size_t n, void *dst, bool avg) {
    switch (t) {
    case ncclInt32:
        reduce_slots<int32_t>(c, off, n, (int32_t *)dst, false);
        break;
    case ncclInt64:
        reduce_slots<int64_t>(c, off, n, (int64_t *)dst, false);
        break;
    case ncclFloat32:
        reduce_slots<float>(c, off, n, (float *)dst, avg);
        break;
    default:
        reduce_slots<double>(c, off, n, (double *)dst, avg);
        break;
    }
}

enum coll_kind { COLL_ALL_REDUCE, COLL_BROADCAST, COLL_ALL_GATHER, COLL_REDUCE_SCATTER };

struct coll {
    coll_kind kind;
    const unsigned char *send;
    unsigned char *recv;
    size_t count; /* all_reduce, broadcast: elements; all_gather: sendcount; reduce_scatter: recvcount */
    ncclDataType_t type;
    bool avg;
    int root;
};

/* The collective's rounds; false when it ended early (abort, lost rank). */
bool run(comm_impl *c, const coll &k) {
    size_t es = type_size(k.type), n = c->nranks;
    switch (k.kind) {
    case COLL_ALL_REDUCE:
    case COLL_BROADCAST:
    case COLL_ALL_GATHER: {
        size_t per = kSlot / es, total = k.count;
        for (size_t off = 0; off < total || (off == 0 && total == 0); off += per) {
            size_t len = total - off < per ? total - off : per, bytes = len * es;
            if (k.kind != COLL_BROADCAST || c->rank == k.root)
                memcpy(c->slot(c->rank), k.send + off * es, bytes);
            if (!barrier(c)) return false;
            if (k.kind == COLL_ALL_REDUCE)
                reduce_any(c, k.type, 0, len, k.recv + off * es, k.avg);
            else if (k.kind == COLL_BROADCAST)
                memmove(k.recv + off * es, c->slot(k.root), bytes);
            else
                for (size_t r = 0; r < n; r++)
                    memcpy(k.recv + (r * total + off) * es, c->slot((int)r), bytes);
            if (!barrier(c)) return false;
            if (total == 0) break;
        }
        return true;
    }
    case COLL_REDUCE_SCATTER: {
        size_t per = kSlot / n / es, total = k.count;
        for (size_t off = 0; off < total; off += per) {
            size_t len = total - off < per ? total - off : per;
            for (size_t d = 0; d < n; d++)
                memcpy(c->slot(c->rank) + d * per * es, k.send + (d * total + off) * es, len * es);
            if (!barrier(c)) return false;
            reduce_any(c, k.type, (size_t)c->rank * per * es, len, k.recv + off * es, k.avg);
            if (!barrier(c)) return false;
        }
        return true;
    }
    }
    return false;
}

/* Calls between ncclGroupStart and the outermost ncclGroupEnd, queued at the end. */
thread_local int tls_group_depth;
thread_local std::vector<std::function<void()>> tls_group_pending;

ncclResult_t check_buffer(comm_impl *c, const char *call, const char *which, const void *p, size_t bytes) {
    if (bytes == 0) return ncclSuccess;
    alloc_info a;
    if (!find_alloc(p, &a) || a.kind != ALLOC_DEVICE) {
        set_last(c, "%s: %s %p is not device memory (cudaMalloc)", call, which, p);
        return ncclInvalidArgument;
    }
    if ((uintptr_t)p + bytes > a.base + a.size) {
        set_last(c, "%s: %s runs %zu bytes past the end of its allocation", call, which,
                 (size_t)((uintptr_t)p + bytes - (a.base + a.size)));
        return ncclInvalidArgument;
    }
    if (a.device != c->device) {
        set_last(c, "%s: %s is on device %d but the communicator is on device %d", call, which, a.device,
                 c->device);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t submit(const char *call, ncclComm_t comm, cudaStream_t stream, coll k, size_t send_elems,
                    size_t recv_elems, ncclRedOp_t op) {
    if (!comm || !comm->impl) {
        set_last(nullptr, "%s: the communicator is NULL or destroyed", call);
        return ncclInvalidArgument;
    }
    comm_impl *c = comm->impl.get();
    size_t es = type_size(k.type);
    if (!es) {
        set_last(c, "%s: data type %d is not emulated (int32, int64, float32, float64 are)", call,
                 (int)k.type);
        return ncclInvalidArgument;
    }
    if (op != ncclSum && op != ncclAvg) {
        set_last(c, "%s: reduction op %d is not emulated (ncclSum, ncclAvg are)", call, (int)op);
        return ncclInvalidArgument;
    }
    if (op == ncclAvg && (k.type == ncclInt32 || k.type == ncclInt64)) {
        set_last(c, "%s: ncclAvg of an integer type is not emulated", call);
        return ncclInvalidArgument;
    }
    if (k.kind == COLL_BROADCAST && (k.root < 0 || k.root >= c->nranks)) {
        set_last(c, "%s: root %d is not a rank of %d", call, k.root, c->nranks);
        return ncclInvalidArgument;
    }
    k.avg = op == ncclAvg;
    bool sends = k.kind != COLL_BROADCAST || c->rank == k.root;
    ncclResult_t r = sends ? check_buffer(c, call, "sendbuff", k.send, send_elems * es) : ncclSuccess;
    if (r == ncclSuccess) r = check_buffer(c, call, "recvbuff", k.recv, recv_elems * es);
    if (r != ncclSuccess) return r;
    if (c->aborted.load()) {
        set_last(c, "%s: the communicator was aborted", call);
        return ncclInvalidUsage;
    }
    cudaError_t err;
    stream_ptr s = resolve_stream(stream, &err);
    if (!s) {
        set_last(c, "%s: unknown stream %p", call, (void *)stream);
        return ncclInvalidArgument;
    }
    if (s->device != c->device) {
        set_last(c, "%s: the stream is on device %d but the communicator is on device %d", call, s->device,
                 c->device);
        return ncclInvalidArgument;
    }
    comm_ptr keep = comm->impl;
    uint64_t ticket;
    {
        std::lock_guard<std::mutex> lock(c->m);
        ticket = c->issued++;
    }
    auto queue = [s, keep, ticket, k] {
        stream_op sop;
        sop.fn = [keep, ticket, k] {
            comm_impl *ci = keep.get();
            {
                std::unique_lock<std::mutex> lock(ci->m);
                while (ci->next_run != ticket && !ci->aborted.load())
                    ci->cv.wait_for(lock, std::chrono::milliseconds(50));
            }
            if (!ci->aborted.load() && ci->async_error.load() == ncclSuccess) run(ci, k);
            std::lock_guard<std::mutex> lock(ci->m);
            if (ci->next_run == ticket) ci->next_run++;
            ci->cv.notify_all();
        };
        enqueue(s, std::move(sop));
    };
    if (tls_group_depth > 0)
        tls_group_pending.push_back(queue);
    else
        queue();
    return ncclSuccess;
}

/* Release one communicator handle: abort makes its collectives in flight end first. */
ncclResult_t release(ncclComm_t comm, bool abort) {
    if (!comm) return ncclInvalidArgument;
    if (abort && comm->impl) {
        comm->impl->aborted.store(true);
        comm->impl->cv.notify_all();
    }
    delete comm; /* the segment is unmapped once its last queued collective has run */
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    static std::atomic<unsigned> counter{0};
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(id->internal, sizeof id->internal, "/kiln-nccl-%d-%u-%lld", (int)getpid(), counter.fetch_add(1),
             (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out) return ncclInvalidArgument;
    *out = nullptr;
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        set_last(nullptr, "ncclCommInitRank: rank %d of %d ranks (the emulation takes 1 to %d)", rank, nranks,
                 kMaxRanks);
        return ncclInvalidArgument;
    }
    id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
    if (strncmp(id.internal, "/kiln-nccl-", 11) != 0) {
        set_last(nullptr, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    auto c = std::make_shared<comm_impl>();
    c->rank = rank, c->nranks = nranks, c->device = tls_device;
    snprintf(c->name, sizeof c->name, "%s", id.internal);
    c->map_size = kHeader + (size_t)nranks * kSlot;
    int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->map_size) != 0) {
        set_last(nullptr, "ncclCommInitRank: shared memory %s: %s", c->name, strerror(errno));
        if (fd >= 0) close(fd);
        return ncclSystemError;
    }
    void *p = mmap(nullptr, c->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        set_last(nullptr, "ncclCommInitRank: mmap of %s: %s", c->name, strerror(errno));
        return ncclSystemError;
    }
    c->base = (unsigned char *)p;
    c->hdr = (shm_header *)p;
    c->hdr->pids[rank] = (int32_t)getpid();
    c->hdr->joined.fetch_add(1);
    auto start = clock_type::now();
    long ns = 1000;
    while (c->hdr->joined.load() < (uint64_t)nranks) {
        double waited = std::chrono::duration<double>(clock_type::now() - start).count();
        int lost = lost_rank(c.get());
        if (lost >= 0 || waited > kJoinTimeoutS) {
            if (lost >= 0)
                set_last(nullptr,
                         "ncclCommInitRank: rank %d (pid %d) is gone before the communicator was made", lost,
                         (int)c->hdr->pids[lost]);
            else
                set_last(nullptr, "ncclCommInitRank: %llu of %d ranks joined within %.0f s",
                         (unsigned long long)c->hdr->joined.load(), nranks, kJoinTimeoutS);
            if (rank == 0) shm_unlink(c->name);
            return ncclSystemError;
        }
        nap(&ns);
    }
    if (rank == 0) shm_unlink(c->name);
    *out = new ncclComm{c};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, false); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, true); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !comm->impl || !err) return ncclInvalidArgument;
    *err = (ncclResult_t)comm->impl->async_error.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !comm->impl || !count) return ncclInvalidArgument;
    *count = comm->impl->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !comm->impl || !rank) return ncclInvalidArgument;
    *rank = comm->impl->rank;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error";
    case ncclSystemError:
        return "unhandled system error";
    case ncclInternalError:
        return "internal error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInvalidUsage:
        return "invalid usage";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    if (comm && comm->impl) {
        std::lock_guard<std::mutex> lock(comm->impl->m);
        if (comm->impl->last_error[0]) snprintf(tls_last, sizeof tls_last, "%s", comm->impl->last_error);
    }
    return tls_last;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    coll k{COLL_ALL_REDUCE, (const unsigned char *)send, (unsigned char *)recv, count, type, false, 0};
    return submit("ncclAllReduce", comm, stream, k, count, count, op);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    coll k{COLL_BROADCAST, (const unsigned char *)send, (unsigned char *)recv, count, type, false, root};
    return submit("ncclBroadcast", comm, stream, k, count, count, ncclSum);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    coll k{COLL_ALL_GATHER, (const unsigned char *)send, (unsigned char *)recv, sendcount, type, false, 0};
    int n = comm && comm->impl ? comm->impl->nranks : 1;
    return submit("ncclAllGather", comm, stream, k, sendcount, sendcount * (size_t)n, ncclSum);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    coll k{
        COLL_REDUCE_SCATTER, (const unsigned char *)send, (unsigned char *)recv, recvcount, type, false, 0};
    int n = comm && comm->impl ? comm->impl->nranks : 1;
    return submit("ncclReduceScatter", comm, stream, k, recvcount * (size_t)n, recvcount, op);
}

ncclResult_t ncclGroupStart(void) {
    tls_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (tls_group_depth <= 0) {
        set_last(nullptr, "ncclGroupEnd without ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--tls_group_depth == 0) {
        std::vector<std::function<void()>> pending;
        pending.swap(tls_group_pending);
        for (auto &q : pending) q();
    }
    return ncclSuccess;
}

} // extern "C"
