/* Training checkpoints (kiln_checkpoint_save / _load): a safetensors file
 * holding the module's state dict, the optimizer's state tensors and the
 * training position in __metadata__ (see kiln/io.h and docs/training.md).
 *
 * The optimizer's record is read through optim/optim_internal.h: the
 * checkpoint is the one place outside src/optim that needs every state
 * slot and the per-parameter step counts. */
#include <errno.h>
#include <inttypes.h>
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

#define CKPT_FORMAT "1"
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
    char *meta_text[64]; /* owned key/value strings */
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
    ok = add_meta(w, "kiln.epoch", "%" PRId64, s->epoch) && add_meta(w, "kiln.step", "%" PRId64, s->step) &&
         add_meta(w, "kiln.batch_in_epoch", "%" PRId64, s->batch_in_epoch) &&
         add_meta(w, "kiln.epochs_done", "%" PRId64, s->epochs_done) &&
         add_meta(w, "kiln.data_seed", "%" PRIu64, s->data_seed);
    if (ok && s->input_c > 0)
        ok = add_meta(w, "kiln.input", "%" PRId64 "x%" PRId64 "x%" PRId64, s->input_c, s->input_h, s->input_w);
    if (ok && s->model_spec) ok = add_meta_str(w, "kiln.model_spec", s->model_spec);
    if (ok && s->amp[0])
        ok = add_meta_str(w, "kiln.amp", s->amp) && add_meta(w, "kiln.amp.scale", "%.17g", s->amp_scale) &&
             add_meta(w, "kiln.amp.growth_tracker", "%" PRId64, s->amp_growth_tracker);
    return ok;
}

kiln_status kiln_checkpoint_save(const char *path, kiln_module *m, kiln_optimizer *opt,
                                 const kiln_train_state *state) {
    if (!path || !m)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_checkpoint_save: NULL path or module");
    kiln_api_enter();
    ckpt_writer w = {0};
    kiln_tensor *steps = NULL;
    kiln_named_tensor *sd = NULL;
    int n_sd = 0;
    kiln_status st = kiln_module_state_dict(m, &sd, &n_sd);
    bool ok = st == KILN_OK && add_meta_str(&w, "kiln.checkpoint", CKPT_FORMAT);
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

static kiln_status meta_i64(const char *path, const kiln_st_index *idx, const char *key, int64_t *out) {
    const char *v = kiln_st_meta_get(idx, key);
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno)
        return KILN_RAISE(KILN_ERR_IO, "the checkpoint is damaged or was not written by kiln_checkpoint_save",
                          "%s: metadata '%s' is %s%s%s, expected an integer", path, key, v ? "'" : "missing",
                          v ? v : "", v ? "'" : "");
    *out = x;
    return KILN_OK;
}

static kiln_status meta_u64(const char *path, const kiln_st_index *idx, const char *key, uint64_t *out) {
    const char *v = kiln_st_meta_get(idx, key);
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || *v == '-')
        return KILN_RAISE(KILN_ERR_IO, "the checkpoint is damaged or was not written by kiln_checkpoint_save",
                          "%s: metadata '%s' is %s%s%s, expected an unsigned integer", path, key,
                          v ? "'" : "missing", v ? v : "", v ? "'" : "");
    *out = x;
    return KILN_OK;
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

static kiln_status load_optimizer(const char *path, const kiln_st_index *idx, const uint8_t *data, kiln_module *m,
                                  kiln_optimizer *o) {
    const char *kind = kiln_st_meta_get(idx, "kiln.optimizer");
    if (!kind)
        return KILN_RAISE(KILN_ERR_IO, "load it without an optimizer (weights only), or train from scratch",
                          "%s holds no optimizer state", path);
    if (strcmp(kind, kind_name(o->kind)))
        return KILN_RAISE(KILN_ERR_IO, "use the optimizer the checkpoint was trained with",
                          "%s holds %s state but the optimizer is %s", path, kind, kind_name(o->kind));
    int64_t n = 0, step_count = 0;
    KILN_TRY(meta_i64(path, idx, "kiln.optimizer.params", &n));
    KILN_TRY(meta_i64(path, idx, "kiln.optimizer.step_count", &step_count));
    if (n != o->n)
        return KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model",
                          "%s: optimizer state for %lld parameters, the optimizer has %d", path, (long long)n, o->n);
    const char *lr_text = kiln_st_meta_get(idx, "kiln.optimizer.lr");
    char *end = NULL;
    double lr = lr_text ? strtod(lr_text, &end) : 0;
    if (!lr_text || !*lr_text || *end || !(lr >= 0))
        return KILN_RAISE(KILN_ERR_IO, NULL, "%s: metadata 'kiln.optimizer.lr' is missing or not a number", path);
    const kiln_st_entry *se = find(idx, OPT_PREFIX "steps");
    if (!se || se->dtype != KILN_I64 || se->shape.ndim != 1 || se->shape.d[0] != o->n)
        return KILN_RAISE(KILN_ERR_IO, NULL, "%s: '" OPT_PREFIX "steps' is missing or not i64 (%d)", path, o->n);

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
        memcpy(o->steps, data + se->begin, (size_t)o->n * sizeof *o->steps);
        o->step_count = step_count;
        o->lr = lr;
    }
    for (size_t i = 0; fresh && i < slots; i++) kiln_tensor_drop(fresh[i]);
    free(fresh);
    free(named);
    return st;
}

static kiln_status load_state(const char *path, const kiln_st_index *idx, kiln_module *m, kiln_train_state *s) {
    memset(s, 0, sizeof *s);
    KILN_TRY(meta_i64(path, idx, "kiln.epoch", &s->epoch));
    KILN_TRY(meta_i64(path, idx, "kiln.step", &s->step));
    KILN_TRY(meta_i64(path, idx, "kiln.batch_in_epoch", &s->batch_in_epoch));
    KILN_TRY(meta_i64(path, idx, "kiln.epochs_done", &s->epochs_done));
    KILN_TRY(meta_u64(path, idx, "kiln.data_seed", &s->data_seed));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.seed", &s->rng_seed));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.subsequence", &s->rng_subsequence));
    KILN_TRY(meta_u64(path, idx, "kiln.generator.offset", &s->rng_offset));
    const char *det = kiln_st_meta_get(idx, "kiln.deterministic");
    s->deterministic = det && !strcmp(det, "true");
    const char *kern = kiln_st_meta_get(idx, "kiln.cpu_kernels");
    snprintf(s->cpu_kernels, sizeof s->cpu_kernels, "%s", kern ? kern : "");
    const char *input = kiln_st_meta_get(idx, "kiln.input");
    long long c = 0, h = 0, w = 0;
    if (input && sscanf(input, "%lldx%lldx%lld", &c, &h, &w) == 3) s->input_c = c, s->input_h = h, s->input_w = w;
    const char *spec = kiln_st_meta_get(idx, "kiln.model_spec");
    const char *amp = kiln_st_meta_get(idx, "kiln.amp");
    if (amp) {
        snprintf(s->amp, sizeof s->amp, "%s", amp);
        const char *scale = kiln_st_meta_get(idx, "kiln.amp.scale");
        char *end = NULL;
        s->amp_scale = scale ? strtod(scale, &end) : 0;
        if (!scale || *end || !(s->amp_scale > 0))
            return KILN_RAISE(KILN_ERR_IO, NULL, "%s: metadata 'kiln.amp.scale' is missing or not a positive number",
                              path);
        KILN_TRY(meta_i64(path, idx, "kiln.amp.growth_tracker", &s->amp_growth_tracker));
    }
    if (spec && !(s->model_spec = strdup(spec))) return KILN_ERR_OUT_OF_MEMORY;
    /* The generator: the same seed (so the same per-device subsequence),
     * then advanced to the saved offset. */
    kiln_device dev = module_device(m);
    kiln_device_rng_seed_all(s->rng_seed);
    kiln_rng now = kiln_device_rng_reserve(dev, 0);
    if (now.subsequence != s->rng_subsequence) {
        free(s->model_spec);
        s->model_spec = NULL;
        return KILN_RAISE(KILN_ERR_IO, "resume on the device type the checkpoint was written on",
                          "%s: its generator state belongs to another device", path);
    }
    kiln_device_rng_reserve(dev, 4 * s->rng_offset);
    return KILN_OK;
}

kiln_status kiln_checkpoint_load(const char *path, kiln_module *m, kiln_optimizer *opt, kiln_train_state *state) {
    if (!path || !m)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_checkpoint_load: NULL path or module");
    uint8_t *bytes;
    const uint8_t *data;
    kiln_st_index idx;
    KILN_TRY(kiln_st_read(path, &bytes, &data, &idx));
    kiln_api_enter();
    kiln_status st = KILN_OK;
    if ((opt || state) && !kiln_st_meta_get(&idx, "kiln.checkpoint"))
        st = KILN_RAISE(KILN_ERR_IO, "load it with kiln_safetensors_load (weights only)",
                        "%s is a weights-only safetensors file, not a Kiln training checkpoint", path);
    if (st == KILN_OK) st = kiln_st_load_module(path, &idx, data, m, OPT_PREFIX);
    if (st == KILN_OK && opt) st = load_optimizer(path, &idx, data, m, opt);
    if (st == KILN_OK && state) st = load_state(path, &idx, m, state);
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
