/* The AVX2 rows of the blocked 2x2 max pooling (src/kernels/cpu/fast/
 * pool_avx2.c) against the generic rows they replace, bit for bit: values,
 * int64 indices and input gradients of max_pool2d, relu_max_pool2d and
 * their backwards (relu_max_pool2d_backward_sum's plane sums too), on
 * nChw8c and nChw16c, with ordinary and with
 * streaming stores (threshold forced to 1 byte), on odd sizes (an
 * uncovered row and column) and inputs built to hit every rule: ties
 * (the first maximum wins), NaN (beats everything), windows with nothing
 * positive (relu: 0 at the first element), -0.0. The backward is also
 * given stray indices (inside the plane but outside their window, and
 * far outside the plane, including an offset of 2^32 whose low half
 * looks right): both row kinds must hand the call to the scatter path,
 * which gives the same values or the same error. relu_max_pool2d's
 * backward also runs with grad_out and y plain NCHW and the indices
 * blocked (a classifier's flatten leaves y so), which must give the
 * blocked inputs' gradient and sums bit for bit. Skips (77) on a CPU
 * without AVX2. */
#include <math.h>
#include <string.h>

#include "test_util.h"

#include "kernels/cpu/fast/fast_kernels.h"
#include "kernels/cpu/fast/pool_avx2.h"
#include "kernels/kernels.h"
#include "kernels/op_args.h"

static kiln_strided blocked(void *data, kiln_dtype dt, int64_t n, int64_t c, int64_t h, int64_t w, kiln_layout layout) {
    kiln_strided s = {.data = data, .dtype = dt, .ndim = 4, .layout = layout};
    int64_t shape[4] = {n, c, h, w};
    int64_t stride = 1;
    for (int i = 3; i >= 0; i--) s.shape[i] = shape[i], s.strides[i] = stride, stride *= shape[i];
    return s;
}

/* Values that hit every rule: small integers (ties), negatives (windows
 * with nothing positive), a NaN and a -0.0 now and then. */
static void fill(float *x, size_t n, unsigned seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t r = s >> 8;
        float v = (float)((int)(r % 7) - 4);
        if (r % 97 == 0) v = NAN;
        else if (r % 89 == 0) v = -0.0f;
        x[i] = v;
    }
}

typedef struct run {
    float *y, *dx, *dx2, *dx3;
    int64_t *ix;
    double *part, *part3; /* relu_max_pool2d_backward_sum's plane sums; 3: grad_out and y plain */
    kiln_status fwd, bwd, bwd_sum, bwd_plain;
} run;

static void one(int64_t n, int64_t c, int64_t h, int64_t w, kiln_layout layout, bool relu, int rows, size_t stream,
                const float *x, const float *go, const int64_t *stray_ix, run *r) {
    int64_t oh = h / 2, ow = w / 2;
    size_t nx = (size_t)(n * c * h * w), ny = (size_t)(n * c * oh * ow);
    kiln_pool_avx2_test_set(rows, stream);
    kiln_op_attrs at = {.kernel = {2, 2}, .stride = {2, 2}};
    kiln_op_args f = {.n_in = 1, .n_out = 2, .attrs = &at};
    f.in[0] = blocked((void *)x, KILN_F32, n, c, h, w, layout);
    f.out[0] = blocked(r->y, KILN_F32, n, c, oh, ow, layout);
    f.out[1] = blocked(r->ix, KILN_I64, n, c, oh, ow, layout);
    memset(r->y, 0x7f, ny * sizeof(float));
    r->fwd = relu ? kiln_blocked_relu_max_pool2d(&f) : kiln_blocked_max_pool2d(&f);
    if (stray_ix) memcpy(r->ix, stray_ix, ny * sizeof(int64_t));
    kiln_op_args b = {.n_in = relu ? 3 : 2, .n_out = 1, .attrs = &at};
    b.in[0] = blocked((void *)go, KILN_F32, n, c, oh, ow, layout);
    if (relu) b.in[1] = blocked(r->y, KILN_F32, n, c, oh, ow, layout);
    b.in[relu ? 2 : 1] = blocked(r->ix, KILN_I64, n, c, oh, ow, layout);
    b.out[0] = blocked(r->dx, KILN_F32, n, c, h, w, layout);
    memset(r->dx, 0x7f, nx * sizeof(float));
    r->bwd = relu ? kiln_blocked_relu_max_pool2d_backward(&b) : kiln_blocked_max_pool2d_backward(&b);
    kiln_error_clear();
    r->bwd_sum = KILN_OK;
    if (relu) { /* the same backward with the plane sums */
        b.out[0].data = r->dx2;
        memset(r->dx2, 0x7f, nx * sizeof(float));
        r->bwd_sum = kiln_blocked_relu_max_pool2d_backward_sum(&b, r->part);
        kiln_error_clear();
        /* grad_out and y plain NCHW, the indices blocked */
        float *gp = malloc(ny * sizeof(float)), *yp = malloc(ny * sizeof(float));
        int64_t pooled[4] = {n, c, oh, ow};
        kiln_cpu_reorder_blocked(gp, go, sizeof(float), pooled, (int)kiln_layout_block(layout), false);
        kiln_cpu_reorder_blocked(yp, r->y, sizeof(float), pooled, (int)kiln_layout_block(layout), false);
        b.in[0] = blocked(gp, KILN_F32, n, c, oh, ow, KILN_LAYOUT_STRIDED);
        b.in[1] = blocked(yp, KILN_F32, n, c, oh, ow, KILN_LAYOUT_STRIDED);
        b.out[0].data = r->dx3;
        memset(r->dx3, 0x7f, nx * sizeof(float));
        r->bwd_plain = kiln_blocked_relu_max_pool2d_backward_sum(&b, r->part3);
        kiln_error_clear();
        free(gp), free(yp);
    }
    kiln_pool_avx2_test_set(-1, 0);
}

static int cases;

static void check(int64_t n, int64_t c, int64_t h, int64_t w, kiln_layout layout, bool relu, int stray) {
    int64_t oh = h / 2, ow = w / 2;
    size_t nx = (size_t)(n * c * h * w), ny = (size_t)(n * c * oh * ow);
    float *x = aligned_alloc(64, (nx * 4 + 63) / 64 * 64), *go = aligned_alloc(64, (ny * 4 + 63) / 64 * 64);
    fill(x, nx, (unsigned)(h * 31 + w + relu));
    fill(go, ny, 99);
    int64_t *bad = NULL;
    run r[3];
    for (int k = 0; k < 3; k++) {
        r[k].y = aligned_alloc(64, (ny * 4 + 63) / 64 * 64);
        r[k].ix = aligned_alloc(64, (ny * 8 + 63) / 64 * 64);
        r[k].dx = aligned_alloc(64, (nx * 4 + 63) / 64 * 64);
        r[k].dx2 = aligned_alloc(64, (nx * 4 + 63) / 64 * 64);
        r[k].dx3 = aligned_alloc(64, (nx * 4 + 63) / 64 * 64);
        r[k].part = malloc((size_t)(n * c) * sizeof(double));
        r[k].part3 = malloc((size_t)(n * c) * sizeof(double));
    }
    if (stray) { /* the generic forward's indices, one of them moved */
        bad = malloc(ny * sizeof(int64_t));
        one(n, c, h, w, layout, relu, 0, 0, x, go, NULL, &r[0]);
        memcpy(bad, r[0].ix, ny * sizeof(int64_t));
        size_t at = ny / 2 + 3;
        bad[at] = stray == 1 ? bad[at] + 2 : stray == 2 ? bad[at] + ((int64_t)1 << 32) : -1;
    }
    /* 0: generic rows; 1: AVX2 rows, ordinary stores; 2: AVX2 rows, streaming */
    one(n, c, h, w, layout, relu, 0, 0, x, go, bad, &r[0]);
    one(n, c, h, w, layout, relu, 1, (size_t)-1 / 2, x, go, bad, &r[1]);
    one(n, c, h, w, layout, relu, 1, 1, x, go, bad, &r[2]);
    char what[128];
    snprintf(what, sizeof what, "%s %lldx%lldx%lldx%lld %s%s", relu ? "relu_max_pool2d" : "max_pool2d", (long long)n,
             (long long)c, (long long)h, (long long)w, kiln_layout_name(layout),
             stray == 1   ? ", a stray index in the plane"
             : stray == 2 ? ", an index 2^32 off"
             : stray == 3 ? ", index -1"
                          : "");
    CHECK_MSG(r[0].fwd == KILN_OK, "%s: the generic forward failed", what);
    for (int k = 1; k < 3; k++) {
        const char *how = k == 1 ? "AVX2 rows" : "AVX2 rows, streaming";
        CHECK_MSG(r[k].fwd == KILN_OK, "%s: %s: forward failed", what, how);
        CHECK_MSG(!memcmp(r[0].y, r[k].y, ny * 4), "%s: %s: values differ from the generic rows", what, how);
        if (!stray) CHECK_MSG(!memcmp(r[0].ix, r[k].ix, ny * 8), "%s: %s: indices differ", what, how);
        CHECK_MSG(r[0].bwd == r[k].bwd, "%s: %s: backward status %d, the generic rows' %d", what, how, (int)r[k].bwd,
                  (int)r[0].bwd);
        if (r[0].bwd == KILN_OK) CHECK_MSG(!memcmp(r[0].dx, r[k].dx, nx * 4), "%s: %s: input gradients differ", what, how);
        if (relu) {
            CHECK_MSG(r[k].bwd_sum == r[0].bwd, "%s: %s: the backward with sums: status %d, without %d", what, how,
                      (int)r[k].bwd_sum, (int)r[0].bwd);
            if (r[0].bwd == KILN_OK && r[k].bwd_sum == KILN_OK) {
                CHECK_MSG(!memcmp(r[k].dx2, r[k].dx, nx * 4), "%s: %s: the backward with sums wrote another gradient",
                          what, how);
                CHECK_MSG(!memcmp(r[k].part, r[0].part, (size_t)(n * c) * sizeof(double)),
                          "%s: %s: plane sums differ from the generic rows'", what, how);
            }
        }
        cases++;
    }
    for (int k = 0; relu && k < 3; k++) { /* grad_out and y plain: the blocked inputs' results */
        CHECK_MSG(r[k].bwd_plain == r[k].bwd_sum, "%s, rows %d: plain grad_out and y: status %d, blocked %d", what, k,
                  (int)r[k].bwd_plain, (int)r[k].bwd_sum);
        if (r[k].bwd_plain == KILN_OK && r[k].bwd_sum == KILN_OK) {
            CHECK_MSG(!memcmp(r[k].dx3, r[k].dx2, nx * 4), "%s, rows %d: plain grad_out and y give another gradient",
                      what, k);
            CHECK_MSG(!memcmp(r[k].part3, r[k].part, (size_t)(n * c) * sizeof(double)),
                      "%s, rows %d: plain grad_out and y give other plane sums", what, k);
        }
    }
    if (relu && r[0].bwd == KILN_OK && r[0].bwd_sum == KILN_OK) { /* each plane's sum is its gradient's */
        int64_t L = kiln_layout_block(layout), hw = h * w;
        for (int64_t i = 0; i < n; i++)
            for (int64_t ch = 0; ch < c; ch++) {
                double want = 0.0;
                for (int64_t p = 0; p < hw; p++) want += r[0].dx[((i * (c / L) + ch / L) * hw + p) * L + ch % L];
                double got = r[0].part[i * c + ch];
                CHECK_MSG((isnan(want) && isnan(got)) || fabs(got - want) <= 1e-6 * (1.0 + fabs(want)),
                          "%s: plane (%lld, %lld) sums to %.9g, its gradient to %.9g", what, (long long)i,
                          (long long)ch, got, want);
            }
    }
    if (stray == 3) CHECK_MSG(r[0].bwd != KILN_OK, "%s: an index outside the plane was accepted", what);
    for (int k = 0; k < 3; k++)
        free(r[k].y), free(r[k].ix), free(r[k].dx), free(r[k].dx2), free(r[k].dx3), free(r[k].part), free(r[k].part3);
    free(x), free(go), free(bad);
}

int main(void) {
    if (!kiln_pool_avx2_ok()) kt_skip("this CPU has no AVX2: the pooling kernels keep their generic rows");
    if (kiln_init() != KILN_OK) {
        fprintf(stderr, "kiln_init: %s\n", kiln_error_message());
        return 1;
    }
    static const int64_t shapes[][4] = {{2, 16, 8, 8}, {3, 16, 7, 9}, {1, 32, 28, 28}, {2, 48, 5, 6}, {1, 16, 2, 2}};
    static const kiln_layout layouts[] = {KILN_LAYOUT_NCHW8C, KILN_LAYOUT_NCHW16C};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int l = 0; l < 2; l++)
            for (int relu = 0; relu < 2; relu++)
                for (int stray = 0; stray < 4; stray++)
                    if (!stray || s < 2)
                        check(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], layouts[l], relu, stray);
    printf("%d comparisons with the generic rows\n", cases);
    kiln_shutdown();
    return kt_finish();
}
