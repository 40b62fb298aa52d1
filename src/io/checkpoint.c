/* Training checkpoints (kiln_checkpoint_save / _load): a safetensors file
 * holding the module's state dict, the optimizer's state tensors and the
 * training position in __metadata__ (see kiln/io.h and docs/training.md).
 *
 * The optimizer's record is read through optim/optim_internal.h: the
 * checkpoint is the one place outside src/optim that needs every state
 * slot and the per-parameter step counts. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "io/safetensors_internal.h"
#include "kiln/io.h"
#include "optim/optim_internal.h"
#include "runtime/runtime_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define OPT_PREFIX "optimizer."

static const char *slot_name(const kiln_optimizer *o, int k) {
    static const char *const adam[KILN_OPTIM_STATES] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    if (o->kind == KILN_OPTIM_SGD) return k == 0 ? "momentum_buffer" : NULL;
    return adam[k];
}

static const char *kind_name(kiln_optimizer_kind k) {
    return k == KILN_OPTIM_SGD ? "sgd" : k == KILN_OPTIM_ADAM ? "adam" : "adamw";
}

/* The CPU kernel table kiln_init put in force. */
static const char *cpu_kernels_in_force(void) { return kiln_kernels_in_force(KILN_DEVICE_CPU); }

/* Parameter i's name: its state-dict name in m, else "param<i>". */
static void param_name(const kiln_named_tensor *named, int n_named, kiln_tensor *p, int i, char *buf,
                       size_t size) {
    for (int j = 0; j < n_named; j++)
        if (named[j].tensor == p) {
            snprintf(buf, size, "%s", named[j].name);
            return;
        }
    snprintf(buf, size, "param%d", i);
}

static kiln_device module_device(kiln_module *m) {
    kiln_named_tensor *items = NULL;
    int n = 0;
    kiln_device d = KILN_CPU;
    if (kiln_module_state_dict(m, &items, &n) == KILN_OK && n > 0) d = kiln_get_device(items[0].tensor);
    free(items);
    return d;
}

/* ---- Saving ---------------------------------------------------------------------------- */

typedef struct ckpt_writer {
    kiln_named_tensor *items;
    char **names; /* owned names of the optimizer entries */
    int n, cap, n_names;
    char *meta_text[96]; /* owned key/value strings */
    int n_meta;
} ckpt_writer;

static bool add_item(ckpt_writer *w, const char *name, kiln_tensor *t, bool own_name) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        kiln_named_tensor *items = KILN_REALLOC(w->items, (size_t)cap * sizeof *items);
        char **names = KILN_REALLOC(w->names, (size_t)cap * sizeof *names);
        if (items) w->items = items;
        if (names) w->names = names;
        if (!items || !names) return false;
        w->cap = cap;
    }
    char *copy = own_name ? strdup(name) : NULL;
    if (own_name && !copy) return false;
    if (copy) w->names[w->n_names++] = copy;
    w->items[w->n++] = (kiln_named_tensor){copy ? copy : name, t};
    return true;
}

static bool add_meta(ckpt_writer *w, const char *key, const char *fmt, ...) {
    if (w->n_meta + 2 > (int)(sizeof w->meta_text / sizeof w->meta_text[0])) return false;
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *k = strdup(key), *v = strdup(buf);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    w->meta_text[w->n_meta++] = k;
    w->meta_text[w->n_meta++] = v;
    return true;
}

static bool add_meta_str(ckpt_writer *w, const char *key, const char *value) {
    if (w->n_meta + 2 > (int)(sizeof w->meta_text / sizeof w->meta_text[0])) return false;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return false;
    }
    w->meta_text[w->n_meta++] = k;
    w->meta_text[w->n_meta++] = v;
    return true;
}

static void writer_free(ckpt_writer *w) {
    for (int i = 0; i < w->n_names; i++) free(w->names[i]);
    for (int i = 0; i < w->n_meta; i++) free(w->meta_text[i]);
    free(w->names);
    free(w->items);
}

static bool add_optimizer(ckpt_writer *w, kiln_module *m, kiln_optimizer *o, kiln_tensor **steps) {
    kiln_named_tensor *named = NULL;
    int n_named = 0;
    if (kiln_module_named_parameters(m, &named, &n_named) != KILN_OK) return false;
    bool ok = true;
    char pname[512], full[600];
    for (int i = 0; i < o->n && ok; i++) {
        param_name(named, n_named, o->params[i], i, pname, sizeof pname);
        for (int k = 0; k < KILN_OPTIM_STATES && ok; k++) {
            const char *slot = slot_name(o, k);
            if (!slot || !o->state[k][i]) continue;
            snprintf(full, sizeof full, OPT_PREFIX "%s.%s", pname, slot);
            ok = add_item(w, full, o->state[k][i], true);
        }
    }
    free(named);
    if (!ok) return false;
    *steps = kiln_from_data(KILN_SHAPE(o->n), KILN_I64, KILN_CPU, o->steps);
    if (!*steps) return false;
    return add_item(w, OPT_PREFIX "steps", *steps, false) && add_meta_str(w, "kiln.optimizer", kind_name(o->kind)) &&
           add_meta(w, "kiln.optimizer.lr", "%.17g", o->lr) &&
           add_meta(w, "kiln.optimizer.step_count", "%" PRId64, o->step_count) &&
           add_meta(w, "kiln.optimizer.params", "%d", o->n);
}

/* ---- The training state's ranges ---------------------------------------------------------
 * One check for save (a caller's bug: KILN_ERR_INVALID_ARGUMENT) and load
 * (an edited or damaged file: KILN_ERR_IO), so every checkpoint Kiln
 * writes loads, and every value a load hands out is in range. */

#define CKPT_HINT_LOAD "the checkpoint was edited or damaged: resume from another checkpoint, or train from scratch"

typedef struct range_ctx {
    const char *path;
    bool saving;
} range_ctx;

static kiln_status out_of_range(const range_ctx *c, const char *key, const char *value, const char *range) {
    if (c->saving)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a training state within the ranges of kiln/io.h",
                          "kiln_checkpoint_save %s: the state's '%s' is %s, outside %s", c->path, key, value, range);
    return KILN_RAISE(KILN_ERR_IO, CKPT_HINT_LOAD, "%s: metadata '%s' is %s, outside %s", c->path, key, value, range);
}

static kiln_status check_i64(const range_ctx *c, const char *key, int64_t v, int64_t lo, int64_t hi,
                             const char *hi_name) {
    if (v >= lo && v <= hi) return KILN_OK;
    char value[32], range[96];
    snprintf(value, sizeof value, "%" PRId64, v);
    snprintf(range, sizeof range, "%" PRId64 "..%" PRId64 "%s%s%s", lo, hi, hi_name ? " (" : "", hi_name ? hi_name : "",
             hi_name ? ")" : "");
    return out_of_range(c, key, value, range);
}

/* A finite double in [lo, hi] (either bound may be infinite); `range`
 * says it in words for the error. */
static kiln_status check_f64(const range_ctx *c, const char *key, double v, double lo, double hi, const char *range) {
    if (isfinite(v) && v >= lo && v <= hi) return KILN_OK;
    char value[32];
    snprintf(value, sizeof value, "%.17g", v);
    return out_of_range(c, key, value, range);
}

#define MAX_INPUT_DIM (1 << 20)

static kiln_status check_state(const range_ctx *c, const kiln_train_state *s) {
    const int64_t cnt = KILN_CHECKPOINT_MAX_COUNT;
    KILN_TRY(check_i64(c, "kiln.epoch", s->epoch, 0, KILN_CHECKPOINT_MAX_EPOCH, "KILN_CHECKPOINT_MAX_EPOCH"));
    KILN_TRY(check_i64(c, "kiln.epochs_done", s->epochs_done, 0, s->epoch, "kiln.epoch"));
    KILN_TRY(check_i64(c, "kiln.step", s->step, 0, cnt, "2^53"));
    KILN_TRY(check_i64(c, "kiln.batch_in_epoch", s->batch_in_epoch, 0, cnt, "2^53"));
    KILN_TRY(check_i64(c, "kiln.epoch_images", s->epoch_images, 0, cnt, "2^53"));
    KILN_TRY(check_i64(c, "kiln.window_steps", s->window_steps, 0, s->batch_in_epoch, "kiln.batch_in_epoch"));
    KILN_TRY(check_i64(c, "kiln.window_images", s->window_images, 0, s->epoch_images, "kiln.epoch_images"));
    /* The loss sums are reported, never trained on: any double, inf and
     * NaN included (a loss under f16 loss scaling may overflow; the
     * scaler skips that step, and the sums must still save). */
    KILN_TRY(check_f64(c, "kiln.epoch_correct", s->epoch_correct, 0, (double)(s->epoch_images - s->window_images),
                       "0..kiln.epoch_images - kiln.window_images"));
    KILN_TRY(check_f64(c, "kiln.window_correct", s->window_correct, 0, (double)s->window_images,
                       "0..kiln.window_images"));
    bool none = !s->input_c && !s->input_h && !s->input_w;
    if (!none) {
        KILN_TRY(check_i64(c, "kiln.input (channels)", s->input_c, 1, MAX_INPUT_DIM, NULL));
        KILN_TRY(check_i64(c, "kiln.input (height)", s->input_h, 1, MAX_INPUT_DIM, NULL));
        KILN_TRY(check_i64(c, "kiln.input (width)", s->input_w, 1, MAX_INPUT_DIM, NULL));
    }
    if (s->amp[0]) {
        if (strcmp(s->amp, "f16") && strcmp(s->amp, "bf16"))
            return out_of_range(c, "kiln.amp", s->amp, "f16 or bf16");
        KILN_TRY(check_f64(c, "kiln.amp.scale", s->amp_scale, DBL_MIN, INFINITY, "the finite numbers > 0"));
        KILN_TRY(check_i64(c, "kiln.amp.growth_tracker", s->amp_growth_tracker, 0, cnt, "2^53"));
    }
    return KILN_OK;
}

static bool add_state(ckpt_writer *w, kiln_module *m, const kiln_train_state *s) {
    kiln_rng rng = kiln_device_rng_reserve(module_device(m), 0);
    bool ok = add_meta(w, "kiln.generator.seed", "%" PRIu64, rng.seed) &&
              add_meta(w, "kiln.generator.subsequence", "%" PRIu64, rng.subsequence) &&
              add_meta(w, "kiln.generator.offset", "%" PRIu64, rng.offset) &&
              add_meta_str(w, "kiln.deterministic", kiln_deterministic() ? "true" : "false") &&
              add_meta_str(w, "kiln.cpu_kernels", cpu_kernels_in_force()) &&
              add_meta_str(w, "kiln.conv_autotune", kiln_is_conv_autotune() ? "true" : "false") &&
              add_meta_str(w, "kiln.cudnn_benchmark", kiln_is_cudnn_benchmark() ? "true" : "false");
    if (!ok || !s) return ok;
    /* %.17g: every double comes back bit for bit. */
    ok = add_meta(w, "kiln.epoch", "%" PRId64, s->epoch) && add_meta(w, "kiln.step", "%" PRId64, s->step) &&
         add_meta(w, "kiln.batch_in_epoch", "%" PRId64, s->batch_in_epoch) &&
         add_meta(w, "kiln.epochs_done", "%" PRId64, s->epochs_done) &&
         add_meta(w, "kiln.data_seed", "%" PRIu64, s->data_seed) &&
         add_meta(w, "kiln.epoch_loss_sum", "%.17g", s->epoch_loss_sum) &&
         add_meta(w, "kiln.epoch_correct", "%.17g", s->epoch_correct) &&
         add_meta(w, "kiln.epoch_images", "%" PRId64, s->epoch_images) &&
         add_meta(w, "kiln.window_steps", "%" PRId64, s->window_steps) &&
         add_meta(w, "kiln.window_images", "%" PRId64, s->window_images) &&
         add_meta(w, "kiln.window_loss_sum", "%.17g", s->window_loss_sum) &&
         add_meta(w, "kiln.window_correct", "%.17g", s->window_correct);
    if (ok && s->input_c > 0)
        ok = add_meta(w, "kiln.input", "%" PRId64 "x%" PRId64 "x%" PRId64, s->input_c, s->input_h, s->input_w);
    if (ok && s->model_spec) ok = add_meta_str(w, "kiln.model_spec", s->model_spec);
    if (ok && s->run_config) ok = add_meta_str(w, "kiln.run_config", s->run_config);
    if (ok && s->amp[0])
        ok = add_meta_str(w, "kiln.amp", s->amp) && add_meta(w, "kiln.amp.scale", "%.17g", s->amp_scale) &&
             add_meta(w, "kiln.amp.growth_tracker", "%" PRId64, s->amp_growth_tracker);
    return ok;
}

kiln_status kiln_checkpoint_save(const char *path, kiln_module *m, kiln_optimizer *opt,
                                 const kiln_train_state *state) {
    if (!path || !m)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_checkpoint_save: NULL path or module");
    if (state) KILN_TRY(check_state(&(range_ctx){path, true}, state));
    kiln_api_enter();
    ckpt_writer w = {0};
    kiln_tensor *steps = NULL;
    kiln_named_tensor *sd = NULL;
    int n_sd = 0;
    kiln_status st = kiln_module_state_dict(m, &sd, &n_sd);
    bool ok = st == KILN_OK && add_meta(&w, "kiln.checkpoint", "%d", KILN_CHECKPOINT_FORMAT);
    for (int i = 0; ok && i < n_sd; i++) ok = add_item(&w, sd[i].name, sd[i].tensor, false);
    if (ok && opt) ok = add_optimizer(&w, m, opt, &steps);
    if (ok) ok = add_state(&w, m, state);
    if (st == KILN_OK && !ok)
        st = kiln_error_last()->status ? kiln_error_last()->status
                                       : KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: out of memory", path);
    if (st == KILN_OK) st = kiln_st_write(path, w.items, w.n, (const char *const *)w.meta_text, w.n_meta / 2);
    kiln_tensor_drop(steps);
    writer_free(&w);
    free(sd);
    kiln_api_leave();
    return st;
}

/* ---- Loading --------------------------------------------------------------------------- */

static kiln_status bad_value(const char *path, const char *key, const char *v, const char *expected) {
    /* Shown cut to 40 bytes, control bytes as '?': a damaged file's value
     * can be long, or hold escapes for the terminal. */
    char shown[48] = "";
    size_t n = v ? strlen(v) : 0;
    for (size_t i = 0; i < n && i < 40; i++) shown[i] = (unsigned char)v[i] < 0x20 || v[i] == 0x7f ? '?' : v[i];
    shown[n < 40 ? n : 40] = '\0';
    return KILN_RAISE(KILN_ERR_IO, CKPT_HINT_LOAD, "%s: metadata '%s' is %s%s%s%s, expected %s", path, key,
                      v ? "'" : "missing", shown, n > 40 ? "..." : "", v ? "'" : "", expected);
}

/* A whole decimal integer: an optional '-' and digits, nothing else. */
static kiln_status meta_i64(const char *path, const kiln_st_index *idx, const char *key, int64_t *out) {
    const char *v = kiln_st_meta_get(idx, key);
    char *end = NULL;
    errno = 0;
    long long x = v && (*v == '-' || (*v >= '0' && *v <= '9')) ? strtoll(v, &end, 10) : 0;
    if (!end || *end || errno) return bad_value(path, key, v, "an integer");
    *out = x;
    return KILN_OK;
}

static kiln_status meta_u64(const char *path, const kiln_st_index *idx, const char *key, uint64_t *out) {
    const char *v = kiln_st_meta_get(idx, key);
    char *end = NULL;
    errno = 0;
    unsigned long long x = v && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno) return bad_value(path, key, v, "an unsigned integer");
    *out = x;
    return KILN_OK;
}

/* A number (strtod's syntax; inf and nan parse here and are refused by
 * the range checks, which name the key). */
static kiln_status meta_f64(const char *path, const kiln_st_index *idx, const char *key, double *out) {
    const char *v = kiln_st_meta_get(idx, key);
    char *end = NULL;
    double x = v && *v && *v != ' ' ? strtod(v, &end) : 0;
    if (!end || *end) return bad_value(path, key, v, "a number");
    *out = x;
    return KILN_OK;
}

/* "true" or "false"; absent: false. */
static kiln_status meta_bool(const char *path, const kiln_st_index *idx, const char *key, bool *out) {
    const char *v = kiln_st_meta_get(idx, key);
    *out = v && !strcmp(v, "true");
    if (v && !*out && strcmp(v, "false")) return bad_value(path, key, v, "true or false");
    return KILN_OK;
}

/* "kiln.checkpoint": 1 or KILN_CHECKPOINT_FORMAT; *version 0 when absent
 * (a plain safetensors file). */
static kiln_status format_version(const char *path, const kiln_st_index *idx, int *version) {
    const char *v = kiln_st_meta_get(idx, "kiln.checkpoint");
    *version = 0;
    if (!v) return KILN_OK;
    if (!strcmp(v, "1") || !strcmp(v, "2")) {
        *version = v[0] - '0';
        return KILN_OK;
    }
    return KILN_RAISE(KILN_ERR_IO, "load it with the Kiln that wrote it, or a newer one",
                      "%s: metadata 'kiln.checkpoint' is format version '%.40s'%s; this Kiln reads versions 1 to %d",
                      path, v, strlen(v) > 40 ? "..." : "", KILN_CHECKPOINT_FORMAT);
}

static const kiln_st_entry *find(const kiln_st_index *idx, const char *name) {
    for (int i = 0; i < idx->n; i++)
        if (!strcmp(idx->items[i].name, name)) return &idx->items[i];
    return NULL;
}

/* A device tensor of p's dtype and device from the file's entry e, which
 * must have p's shape. */
static kiln_status state_tensor(const char *path, const kiln_st_entry *e, const uint8_t *data, kiln_tensor *p,
                                kiln_tensor **out) {
    kiln_shape ps = kiln_shape_of(p);
    bool same = ps.ndim == e->shape.ndim && e->dtype == kiln_dtype_of(p);
    for (int d = 0; same && d < ps.ndim; d++) same = ps.d[d] == e->shape.d[d];
    if (!same) {
        char a[96], b[96];
        return KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model or optimizer",
                          "%s: '%s' is %s %s but its parameter is %s %s", path, e->name, kiln_dtype_name(e->dtype),
                          kiln_shape_format(e->shape.ndim, e->shape.d, a, sizeof a), kiln_dtype_name(kiln_dtype_of(p)),
                          kiln_shape_format(ps.ndim, ps.d, b, sizeof b));
    }
    kiln_tensor *host = kiln_from_data(e->shape, e->dtype, KILN_CPU, data + e->begin);
    if (!host) return kiln_error_last()->status;
    *out = kiln_to(host, kiln_get_device(p), e->dtype, 0);
    /* kiln_to may return host itself (a new reference either way). */
    kiln_tensor_drop(host);
    return *out ? KILN_OK : kiln_error_last()->status;
}

/* The optimizer's scalars, checked before anything is loaded. */
typedef struct opt_record {
    double lr;
    int64_t step_count;
    const kiln_st_entry *steps; /* "optimizer.steps": (n,) i64 */
} opt_record;

static kiln_status check_optimizer(const char *path, const kiln_st_index *idx, const uint8_t *data,
                                   const kiln_optimizer *o, opt_record *rec) {
    const char *kind = kiln_st_meta_get(idx, "kiln.optimizer");
    if (!kind)
        return KILN_RAISE(KILN_ERR_IO, "load it without an optimizer (weights only), or train from scratch",
                          "%s holds no optimizer state", path);
    if (strcmp(kind, kind_name(o->kind)))
        return KILN_RAISE(KILN_ERR_IO, "use the optimizer the checkpoint was trained with",
                          "%s holds %.40s state but the optimizer is %s", path, kind, kind_name(o->kind));
    int64_t n = 0;
    KILN_TRY(meta_i64(path, idx, "kiln.optimizer.params", &n));
    if (n != o->n)
        return KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model",
                          "%s: optimizer state for %lld parameters, the optimizer has %d", path, (long long)n, o->n);
    const range_ctx c = {path, false};
    KILN_TRY(meta_i64(path, idx, "kiln.optimizer.step_count", &rec->step_count));
    KILN_TRY(check_i64(&c, "kiln.optimizer.step_count", rec->step_count, 0, KILN_CHECKPOINT_MAX_COUNT, "2^53"));
    KILN_TRY(meta_f64(path, idx, "kiln.optimizer.lr", &rec->lr));
    KILN_TRY(check_f64(&c, "kiln.optimizer.lr", rec->lr, 0, INFINITY, "the finite numbers >= 0"));
    const kiln_st_entry *se = find(idx, OPT_PREFIX "steps");
    if (!se || se->dtype != KILN_I64 || se->shape.ndim != 1 || se->shape.d[0] != o->n)
        return KILN_RAISE(KILN_ERR_IO, CKPT_HINT_LOAD, "%s: tensor '" OPT_PREFIX "steps' is missing or not i64 (%d)",
                          path, o->n);
    /* Each parameter's update count: a negative one made Adam's bias
     * correction divide by a negative power (loss -nan). It is not held to
     * step_count: a step that failed part way has counted some updates. */
    for (int i = 0; i < o->n; i++) {
        int64_t k;
        memcpy(&k, data + se->begin + (size_t)i * sizeof k, sizeof k);
        if (k < 0 || k > KILN_CHECKPOINT_MAX_COUNT)
            return KILN_RAISE(KILN_ERR_IO, CKPT_HINT_LOAD,
                              "%s: tensor '" OPT_PREFIX "steps'[%d] (parameter %d's update count) is %lld, outside "
                              "0..%lld (2^53)",
                              path, i, i, (long long)k, (long long)KILN_CHECKPOINT_MAX_COUNT);
    }
    rec->steps = se;
    return KILN_OK;
}

static kiln_status load_optimizer(const char *path, const kiln_st_index *idx, const uint8_t *data, kiln_module *m,
                                  kiln_optimizer *o, const opt_record *rec) {
    kiln_named_tensor *named = NULL;
    int n_named = 0;
    KILN_TRY(kiln_module_named_parameters(m, &named, &n_named));
    /* Build every new state tensor first; replace the optimizer's only when
     * all are good, so a failed load leaves the optimizer as it was. */
    size_t slots = (size_t)(o->n ? o->n : 1) * KILN_OPTIM_STATES;
    kiln_tensor **fresh = KILN_CALLOC(slots, sizeof *fresh);
    kiln_status st = fresh ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    char pname[512], full[600];
    for (int i = 0; i < o->n && st == KILN_OK; i++) {
        param_name(named, n_named, o->params[i], i, pname, sizeof pname);
        for (int k = 0; k < KILN_OPTIM_STATES && st == KILN_OK; k++) {
            const char *slot = slot_name(o, k);
            if (!slot) continue;
            snprintf(full, sizeof full, OPT_PREFIX "%s.%s", pname, slot);
            const kiln_st_entry *e = find(idx, full);
            if (e) st = state_tensor(path, e, data, o->params[i], &fresh[(size_t)i * KILN_OPTIM_STATES + k]);
        }
    }
    /* Every optimizer.* entry must belong to a parameter of this optimizer. */
    for (int j = 0; j < idx->n && st == KILN_OK; j++) {
        const char *name = idx->items[j].name;
        if (strncmp(name, OPT_PREFIX, strlen(OPT_PREFIX)) || !strcmp(name, OPT_PREFIX "steps")) continue;
        bool known = false;
        for (int i = 0; i < o->n && !known; i++) {
            param_name(named, n_named, o->params[i], i, pname, sizeof pname);
            for (int k = 0; k < KILN_OPTIM_STATES && !known; k++) {
                if (!slot_name(o, k)) continue;
                snprintf(full, sizeof full, OPT_PREFIX "%s.%s", pname, slot_name(o, k));
                known = !strcmp(full, name);
            }
        }
        if (!known)
            st = KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model",
                            "%s: unexpected optimizer state '%s'", path, name);
    }
    if (st == KILN_OK) {
        for (int i = 0; i < o->n; i++)
            for (int k = 0; k < KILN_OPTIM_STATES; k++) {
                kiln_tensor_drop(o->state[k][i]);
                o->state[k][i] = fresh[(size_t)i * KILN_OPTIM_STATES + k];
                fresh[(size_t)i * KILN_OPTIM_STATES + k] = NULL;
            }
        memcpy(o->steps, data + rec->steps->begin, (size_t)o->n * sizeof *o->steps);
        o->step_count = rec->step_count;
        o->lr = rec->lr;
    }
    for (size_t i = 0; fresh && i < slots; i++) kiln_tensor_drop(fresh[i]);
    free(fresh);
    free(named);
    return st;
}

/* "CxHxW", each a whole positive number (the ranges are check_state's). */
static kiln_status meta_input(const char *path, const kiln_st_index *idx, kiln_train_state *s) {
    const char *v = kiln_st_meta_get(idx, "kiln.input");
    if (!v) return KILN_OK;
    int64_t *dims[3] = {&s->input_c, &s->input_h, &s->input_w};
    const char *p = v;
    for (int k = 0; k < 3; k++) {
        char *end = NULL;
        errno = 0;
        long long x = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
        if (!end || errno || (k < 2 ? *end != 'x' : *end != '\0') || x <= 0)
            return bad_value(path, "kiln.input", v, "CxHxW, three positive integers");
        *dims[k] = x;
        p = end + 1;
    }
    return KILN_OK;
}

/* Every value of the training state, parsed and range-checked; nothing
 * else is touched. s->model_spec and s->run_config are malloc'd. */
static kiln_status parse_state(const char *path, const kiln_st_index *idx, int version, kiln_train_state *s) {
    memset(s, 0, sizeof *s);
    s->format_version = version;
    KILN_TRY(meta_i64(path, idx, "kiln.epoch", &s->epoch));
    KILN_TRY(meta_i64(path, idx, "kiln.step", &s->step));
    KILN_TRY(meta_i64(path, idx, "kiln.batch_in_epoch", &s->batch_in_epoch));
    KILN_TRY(meta_i64(path, idx, "kiln.epochs_done", &s->epochs_done));
    KILN_TRY(meta_u64(path, idx, "kiln.data_seed", &s->data_seed));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.seed", &s->rng_seed));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.subsequence", &s->rng_subsequence));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.offset", &s->rng_offset));
    /* The generator advances by 4 draws per offset (restore_generator). */
    if (s->rng_offset > UINT64_MAX / 4)
        return KILN_RAISE(KILN_ERR_IO, CKPT_HINT_LOAD, "%s: metadata 'kiln.generator.offset' is %" PRIu64
                          ", outside 0..%" PRIu64, path, s->rng_offset, UINT64_MAX / 4);
    KILN_TRY(meta_bool(path, idx, "kiln.deterministic", &s->deterministic));
    const char *kern = kiln_st_meta_get(idx, "kiln.cpu_kernels");
    if (kern && strcmp(kern, "fast") && strcmp(kern, "reference")) return bad_value(path, "kiln.cpu_kernels", kern, "fast or reference");
    snprintf(s->cpu_kernels, sizeof s->cpu_kernels, "%s", kern ? kern : "");
    KILN_TRY(meta_input(path, idx, s));
    if (version >= 2) {
        KILN_TRY(meta_f64(path, idx, "kiln.epoch_loss_sum", &s->epoch_loss_sum));
        KILN_TRY(meta_f64(path, idx, "kiln.epoch_correct", &s->epoch_correct));
        KILN_TRY(meta_i64(path, idx, "kiln.epoch_images", &s->epoch_images));
        KILN_TRY(meta_i64(path, idx, "kiln.window_steps", &s->window_steps));
        KILN_TRY(meta_i64(path, idx, "kiln.window_images", &s->window_images));
        KILN_TRY(meta_f64(path, idx, "kiln.window_loss_sum", &s->window_loss_sum));
        KILN_TRY(meta_f64(path, idx, "kiln.window_correct", &s->window_correct));
    }
    const char *amp = kiln_st_meta_get(idx, "kiln.amp");
    if (amp) {
        if (strcmp(amp, "f16") && strcmp(amp, "bf16")) return bad_value(path, "kiln.amp", amp, "f16 or bf16");
        snprintf(s->amp, sizeof s->amp, "%s", amp);
        KILN_TRY(meta_f64(path, idx, "kiln.amp.scale", &s->amp_scale));
        KILN_TRY(meta_i64(path, idx, "kiln.amp.growth_tracker", &s->amp_growth_tracker));
    }
    KILN_TRY(check_state(&(range_ctx){path, false}, s));
    const char *spec = kiln_st_meta_get(idx, "kiln.model_spec"), *config = kiln_st_meta_get(idx, "kiln.run_config");
    if ((spec && !(s->model_spec = strdup(spec))) || (config && !(s->run_config = strdup(config))))
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "out of host memory copying %s's metadata", path);
    return KILN_OK;
}

/* The generator: the same seed (so the same per-device subsequence), then
 * advanced to the saved offset. */
static kiln_status restore_generator(const char *path, kiln_module *m, const kiln_train_state *s) {
    kiln_device dev = module_device(m);
    kiln_device_rng_seed_all(s->rng_seed);
    kiln_rng now = kiln_device_rng_reserve(dev, 0);
    if (now.subsequence != s->rng_subsequence)
        return KILN_RAISE(KILN_ERR_IO, "resume on the device type the checkpoint was written on",
                          "%s: its generator state belongs to another device", path);
    kiln_device_rng_reserve(dev, 4 * s->rng_offset);
    return KILN_OK;
}

static void state_free(kiln_train_state *s) {
    free(s->model_spec);
    free(s->run_config);
    s->model_spec = s->run_config = NULL;
}

kiln_status kiln_checkpoint_load(const char *path, kiln_module *m, kiln_optimizer *opt, kiln_train_state *state) {
    if (!path || !m)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_checkpoint_load: NULL path or module");
    if (state) memset(state, 0, sizeof *state);
    uint8_t *bytes;
    const uint8_t *data;
    kiln_st_index idx;
    KILN_TRY(kiln_st_read(path, &bytes, &data, &idx));
    kiln_api_enter();
    int version = 0;
    kiln_status st = format_version(path, &idx, &version);
    if (st == KILN_OK && (opt || state) && !version)
        st = KILN_RAISE(KILN_ERR_IO, "load it with kiln_safetensors_load (weights only)",
                        "%s is a weights-only safetensors file, not a Kiln training checkpoint", path);
    /* Every value is checked before the module, the optimizer or the
     * generator changes. */
    opt_record rec = {0};
    if (st == KILN_OK && state) st = parse_state(path, &idx, version, state);
    if (st == KILN_OK && opt) st = check_optimizer(path, &idx, data, opt, &rec);
    if (st == KILN_OK) st = kiln_st_load_module(path, &idx, data, m, OPT_PREFIX);
    if (st == KILN_OK && opt) st = load_optimizer(path, &idx, data, m, opt, &rec);
    if (st == KILN_OK && state) st = restore_generator(path, m, state);
    if (st != KILN_OK && state) state_free(state);
    kiln_api_leave();
    kiln_st_index_free(&idx);
    free(bytes);
    return st;
}

kiln_status kiln_checkpoint_read_meta(const char *path, const char *key, char **value) {
    if (!path || !key || !value)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_checkpoint_read_meta: NULL argument");
    *value = NULL;
    kiln_safetensors *f = NULL; /* reads the header only, not the tensors */
    KILN_TRY(kiln_safetensors_open(path, &f));
    const char *v = kiln_safetensors_metadata(f, key);
    kiln_status st = KILN_OK;
    if (v && !(*value = strdup(v)))
        st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "out of host memory copying %s's metadata '%s'", path, key);
    kiln_safetensors_close(f);
    return st;
}
