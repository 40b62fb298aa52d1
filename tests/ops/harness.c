/* The op test harness (see harness.h for how to write cases). Included by
 * each tests/ops/test_ops_*.c; the kernel-level guard check lives in
 * harness_kernel.c, included below. */
#include "ops/harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h"

/* ---- Thresholds --------------------------------------------------------------------
 * One table per dtype, never per op. The reference sees exactly the values
 * stored in the run dtype, so the only error left is the kernel's own
 * arithmetic plus the rounding of the result:
 *   f64   1e-12  unit roundoff 1.1e-16; reductions over the harness's
 *                small shapes (<= ~1e3 terms) and libm's last-bit
 *                differences stay below 1e-13; 1e-12 leaves a margin.
 *   f32   1e-5   unit roundoff 6e-8; f32 accumulation over <= ~1e3 terms
 *                grows like sqrt(n)*u ~ 2e-6 typically, n*u in the worst
 *                case; f32 libm (expf, erff) adds ~1 ulp.
 *   f16   1e-2   unit roundoff 4.9e-4 (11-bit significand); computed in
 *                f32 and rounded once, plus intermediates rounded to f16
 *                in composite ops (cross_entropy = log_softmax + nll_loss):
 *                ~20 u.
 *   bf16  5e-2   unit roundoff 3.9e-3 (8-bit significand); the same
 *                reasoning, ~13 u.
 *   integer and bool outputs: exact.
 * Gradients: float64 analytic vs central differences with eps 1e-6: the
 * truncation error is O(eps^2 f''') ~ 1e-12 and the cancellation error
 * O(u / eps) ~ 1e-10 relative, so 1e-6 (KH_TOL_GRAD) catches any wrong
 * formula (a wrong factor is O(1)) without flakiness. */
double kh_tol_forward(kiln_dtype dtype) {
    switch (dtype) {
    case KILN_F64:
        return 1e-12;
    case KILN_F32:
        return 1e-5;
    case KILN_F16:
        return 1e-2;
    case KILN_BF16:
        return 5e-2;
    default:
        return 0.0; /* integers and bool: exact */
    }
}

/* ---- Small utilities ------------------------------------------------------------- */

int64_t kh_numel(kiln_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return n;
}

bool kh_broadcast(kiln_shape a, kiln_shape b, kiln_shape *out) {
    kiln_shape r = {.ndim = a.ndim > b.ndim ? a.ndim : b.ndim};
    for (int i = 0; i < r.ndim; i++) {
        int ia = a.ndim - r.ndim + i, ib = b.ndim - r.ndim + i;
        int64_t da = ia >= 0 ? a.d[ia] : 1, db = ib >= 0 ? b.d[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        r.d[i] = da == 1 ? db : da;
    }
    *out = r;
    return true;
}

void kh_unravel(kiln_shape s, int64_t flat, int64_t *idx) {
    for (int i = s.ndim - 1; i >= 0; i--) {
        idx[i] = s.d[i] ? flat % s.d[i] : 0;
        flat = s.d[i] ? flat / s.d[i] : 0;
    }
}

int64_t kh_ravel(kiln_shape s, const int64_t *idx) {
    int64_t f = 0;
    for (int i = 0; i < s.ndim; i++) f = f * s.d[i] + idx[i];
    return f;
}

int64_t kh_bcast_index(kiln_shape out, int64_t flat, kiln_shape in) {
    int64_t idx[KILN_MAX_DIMS], f = 0;
    kh_unravel(out, flat, idx);
    int lead = out.ndim - in.ndim;
    for (int i = 0; i < in.ndim; i++) f = f * in.d[i] + (in.d[i] == 1 ? 0 : idx[i + lead]);
    return f;
}

double kh_rel_err(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0, na = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = a[i] - b[i];
        if (a[i] == b[i]) d = 0; /* equal infinities */
        num += d * d;
        den += b[i] * b[i];
        na += a[i] * a[i];
    }
    if (isnan(num) || isinf(num)) return INFINITY;
    if (den == 0) return sqrt(na);
    return sqrt(num / den);
}

const char *kh_case_id(const kh_case *c, char *buf, size_t size) {
    snprintf(buf, size, "%s %s", c->name, c->params ? c->params : "");
    return buf;
}

static kiln_dtype kh_input_dtype(const kh_input *in, kiln_dtype run) {
    if (in->as) return (kiln_dtype)(in->as - 1);
    return in->fill == KH_BOOL ? KILN_BOOL : run;
}

static bool kh_is_float(kiln_dtype d) {
    return d == KILN_F32 || d == KILN_F64 || d == KILN_F16 || d == KILN_BF16;
}

/* ---- Elements in any dtype ------------------------------------------------------- */

static double kh_load(const void *p, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_F32:
        return ((const float *)p)[i];
    case KILN_F64:
        return ((const double *)p)[i];
    case KILN_F16:
        return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    case KILN_I32:
        return ((const int32_t *)p)[i];
    case KILN_I64:
        return (double)((const int64_t *)p)[i];
    case KILN_U8:
        return ((const uint8_t *)p)[i];
    case KILN_BOOL:
        return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
    default:
        return NAN;
    }
}

/* Conversion as kiln's copy does it: float -> integer truncates, NaN gives
 * 0, i32/i64 saturate, u8 wraps, -> bool is x != 0. */
static void kh_store(void *p, kiln_dtype dt, int64_t i, double v) {
    double t = isnan(v) ? 0.0 : trunc(v);
    switch (dt) {
    case KILN_F32:
        ((float *)p)[i] = (float)v;
        break;
    case KILN_F64:
        ((double *)p)[i] = v;
        break;
    case KILN_F16:
        ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v);
        break;
    case KILN_BF16:
        ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v);
        break;
    case KILN_I32:
        ((int32_t *)p)[i] = t >= 2147483647.0 ? INT32_MAX : t <= -2147483648.0 ? INT32_MIN : (int32_t)t;
        break;
    case KILN_I64:
        ((int64_t *)p)[i] = t >= 9.2e18 ? INT64_MAX : t <= -9.2e18 ? INT64_MIN : (int64_t)t;
        break;
    case KILN_U8:
        ((uint8_t *)p)[i] = (uint8_t)(int64_t)(fabs(t) < 1e18 ? t : 0);
        break;
    case KILN_BOOL:
        ((uint8_t *)p)[i] = v != 0;
        break;
    default:
        break;
    }
}

static double kh_round_to(kiln_dtype dt, double v) {
    unsigned char tmp[8];
    kh_store(tmp, dt, 0, v);
    return kh_load(tmp, dt, 0);
}

/* ---- Deterministic inputs: splitmix64 seeded by FNV-1a of the case id ------------ */

typedef struct kh_rng {
    uint64_t s;
} kh_rng;

static uint64_t kh_next(kh_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double kh_unif(kh_rng *r) { return (double)(kh_next(r) >> 11) * 0x1.0p-53; }

static double kh_normal(kh_rng *r) {
    double u1 = 1.0 - kh_unif(r), u2 = kh_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static kh_rng kh_seed(const kh_case *c, uint64_t stream) {
    char id[256];
    kh_case_id(c, id, sizeof id);
    uint64_t h = 0xCBF29CE484222325ull;
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
    return (kh_rng){h ^ (stream * 0xD6E8FEB86659FD93ull)};
}

double *kh_gen_input(const kh_case *c, int i, kiln_dtype dtype) {
    const kh_input *in = &c->in[i];
    if (in->absent) return NULL;
    kiln_dtype dt = kh_input_dtype(in, dtype);
    int64_t n = kh_numel(in->shape);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    kh_rng r = kh_seed(c, (uint64_t)i + 1);
    double lo = in->lo, hi = in->hi;
    if (in->fill == KH_UNIFORM && lo == hi) lo = -1, hi = 1;
    for (int64_t j = 0; j < n; j++) {
        double u = kh_unif(&r);
        switch (in->fill) {
        case KH_NORMAL:
            v[j] = kh_normal(&r);
            break;
        case KH_POSITIVE:
            v[j] = 0.5 + 1.5 * u;
            break;
        case KH_UNIFORM:
            v[j] = lo + (hi - lo) * u;
            break;
        case KH_AWAY:
            v[j] = (0.5 + kh_unif(&r)) * (u < 0.5 ? -1.0 : 1.0);
            break;
        case KH_INDEX:
            v[j] = floor(lo + (hi - lo) * u);
            break;
        case KH_BOOL:
            v[j] = u < 0.5 ? 0.0 : 1.0;
            break;
        case KH_DISTINCT:
            v[j] = (double)j;
            break;
        case KH_SPECIAL:
            v[j] = j % 5 == 1 ? NAN : j % 7 == 3 ? INFINITY : j % 7 == 5 ? -INFINITY : kh_normal(&r);
            break;
        }
    }
    if (in->fill == KH_DISTINCT) { /* Fisher-Yates over 0..n-1, then k/16 centred */
        for (int64_t j = n - 1; j > 0; j--) {
            int64_t k = (int64_t)(kh_next(&r) % (uint64_t)(j + 1));
            double t = v[j];
            v[j] = v[k];
            v[k] = t;
        }
        for (int64_t j = 0; j < n; j++) v[j] = (v[j] - (double)(n / 2)) / 16.0;
    }
    for (int64_t j = 0; j < n; j++) {
        if (!kh_is_float(dt) && dt != KILN_BOOL && isfinite(v[j])) v[j] = nearbyint(v[j]);
        v[j] = kh_round_to(dt, v[j]);
    }
    return v;
}

double *kh_gen_r(const kh_case *c, int64_t n) {
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    kh_rng r = kh_seed(c, 1000);
    for (int64_t j = 0; j < n; j++) v[j] = kh_normal(&r);
    return v;
}

/* ---- Tensors from values, and back ----------------------------------------------- */

/* A tensor of `in`'s shape and layout holding vals (already in dt's range). */
static kiln_tensor *kh_make(const kh_input *in, kiln_dtype dt, const double *vals, kiln_device dev) {
    kiln_shape s = in->shape, base = s;
    int nd = s.ndim;
    kh_layout lay = in->layout;
    if (lay == KH_TRANSPOSED && nd < 2) lay = KH_STRIDED;
    int64_t strides[KILN_MAX_DIMS], bstr[KILN_MAX_DIMS], offset = 0;
    if (lay == KH_TRANSPOSED) {
        base.d[nd - 1] = s.d[nd - 2];
        base.d[nd - 2] = s.d[nd - 1];
    } else if (lay == KH_STRIDED) {
        if (nd == 0) {
            base = (kiln_shape){.ndim = 1, .d = {2}};
        } else {
            base.d[nd - 1] = 2 * s.d[nd - 1] + 1;
        }
        offset = 1;
    }
    kiln_contiguous_strides(base.ndim, base.d, bstr);
    for (int i = 0; i < nd; i++) strides[i] = bstr[i];
    if (lay == KH_TRANSPOSED) {
        strides[nd - 1] = bstr[nd - 2];
        strides[nd - 2] = bstr[nd - 1];
    } else if (lay == KH_STRIDED && nd > 0) {
        strides[nd - 1] = 2;
    }
    int64_t bn = kh_numel(base), n = kh_numel(s);
    size_t es = kiln_dtype_size(dt);
    unsigned char *buf = malloc(es * (size_t)(bn ? bn : 1));
    double gap = kh_is_float(dt) ? NAN : 99.0;
    for (int64_t j = 0; j < bn; j++) kh_store(buf, dt, j, gap);
    int64_t idx[KILN_MAX_DIMS];
    for (int64_t j = 0; j < n; j++) {
        kh_unravel(s, j, idx);
        int64_t o = offset;
        for (int k = 0; k < nd; k++) o += idx[k] * strides[k];
        kh_store(buf, dt, o, vals[j]);
    }
    kiln_tensor *b = kiln_from_data(base, dt, dev, buf);
    free(buf);
    if (!b || lay == KH_CONTIG) return b;
    kiln_tensor *v = kiln_tensor_alias(b, nd, s.d, strides, offset);
    kiln_release(b);
    return v;
}

/* t's elements in row-major order as doubles (caller frees); NULL on error. */
static double *kh_read(const kiln_tensor *t) {
    int64_t n = kiln_numel(t);
    kiln_dtype dt = kiln_dtype_of(t);
    size_t es = kiln_dtype_size(dt);
    unsigned char *raw = malloc(es * (size_t)(n ? n : 1));
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (n && kiln_to_host(t, raw, es * (size_t)n)) {
        free(raw);
        free(v);
        return NULL;
    }
    for (int64_t j = 0; j < n; j++) v[j] = kh_load(raw, dt, j);
    free(raw);
    return v;
}

/* ---- Reporting ----------------------------------------------------------------- */

typedef struct kh_ctx {
    const kh_case *c;
    char tag[64]; /* "cpu f16" */
    int failed;
} kh_ctx;

static void kh_fail(kh_ctx *x, const char *fmt, ...) {
    char id[256];
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s [%s]: ", kh_case_id(x->c, id, sizeof id), x->tag);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    x->failed = 1;
}

static const char *kh_shape_str(kiln_shape s, char *buf, size_t size) {
    return kiln_shape_format(s.ndim, s.d, buf, size);
}

static bool kh_shape_eq(kiln_shape a, kiln_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

/* Compare got (n values of dtype dt, shape gs) with the reference output k. */
static void kh_compare(kh_ctx *x, const char *what, int k, const kh_ref *ref, kiln_shape gs, kiln_dtype dt,
                       const double *got) {
    char a[96], b[96];
    if (!kh_shape_eq(gs, ref->out_shape[k])) {
        kh_fail(x, "%s output %d has shape %s, the reference %s", what, k, kh_shape_str(gs, a, sizeof a),
                kh_shape_str(ref->out_shape[k], b, sizeof b));
        return;
    }
    if (dt != ref->out_dtype[k]) {
        kh_fail(x, "%s output %d has dtype %s, expected %s", what, k, kiln_dtype_name(dt),
                kiln_dtype_name(ref->out_dtype[k]));
        return;
    }
    int64_t n = kh_numel(gs);
    double tol = kh_tol_forward(dt);
    if (tol == 0.0) {
        for (int64_t j = 0; j < n; j++)
            if (!(got[j] == ref->out[k][j])) {
                kh_fail(x, "%s output %d element %lld is %.17g, expected exactly %.17g", what, k,
                        (long long)j, got[j], ref->out[k][j]);
                return;
            }
        return;
    }
    double e = kh_rel_err(got, ref->out[k], n);
    if (!(e <= tol)) {
        int64_t worst = 0;
        double wd = -1;
        for (int64_t j = 0; j < n; j++) {
            double d = isnan(got[j]) ? INFINITY : fabs(got[j] - ref->out[k][j]);
            if (d > wd) wd = d, worst = j;
        }
        kh_fail(x,
                "%s output %d: normwise relative error %.3g > %.3g (worst element %lld: %.9g, expected %.9g)",
                what, k, e, tol, (long long)worst, n ? got[worst] : 0.0, n ? ref->out[k][worst] : 0.0);
    }
}

/* ---- The reference -------------------------------------------------------------- */

double *kh_out(kh_ref *r, int k, kiln_shape shape, int as) {
    if (k < 0 || k >= KH_MAX_OUT) return NULL;
    free(r->out[k]);
    int64_t n = kh_numel(shape);
    r->out[k] = calloc((size_t)(n ? n : 1), sizeof(double));
    r->out_shape[k] = shape;
    r->out_dtype[k] = as ? (kiln_dtype)(as - 1) : r->dtype;
    return r->out[k];
}

static void kh_ref_free(kh_ref *r) {
    for (int k = 0; k < KH_MAX_OUT; k++) free(r->out[k]);
}

/* Inputs of one run: values (as the reference sees them) and tensors. */
typedef struct kh_inputs {
    double *vals[KH_MAX_IN];
    kiln_tensor *t[KH_MAX_IN];
    kiln_dtype dt[KH_MAX_IN];
} kh_inputs;

static bool kh_inputs_make(kh_ctx *x, kh_inputs *in, kiln_dtype dtype, kiln_device dev) {
    const kh_case *c = x->c;
    memset(in, 0, sizeof *in);
    for (int i = 0; i < c->n_in; i++) {
        in->dt[i] = kh_input_dtype(&c->in[i], dtype);
        in->vals[i] = kh_gen_input(c, i, dtype);
        if (!in->vals[i]) continue;
        in->t[i] = kh_make(&c->in[i], in->dt[i], in->vals[i], dev);
        if (!in->t[i]) {
            kh_fail(x, "making input %d failed: %s", i, kiln_error_message());
            return false;
        }
    }
    return true;
}

static void kh_inputs_free(kh_inputs *in) {
    for (int i = 0; i < KH_MAX_IN; i++) {
        free(in->vals[i]);
        kiln_release(in->t[i]);
    }
    memset(in, 0, sizeof *in);
}

static void kh_reference(const kh_case *c, const kh_inputs *in, kiln_dtype dtype, kh_ref *r) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->attrs = &c->attrs;
    r->dtype = dtype;
    r->n_in = c->n_in;
    for (int i = 0; i < c->n_in; i++) {
        r->in[i] = in->vals[i];
        r->shape[i] = c->in[i].shape;
        r->in_dtype[i] = in->dt[i];
    }
    c->reference(r);
}

/* The error message of the last run() that returned NULL. */
static char kh_errmsg[1100];

/* run() inside a scope; returns out[0] (a new reference) and aux[]. */
static kiln_tensor *kh_call(const kh_case *c, kiln_tensor *const *t, kiln_dtype dtype, kiln_device dev,
                            kiln_tensor **aux) {
    kh_run r = {.c = c, .attrs = &c->attrs, .device = dev, .dtype = dtype, .n_in = c->n_in};
    for (int i = 0; i < c->n_in; i++) r.in[i] = t[i];
    kiln_scope_begin();
    kiln_tensor *out = c->run(&r);
    if (out) kiln_keep(out);
    for (int k = 0; k < KH_MAX_OUT - 1; k++) {
        if (r.aux[k]) kiln_keep(r.aux[k]);
        if (aux) {
            aux[k] = r.aux[k];
        } else {
            kiln_release(r.aux[k]);
        }
    }
    if (!out) snprintf(kh_errmsg, sizeof kh_errmsg, "%s", kiln_error_message());
    kiln_scope_end();
    return out;
}

#include "ops/harness_kernel.c"
#include "ops/harness_run.c"
