/* Anomaly mode: the dispatcher's anomaly hook reads every op's floating
 * outputs and stops at the first NaN or infinity, naming the op, its
 * inputs' ranges and the user's line. Ops run inside a backward formula
 * are named with the forward op being differentiated and that op's line,
 * which is where the user can do something about it.
 *
 * The end hook runs innermost first, before autograd's: an anomaly fails
 * the call before a node is recorded, and the dispatcher drops the outputs. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_internal.h"
#include "base/error.h"
#include "base/log_internal.h"
#include "diag/anomaly.h"
#include "kiln/diag.h"
#include "ops/op_registry.h"
#include "tensor/scope.h"

#define F16_MAX  65504.0
#define F16_WARN (0.9 * F16_MAX)

static atomic_bool anomaly_enabled;
static _Thread_local kiln_anomaly_report last_report;
/* Reading a device tensor back runs copies that may dispatch ops: they
 * are not checked again. */
static _Thread_local int checking;

/* Call sites already warned about f16 values near the limit. */
static pthread_mutex_t warned_mutex = PTHREAD_MUTEX_INITIALIZER;
typedef struct warned_site {
    const char *file;
    int line;
    kiln_op_id op;
} warned_site;
static warned_site warned[64];
static int n_warned;

typedef struct value_stats {
    double min, max, max_abs; /* over finite values */
    int64_t n, n_nan, n_pos_inf, n_neg_inf;
} value_stats;

void kiln_set_detect_anomaly(bool enabled) { atomic_store(&anomaly_enabled, enabled); }
bool kiln_is_anomaly_enabled(void) { return atomic_load(&anomaly_enabled); }

void kiln_anomaly_last(kiln_anomaly_report *out) {
    if (out) *out = last_report;
}

void kiln_anomaly_clear(void) { memset(&last_report, 0, sizeof last_report); }

static double load(const void *data, kiln_dtype dt, int64_t i) {
    switch (dt) {
    case KILN_F32:
        return ((const float *)data)[i];
    case KILN_F64:
        return ((const double *)data)[i];
    case KILN_F16:
        return kiln_f16_to_f32(((const uint16_t *)data)[i]);
    case KILN_BF16:
        return kiln_bf16_to_f32(((const uint16_t *)data)[i]);
    default:
        return 0.0;
    }
}

static void stats_add(value_stats *s, double v) {
    s->n++;
    if (isnan(v)) {
        s->n_nan++;
    } else if (isinf(v)) {
        if (v > 0)
            s->n_pos_inf++;
        else
            s->n_neg_inf++;
    } else {
        bool first = s->n - s->n_nan - s->n_pos_inf - s->n_neg_inf == 1;
        if (first || v < s->min) s->min = v;
        if (first || v > s->max) s->max = v;
        if (fabs(v) > s->max_abs) s->max_abs = fabs(v);
    }
}

/* Walk a strided view element by element (row-major index order). */
static void scan_strided(const kiln_strided *s, value_stats *vs) {
    int64_t numel = 1;
    for (int d = 0; d < s->ndim; d++) numel *= s->shape[d];
    if (numel == 0 || !s->data) return;
    int64_t idx[KILN_MAX_DIMS] = {0}, off = 0;
    for (int64_t k = 0; k < numel; k++) {
        stats_add(vs, load(s->data, s->dtype, off));
        for (int d = s->ndim - 1; d >= 0; d--) {
            if (++idx[d] < s->shape[d]) {
                off += s->strides[d];
                break;
            }
            off -= s->strides[d] * (s->shape[d] - 1);
            idx[d] = 0;
        }
    }
}

/* Statistics of t's values into *vs; *scanned false when t has no
 * readable floating data (not floating, meta). An error when the values
 * cannot be read: a CPU tensor in an opaque layout is converted to strided
 * first, a device tensor copied to the host, and either can run out of
 * memory. */
static kiln_status scan_tensor(const kiln_tensor *t, value_stats *vs, bool *scanned) {
    memset(vs, 0, sizeof *vs);
    *scanned = false;
    if (!t || !kiln_dtype_is_floating(t->dtype)) return KILN_OK;
    kiln_device dev = kiln_get_device(t);
    if (dev.type == KILN_DEVICE_META) return KILN_OK;
    if (dev.type == KILN_DEVICE_CPU) {
        kiln_strided s;
        KILN_TRY(kiln_tensor_strided(t, &s));
        scan_strided(&s, vs);
        *scanned = true;
        return KILN_OK;
    }
    int64_t numel = kiln_numel(t);
    size_t bytes = (size_t)numel * kiln_dtype_size(t->dtype);
    void *host = bytes ? KILN_MALLOC(bytes) : NULL;
    if (bytes && !host) return kiln_error_last()->status;
    kiln_status st = bytes ? kiln_to_host(t, host, bytes) : KILN_OK;
    if (!st) {
        kiln_strided s = {.data = host, .dtype = t->dtype, .ndim = 1, .shape = {numel}, .strides = {1}};
        scan_strided(&s, vs);
        *scanned = true;
    }
    free(host);
    return st;
}

static bool first_warning(const char *file, int line, kiln_op_id op) {
    pthread_mutex_lock(&warned_mutex);
    bool first = true;
    for (int i = 0; i < n_warned && first; i++)
        if (warned[i].line == line && warned[i].op == op &&
            (warned[i].file == file || strcmp(warned[i].file, file) == 0))
            first = false;
    if (first && n_warned < (int)(sizeof warned / sizeof warned[0]))
        warned[n_warned++] = (warned_site){file, line, op};
    pthread_mutex_unlock(&warned_mutex);
    return first;
}

/* "(unknown)" sites have no file to show; the op name is still useful. */
static const char *call_site(const kiln_node **backward_node, int *line) {
    *backward_node = kiln_backward_running_node();
    if (*backward_node) {
        *line = (*backward_node)->line;
        return (*backward_node)->file ? (*backward_node)->file : "(unknown)";
    }
    return kiln_site_get(line);
}

static int format_inputs(const kiln_op_call *c, kiln_anomaly_report *r, char *buf, size_t cap) {
    size_t len = 0;
    r->n_in = c->n_in < 8 ? c->n_in : 8;
    for (int i = 0; i < c->n_in && len < cap; i++) {
        value_stats vs;
        kiln_anomaly_input *ri = i < 8 ? &r->in[i] : NULL;
        const char *dt = c->in[i] ? kiln_dtype_name(c->in[i]->dtype) : "-";
        if (!c->in[i]) {
            len += (size_t)snprintf(buf + len, cap - len, "; input %d: absent", i);
            continue;
        }
        bool scanned;
        if (scan_tensor(c->in[i], &vs, &scanned) || !scanned) {
            if (ri) ri->present = true;
            len += (size_t)snprintf(buf + len, cap - len, "; input %d: %s (not checked)", i, dt);
            continue;
        }
        if (ri) *ri = (kiln_anomaly_input){true, true, vs.min, vs.max, vs.n_nan, vs.n_pos_inf + vs.n_neg_inf};
        len += (size_t)snprintf(buf + len, cap - len,
                                "; input %d: %s, %lld values, min %g, max %g, %s NaN, %lld inf", i, dt,
                                (long long)vs.n, vs.min, vs.max, vs.n_nan ? "has" : "no",
                                (long long)(vs.n_pos_inf + vs.n_neg_inf));
    }
    return (int)len;
}

static kiln_status report_anomaly(const kiln_op_call *c, int out_i, const value_stats *vs) {
    kiln_anomaly_report *r = &last_report;
    memset(r, 0, sizeof *r);
    const kiln_node *bn;
    r->found = true;
    r->file = call_site(&bn, &r->line);
    snprintf(r->op, sizeof r->op, "%s", c->info->name);
    if (bn) snprintf(r->backward_of, sizeof r->backward_of, "%s", kiln_node_name(bn));
    r->output = out_i;
    r->n_nan = vs->n_nan, r->n_pos_inf = vs->n_pos_inf, r->n_neg_inf = vs->n_neg_inf;
    r->f16_overflow = c->out[out_i]->dtype == KILN_F16 && (vs->n_pos_inf || vs->n_neg_inf);
    char where[512], inputs[600];
    if (bn)
        snprintf(where, sizeof where,
                 "kiln_%.31s in the backward of kiln_%.31s (%.40s), whose forward call is at %.200s:%d",
                 r->op, r->backward_of, kiln_node_backward_name(bn), r->file, r->line);
    else
        snprintf(where, sizeof where, "kiln_%.31s at %.200s:%d", r->op, r->file, r->line);
    inputs[0] = '\0';
    format_inputs(c, r, inputs, sizeof inputs);
    const char *hint = r->f16_overflow
                           ? "the result overflowed f16 (largest finite value 65504): compute this op in f32 "
                             "(kiln_to or autocast's f32 class) or scale the values down"
                           : "look at the inputs' ranges: clamp, add an epsilon, or lower the learning rate";
    kiln_status st =
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint,
                   "anomaly: %s produced %lld NaN, %lld +inf, %lld -inf in output %d (%s)%s", where,
                   (long long)vs->n_nan, (long long)vs->n_pos_inf, (long long)vs->n_neg_inf, out_i,
                   kiln_dtype_name(c->out[out_i]->dtype), inputs);
    kiln_log_write(KILN_LOG_ERROR, "%s (hint: %s)", kiln_error_message(), hint);
    return st;
}

static void warn_f16_near_limit(const kiln_op_call *c, const value_stats *vs) {
    const kiln_node *bn;
    int line;
    const char *file = call_site(&bn, &line);
    if (!first_warning(file, line, c->op)) return;
    kiln_log_write(
        KILN_LOG_WARN,
        "anomaly: kiln_%s at %s:%d produced f16 values up to %g, %.0f%% of the f16 limit (65504): the next "
        "op may overflow to inf; compute it in f32 (kiln_to or autocast's f32 class)",
        c->info->name, file, line, vs->max_abs, 100.0 * vs->max_abs / F16_MAX);
}

static kiln_status check_call(const kiln_op_call *c) {
    if (c->info->flags & OPF_VIEW) return KILN_OK; /* no kernel ran: its input was checked */
    for (int i = 0; i < c->n_out; i++) {
        value_stats vs;
        bool scanned;
        KILN_TRY(scan_tensor(c->out[i], &vs, &scanned));
        if (!scanned) continue;
        if (vs.n_nan || vs.n_pos_inf || vs.n_neg_inf) return report_anomaly(c, i, &vs);
        if (c->out[i]->dtype == KILN_F16 && vs.max_abs > F16_WARN) warn_f16_near_limit(c, &vs);
    }
    return KILN_OK;
}

static kiln_status anomaly_end(kiln_op_call *c, kiln_status status) {
    if (status || checking || !atomic_load_explicit(&anomaly_enabled, memory_order_relaxed)) return KILN_OK;
    checking++;
    kiln_status st = check_call(c);
    checking--;
    return st;
}

void kiln_anomaly_init(void) {
    static const kiln_dispatch_hook hook = {NULL, anomaly_end};
    kiln_dispatch_set_hook(KILN_HOOK_ANOMALY, &hook);
}
