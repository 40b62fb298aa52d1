/* CUDA kernels of the shape and indexing ops: cat, gather, scatter_add,
 * constant pad, flip, embedding (+ backward), randperm. Semantics are the
 * CPU kernels' (kernels/cpu/ops_shape.c): moves copy elements bit for bit
 * (every dtype), sums run in double for floating dtypes and in int64 for
 * integer ones, in the CPU kernels' order, so results match them bit for
 * bit. No floating-point atomics anywhere:
 *   - scatter_add is a gather: each output element walks its index column
 *     in order and adds the sources that land on it;
 *   - embedding_backward sorts the index positions by row with a stable
 *     one-block counting sort (integer atomics only for the counts), then
 *     each (row, column) of the gradient sums its positions in order.
 *
 * gather, scatter_add and embedding check their indices the way the CPU
 * kernels do and raise the same error: a one-block kernel finds the first
 * bad index and the host reads it back, so these three ops wait for their
 * stream. embedding_backward does not (its indices passed the forward's
 * check); there an out-of-range index contributes nothing.
 *
 * randperm gives the CPU backend's permutation for the same rng: the CPU
 * kernel is Fisher-Yates from the top, step i swapping slot i with slot
 * j_i drawn from words 2i and 2i+1 of the Philox draw. The draws j_i are
 * computed in parallel; the swaps, which are sequential by nature, run on
 * one GPU thread (O(n) dependent memory accesses: fine for the sizes
 * randperm serves, data loader shuffles, but not a fast path). */
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/nn_common.h"

/* runtime/counters.h (C11 atomics, not includable from C++): a blocking
 * wait counts as a host synchronisation, seen by kiln's profiler. */
extern "C" uint64_t kiln_sync_enter(void);
extern "C" void kiln_sync_leave(const char *what, uint64_t start_ns);

namespace {

using kiln_cuda::offset_of;
using kiln_nn::copy_elem;
using kiln_nn::ldf;
using kiln_nn::ldi;
using kiln_nn::stf;
using kiln_nn::sti;
using kiln_nn::view;

#define GRID_STRIDE(i, total)                                                                                \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (total);                            \
         i += (int64_t)gridDim.x * blockDim.x)

int wrap(int dim, int ndim) { return dim < 0 ? dim + ndim : dim; }

/* ---- index checks ---- */

/* One block: the first (row-major) element of ix whose value lies outside
 * [0, limit); out[0] = its linear position or -1, out[1] = its value. */
__global__ void first_bad_index(view ixv, const void *ix, int dt, int64_t n, int64_t limit, int64_t *out) {
    KILN_DYNAMIC_SHARED(int64_t, best_s);
    int tid = (int)threadIdx.x;
    int64_t best = -1;
    for (int64_t i = tid; i < n; i += blockDim.x) {
        int64_t k = ldi(ix, dt, offset_of(ixv, i));
        if (k < 0 || k >= limit) {
            best = i;
            break;
        }
    }
    best_s[tid] = best;
    __syncthreads();
    if (tid == 0) {
        int64_t b = -1;
        for (int t = 0; t < (int)blockDim.x; t++)
            if (best_s[t] >= 0 && (b < 0 || best_s[t] < b)) b = best_s[t];
        out[0] = b;
        out[1] = b >= 0 ? ldi(ix, dt, offset_of(ixv, b)) : 0;
    }
}

/* Runs first_bad_index on `stream` and waits for its answer (this blocks
 * the host until the stream's earlier work is done). `scratch`: 16 bytes
 * of device memory. *bad = -1 when every index is in range, else the first
 * bad index's value goes to *value. */
kiln_status check_indices(int device, const kiln_strided *ix, int64_t limit, void *scratch, void *stream,
                          int64_t *bad, int64_t *value) {
    *bad = -1;
    int64_t n = kiln_cuda::element_count(ix);
    if (n == 0) return KILN_OK;
    if (!scratch)
        return KILN_RAISE(KILN_ERR_INTERNAL, "report this bug",
                          "CUDA index check: no workspace was given for its 16-byte result");
    view v = kiln_cuda::view_of(ix);
    KILN_LAUNCH(first_bad_index, 1, kiln_nn::kThreads, kiln_nn::kThreads * sizeof(int64_t), stream, v,
                (const void *)ix->data, (int)ix->dtype, n, limit, (int64_t *)scratch);
    KILN_LAUNCH_CHECK(device, "index check (first_bad_index)");
    int64_t host[2] = {-1, 0};
    uint64_t t0 = kiln_sync_enter();
    kiln_status st = KILN_CUDA_CHECK(
        device, cudaMemcpyAsync(host, scratch, sizeof host, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    if (st == KILN_OK) st = KILN_CUDA_CHECK(device, cudaStreamSynchronize((cudaStream_t)stream));
    kiln_sync_leave("CUDA index check", t0);
    if (st != KILN_OK) return st;
    *bad = host[0];
    *value = host[1];
    return KILN_OK;
}

size_t index_check_workspace(const kiln_op_args *a) {
    (void)a;
    return 2 * sizeof(int64_t);
}

/* ---- cat ---- */

/* y[base + offset of x's index i in y] = x[i]: yv has x's shape, y's strides. */
__global__ void copy_into(view xv, const void *x, view yv, void *y, int64_t base, int64_t n, int es) {
    GRID_STRIDE(i, n) { copy_elem(y, base + offset_of(yv, i), x, offset_of(xv, i), es); }
}

kiln_status run_cat(const kiln_op_args *a) {
    const kiln_strided *y = &a->out[0];
    if (kiln_cuda::element_count(y) == 0) return KILN_OK;
    int dim = wrap(a->attrs->dims[0], y->ndim);
    int es = (int)kiln_dtype_size(y->dtype);
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    int64_t at = 0;
    for (int i = 0; i < a->n_in; i++) {
        const kiln_strided *x = &a->in[i];
        if (x->ndim != y->ndim) continue; /* a legacy (0) operand */
        int64_t base = at * y->strides[dim];
        at += x->shape[dim];
        int64_t n = kiln_cuda::element_count(x);
        if (n == 0) continue;
        view xv = kiln_cuda::view_of(x), yv = kiln_nn::make_view(x->ndim, x->shape, y->strides);
        KILN_LAUNCH(copy_into, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream, xv,
                    (const void *)x->data, yv, y->data, base, n, es);
        KILN_LAUNCH_CHECK(guard.device, "cat (copy_into)");
    }
    return KILN_OK;
}

/* ---- gather ---- */

__global__ void gather_kernel(view xv, const void *x, view ixv, const void *ix, int idt, view yv, void *y,
                              int dim, int64_t n, int es) {
    GRID_STRIDE(i, n) {
        int64_t c[KILN_MAX_DIMS];
        kiln_nn::coords_of(yv.ndim, yv.shape, i, c);
        int64_t k = ldi(ix, idt, kiln_nn::dot_strides(ixv.ndim, ixv.strides, c));
        if (k < 0 || k >= xv.shape[dim]) continue; /* rejected by the check */
        int64_t xoff = kiln_nn::dot_strides(xv.ndim, xv.strides, c) + (k - c[dim]) * xv.strides[dim];
        copy_elem(y, kiln_nn::dot_strides(yv.ndim, yv.strides, c), x, xoff, es);
    }
}

kiln_status bad_index(const char *op, int64_t v, int dim, int64_t size) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "indices must lie in [0, size) of the indexed dim",
                      "%s: index %lld is out of bounds for dim %d of size %lld", op, (long long)v, dim,
                      (long long)size);
}

kiln_status run_gather(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    int64_t n = kiln_cuda::element_count(y);
    if (n == 0) return KILN_OK;
    int dim = wrap(a->attrs->dims[0], x->ndim);
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    int64_t bad, value = 0;
    KILN_TRY(check_indices(guard.device, ix, x->shape[dim], a->workspace, a->stream, &bad, &value));
    if (bad >= 0) return bad_index("kiln_gather", value, dim, x->shape[dim]);
    KILN_LAUNCH(gather_kernel, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream, kiln_cuda::view_of(x),
                (const void *)x->data, kiln_cuda::view_of(ix), (const void *)ix->data, (int)ix->dtype,
                kiln_cuda::view_of(y), y->data, dim, n, (int)kiln_dtype_size(y->dtype));
    KILN_LAUNCH_CHECK(guard.device, "gather (gather_kernel)");
    return KILN_OK;
}

/* ---- scatter_add ---- */

/* y[c] = self[c] + sum over t (ascending) of src[c'] where c' = c with
 * c'[dim] = t and ix[c'] == c[dim]. */
__global__ void scatter_add_kernel(view sv, const void *self, int sdt, view ixv, const void *ix, int idt,
                                   view srcv, const void *src, int srcdt, view yv, void *y, int ydt, int dim,
                                   int64_t n, bool fl) {
    GRID_STRIDE(i, n) {
        int64_t c[KILN_MAX_DIMS];
        kiln_nn::coords_of(yv.ndim, yv.shape, i, c);
        int64_t so = kiln_nn::dot_strides(sv.ndim, sv.strides, c),
                yo = kiln_nn::dot_strides(yv.ndim, yv.strides, c);
        bool covered = true;
        for (int d = 0; d < yv.ndim; d++)
            if (d != dim && c[d] >= ixv.shape[d]) covered = false;
        int64_t me = c[dim];
        if (fl) {
            double acc = ldf(self, sdt, so);
            if (covered)
                for (int64_t t = 0; t < ixv.shape[dim]; t++) {
                    c[dim] = t;
                    if (ldi(ix, idt, kiln_nn::dot_strides(ixv.ndim, ixv.strides, c)) == me)
                        acc += ldf(src, srcdt, kiln_nn::dot_strides(srcv.ndim, srcv.strides, c));
                }
            stf(y, ydt, yo, acc);
        } else {
            int64_t acc = ldi(self, sdt, so);
            if (covered)
                for (int64_t t = 0; t < ixv.shape[dim]; t++) {
                    c[dim] = t;
                    if (ldi(ix, idt, kiln_nn::dot_strides(ixv.ndim, ixv.strides, c)) == me)
                        acc = (int64_t)((uint64_t)acc +
                                        (uint64_t)ldi(src, srcdt,
                                                      kiln_nn::dot_strides(srcv.ndim, srcv.strides, c)));
                }
            sti(y, ydt, yo, acc);
        }
    }
}

kiln_status run_scatter_add(const kiln_op_args *a) {
    const kiln_strided *self = &a->in[0], *ix = &a->in[1], *src = &a->in[2], *y = &a->out[0];
    int64_t n = kiln_cuda::element_count(y);
    /* an index into an empty dim is still an error, as on the CPU */
    if (n == 0 && kiln_cuda::element_count(ix) == 0) return KILN_OK;
    int dim = wrap(a->attrs->dims[0], y->ndim);
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(n ? y->data : ix->data));
    int64_t bad, value = 0;
    KILN_TRY(check_indices(guard.device, ix, y->shape[dim], a->workspace, a->stream, &bad, &value));
    if (bad >= 0) return bad_index("kiln_scatter_add", value, dim, y->shape[dim]);
    if (n == 0) return KILN_OK;
    KILN_LAUNCH(scatter_add_kernel, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream,
                kiln_cuda::view_of(self), (const void *)self->data, (int)self->dtype, kiln_cuda::view_of(ix),
                (const void *)ix->data, (int)ix->dtype, kiln_cuda::view_of(src), (const void *)src->data,
                (int)src->dtype, kiln_cuda::view_of(y), y->data, (int)y->dtype, dim, n,
                kiln_dtype_is_floating(y->dtype));
    KILN_LAUNCH_CHECK(guard.device, "scatter_add (scatter_add_kernel)");
    return KILN_OK;
}

/* ---- pad, flip ---- */

struct dims8 {
    int64_t v[KILN_MAX_DIMS];
};

__global__ void pad_kernel(view xv, const void *x, view yv, void *y, int ydt, dims8 left, double value,
                           int64_t n, int es) {
    GRID_STRIDE(i, n) {
        int64_t c[KILN_MAX_DIMS];
        kiln_nn::coords_of(yv.ndim, yv.shape, i, c);
        int64_t xoff = 0;
        bool inside = true;
        for (int d = 0; d < yv.ndim && inside; d++) {
            int64_t j = c[d] - left.v[d];
            inside = j >= 0 && j < xv.shape[d];
            xoff += j * xv.strides[d];
        }
        int64_t yoff = kiln_nn::dot_strides(yv.ndim, yv.strides, c);
        if (inside)
            copy_elem(y, yoff, x, xoff, es);
        else
            stf(y, ydt, yoff, value);
    }
}

kiln_status run_pad(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    int64_t n = kiln_cuda::element_count(y);
    if (n == 0) return KILN_OK;
    dims8 left;
    memset(&left, 0, sizeof left);
    for (int p = 0; p < a->attrs->n_ints / 2 && p < y->ndim; p++)
        left.v[y->ndim - 1 - p] = a->attrs->ints[2 * p];
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    KILN_LAUNCH(pad_kernel, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream, kiln_cuda::view_of(x),
                (const void *)x->data, kiln_cuda::view_of(y), y->data, (int)y->dtype, left,
                a->attrs->scalar[0], n, (int)kiln_dtype_size(y->dtype));
    KILN_LAUNCH_CHECK(guard.device, "pad (pad_kernel)");
    return KILN_OK;
}

__global__ void flip_kernel(view xv, const void *x, view yv, void *y, unsigned mask, int64_t n, int es) {
    GRID_STRIDE(i, n) {
        int64_t c[KILN_MAX_DIMS];
        kiln_nn::coords_of(yv.ndim, yv.shape, i, c);
        int64_t xoff = 0;
        for (int d = 0; d < xv.ndim; d++)
            xoff += ((mask >> d) & 1u ? xv.shape[d] - 1 - c[d] : c[d]) * xv.strides[d];
        copy_elem(y, kiln_nn::dot_strides(yv.ndim, yv.strides, c), x, xoff, es);
    }
}

kiln_status run_flip(const kiln_op_args *a) {
    const kiln_strided *x = &a->in[0], *y = &a->out[0];
    int64_t n = kiln_cuda::element_count(y);
    if (n == 0) return KILN_OK;
    unsigned mask = 0;
    for (int i = 0; i < a->attrs->n_dims; i++) {
        int d = wrap(a->attrs->dims[i], x->ndim);
        if (d >= 0 && d < KILN_MAX_DIMS) mask |= 1u << d;
    }
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    KILN_LAUNCH(flip_kernel, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream, kiln_cuda::view_of(x),
                (const void *)x->data, kiln_cuda::view_of(y), y->data, mask, n,
                (int)kiln_dtype_size(y->dtype));
    KILN_LAUNCH_CHECK(guard.device, "flip (flip_kernel)");
    return KILN_OK;
}

/* ---- embedding ---- */

/* y (ix..., D) = w[ix[...], :]; yv/gv: ix's shape with y's strides. */
__global__ void embedding_kernel(view ixv, const void *ix, int idt, const void *w, int64_t V, int64_t ws0,
                                 int64_t ws1, view yv, int64_t ylast, void *y, int64_t D, int64_t n, int es) {
    GRID_STRIDE(i, n) {
        int64_t j = i / D, d = i % D;
        int64_t k = ldi(ix, idt, offset_of(ixv, j));
        if (k < 0 || k >= V) continue; /* rejected by the check */
        copy_elem(y, offset_of(yv, j) + d * ylast, w, k * ws0 + d * ws1, es);
    }
}

kiln_status run_embedding(const kiln_op_args *a) {
    const kiln_strided *w = &a->in[0], *ix = &a->in[1], *y = &a->out[0];
    int64_t V = w->shape[0], D = w->shape[1], m = kiln_cuda::element_count(ix), n = m * D;
    if (m == 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(n ? y->data : ix->data)); /* D == 0: the indices are still checked */
    int64_t bad, value = 0;
    KILN_TRY(check_indices(guard.device, ix, V, a->workspace, a->stream, &bad, &value));
    if (bad >= 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "indices must lie in [0, num_embeddings)",
                          "kiln_embedding: index %lld is out of range for a table of %lld rows",
                          (long long)value, (long long)V);
    if (n == 0) return KILN_OK;
    view yv = kiln_nn::make_view(ix->ndim, ix->shape, y->strides);
    KILN_LAUNCH(embedding_kernel, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream,
                kiln_cuda::view_of(ix), (const void *)ix->data, (int)ix->dtype, (const void *)w->data, V,
                w->strides[0], w->strides[1], yv, y->strides[ix->ndim], y->data, D, n,
                (int)kiln_dtype_size(y->dtype));
    KILN_LAUNCH_CHECK(guard.device, "embedding (embedding_kernel)");
    return KILN_OK;
}

/* One block: order[] = the positions of ix with a valid row, sorted by row
 * and, within a row, by position (stable counting sort); start[v] ..
 * start[v + 1] are row v's. cursor: V ints of scratch. */
__global__ void embedding_sort(view ixv, const void *ix, int idt, int64_t m, int64_t V, int *start,
                               int *cursor, int *order) {
    KILN_DYNAMIC_SHARED(int64_t, sh); /* [blockDim] keys, then [blockDim] partial sums */
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    int64_t *keys = sh, *part = sh + nt;
    for (int64_t v = tid; v < V; v += nt) cursor[v] = 0;
    __syncthreads();
    for (int64_t i = tid; i < m; i += nt) {
        int64_t k = ldi(ix, idt, offset_of(ixv, i));
        if (k >= 0 && k < V) atomicAdd(&cursor[k], 1);
    }
    __syncthreads();
    /* exclusive scan of the counts: thread t owns rows [t*per, (t+1)*per) */
    int64_t per = (V + nt - 1) / nt, lo = tid * per, hi = lo + per < V ? lo + per : V;
    int64_t s = 0;
    for (int64_t v = lo; v < hi; v++) s += cursor[v];
    part[tid] = s;
    __syncthreads();
    if (tid == 0) {
        int64_t run = 0;
        for (int t = 0; t < nt; t++) {
            int64_t c = part[t];
            part[t] = run;
            run += c;
        }
        start[V] = (int)run;
    }
    __syncthreads();
    s = part[tid];
    for (int64_t v = lo; v < hi; v++) {
        int c = cursor[v];
        start[v] = (int)s;
        cursor[v] = (int)s;
        s += c;
    }
    __syncthreads();
    /* stable fill, one tile of nt positions at a time */
    for (int64_t t0 = 0; t0 < m; t0 += nt) {
        int64_t i = t0 + tid, k = -1;
        if (i < m) {
            k = ldi(ix, idt, offset_of(ixv, i));
            if (k < 0 || k >= V) k = -1;
        }
        keys[tid] = k;
        __syncthreads();
        int rank = 0;
        bool last = true;
        if (k >= 0) {
            for (int j = 0; j < tid; j++) rank += keys[j] == k;
            for (int j = tid + 1; j < nt; j++)
                if (keys[j] == k) {
                    last = false;
                    break;
                }
            order[cursor[k] + rank] = (int)i;
        }
        __syncthreads();
        if (k >= 0 && last) cursor[k] += rank + 1;
        __syncthreads();
    }
}

/* dw[v, d] = sum over row v's positions p (ascending) of go[p, d], in double. */
__global__ void embedding_accumulate(const int *start, const int *order, view gv, int64_t glast,
                                     const void *go, int gdt, void *dw, int ddt, int64_t ds0, int64_t ds1,
                                     int64_t V, int64_t D) {
    GRID_STRIDE(i, V * D) {
        int64_t v = i / D, d = i % D;
        double acc = 0;
        for (int j = start[v]; j < start[v + 1]; j++)
            acc += ldf(go, gdt, offset_of(gv, order[j]) + d * glast);
        stf(dw, ddt, v * ds0 + d * ds1, acc);
    }
}

size_t embedding_backward_workspace(const kiln_op_args *a) {
    int64_t V = a->out[0].shape[0], m = kiln_cuda::element_count(&a->in[1]);
    return (size_t)(2 * V + 1 + m) * sizeof(int);
}

kiln_status run_embedding_backward(const kiln_op_args *a) {
    const kiln_strided *go = &a->in[0], *ix = &a->in[1], *dw = &a->out[0];
    int64_t V = dw->shape[0], D = dw->shape[1], m = kiln_cuda::element_count(ix);
    if (V * D == 0) return KILN_OK;
    if (m >= 2147483647 || V >= 2147483647)
        return KILN_RAISE(
            KILN_ERR_UNSUPPORTED, "split the batch",
            "embedding_backward: %lld indices or %lld rows exceed the CUDA kernel's 32-bit counters",
            (long long)m, (long long)V);
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(dw->data));
    int *start = (int *)a->workspace, *cursor = start + V + 1;
    int *order = m > 0 ? cursor + V : cursor; /* never one past the workspace's end */
    KILN_LAUNCH(embedding_sort, 1, kiln_nn::kThreads, 2 * kiln_nn::kThreads * sizeof(int64_t), a->stream,
                kiln_cuda::view_of(ix), (const void *)ix->data, (int)ix->dtype, m, V, start, cursor, order);
    KILN_LAUNCH_CHECK(guard.device, "embedding_backward (embedding_sort)");
    view gv = kiln_nn::make_view(ix->ndim, ix->shape, go->strides);
    KILN_LAUNCH(embedding_accumulate, kiln_nn::blocks_for(V * D), kiln_nn::kThreads, 0, a->stream,
                (const int *)start, (const int *)order, gv, go->strides[ix->ndim], (const void *)go->data,
                (int)go->dtype, dw->data, (int)dw->dtype, dw->strides[0], dw->strides[1], V, D);
    KILN_LAUNCH_CHECK(guard.device, "embedding_backward (embedding_accumulate)");
    return KILN_OK;
}

/* ---- randperm ---- */

/* In parallel: p[i] = i, and the slot j[i] that step i of Fisher-Yates
 * swaps with, from words 2i and 2i+1 of the draw (one Philox block). */
__global__ void randperm_draws(int64_t *p, int64_t n, int64_t st, int64_t *js, kiln_rng rng) {
    GRID_STRIDE(i, n) {
        p[i * st] = i;
        if (i == 0) continue;
        uint32_t w[4];
        uint64_t word = 2 * (uint64_t)i;
        kiln_philox_stream_block(rng.seed, rng.subsequence, rng.offset + word / 4, w);
        uint64_t r = ((uint64_t)w[word % 4] << 32) | w[word % 4 + 1];
        js[i] = (int64_t)(r % (uint64_t)(i + 1));
    }
}

/* The swaps themselves are sequential: one thread, from the top. */
__global__ void randperm_swaps(int64_t *p, int64_t n, int64_t st, const int64_t *js) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = js[i];
        int64_t t = p[i * st];
        p[i * st] = p[j * st];
        p[j * st] = t;
    }
}

size_t randperm_workspace(const kiln_op_args *a) { return (size_t)a->out[0].shape[0] * sizeof(int64_t); }

kiln_status run_randperm(const kiln_op_args *a) {
    const kiln_strided *y = &a->out[0];
    int64_t n = y->shape[0];
    if (n <= 0) return KILN_OK;
    kiln_cuda::device_guard guard;
    KILN_TRY(guard.enter(y->data));
    int64_t *js = (int64_t *)a->workspace;
    KILN_LAUNCH(randperm_draws, kiln_nn::blocks_for(n), kiln_nn::kThreads, 0, a->stream, (int64_t *)y->data,
                n, y->strides[0], js, a->attrs->rng);
    KILN_LAUNCH_CHECK(guard.device, "randperm (randperm_draws)");
    KILN_LAUNCH(randperm_swaps, 1, 1, 0, a->stream, (int64_t *)y->data, n, y->strides[0],
                (const int64_t *)js);
    KILN_LAUNCH_CHECK(guard.device, "randperm (randperm_swaps)");
    return KILN_OK;
}

} // namespace

/* The exported kernels (cuda_ops.h); src/ops/cuda_table_nn_cuda.c points
 * the table at them. */
extern "C" kiln_status kiln_cuda_cat(const kiln_op_args *a) { return run_cat(a); }
extern "C" kiln_status kiln_cuda_gather(const kiln_op_args *a) { return run_gather(a); }
extern "C" kiln_status kiln_cuda_scatter_add(const kiln_op_args *a) { return run_scatter_add(a); }
extern "C" kiln_status kiln_cuda_pad(const kiln_op_args *a) { return run_pad(a); }
extern "C" kiln_status kiln_cuda_flip(const kiln_op_args *a) { return run_flip(a); }
extern "C" kiln_status kiln_cuda_embedding(const kiln_op_args *a) { return run_embedding(a); }
extern "C" kiln_status kiln_cuda_embedding_backward(const kiln_op_args *a) {
    return run_embedding_backward(a);
}
extern "C" kiln_status kiln_cuda_randperm(const kiln_op_args *a) { return run_randperm(a); }
extern "C" size_t kiln_cuda_index_check_workspace(const kiln_op_args *a) { return index_check_workspace(a); }
extern "C" size_t kiln_cuda_embedding_backward_workspace(const kiln_op_args *a) {
    return embedding_backward_workspace(a);
}
extern "C" size_t kiln_cuda_randperm_workspace(const kiln_op_args *a) { return randperm_workspace(a); }
