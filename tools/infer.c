/* kiln infer: runs a saved inference program (kiln export --traced, or
 * kiln_program_save) from the command line: no model spec, no autograd.
 *
 *   kiln infer --program DIR/model.kiln --input x.safetensors [--input-name NAME] [--out y.safetensors]
 *   kiln infer --program DIR/model.kiln --random [--seed S]
 *
 * The input is a safetensors file holding the input tensor (its only
 * tensor, or the one --input-name names) with exactly the shape and dtype
 * the program was traced with; --random feeds N(0, 1) numbers of that
 * shape. Prints each row's arg-max and values, then one JSON line; --out
 * writes the output as safetensors (tensor "output").
 *
 * Also the traced part of kiln export: kiln export --checkpoint FILE --out
 * DIR --traced --example NxCxHxW writes DIR/model.kiln. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "io/safetensors_internal.h"

static bool parse_shape(const char *s, int64_t out[4]) {
    long long v[4];
    char tail;
    if (sscanf(s, "%lldx%lldx%lldx%lld%c", &v[0], &v[1], &v[2], &v[3], &tail) != 4) return false;
    for (int i = 0; i < 4; i++) {
        if (v[i] < 1 || v[i] > (1 << 20)) return false;
        out[i] = v[i];
    }
    return true;
}

int kiln_export_traced_flags(int *argc, char **argv, export_traced *out) {
    *out = (export_traced){0};
    bool have_example = false;
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        if (!strcmp(argv[i], "--traced")) {
            out->on = true;
        } else if (!strcmp(argv[i], "--example")) {
            if (i + 1 >= *argc || !parse_shape(argv[i + 1], out->example)) {
                fprintf(stderr, "kiln export: --example takes the traced input's shape NxCxHxW, each 1..2^20 "
                                "(e.g. --example 1x3x32x32)\n");
                return 2;
            }
            have_example = true;
            i++;
        } else {
            argv[w++] = argv[i];
        }
    }
    *argc = w;
    if (out->on != have_example) {
        fprintf(
            stderr,
            "kiln export: --traced and --example SHAPE go together (e.g. --traced --example 1x3x32x32)\n");
        return 2;
    }
    return 0;
}

static kiln_status forward(void *user, kiln_tensor *const *in, kiln_tensor **out) {
    out[0] = kiln_module_forward((kiln_module *)user, in[0]);
    return out[0] ? KILN_OK : kiln_error_last()->status;
}

int kiln_export_traced(kiln_module *m, const export_traced *t, const char *dir, int64_t c, int64_t h,
                       int64_t w) {
    if (t->example[1] != c || t->example[2] != h || t->example[3] != w) {
        fprintf(stderr,
                "kiln export: --example %lldx%lldx%lldx%lld: the model takes %lldx%lldx%lld images; pass "
                "--example Nx%lldx%lldx%lld\n",
                (long long)t->example[0], (long long)t->example[1], (long long)t->example[2],
                (long long)t->example[3], (long long)c, (long long)h, (long long)w, (long long)c,
                (long long)h, (long long)w);
        return 2;
    }
    kiln_device cpu = {KILN_DEVICE_CPU, 0};
    if (kiln_module_to(m, cpu) != KILN_OK) {
        fprintf(stderr, "kiln export: %s\n", kiln_error_message());
        return 1;
    }
    kiln_module_train(m, false);
    kiln_no_grad_begin();
    kiln_tensor *x = kiln_zeros(KILN_SHAPE(t->example[0], c, h, w), KILN_F32, cpu);
    kiln_program *p = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.kiln", dir);
    int rc = 0;
    if (!x || kiln_trace(forward, m, 1, &x, 1, NULL, &p) != KILN_OK ||
        kiln_program_save(p, path, m) != KILN_OK) {
        fprintf(stderr, "kiln export: tracing the model: %s\n", kiln_error_message());
        rc = 1;
    } else {
        kiln_program_stats st;
        kiln_program_stats_get(p, &st);
        printf(
            "kiln export: %s: traced inference program for input %lldx%lldx%lldx%lld (%d steps, %d tensors, "
            "arena %.1f KiB)\n",
            path, (long long)t->example[0], (long long)c, (long long)h, (long long)w, st.n_steps,
            st.n_external, st.arena_bytes / 1024.0);
    }
    kiln_program_free(p);
    kiln_release(x);
    kiln_grad_mode_end();
    return rc;
}

typedef struct infer_args {
    const char *program, *input, *input_name, *out;
    bool random;
    unsigned long long seed;
} infer_args;

static int usage(FILE *f, int rc) {
    fprintf(
        f,
        "usage: kiln infer --program FILE (--input FILE.safetensors [--input-name NAME] | --random [--seed "
        "S])\n"
        "                  [--out FILE.safetensors]\n"
        "  runs a traced inference program (kiln export --traced) on the CPU: no model spec, no autograd\n");
    return rc;
}

static int parse(int argc, char **argv, infer_args *a) {
    *a = (infer_args){.seed = 0};
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        bool v = i + 1 < argc;
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) return -1;
        if (!strcmp(s, "--program") && v)
            a->program = argv[++i];
        else if (!strcmp(s, "--input") && v)
            a->input = argv[++i];
        else if (!strcmp(s, "--input-name") && v)
            a->input_name = argv[++i];
        else if (!strcmp(s, "--out") && v)
            a->out = argv[++i];
        else if (!strcmp(s, "--random"))
            a->random = true;
        else if (!strcmp(s, "--seed") && v)
            a->seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "kiln infer: unknown or incomplete argument '%s'\n", s);
            return 2;
        }
    }
    if (!a->program || (!a->input) == !a->random) {
        fprintf(stderr, "kiln infer: give --program FILE and one of --input FILE or --random\n");
        return 2;
    }
    return 0;
}

/* The input tensor from the file, on the CPU; NULL after a message. */
static kiln_tensor *read_input(const infer_args *a) {
    kiln_safetensors *f = NULL;
    if (kiln_safetensors_open(a->input, &f) != KILN_OK) {
        fprintf(stderr, "kiln infer: --input: %s\n", kiln_error_message());
        return NULL;
    }
    const char *name = a->input_name;
    if (!name && kiln_safetensors_tensor_count(f) != 1)
        fprintf(stderr, "kiln infer: --input %s holds %d tensors: name the input with --input-name\n",
                a->input, kiln_safetensors_tensor_count(f));
    else if (!name)
        name = kiln_safetensors_tensor_name(f, 0);
    kiln_tensor *x = name ? kiln_safetensors_get(f, name, (kiln_device){KILN_DEVICE_CPU, 0}) : NULL;
    if (name && !x) fprintf(stderr, "kiln infer: --input: %s\n", kiln_error_message());
    kiln_safetensors_close(f);
    return x;
}

static void print_output(kiln_tensor *y) {
    kiln_tensor *h = kiln_to(y, (kiln_device){KILN_DEVICE_CPU, 0}, KILN_F32, KILN_COPY);
    if (!h) return;
    int64_t rows = kiln_ndim(h) >= 2 ? kiln_size(h, 0) : 1, cols = rows ? kiln_numel(h) / rows : 0;
    const float *v = kiln_data_ptr(h);
    for (int64_t r = 0; r < rows && r < 64; r++) {
        int64_t best = 0;
        for (int64_t k = 1; k < cols; k++)
            if (v[r * cols + k] > v[r * cols + best]) best = k;
        printf("row %lld: argmax %lld:", (long long)r, (long long)best);
        for (int64_t k = 0; k < cols && k < 16; k++) printf(" %.6g", v[r * cols + k]);
        printf("%s\n", cols > 16 ? " ..." : "");
    }
    if (rows > 64) printf("(%lld rows more)\n", (long long)(rows - 64));
    kiln_release(h);
}

int kiln_cmd_infer(int argc, char **argv) {
    infer_args a;
    int rc = parse(argc, argv, &a);
    if (rc < 0) return usage(stdout, 0);
    if (rc) return usage(stderr, rc);
    kiln_program *p = NULL;
    if (kiln_program_load(a.program, &p) != KILN_OK) {
        fprintf(stderr, "kiln infer: %s%s%s\n", kiln_error_message(), kiln_error_last()->hint[0] ? " (" : "",
                kiln_error_last()->hint[0] ? kiln_error_last()->hint : "");
        if (kiln_error_last()->hint[0]) fprintf(stderr, ")\n");
        return 1;
    }
    kiln_tensor *x = NULL;
    if (a.random) {
        /* The traced input's shape: the program's guard says it. */
        kiln_shape s;
        kiln_dtype dt;
        if (kiln_program_input_info(p, 0, &s, &dt) == KILN_OK) {
            kiln_manual_seed(a.seed);
            x = kiln_randn(s, dt, (kiln_device){KILN_DEVICE_CPU, 0});
        }
    } else {
        x = read_input(&a);
    }
    kiln_tensor *y = NULL;
    if (!x) {
        rc = 1;
    } else if (kiln_program_run(p, 1, &x, 1, &y) != KILN_OK) {
        fprintf(stderr, "kiln infer: %s (%s)\n", kiln_error_message(), kiln_error_last()->hint);
        rc = 1;
    } else {
        print_output(y);
        if (a.out) {
            kiln_named_tensor item = {"output", y};
            if (kiln_st_write(a.out, &item, 1, NULL, 0) != KILN_OK) {
                fprintf(stderr, "kiln infer: --out: %s\n", kiln_error_message());
                rc = 1;
            }
        }
        char shape[128];
        int o = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < kiln_ndim(y) && o < 100; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", d ? "," : "",
                          (long long)kiln_size(y, d));
        snprintf(shape + o, sizeof shape - (size_t)o, "]");
        printf("{\"event\":\"infer\",\"program\":\"%s\",\"output_shape\":%s}\n", a.program, shape);
    }
    kiln_release(y), kiln_release(x);
    kiln_program_free(p);
    return rc;
}
