/* Inference from a saved, traced program: what `kiln export --traced`
 * writes, run from C with nothing but the file — no model spec, no
 * autograd, no dispatcher (docs/trace.md).
 *
 *   example_infer PROGRAM.kiln   load the program, run it on N(0, 1) input
 *   example_infer                first make one: trace the tutorial CNN
 *                                (1x28x28) at batch 1, save it to a
 *                                temporary file, then load and run it and
 *                                check the result against the eager model */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kiln/kiln.h>

static const char spec[] = "conv 32 k3 p1\nrelu\nmaxpool 2\nconv 64 k3 p1\nrelu\nmaxpool 2\n"
                           "conv 128 k3 p1\nrelu\nmaxpool 2\nflatten\nlinear 512\nrelu\nlinear 10\n";

static int fail(const char *what) {
    fprintf(stderr, "example_infer: %s: %s\n", what, kiln_error_message());
    return 1;
}

/* The call kiln_trace records: one forward of the model. */
static kiln_status forward(void *model, kiln_tensor *const *in, kiln_tensor **out) {
    out[0] = kiln_module_forward(model, in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

/* Trace the model's inference forward and save it: what kiln export
 * --traced does for a checkpoint. */
static int make_program(kiln_module *m, const char *path) {
    kiln_module_train(m, false);
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(1, 1, 28, 28), KILN_F32, KILN_CPU);
    kiln_program *p = NULL;
    int rc = x && !kiln_trace(forward, m, 1, &x, 1, NULL, &p) && !kiln_program_save(p, path, m)
                 ? 0
                 : fail("trace");
    kiln_program_free(p);
    kiln_release(x);
    kiln_grad_mode_end();
    return rc;
}

/* Load the program and run it: this is all an inference binary needs. */
static int run_program(const char *path, kiln_module *check_against) {
    kiln_program *p = NULL;
    if (kiln_program_load(path, &p)) return fail("load");
    kiln_shape shape;
    kiln_dtype dtype;
    kiln_program_input_info(p, 0, &shape, &dtype); /* the traced input's shape */
    kiln_tensor *x = kiln_randn(shape, dtype, KILN_CPU), *y = NULL;
    int rc = 0;
    if (kiln_program_run(p, 1, &x, 1, &y)) rc = fail("run"); /* blocks until the CPU kernels ran */
    if (!rc) {
        const float *v = kiln_data_ptr(y); /* the program's output tensor: the next run overwrites it */
        printf("output (%lld values):", (long long)kiln_numel(y));
        for (int64_t i = 0; i < kiln_numel(y) && i < 10; i++) printf(" %.5f", v[i]);
        printf("\n");
    }
    if (!rc && check_against) {
        kiln_no_grad_begin();
        kiln_tensor *ref = kiln_module_forward(check_against, x);
        bool same = ref && kiln_numel(ref) == kiln_numel(y) &&
                    !memcmp(kiln_data_ptr(ref), kiln_data_ptr(y), (size_t)kiln_numel(y) * sizeof(float));
        kiln_grad_mode_end();
        printf("the loaded program %s the eager model's output bit for bit\n",
               same ? "gives" : "does NOT give");
        if (!same) rc = 1;
        kiln_release(ref);
    }
    kiln_release(y);
    kiln_release(x);
    kiln_program_free(p);
    return rc;
}

int main(int argc, char **argv) {
    if (kiln_init()) return 1;
    int rc;
    if (argc > 1) {
        rc = run_program(argv[1], NULL);
    } else {
        char path[] = "/tmp/kiln_example_infer_XXXXXX";
        int fd = mkstemp(path);
        kiln_module *m = NULL;
        if (fd < 0 || kiln_model_spec_parse(spec, "tutorial_cnn", 1, 28, 28, &m)) {
            rc = fail("model");
        } else {
            close(fd);
            rc = make_program(m, path);
            if (!rc) rc = run_program(path, m);
            unlink(path);
        }
        kiln_module_free(m);
    }
    kiln_shutdown();
    return rc;
}
