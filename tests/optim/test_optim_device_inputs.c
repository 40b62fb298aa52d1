/* The fused optimizer kernels' graph-safe inputs (kernels/optim_kernels.h),
 * on the CPU and, where there is one, on cuda:0 (a GPU or the emulation
 * build): device scalars (Adam's {lr, step_size, bc2_sqrt}, SGD's lr)
 * replace the launch's own and give the same bits as a launch carrying
 * the values; a found-inf flag of 0 changes nothing, and a nonzero one
 * leaves the parameter and every moment untouched (one update of a batch
 * skipped, its neighbour in the same launch updated). These are what a
 * CUDA graph's replay (src/trace/program_graph.c) and a scaler's skipped
 * step rely on. */
#include <math.h>
#include <string.h>

#include "kernels/optim_kernels.h"
#include "kiln/kiln.h"
#include "test_util.h"

enum { N = 301 };

/* A tensor on dev holding host data. */
static kiln_tensor *on(kiln_device dev, kiln_shape shape, kiln_dtype dt, const void *data) {
    kiln_tensor *h = kiln_from_data(shape, dt, KILN_CPU, data);
    kiln_tensor *t = h ? kiln_to(h, dev, dt, KILN_COPY) : NULL;
    kiln_release(h);
    CHECK(t != NULL);
    return t;
}

/* One set of Adam state (f32) on dev: p, g, m, v. */
typedef struct set {
    kiln_tensor *t[4];
} set;

static set make_set(kiln_device dev, int salt) {
    float v[4][N];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < N; i++) {
            double x = sin(0.31 * (double)(i + 1) * (k + 2) + salt) * pow(10.0, (double)((i + k) % 4) - 2.0);
            v[k][i] = (float)(k == 3 ? fabs(x) : x);
        }
    set s;
    for (int k = 0; k < 4; k++) s.t[k] = on(dev, KILN_SHAPE(N), KILN_F32, v[k]);
    return s;
}

static void free_set(set *s) {
    for (int k = 0; k < 4; k++) kiln_release(s->t[k]);
}

/* Bit-identical, element by element, read through the host. */
static bool same(kiln_tensor *a, kiln_tensor *b) {
    kiln_tensor *x = kiln_to(a, KILN_CPU, KILN_F32, KILN_COPY),
                *y = kiln_to(b, KILN_CPU, KILN_F32, KILN_COPY);
    bool r = x && y && !memcmp(kiln_data_ptr(x), kiln_data_ptr(y), N * sizeof(float));
    kiln_release(x), kiln_release(y);
    return r;
}

static bool same_set(set *a, set *b) {
    bool r = true;
    for (int k = 0; k < 4; k++) r = r && same(a->t[k], b->t[k]);
    return r;
}

static kiln_adam_step adam_of(set *s, double lr, int64_t step) {
    double bc1 = 1.0 - pow(0.9, (double)step), bc2 = 1.0 - pow(0.999, (double)step);
    return (kiln_adam_step){.dtype = KILN_F32,
                            .n = N,
                            .p = kiln_data_ptr(s->t[0]),
                            .g = kiln_data_ptr(s->t[1]),
                            .m = kiln_data_ptr(s->t[2]),
                            .v = kiln_data_ptr(s->t[3]),
                            .beta1 = 0.9,
                            .beta2 = 0.999,
                            .eps = 1e-8,
                            .weight_decay = 0.01,
                            .adamw = true,
                            .lr = lr,
                            .step_size = lr / bc1,
                            .bc2_sqrt = sqrt(bc2)};
}

static void check_adam(kiln_device dev, const kiln_optim_kernels *k) {
    set ref = make_set(dev, 1), viadev = make_set(dev, 1), skip = make_set(dev, 2), orig = make_set(dev, 2);
    set start = make_set(dev, 1);
    const double lr = 3e-3;
    kiln_adam_step a = adam_of(&ref, lr, 3);
    CHECK_OK(k->adam(&a, 1, NULL));
    /* The launch's own scalars are wrong on purpose: only the device ones may be used. */
    kiln_adam_step d = adam_of(&viadev, 1.0, 1);
    d.lr = d.step_size = d.bc2_sqrt = NAN;
    double sc[3] = {a.lr, a.step_size, a.bc2_sqrt};
    float zero = 0.0f, one = 1.0f;
    kiln_tensor *scalars = on(dev, KILN_SHAPE(3), KILN_F64, sc);
    kiln_tensor *f0 = on(dev, KILN_SHAPE(1), KILN_F32, &zero);
    kiln_tensor *f1 = on(dev, KILN_SHAPE(1), KILN_F32, &one);
    d.scalars = kiln_data_ptr(scalars);
    d.found_inf = kiln_data_ptr(f0);
    /* One launch: update 0 skipped (flag set), update 1 done from device scalars. */
    kiln_adam_step both[2] = {adam_of(&skip, lr, 3), d};
    both[0].found_inf = kiln_data_ptr(f1);
    CHECK_OK(k->adam(both, 2, NULL));
    char name[32];
    kiln_device_str(dev, name, sizeof name);
    CHECK_MSG(same_set(&ref, &viadev), "%s Adam: device scalars differ from the launch's", name);
    CHECK_MSG(same_set(&skip, &orig), "%s Adam: a set found-inf flag did not skip the update", name);
    CHECK_MSG(!same(ref.t[0], start.t[0]), "%s Adam: the reference step moved nothing", name);
    kiln_release(scalars), kiln_release(f0), kiln_release(f1);
    free_set(&ref), free_set(&viadev), free_set(&skip), free_set(&orig), free_set(&start);
}

static void check_sgd(kiln_device dev, const kiln_optim_kernels *k) {
    set ref = make_set(dev, 3), viadev = make_set(dev, 3), skip = make_set(dev, 4), orig = make_set(dev, 4);
    kiln_sgd_step a = {.dtype = KILN_F32,
                       .n = N,
                       .p = kiln_data_ptr(ref.t[0]),
                       .g = kiln_data_ptr(ref.t[1]),
                       .buf = kiln_data_ptr(ref.t[2]),
                       .momentum = 0.9,
                       .dampening = 0.1,
                       .lr = 0.05};
    CHECK_OK(k->sgd(&a, 1, NULL));
    kiln_sgd_step d = a, s = a;
    d.p = kiln_data_ptr(viadev.t[0]), d.g = kiln_data_ptr(viadev.t[1]), d.buf = kiln_data_ptr(viadev.t[2]);
    d.lr = NAN;
    s.p = kiln_data_ptr(skip.t[0]), s.g = kiln_data_ptr(skip.t[1]), s.buf = kiln_data_ptr(skip.t[2]);
    double lr = 0.05;
    float one = 2.5f;
    kiln_tensor *lr_t = on(dev, KILN_SHAPE(1), KILN_F64, &lr);
    kiln_tensor *f1 = on(dev, KILN_SHAPE(1), KILN_F32, &one);
    d.lr_dev = kiln_data_ptr(lr_t);
    s.found_inf = kiln_data_ptr(f1);
    kiln_sgd_step both[2] = {s, d};
    CHECK_OK(k->sgd(both, 2, NULL));
    char name[32];
    kiln_device_str(dev, name, sizeof name);
    CHECK_MSG(same_set(&ref, &viadev), "%s SGD: the device lr differs from the launch's", name);
    CHECK_MSG(same_set(&skip, &orig), "%s SGD: a set found-inf flag did not skip the update", name);
    kiln_release(lr_t), kiln_release(f1);
    free_set(&ref), free_set(&viadev), free_set(&skip), free_set(&orig);
}

int main(void) {
    CHECK_OK(kiln_init());
    kiln_device devs[2] = {KILN_CPU, {KILN_DEVICE_CUDA, 0}};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && !kiln_device_is_available(devs[i])) continue;
        const kiln_optim_kernels *k = kiln_optim_kernels_for(devs[i].type);
        CHECK(k != NULL);
        if (!k) continue;
        check_adam(devs[i], k);
        check_sgd(devs[i], k);
        CHECK_OK(kiln_device_synchronize(devs[i]));
    }
    kiln_shutdown();
    return kt_finish();
}
