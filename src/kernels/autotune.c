/* The convolution autotuner (autotune.h) and the settings that steer it
 * (kiln_set_deterministic, kiln_set_cudnn_benchmark, kiln_set_conv_autotune
 * of include/kiln/runtime.h). */
#include "kernels/autotune.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "runtime/caching_allocator.h"

#define HEADER      "kiln-autotune-cache 1"
#define FIELD_MAX   256                /* bytes of one key field, NUL included */
#define FILE_MAX    ((size_t)16 << 20) /* a cache file larger than this is not ours */
#define ENTRIES_MAX 100000
#define BUCKETS     256

/* ---- Settings ----------------------------------------------------------------------- */

/* -1: not set yet (read from the environment at first use). */
static atomic_int deterministic_flag = -1;
static atomic_int cudnn_benchmark_flag = -1;
static atomic_int conv_autotune_flag = -1;
static atomic_int cpu_layouts_flag = -1;

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcmp(v, "on") || !strcmp(v, "true"));
}

static bool read_flag(atomic_int *flag, const char *env) {
    int v = atomic_load(flag);
    if (v < 0) {
        int expected = -1;
        atomic_compare_exchange_strong(flag, &expected, env_flag(env) ? 1 : 0);
        v = atomic_load(flag);
    }
    return v == 1;
}

void kiln_set_deterministic(bool enabled) { atomic_store(&deterministic_flag, enabled ? 1 : 0); }
bool kiln_deterministic(void) { return read_flag(&deterministic_flag, "KILN_DETERMINISTIC"); }
void kiln_set_cudnn_benchmark(bool enabled) { atomic_store(&cudnn_benchmark_flag, enabled ? 1 : 0); }
bool kiln_is_cudnn_benchmark(void) { return read_flag(&cudnn_benchmark_flag, "KILN_CUDNN_BENCHMARK"); }
void kiln_set_conv_autotune(bool enabled) { atomic_store(&conv_autotune_flag, enabled ? 1 : 0); }
bool kiln_is_conv_autotune(void) { return read_flag(&conv_autotune_flag, "KILN_CONV_AUTOTUNE"); }
void kiln_set_cpu_layouts(bool enabled) { atomic_store(&cpu_layouts_flag, enabled ? 1 : 0); }
bool kiln_cpu_layouts(void) {
    int v = atomic_load(&cpu_layouts_flag);
    if (v < 0) {
        const char *e = getenv("KILN_CPU_LAYOUTS");
        int expected = -1;
        atomic_compare_exchange_strong(&cpu_layouts_flag, &expected,
                                       e && (!strcmp(e, "0") || !strcmp(e, "off") || !strcmp(e, "false")) ? 0 : 1);
        v = atomic_load(&cpu_layouts_flag);
    }
    return v == 1;
}

kiln_autotune_mode kiln_autotune_mode_current(kiln_device_type type) {
    kiln_autotune_mode m;
    m.deterministic = kiln_deterministic();
    m.timing =
        !m.deterministic && (type == KILN_DEVICE_CUDA ? kiln_is_cudnn_benchmark() : kiln_is_conv_autotune());
    return m;
}

/* What `device`'s allocator holds: its free cached bytes, the device's free
 * memory and, under a limit, the bytes the limit leaves over its reserved
 * ones (*limited false: no limit). False when its statistics cannot be
 * read. */
static bool allocator_state(kiln_device device, size_t *cached, size_t *free_dev, bool *limited, int64_t *left) {
    kiln_memory_stats st;
    size_t total = 0;
    if (kiln_memory_stats_get(device, &st) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (kiln_device_mem_info(device, free_dev, &total) != KILN_OK) {
        kiln_error_clear();
        *free_dev = 0;
    }
    int64_t c = st.reserved_bytes[KILN_POOL_ALL].current - st.allocated_bytes[KILN_POOL_ALL].current;
    *cached = c > 0 ? (size_t)c : 0;
    *limited = st.limit_bytes != 0;
    *left = (int64_t)st.limit_bytes - st.reserved_bytes[KILN_POOL_ALL].current;
    return true;
}

size_t kiln_autotune_allocator_headroom(kiln_device device) {
    size_t cached, free_dev;
    bool limited;
    int64_t left;
    if (!allocator_state(device, &cached, &free_dev, &limited, &left)) return 0;
    size_t headroom = free_dev + cached;
    if (limited) {
        int64_t cap = left + (int64_t)cached;
        if (cap < 0) cap = 0;
        if ((size_t)cap < headroom) headroom = (size_t)cap;
    }
    return headroom;
}

size_t kiln_autotune_allocator_fit(kiln_device device) {
    size_t cached, room; /* room: for a new segment */
    bool limited;
    int64_t left;
    if (!allocator_state(device, &cached, &room, &limited, &left)) return 0;
    if (limited && (size_t)(left > 0 ? left : 0) < room) room = (size_t)(left > 0 ? left : 0);
    /* The largest request whose new segment fits in room: any, from a room
     * of one large segment (requests between the small pool's 1 MiB and
     * 10 MiB take 20 MiB, larger ones about themselves); the small pool's
     * requests from a room of one small segment (2 MiB); none below. */
    size_t small_seg = kiln_alloc_segment_size(1), large_seg = kiln_alloc_segment_size(small_seg);
    size_t by_segment = room >= large_seg ? room : room >= small_seg ? small_seg / 2 : 0;
    return by_segment > cached ? by_segment : cached;
}

/* ---- Entries ------------------------------------------------------------------------ */

/* How a pick was made: only timed picks are written to the file. */
enum { PICK_TIMED = 'T', PICK_DETERMINISTIC = 'D', PICK_DEFAULT = 'F' };

typedef struct entry {
    char *key; /* provider \t device \t versions \t configuration */
    int how;   /* PICK_* */
    int index; /* candidate index; -1 until resolved (entries read from the file) */
    char name[KILN_AUTOTUNE_NAME_MAX];
    double ms;
    struct entry *next;
} entry;

struct kiln_autotuner {
    pthread_mutex_t mutex;      /* guards everything below */
    pthread_mutex_t tune_mutex; /* one tuning (provider callbacks) at a time */
    char *path;                 /* NULL: memory only */
    bool loaded;
    int warmup, repeats;
    entry *buckets[BUCKETS];
    kiln_autotune_stats stats;
};

static uint64_t hash_str(const char *s, int how) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)how; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static entry *find(kiln_autotuner *t, const char *key, int how) {
    for (entry *e = t->buckets[hash_str(key, how) % BUCKETS]; e; e = e->next)
        if (e->how == how && !strcmp(e->key, key)) return e;
    return NULL;
}

/* Bumped by every change to any tuner's entries (kiln_autotune_generation). */
static _Atomic uint64_t generation = 1;

uint64_t kiln_autotune_generation(void) { return atomic_load(&generation); }

static void remove_entry(kiln_autotuner *t, entry *victim) {
    entry **pp = &t->buckets[hash_str(victim->key, victim->how) % BUCKETS];
    while (*pp && *pp != victim) pp = &(*pp)->next;
    if (!*pp) return;
    atomic_fetch_add(&generation, 1);
    *pp = victim->next;
    if (victim->how == PICK_TIMED) t->stats.entries--;
    free(victim->key);
    free(victim);
}

/* Insert or overwrite; NULL when out of memory. */
static entry *put(kiln_autotuner *t, const char *key, int how, int index, const char *name, double ms) {
    entry *e = find(t, key, how);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->key = strdup(key))) {
            free(e);
            return NULL;
        }
        e->how = how;
        size_t b = hash_str(key, how) % BUCKETS;
        e->next = t->buckets[b];
        t->buckets[b] = e;
        if (how == PICK_TIMED) t->stats.entries++;
    }
    atomic_fetch_add(&generation, 1);
    e->index = index;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ms = ms;
    return e;
}

static void clear_entries(kiln_autotuner *t) {
    atomic_fetch_add(&generation, 1);
    for (int b = 0; b < BUCKETS; b++) {
        while (t->buckets[b]) {
            entry *e = t->buckets[b];
            t->buckets[b] = e->next;
            free(e->key);
            free(e);
        }
    }
    t->stats.entries = 0;
}

/* ---- Keys --------------------------------------------------------------------------- */

static const char *dtype_str(kiln_dtype d) {
    static const char *names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "u8", "bool"};
    return (unsigned)d < sizeof names / sizeof names[0] ? names[d] : "?";
}

static const char *pass_str(kiln_autotune_pass p) {
    return p == KILN_AUTOTUNE_CONV_FWD ? "fwd" : p == KILN_AUTOTUNE_CONV_BWD_DATA ? "bwd_data" : "bwd_weight";
}

void kiln_autotune_key_format(const kiln_autotune_conv *c, char *buf, size_t size) {
    snprintf(
        buf, size,
        "%s x=%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " w=%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64
        " y=%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " s=%" PRId64 ",%" PRId64 " p=%" PRId64 ",%" PRId64
        " d=%" PRId64 ",%" PRId64 " g=%" PRId64 " bias=%d dt=%s,%s,%s layout=%s math=%s",
        pass_str(c->pass), c->x[0], c->x[1], c->x[2], c->x[3], c->w[0], c->w[1], c->w[2], c->w[3], c->y[0],
        c->y[1], c->y[2], c->y[3], c->stride[0], c->stride[1], c->padding[0], c->padding[1], c->dilation[0],
        c->dilation[1], c->groups, c->bias ? 1 : 0, dtype_str(c->x_dtype), dtype_str(c->w_dtype),
        dtype_str(c->y_dtype), c->layout ? c->layout : "-", c->math ? c->math : "-");
}

/* Key fields hold printable ASCII only: tabs and newlines separate them. */
static void clean_field(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = ' ';
}

static void full_key(const kiln_autotune_provider *p, const kiln_autotune_conv *cfg, void *ctx, char *key,
                     size_t size) {
    char device[FIELD_MAX] = "", versions[FIELD_MAX] = "", config[FIELD_MAX * 2], name[FIELD_MAX];
    if (p->identity) p->identity(p->self, ctx, device, sizeof device, versions, sizeof versions);
    snprintf(name, sizeof name, "%s", p->name ? p->name : "?");
    kiln_autotune_key_format(cfg, config, sizeof config);
    clean_field(device);
    clean_field(versions);
    clean_field(name);
    clean_field(config);
    snprintf(key, size, "%s\t%s\t%s\t%s", name[0] ? name : "-", device[0] ? device : "-",
             versions[0] ? versions : "-", config);
}

/* ---- The cache file ----------------------------------------------------------------- */

static bool printable(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) return false;
    return true;
}

/* One entry line (no newline): six tab-separated fields. */
static kiln_status parse_line(kiln_autotuner *t, const char *line, size_t len, int lineno) {
    const char *f[6];
    size_t n[6];
    int k = 0;
    const char *start = line, *end = line + len;
    for (const char *s = line; s <= end; s++) {
        if (s == end || *s == '\t') {
            if (k >= 6)
                k = 7; /* too many fields: counted, not stored */
            else {
                f[k] = start, n[k] = (size_t)(s - start), k++;
            }
            start = s + 1;
        }
    }
    if (k != 6)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "line %d has %s than 6 tab-separated fields",
                          lineno, k < 6 ? "fewer" : "more");
    for (int i = 0; i < 6; i++) {
        size_t cap = i == 4 ? KILN_AUTOTUNE_NAME_MAX : i == 3 ? FIELD_MAX * 2 : FIELD_MAX;
        if (n[i] == 0 || n[i] >= cap || !printable(f[i], n[i]))
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                              "line %d: field %d is empty, too long or not printable", lineno, i + 1);
    }
    char num[64];
    if (n[5] >= sizeof num) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "line %d: bad time", lineno);
    memcpy(num, f[5], n[5]);
    num[n[5]] = 0;
    char *stop;
    errno = 0;
    double ms = strtod(num, &stop);
    if (errno || *stop || !isfinite(ms) || ms < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "line %d: bad time '%s'", lineno, num);
    char key[FIELD_MAX * 5 + 4], name[KILN_AUTOTUNE_NAME_MAX];
    snprintf(key, sizeof key, "%.*s\t%.*s\t%.*s\t%.*s", (int)n[0], f[0], (int)n[1], f[1], (int)n[2], f[2],
             (int)n[3], f[3]);
    snprintf(name, sizeof name, "%.*s", (int)n[4], f[4]);
    if (t->stats.entries >= ENTRIES_MAX)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "more than %d entries", ENTRIES_MAX);
    if (!put(t, key, PICK_TIMED, -1, name, ms))
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "no host memory for an autotune cache entry");
    return KILN_OK;
}

static kiln_status parse_locked(kiln_autotuner *t, const char *text, size_t len) {
    clear_entries(t);
    size_t hl = strlen(HEADER);
    if (len < hl || memcmp(text, HEADER, hl) || (len > hl && text[hl] != '\n'))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "the first line is not '%s'", HEADER);
    size_t pos = len > hl ? hl + 1 : hl;
    int lineno = 1;
    kiln_status st = KILN_OK;
    while (pos < len && !st) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        lineno++;
        if (end > pos) st = parse_line(t, text + pos, end - pos, lineno);
        pos = end + 1;
    }
    if (st) clear_entries(t);
    return st;
}

kiln_status kiln_autotune_parse(kiln_autotuner *t, const char *text, size_t len) {
    pthread_mutex_lock(&t->mutex);
    kiln_status st = parse_locked(t, text, len);
    t->loaded = true;
    pthread_mutex_unlock(&t->mutex);
    return st;
}

static char *serialize_locked(kiln_autotuner *t) {
    size_t cap = strlen(HEADER) + 2, used = 0;
    for (int b = 0; b < BUCKETS; b++)
        for (entry *e = t->buckets[b]; e; e = e->next)
            if (e->how == PICK_TIMED) cap += strlen(e->key) + strlen(e->name) + 40;
    char *out = malloc(cap);
    if (!out) return NULL;
    used += (size_t)snprintf(out, cap, "%s\n", HEADER);
    for (int b = 0; b < BUCKETS; b++)
        for (entry *e = t->buckets[b]; e; e = e->next)
            if (e->how == PICK_TIMED)
                used += (size_t)snprintf(out + used, cap - used, "%s\t%s\t%.6g\n", e->key, e->name, e->ms);
    return out;
}

char *kiln_autotune_serialize(kiln_autotuner *t) {
    pthread_mutex_lock(&t->mutex);
    char *s = serialize_locked(t);
    pthread_mutex_unlock(&t->mutex);
    return s;
}

/* mkdir -p of path's directory. */
static void make_parent_dirs(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

/* Write the file atomically: a temporary beside it, then rename. A
 * failure is a warning (the picks stay in memory), never an op error. */
static void save_locked(kiln_autotuner *t) {
    if (!t->path) return;
    char *text = serialize_locked(t);
    if (!text) return;
    make_parent_dirs(t->path);
    static atomic_uint counter;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", t->path, (long)getpid(), atomic_fetch_add(&counter, 1));
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = false;
    if (ok && rename(tmp, t->path)) ok = false;
    if (ok)
        t->stats.saves++;
    else {
        if (f) remove(tmp);
        kiln_log_write(KILN_LOG_WARN,
                       "kiln: could not write the autotune cache %s: %s (picks kept in memory only)", t->path,
                       strerror(errno));
    }
    free(text);
}

static void load_locked(kiln_autotuner *t) {
    t->loaded = true;
    if (!t->path) return;
    FILE *f = fopen(t->path, "rb");
    if (!f) return; /* no file yet */
    char *buf = malloc(FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, FILE_MAX + 1, f) : 0;
    fclose(f);
    if (!buf) return;
    const char *why = NULL;
    char msg[320];
    if (n > FILE_MAX)
        why = "larger than 16 MiB";
    else if (parse_locked(t, buf, n) != KILN_OK) {
        snprintf(msg, sizeof msg, "%s", kiln_error_message());
        why = msg;
        kiln_error_clear();
    }
    free(buf);
    if (why) {
        clear_entries(t);
        t->stats.load_rejected = true;
        kiln_log_write(KILN_LOG_WARN,
                       "kiln: autotune cache %s ignored (%s); it is rewritten at the next pick", t->path,
                       why);
        return;
    }
    t->stats.loaded = t->stats.entries;
}

/* ---- Tuners ------------------------------------------------------------------------- */

kiln_autotuner *kiln_autotuner_create(const char *cache_path, int warmup, int repeats) {
    kiln_autotuner *t = KILN_CALLOC(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mutex, NULL);
    pthread_mutex_init(&t->tune_mutex, NULL);
    t->warmup = warmup > 0 ? warmup : 1;
    t->repeats = repeats > 0 ? repeats : 5;
    if (cache_path && cache_path[0] && !(t->path = strdup(cache_path))) {
        kiln_autotuner_free(t);
        KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "no host memory for the autotune cache path");
        return NULL;
    }
    return t;
}

void kiln_autotuner_free(kiln_autotuner *t) {
    if (!t) return;
    clear_entries(t);
    pthread_mutex_destroy(&t->mutex);
    pthread_mutex_destroy(&t->tune_mutex);
    free(t->path);
    free(t);
}

static pthread_mutex_t global_mutex = PTHREAD_MUTEX_INITIALIZER;
static kiln_autotuner *global_tuner;

static void default_path(char *buf, size_t size) {
    const char *env = getenv("KILN_AUTOTUNE_CACHE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    buf[0] = 0;
    if (env) {
        if (strcmp(env, "off")) snprintf(buf, size, "%s", env);
    } else if (xdg && xdg[0] == '/') {
        snprintf(buf, size, "%s/kiln/autotune.txt", xdg);
    } else if (home && home[0] == '/') {
        snprintf(buf, size, "%s/.cache/kiln/autotune.txt", home);
    }
}

kiln_autotuner *kiln_autotune_global(void) {
    pthread_mutex_lock(&global_mutex);
    if (!global_tuner) {
        char path[4096];
        default_path(path, sizeof path);
        global_tuner = kiln_autotuner_create(path, 0, 0);
    }
    kiln_autotuner *t = global_tuner;
    pthread_mutex_unlock(&global_mutex);
    return t;
}

void kiln_autotune_global_free(void) {
    pthread_mutex_lock(&global_mutex);
    kiln_autotuner_free(global_tuner);
    global_tuner = NULL;
    pthread_mutex_unlock(&global_mutex);
}

void kiln_autotune_stats_get(kiln_autotuner *t, kiln_autotune_stats *out) {
    pthread_mutex_lock(&t->mutex);
    *out = t->stats;
    pthread_mutex_unlock(&t->mutex);
}

/* ---- Choosing ----------------------------------------------------------------------- */

/* Why candidates were skipped, for the error when none is left. */
typedef struct reasons {
    char text[768];
    size_t used;
} reasons;

static void add_reason(reasons *r, const char *name, const char *why) {
    if (r->used >= sizeof r->text - 1) return;
    int n = snprintf(r->text + r->used, sizeof r->text - r->used, "%s%s: %s", r->used ? "; " : "", name, why);
    if (n > 0) r->used += (size_t)n;
    if (r->used > sizeof r->text - 1) r->used = sizeof r->text - 1;
}

/* Builds candidate i and checks its workspace against the limit. */
static bool usable(const kiln_autotune_provider *p, const kiln_autotune_conv *cfg, void *ctx, int i,
                   const kiln_autotune_candidate *c, size_t *ws, reasons *r) {
    *ws = 0;
    if (p->build(p->self, cfg, ctx, i, ws) != KILN_OK) {
        char why[300];
        snprintf(why, sizeof why, "does not build (%s)", kiln_error_message());
        add_reason(r, c->name, why);
        return false;
    }
    size_t limit = p->workspace_limit ? p->workspace_limit(p->self, ctx) : SIZE_MAX;
    if (*ws > limit) {
        char why[160];
        snprintf(why, sizeof why, "needs %zu bytes of workspace, the allocator can give %zu", *ws, limit);
        add_reason(r, c->name, why);
        return false;
    }
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fastest ms of candidate i over t->repeats timed runs after t->warmup
 * untimed ones; false (reason added) when a run fails. */
static bool time_candidate(kiln_autotuner *t, const kiln_autotune_provider *p, const kiln_autotune_conv *cfg,
                           void *ctx, int i, const kiln_autotune_candidate *c, size_t ws_bytes,
                           double *fastest, reasons *r) {
    void *ws = NULL;
    if (ws_bytes && p->workspace_alloc && p->workspace_alloc(p->self, ctx, ws_bytes, &ws) != KILN_OK) {
        add_reason(r, c->name, "its workspace could not be allocated");
        return false;
    }
    double times[64];
    int reps = t->repeats < 64 ? t->repeats : 64, done = 0;
    bool ok = true;
    for (int k = 0; ok && k < t->warmup; k++) ok = p->run(p->self, cfg, ctx, i, ws, ws_bytes) == KILN_OK;
    for (; ok && done < reps; done++) {
        ok = p->timer_start(p->self, ctx) == KILN_OK &&
             p->run(p->self, cfg, ctx, i, ws, ws_bytes) == KILN_OK &&
             p->timer_stop(p->self, ctx, &times[done]) == KILN_OK;
    }
    if (ws && p->workspace_free) p->workspace_free(p->self, ctx, ws);
    pthread_mutex_lock(&t->mutex);
    t->stats.timed_runs += done;
    pthread_mutex_unlock(&t->mutex);
    if (!ok) {
        char why[300];
        snprintf(why, sizeof why, "failed when run (%s)", kiln_error_message());
        add_reason(r, c->name, why);
        return false;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    *fastest = times[0];
    return true;
}

/* The pick for a key not seen before (tune_mutex held). */
static kiln_status pick(kiln_autotuner *t, const kiln_autotune_provider *p, const kiln_autotune_conv *cfg,
                        void *ctx, int how, const kiln_autotune_candidate *cand, int n,
                        kiln_autotune_choice *out) {
    reasons r = {.used = 0};
    r.text[0] = 0;
    int best = -1;
    double best_ms = -1;
    int start = 0;
    if (how == PICK_DEFAULT)
        for (int i = 0; i < n; i++)
            if (cand[i].is_default) start = i;
    for (int k = 0; k < n; k++) {
        int i = (start + k) % n;
        if (how == PICK_DETERMINISTIC && !cand[i].deterministic) {
            add_reason(&r, cand[i].name, "not deterministic");
            continue;
        }
        size_t ws;
        if (!usable(p, cfg, ctx, i, &cand[i], &ws, &r)) continue;
        if (how != PICK_TIMED) {
            best = i;
            break;
        }
        double ms;
        if (!time_candidate(t, p, cfg, ctx, i, &cand[i], ws, &ms, &r)) continue;
        if (best < 0 || ms < best_ms) best = i, best_ms = ms;
    }
    if (best < 0) {
        char config[FIELD_MAX * 2];
        kiln_autotune_key_format(cfg, config, sizeof config);
        return KILN_RAISE(KILN_ERR_UNSUPPORTED,
                          how == PICK_DETERMINISTIC ? "call kiln_set_deterministic(false) to allow the others"
                                                    : "raise the memory limit, or report the configuration",
                          "%s convolution (%s): no candidate can run%s: %s", p->name, config,
                          how == PICK_DETERMINISTIC ? " in deterministic mode" : "",
                          r.used ? r.text : "the provider has none");
    }
    out->index = best;
    snprintf(out->name, sizeof out->name, "%s", cand[best].name);
    out->ms = best_ms;
    out->from_cache = false;
    return KILN_OK;
}

static kiln_status list_candidates(const kiln_autotune_provider *p, const kiln_autotune_conv *cfg, void *ctx,
                                   kiln_autotune_candidate *cand, int *n) {
    *n = 0;
    KILN_TRY(p->candidates(p->self, cfg, ctx, cand, KILN_AUTOTUNE_MAX_CANDIDATES, n));
    if (*n > KILN_AUTOTUNE_MAX_CANDIDATES) *n = KILN_AUTOTUNE_MAX_CANDIDATES;
    return KILN_OK;
}

/* A cached entry as a choice; false when its name is no longer a candidate. */
static bool resolve(entry *e, const kiln_autotune_candidate *cand, int n) {
    if (e->index >= 0) return e->index < n;
    for (int i = 0; i < n; i++)
        if (!strcmp(cand[i].name, e->name)) {
            e->index = i;
            return true;
        }
    return false;
}

static void choice_of(const entry *e, kiln_autotune_choice *out) {
    out->index = e->index;
    snprintf(out->name, sizeof out->name, "%s", e->name);
    out->ms = e->how == PICK_TIMED ? e->ms : -1;
    out->from_cache = true;
}

/* The last untimed answers on this thread (default or deterministic
 * mode), by tuner, provider, mode, the provider's identity for the call
 * (the device its ctx names) and configuration: everything the key holds.
 * An answer costs a formatted key and a locked lookup (about 1.5 us), and
 * a convolution asks
 * several times a call (supports, layout, workspace, prepared copy, run;
 * a fused op a dozen). Dropped when any tuner's entries change. Timing
 * mode never uses it: there an untimed answer may later be replaced. */
#define MEMO_SLOTS 8
typedef struct memo_slot {
    const kiln_autotuner *tuner;
    const kiln_autotune_provider *provider;
    uint64_t generation;
    int how;
    char device[FIELD_MAX], versions[FIELD_MAX]; /* the provider's identity for the call's ctx */
    kiln_autotune_conv cfg;
    kiln_autotune_choice choice;
} memo_slot;
static _Thread_local memo_slot memo[MEMO_SLOTS];
static _Thread_local int memo_next;

static bool same_text(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

static bool same_cfg(const kiln_autotune_conv *a, const kiln_autotune_conv *b) {
    return a->pass == b->pass && a->x_dtype == b->x_dtype && a->w_dtype == b->w_dtype && a->y_dtype == b->y_dtype &&
           !memcmp(a->x, b->x, sizeof a->x) && !memcmp(a->w, b->w, sizeof a->w) && !memcmp(a->y, b->y, sizeof a->y) &&
           !memcmp(a->stride, b->stride, sizeof a->stride) && !memcmp(a->padding, b->padding, sizeof a->padding) &&
           !memcmp(a->dilation, b->dilation, sizeof a->dilation) && a->groups == b->groups && a->bias == b->bias &&
           same_text(a->layout, b->layout) && same_text(a->math, b->math);
}

static bool memo_get(const kiln_autotuner *t, const kiln_autotune_provider *p, const char *device,
                     const char *versions, const kiln_autotune_conv *cfg, int how, kiln_autotune_choice *out) {
    uint64_t g = atomic_load(&generation);
    for (int i = 0; i < MEMO_SLOTS; i++) {
        const memo_slot *m = &memo[i];
        if (m->tuner == t && m->provider == p && m->generation == g && m->how == how && same_cfg(&m->cfg, cfg) &&
            !strcmp(m->device, device) && !strcmp(m->versions, versions)) {
            *out = m->choice;
            out->from_cache = true;
            return true;
        }
    }
    return false;
}

static void memo_put(const kiln_autotuner *t, const kiln_autotune_provider *p, const char *device,
                     const char *versions, const kiln_autotune_conv *cfg, int how, const kiln_autotune_choice *choice) {
    memo_slot *m = &memo[memo_next];
    memo_next = (memo_next + 1) % MEMO_SLOTS;
    *m = (memo_slot){.tuner = t, .provider = p, .generation = atomic_load(&generation), .how = how, .cfg = *cfg,
                     .choice = *choice};
    snprintf(m->device, sizeof m->device, "%s", device);
    snprintf(m->versions, sizeof m->versions, "%s", versions);
}

static kiln_status choose(kiln_autotuner *t, const kiln_autotune_provider *p, const kiln_autotune_conv *cfg,
                          void *ctx, int how, bool can_time, kiln_autotune_choice *out);

kiln_status kiln_autotune_choose(kiln_autotuner *t, const kiln_autotune_provider *p,
                                 const kiln_autotune_conv *cfg, void *ctx, kiln_autotune_mode mode,
                                 bool can_time, kiln_autotune_choice *out) {
    int how = mode.deterministic ? PICK_DETERMINISTIC : mode.timing ? PICK_TIMED : PICK_DEFAULT;
    if (how == PICK_TIMED) return choose(t, p, cfg, ctx, how, can_time, out);
    char device[FIELD_MAX] = "", versions[FIELD_MAX] = "";
    if (p->identity) p->identity(p->self, ctx, device, sizeof device, versions, sizeof versions);
    if (memo_get(t, p, device, versions, cfg, how, out)) return KILN_OK;
    KILN_TRY(choose(t, p, cfg, ctx, how, can_time, out));
    memo_put(t, p, device, versions, cfg, how, out);
    return KILN_OK;
}

static kiln_status choose(kiln_autotuner *t, const kiln_autotune_provider *p, const kiln_autotune_conv *cfg,
                          void *ctx, int how, bool can_time, kiln_autotune_choice *out) {
    char key[FIELD_MAX * 5 + 4];
    full_key(p, cfg, ctx, key, sizeof key);

    pthread_mutex_lock(&t->mutex);
    if (!t->loaded) load_locked(t);
    entry *e = find(t, key, how);
    if (!e && how == PICK_TIMED && !can_time) {
        how = PICK_DEFAULT; /* planning without buffers: the default, until a real run times */
        e = find(t, key, how);
    }
    if (e && e->index >= 0) {
        choice_of(e, out);
        if (how == PICK_TIMED) t->stats.cache_hits++;
        pthread_mutex_unlock(&t->mutex);
        return KILN_OK;
    }
    pthread_mutex_unlock(&t->mutex);

    kiln_autotune_candidate cand[KILN_AUTOTUNE_MAX_CANDIDATES];
    int n;
    pthread_mutex_lock(&t->tune_mutex);
    kiln_status st = list_candidates(p, cfg, ctx, cand, &n);
    if (st) {
        pthread_mutex_unlock(&t->tune_mutex);
        return st;
    }
    pthread_mutex_lock(&t->mutex);
    e = find(t, key, how); /* another thread may have picked meanwhile, or the file named it */
    if (e && resolve(e, cand, n)) {
        choice_of(e, out);
        if (how == PICK_TIMED) t->stats.cache_hits++;
        pthread_mutex_unlock(&t->mutex);
        pthread_mutex_unlock(&t->tune_mutex);
        return KILN_OK;
    }
    if (e) remove_entry(t, e); /* names a candidate the provider no longer has */
    pthread_mutex_unlock(&t->mutex);

    st = pick(t, p, cfg, ctx, how, cand, n, out);
    if (!st) {
        pthread_mutex_lock(&t->mutex);
        if (!put(t, key, how, out->index, out->name, out->ms < 0 ? 0 : out->ms))
            st = KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "no host memory for an autotune cache entry");
        if (!st && how == PICK_TIMED) {
            t->stats.tunings++;
            save_locked(t);
        }
        pthread_mutex_unlock(&t->mutex);
    }
    pthread_mutex_unlock(&t->tune_mutex);
    return st;
}
