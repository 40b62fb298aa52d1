/* Reader for the parity golden files written by tests/parity/make_golden.py
 * (the format is described there), and the normwise comparison. Included
 * by test_parity.c (not a test itself). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn_test_util.c"

enum { GD_F32 = 0, GD_F64 = 1, GD_I64 = 2, GD_BF16 = 3 };

typedef struct golden_tensor {
    char name[128];
    int dtype, ndim;
    int64_t dims[8];
    int64_t stride, count; /* every stride-th element of the flattened tensor; count of them */
    double *v;             /* count values */
} golden_tensor;

typedef struct golden_file {
    int n;
    golden_tensor *t;
} golden_file;

static bool gd_read(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

/* Little-endian host assumed (x86-64, aarch64): the values are read raw. */
static bool gd_load_tensor(FILE *f, golden_tensor *t) {
    uint16_t len;
    uint8_t dt, nd;
    if (!gd_read(f, &len, 2) || len >= sizeof t->name || !gd_read(f, t->name, len)) return false;
    t->name[len] = 0;
    if (!gd_read(f, &dt, 1) || !gd_read(f, &nd, 1) || nd > 8) return false;
    t->dtype = dt, t->ndim = nd;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        if (!gd_read(f, &t->dims[i], 8)) return false;
        numel *= t->dims[i];
    }
    if (!gd_read(f, &t->stride, 8) || t->stride < 1) return false;
    t->count = (numel + t->stride - 1) / t->stride;
    t->v = malloc((size_t)(t->count ? t->count : 1) * sizeof(double));
    if (!t->v) return false;
    for (int64_t i = 0; i < t->count; i++) {
        if (dt == GD_F32) {
            float x;
            if (!gd_read(f, &x, 4)) return false;
            t->v[i] = x;
        } else if (dt == GD_F64) {
            if (!gd_read(f, &t->v[i], 8)) return false;
        } else if (dt == GD_I64) {
            int64_t x;
            if (!gd_read(f, &x, 8)) return false;
            t->v[i] = (double)x;
        } else if (dt == GD_BF16) {
            uint16_t h;
            if (!gd_read(f, &h, 2)) return false;
            t->v[i] = kiln_bf16_to_f32(h);
        } else {
            return false;
        }
    }
    return true;
}

static void gd_free(golden_file *g) {
    for (int i = 0; i < g->n; i++) free(g->t[i].v);
    free(g->t);
    g->t = NULL;
    g->n = 0;
}

/* Load tests/parity/golden/<name>.bin, found from this file's path. */
static bool gd_load(const char *name, golden_file *g) {
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *at = strstr(path, "tests/parity/golden.c");
    if (!at) kt_missing("cannot locate the source tree from __FILE__");
    snprintf(at, sizeof path - (size_t)(at - path), "tests/parity/golden/%s.bin", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (regenerate with tests/parity/make_golden.py)\n", path);
        return false;
    }
    char magic[8];
    uint32_t n = 0;
    bool ok = gd_read(f, magic, 8) && !memcmp(magic, "KILNGLD1", 8) && gd_read(f, &n, 4) && n < 100000;
    g->n = 0;
    g->t = ok ? calloc(n ? n : 1, sizeof *g->t) : NULL;
    for (uint32_t i = 0; ok && i < n; i++) {
        if (!g->t) break;
        g->n = (int)i + 1;
        ok = gd_load_tensor(f, &g->t[i]);
    }
    fclose(f);
    ok = ok && g->t;
    if (!ok) {
        fprintf(stderr, "%s: malformed golden file\n", path);
        gd_free(g);
    }
    return ok;
}

static const golden_tensor *gd_find(const golden_file *g, const char *prefix, const char *key) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, key);
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

static kiln_shape gd_shape(const golden_tensor *t) {
    kiln_shape s = {0};
    s.ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) s.d[i] = t->dims[i];
    return s;
}

/* A new CPU tensor of the golden values (full tensors only) in `dtype`. */
static kiln_tensor *gd_tensor(const golden_tensor *t, kiln_dtype dtype) {
    if (t->stride != 1) return NULL;
    if (dtype == KILN_I64) {
        int64_t *iv = malloc((size_t)(t->count ? t->count : 1) * sizeof *iv);
        if (!iv) return NULL;
        for (int64_t i = 0; i < t->count; i++) iv[i] = (int64_t)t->v[i];
        kiln_tensor *r = kiln_from_data(gd_shape(t), KILN_I64, KILN_CPU, iv);
        free(iv);
        return r;
    }
    return kt_tensor(gd_shape(t), dtype, t->v);
}

/* Normwise relative error ||a - g|| / ||g|| of tensor `a` against the
 * golden `g` (over g's sample when it is sampled); -1 when the shapes
 * differ or a value is not finite. */
static double gd_relerr(kiln_tensor *a, const golden_tensor *g) {
    if (!a || !kt_shape_is(a, gd_shape(g))) return -1;
    double *v = kt_values(a);
    if (!v) return -1;
    double num = 0, den = 0;
    for (int64_t i = 0; i < g->count; i++) {
        double x = v[i * g->stride], d = x - g->v[i];
        if (!isfinite(x)) {
            free(v);
            return -1;
        }
        num += d * d;
        den += g->v[i] * g->v[i];
    }
    free(v);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
