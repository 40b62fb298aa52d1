/* kiln eval (test accuracy and loss of a checkpoint) and kiln export
 * (weights-only safetensors + the model spec, for inference). Both
 * rebuild the model from --model SPEC or from the spec the checkpoint
 * stores (kiln train embeds it). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "kiln/kiln.h"
#include "infer.h"
#include "train.h"

typedef struct tool_args {
    const char *checkpoint, *model, *data, *out, *device;
    int64_t batch, limit;
} tool_args;

static int parse(const char *cmd, int argc, char **argv, tool_args *a, bool want_out) {
    *a = (tool_args){.batch = 256};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) return -1;
        if (i + 1 >= argc) {
            fprintf(stderr, "kiln %s: %s needs a value (kiln %s --help)\n", cmd, o, cmd);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(o, "--checkpoint"))
            a->checkpoint = v;
        else if (!strcmp(o, "--model"))
            a->model = v;
        else if (!want_out && !strcmp(o, "--data"))
            a->data = v;
        else if (!want_out && !strcmp(o, "--device"))
            a->device = v;
        else if (want_out && !strcmp(o, "--device")) {
            fprintf(stderr, "kiln export: --device %s: export runs no model (it reads the checkpoint on the host and "
                            "writes host files), so it takes no device; drop --device\n", v);
            return 2;
        }
        else if (!want_out && (!strcmp(o, "--batch") || !strcmp(o, "--limit"))) {
            errno = 0;
            long long n = strtoll(v, &end, 10);
            if (!*v || *end || n < 1 || errno == ERANGE) {
                fprintf(stderr, "kiln %s: bad value '%s' for %s: give a whole number from 1 to %lld\n", cmd,
                        v, o, LLONG_MAX);
                return 2;
            }
            if (!strcmp(o, "--batch"))
                a->batch = n;
            else
                a->limit = n;
        } else if (want_out && !strcmp(o, "--out"))
            a->out = v;
        else {
            fprintf(stderr, "kiln %s: unknown option '%s' (kiln %s --help)\n", cmd, o, cmd);
            return 2;
        }
    }
    if (!a->checkpoint || (want_out && !a->out)) {
        fprintf(stderr, "kiln %s: %s required (kiln %s --help)\n", cmd,
                want_out ? "--checkpoint FILE and --out DIR are" : "--checkpoint FILE is", cmd);
        return 2;
    }
    return 0;
}

/* mkdir -p `path`, as kiln train does for --out; on failure prints which
 * directory could not be made and why, and returns 1 (2 for an empty path). */
static int make_dirs(const char *cmd, const char *path) {
    char tmp[PATH_MAX];
    if (!*path) {
        fprintf(stderr, "kiln %s: --out is empty: give the directory to write to\n", cmd);
        return 2;
    }
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) {
        fprintf(stderr, "kiln %s: --out %s: the path is longer than %d bytes\n", cmd, path, PATH_MAX - 1);
        return 1;
    }
    for (char *p = tmp + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last) continue;
        *p = '\0';
        struct stat st;
        if (mkdir(tmp, 0755) != 0 && (errno != EEXIST || stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode))) {
            int err = errno == EEXIST ? ENOTDIR : errno;
            fprintf(stderr, "kiln %s: cannot create %s for --out %s: %s (choose another --out DIR)\n", cmd,
                    tmp, path, strerror(err));
            return 1;
        }
        if (last) return 0;
        *p = '/';
    }
}

/* The spec text: --model's file, else the checkpoint's; *c,*h,*w from the
 * checkpoint's kiln.input when the caller has no dataset to ask. */
static char *model_spec(const char *cmd, const tool_args *a) {
    if (a->model) return train_read_text(cmd, a->model);
    char *spec = NULL;
    if (kiln_checkpoint_read_meta(a->checkpoint, "kiln.model_spec", &spec) != KILN_OK) {
        train_fail(cmd, "checkpoint");
        return NULL;
    }
    if (!spec)
        fprintf(stderr, "kiln %s: %s stores no model spec (a weights-only file): pass --model FILE\n", cmd,
                a->checkpoint);
    return spec;
}

static int input_shape(const char *cmd, const char *ckpt, int64_t *c, int64_t *h, int64_t *w) {
    char *in = NULL;
    if (kiln_checkpoint_read_meta(ckpt, "kiln.input", &in) != KILN_OK) return train_fail(cmd, "checkpoint");
    long long cc = 0, hh = 0, ww = 0;
    bool ok = in && sscanf(in, "%lldx%lldx%lld", &cc, &hh, &ww) == 3 && cc > 0 && hh > 0 && ww > 0;
    free(in);
    if (!ok) {
        /* A weights-only file: Kiln's models are for Fashion-MNIST. */
        cc = 1, hh = 28, ww = 28;
    }
    *c = cc, *h = hh, *w = ww;
    return 0;
}

static int build(const char *cmd, const tool_args *a, int64_t c, int64_t h, int64_t w, kiln_module **m,
                 char **spec) {
    *spec = model_spec(cmd, a);
    if (!*spec) return 1;
    if (train_parse_spec(cmd, *spec, a->model ? a->model : a->checkpoint, a->model ? NULL : a->checkpoint, c,
                         h, w, m) != 0)
        return 1;
    if (kiln_checkpoint_load(a->checkpoint, *m, NULL, NULL) != KILN_OK) return train_fail(cmd, "checkpoint");
    return 0;
}

/* The dataset the checkpoint's run trained on, from its run configuration
 * (kiln.run_config: "dataset", and "data" when the run gave --data; *data
 * is malloc'd or NULL). A checkpoint without one (a weights-only file, an
 * older Kiln) was trained on Fashion-MNIST. 0, or 1 after a message. */
static int checkpoint_dataset(const char *ckpt, train_dataset *kind, char **data) {
    *kind = TRAIN_DATASET_FASHION_MNIST;
    *data = NULL;
    char *text = NULL;
    if (kiln_checkpoint_read_meta(ckpt, "kiln.run_config", &text) != KILN_OK) {
        kiln_error_clear(); /* build() reports a file that cannot be read */
        return 0;
    }
    if (!text) return 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "dataset");
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(root, "data");
    int rc = 0;
    if (cJSON_IsString(ds) && !train_dataset_parse(ds->valuestring, kind)) {
        fprintf(stderr,
                "kiln eval: %s: the run configuration (metadata kiln.run_config) names dataset '%s', which this Kiln "
                "does not know: the file was edited or damaged\n",
                ckpt, ds->valuestring);
        rc = 1;
    }
    if (!rc && cJSON_IsString(dir) && !(*data = strdup(dir->valuestring))) rc = 1;
    cJSON_Delete(root);
    return rc;
}

int kiln_cmd_eval(int argc, char **argv) {
    tool_args a;
    int rc = parse("eval", argc, argv, &a, false);
    if (rc < 0) {
        printf("usage: kiln eval --checkpoint FILE [--model SPEC] [--data DIR] [--batch B] [--limit N]\n"
               "                 [--threads N] [--device D]\n"
               "  test-set loss and accuracy of a checkpoint on the test split of the dataset it was trained\n"
               "  on (Fashion-MNIST or CIFAR-10, from the checkpoint's run configuration; --data defaults to\n"
               "  the run's for CIFAR-10); the model spec comes from\n"
               "  the checkpoint unless --model is given; --threads: the CPU compute threads; --device:\n"
               "  cpu, cuda or cuda:N (default: KILN_DEVICE, else the first GPU, else cpu)\n");
        return 0;
    }
    if (rc) return rc;
    kiln_dataset *ds = NULL;
    train_dataset kind;
    char *run_data = NULL;
    if ((rc = checkpoint_dataset(a.checkpoint, &kind, &run_data))) return rc;
    /* CIFAR-10 has no default directory: the run's own. */
    if (!a.data && kind == TRAIN_DATASET_CIFAR10) a.data = run_data;
    kiln_status ost = train_open_split(kind, a.data, a.limit, "test", &ds);
    if (ost != KILN_OK) {
        rc = train_fail("eval", kind == TRAIN_DATASET_CIFAR10 ? "CIFAR-10 test set" : "test set");
        free(run_data);
        return rc;
    }
    kiln_sample_info info = kiln_dataset_info(ds);
    /* The images the model was trained on against these, before building
     * (else a shape error in a layer, blaming the spec). A checkpoint that
     * cannot be read is reported by build(). */
    char *in = NULL;
    long long cc = 0, hh = 0, ww = 0;
    if (kiln_checkpoint_read_meta(a.checkpoint, "kiln.input", &in) == KILN_OK && in &&
        sscanf(in, "%lldx%lldx%lld", &cc, &hh, &ww) == 3 &&
        (cc != info.channels || hh != info.height || ww != info.width)) {
        fprintf(stderr,
                "kiln eval: %s was trained on %lldx%lldx%lld images, but the test images in %s are %lldx%lldx%lld: "
                "pass the --data the model was trained on\n",
                a.checkpoint, cc, hh, ww, a.data ? a.data : "the default --data", (long long)info.channels,
                (long long)info.height, (long long)info.width);
        free(in);
        kiln_dataset_free(ds);
        free(run_data);
        return 1;
    }
    free(in);
    kiln_error_clear();
    /* A batch larger than the test set would only ask for memory no batch fills. */
    int64_t n_test = kiln_dataset_length(ds);
    if (a.batch > n_test && n_test > 0) a.batch = n_test;
    kiln_module *m = NULL;
    kiln_loader *ld = NULL;
    char *spec = NULL;
    kiln_device dev = kiln_default_device();
    if (a.device && (kiln_device_parse(a.device, &dev) != KILN_OK || dev.type == KILN_DEVICE_META)) {
        fprintf(stderr, "kiln eval: --device %s: %s\n", a.device,
                dev.type == KILN_DEVICE_META ? "meta tensors hold no data" : kiln_error_last()->message);
        kiln_dataset_free(ds);
        free(run_data);
        return 2;
    }
    rc = build("eval", &a, info.channels, info.height, info.width, &m, &spec);
    if (!rc && kiln_module_to(m, dev) != KILN_OK) rc = train_fail("eval", "model");
    if (!rc && train_make_loader(kind, TRAIN_AUGMENT_NONE, ds, dev, a.batch, false, 0, -1, &ld) != KILN_OK)
        rc = train_fail("eval", "loader");
    double loss = 0, acc = 0;
    int64_t n = 0;
    if (!rc && train_evaluate(m, ld, 0, &loss, &acc, &n) != KILN_OK) rc = train_fail("eval", "evaluation");
    if (!rc && !isfinite(loss)) {
        fprintf(stderr,
                "kiln eval: %s: the test loss is %g: the checkpoint's weights are not finite (a run that "
                "diverged, or a damaged file); evaluate an earlier checkpoint\n",
                a.checkpoint, loss);
        rc = 1;
    }
    if (!rc) {
        printf("kiln eval: %s: test accuracy %.2f%%, test loss %.4f on %lld images\n", a.checkpoint,
               100 * acc, loss, (long long)n);
        printf("{\"event\":\"eval\",\"test_acc\":%.6f,\"test_loss\":%.9g,\"images\":%lld,\"dataset\":\"%s\"}\n",
               acc, loss, (long long)n, train_dataset_name(kind));
    }
    free(run_data);
    kiln_loader_free(ld);
    kiln_module_free(m);
    kiln_dataset_free(ds);
    free(spec);
    return rc;
}

int kiln_cmd_export(int argc, char **argv) {
    tool_args a;
    export_traced traced; /* --traced --example SHAPE: tools/infer.c */
    int rc = kiln_export_traced_flags(&argc, argv, &traced);
    if (!rc) rc = parse("export", argc, argv, &a, true);
    if (rc < 0) {
        printf("usage: kiln export --checkpoint FILE --out DIR [--model SPEC] [--traced --example NxCxHxW]\n"
               "  --traced: DIR/model.kiln, the inference forward traced on an N-image example (kiln infer)\n"
               "  writes DIR/model.safetensors (weights only: the state dict, no optimizer state) and\n"
               "  DIR/model.txt (the model spec) for inference; it runs no model, only reads the checkpoint\n"
               "  and writes host files, so it takes no --device (a checkpoint from any device, --devices or\n"
               "  --split run is the plain model's)\n");
        return 0;
    }
    if (rc) return rc;
    int64_t c = 0, h = 0, w = 0;
    if ((rc = input_shape("export", a.checkpoint, &c, &h, &w))) return rc;
    if ((rc = make_dirs("export", a.out))) return rc;
    kiln_module *m = NULL;
    char *spec = NULL;
    rc = build("export", &a, c, h, w, &m, &spec);
    if (!rc && traced.on) {
        rc = kiln_export_traced(m, &traced, a.out, c, h, w);
        kiln_module_free(m);
        free(spec);
        return rc;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", a.out);
    if (!rc && kiln_safetensors_save(path, m) != KILN_OK) rc = train_fail("export", "weights");
    if (!rc) {
        char spec_path[PATH_MAX + 32], tmp[PATH_MAX + 48];
        snprintf(spec_path, sizeof spec_path, "%s/model.txt", a.out);
        snprintf(tmp, sizeof tmp, "%s.tmp", spec_path);
        FILE *f = fopen(tmp, "w");
        bool ok = f && fputs(spec, f) >= 0;
        if (f && fclose(f) != 0) ok = false;
        if (!ok || rename(tmp, spec_path) != 0) {
            fprintf(stderr, "kiln export: cannot write %s: %s\n", spec_path, strerror(errno));
            remove(tmp);
            rc = 1;
        } else {
            printf("kiln export: %s (%lld parameters) and %s (input %lldx%lldx%lld)\n", path,
                   (long long)kiln_module_num_parameters(m), spec_path, (long long)c, (long long)h,
                   (long long)w);
        }
    }
    kiln_module_free(m);
    free(spec);
    return rc;
}
