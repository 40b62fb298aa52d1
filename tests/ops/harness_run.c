/* The harness's checks per case (included by harness.c): forward in each
 * dtype against the reference, the kernel check, and the float64 gradient
 * check against central finite differences; kh_run_case and kh_main. */

/* Dtypes a device can run; the CUDA backend narrows this where it lacks one. */
static unsigned kh_device_dtypes(kiln_device dev) {
    (void)dev;
    return KILN_DT_ALL;
}

static void kh_forward(kh_ctx *x, kiln_dtype dtype, kiln_device dev) {
    const kh_case *c = x->c;
    kh_inputs in;
    kiln_tensor *aux[KH_MAX_OUT - 1] = {NULL};
    kiln_tensor *out = NULL;
    kh_ref ref;
    memset(&ref, 0, sizeof ref);
    if (!kh_inputs_make(x, &in, dtype, dev)) goto done;
    out = kh_call(c, in.t, dtype, dev, aux);
    if (c->expect_error && c->value_error && dev.type != KILN_DEVICE_CPU) {
        double *v = out ? kh_read(out) : NULL;
        bool nan = false;
        for (int64_t j = 0; v && j < kiln_numel(out); j++) nan |= isnan(v[j]);
        if (!out) kh_fail(x, "run failed: %s (a device flags '%s' with NaN)", kh_errmsg, c->expect_error);
        else if (!nan) kh_fail(x, "expected NaN in output 0 for '%s'", c->expect_error);
        free(v);
        goto done;
    }
    if (c->expect_error) {
        if (out)
            kh_fail(x, "expected an error mentioning '%s', got a result", c->expect_error);
        else if (!strstr(kh_errmsg, c->expect_error))
            kh_fail(x, "the error '%s' does not mention '%s'", kh_errmsg, c->expect_error);
        goto done;
    }
    if (!out) {
        kh_fail(x, "run failed: %s", kh_errmsg);
        goto done;
    }
    kh_reference(c, &in, dtype, &ref);
    if (!ref.out[0]) kh_fail(x, "the reference produced no output 0 (call kh_out(r, 0, ...))");
    for (int k = 0; k < KH_MAX_OUT; k++) {
        if (!ref.out[k]) continue;
        kiln_tensor *t = k ? aux[k - 1] : out;
        if (!t) {
            kh_fail(x, "run() set no r->aux[%d] for the reference's output %d", k - 1, k);
            continue;
        }
        double *v = kh_read(t);
        if (!v) {
            kh_fail(x, "reading output %d failed: %s", k, kiln_error_message());
            continue;
        }
        kh_compare(x, "forward", k, &ref, kiln_shape_of(t), kiln_dtype_of(t), v);
        free(v);
    }
    for (int i = 0; i < c->n_in; i++) {
        if (!in.t[i]) continue;
        double *v = kh_read(in.t[i]);
        int64_t n = kh_numel(c->in[i].shape);
        for (int64_t j = 0; v && j < n; j++)
            if (!(v[j] == in.vals[i][j] || (isnan(v[j]) && isnan(in.vals[i][j])))) {
                kh_fail(x, "run() modified input %d (element %lld)", i, (long long)j);
                break;
            }
        free(v);
    }
    if (c->op && dev.type == KILN_DEVICE_CPU) kh_check_kernel(x, &in, &ref);
done:
    kh_ref_free(&ref);
    kiln_release(out);
    for (int k = 0; k < KH_MAX_OUT - 1; k++) kiln_release(aux[k]);
    kh_inputs_free(&in);
}

/* sum(out * R) of one forward through run(), inputs t; NAN on failure. */
static double kh_objective(kh_ctx *x, kiln_tensor *const *t, const double *r, kiln_device dev) {
    kiln_tensor *out = kh_call(x->c, t, KILN_F64, dev, NULL);
    if (!out) {
        kh_fail(x, "run failed during finite differences: %s", kh_errmsg);
        return NAN;
    }
    double *v = kh_read(out), s = 0;
    int64_t n = kiln_numel(out);
    for (int64_t j = 0; v && j < n; j++) s += v[j] * r[j];
    if (!v) s = NAN;
    free(v);
    kiln_release(out);
    return s;
}

static void kh_backward(kh_ctx *x, kiln_device dev) {
    const kh_case *c = x->c;
    kh_inputs in;
    double *r = NULL, *g[KH_MAX_IN] = {NULL};
    kiln_tensor *out = NULL, *rt = NULL;
    if (!kh_inputs_make(x, &in, KILN_F64, dev)) goto done;
    for (int i = 0; i < c->n_in; i++) {
        if (!c->in[i].grad) continue;
        if (!in.t[i] || !kh_is_float(in.dt[i])) {
            kh_fail(x, "input %d is marked grad but is absent or not floating", i);
            goto done;
        }
        if (kiln_set_requires_grad(in.t[i], true)) {
            kh_fail(x, "requires_grad on input %d: %s", i, kiln_error_message());
            goto done;
        }
    }
    out = kh_call(c, in.t, KILN_F64, dev, NULL);
    if (!out) {
        kh_fail(x, "run failed: %s", kh_errmsg);
        goto done;
    }
    if (kiln_dtype_of(out) != KILN_F64) {
        kh_fail(x, "the float64 run returned %s", kiln_dtype_name(kiln_dtype_of(out)));
        goto done;
    }
    int64_t n_out = kiln_numel(out);
    r = kh_gen_r(c, n_out);
    rt = kiln_from_data(kiln_shape_of(out), KILN_F64, dev, r);
    if (!rt || kiln_backward(out, rt, false)) {
        kh_fail(x, "kiln_backward failed: %s", kiln_error_message());
        goto done;
    }
    for (int i = 0; i < c->n_in; i++) {
        if (!c->in[i].grad) continue;
        int64_t n = kh_numel(c->in[i].shape);
        kiln_error_clear();
        kiln_tensor *gt = kiln_grad(in.t[i]);
        if (!gt && kiln_error_last()->status) {
            kh_fail(x, "kiln_grad(input %d): %s", i, kiln_error_message());
            goto done;
        }
        if (gt && (!kh_shape_eq(kiln_shape_of(gt), c->in[i].shape) || kiln_dtype_of(gt) != KILN_F64)) {
            char a[96], b[96];
            kh_fail(x, "the gradient of input %d is %s %s, the input %s f64", i,
                    kh_shape_str(kiln_shape_of(gt), a, sizeof a), kiln_dtype_name(kiln_dtype_of(gt)),
                    kh_shape_str(c->in[i].shape, b, sizeof b));
            kiln_release(gt);
            goto done;
        }
        g[i] = gt ? kh_read(gt) : calloc((size_t)(n ? n : 1), sizeof(double));
        kiln_release(gt);
    }
    kiln_release(out);
    out = NULL;
    kiln_no_grad_begin();
    for (int i = 0; i < c->n_in && !x->failed; i++) {
        if (!c->in[i].grad || !g[i]) continue;
        int64_t n = kh_numel(c->in[i].shape);
        double *fd = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kiln_tensor *t[KH_MAX_IN];
        memcpy(t, in.t, sizeof t);
        for (int64_t j = 0; j < n && !x->failed; j++) {
            double orig = in.vals[i][j], l[2];
            for (int s = 0; s < 2; s++) {
                in.vals[i][j] = orig + (s ? -KH_FD_EPS : KH_FD_EPS);
                t[i] = kh_make(&c->in[i], KILN_F64, in.vals[i], dev);
                l[s] = t[i] ? kh_objective(x, t, r, dev) : NAN;
                kiln_release(t[i]);
            }
            in.vals[i][j] = orig;
            fd[j] = (l[0] - l[1]) / (2 * KH_FD_EPS);
        }
        double e = kh_rel_err(g[i], fd, n);
        if (!x->failed && !(e <= KH_TOL_GRAD)) {
            int64_t worst = 0;
            double wd = -1;
            for (int64_t j = 0; j < n; j++) {
                double d = isnan(g[i][j]) ? INFINITY : fabs(g[i][j] - fd[j]);
                if (d > wd) wd = d, worst = j;
            }
            kh_fail(x,
                    "gradient of input %d: normwise relative error %.3g > %.3g vs finite differences "
                    "(worst element %lld: analytic %.9g, numeric %.9g)",
                    i, e, KH_TOL_GRAD, (long long)worst, n ? g[i][worst] : 0.0, n ? fd[worst] : 0.0);
        }
        free(fd);
    }
    kiln_grad_mode_end();
done:
    kiln_release(out);
    kiln_release(rt);
    free(r);
    for (int i = 0; i < KH_MAX_IN; i++) free(g[i]);
    kh_inputs_free(&in);
}

int kh_run_case(const kh_case *c, kiln_device dev) {
    kh_ctx x = {.c = c};
    char ds[32];
    kiln_device_str(dev, ds, sizeof ds);
    snprintf(x.tag, sizeof x.tag, "%s", ds);
    if (!c->run || (!c->reference && !c->expect_error) || c->n_in < 0 || c->n_in > KH_MAX_IN || !c->dtypes) {
        kh_fail(&x, "malformed case: it needs run, reference (or expect_error), dtypes and 0..%d inputs",
                KH_MAX_IN);
        return 1;
    }
    unsigned dts = c->dtypes & kh_device_dtypes(dev);
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        if (!(dts & KILN_DT(d))) continue;
        snprintf(x.tag, sizeof x.tag, "%s %s", ds, kiln_dtype_name((kiln_dtype)d));
        kh_forward(&x, (kiln_dtype)d, dev);
    }
    bool grads = false;
    for (int i = 0; i < c->n_in; i++) grads |= c->in[i].grad;
    if (grads && !c->expect_error && (kh_device_dtypes(dev) & KILN_DT(KILN_F64))) {
        snprintf(x.tag, sizeof x.tag, "%s f64 backward", ds);
        kh_backward(&x, dev);
    }
    return x.failed;
}

int kh_main(int argc, char **argv, const kh_case *cases, int n_cases) {
    if (kiln_init()) {
        fprintf(stderr, "kiln_init failed: %s\n", kiln_error_message());
        return 1;
    }
    const char *filter = argc > 1 ? argv[1] : getenv("KILN_OPS_FILTER");
    kiln_device devs[4];
    int nd = 0;
    devs[nd++] = KILN_CPU;
#ifdef KILN_WITH_CUDA
    if (kiln_device_is_available(KILN_CUDA(0))) devs[nd++] = KILN_CUDA(0);
#endif
    const char *conf = getenv("KILN_ALLOC_CONF");
    int ran = 0, failed = 0;
    for (int i = 0; i < n_cases; i++) /* ids select cases and seed their inputs: unique */
        for (int j = 0; j < i; j++) {
            char a[256], b[256];
            if (strcmp(kh_case_id(&cases[i], a, sizeof a), kh_case_id(&cases[j], b, sizeof b))) continue;
            fprintf(stderr, "FAIL %s: two cases have this id (make their params differ)\n", a);
            failed++;
            break;
        }
    for (int i = 0; i < n_cases; i++) {
        char id[256], ds[32];
        kh_case_id(&cases[i], id, sizeof id);
        if (filter && *filter && !strstr(id, filter)) continue;
        for (int d = 0; d < nd; d++) {
            ran++;
            int f = kh_run_case(&cases[i], devs[d]);
            failed += f;
            printf("%s %s [%s]\n", f ? "FAIL" : "ok  ", id, kiln_device_str(devs[d], ds, sizeof ds));
        }
    }
    printf("%d case runs, %d failed (KILN_ALLOC_CONF=%s%s%s)\n", ran, failed, conf ? conf : "",
           filter ? ", filter " : "", filter ? filter : "");
    kiln_shutdown();
    if (ran == 0) {
        fprintf(stderr, "no case matched%s%s\n", filter ? " the filter " : "", filter ? filter : "");
        return 1;
    }
    return failed ? 1 : 0;
}
