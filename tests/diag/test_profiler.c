/* The profiler: a small CNN step (conv2d, relu, linear, cross entropy,
 * backward, SGD) runs under it with user ranges. The table must hold the
 * ops with the right call counts, self <= total, self times summing to
 * the footer, and sort and row limit must work; the Chrome trace must
 * parse and hold every op and range, nested within its parent on its
 * thread; the schedule must record exactly its active steps and call
 * on_trace_ready once; the efficiency counters must show a steady state
 * (no raw allocation, no pageable copy, one host sync: kiln_item). */
#include <pthread.h>
#include <unistd.h>

#include "diag/json.h"
#include "diag/profiler_internal.h"
#include "test_util.h"

/* ---- A small model ------------------------------------------------------------------ */

typedef struct model {
    kiln_tensor *x, *y;             /* (4, 1, 8, 8) f32, (4) i64 */
    kiln_tensor *cw, *cb, *lw, *lb; /* (4, 1, 3, 3), (4), (10, 144), (10) */
    kiln_optimizer *opt;
} model;

static bool model_init(model *m) {
    kiln_manual_seed(7);
    int64_t labels[4] = {1, 3, 5, 7};
    m->x = kiln_randn(KILN_SHAPE(4, 1, 8, 8), KILN_F32, KILN_CPU);
    m->y = kiln_from_data(KILN_SHAPE(4), KILN_I64, KILN_CPU, labels);
    m->cw = kiln_randn(KILN_SHAPE(4, 1, 3, 3), KILN_F32, KILN_CPU);
    m->cb = kiln_zeros(KILN_SHAPE(4), KILN_F32, KILN_CPU);
    m->lw = kiln_randn(KILN_SHAPE(10, 144), KILN_F32, KILN_CPU);
    m->lb = kiln_zeros(KILN_SHAPE(10), KILN_F32, KILN_CPU);
    kiln_tensor *params[4] = {m->cw, m->cb, m->lw, m->lb};
    for (int i = 0; i < 4; i++) CHECK_OK(kiln_set_requires_grad(params[i], true));
    kiln_sgd_opts so = kiln_sgd_defaults(0.01);
    m->opt = kiln_sgd(params, 4, &so);
    return m->x && m->y && m->opt;
}

static void model_free(model *m) {
    kiln_optimizer_free(m->opt);
    kiln_tensor *all[6] = {m->x, m->y, m->cw, m->cb, m->lw, m->lb};
    for (int i = 0; i < 6; i++) kiln_release(all[i]);
}

static kiln_status train_step(model *m, double *loss) {
    kiln_scope_begin();
    kiln_range_push("forward");
    kiln_tensor *h = kiln_relu(kiln_conv2d(m->x, m->cw, m->cb, NULL));
    kiln_tensor *logits = kiln_linear(kiln_flatten(h, 1, -1), m->lw, m->lb);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *l = kiln_cross_entropy(logits, m->y, &lo);
    kiln_range_pop();
    kiln_status st = l ? kiln_item(l, loss) : kiln_error_last()->status;
    kiln_range_push("backward");
    if (!st) st = kiln_optimizer_zero_grad(m->opt, true);
    if (!st) st = kiln_backward(l, NULL, false);
    kiln_range_pop();
    kiln_range_push("optimizer");
    if (!st) st = kiln_optimizer_step(m->opt);
    kiln_range_pop();
    kiln_status end = kiln_scope_end();
    return st ? st : end;
}

/* ---- Reading the table ------------------------------------------------------------ */

/* Nanoseconds from PyTorch's time format. */
static double parse_time(const char *s) {
    double v = atof(s);
    if (strstr(s, "ms")) return v * 1e6;
    if (strstr(s, "us")) return v * 1e3;
    return v * 1e9;
}

typedef struct row {
    char name[64];
    double self_cpu, cpu_total;
    long long calls;
} row;

/* The data rows of a table (between the second and third rules). */
static int table_rows(const char *table, row *rows, int max) {
    int rules = 0, n = 0;
    for (const char *line = table; *line;) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (line[0] == '-') rules++;
        else if (rules == 2 && n < max && len > 55) {
            row *r = &rows[n++];
            snprintf(r->name, sizeof r->name, "%.55s", line);
            for (int k = (int)strlen(r->name) - 1; k >= 0 && r->name[k] == ' '; k--) r->name[k] = 0;
            char cols[9][32];
            if (sscanf(line + 55, "%31s %31s %31s %31s %31s %31s %31s %31s", cols[0], cols[1], cols[2], cols[3],
                       cols[4], cols[5], cols[6], cols[7]) == 8) {
                r->self_cpu = parse_time(cols[1]);
                r->cpu_total = parse_time(cols[3]);
                r->calls = atoll(cols[7]);
            }
        }
        line += len + (eol ? 1 : 0);
    }
    return n;
}

static const row *find_row(const row *rows, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0) return &rows[i];
    return NULL;
}

static long long calls_of(const row *rows, int n, const char *name) {
    const row *r = find_row(rows, n, name);
    return r ? r->calls : 0;
}

/* ---- The trace, read with cJSON ------------------------------------------------------- */

typedef struct trace_ev {
    char ph[4], name[64], cat[32];
    double pid, tid, ts, dur, id;
} trace_ev;

typedef struct trace {
    trace_ev *ev;
    int n;
} trace;

static double num_of(const cJSON *o, const char *key) {
    double v = 0;
    kiln_json_number(kiln_json_get(o, key), &v);
    return v;
}

/* The file's traceEvents, the fields the checks use of each; false when
 * the file is not valid JSON holding a traceEvents array. */
static bool read_trace(const char *path, trace *t) {
    size_t len = 0;
    char *text = kiln_json_read_file(path, &len), err[128] = "cannot be read";
    cJSON *root = text ? kiln_json_parse(text, len, err, sizeof err) : NULL;
    free(text);
    const cJSON *evs = kiln_json_get(root, "traceEvents"), *e;
    CHECK_MSG(cJSON_IsArray(evs), "%s: no traceEvents array (%s)", path, root ? "not in the object" : err);
    t->n = 0;
    t->ev = calloc((size_t)cJSON_GetArraySize(evs) + 1, sizeof *t->ev);
    const cJSON *list = t->ev && cJSON_IsArray(evs) ? evs : NULL;
    cJSON_ArrayForEach(e, list) {
        trace_ev *x = &t->ev[t->n++];
        snprintf(x->ph, sizeof x->ph, "%s", kiln_json_string(kiln_json_get(e, "ph"), ""));
        snprintf(x->name, sizeof x->name, "%s", kiln_json_string(kiln_json_get(e, "name"), ""));
        snprintf(x->cat, sizeof x->cat, "%s", kiln_json_string(kiln_json_get(e, "cat"), ""));
        x->pid = num_of(e, "pid"), x->tid = num_of(e, "tid"), x->ts = num_of(e, "ts");
        x->dur = num_of(e, "dur"), x->id = num_of(e, "id");
    }
    cJSON_Delete(root);
    return cJSON_IsArray(evs) && t->ev;
}

static int by_start(const void *a, const void *b) {
    const trace_ev *x = *(trace_ev *const *)a, *y = *(trace_ev *const *)b;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur ? 1 : 0;
}

/* Host X events of one pid: on each thread, intervals are nested or disjoint. */
static bool well_nested(trace_ev *ev, int n, double pid) {
    trace_ev **v = malloc((size_t)n * sizeof *v);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(ev[i].ph, "X") && ev[i].pid == pid) v[k++] = &ev[i];
    qsort(v, (size_t)k, sizeof *v, by_start);
    bool ok = true;
    trace_ev *stack[256];
    int depth = 0;
    for (int i = 0; i < k && ok; i++) {
        while (depth > 0 && (stack[depth - 1]->tid != v[i]->tid ||
                             stack[depth - 1]->ts + stack[depth - 1]->dur <= v[i]->ts))
            depth--;
        if (depth > 0 && v[i]->ts + v[i]->dur > stack[depth - 1]->ts + stack[depth - 1]->dur + 1e-3) {
            fprintf(stderr, "%s [%.3f, +%.3f] overlaps %s [%.3f, +%.3f]\n", v[i]->name, v[i]->ts, v[i]->dur,
                    stack[depth - 1]->name, stack[depth - 1]->ts, stack[depth - 1]->dur);
            ok = false;
        }
        if (depth < 256) stack[depth++] = v[i];
    }
    free(v);
    return ok;
}

static int count_events(const trace *p, const char *ph, const char *name) {
    int c = 0;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->ev[i].ph, ph) && (!name || !strcmp(p->ev[i].name, name))) c++;
    return c;
}

/* ---- Tests ------------------------------------------------------------------------------ */

/* Every record lies within its parent, on the parent's thread. */
static void check_records_nest(void) {
    const prof_result *r = kiln_profiler_result_lock();
    int bad = 0;
    for (size_t i = 0; i < r->n; i++) {
        int64_t p = r->rec[i].parent;
        if (p < 0) continue;
        const prof_record *c = &r->rec[i], *q = &r->rec[p];
        if ((size_t)p >= i || c->tid != q->tid || c->start_ns < q->start_ns || c->end_ns > q->end_ns) bad++;
    }
    kiln_profiler_result_unlock();
    CHECK_EQ_I(bad, 0);
}

static void test_table_and_trace(model *m) {
    CHECK_OK(kiln_profiler_start(NULL));
    double loss;
    for (int s = 0; s < 2; s++) CHECK_OK(train_step(m, &loss));
    CHECK_OK(kiln_profiler_stop());
    check_records_nest();

    char *t = kiln_profiler_table(KILN_SORT_CPU_TOTAL, 0);
    CHECK(t != NULL);
    if (!t) return;
    printf("%s", t);
    row rows[256];
    int n = table_rows(t, rows, 256);
    CHECK(n > 8);
    CHECK_EQ_I(calls_of(rows, n, "conv2d"), 2);
    CHECK_EQ_I(calls_of(rows, n, "relu"), 2);
    CHECK_EQ_I(calls_of(rows, n, "linear"), 2);
    CHECK_EQ_I(calls_of(rows, n, "log_softmax"), 2);
    CHECK_EQ_I(calls_of(rows, n, "forward"), 2);
    CHECK_EQ_I(calls_of(rows, n, "backward"), 2);
    CHECK_EQ_I(calls_of(rows, n, "kiln_item"), 2);
    CHECK(calls_of(rows, n, "conv2d_grad_weight") == 2);
    CHECK(calls_of(rows, n, "ProfilerStep#0") == 1);
    /* Device time per device: the model is on the CPU, whose kernels are
     * its device work; two-device sums are checked by test_data_parallel. */
    kiln_device devs[4];
    double ms[4] = {0};
    CHECK_EQ_I(kiln_profiler_device_times(devs, ms, 4), 1);
    CHECK(kiln_device_equal(devs[0], KILN_CPU) && ms[0] > 0);
    double self_sum = 0;
    for (int i = 0; i < n; i++) {
        CHECK_MSG(rows[i].cpu_total + 1 >= rows[i].self_cpu, "%s: total %.0f < self %.0f", rows[i].name,
                  rows[i].cpu_total, rows[i].self_cpu);
        if (i > 0) CHECK(rows[i - 1].cpu_total >= rows[i].cpu_total);
        self_sum += rows[i].self_cpu;
    }
    const char *foot = strstr(t, "Self CPU time total: ");
    CHECK(foot != NULL);
    double total = foot ? parse_time(foot + strlen("Self CPU time total: ")) : 0;
    /* Each row rounds to 1 ns below 1 ms, to 1 us above. */
    CHECK_MSG(fabs(self_sum - total) <= 0.002 * total + 1e3 * n, "self sum %.0f vs footer %.0f", self_sum, total);
    /* The step range holds everything: its total is the CPU total. */
    const row *step0 = find_row(rows, n, "ProfilerStep#0");
    CHECK(step0 && step0->cpu_total <= total * 1.001);
    free(t);

    t = kiln_profiler_table(KILN_SORT_CALLS, 3);
    n = t ? table_rows(t, rows, 256) : 0;
    CHECK_EQ_I(n, 3);
    for (int i = 1; i < n; i++) CHECK(rows[i - 1].calls >= rows[i].calls);
    free(t);
    t = kiln_profiler_table(KILN_SORT_SELF_CPU, 0);
    n = t ? table_rows(t, rows, 256) : 0;
    for (int i = 1; i < n; i++) CHECK(rows[i - 1].self_cpu >= rows[i].self_cpu);
    free(t);
    t = kiln_profiler_table(KILN_SORT_NAME, 0);
    n = t ? table_rows(t, rows, 256) : 0;
    for (int i = 1; i < n; i++) CHECK(strcmp(rows[i - 1].name, rows[i].name) < 0);
    free(t);

    const char *path = "test_profiler_trace.json";
    CHECK_OK(kiln_profiler_export_chrome_trace(path));
    trace p = {0};
    CHECK(read_trace(path, &p));
    const char *names[] = {"conv2d", "relu", "linear", "log_softmax", "nll_loss", "forward", "backward", "optimizer",
                           "backward_conv2d", "conv2d_grad_weight", "kiln_item", "ProfilerStep#0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK_MSG(count_events(&p, "X", names[i]) >= 1, "no X event for %s", names[i]);
    CHECK_EQ_I(count_events(&p, "X", "conv2d"), 2 + 2); /* the host op and its device work */
    CHECK(count_events(&p, "M", "process_name") >= 2);
    CHECK(count_events(&p, "M", "thread_name") >= 2);
    int flows = count_events(&p, "s", NULL);
    CHECK(flows > 0);
    CHECK_EQ_I(flows, count_events(&p, "f", NULL));
    double host_pid = (double)getpid();
    CHECK(well_nested(p.ev, p.n, host_pid));
    /* Device work lies within the op that launched it. */
    int kernels = 0;
    for (int i = 0; i < p.n; i++)
        if (!strcmp(p.ev[i].ph, "X") && !strcmp(p.ev[i].cat, "kernel")) kernels++;
    CHECK_EQ_I(kernels, flows);
    free(p.ev);
    remove(path);
}

static int ready_calls;
static char *ready_table;

static void on_ready(void *user) {
    (*(int *)user)++;
    free(ready_table);
    ready_table = kiln_profiler_table(KILN_SORT_NAME, 0);
}

static void test_schedule(model *m) {
    kiln_profiler_schedule s = {.wait = 1, .warmup = 1, .active = 2, .repeat = 1};
    kiln_profiler_action want[] = {KILN_PROFILER_NONE, KILN_PROFILER_WARMUP, KILN_PROFILER_RECORD,
                                   KILN_PROFILER_RECORD_AND_SAVE, KILN_PROFILER_NONE, KILN_PROFILER_NONE};
    for (int i = 0; i < 6; i++) CHECK_EQ_I(kiln_profiler_schedule_action(&s, i), want[i]);
    kiln_profiler_schedule sk = {.wait = 0, .warmup = 0, .active = 1, .skip_first = 2};
    CHECK_EQ_I(kiln_profiler_schedule_action(&sk, 1), KILN_PROFILER_NONE);
    CHECK_EQ_I(kiln_profiler_schedule_action(&sk, 2), KILN_PROFILER_RECORD_AND_SAVE);
    CHECK_EQ_I(kiln_profiler_schedule_action(&sk, 7), KILN_PROFILER_RECORD_AND_SAVE);

    kiln_profiler_opts o = {.schedule = s, .on_trace_ready = on_ready, .user = &ready_calls};
    CHECK_OK(kiln_profiler_start(&o));
    CHECK_FAILS(kiln_profiler_start(&o), KILN_ERR_STATE, "already started");
    double loss;
    for (int step = 0; step < 6; step++) {
        CHECK_OK(train_step(m, &loss));
        CHECK_OK(kiln_profiler_step());
    }
    CHECK_OK(kiln_profiler_stop());
    CHECK_EQ_I(ready_calls, 1);
    CHECK(ready_table != NULL);
    if (!ready_table) return;
    row rows[256];
    int n = table_rows(ready_table, rows, 256);
    CHECK(find_row(rows, n, "ProfilerStep#2") && find_row(rows, n, "ProfilerStep#3"));
    int steps = 0;
    for (int i = 0; i < n; i++) steps += strncmp(rows[i].name, "ProfilerStep#", 13) == 0;
    CHECK_EQ_I(steps, 2);
    CHECK_EQ_I(calls_of(rows, n, "conv2d"), 2);
    CHECK_EQ_I(calls_of(rows, n, "forward"), 2);
    free(ready_table);
    ready_table = NULL;
}

static void test_counters(model *m) {
    double loss;
    CHECK_OK(train_step(m, &loss)); /* the first step fills the caches */
    for (int s = 0; s < 3; s++) {
        kiln_counters a, b, d;
        kiln_counters_get(&a);
        CHECK_OK(train_step(m, &loss));
        kiln_counters_get(&b);
        kiln_counters_diff(&b, &a, &d);
        CHECK_EQ_I(d.raw_allocs, 0);
        CHECK_EQ_I(d.pageable_copies, 0);
        CHECK_EQ_I(d.host_syncs, 1); /* kiln_item of the loss */
        CHECK(d.kernel_launches > 10);
    }
    /* Per-step counters from the profiler agree. */
    CHECK_OK(kiln_profiler_start(NULL));
    CHECK_OK(train_step(m, &loss));
    CHECK_OK(kiln_profiler_step());
    kiln_counters d;
    kiln_profiler_step_counters(&d);
    CHECK_EQ_I(d.host_syncs, 1);
    CHECK_EQ_I(d.raw_allocs, 0);
    CHECK_OK(kiln_profiler_stop());
    /* What is and is not a host sync. */
    kiln_counters_reset();
    kiln_stream *st = kiln_stream_default(KILN_CPU);
    kiln_event *ev = NULL;
    CHECK_OK(kiln_event_create(KILN_CPU, KILN_EVENT_DEFAULT, &ev));
    CHECK_OK(kiln_event_record(ev, st));
    CHECK_OK(kiln_stream_wait_event(st, ev));
    kiln_counters c;
    kiln_counters_get(&c);
    CHECK_EQ_I(c.host_syncs, 0);
    CHECK_OK(kiln_event_synchronize(ev));
    CHECK_OK(kiln_stream_synchronize(st));
    CHECK_OK(kiln_device_synchronize(KILN_CPU));
    kiln_counters_get(&c);
    CHECK_EQ_I(c.host_syncs, 3);
    kiln_event_destroy(ev);
}

static void *thread_ops(void *arg) {
    (void)arg;
    kiln_tensor *a = kiln_ones(KILN_SHAPE(8), KILN_F32, KILN_CPU);
    kiln_range_push("worker");
    for (int i = 0; i < 50; i++) kiln_release(kiln_add(a, a));
    kiln_range_pop();
    kiln_release(a);
    return NULL;
}

static void test_threads(void) {
    CHECK_OK(kiln_profiler_start(NULL));
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, thread_ops, NULL);
    thread_ops(NULL);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    CHECK_OK(kiln_profiler_stop());
    check_records_nest();
    char *t = kiln_profiler_table(KILN_SORT_CALLS, 0);
    row rows[64];
    int n = t ? table_rows(t, rows, 64) : 0;
    CHECK_EQ_I(calls_of(rows, n, "add"), 200);
    CHECK_EQ_I(calls_of(rows, n, "worker"), 4);
    free(t);
    const prof_result *r = kiln_profiler_result_lock();
    uint64_t tids[8];
    int nt = 0;
    for (size_t i = 0; i < r->n; i++) {
        bool seen = false;
        for (int k = 0; k < nt; k++) seen |= tids[k] == r->rec[i].tid;
        if (!seen && nt < 8) tids[nt++] = r->rec[i].tid;
    }
    kiln_profiler_result_unlock();
    CHECK_EQ_I(nt, 4);
}

/* FLOPs of the three convolution passes and a matmul, counted from the
 * shapes (a multiply-add is 2): x (2, 3, 9, 7), weight (5, 3, 3, 2),
 * padding 1 -> y (2, 5, 9, 8): 2 * 720 * 18 = 25920 in each pass; mm
 * (4, 6) x (6, 3): 2 * 4 * 3 * 6 = 144. The table gains its FLOP columns
 * and the trace a "flops" argument; ops without arithmetic count none. */
static void test_flops(void) {
    kiln_tensor *x = kiln_randn(KILN_SHAPE(2, 3, 9, 7), KILN_F32, KILN_CPU);
    kiln_tensor *w = kiln_randn(KILN_SHAPE(5, 3, 3, 2), KILN_F32, KILN_CPU);
    kiln_tensor *a = kiln_randn(KILN_SHAPE(4, 6), KILN_F32, KILN_CPU);
    kiln_tensor *b = kiln_randn(KILN_SHAPE(6, 3), KILN_F32, KILN_CPU);
    CHECK_OK(kiln_set_requires_grad(x, true));
    CHECK_OK(kiln_set_requires_grad(w, true));
    CHECK_OK(kiln_profiler_start(NULL));
    kiln_conv2d_opts o = {.padding = {1, 1}};
    kiln_tensor *y = kiln_conv2d(x, w, NULL, &o);
    kiln_tensor *l = y ? kiln_sum(y, 0, NULL, false) : NULL;
    CHECK(l && kiln_backward(l, NULL, false) == KILN_OK);
    kiln_tensor *p = kiln_mm(a, b);
    /* the fused op counts its convolution (y (2, 5, 9, 8) before the 2x2
     * pooling, whose floor drops a row) */
    kiln_tensor *q = kiln_conv2d_relu_max_pool2d(x, w, NULL, &o, 2, NULL);
    CHECK(q != NULL);
    CHECK_OK(kiln_profiler_stop());
    double g = -1, secs = -1;
    CHECK_EQ_I(kiln_profiler_op_flops("conv2d", &g, &secs), 1);
    CHECK_MSG(g * 1e9 > 25919.5 && g * 1e9 < 25920.5 && secs > 0, "conv2d: %.1f FLOP in %g s", g * 1e9, secs);
    CHECK_EQ_I(kiln_profiler_op_flops("conv2d_grad_input", &g, NULL), 1);
    CHECK_MSG(g * 1e9 > 25919.5 && g * 1e9 < 25920.5, "conv2d_grad_input: %.1f FLOP", g * 1e9);
    CHECK_EQ_I(kiln_profiler_op_flops("conv2d_grad_weight", &g, NULL), 1);
    CHECK_MSG(g * 1e9 > 25919.5 && g * 1e9 < 25920.5, "conv2d_grad_weight: %.1f FLOP", g * 1e9);
    CHECK_EQ_I(kiln_profiler_op_flops("conv2d_relu_max_pool2d", &g, NULL), 1);
    CHECK_MSG(g * 1e9 > 25919.5 && g * 1e9 < 25920.5, "conv2d_relu_max_pool2d: %.1f FLOP", g * 1e9);
    CHECK_EQ_I(kiln_profiler_op_flops("mm", &g, NULL), 1);
    CHECK_MSG(g * 1e9 > 143.5 && g * 1e9 < 144.5, "mm: %.1f FLOP", g * 1e9);
    CHECK_EQ_I(kiln_profiler_op_flops("sum", &g, NULL), 1);
    CHECK(g == 0);
    CHECK_EQ_I(kiln_profiler_op_flops("no such op", &g, &secs), 0);
    char *t = kiln_profiler_table(KILN_SORT_NAME, 0);
    CHECK(t && strstr(t, "Total GFLOP") && strstr(t, "GFLOP/s"));
    free(t);
    char path[] = "/tmp/kiln_profiler_flops_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        CHECK_OK(kiln_profiler_export_chrome_trace(path));
        FILE *f = fopen(path, "r");
        char buf[1 << 16];
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[n] = 0;
        if (f) fclose(f);
        CHECK_MSG(strstr(buf, "\"flops\":25920") != NULL, "the trace has no \"flops\":25920");
        CHECK(strstr(buf, "\"flops\":144") != NULL);
        remove(path);
    }
    kiln_release(p), kiln_release(q), kiln_release(l), kiln_release(y);
    kiln_release(x), kiln_release(w), kiln_release(a), kiln_release(b);
}

int main(void) {
    if (kiln_init()) return 1;
    test_flops();
    model m = {0};
    CHECK(model_init(&m));
    double loss;
    CHECK_OK(train_step(&m, &loss)); /* warm the caches before anything is timed */
    test_table_and_trace(&m);
    test_schedule(&m);
    test_counters(&m);
    test_threads();
    CHECK_FAILS(kiln_profiler_stop(), KILN_ERR_STATE, "not started");
    model_free(&m);
    kiln_shutdown();
    return kt_finish();
}
