/* Distributed data parallel: buckets of gradients all-reduced while
 * backward runs (PyTorch's DistributedDataParallel, reference/
 * pytorch-semantics.md §5).
 *
 * Parameters are assigned to buckets in reverse order (the order backward
 * tends to produce their gradients), the first bucket capped at
 * first_bucket_mb and the others at bucket_cap_mb. Each parameter has a
 * post-accumulate hook; when the last parameter of a bucket reports, the
 * bucket's gradients (times this rank's sample count) are copied into its
 * flat buffer and its all-reduce (SUM) starts. Buckets start strictly in
 * index order, so every rank issues the same collectives in the same order
 * whatever order its gradients arrive in. Each flat buffer ends with one
 * extra element holding the rank's sample count: after the SUM it is the
 * total, and finish divides by it, which gives the sample-weighted average
 * without a separate collective. After the first synchronised step the
 * buckets are rebuilt in the order rank 0's gradients arrived in
 * (PyTorch's rebuild_buckets). On a CUDA device the flat buffers live
 * there and are filled and read back with device ops; the all-reduces go
 * through NCCL (nccl.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/clock.h"
#include "base/error.h"
#include "dist/dist_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define DDP_MAX_SAMPLES (1 << 20) /* sums of counts stay exact in f32 */

typedef struct ddp_param {
    struct kiln_ddp *owner;
    int index;
    kiln_tensor *tensor; /* own reference */
    char *name;
    int bucket;
    int64_t offset; /* in elements, in the bucket's flat buffer */
    int64_t numel;
    bool ready; /* its gradient arrived in this backward */
} ddp_param;

typedef struct ddp_bucket {
    kiln_tensor *flat; /* (numel + 1): the gradients, then the sample count */
    int *members;      /* parameter indices */
    int n_members;
    int pending; /* members whose gradient has not arrived */
    kiln_dtype dtype;
    kiln_dist_work *work; /* its all-reduce once started */
} ddp_bucket;

struct kiln_ddp {
    kiln_module *module;
    kiln_device device; /* of every parameter: CPU, or one CUDA device (NCCL) */
    kiln_dist_group *group;
    kiln_ddp_opts opts;
    ddp_param *params;
    int n_params;
    ddp_bucket *buckets;
    int n_buckets;
    kiln_tensor **buffers; /* own references */
    int n_buffers;
    int next_start; /* the next bucket to start (buckets start in order) */
    bool sync;
    bool broken; /* a wait timed out: work is stuck in flight */
    double samples;
    /* The backward in progress (reset by finish). */
    bool backward_open;
    int twice;            /* a parameter whose hook fired twice, or -1 */
    kiln_status deferred; /* an error raised inside a hook */
    bool deferred_failed; /* it is a started all-reduce's failure, not a start's */
    char deferred_msg[1024];
    kiln_ddp_stats stats;
    /* Bucket rebuild (PyTorch's rebuild_buckets): the order the gradients
     * arrived in during the first synchronised backward. */
    int *arrival;
    int n_arrived;
    bool rebuilt;
};

static void ddp_hook(kiln_tensor *leaf, void *user);

/* Raise a saved error again (after calls that may have replaced it). */
static kiln_status restore_error(const kiln_error *e) {
    return kiln_error_raise(e->status, e->file, e->line, e->hint[0] ? e->hint : NULL, "%s", e->message);
}

kiln_ddp_opts kiln_ddp_opts_default(void) {
    return (kiln_ddp_opts){.bucket_cap_mb = 25.0,
                           .first_bucket_mb = 1.0,
                           .find_unused_parameters = false,
                           .broadcast_buffers = true};
}

/* ---- Wrap: the ranks agree on the model ------------------------------------------------- */

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* One line per parameter and buffer: "param fc.weight f32 [10, 32]\n". */
static char *describe_model(const kiln_named_tensor *p, int np, const kiln_named_tensor *b, int nb,
                            size_t *len) {
    size_t cap = 256, used = 0;
    char *text = KILN_MALLOC(cap);
    if (!text) return NULL;
    text[0] = 0;
    for (int i = 0; i < np + nb; i++) {
        const kiln_named_tensor *t = i < np ? &p[i] : &b[i - np];
        kiln_shape s = kiln_shape_of(t->tensor);
        char shape[200];
        kiln_shape_format(s.ndim, s.d, shape, sizeof shape);
        size_t need = strlen(t->name) + strlen(shape) + 32;
        if (used + need >= cap) {
            while (used + need >= cap) cap *= 2;
            char *grown = KILN_REALLOC(text, cap);
            if (!grown) {
                free(text);
                return NULL;
            }
            text = grown;
        }
        int k = snprintf(text + used, cap - used, "%s %s %s %s\n", i < np ? "parameter" : "buffer", t->name,
                         kiln_dtype_name(kiln_dtype_of(t->tensor)), shape);
        used += (size_t)(k > 0 ? k : 0);
    }
    *len = used;
    return text;
}

/* The k-th line of text into buf ("(nothing)" past the end). */
static void nth_line(const char *text, size_t len, int k, char *buf, size_t size) {
    size_t i = 0;
    for (int line = 0; line < k && i < len; i++)
        if (text[i] == '\n') line++;
    if (i >= len) {
        snprintf(buf, size, "(nothing)");
        return;
    }
    size_t j = i;
    while (j < len && text[j] != '\n') j++;
    snprintf(buf, size, "'%.*s'", (int)(j - i), text + i);
}

/* Every rank's model description against rank 0's; the same verdict on
 * every rank. */
static kiln_status check_same_model(kiln_dist_group *g, const char *text, size_t len) {
    if (g->world == 1) return KILN_OK;
    kiln_tensor *mine = kiln_from_data(KILN_SHAPE(2), KILN_I64, KILN_CPU,
                                       (int64_t[2]){(int64_t)fnv1a(text, len), (int64_t)len});
    kiln_tensor *all = kiln_empty(KILN_SHAPE(g->world, 2), KILN_I64, KILN_CPU);
    kiln_status st = mine && all ? kiln_dist_all_gather(g, all, mine, NULL) : kiln_error_last()->status;
    const int64_t *sums = st ? NULL : kiln_data_ptr(all);
    bool same = true;
    int64_t longest = 0;
    for (int r = 0; !st && r < g->world; r++) {
        same &= sums[2 * r] == sums[0] && sums[2 * r + 1] == sums[1];
        if (sums[2 * r + 1] > longest) longest = sums[2 * r + 1];
    }
    kiln_tensor_drop(mine), kiln_tensor_drop(all);
    if (st || same) return st;
    /* They differ: gather every rank's text (padded to the longest) and
     * name the first differing line. */
    int64_t words = (longest + 7) / 8 + 1;
    kiln_tensor *t_mine = kiln_zeros(KILN_SHAPE(words), KILN_I64, KILN_CPU);
    kiln_tensor *t_all = kiln_empty(KILN_SHAPE(g->world, words), KILN_I64, KILN_CPU);
    if (!t_mine || !t_all) st = kiln_error_last()->status;
    if (!st) {
        memcpy(kiln_data_ptr(t_mine), text, len);
        st = kiln_dist_all_gather(g, t_all, t_mine, NULL);
    }
    if (!st) {
        const char *base = kiln_data_ptr(t_all);
        size_t stride = (size_t)words * 8;
        const char *zero = base;
        size_t zlen = strnlen(zero, stride);
        for (int r = 1; r < g->world && !st; r++) {
            const char *other = base + (size_t)r * stride;
            size_t olen = strnlen(other, stride);
            if (zlen == olen && !memcmp(zero, other, zlen)) continue;
            int line = 0;
            for (size_t i = 0; i < zlen && i < olen && zero[i] == other[i]; i++)
                if (zero[i] == '\n') line++;
            char a[400], b[400];
            nth_line(zero, zlen, line, a, sizeof a);
            nth_line(other, olen, line, b, sizeof b);
            st = KILN_RAISE(
                KILN_ERR_INVALID_ARGUMENT,
                "every rank must build the same model (parameters and buffers, names, dtypes, shapes) "
                "before kiln_ddp_wrap",
                "kiln_ddp_wrap: the model differs between ranks at entry %d: rank 0 has %s, rank %d has %s",
                line, a, r, b);
        }
    }
    kiln_tensor_drop(t_mine), kiln_tensor_drop(t_all);
    return st;
}

/* Rank 0's values into every rank's tensors: all broadcasts started, then
 * waited for. */
static kiln_status broadcast_all(kiln_dist_group *g, kiln_tensor *const *tensors, int n) {
    if (g->world == 1 || n == 0) return KILN_OK;
    kiln_dist_work **works = KILN_CALLOC((size_t)n, sizeof *works);
    if (!works) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = KILN_OK;
    int started = 0;
    for (; started < n && !st; started++) st = kiln_dist_broadcast(g, tensors[started], 0, &works[started]);
    kiln_error saved = *kiln_error_last();
    double deadline = kiln_clock_now_s() + g->timeout_s; /* one bound for all of them */
    for (int i = 0; i < started; i++) {
        if (!works[i]) continue;
        kiln_status w = kiln_dist_work_wait_until(works[i], deadline);
        if (!st && w) st = w, saved = *kiln_error_last();
        kiln_dist_work_free(works[i]); /* a timed-out one refuses, and stays in flight */
    }
    free(works);
    return st ? restore_error(&saved) : KILN_OK;
}

/* ---- Buckets --------------------------------------------------------------------------- */

/* Assign the parameters to buckets taking them in `order` (a permutation
 * of 0..n_params-1): at wrap, reverse parameter order; after the first
 * backward, the order its gradients arrived in. */
static kiln_status build_buckets_in(kiln_ddp *d, const int *order) {
    double first = d->opts.first_bucket_mb > 0 ? d->opts.first_bucket_mb : 1.0;
    double cap = d->opts.bucket_cap_mb > 0 ? d->opts.bucket_cap_mb : 25.0;
    d->buckets = KILN_CALLOC((size_t)(d->n_params > 0 ? d->n_params : 1), sizeof *d->buckets);
    if (!d->buckets) return KILN_ERR_OUT_OF_MEMORY;
    /* A bucket closes once it reaches its cap (PyTorch's
     * compute_bucket_assignment_by_size) or the dtype changes. */
    int64_t bytes = 0;
    for (int o = 0; o < d->n_params; o++) {
        int i = order[o];
        ddp_param *p = &d->params[i];
        kiln_dtype dt = kiln_dtype_of(p->tensor);
        ddp_bucket *b = d->n_buckets ? &d->buckets[d->n_buckets - 1] : NULL;
        double limit = (d->n_buckets <= 1 ? first : cap) * 1024.0 * 1024.0;
        if (!b || (double)bytes >= limit || b->dtype != dt) {
            b = &d->buckets[d->n_buckets++];
            b->dtype = dt;
            b->members = KILN_MALLOC(sizeof(int) * (size_t)(d->n_params - o));
            if (!b->members) return KILN_ERR_OUT_OF_MEMORY;
            bytes = 0;
        }
        p->bucket = (int)(b - d->buckets);
        p->offset = 0;
        for (int k = 0; k < b->n_members; k++) p->offset += d->params[b->members[k]].numel;
        b->members[b->n_members++] = i;
        bytes += p->numel * (int64_t)kiln_dtype_size(dt);
    }
    for (int k = 0; k < d->n_buckets; k++) {
        ddp_bucket *b = &d->buckets[k];
        int64_t n = 1;
        for (int m = 0; m < b->n_members; m++) n += d->params[b->members[m]].numel;
        b->flat = kiln_zeros(KILN_SHAPE(n), b->dtype, d->device);
        if (!b->flat) return kiln_error_last()->status;
        b->pending = b->n_members;
    }
    return KILN_OK;
}

static kiln_status build_buckets(kiln_ddp *d) {
    int *order = KILN_MALLOC(sizeof(int) * (size_t)(d->n_params > 0 ? d->n_params : 1));
    if (!order) return KILN_ERR_OUT_OF_MEMORY;
    for (int o = 0; o < d->n_params; o++) order[o] = d->n_params - 1 - o;
    kiln_status st = build_buckets_in(d, order);
    free(order);
    return st;
}

static void free_buckets(kiln_ddp *d) {
    for (int k = 0; k < d->n_buckets; k++) {
        kiln_tensor_drop(d->buckets[k].flat);
        free(d->buckets[k].members);
    }
    free(d->buckets);
    d->buckets = NULL;
    d->n_buckets = 0;
}

/* After the first synchronised step: rank 0's arrival order (broadcast, so
 * every rank builds the same buckets; parameters that never arrived go
 * last, in reverse order), and the buckets rebuilt in it when it differs
 * from theirs. Collective. Only called with no bucket in flight. */
static kiln_status rebuild_buckets(kiln_ddp *d) {
    d->rebuilt = true;
    int n = d->n_params;
    if (n == 0) return KILN_OK;
    kiln_tensor *t = kiln_empty(KILN_SHAPE(n), KILN_I64, KILN_CPU);
    if (!t) return kiln_error_last()->status;
    int64_t *o = kiln_data_ptr(t);
    bool *seen = KILN_CALLOC((size_t)n, sizeof *seen);
    int *order = KILN_MALLOC(sizeof(int) * (size_t)n);
    kiln_status st = seen && order ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    int k = 0;
    for (int i = 0; !st && i < d->n_arrived; i++) seen[d->arrival[i]] = true, o[k++] = d->arrival[i];
    for (int i = n - 1; !st && i >= 0; i--)
        if (!seen[i]) o[k++] = i;
    if (!st) st = kiln_dist_broadcast(d->group, t, 0, NULL);
    bool same = true;
    for (int i = 0; !st && i < n; i++) {
        order[i] = (int)o[i];
        if (order[i] < 0 || order[i] >= n)
            st = KILN_RAISE(KILN_ERR_INTERNAL, NULL,
                            "kiln_ddp: rank 0's gradient order names parameter %d of %d", order[i], n);
    }
    /* The current buckets, flattened in order, against the new order. */
    for (int b = 0, i = 0; !st && b < d->n_buckets; b++)
        for (int m = 0; m < d->buckets[b].n_members; m++, i++) same &= d->buckets[b].members[m] == order[i];
    if (!st && !same) {
        free_buckets(d);
        st = build_buckets_in(d, order);
        d->stats.num_buckets = d->n_buckets;
        d->stats.buckets_rebuilt = true;
    }
    free(seen), free(order);
    kiln_tensor_drop(t);
    return st;
}

static kiln_status check_params(kiln_ddp *d, const kiln_named_tensor *items, int n) {
    d->device = n > 0 ? kiln_get_device(items[0].tensor) : KILN_CPU;
    for (int i = 0; i < n; i++) {
        kiln_tensor *t = items[i].tensor;
        kiln_dtype dt = kiln_dtype_of(t);
        kiln_device dev = kiln_get_device(t);
        if (dev.type != KILN_DEVICE_CPU && dev.type != KILN_DEVICE_CUDA) {
            char name[32];
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "move the module to the CPU or a CUDA device",
                              "kiln_ddp_wrap: parameter '%s' is on %s; DDP reduces CPU (MPI) and CUDA "
                              "(NCCL) gradients",
                              items[i].name, kiln_device_str(dev, name, sizeof name));
        }
        if (dev.type != d->device.type || dev.index != d->device.index) {
            char a[32], b[32];
            return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                              "one process drives one device: put the whole module on it (kiln_module_to)",
                              "kiln_ddp_wrap: parameter '%s' is on %s but '%s' is on %s", items[i].name,
                              kiln_device_str(dev, a, sizeof a), items[0].name,
                              kiln_device_str(d->device, b, sizeof b));
        }
        if (dt != KILN_F32 && dt != KILN_F64)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "train in f32 or f64 (kiln_module_to_dtype)",
                              "kiln_ddp_wrap: parameter '%s' has dtype %s; DDP reduces f32 and f64 gradients",
                              items[i].name, kiln_dtype_name(dt));
        if (!kiln_is_contiguous(t))
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, "register contiguous parameters",
                              "kiln_ddp_wrap: parameter '%s' is not contiguous", items[i].name);
    }
    return KILN_OK;
}

static void remove_hook(ddp_param *p) {
    kiln_autograd_meta *m = p->tensor ? kiln_autograd_meta_get(p->tensor, false) : NULL;
    for (int i = 0; m && i < m->n_hooks; i++) {
        if (m->hooks[i].post != ddp_hook || m->hooks[i].user != p) continue;
        memmove(&m->hooks[i], &m->hooks[i + 1], sizeof *m->hooks * (size_t)(m->n_hooks - i - 1));
        m->n_hooks--;
        return;
    }
}

/* A parameter that already carries a DDP hook belongs to another handle:
 * both would reduce its gradient. */
static kiln_status check_not_wrapped(const kiln_named_tensor *items, int n) {
    for (int i = 0; i < n; i++) {
        kiln_autograd_meta *m = kiln_autograd_meta_get(items[i].tensor, false);
        for (int k = 0; m && k < m->n_hooks; k++)
            if (m->hooks[k].post == ddp_hook)
                return KILN_RAISE(
                    KILN_ERR_STATE, "kiln_ddp_free the other handle first",
                    "kiln_ddp_wrap: parameter '%s' is already wrapped by another kiln_ddp handle",
                    items[i].name);
    }
    return KILN_OK;
}

static kiln_status wrap_impl(kiln_ddp *d, kiln_named_tensor *pitems, int np, kiln_named_tensor *bitems,
                             int nb) {
    KILN_TRY(check_params(d, pitems, np));
    KILN_TRY(check_not_wrapped(pitems, np));
    size_t len = 0;
    char *text = describe_model(pitems, np, bitems, nb, &len);
    if (!text) return kiln_error_last()->status;
    kiln_status st = check_same_model(d->group, text, len);
    free(text);
    KILN_TRY(st);

    d->params = KILN_CALLOC((size_t)(np > 0 ? np : 1), sizeof *d->params);
    d->arrival = KILN_CALLOC((size_t)(np > 0 ? np : 1), sizeof *d->arrival);
    if (!d->arrival) return KILN_ERR_OUT_OF_MEMORY;
    d->buffers = KILN_CALLOC((size_t)(nb > 0 ? nb : 1), sizeof *d->buffers);
    if (!d->params || !d->buffers) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) {
        ddp_param *p = &d->params[i];
        p->owner = d, p->index = i, p->tensor = kiln_retain(pitems[i].tensor);
        p->numel = kiln_numel(p->tensor);
        p->name = KILN_MALLOC(strlen(pitems[i].name) + 1);
        d->n_params++;
        if (!p->name) return KILN_ERR_OUT_OF_MEMORY;
        strcpy(p->name, pitems[i].name);
    }
    for (int i = 0; i < nb; i++) d->buffers[d->n_buffers++] = kiln_retain(bitems[i].tensor);

    kiln_tensor **all = KILN_MALLOC(sizeof *all * (size_t)(np + nb + 1));
    if (!all) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) all[i] = d->params[i].tensor;
    for (int i = 0; i < nb; i++) all[np + i] = d->buffers[i];
    st = broadcast_all(d->group, all, np + nb);
    free(all);
    KILN_TRY(st);

    KILN_TRY(build_buckets(d));
    for (int i = 0; i < np; i++) {
        st = kiln_register_post_accumulate_hook(d->params[i].tensor, ddp_hook, &d->params[i]);
        if (st) {
            for (int k = 0; k < i; k++) remove_hook(&d->params[k]);
            return st;
        }
    }
    d->stats.num_buckets = d->n_buckets;
    d->stats.num_parameters = d->n_params;
    d->stats.hooks_before_first_start = -1;
    return KILN_OK;
}

static void ddp_release(kiln_ddp *d, bool hooks_registered) {
    for (int i = 0; i < d->n_params; i++) {
        if (hooks_registered) remove_hook(&d->params[i]);
        kiln_tensor_drop(d->params[i].tensor);
        free(d->params[i].name);
    }
    free_buckets(d);
    for (int i = 0; i < d->n_buffers; i++) kiln_tensor_drop(d->buffers[i]);
    free(d->params), free(d->buffers), free(d->arrival);
    free(d);
}

kiln_status kiln_ddp_wrap(kiln_module *m, kiln_dist_group *g, const kiln_ddp_opts *opts, kiln_ddp **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_wrap: out is NULL");
    *out = NULL;
    if (!m || !g)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the module and the group from kiln_dist_init",
                          "kiln_ddp_wrap: %s is NULL", m ? "the group" : "the module");
    kiln_ddp_opts o = opts ? *opts : kiln_ddp_opts_default();
    if (!isfinite(o.bucket_cap_mb) || o.bucket_cap_mb < 0 || !isfinite(o.first_bucket_mb) ||
        o.first_bucket_mb < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give MiB >= 0 (0: the default)",
                          "kiln_ddp_wrap: bucket_cap_mb %g / first_bucket_mb %g are not sizes",
                          o.bucket_cap_mb, o.first_bucket_mb);
    kiln_ddp *d = KILN_CALLOC(1, sizeof *d);
    if (!d) return KILN_ERR_OUT_OF_MEMORY;
    d->module = m, d->group = g, d->opts = o, d->sync = true, d->samples = 1.0, d->twice = -1;
    kiln_named_tensor *pitems = NULL, *bitems = NULL;
    int np = 0, nb = 0;
    kiln_api_enter();
    kiln_status st = kiln_module_named_parameters(m, &pitems, &np);
    if (!st) st = kiln_module_named_buffers(m, &bitems, &nb);
    if (!st) st = wrap_impl(d, pitems, np, bitems, nb);
    kiln_api_leave();
    free(pitems), free(bitems);
    if (st) {
        kiln_error saved = *kiln_error_last();
        ddp_release(d, false);
        return restore_error(&saved);
    }
    *out = d;
    return KILN_OK;
}

/* ---- Backward: hooks start buckets ------------------------------------------------------ */

/* Copy the bucket's gradients (times the sample count) into its flat
 * buffer. A member without a gradient contributes zeros. */
static kiln_status fill_bucket_device(kiln_ddp *d, ddp_bucket *b);

static kiln_status fill_bucket(kiln_ddp *d, ddp_bucket *b) {
    if (d->device.type != KILN_DEVICE_CPU) {
        kiln_api_enter();
        kiln_status st = fill_bucket_device(d, b);
        kiln_api_leave();
        return st;
    }
    void *flat = kiln_data_ptr(b->flat);
    int64_t total = 0;
    for (int m = 0; m < b->n_members; m++) {
        ddp_param *p = &d->params[b->members[m]];
        total += p->numel;
        /* Not ready: unused in this backward (find_unused_parameters); a .grad
         * it may still hold is from an earlier step and is not sent. */
        kiln_tensor *g = p->ready ? kiln_grad(p->tensor) : NULL;
        if (g && !kiln_is_contiguous(g)) {
            kiln_tensor *c = kiln_contiguous(g);
            kiln_tensor_drop(g);
            if (!c) return kiln_error_last()->status;
            g = c;
        }
        if (b->dtype == KILN_F32) {
            float *dst = (float *)flat + p->offset, w = (float)d->samples;
            const float *src = g ? kiln_data_ptr(g) : NULL;
            for (int64_t j = 0; j < p->numel; j++) dst[j] = src ? src[j] * w : 0.0f;
        } else {
            double *dst = (double *)flat + p->offset, w = d->samples;
            const double *src = g ? kiln_data_ptr(g) : NULL;
            for (int64_t j = 0; j < p->numel; j++) dst[j] = src ? src[j] * w : 0.0;
        }
        kiln_tensor_drop(g);
    }
    if (b->dtype == KILN_F32)
        ((float *)flat)[total] = (float)d->samples;
    else
        ((double *)flat)[total] = d->samples;
    return KILN_OK;
}

/* The slice of flat [offset, offset + numel) viewed as `shape`. */
static kiln_tensor *flat_slice(kiln_tensor *flat, int64_t offset, int64_t numel, kiln_shape shape) {
    kiln_tensor *n = kiln_narrow(flat, 0, offset, numel);
    kiln_tensor *v = n ? kiln_view(n, shape) : NULL;
    kiln_tensor_drop(n);
    return v;
}

/* fill_bucket on a CUDA device: the same with device ops, queued on the
 * compute stream (the bucket's all-reduce is ordered after them). */
static kiln_status fill_bucket_device(kiln_ddp *d, ddp_bucket *b) {
    int64_t total = 0;
    kiln_status st = KILN_OK;
    for (int m = 0; m < b->n_members && !st; m++) {
        ddp_param *p = &d->params[b->members[m]];
        total += p->numel;
        kiln_tensor *g = p->ready ? kiln_grad(p->tensor) : NULL;
        kiln_tensor *dst = flat_slice(b->flat, p->offset, p->numel, kiln_shape_of(p->tensor));
        kiln_tensor *src =
            g ? kiln_mul_scalar(g, d->samples) : kiln_zeros(kiln_shape_of(p->tensor), b->dtype, d->device);
        if (!dst || !src)
            st = kiln_error_last()->status;
        else
            st = kiln_copy_(dst, src, 0);
        kiln_tensor_drop(g), kiln_tensor_drop(dst), kiln_tensor_drop(src);
    }
    if (st) return st;
    kiln_tensor *count = kiln_full(KILN_SHAPE(1), d->samples, b->dtype, d->device);
    kiln_tensor *dst = kiln_narrow(b->flat, 0, total, 1);
    st = count && dst ? kiln_copy_(dst, count, 0) : kiln_error_last()->status;
    kiln_tensor_drop(count), kiln_tensor_drop(dst);
    return st;
}

/* Start every bucket that is ready, in index order. */
static kiln_status start_ready(kiln_ddp *d, bool from_hook) {
    while (d->next_start < d->n_buckets && d->buckets[d->next_start].pending == 0) {
        ddp_bucket *b = &d->buckets[d->next_start];
        KILN_TRY(fill_bucket(d, b));
        KILN_TRY(kiln_dist_all_reduce(d->group, b->flat, KILN_DIST_SUM, &b->work));
        if (d->next_start == 0) d->stats.hooks_before_first_start = d->stats.hooks_fired;
        if (from_hook) d->stats.buckets_started_in_backward++;
        d->next_start++;
    }
    return KILN_OK;
}

/* Let MPI move the started all-reduces forward (Open MPI progresses only
 * inside MPI calls): this is what overlaps them with the rest of backward. */
static void progress(kiln_ddp *d) {
    for (int k = 0; k < d->next_start; k++) {
        bool done;
        if (!d->buckets[k].work || !kiln_dist_work_poll(d->buckets[k].work, &done) || d->deferred) continue;
        /* A collective failed (a lost rank, an aborted communicator): that
         * is the step's error, reported as it is by finish. */
        d->deferred = kiln_error_last()->status;
        d->deferred_failed = true;
        snprintf(d->deferred_msg, sizeof d->deferred_msg, "%s", kiln_error_last()->message);
    }
}

static void ddp_hook(kiln_tensor *leaf, void *user) {
    (void)leaf;
    ddp_param *p = user;
    kiln_ddp *d = p->owner;
    if (!d->sync || d->broken) return;
    if (!d->backward_open) {
        d->backward_open = true;
        d->stats.hooks_fired = 0;
        d->stats.buckets_started_in_backward = 0;
        d->stats.hooks_before_first_start = -1;
    }
    d->stats.hooks_fired++;
    if (p->ready) {
        if (d->twice < 0) d->twice = p->index;
        return;
    }
    p->ready = true;
    if (!d->rebuilt && d->arrival && d->n_arrived < d->n_params) d->arrival[d->n_arrived++] = p->index;
    ddp_bucket *b = &d->buckets[p->bucket];
    b->pending--;
    if (d->deferred) return;
    kiln_status st = b->pending == 0 ? start_ready(d, true) : KILN_OK;
    if (st) {
        d->deferred = st;
        snprintf(d->deferred_msg, sizeof d->deferred_msg, "%s", kiln_error_last()->message);
        return;
    }
    progress(d);
}

/* ---- Finish: wait, average, write back --------------------------------------------------- */

/* Wait for every bucket whose all-reduce is in flight (also one left by an
 * earlier timeout). A timeout leaves the handle broken. */
static kiln_status wait_started(kiln_ddp *d) {
    kiln_status first = KILN_OK;
    kiln_error saved = {0};
    /* One watchdog bound for all buckets: after a timeout (or a lost rank)
     * the buckets after it are tested once, not given a full bound each. */
    double deadline = kiln_clock_now_s() + d->group->timeout_s;
    for (int k = 0; k < d->n_buckets; k++) {
        ddp_bucket *b = &d->buckets[k];
        if (!b->work) continue;
        kiln_status st = kiln_dist_work_wait_until(b->work, deadline);
        if (st && !first) first = st, saved = *kiln_error_last();
        if (kiln_dist_work_free(b->work) == KILN_OK)
            b->work = NULL;
        else
            d->broken = true;
    }
    return first ? restore_error(&saved) : KILN_OK;
}

static void reset_backward(kiln_ddp *d) {
    for (int i = 0; i < d->n_params; i++) d->params[i].ready = false;
    for (int k = 0; k < d->n_buckets; k++) d->buckets[k].pending = d->buckets[k].n_members;
    d->next_start = 0;
    d->backward_open = false;
    d->twice = -1;
    d->deferred = KILN_OK;
    d->deferred_failed = false;
}

/* write_back on a CUDA device: reads each bucket's total count (a host
 * sync, after its all-reduce), then .grad = slice * (1 / total). */
static kiln_status write_back_device(kiln_ddp *d) {
    kiln_status st = KILN_OK;
    double *totals = KILN_CALLOC((size_t)d->n_buckets, sizeof *totals);
    if (!totals) return KILN_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < d->n_buckets && !st; k++) {
        kiln_tensor *c = kiln_narrow(d->buckets[k].flat, 0, kiln_numel(d->buckets[k].flat) - 1, 1);
        st = c ? kiln_item(c, &totals[k]) : kiln_error_last()->status;
        kiln_tensor_drop(c);
    }
    for (int i = 0; i < d->n_params && !st; i++) {
        ddp_param *p = &d->params[i];
        ddp_bucket *b = &d->buckets[p->bucket];
        kiln_tensor *src = flat_slice(b->flat, p->offset, p->numel, kiln_shape_of(p->tensor));
        kiln_tensor *avg = src ? kiln_mul_scalar(src, 1.0 / totals[p->bucket]) : NULL;
        kiln_tensor *g = kiln_grad(p->tensor);
        if (!avg) {
            st = kiln_error_last()->status;
        } else if (g && kiln_is_contiguous(g)) {
            st = kiln_copy_(g, avg, 0);
        } else {
            st = kiln_set_grad(p->tensor, avg);
        }
        kiln_tensor_drop(src), kiln_tensor_drop(avg), kiln_tensor_drop(g);
    }
    free(totals);
    return st;
}

/* .grad = the bucket slice / the total sample count. */
static kiln_status write_back(kiln_ddp *d) {
    if (d->device.type != KILN_DEVICE_CPU) {
        kiln_api_enter();
        kiln_status st = write_back_device(d);
        kiln_api_leave();
        return st;
    }
    for (int i = 0; i < d->n_params; i++) {
        ddp_param *p = &d->params[i];
        ddp_bucket *b = &d->buckets[p->bucket];
        int64_t total = kiln_numel(b->flat) - 1;
        kiln_tensor *g = kiln_grad(p->tensor);
        if (!g || !kiln_is_contiguous(g)) {
            kiln_tensor_drop(g);
            g = kiln_empty(kiln_shape_of(p->tensor), b->dtype, KILN_CPU);
            if (!g) return kiln_error_last()->status;
            kiln_status st = kiln_set_grad(p->tensor, g);
            if (st) {
                kiln_tensor_drop(g);
                return st;
            }
        }
        if (b->dtype == KILN_F32) {
            const float *src = (const float *)kiln_data_ptr(b->flat);
            float inv = 1.0f / src[total], *dst = kiln_data_ptr(g);
            for (int64_t j = 0; j < p->numel; j++) dst[j] = src[p->offset + j] * inv;
        } else {
            const double *src = (const double *)kiln_data_ptr(b->flat);
            double n = src[total], *dst = kiln_data_ptr(g);
            for (int64_t j = 0; j < p->numel; j++) dst[j] = src[p->offset + j] / n;
        }
        kiln_tensor_bump_version(g);
        kiln_tensor_drop(g);
    }
    return KILN_OK;
}

/* The names of the parameters whose gradient did not arrive. */
static kiln_status unused_error(kiln_ddp *d) {
    char names[600] = "";
    size_t used = 0;
    int count = 0;
    for (int i = 0; i < d->n_params; i++) {
        if (d->params[i].ready) continue;
        if (count++ < 8 && used + 8 < sizeof names) {
            int k = snprintf(names + used, sizeof names - used, "%s'%s'", count > 1 ? ", " : "",
                             d->params[i].name);
            if (k > 0) used += (size_t)k;
        }
    }
    return KILN_RAISE(KILN_ERR_STATE,
                      "use every parameter in the forward, or wrap with opts.find_unused_parameters = true",
                      "kiln_ddp_finish_grads: %d parameter(s) got no gradient in this backward: %s%s", count,
                      names, count > 8 ? ", ..." : "");
}

static kiln_status finish_impl(kiln_ddp *d) {
    if (d->broken)
        return KILN_RAISE(
            KILN_ERR_STATE, "restart the job",
            "kiln_ddp_finish_grads: an earlier wait timed out and a gradient all-reduce is stuck");
    if (!d->backward_open && d->n_params > 0)
        return KILN_RAISE(KILN_ERR_STATE, "run kiln_backward (outside no_sync) before kiln_ddp_finish_grads",
                          "kiln_ddp_finish_grads: no synchronised backward since the last call");
    kiln_status st = KILN_OK;
    if (d->deferred && d->deferred_failed) {
        st = KILN_RAISE(d->deferred, NULL, "%s", d->deferred_msg);
    } else if (d->deferred) {
        st = KILN_RAISE(d->deferred, NULL,
                        "kiln_ddp: starting a bucket's all-reduce during backward failed: %s",
                        d->deferred_msg);
    } else if (d->twice >= 0) {
        st = KILN_RAISE(
            KILN_ERR_STATE,
            "use each parameter once per forward, call kiln_ddp_finish_grads after each synchronised "
            "backward, or accumulate under kiln_ddp_set_sync(d, false)",
            "kiln_ddp_finish_grads: parameter '%s' got its gradient twice in one synchronised backward",
            d->params[d->twice].name);
    } else {
        bool missing = false;
        for (int i = 0; i < d->n_params; i++) missing |= !d->params[i].ready;
        if (missing && !d->opts.find_unused_parameters) {
            st = unused_error(d);
        } else if (missing) {
            for (int k = 0; k < d->n_buckets; k++) d->buckets[k].pending = 0;
        }
        if (!st) st = start_ready(d, false);
    }
    /* Started all-reduces are waited for even on error, so the ranks'
     * collectives stay matched. */
    kiln_error saved = *kiln_error_last();
    kiln_status wst = wait_started(d);
    if (st) {
        st = restore_error(&saved);
    } else {
        st = wst;
        if (!st) st = write_back(d);
        if (!st) d->stats.synced_steps++;
        if (!st && !d->rebuilt && !d->opts.static_bucket_order) st = rebuild_buckets(d);
    }
    reset_backward(d);
    d->n_arrived = 0;
    return st;
}

kiln_status kiln_ddp_finish_grads(kiln_ddp *d) {
    if (!d) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_finish_grads: handle is NULL");
    if (!d->sync) return KILN_OK;
    kiln_api_enter();
    kiln_status st = finish_impl(d);
    kiln_api_leave();
    return st;
}

void kiln_ddp_free(kiln_ddp *d) {
    if (!d) return;
    kiln_api_enter();
    wait_started(d);
    kiln_api_leave();
    bool stuck = false;
    for (int k = 0; k < d->n_buckets; k++) stuck |= d->buckets[k].work != NULL;
    if (stuck) {
        /* MPI still writes into a bucket: its buffers must stay. */
        kiln_log_write(KILN_LOG_WARN,
                       "kiln_ddp_free: a gradient all-reduce is stuck in flight; its buckets are "
                       "left allocated");
        for (int i = 0; i < d->n_params; i++) remove_hook(&d->params[i]);
        return;
    }
    ddp_release(d, true);
}

/* ---- Buffers, forward, settings ----------------------------------------------------------- */

kiln_status kiln_ddp_broadcast_buffers(kiln_ddp *d) {
    if (!d) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_broadcast_buffers: handle is NULL");
    kiln_api_enter();
    kiln_status st = broadcast_all(d->group, d->buffers, d->n_buffers);
    kiln_api_leave();
    return st;
}

kiln_tensor *kiln_ddp_forward(kiln_ddp *d, kiln_tensor *x) {
    if (!d) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_forward: handle is NULL");
        return NULL;
    }
    if (d->opts.broadcast_buffers && kiln_ddp_broadcast_buffers(d)) return NULL;
    kiln_api_enter();
    return kiln_api_return(kiln_module_forward(d->module, x));
}

kiln_status kiln_ddp_set_sample_count(kiln_ddp *d, int64_t n) {
    if (!d) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_set_sample_count: handle is NULL");
    if (n <= 0 || n > DDP_MAX_SAMPLES)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give this rank's batch size",
                          "kiln_ddp_set_sample_count: %lld is not in [1, %d]", (long long)n, DDP_MAX_SAMPLES);
    if (d->backward_open)
        return KILN_RAISE(KILN_ERR_STATE, "set it before the backward",
                          "kiln_ddp_set_sample_count: a synchronised backward is in progress (call "
                          "kiln_ddp_finish_grads first)");
    d->samples = (double)n;
    return KILN_OK;
}

kiln_status kiln_ddp_set_sync(kiln_ddp *d, bool sync) {
    if (!d) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_set_sync: handle is NULL");
    if (d->backward_open)
        return KILN_RAISE(KILN_ERR_STATE, "call kiln_ddp_finish_grads first",
                          "kiln_ddp_set_sync: a synchronised backward is waiting for kiln_ddp_finish_grads");
    d->sync = sync;
    return KILN_OK;
}

bool kiln_ddp_is_sync(const kiln_ddp *d) { return d && d->sync; }

kiln_status kiln_ddp_stats_get(const kiln_ddp *d, kiln_ddp_stats *out) {
    if (!d || !out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_ddp_stats_get: NULL argument");
    *out = d->stats;
    return KILN_OK;
}

int kiln_ddp_bucket_of(const kiln_ddp *d, int param_index) {
    if (!d || param_index < 0 || param_index >= d->n_params) return -1;
    return d->params[param_index].bucket;
}
