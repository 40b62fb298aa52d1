/* Saved inference programs: the tutorial CNN and the small ResNet traced
 * at batch 1 and saved (kiln_program_save), loaded back with
 * kiln_program_load and run on fresh inputs, each result bit-identical to
 * the eager forward; the file's tensors carry the state dict's names.
 * Loading validates: a missing file, a safetensors file without a program,
 * and descriptions edited to lie (a newer version, an unknown op, a view
 * reaching past its buffer, an output shape the op would not give, a
 * missing tensor, a wrong tensor shape) each give KILN_ERR_IO naming the
 * problem. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors_internal.h"
#include "trace/trace_internal.h"
#include "trace/trace_test_util.h"

static char *description(const char *path) {
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(path, &f));
    const char *t = f ? kiln_safetensors_metadata(f, "kiln.program") : NULL;
    char *copy = t ? strdup(t) : NULL;
    kiln_safetensors_close(f);
    return copy;
}

/* text with the first `from` replaced by `to`, parsed: must fail naming `needle`. */
static void check_lie(const char *text, const char *from, const char *to, const char *needle) {
    const char *at = strstr(text, from);
    CHECK_MSG(at != NULL, "'%s' not in the description", from);
    if (!at) return;
    size_t n = strlen(text) + strlen(to) + 1;
    char *t = malloc(n);
    snprintf(t, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    kiln_program *p = NULL;
    CHECK_FAILS(kiln_program_parse("lie.kiln", t, strlen(t), &p), KILN_ERR_IO, needle);
    CHECK(p == NULL);
    free(t);
}

static void check_model(const char *file, const char *path) {
    kiln_device cpu = {KILN_DEVICE_CPU, 0};
    tt_model md = tt_make(file, cpu, KILN_F32);
    if (!md.m) return;
    kiln_module_train(md.m, false);
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_randn(KILN_SHAPE(1, 3, 32, 32), KILN_F32, cpu);
    kiln_program *p = NULL, *q = NULL;
    CHECK_OK(kiln_trace(tt_forward, md.m, 1, &x, 1, NULL, &p));
    if (p) CHECK_OK(kiln_program_save(p, path, md.m));
    kiln_program_free(p);
    kiln_grad_mode_end(); /* a loaded program has no grad-mode guard */
    CHECK_OK(kiln_program_load(path, &q));
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(path, &f));
    if (f) CHECK_OK(kiln_safetensors_tensor_info(f, "0.weight", NULL, NULL));
    kiln_safetensors_close(f);
    kiln_no_grad_begin();
    for (int r = 0; q && r < 3; r++) {
        kiln_tensor *xi = kiln_randn(KILN_SHAPE(1, 3, 32, 32), KILN_F32, cpu), *y = NULL;
        CHECK_OK(kiln_program_run(q, 1, &xi, 1, &y));
        kiln_tensor *ref = kiln_module_forward(md.m, xi);
        CHECK_MSG(tt_same_bits(y, ref), "%s: loaded program run %d differs from eager", file, r);
        kiln_release(y), kiln_release(ref), kiln_release(xi);
    }
    kiln_grad_mode_end();
    kiln_program_free(q);
    kiln_release(x);
    tt_free(&md);
}

int main(void) {
    CHECK_OK(kiln_init());
    char path[] = "/tmp/kiln_trace_file_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    check_model("resnet_small_cifar10.txt", path);
    check_model("tutorial_cnn_32x32x3.txt", path);
    kiln_program *p = NULL;
    CHECK_FAILS(kiln_program_load("/nonexistent/prog.kiln", &p), KILN_ERR_IO, "/nonexistent/prog.kiln");
    char *text = description(path);
    if (text) {
        CHECK_OK(kiln_program_parse("ok.kiln", text, strlen(text), &p));
        kiln_program_free(p);
        check_lie(text, "\"version\":1", "\"version\":2", "version 2");
        check_lie(text, "\"op\":\"conv2d_relu_max_pool2d\"", "\"op\":\"conv9d_relu_max_pool2d\"", "unknown op");
        check_lie(text, "\"buffers\":[[", "\"buffers\":[[1,", "buffer");
        check_lie(text, "\"s\":[1,10]", "\"s\":[1,11]", "inference");
        check_lie(text, "\"k\":\"kernel\"", "\"k\":\"kernal\"", "unknown step kind");
        check_lie(text, "\"format\":\"kiln.program\"", "\"format\":\"kiln.prog\"", "format");
        check_lie(text, "\"r\":[2,0,0]", "\"r\":[2,0,64]", "reaches past");
        check_lie(text, "\"r\":[2,0,0]", "\"r\":[2,3,0]", "does not exist");
        check_lie(text, "{", "[", "bad Kiln program");
    }
    /* The tensors must be in the file as described. */
    kiln_module *m = NULL;
    char spec[1024];
    snprintf(spec, sizeof spec, "%s/models/tutorial_cnn_32x32x3.txt", KILN_SOURCE_DIR);
    CHECK_OK(kiln_model_spec_load(spec, 3, 32, 32, &m));
    if (m && text) {
        /* A plain weights file: no program in it. */
        CHECK_OK(kiln_safetensors_save(path, m));
        CHECK_FAILS(kiln_program_load(path, &p), KILN_ERR_IO, "not a Kiln program");
        /* The program with one weight renamed away, then with a shape changed. */
        kiln_named_tensor items[2] = {{"0.weight.renamed", kiln_module_state_get(m, "0.weight")},
                                      {"0.bias", kiln_module_state_get(m, "0.bias")}};
        const char *meta[2] = {"kiln.program", text};
        CHECK_OK(kiln_st_write(path, items, 2, meta, 1));
        CHECK_FAILS(kiln_program_load(path, &p), KILN_ERR_INVALID_ARGUMENT, "0.weight");
        kiln_release(items[0].tensor);
        items[0] = (kiln_named_tensor){"0.weight", kiln_module_state_get(m, "3.weight")};
        CHECK_OK(kiln_st_write(path, items, 2, meta, 1));
        CHECK_FAILS(kiln_program_load(path, &p), KILN_ERR_IO, "another shape");
        kiln_release(items[0].tensor), kiln_release(items[1].tensor);
    }
    kiln_module_free(m);
    free(text);
    unlink(path);
    kiln_shutdown();
    return kt_finish();
}
