/* Modules: the record, its named slots (parameters, buffers, children),
 * modes, forward, the state dict and moves between devices and dtypes.
 *
 * Every tensor a module holds is its own reference, dropped with
 * kiln_tensor_drop so that scopes are never consulted. Public functions
 * that call tensor-returning functions bracket their body with
 * kiln_api_enter / kiln_api_leave so nothing lands in the user's scope. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log_internal.h"
#include "nn/module_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define NAME_MAX_LEN 512

kiln_module *kiln_module_new(const char *kind, kiln_layer_forward forward) {
    kiln_module *m = KILN_CALLOC(1, sizeof *m);
    if (!m) return NULL;
    m->kind = kind;
    m->training = true;
    m->forward = forward;
    return m;
}

static void slots_free_tensors(kiln_module_slots *s) {
    for (int i = 0; i < s->n; i++) {
        kiln_tensor_drop(s->items[i].u.tensor);
        free(s->items[i].name);
    }
    free(s->items);
}

void kiln_module_free(kiln_module *m) {
    if (!m) return;
    slots_free_tensors(&m->params);
    slots_free_tensors(&m->buffers);
    for (int i = 0; i < m->children.n; i++) {
        kiln_module_free(m->children.items[i].u.child);
        free(m->children.items[i].name);
    }
    free(m->children.items);
    free(m->names.refs);
    if (m->free_state) m->free_state(m->state);
    if (m->kind_owned) free((char *)m->kind);
    free(m);
}

const char *kiln_module_kind(const kiln_module *m) { return m ? m->kind : NULL; }

/* ---- Names ---------------------------------------------------------------------------------
 * One hash index over the parameters', buffers' and children's names
 * (module_internal.h, kiln_module_names): adding a member and finding one
 * by name are O(1) expected. There is no removal: a module's members are
 * only ever added, or replaced in place under the same name. */

/* A name's kind, one bit each so that a lookup can accept several. */
enum { NAME_PARAM = 1, NAME_BUFFER = 2, NAME_CHILD = 4 };

/* FNV-1a over len bytes. Names come from the program or from a spec's
 * line numbers, not from an adversary who could pick colliding ones. */
static uint32_t name_hash(const char *s, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static const kiln_module_slots *slots_of(const kiln_module *m, int kind) {
    return kind == NAME_PARAM ? &m->params : kind == NAME_BUFFER ? &m->buffers : &m->children;
}

/* The bucket holding `name` (len bytes, no NUL needed), or the empty one
 * where it would go; NULL when the index is empty. Adds the buckets looked
 * at to *probes. The table is at most half full, so an empty bucket ends
 * every walk. */
static kiln_module_name_ref *names_probe(const kiln_module *m, const char *name, size_t len, uint32_t h,
                                         int64_t *probes) {
    const kiln_module_names *ix = &m->names;
    if (!ix->cap) return NULL;
    size_t mask = (size_t)ix->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        kiln_module_name_ref *r = &ix->refs[i];
        ++*probes;
        if (!r->kind) return r;
        if (r->hash != h) continue;
        const char *other = slots_of(m, r->kind)->items[r->index].name;
        if (strncmp(other, name, len) == 0 && other[len] == '\0') return r;
    }
}

/* The member `name` (len bytes) if its kind is one of `kinds` (NAME_*
 * bits), or NULL. */
static kiln_module_slot *name_find(const kiln_module *m, int kinds, const char *name, size_t len) {
    int64_t probes = 0;
    kiln_module_name_ref *r = names_probe(m, name, len, name_hash(name, len), &probes);
    if (!r || !(r->kind & kinds)) return NULL;
    return &slots_of(m, r->kind)->items[r->index];
}

static kiln_module_slot *slot_find(const kiln_module *m, int kinds, const char *name) {
    return name_find(m, kinds, name, strlen(name));
}

/* Room in the index for one more name, so that adding it cannot fail
 * after the slot is pushed. */
static kiln_status names_reserve(kiln_module *m) {
    kiln_module_names *ix = &m->names;
    if ((int64_t)(ix->n + 1) * 2 <= ix->cap) return KILN_OK;
    if (ix->cap > INT32_MAX / 4)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "split the module into nested ones",
                          "%s has %d members, the most one module may hold", m->kind, ix->n);
    int cap = ix->cap ? 2 * ix->cap : 8;
    kiln_module_name_ref *refs = KILN_CALLOC((size_t)cap, sizeof *refs);
    if (!refs) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < ix->cap; i++) {
        kiln_module_name_ref r = ix->refs[i];
        if (!r.kind) continue;
        size_t j = r.hash & (size_t)(cap - 1);
        while (refs[j].kind) j = (j + 1) & (size_t)(cap - 1);
        refs[j] = r;
    }
    free(ix->refs);
    ix->refs = refs;
    ix->cap = cap;
    return KILN_OK;
}

/* Names are unique across a module's parameters, buffers and children, as
 * in PyTorch, since they share the state dict's namespace. On success the
 * index has room for the name (names_reserve). */
static kiln_status check_new_name(kiln_module *m, const char *fn, const char *name) {
    if (!m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: module is NULL", fn);
    if (!name || !*name || strchr(name, '.') || strlen(name) >= NAME_MAX_LEN / 2)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use a short name without '.'",
                          "%s: bad name '%s' in %s", fn, name ? name : "(null)", m->kind);
    size_t len = strlen(name);
    kiln_module_name_ref *r = names_probe(m, name, len, name_hash(name, len), &m->names.probes);
    if (r && r->kind)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pick a name the module does not use yet",
                          "%s: %s already has a member named '%s'", fn, m->kind, name);
    return names_reserve(m);
}

/* Index the slot just pushed to the list of `kind` (room reserved). */
static void names_add(kiln_module *m, int kind) {
    const kiln_module_slots *s = slots_of(m, kind);
    const char *name = s->items[s->n - 1].name;
    size_t len = strlen(name);
    uint32_t h = name_hash(name, len);
    kiln_module_name_ref *r = names_probe(m, name, len, h, &m->names.probes);
    KILN_ASSERT(r && !r->kind);
    *r = (kiln_module_name_ref){.hash = h, .kind = (uint8_t)kind, .index = s->n - 1};
    m->names.n++;
}

int64_t kiln_module_name_probes(const kiln_module *m) { return m ? m->names.probes : 0; }

static kiln_status slot_push(kiln_module_slots *s, const char *name, void *value, bool is_child) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        kiln_module_slot *items = KILN_REALLOC(s->items, (size_t)cap * sizeof *items);
        if (!items) return KILN_ERR_OUT_OF_MEMORY;
        s->items = items;
        s->cap = cap;
    }
    char *copy = KILN_MALLOC(strlen(name) + 1);
    if (!copy) return KILN_ERR_OUT_OF_MEMORY;
    strcpy(copy, name);
    kiln_module_slot *slot = &s->items[s->n++];
    slot->name = copy;
    if (is_child)
        slot->u.child = value;
    else
        slot->u.tensor = value;
    return KILN_OK;
}

kiln_status kiln_module_add_child(kiln_module *m, const char *name, kiln_module *child) {
    kiln_status st = check_new_name(m, "kiln_module_add_child", name);
    if (!st && !child)
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "check the constructor's error",
                        "kiln_module_add_child: child '%s' is NULL", name);
    if (!st) st = slot_push(&m->children, name, child, true);
    if (!st) names_add(m, NAME_CHILD);
    if (st) kiln_module_free(child);
    return st;
}

static kiln_status add_tensor(kiln_module *m, const char *fn, const char *name, kiln_tensor *t, bool param) {
    KILN_TRY(check_new_name(m, fn, name));
    KILN_TRY(kiln_tensor_check(t, fn));
    if (param && !kiln_requires_grad(t)) KILN_TRY(kiln_set_requires_grad(t, true));
    kiln_tensor *own = kiln_retain(t);
    kiln_status st = slot_push(param ? &m->params : &m->buffers, name, own, false);
    if (st) kiln_tensor_drop(own);
    else names_add(m, param ? NAME_PARAM : NAME_BUFFER);
    return st;
}

kiln_status kiln_module_add_parameter(kiln_module *m, const char *name, kiln_tensor *t) {
    return add_tensor(m, "kiln_module_add_parameter", name, t, true);
}

kiln_status kiln_module_add_buffer(kiln_module *m, const char *name, kiln_tensor *t) {
    return add_tensor(m, "kiln_module_add_buffer", name, t, false);
}

kiln_tensor *kiln_module_own_tensor(const kiln_module *m, const char *name) {
    kiln_module_slot *s = slot_find(m, NAME_PARAM | NAME_BUFFER, name);
    return s ? s->u.tensor : NULL;
}

kiln_module *kiln_module_child(kiln_module *m, const char *name) {
    if (!m || !name) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_child: NULL module or name");
        return NULL;
    }
    kiln_module_slot *s = slot_find(m, NAME_CHILD, name);
    if (!s) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "list the children with kiln_module_child_at",
                   "kiln_module_child: %s has no child named '%s'", m->kind, name);
        return NULL;
    }
    return s->u.child;
}

int kiln_module_num_children(const kiln_module *m) { return m ? m->children.n : 0; }

kiln_module *kiln_module_child_at(kiln_module *m, int i, const char **name) {
    if (!m || i < 0 || i >= m->children.n) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_child_at: index %d out of range [0, %d)", i,
                   m ? m->children.n : 0);
        return NULL;
    }
    if (name) *name = m->children.items[i].name;
    return m->children.items[i].u.child;
}

/* ---- Forward and modes ------------------------------------------------------------------ */

/* A forward that failed on a device mismatch, named the user's way: the
 * first parameter or buffer (by its state-dict name) that is not on the
 * input's device, and kiln_module_to as the fix. Keeps the error as it is
 * when every tensor of m is on x's device (the mismatch is elsewhere). */
static void name_misplaced_state(kiln_module *m, kiln_tensor *x) {
    const kiln_error *e = kiln_error_last();
    if (e->status != KILN_ERR_INVALID_ARGUMENT || !strstr(e->message, " is on ")) return;
    kiln_named_tensor *items = NULL;
    int n = 0;
    kiln_device xd = kiln_get_device(x);
    char original[sizeof e->message];
    snprintf(original, sizeof original, "%s", e->message);
    kiln_error_clear();
    /* A model that spans devices by design (placed in stages, pipelined,
     * DataParallel): the input's device says nothing; a layer is off its
     * stage's device. */
    if (m->spans_devices) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                   "every layer of a stage must be on the stage's device: check the placement "
                   "(kiln_nn_sequential_place, kiln_nn_pipeline) and any kiln_module_to since",
                   "kiln_module_forward: the %s spans devices and one of its layers is on another device than its "
                   "input (%s)",
                   m->kind, original);
        return;
    }
    if (kiln_module_state_dict(m, &items, &n) != KILN_OK) {
        kiln_error_clear();
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "move them to one device with kiln_to", "%s", original);
        return;
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (!kiln_device_equal(kiln_get_device(items[i].tensor), xd)) bad = i;
    char a[32], b[32], hint[160];
    if (bad < 0) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "move them to one device with kiln_to", "%s", original);
    } else {
        kiln_device_str(xd, a, sizeof a);
        snprintf(hint, sizeof hint, "move the model with kiln_module_to(model, %s) before the forward", a);
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "kiln_module_forward: the input is on %s but %s '%s' of the %s is on %s (%s)",
                   a, kiln_requires_grad(items[bad].tensor) ? "parameter" : "buffer", items[bad].name, m->kind,
                   kiln_device_str(kiln_get_device(items[bad].tensor), b, sizeof b), original);
    }
    free(items);
}

static _Thread_local int forward_depth;

kiln_tensor *kiln_module_forward(kiln_module *m, kiln_tensor *x) {
    kiln_api_enter();
    kiln_tensor *y = NULL;
    if (!m)
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "check the constructor's error", "kiln_module_forward: module is NULL");
    else if (kiln_tensor_check(x, "kiln_module_forward") == KILN_OK) {
        forward_depth++;
        y = m->forward ? m->forward(m, x) : m->user_forward(m, x, m->user);
        forward_depth--;
        if (!y && forward_depth == 0) name_misplaced_state(m, x);
    }
    return kiln_api_return(y);
}

void kiln_module_train(kiln_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->children.n; i++) kiln_module_train(m->children.items[i].u.child, training);
}

bool kiln_module_is_training(const kiln_module *m) { return m && m->training; }

/* ---- Listing ------------------------------------------------------------------------------- */

typedef struct entry_list {
    int n, cap;
    size_t name_bytes;
    char **names;
    kiln_tensor **tensors;
} entry_list;

static void entries_free(entry_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->tensors);
}

static kiln_status entries_push(entry_list *l, const char *prefix, const char *name, kiln_tensor *t) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **names = KILN_REALLOC(l->names, (size_t)cap * sizeof *names);
        if (!names) return KILN_ERR_OUT_OF_MEMORY;
        l->names = names;
        kiln_tensor **tensors = KILN_REALLOC(l->tensors, (size_t)cap * sizeof *tensors);
        if (!tensors) return KILN_ERR_OUT_OF_MEMORY;
        l->tensors = tensors;
        l->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(name) + 1;
    char *full = KILN_MALLOC(len);
    if (!full) return KILN_ERR_OUT_OF_MEMORY;
    snprintf(full, len, "%s%s", prefix, name);
    l->names[l->n] = full;
    l->tensors[l->n++] = t;
    l->name_bytes += len;
    return KILN_OK;
}

static kiln_status walk(kiln_module *m, const char *prefix, bool params, bool buffers, entry_list *out) {
    for (int i = 0; params && i < m->params.n; i++)
        KILN_TRY(entries_push(out, prefix, m->params.items[i].name, m->params.items[i].u.tensor));
    for (int i = 0; buffers && i < m->buffers.n; i++)
        KILN_TRY(entries_push(out, prefix, m->buffers.items[i].name, m->buffers.items[i].u.tensor));
    for (int i = 0; i < m->children.n; i++) {
        char sub[NAME_MAX_LEN];
        int len = snprintf(sub, sizeof sub, "%s%s.", prefix, m->children.items[i].name);
        if (len < 0 || (size_t)len >= sizeof sub)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use shorter names or a shallower tree",
                              "module listing: the name %s%s... is longer than %d characters", prefix,
                              m->children.items[i].name, NAME_MAX_LEN);
        KILN_TRY(walk(m->children.items[i].u.child, sub, params, buffers, out));
    }
    return KILN_OK;
}

static kiln_status list_named(kiln_module *m, const char *fn, bool params, bool buffers,
                              kiln_named_tensor **items, int *n) {
    if (!m || !items || !n) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: NULL argument", fn);
    *items = NULL;
    *n = 0;
    entry_list l = {0};
    kiln_status st = walk(m, "", params, buffers, &l);
    kiln_named_tensor *block = NULL;
    if (!st) {
        size_t head = (size_t)(l.n ? l.n : 1) * sizeof *block;
        block = KILN_MALLOC(head + l.name_bytes);
        if (!block) st = KILN_ERR_OUT_OF_MEMORY;
    }
    if (!st) {
        char *names = (char *)block + (size_t)(l.n ? l.n : 1) * sizeof *block;
        for (int i = 0; i < l.n; i++) {
            size_t len = strlen(l.names[i]) + 1;
            memcpy(names, l.names[i], len);
            block[i].name = names;
            block[i].tensor = l.tensors[i];
            names += len;
        }
        *items = block;
        *n = l.n;
    }
    entries_free(&l);
    return st;
}

kiln_status kiln_module_named_parameters(kiln_module *m, kiln_named_tensor **items, int *n) {
    return list_named(m, "kiln_module_named_parameters", true, false, items, n);
}

kiln_status kiln_module_named_buffers(kiln_module *m, kiln_named_tensor **items, int *n) {
    return list_named(m, "kiln_module_named_buffers", false, true, items, n);
}

kiln_status kiln_module_state_dict(kiln_module *m, kiln_named_tensor **items, int *n) {
    return list_named(m, "kiln_module_state_dict", true, true, items, n);
}

kiln_status kiln_module_parameters(kiln_module *m, kiln_tensor ***params, int *n) {
    if (!params || !n) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_parameters: NULL argument");
    *params = NULL;
    *n = 0;
    entry_list l = {0};
    kiln_status st = m ? walk(m, "", true, false, &l)
                       : KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_parameters: module is NULL");
    if (!st) {
        *params = KILN_MALLOC((size_t)(l.n ? l.n : 1) * sizeof **params);
        if (!*params) st = KILN_ERR_OUT_OF_MEMORY;
    }
    if (!st) {
        memcpy(*params, l.tensors, (size_t)l.n * sizeof **params);
        *n = l.n;
    }
    entries_free(&l);
    return st;
}

int64_t kiln_module_num_parameters(kiln_module *m) {
    if (!m) return 0;
    int64_t total = 0;
    for (int i = 0; i < m->params.n; i++) total += kiln_numel(m->params.items[i].u.tensor);
    for (int i = 0; i < m->children.n; i++) total += kiln_module_num_parameters(m->children.items[i].u.child);
    return total;
}

/* ---- State dict by key -------------------------------------------------------------------- */

/* The slot holding `key` ("a.b.weight"), or NULL with an error naming it. */
static kiln_module_slot *find_key(kiln_module *m, const char *fn, const char *key) {
    if (!m || !key) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: NULL module or key", fn);
        return NULL;
    }
    const char *part = key;
    for (const char *dot; (dot = strchr(part, '.')) != NULL; part = dot + 1) {
        kiln_module_slot *child = name_find(m, NAME_CHILD, part, (size_t)(dot - part));
        if (!child) goto missing;
        m = child->u.child;
    }
    kiln_module_slot *s = slot_find(m, NAME_PARAM | NAME_BUFFER, part);
    if (s) return s;
missing:
    KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "list the keys with kiln_module_state_dict",
               "%s: no parameter or buffer named '%s'", fn, key);
    return NULL;
}

kiln_tensor *kiln_module_state_get(kiln_module *m, const char *key) {
    kiln_api_enter();
    kiln_module_slot *s = find_key(m, "kiln_module_state_get", key);
    return kiln_api_return(s ? kiln_retain(s->u.tensor) : NULL);
}

static kiln_status state_set_body(kiln_module *m, const char *key, kiln_tensor *value) {
    kiln_module_slot *s = find_key(m, "kiln_module_state_set", key);
    if (!s) return kiln_error_last()->status;
    KILN_TRY(kiln_tensor_check(value, "kiln_module_state_set"));
    kiln_tensor *dst = s->u.tensor;
    kiln_shape a = kiln_shape_of(dst), b = kiln_shape_of(value);
    bool same = a.ndim == b.ndim;
    for (int i = 0; same && i < a.ndim; i++) same = a.d[i] == b.d[i];
    if (!same) {
        char sa[128], sb[128];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "reshape the value or check the checkpoint's model",
                          "kiln_module_state_set: size mismatch for '%s': the module has %s, the value is %s", key,
                          kiln_shape_format(a.ndim, a.d, sa, sizeof sa), kiln_shape_format(b.ndim, b.d, sb, sizeof sb));
    }
    kiln_dtype dd = kiln_dtype_of(dst), vd = kiln_dtype_of(value);
    if (kiln_dtype_is_floating(dd) != kiln_dtype_is_floating(vd))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "cast the value with kiln_to first if this is intended",
                          "kiln_module_state_set: dtype mismatch for '%s': the module has %s, the value is %s", key,
                          kiln_dtype_name(dd), kiln_dtype_name(vd));
    kiln_no_grad_begin();
    kiln_status st = kiln_copy_(dst, value, 0);
    kiln_grad_mode_end();
    return st;
}

kiln_status kiln_module_state_set(kiln_module *m, const char *key, kiln_tensor *value) {
    kiln_api_enter();
    kiln_status st = state_set_body(m, key, value);
    kiln_api_leave();
    return st;
}

void kiln_incompatible_keys_free(kiln_incompatible_keys *keys) {
    if (!keys) return;
    for (int i = 0; i < keys->n_missing; i++) free(keys->missing_keys[i]);
    for (int i = 0; i < keys->n_unexpected; i++) free(keys->unexpected_keys[i]);
    free(keys->missing_keys);
    free(keys->unexpected_keys);
    *keys = (kiln_incompatible_keys){0};
}

static kiln_status key_list_add(char ***list, int *n, const char *name) {
    char **grown = KILN_REALLOC(*list, sizeof *grown * (size_t)(*n + 1));
    if (!grown) return kiln_error_last()->status;
    *list = grown;
    size_t len = strlen(name) + 1;
    char *copy = KILN_MALLOC(len);
    if (!copy) return kiln_error_last()->status;
    memcpy(copy, name, len);
    grown[(*n)++] = copy;
    return KILN_OK;
}

/* The names of a state dict, hashed, so that comparing two of n keys
 * each is O(n) (a scan per key made loading a 10^5-layer model's state
 * dict take hours). Buckets hold an index into items, or -1. */
typedef struct key_set {
    const kiln_named_tensor *items;
    size_t mask;
    int *bucket;
} key_set;

static kiln_status key_set_init(key_set *ks, const kiln_named_tensor *items, int n) {
    size_t cap = 8;
    while (cap < 2 * (size_t)n) cap *= 2;
    *ks = (key_set){.items = items, .mask = cap - 1, .bucket = KILN_MALLOC(cap * sizeof(int))};
    if (!ks->bucket) return KILN_ERR_OUT_OF_MEMORY;
    memset(ks->bucket, 0xff, cap * sizeof(int)); /* -1: empty */
    for (int i = 0; i < n; i++) {
        size_t j = name_hash(items[i].name, strlen(items[i].name)) & ks->mask;
        while (ks->bucket[j] >= 0) j = (j + 1) & ks->mask;
        ks->bucket[j] = i;
    }
    return KILN_OK;
}

static bool key_set_has(const key_set *ks, const char *name) {
    for (size_t j = name_hash(name, strlen(name)) & ks->mask; ks->bucket[j] >= 0; j = (j + 1) & ks->mask)
        if (strcmp(ks->items[ks->bucket[j]].name, name) == 0) return true;
    return false;
}

/* "'a', 'b', 'c'" into buf, as many names as fit in cap with room for
 * "... and N more". */
static void format_keys(char *buf, size_t cap, char *const *keys, int n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t need = strlen(keys[i]) + 4;
        if (len + need + 24 > cap) {
            snprintf(buf + len, cap - len, "%s... and %d more", i ? ", " : "", n - i);
            return;
        }
        len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", i ? ", " : "", keys[i]);
    }
}

/* "2 missing keys ('a', 'b') and 1 unexpected key ('c')" into buf; a
 * list that is empty is left out. */
static void format_incompatible(char *buf, size_t cap, const kiln_incompatible_keys *k) {
    char missing[360], unexpected[360];
    format_keys(missing, sizeof missing, k->missing_keys, k->n_missing);
    format_keys(unexpected, sizeof unexpected, k->unexpected_keys, k->n_unexpected);
    int len = 0;
    if (k->n_missing)
        len = snprintf(buf, cap, "%d missing key%s (%s)", k->n_missing, k->n_missing == 1 ? "" : "s", missing);
    if (k->n_unexpected)
        snprintf(buf + len, cap - (size_t)len, "%s%d unexpected key%s (%s)", len ? " and " : "", k->n_unexpected,
                 k->n_unexpected == 1 ? "" : "s", unexpected);
    else if (!k->n_missing)
        snprintf(buf, cap, "no keys on either side");
}

/* The module's keys the state dict lacks, and its keys the module lacks. */
static kiln_status compare_keys(const key_set *own, int n_own, const key_set *items, int n,
                                kiln_incompatible_keys *k) {
    for (int i = 0; i < n_own; i++) {
        const char *name = own->items[i].name;
        if (!key_set_has(items, name)) KILN_TRY(key_list_add(&k->missing_keys, &k->n_missing, name));
    }
    for (int j = 0; j < n; j++) {
        const char *name = items->items[j].name;
        if (!key_set_has(own, name)) KILN_TRY(key_list_add(&k->unexpected_keys, &k->n_unexpected, name));
    }
    return KILN_OK;
}

static kiln_status load_state_dict_body(kiln_module *m, const kiln_named_tensor *items, int n, bool strict,
                                        kiln_incompatible_keys *k) {
    if (!m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_load_state_dict: module is NULL");
    if (n < 0 || (n > 0 && !items))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the array and its length",
                          "kiln_module_load_state_dict: %d items (items %s)", n, items ? "given" : "NULL");
    for (int j = 0; j < n; j++)
        if (!items[j].name)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give every item a name",
                              "kiln_module_load_state_dict: item %d has no name", j);
    kiln_named_tensor *own = NULL;
    int n_own = 0;
    KILN_TRY(kiln_module_state_dict(m, &own, &n_own));
    key_set own_set = {0}, item_set = {0};
    kiln_status st = key_set_init(&own_set, own, n_own);
    if (!st) st = key_set_init(&item_set, items, n);
    if (!st) st = compare_keys(&own_set, n_own, &item_set, n, k);
    char keys[800];
    if (!st && strict && (k->n_missing || k->n_unexpected)) {
        format_incompatible(keys, sizeof keys, k);
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                        "pass strict=false to load the keys that match (the lists come back in "
                        "kiln_incompatible_keys), or rename the keys",
                        "kiln_module_load_state_dict: %s; nothing was loaded", keys);
    } else if (!st && n - k->n_unexpected == 0 && (n > 0 || n_own > 0)) {
        format_incompatible(keys, sizeof keys, k);
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                        "compare the names with kiln_module_state_dict's (a prefix such as 'module.' or "
                        "'model.' added or dropped?)",
                        "kiln_module_load_state_dict: no key of the state dict matches the module: %s", keys);
    }
    for (int j = 0; !st && j < n; j++)
        if (key_set_has(&own_set, items[j].name)) st = state_set_body(m, items[j].name, items[j].tensor);
    free(own_set.bucket);
    free(item_set.bucket);
    free(own);
    return st;
}

kiln_status kiln_module_load_state_dict(kiln_module *m, const kiln_named_tensor *items, int n, bool strict,
                                        kiln_incompatible_keys *result) {
    kiln_incompatible_keys local = {0}, *k = result ? result : &local;
    *k = (kiln_incompatible_keys){0};
    kiln_api_enter();
    kiln_status st = load_state_dict_body(m, items, n, strict, k);
    kiln_api_leave();
    if (!st && !result && (k->n_missing || k->n_unexpected)) {
        char keys[800];
        format_incompatible(keys, sizeof keys, k);
        kiln_log_write(KILN_LOG_WARN,
                       "kiln_module_load_state_dict (strict=false) loaded the keys that match; %s (pass a "
                       "kiln_incompatible_keys to get the lists)",
                       keys);
    }
    kiln_incompatible_keys_free(&local);
    return st;
}

/* ---- Gradients ----------------------------------------------------------------------------- */

static kiln_status zero_grad_body(kiln_module *m, bool set_to_none) {
    for (int i = 0; i < m->params.n; i++) KILN_TRY(kiln_zero_grad(m->params.items[i].u.tensor, set_to_none));
    for (int i = 0; i < m->children.n; i++) KILN_TRY(zero_grad_body(m->children.items[i].u.child, set_to_none));
    return KILN_OK;
}

kiln_status kiln_module_zero_grad(kiln_module *m, bool set_to_none) {
    if (!m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_module_zero_grad: module is NULL");
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = zero_grad_body(m, set_to_none);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

/* ---- Devices and dtypes --------------------------------------------------------------------- */

/* Move *slot to device/dtype in place: the handle keeps its identity (an
 * optimizer or a kiln_named_tensor holding it still sees the parameter,
 * as PyTorch's module.to() keeps each parameter's identity), its data is
 * swapped for the moved copy's, and a parameter's gradient is converted
 * alike. On error nothing has changed. */
static kiln_status move_tensor(kiln_tensor **slot, kiln_device device, kiln_dtype dtype, bool param) {
    kiln_tensor *t = *slot;
    if (kiln_device_equal(kiln_get_device(t), device) && kiln_dtype_of(t) == dtype) return KILN_OK;
    kiln_tensor *moved = kiln_to(t, device, dtype, 0);
    if (!moved) return kiln_error_last()->status;
    kiln_tensor *g = param ? kiln_grad(t) : NULL, *g2 = NULL;
    if (g && !(g2 = kiln_to(g, device, dtype, 0))) {
        kiln_status st = kiln_error_last()->status;
        kiln_tensor_drop(g);
        kiln_tensor_drop(moved);
        return st;
    }
    if (g) KILN_ASSERT(kiln_set_grad(t, NULL) == KILN_OK);
    kiln_tensor_swap_data(t, moved);
    kiln_tensor_bump_version(t);
    kiln_status st = g2 ? kiln_set_grad(t, g2) : KILN_OK;
    if (g) kiln_tensor_drop(g);
    if (g2) kiln_tensor_drop(g2);
    kiln_tensor_drop(moved); /* now holds the old data */
    return st;
}

/* has_dtype false: keep each tensor's dtype (a pure device move). */
static kiln_status move_module(kiln_module *m, bool has_device, kiln_device device, bool has_dtype, kiln_dtype dtype) {
    kiln_module_slots *sets[2] = {&m->params, &m->buffers};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < sets[k]->n; i++) {
            kiln_tensor **slot = &sets[k]->items[i].u.tensor;
            kiln_dtype target = kiln_dtype_of(*slot);
            /* BatchNorm stays f32 under the half dtypes; f64 converts it too,
             * as PyTorch's .double() does. */
            if (has_dtype && kiln_dtype_is_floating(target))
                target = m->keep_f32 && dtype != KILN_F64 ? KILN_F32 : dtype;
            kiln_device dev = has_device ? device : kiln_get_device(*slot);
            KILN_TRY(move_tensor(slot, dev, target, k == 0));
        }
    }
    for (int i = 0; i < m->children.n; i++)
        KILN_TRY(move_module(m->children.items[i].u.child, has_device, device, has_dtype, dtype));
    return KILN_OK;
}

static kiln_status move(kiln_module *m, const char *fn, bool has_device, kiln_device device, bool has_dtype,
                        kiln_dtype dtype) {
    if (!m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: module is NULL", fn);
    if (has_dtype && !kiln_dtype_is_floating(dtype))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use f32, f16, bf16 or f64",
                          "%s: %s is not a floating dtype", fn, kiln_dtype_name(dtype));
    kiln_api_enter();
    kiln_no_grad_begin();
    kiln_status st = move_module(m, has_device, device, has_dtype, dtype);
    kiln_grad_mode_end();
    kiln_api_leave();
    return st;
}

kiln_status kiln_module_to(kiln_module *m, kiln_device device) {
    return move(m, "kiln_module_to", true, device, false, KILN_F32);
}

kiln_status kiln_module_to_dtype(kiln_module *m, kiln_dtype dtype) {
    return move(m, "kiln_module_to_dtype", false, KILN_CPU, true, dtype);
}
