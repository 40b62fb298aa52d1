/* kiln_trace of an inference forward on the CPU: the tutorial CNN and the
 * small ResNet (eval mode, grad off) traced once at batch 2, replayed on
 * fresh data several times, each result bit-identical to the eager
 * forward on the same data, also after the weights were written in place
 * (the kernels' prepared copies refilled, a lazy one from its second
 * replay); no allocator call after the first replay, a write to the
 * weights included (kiln_memory_alloc_count); the memory plan shares bytes (arena smaller
 * than the blocks' sum); guards name what changed and say retrace. */
#include <math.h>
#include <string.h>

#include "tensor/tensor_internal.h"
#include "test_util.h"

static kiln_module *load(const char *file, int64_t c, int64_t h, int64_t w) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, file);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_load(path, c, h, w, &m));
    return m;
}

static kiln_status forward(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    out[0] = kiln_module_forward((kiln_module *)user, in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

static bool same_bits(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_numel(a) != kiln_numel(b) || kiln_dtype_of(a) != kiln_dtype_of(b)) return false;
    kiln_tensor *ha = kiln_contiguous(a), *hb = kiln_contiguous(b);
    bool same = ha && hb &&
                !memcmp(kiln_data_ptr(ha), kiln_data_ptr(hb),
                        (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a)));
    /* NaNs compare equal bit for bit: insist on finite results. */
    for (int64_t i = 0; same && kiln_dtype_of(a) == KILN_F32 && i < kiln_numel(a); i++)
        same = isfinite(((const float *)kiln_data_ptr(ha))[i]);
    kiln_release(ha), kiln_release(hb);
    return same;
}

static void check_model(const char *file, int64_t c, int64_t hw) {
    kiln_module *m = load(file, c, hw, hw);
    if (!m) return;
    kiln_module_train(m, false);
    kiln_no_grad_begin();
    kiln_manual_seed(7);
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, c, hw, hw), KILN_F32, KILN_CPU);
    kiln_program *p = NULL;
    kiln_tensor *eager = NULL;
    CHECK_OK(kiln_trace(forward, m, 1, &x, 1, &eager, &p));
    if (p) {
        kiln_program_stats st;
        CHECK_OK(kiln_program_stats_get(p, &st));
        CHECK_MSG(st.n_steps >= 5 && st.arena_bytes > 0 && st.arena_bytes < st.unplanned_bytes,
                  "%s: %d steps, arena %zu of %zu", file, st.n_steps, st.arena_bytes, st.unplanned_bytes);
        int64_t allocs_before = 0;
        for (int round = 0; round < 7; round++) {
            if (round == 4) { /* the weights written in place (a training step's update): same storage */
                kiln_named_tensor *ps = NULL;
                int np = 0;
                CHECK_OK(kiln_module_named_parameters(m, &ps, &np));
                for (int i = 0; i < np; i++) {
                    kiln_tensor *half = kiln_mul_scalar(ps[i].tensor, 0.5);
                    CHECK_OK(kiln_copy_(ps[i].tensor, half, 0));
                    kiln_release(half);
                }
                free(ps);
            }
            kiln_tensor *xi =
                round == 0 ? kiln_retain(x) : kiln_randn(KILN_SHAPE(2, c, hw, hw), KILN_F32, KILN_CPU);
            if (round >= 2) allocs_before = kiln_memory_alloc_count();
            kiln_tensor *y = NULL;
            /* after the write, twice with no eager call between (which would
             * refill the copies itself): the second replay refills them */
            for (int twice = 0; twice < (round == 4 ? 2 : 1); twice++) {
                kiln_release(y);
                y = NULL;
                CHECK_OK(kiln_program_run(p, 1, &xi, 1, &y));
            }
            if (round >= 2) CHECK_EQ_I(kiln_memory_alloc_count() - allocs_before, 0);
            kiln_tensor *ref = round == 0 ? kiln_retain(eager) : kiln_module_forward(m, xi);
            CHECK_MSG(same_bits(y, ref), "%s: replay %d differs from eager", file, round);
            kiln_release(ref), kiln_release(y), kiln_release(xi);
        }
        /* Guards. */
        kiln_tensor *bad = kiln_randn(KILN_SHAPE(3, c, hw, hw), KILN_F32, KILN_CPU), *y = NULL;
        CHECK_FAILS(kiln_program_run(p, 1, &bad, 1, &y), KILN_ERR_INVALID_ARGUMENT, "input 0 has shape [3,");
        CHECK(strstr(kiln_error_last()->hint, "retrace") != NULL);
        kiln_release(bad);
        kiln_grad_mode_end();
        CHECK_FAILS(kiln_program_run(p, 1, &x, 1, &y), KILN_ERR_INVALID_ARGUMENT, "grad mode is on");
        kiln_no_grad_begin();
        CHECK_OK(kiln_autocast_begin(KILN_DEVICE_CPU, KILN_BF16));
        CHECK_FAILS(kiln_program_run(p, 1, &x, 1, &y), KILN_ERR_INVALID_ARGUMENT, "autocast is on in bf16");
        CHECK_OK(kiln_autocast_end());
        kiln_tensor *nc = kiln_randn(KILN_SHAPE(2, c, hw, hw + 1), KILN_F32, KILN_CPU);
        kiln_tensor *view = kiln_narrow(nc, 3, 0, hw);
        CHECK_FAILS(kiln_program_run(p, 1, &view, 1, &y), KILN_ERR_INVALID_ARGUMENT, "input 0 has strides");
        kiln_release(view), kiln_release(nc);
        /* A weight given new storage (as a state dict loaded by swapping
         * would): the program would still read the old one. */
        kiln_named_tensor *params = NULL;
        int n = 0;
        CHECK_OK(kiln_module_named_parameters(m, &params, &n));
        if (n > 0) {
            kiln_tensor *w = params[0].tensor, *fresh = kiln_to(w, KILN_CPU, kiln_dtype_of(w), KILN_COPY);
            kiln_tensor_swap_data(w, fresh);
            CHECK_FAILS(kiln_program_run(p, 1, &x, 1, &y), KILN_ERR_INVALID_ARGUMENT, "has new storage");
            kiln_tensor_swap_data(w, fresh);
            kiln_release(fresh);
            CHECK_OK(kiln_program_run(p, 1, &x, 1, &y));
            kiln_release(y);
        }
        free(params);
    }
    kiln_program_free(p);
    kiln_release(eager), kiln_release(x);
    kiln_grad_mode_end();
    kiln_module_free(m);
}

int main(void) {
    CHECK_OK(kiln_init());
    check_model("tutorial_cnn_32x32x3.txt", 3, 32);
    check_model("tutorial_cnn_28x28x1.txt", 1, 28);
    check_model("resnet_small_cifar10.txt", 3, 32);
    kiln_shutdown();
    return kt_finish();
}
