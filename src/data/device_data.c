/* Dataset-on-device mode: the whole dataset lives in one tensor on the
 * loader's device and each batch is made by ops on the caller's stream.
 *
 * Upload (once, at kiln_loader_create): every sample is written, as stored
 * (u8 or f32), into an image padded by crop_padding on each side — with
 * zeros or reflected exactly as the host transform reads its padding
 * (transform_source_coord) — so a random crop is a plain window of the
 * padded image and needs no bounds test per pixel. Labels go up as i64.
 *
 * A batch of `rows` samples s_i with (per sample) crop offsets (oy, ox),
 * flip f and cutout rectangle [cy0, cy1) x [cx0, cx1). The cropped rows of
 * an image are W-wide windows of the flat padded data, so they are rows of
 * `windows`, a (numel - W + 1, W) view of the data with strides (1, 1)
 * (overlapping rows; nothing is copied), and one embedding lookup fetches
 * them all:
 *
 *   start[i]      = s_i*C*Hp*Wp + oy_i*Wp + ox_i                  (host, per sample)
 *                   or, flipped, F + s_i*C*Hp*Wp + oy_i*Wp + 2*pad - ox_i
 *   row[i, c, y]  = start[i] + c*Hp*Wp + y*Wp                      (two broadcast adds)
 *   win           = embedding(windows, row)     (rows, C, H, W)   (u8 or f32, as stored)
 *   out           = f32(win) * mul[c] + add[c]  (mul = scale/std, add = -mean/std)
 *   out           = where(in cutout, 0, out)    in cutout: (y-cy0)(y-cy1+1) <= 0 and
 *                                                         (x-cx0)(x-cx1+1) <= 0
 *   labels        = gather(labels, s)
 *
 * Flips cost no op: when the transforms flip, the upload also holds every
 * padded image mirrored (at element F = N*C*Hp*Wp), and the host reads
 * column W-1-x+ox of the image for output x, which is column x + 2*pad - ox
 * of the mirror. That doubles the device memory for a pass per pixel
 * saved. The arithmetic is the host transform's, operation for operation
 * (one f32 multiply, one f32 add, a +0 fill), so the batches are
 * bit-identical to the host path's.
 *
 * The per-sample parameters come from the same counter-based draws as the
 * host pipeline (transform_plan_sample keyed by (seed, epoch, index)). The
 * device has no op for that Philox stream, so the host computes them: a
 * few words per sample (not per pixel), packed into one pinned (P, rows)
 * i64 buffer and uploaded with one non-blocking copy on the caller's
 * stream. PARAM_SLOTS such buffers rotate; a buffer is refilled only after
 * the event recorded behind its copy has completed. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "data/loader_internal.h"
#include "data/transform_internal.h"
#include "kiln/ops.h"
#include "runtime/runtime_internal.h"
#include "tensor/tensor_internal.h"

/* Rows of the parameter block. */
enum { P_SAMPLE = 0, P_START, P_CY0, P_CY1, P_CX0, P_CX1, P_COUNT };

#define PARAM_SLOTS 4

typedef struct param_slot {
    kiln_tensor *host;  /* (P_COUNT * batch_size) i64, pinned */
    kiln_event *copied; /* recorded after the upload from `host` */
    bool pending;       /* `copied` was recorded since the last refill */
} param_slot;

struct loader_ondevice {
    kiln_device device;
    kiln_transform_opts t;
    kiln_sample_info info;
    uint64_t seed;
    int64_t batch_size;
    int Hp, Wp;
    bool cutout;
    int64_t bytes;
    kiln_tensor *data;      /* (N * C * Hp * Wp) as stored, padded; then as many mirrored when flipping */
    int64_t mirror;         /* element offset of the mirrored images, 0 when none */
    kiln_tensor *windows;   /* (numel - W + 1, W) strides (1, 1): a view of data */
    kiln_tensor *labels;    /* (N) i64 */
    kiln_tensor *row_off;   /* (1, 1, H) i64: y * Wp */
    kiln_tensor *chan_off;  /* (1, C, 1) i64: c * Hp * Wp */
    kiln_tensor *row;       /* (1, 1, H, 1) i64: y */
    kiln_tensor *col;       /* (1, 1, 1, W) i64: x */
    kiln_tensor *mul, *add; /* (1, C, 1, 1) f32 */
    kiln_tensor *zero_i;    /* () i64 0 */
    kiln_tensor *zero_f;    /* () f32 0 */
    kiln_tensor *no;        /* () bool false */
    param_slot slot[PARAM_SLOTS];
    int next_slot;
};

static bool flips(const kiln_transform_opts *t) { return t->flip_p > 0.0f || t->alternating_flip; }

int64_t loader_ondevice_bytes(const kiln_transform_opts *t, kiln_sample_info info, int64_t n) {
    int64_t hp = info.height + 2 * (int64_t)t->crop_padding, wp = info.width + 2 * (int64_t)t->crop_padding;
    return n * (int64_t)info.channels * hp * wp * (int64_t)kiln_dtype_size(info.dtype) * (flips(t) ? 2 : 1) +
           n * (int64_t)sizeof(int64_t);
}

int64_t loader_ondevice_size(const loader_ondevice *d) { return d ? d->bytes : 0; }

void loader_ondevice_free(loader_ondevice *d) {
    if (!d) return;
    for (int i = 0; i < PARAM_SLOTS; i++) {
        if (d->slot[i].pending) kiln_event_synchronize(d->slot[i].copied);
        kiln_event_destroy(d->slot[i].copied);
        kiln_tensor_drop(d->slot[i].host);
    }
    kiln_tensor *all[] = {d->windows, d->data, d->labels, d->row_off, d->col,    d->chan_off,
                          d->row,     d->mul,  d->add,    d->zero_i,  d->zero_f, d->no};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_drop(all[i]);
    free(d);
}

/* The padded dataset and the labels, on the host. */
static kiln_status build_host_copy(loader_ondevice *d, kiln_dataset *ds, int64_t n, kiln_tensor **data,
                                   kiln_tensor **labels) {
    const kiln_sample_info in = d->info;
    const int C = in.channels, H = in.height, W = in.width, pad = d->t.crop_padding;
    size_t es = kiln_dtype_size(in.dtype);
    int64_t total = n * C * d->Hp * d->Wp;
    d->mirror = flips(&d->t) ? total : 0;
    *data = kiln_zeros(KILN_SHAPE(flips(&d->t) ? 2 * total : total), in.dtype, KILN_CPU);
    *labels = kiln_empty(KILN_SHAPE(n), KILN_I64, KILN_CPU);
    uint8_t *scratch = KILN_MALLOC(kiln_sample_bytes(in));
    if (!*data || !*labels || !scratch) {
        free(scratch);
        return *data && *labels ? KILN_ERR_OUT_OF_MEMORY : kiln_error_last()->status;
    }
    uint8_t *dst = kiln_data_ptr(*data);
    int64_t *lab = kiln_data_ptr(*labels);
    size_t plane = (size_t)d->Hp * (size_t)d->Wp, image = (size_t)C * plane;
    for (int64_t i = 0; i < n; i++) {
        kiln_status st = kiln_dataset_get(ds, i, scratch, &lab[i]);
        if (st) {
            free(scratch);
            return st;
        }
        for (int c = 0; c < C; c++)
            for (int py = 0; py < d->Hp; py++) {
                int sy = transform_source_coord(py, pad, H, d->t.pad_mode);
                if (sy < 0) continue; /* zero padding: already 0 */
                uint8_t *row = dst + ((size_t)i * image + (size_t)c * plane + (size_t)py * d->Wp) * es;
                const uint8_t *from = scratch + ((size_t)c * H + (size_t)sy) * W * es;
                memcpy(row + (size_t)pad * es, from, (size_t)W * es);
                for (int px = 0; px < pad; px++) { /* the padding columns */
                    int l = transform_source_coord(px, pad, W, d->t.pad_mode);
                    int r = transform_source_coord(d->Wp - 1 - px, pad, W, d->t.pad_mode);
                    if (l >= 0) memcpy(row + (size_t)px * es, from + (size_t)l * es, es);
                    if (r >= 0) memcpy(row + (size_t)(d->Wp - 1 - px) * es, from + (size_t)r * es, es);
                }
                if (d->mirror) {
                    uint8_t *m = row + (size_t)d->mirror * es;
                    for (int px = 0; px < d->Wp; px++)
                        memcpy(m + (size_t)px * es, row + (size_t)(d->Wp - 1 - px) * es, es);
                }
            }
    }
    free(scratch);
    return KILN_OK;
}

/* A small constant on the device from host values. */
static kiln_tensor *constant(loader_ondevice *d, kiln_shape shape, kiln_dtype dtype, const void *values) {
    return kiln_from_data(shape, dtype, d->device, values);
}

static kiln_status make_constants(loader_ondevice *d) {
    const int C = d->info.channels, H = d->info.height, W = d->info.width;
    int64_t *buf = KILN_MALLOC(sizeof(int64_t) * (size_t)(H > W ? (H > C ? H : C) : (W > C ? W : C)));
    if (!buf) return KILN_ERR_OUT_OF_MEMORY;
    for (int y = 0; y < H; y++) buf[y] = (int64_t)y * d->Wp;
    d->row_off = constant(d, KILN_SHAPE(1, 1, H), KILN_I64, buf);
    for (int y = 0; y < H; y++) buf[y] = y;
    d->row = constant(d, KILN_SHAPE(1, 1, H, 1), KILN_I64, buf);
    for (int x = 0; x < W; x++) buf[x] = x;
    d->col = constant(d, KILN_SHAPE(1, 1, 1, W), KILN_I64, buf);
    for (int c = 0; c < C; c++) buf[c] = (int64_t)c * d->Hp * d->Wp;
    d->chan_off = constant(d, KILN_SHAPE(1, C, 1), KILN_I64, buf);
    free(buf);
    /* Exactly the host transform's factors (transform.c). */
    float mul[KILN_TRANSFORM_MAX_CHANNELS], add[KILN_TRANSFORM_MAX_CHANNELS];
    float *m = C <= KILN_TRANSFORM_MAX_CHANNELS ? mul : KILN_MALLOC(sizeof(float) * (size_t)C);
    float *a = C <= KILN_TRANSFORM_MAX_CHANNELS ? add : KILN_MALLOC(sizeof(float) * (size_t)C);
    if (m && a) {
        float scale = (d->info.dtype == KILN_U8 && d->t.scale_u8) ? 1.0f / 255.0f : 1.0f;
        for (int c = 0; c < C; c++) {
            m[c] = scale;
            a[c] = 0.0f;
            if (d->t.normalize) {
                m[c] = scale / d->t.std[c];
                a[c] = -d->t.mean[c] / d->t.std[c];
            }
        }
        d->mul = constant(d, KILN_SHAPE(1, C, 1, 1), KILN_F32, m);
        d->add = constant(d, KILN_SHAPE(1, C, 1, 1), KILN_F32, a);
    }
    if (m != mul) free(m);
    if (a != add) free(a);
    if (!m || !a) return KILN_ERR_OUT_OF_MEMORY;
    int64_t zi = 0;
    float zf = 0.0f;
    bool no = false;
    d->zero_i = constant(d, KILN_SHAPE(), KILN_I64, &zi);
    d->zero_f = constant(d, KILN_SHAPE(), KILN_F32, &zf);
    d->no = constant(d, KILN_SHAPE(), KILN_BOOL, &no);
    kiln_tensor *all[] = {d->row_off, d->row,    d->col,    d->chan_off, d->mul,
                          d->add,     d->zero_i, d->zero_f, d->no};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!all[i]) return kiln_error_last()->status;
    for (int i = 0; i < PARAM_SLOTS; i++) {
        d->slot[i].host = kiln_empty_pinned(KILN_SHAPE(P_COUNT * d->batch_size), KILN_I64);
        if (!d->slot[i].host) return kiln_error_last()->status;
        KILN_TRY(kiln_event_create(d->device, KILN_EVENT_DEFAULT, &d->slot[i].copied));
    }
    return KILN_OK;
}

kiln_status loader_ondevice_create(kiln_dataset *ds, const kiln_loader_opts *o, loader_ondevice **out) {
    *out = NULL;
    loader_ondevice *d = KILN_CALLOC(1, sizeof *d);
    if (!d) return KILN_ERR_OUT_OF_MEMORY;
    d->device = o->device;
    d->t = o->transforms;
    d->info = kiln_dataset_info(ds);
    d->seed = o->seed;
    d->batch_size = o->batch_size;
    d->Hp = d->info.height + 2 * d->t.crop_padding;
    d->Wp = d->info.width + 2 * d->t.crop_padding;
    d->cutout = d->t.cutout > 0;
    int64_t n = kiln_dataset_length(ds);
    d->bytes = loader_ondevice_bytes(&d->t, d->info, n);
    kiln_tensor *hdata = NULL, *hlabels = NULL;
    kiln_status st = build_host_copy(d, ds, n, &hdata, &hlabels);
    if (!st) {
        /* Blocking copies (a CPU target keeps the host tensors themselves). */
        d->data = kiln_to(hdata, d->device, d->info.dtype, 0);
        d->labels = d->data ? kiln_to(hlabels, d->device, KILN_I64, 0) : NULL;
        if (!d->data || !d->labels) st = kiln_error_last()->status;
    }
    kiln_tensor_drop(hdata);
    kiln_tensor_drop(hlabels);
    int64_t numel = d->data ? kiln_numel(d->data) : 0, W = d->info.width;
    if (!st && numel >= W) {
        int64_t shape[2] = {numel - W + 1, W}, strides[2] = {1, 1};
        d->windows = kiln_tensor_alias(d->data, 2, shape, strides, 0);
        if (!d->windows) st = kiln_error_last()->status;
    }
    if (!st) st = make_constants(d);
    if (st) {
        loader_ondevice_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

/* Element k*rows .. (k+1)*rows of the uploaded parameters as (rows, 1, ...) with ndim dims. */
static kiln_tensor *param(kiln_tensor *dev, int k, int64_t rows, int ndim) {
    int64_t shape[4] = {rows, 1, 1, 1}, strides[4];
    kiln_contiguous_strides(ndim, shape, strides);
    return kiln_tensor_alias(dev, ndim, shape, strides, (int64_t)k * rows);
}

enum { MAX_TEMPS = 40 };

typedef struct temps {
    kiln_tensor *t[MAX_TEMPS];
    int n;
    bool failed;
} temps;

/* Keep `t` for the final drop; remember a failure (the error is set). */
static kiln_tensor *keep(temps *ts, kiln_tensor *t) {
    if (!t)
        ts->failed = true;
    else if (ts->n < MAX_TEMPS)
        ts->t[ts->n++] = t;
    return t;
}

static void drop_all(temps *ts) {
    for (int i = 0; i < ts->n; i++) kiln_tensor_drop(ts->t[i]);
    ts->n = 0;
}

/* Rows (or cols) within [lo, hi] as a bool mask: (v - lo) * (v - hi) <= 0. */
static kiln_tensor *within(temps *ts, loader_ondevice *d, kiln_tensor *v, kiln_tensor *lo, kiln_tensor *hi) {
    if (ts->failed) return NULL;
    kiln_tensor *a = keep(ts, kiln_sub(v, lo));
    kiln_tensor *b = a ? keep(ts, kiln_sub(v, hi)) : NULL;
    kiln_tensor *p = b ? keep(ts, kiln_mul(a, b)) : NULL;
    return p ? keep(ts, kiln_le(p, d->zero_i)) : NULL;
}

static void fill_params(loader_ondevice *d, int64_t *p, const int64_t *idx, int64_t rows, int64_t epoch) {
    const int64_t image = (int64_t)d->info.channels * d->Hp * d->Wp;
    for (int64_t i = 0; i < rows; i++) {
        int64_t s = idx[i];
        transform_plan pl = transform_plan_sample(&d->t, d->info, d->seed, epoch, s);
        p[P_SAMPLE * rows + i] = s;
        if (pl.flip)
            p[P_START * rows + i] =
                d->mirror + s * image + (int64_t)pl.oy * d->Wp + 2 * d->t.crop_padding - pl.ox;
        else
            p[P_START * rows + i] = s * image + (int64_t)pl.oy * d->Wp + pl.ox;
        p[P_CY0 * rows + i] = pl.cy0;
        p[P_CY1 * rows + i] = pl.cy1 - 1;
        p[P_CX0 * rows + i] = pl.cx0;
        p[P_CX1 * rows + i] = pl.cx1 - 1;
    }
}

/* Upload the batch's parameters (one non-blocking copy from a pinned slot). */
static kiln_status upload_params(loader_ondevice *d, const int64_t *idx, int64_t rows, int64_t epoch,
                                 kiln_tensor **dev) {
    *dev = NULL;
    param_slot *slot = &d->slot[d->next_slot];
    d->next_slot = (d->next_slot + 1) % PARAM_SLOTS;
    if (slot->pending) {
        KILN_TRY(kiln_event_synchronize(slot->copied));
        slot->pending = false;
    }
    fill_params(d, kiln_data_ptr(slot->host), idx, rows, epoch);
    /* A raw copy rather than kiln_to, so the pinned pool records no use of
     * the slot on the caller's stream (which the caller may destroy before
     * the loader): the slot's own event guards its reuse. */
    kiln_tensor *t = kiln_empty(KILN_SHAPE(P_COUNT * rows), KILN_I64, d->device);
    kiln_stream *stream = t ? kiln_current_stream(d->device) : NULL;
    if (!stream) {
        kiln_tensor_drop(t);
        return kiln_error_last()->status;
    }
    kiln_status st = kiln_runtime_copy(d->device, kiln_data_ptr(t), KILN_CPU, kiln_data_ptr(slot->host),
                                       sizeof(int64_t) * (size_t)(P_COUNT * rows), stream, true);
    if (!st) {
        st = kiln_event_record(slot->copied, stream);
        /* Recorded or not, the copy may be queued: when not, the slot is
         * refilled only after the stream drains. */
        if (st) kiln_stream_synchronize(stream);
    }
    if (st) {
        kiln_tensor_drop(t);
        return st;
    }
    slot->pending = true;
    *dev = t;
    return KILN_OK;
}

kiln_status loader_ondevice_batch(loader_ondevice *d, const int64_t *idx, int64_t rows, int64_t epoch,
                                  kiln_tensor **x, kiln_tensor **y) {
    *x = *y = NULL;
    const int C = d->info.channels, H = d->info.height, W = d->info.width;
    if (!d->windows) /* numel < W: an empty dataset has no batch to make */
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "kiln_loader: no data on the device");
    kiln_tensor *dev = NULL;
    KILN_TRY(upload_params(d, idx, rows, epoch, &dev));
    temps ts = {.n = 0};
    keep(&ts, dev);

    kiln_tensor *start = keep(&ts, param(dev, P_START, rows, 3)); /* (rows, 1, 1) */
    kiln_tensor *img = NULL, *row = NULL, *win = NULL, *f32 = NULL, *scaled = NULL, *out = NULL;
    if (!ts.failed) img = keep(&ts, kiln_add(start, d->chan_off));    /* (rows, C, 1) */
    if (!ts.failed) row = keep(&ts, kiln_add(img, d->row_off));       /* (rows, C, H) */
    if (!ts.failed) win = keep(&ts, kiln_embedding(d->windows, row)); /* (rows, C, H, W) */
    if (!ts.failed) f32 = keep(&ts, kiln_cast(win, KILN_F32));
    if (!ts.failed) scaled = keep(&ts, kiln_mul(f32, d->mul));
    if (!ts.failed) out = kiln_add(scaled, d->add);
    if (!out) ts.failed = true;
    if (!ts.failed && d->cutout) {
        kiln_tensor *cy0 = keep(&ts, param(dev, P_CY0, rows, 4)),
                    *cy1 = keep(&ts, param(dev, P_CY1, rows, 4));
        kiln_tensor *cx0 = keep(&ts, param(dev, P_CX0, rows, 4)),
                    *cx1 = keep(&ts, param(dev, P_CX1, rows, 4));
        kiln_tensor *in_r = within(&ts, d, d->row, cy0, cy1);                            /* (rows, 1, H, 1) */
        kiln_tensor *in_c = within(&ts, d, d->col, cx0, cx1);                            /* (rows, 1, 1, W) */
        kiln_tensor *cut = !ts.failed ? keep(&ts, kiln_where(in_r, in_c, d->no)) : NULL; /* (rows, 1, H, W) */
        kiln_tensor *cutout = cut ? kiln_where(cut, d->zero_f, out) : NULL;
        kiln_tensor_drop(out);
        out = cutout;
        if (!out) ts.failed = true;
    }
    kiln_tensor *sample = NULL, *lab = NULL;
    if (!ts.failed) sample = keep(&ts, param(dev, P_SAMPLE, rows, 1));
    if (!ts.failed) lab = kiln_gather(d->labels, 0, sample);
    if (ts.failed || !lab) {
        kiln_status st = kiln_error_last()->status;
        kiln_tensor_drop(out);
        drop_all(&ts);
        return st ? st : KILN_ERR_INTERNAL;
    }
    drop_all(&ts);
    (void)C, (void)H, (void)W;
    *x = out;
    *y = lab;
    return KILN_OK;
}
