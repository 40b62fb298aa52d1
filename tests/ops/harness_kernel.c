/* The harness's kernel-level check (included by harness.c): for cases that
 * name their op, call the CPU kernel directly on buffers the harness
 * mallocs itself, outside the caching allocator, each with guard regions
 * before and after that must survive; inputs must stay untouched and the
 * outputs must match the float64 reference like the public path's. */

#define KH_GUARD 64 /* bytes of guard on each side of every buffer */

typedef struct kh_gbuf {
    unsigned char *raw; /* guard | data | guard */
    size_t bytes;
    unsigned char *copy; /* inputs: the data as written, to detect writes */
} kh_gbuf;

static unsigned char kh_guard_byte(size_t i) { return (unsigned char)(0xA5u ^ (i * 29u)); }

/* Data bytes are set to 0xFF (NaN for every float dtype) so an output
 * element the kernel never writes fails the comparison. */
static void *kh_gbuf_alloc(kh_gbuf *g, size_t bytes) {
    g->bytes = bytes;
    g->raw = malloc(bytes + 2 * KH_GUARD);
    for (size_t i = 0; i < KH_GUARD; i++) {
        g->raw[i] = kh_guard_byte(i);
        g->raw[KH_GUARD + bytes + i] = kh_guard_byte(i + KH_GUARD);
    }
    memset(g->raw + KH_GUARD, 0xFF, bytes);
    return g->raw + KH_GUARD;
}

/* 0 intact, -1 the front guard was written, 1 the back guard. */
static int kh_gbuf_check(const kh_gbuf *g) {
    if (!g->raw) return 0;
    for (size_t i = 0; i < KH_GUARD; i++)
        if (g->raw[i] != kh_guard_byte(i)) return -1;
    for (size_t i = 0; i < KH_GUARD; i++)
        if (g->raw[KH_GUARD + g->bytes + i] != kh_guard_byte(i + KH_GUARD)) return 1;
    return 0;
}

static void kh_gbuf_free(kh_gbuf *g) {
    free(g->raw);
    free(g->copy);
    memset(g, 0, sizeof *g);
}

static kiln_strided kh_strided_contig(void *data, kiln_dtype dt, int ndim, const int64_t *shape) {
    kiln_strided s = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) s.shape[i] = shape[i];
    kiln_contiguous_strides(ndim, s.shape, s.strides);
    return s;
}

static void kh_guard_report(kh_ctx *x, const kh_gbuf *g, const char *what, int i) {
    int r = kh_gbuf_check(g);
    if (r)
        kh_fail(x, "kernel wrote %s %s %d (guard bytes overwritten)", r < 0 ? "before" : "past the end of",
                what, i);
}

static void kh_check_kernel(kh_ctx *x, const kh_inputs *in, const kh_ref *ref) {
    const kh_case *c = x->c;
    kiln_op_id op = (kiln_op_id)(c->op - 1);
    const kiln_op_info *info = kiln_op_info_get(op);
    if (!info) {
        kh_fail(x, "op id %d is not in ops.def", c->op - 1);
        return;
    }
    if ((info->flags & OPF_VIEW) && !c->kernel) return; /* views have no kernel */
    const kiln_op_kernel *k = c->kernel ? c->kernel : kiln_ops_kernel(KILN_DEVICE_CPU, op);
    if (!k || !k->run) {
        kh_fail(x, "kernel check: no CPU kernel registered for op %s", info->name);
        return;
    }
    if (!info->infer || c->n_in > KILN_OP_MAX_IN) {
        kh_fail(x, "kernel check: op %s has no infer function or the case has %d inputs", info->name,
                c->n_in);
        return;
    }
    kiln_op_attrs attrs = c->attrs;
    kiln_meta meta[KILN_OP_MAX_OUT];
    kiln_dtype in_dt[KILN_OP_MAX_IN];
    memset(meta, 0, sizeof meta);
    for (int i = 0; i < c->n_in; i++) in_dt[i] = in->t[i] ? kiln_dtype_of(in->t[i]) : KILN_F32;
    char fn[64];
    snprintf(fn, sizeof fn, "kiln_%s", info->name);
    if (info->infer(fn, &attrs, c->n_in, in->t, meta, in_dt)) {
        kh_fail(x, "kernel check: infer of %s failed: %s", info->name, kiln_error_message());
        return;
    }
    if (info->n_out && !(k->dtypes & KILN_DT(meta[0].dtype))) {
        kh_fail(x, "kernel check: the CPU kernel of %s does not claim dtype %s", info->name,
                kiln_dtype_name(meta[0].dtype));
        return;
    }
    kiln_op_args args = {.n_in = c->n_in, .n_out = info->n_out, .attrs = &attrs};
    kh_gbuf gin[KH_MAX_IN], gout[KILN_OP_MAX_OUT], gws;
    memset(gin, 0, sizeof gin);
    memset(gout, 0, sizeof gout);
    memset(&gws, 0, sizeof gws);
    for (int i = 0; i < c->n_in; i++) {
        if (!in->t[i]) {
            args.in[i].ndim = -1;
            continue;
        }
        kiln_shape s = c->in[i].shape;
        int64_t n = kh_numel(s);
        void *d = kh_gbuf_alloc(&gin[i], kiln_dtype_size(in_dt[i]) * (size_t)n);
        for (int64_t j = 0; j < n; j++) kh_store(d, in_dt[i], j, in->vals[i][j]); /* the dispatcher's cast */
        gin[i].copy = malloc(gin[i].bytes + 1);
        memcpy(gin[i].copy, d, gin[i].bytes);
        kiln_strided st = kh_strided_contig(d, in_dt[i], s.ndim, s.d);
        if (info->flags & OPF_BROADCAST) { /* as dispatch.c's broadcast_view */
            kiln_strided b = st;
            b.ndim = meta[0].ndim;
            int lead = meta[0].ndim - st.ndim;
            for (int a = 0; a < meta[0].ndim; a++) {
                b.shape[a] = meta[0].shape[a];
                b.strides[a] =
                    (a < lead || st.shape[a - lead] != meta[0].shape[a]) ? 0 : st.strides[a - lead];
            }
            st = b;
        }
        args.in[i] = st;
    }
    for (int o = 0; o < info->n_out; o++) {
        if (o == 0 && (info->flags & OPF_INPLACE)) {
            args.out[0] = kh_strided_contig(args.in[0].data, meta[0].dtype, meta[0].ndim, meta[0].shape);
            continue;
        }
        kiln_shape s = {.ndim = meta[o].ndim};
        memcpy(s.d, meta[o].shape, sizeof(int64_t) * (size_t)meta[o].ndim);
        void *d = kh_gbuf_alloc(&gout[o], kiln_dtype_size(meta[o].dtype) * (size_t)kh_numel(s));
        args.out[o] = kh_strided_contig(d, meta[o].dtype, s.ndim, s.d);
    }
    if (kiln_tensor_kernel_stream(KILN_CPU, &args.stream)) {
        kh_fail(x, "kernel check: no CPU stream: %s", kiln_error_message());
        goto done;
    }
    if (k->workspace) args.workspace_bytes = k->workspace(&args);
    if (args.workspace_bytes) args.workspace = kh_gbuf_alloc(&gws, args.workspace_bytes);
    kiln_status st = k->run(&args);
    if (st) {
        kh_fail(x, "kernel check: the CPU kernel of %s failed: %s", info->name, kiln_error_message());
        goto done;
    }
    for (int i = 0; i < c->n_in; i++) {
        kh_guard_report(x, &gin[i], "input", i);
        bool written_in_place = i == 0 && (info->flags & OPF_INPLACE);
        if (gin[i].copy && !written_in_place && memcmp(gin[i].copy, gin[i].raw + KH_GUARD, gin[i].bytes))
            kh_fail(x, "kernel check: the kernel of %s modified input %d", info->name, i);
    }
    for (int o = 0; o < info->n_out; o++) kh_guard_report(x, &gout[o], "output", o);
    kh_guard_report(x, &gws, "workspace", 0);
    for (int o = 0; o < info->n_out && o < KH_MAX_OUT; o++) {
        if (!ref->out[o]) continue;
        kiln_shape s = {.ndim = meta[o].ndim};
        memcpy(s.d, meta[o].shape, sizeof(int64_t) * (size_t)meta[o].ndim);
        int64_t n = kh_numel(s);
        double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t j = 0; j < n; j++) v[j] = kh_load(args.out[o].data, meta[o].dtype, j);
        kh_compare(x, "kernel", o, ref, s, meta[o].dtype, v);
        free(v);
    }
done:
    for (int i = 0; i < KH_MAX_IN; i++) kh_gbuf_free(&gin[i]);
    for (int o = 0; o < KILN_OP_MAX_OUT; o++) kh_gbuf_free(&gout[o]);
    kh_gbuf_free(&gws);
}
