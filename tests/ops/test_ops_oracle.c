/* An outside oracle for the harness's float64 references: PyTorch's
 * outputs and input gradients for every harness case it has an op for,
 * computed by tests/ops/oracle/make_oracle.py and committed as
 * tests/ops/oracle/oracle.txt. This test checks the REFERENCES (not the
 * kernels), so a misread definition (GELU variant, max ties, label
 * smoothing, adaptive-pool bins) cannot hide in both kernel and reference:
 *   outputs    reference vs torch, normwise relative error <= 1e-10
 *              (both float64; integer and bool outputs exactly);
 *   gradients  central differences (eps 1e-6) of sum(reference * R) vs
 *              torch's autograd with the same R, <= 1e-6 (KH_TOL_GRAD).
 * Eligible cases: a reference, no expected error, float64 among their
 * dtypes. Each case's inputs are regenerated here from the harness's seed;
 * the oracle file records a checksum of them, so a changed case is
 * reported as stale instead of compared with old numbers.
 *
 * Modes: KILN_OPS_DUMP=file writes every eligible case (inputs, attrs, R)
 * for make_oracle.py and exits; otherwise checks against
 * $KILN_OPS_ORACLE or the oracle.txt next to this source file. */
#include "ops/harness.c"

#include "ops/cases_elementwise.c"
#include "ops/cases_nn.c"
#include "ops/cases_reduce.c"

#define ORACLE_TOL_FWD 1e-10

typedef struct oracle_table {
    const kh_case *cases;
    int n;
} oracle_table;

static const oracle_table oracle_tables[] = {
    {elementwise_cases, KH_COUNT(elementwise_cases)},
    {reduce_cases, KH_COUNT(reduce_cases)},
    {nn_cases, KH_COUNT(nn_cases)},
};

static bool oracle_eligible(const kh_case *c) {
    return c->reference && !c->expect_error && (c->dtypes & KILN_DT(KILN_F64));
}

/* Values of a case's inputs for the float64 run (no tensors). */
static void oracle_inputs(const kh_case *c, kh_inputs *in) {
    memset(in, 0, sizeof *in);
    for (int i = 0; i < c->n_in; i++) {
        in->dt[i] = kh_input_dtype(&c->in[i], KILN_F64);
        in->vals[i] = kh_gen_input(c, i, KILN_F64);
    }
}

static void oracle_inputs_free(kh_inputs *in) {
    for (int i = 0; i < KH_MAX_IN; i++) free(in->vals[i]);
}

static double oracle_checksum(const kh_case *c, const kh_inputs *in) {
    double h = 0;
    for (int i = 0; i < c->n_in; i++) {
        if (!in->vals[i]) continue;
        int64_t n = kh_numel(c->in[i].shape);
        for (int64_t j = 0; j < n; j++)
            if (isfinite(in->vals[i][j]))
                h += in->vals[i][j] * (1.0 + 0.001 * (double)((j * 7 + i * 3) % 101));
    }
    return h;
}

static void oracle_values(FILE *f, const double *v, int64_t n) {
    for (int64_t j = 0; j < n; j++) fprintf(f, " %.17g", v[j]);
    fputc('\n', f);
}

static void oracle_dump_case(FILE *f, const kh_case *c) {
    char id[256];
    const kiln_op_attrs *a = &c->attrs;
    kh_inputs in;
    oracle_inputs(c, &in);
    kh_ref ref;
    kh_reference(c, &in, KILN_F64, &ref);
    fprintf(f, "case %s\nname %s\n", kh_case_id(c, id, sizeof id), c->name);
    fprintf(f, "scalar %.17g %.17g %.17g\nflag %d\ndims %d", a->scalar[0], a->scalar[1], a->scalar[2],
            a->flag, a->n_dims);
    for (int i = 0; i < KILN_MAX_DIMS; i++) fprintf(f, " %d", a->dims[i]);
    fprintf(f, "\nkeepdim %d\nints %d", a->keepdim, a->n_ints);
    for (int i = 0; i < KILN_MAX_DIMS * 2; i++) fprintf(f, " %lld", (long long)a->ints[i]);
    fprintf(f, "\nkernel %lld %lld\nstride %lld %lld\npadding %lld %lld\ndilation %lld %lld\n",
            (long long)a->kernel[0], (long long)a->kernel[1], (long long)a->stride[0],
            (long long)a->stride[1], (long long)a->padding[0], (long long)a->padding[1],
            (long long)a->dilation[0], (long long)a->dilation[1]);
    fprintf(f, "groups %lld\nceil_mode %d\ncount_include_pad %d\nreduction %d\nignore_index %lld\n",
            (long long)a->groups, a->ceil_mode, a->count_include_pad, (int)a->reduction,
            (long long)a->ignore_index);
    fprintf(f, "label_smoothing %.17g\ntraining %d\nmomentum %.17g\neps %.17g\ndtype %s\n",
            a->label_smoothing, a->training, a->momentum, a->eps, kiln_dtype_name(a->dtype));
    fprintf(f, "check %.17g\n", oracle_checksum(c, &in));
    for (int i = 0; i < c->n_in; i++) {
        if (!in.vals[i]) {
            fprintf(f, "in %d none\n", i);
            continue;
        }
        kiln_shape s = c->in[i].shape;
        fprintf(f, "in %d %s %d %d", i, kiln_dtype_name(in.dt[i]), c->in[i].grad, s.ndim);
        for (int d = 0; d < s.ndim; d++) fprintf(f, " %lld", (long long)s.d[d]);
        fprintf(f, " |");
        oracle_values(f, in.vals[i], kh_numel(s));
    }
    if (ref.out[0]) {
        kiln_shape s = ref.out_shape[0];
        fprintf(f, "out %s %d", kiln_dtype_name(ref.out_dtype[0]), s.ndim);
        for (int d = 0; d < s.ndim; d++) fprintf(f, " %lld", (long long)s.d[d]);
        double *r = kh_gen_r(c, kh_numel(s));
        fprintf(f, "\nr");
        oracle_values(f, r, kh_numel(s));
        free(r);
    }
    fprintf(f, "end\n");
    kh_ref_free(&ref);
    oracle_inputs_free(&in);
}

/* ---- Reading the oracle ------------------------------------------------------------- */

typedef struct oracle_entry {
    char id[256];
    double check;
    char skip[256]; /* non-empty: torch has no op for it (the reason) */
    double *out[KH_MAX_OUT];
    int64_t n_out[KH_MAX_OUT];
    double *grad[KH_MAX_IN];
    int64_t n_grad[KH_MAX_IN];
} oracle_entry;

static double *oracle_read_values(char *rest, int64_t *n) {
    int64_t cap = 16;
    double *v = malloc(sizeof(double) * (size_t)cap);
    *n = 0;
    char *end;
    for (;;) {
        double x = strtod(rest, &end);
        if (end == rest) break;
        rest = end;
        if (*n == cap) v = realloc(v, sizeof(double) * (size_t)(cap *= 2));
        v[(*n)++] = x;
    }
    return v;
}

static oracle_entry *oracle_load(const char *path, int *count) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    int n = 0, ecap = 64;
    oracle_entry *e = calloc((size_t)ecap, sizeof *e), *cur = NULL;
    while (getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        int k = 0;
        if (!strncmp(line, "case ", 5)) {
            if (n == ecap) {
                e = realloc(e, sizeof *e * (size_t)(ecap *= 2));
                memset(e + n, 0, sizeof *e * (size_t)(ecap - n));
            }
            cur = &e[n++];
            snprintf(cur->id, sizeof cur->id, "%s", line + 5);
        } else if (!cur) {
            continue;
        } else if (!strncmp(line, "check ", 6)) {
            cur->check = strtod(line + 6, NULL);
        } else if (!strncmp(line, "skip ", 5)) {
            snprintf(cur->skip, sizeof cur->skip, "%s", line + 5);
        } else if (sscanf(line, "out %d", &k) == 1 && k >= 0 && k < KH_MAX_OUT) {
            cur->out[k] =
                oracle_read_values(strchr(line, '|') ? strchr(line, '|') + 1 : line + 6, &cur->n_out[k]);
        } else if (sscanf(line, "grad %d", &k) == 1 && k >= 0 && k < KH_MAX_IN) {
            cur->grad[k] =
                oracle_read_values(strchr(line, '|') ? strchr(line, '|') + 1 : line + 7, &cur->n_grad[k]);
        }
    }
    free(line);
    fclose(f);
    *count = n;
    return e;
}

static void oracle_free(oracle_entry *e, int n) {
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < KH_MAX_OUT; k++) free(e[i].out[k]);
        for (int k = 0; k < KH_MAX_IN; k++) free(e[i].grad[k]);
    }
    free(e);
}

/* ---- Checking one case ------------------------------------------------------------ */

static double oracle_objective(const kh_case *c, kh_inputs *in, const double *r) {
    kh_ref ref;
    kh_reference(c, in, KILN_F64, &ref);
    double s = 0;
    int64_t n = ref.out[0] ? kh_numel(ref.out_shape[0]) : 0;
    for (int64_t j = 0; j < n; j++) s += ref.out[0][j] * r[j];
    kh_ref_free(&ref);
    return s;
}

static int oracle_check_case(const kh_case *c, const oracle_entry *e) {
    int fails = 0;
    char id[256];
    kh_case_id(c, id, sizeof id);
    kh_inputs in;
    oracle_inputs(c, &in);
    double h = oracle_checksum(c, &in);
    if (fabs(h - e->check) > 1e-9 * (1 + fabs(h))) {
        fprintf(stderr,
                "FAIL %s: the oracle entry is stale (its inputs changed): rerun "
                "tests/ops/oracle/make_oracle.py\n",
                id);
        oracle_inputs_free(&in);
        return 1;
    }
    kh_ref ref;
    kh_reference(c, &in, KILN_F64, &ref);
    for (int k = 0; k < KH_MAX_OUT; k++) {
        if (!e->out[k] || !ref.out[k]) continue;
        int64_t n = kh_numel(ref.out_shape[k]);
        if (n != e->n_out[k]) {
            fprintf(stderr, "FAIL %s: output %d has %lld elements in the reference, %lld in torch\n", id, k,
                    (long long)n, (long long)e->n_out[k]);
            fails = 1;
            continue;
        }
        bool exact = !kh_is_float(ref.out_dtype[k]);
        double err = kh_rel_err(ref.out[k], e->out[k], n);
        for (int64_t j = 0; exact && j < n; j++)
            if (ref.out[k][j] != e->out[k][j]) err = INFINITY;
        if (!(err <= (exact ? 0.0 : ORACLE_TOL_FWD))) {
            int64_t w = 0;
            for (int64_t j = 0; j < n; j++)
                if (!(fabs(ref.out[k][j] - e->out[k][j]) <= fabs(ref.out[k][w] - e->out[k][w]))) w = j;
            fprintf(stderr,
                    "FAIL %s: reference output %d differs from torch: normwise %.3g (element %lld: %.17g vs "
                    "torch %.17g)\n",
                    id, k, err, (long long)w, n ? ref.out[k][w] : 0.0, n ? e->out[k][w] : 0.0);
            fails = 1;
        }
    }
    double *r = ref.out[0] ? kh_gen_r(c, kh_numel(ref.out_shape[0])) : NULL;
    for (int i = 0; i < c->n_in && r; i++) {
        if (!e->grad[i] || !in.vals[i]) continue;
        int64_t n = kh_numel(c->in[i].shape);
        if (n != e->n_grad[i]) {
            fprintf(stderr, "FAIL %s: torch's gradient of input %d has %lld elements, the input %lld\n", id,
                    i, (long long)e->n_grad[i], (long long)n);
            fails = 1;
            continue;
        }
        double *fd = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t j = 0; j < n; j++) {
            double orig = in.vals[i][j];
            in.vals[i][j] = orig + KH_FD_EPS;
            double lp = oracle_objective(c, &in, r);
            in.vals[i][j] = orig - KH_FD_EPS;
            double lm = oracle_objective(c, &in, r);
            in.vals[i][j] = orig;
            fd[j] = (lp - lm) / (2 * KH_FD_EPS);
        }
        double err = kh_rel_err(fd, e->grad[i], n);
        if (!(err <= KH_TOL_GRAD)) {
            fprintf(stderr,
                    "FAIL %s: the reference's gradient of input %d (central differences) differs from "
                    "torch's: normwise %.3g\n",
                    id, i, err);
            fails = 1;
        }
        free(fd);
    }
    free(r);
    kh_ref_free(&ref);
    oracle_inputs_free(&in);
    return fails;
}

static const char *oracle_default_path(char *buf, size_t size) {
    const char *env = getenv("KILN_OPS_ORACLE");
    if (env) return env;
    snprintf(buf, size, "%s", __FILE__);
    char *slash = strrchr(buf, '/');
    size_t dir = slash ? (size_t)(slash - buf + 1) : 0;
    snprintf(buf + dir, size - dir, "oracle/oracle.txt");
    return buf;
}

int main(void) {
    const char *dump = getenv("KILN_OPS_DUMP");
    if (dump) {
        FILE *f = fopen(dump, "w");
        if (!f) return 1;
        for (size_t t = 0; t < sizeof oracle_tables / sizeof oracle_tables[0]; t++)
            for (int i = 0; i < oracle_tables[t].n; i++)
                if (oracle_eligible(&oracle_tables[t].cases[i]))
                    oracle_dump_case(f, &oracle_tables[t].cases[i]);
        return fclose(f) ? 1 : 0;
    }
    char pbuf[1024];
    const char *path = oracle_default_path(pbuf, sizeof pbuf);
    int n_entries = 0;
    oracle_entry *entries = oracle_load(path, &n_entries);
    if (!entries) {
        fprintf(stderr, "FAIL: cannot read the oracle %s (make it with tests/ops/oracle/make_oracle.py)\n",
                path);
        return 1;
    }
    int checked = 0, skipped = 0, fails = 0;
    for (size_t t = 0; t < sizeof oracle_tables / sizeof oracle_tables[0]; t++)
        for (int i = 0; i < oracle_tables[t].n; i++) {
            const kh_case *c = &oracle_tables[t].cases[i];
            if (!oracle_eligible(c)) continue;
            char id[256];
            kh_case_id(c, id, sizeof id);
            const oracle_entry *e = NULL;
            int matches = 0;
            for (int k = 0; k < n_entries; k++)
                if (!strcmp(entries[k].id, id)) e = &entries[k], matches++;
            if (matches != 1) {
                fprintf(stderr, "FAIL %s: %s in the oracle: rerun tests/ops/oracle/make_oracle.py%s\n", id,
                        matches ? "several entries" : "no entry",
                        matches ? " (case ids must be unique)" : "");
                fails++;
                continue;
            }
            if (e->skip[0]) {
                printf("skip %s: %s\n", id, e->skip);
                skipped++;
                continue;
            }
            int f = oracle_check_case(c, e);
            printf("%s %s\n", f ? "FAIL" : "ok  ", id);
            fails += f;
            checked++;
        }
    printf("%d cases checked against torch, %d without a torch op, %d failed\n", checked, skipped, fails);
    oracle_free(entries, n_entries);
    return fails ? 1 : 0;
}
