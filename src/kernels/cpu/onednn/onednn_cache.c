/* The oneDNN engine, stream and primitive cache, and the CPU as the
 * autotuner's oneDNN provider sees it (onednn_internal.h). */
#ifdef KILN_WITH_ONEDNN
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.h"
#include "kernels/autotune.h"
#include "kernels/cpu/onednn/onednn_internal.h"
#include "kiln/runtime.h"

#define CACHE_BUCKETS 128

typedef struct cache_entry {
    kiln_onednn_key key;
    kiln_onednn_prim prim;
    kiln_status status; /* KILN_OK, or why the build failed */
    char message[256];  /* the failure's message, repeated to later callers */
    struct cache_entry *next;
} cache_entry;

/* All guarded by cache_mutex; exec_mutex serialises execution (entries
 * are only freed by kiln_onednn_shutdown, when no op runs). */
static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t exec_mutex = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static cache_entry *buckets[CACHE_BUCKETS];

const char *kiln_onednn_status_name(dnnl_status_t st) {
    switch (st) {
    case dnnl_success:
        return "dnnl_success";
    case dnnl_out_of_memory:
        return "dnnl_out_of_memory";
    case dnnl_invalid_arguments:
        return "dnnl_invalid_arguments";
    case dnnl_unimplemented:
        return "dnnl_unimplemented";
    case dnnl_iterator_ends:
        return "dnnl_iterator_ends";
    case dnnl_runtime_error:
        return "dnnl_runtime_error";
    case dnnl_not_required:
        return "dnnl_not_required";
    default:
        return "unknown dnnl status";
    }
}

bool kiln_onednn_is_contiguous(const kiln_strided *s) {
    int64_t expect = 1;
    for (int i = s->ndim - 1; i >= 0; i--) {
        if (s->shape[i] <= 0) return false;
        if (s->shape[i] != 1 && s->strides[i] != expect) return false;
        expect *= s->shape[i];
    }
    return true;
}

static uint64_t key_hash(const kiln_onednn_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static kiln_status ensure_engine(void) {
    if (!engine) KILN_DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    if (!stream) KILN_DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    return KILN_OK;
}

static void prim_destroy(kiln_onednn_prim *p) {
    for (int i = 0; i < p->n_args; i++)
        if (p->mem[i]) dnnl_memory_destroy(p->mem[i]);
    if (p->scratch) dnnl_memory_destroy(p->scratch);
    if (p->prim) dnnl_primitive_destroy(p->prim);
    memset(p, 0, sizeof *p);
}

/* Memory objects without buffers, one per argument, from pd's descriptors. */
static kiln_status prim_create(const_dnnl_primitive_desc_t pd, int n_args, const int *arg_ids,
                               kiln_onednn_prim *p) {
    KILN_DNNL_CHECK(dnnl_primitive_create(&p->prim, pd));
    for (int i = 0; i < n_args; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg_ids[i]);
        if (!md)
            return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "oneDNN: the primitive has no argument %d",
                              arg_ids[i]);
        p->arg_ids[i] = arg_ids[i];
        KILN_DNNL_CHECK(dnnl_memory_create(&p->mem[i], md, engine, DNNL_MEMORY_NONE));
        p->n_args = i + 1;
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (p->scratch_bytes) KILN_DNNL_CHECK(dnnl_memory_create(&p->scratch, smd, engine, DNNL_MEMORY_NONE));
    return KILN_OK;
}

static kiln_status build_entry(cache_entry *e, kiln_onednn_build_fn build, int n_args, const int *arg_ids) {
    if (n_args > KILN_ONEDNN_MAX_ARGS)
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "oneDNN: %d arguments (at most %d)", n_args,
                          KILN_ONEDNN_MAX_ARGS);
    KILN_TRY(ensure_engine());
    dnnl_primitive_attr_t attr = NULL;
    KILN_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    dnnl_status_t ds = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (ds != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        KILN_DNNL_CHECK(ds);
    }
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = build(&e->key, attr, engine, &pd);
    dnnl_primitive_attr_destroy(attr);
    if (!st) st = prim_create(pd, n_args, arg_ids, &e->prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (st) prim_destroy(&e->prim);
    return st;
}

kiln_status kiln_onednn_get(const kiln_onednn_key *key, kiln_onednn_build_fn build, int n_args,
                            const int *arg_ids, kiln_onednn_prim **out) {
    *out = NULL;
    size_t b = (size_t)(key_hash(key) % CACHE_BUCKETS);
    pthread_mutex_lock(&cache_mutex);
    cache_entry *e = buckets[b];
    while (e && memcmp(&e->key, key, sizeof *key)) e = e->next;
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&cache_mutex);
            return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL,
                              "oneDNN: no host memory for a primitive cache entry");
        }
        e->key = *key;
        e->status = build_entry(e, build, n_args, arg_ids);
        if (e->status) snprintf(e->message, sizeof e->message, "%s", kiln_error_message());
        e->next = buckets[b];
        buckets[b] = e;
        pthread_mutex_unlock(&cache_mutex);
        if (e->status) return e->status; /* the build raised it just now */
        *out = &e->prim;
        return KILN_OK;
    }
    pthread_mutex_unlock(&cache_mutex);
    if (e->status) return KILN_RAISE(e->status, NULL, "%s", e->message);
    *out = &e->prim;
    return KILN_OK;
}

static kiln_status execute_locked(kiln_onednn_prim *p, void *const *data, void *workspace) {
    dnnl_exec_arg_t args[KILN_ONEDNN_MAX_ARGS + 1];
    int n = 0;
    for (int i = 0; i < p->n_args; i++) {
        KILN_DNNL_CHECK(dnnl_memory_set_data_handle(p->mem[i], data[i]));
        args[n++] = (dnnl_exec_arg_t){p->arg_ids[i], p->mem[i]};
    }
    if (p->scratch) {
        KILN_DNNL_CHECK(dnnl_memory_set_data_handle(p->scratch, workspace));
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->scratch};
    }
    KILN_DNNL_CHECK(dnnl_primitive_execute(p->prim, stream, n, args));
    KILN_DNNL_CHECK(dnnl_stream_wait(stream));
    return KILN_OK;
}

kiln_status kiln_onednn_execute(kiln_onednn_prim *p, void *const *data, void *workspace,
                                size_t workspace_bytes) {
    if (workspace_bytes < p->scratch_bytes || (p->scratch_bytes && !workspace))
        return KILN_RAISE(KILN_ERR_INTERNAL, NULL, "oneDNN: workspace of %zu bytes, the primitive needs %zu",
                          workspace_bytes, p->scratch_bytes);
    pthread_mutex_lock(&exec_mutex);
    kiln_status st = execute_locked(p, data, workspace);
    pthread_mutex_unlock(&exec_mutex);
    return st;
}

void kiln_onednn_shutdown(void) {
    pthread_mutex_lock(&cache_mutex);
    for (int b = 0; b < CACHE_BUCKETS; b++) {
        while (buckets[b]) {
            cache_entry *e = buckets[b];
            buckets[b] = e->next;
            prim_destroy(&e->prim);
            free(e);
        }
    }
    if (stream) dnnl_stream_destroy(stream);
    if (engine) dnnl_engine_destroy(engine);
    stream = NULL;
    engine = NULL;
    pthread_mutex_unlock(&cache_mutex);
    /* The autotuner's picks name these primitives' algorithms; its file
     * keeps the timed ones for the next kiln_init. */
    kiln_autotune_global_free();
}

/* ---- The CPU as the autotuner's oneDNN provider sees it ---------------------------- */

static char identity_device[200], identity_versions[80];

static void identity_init(void) {
    char name[160] = "cpu";
    if (kiln_device_name(KILN_CPU, name, sizeof name) != KILN_OK) kiln_error_clear();
    /* oneDNN runs on OpenMP's threads: their count changes which
     * algorithm wins, so it is part of the device. */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    snprintf(identity_device, sizeof identity_device, "%s, %d threads", name, threads);
    const dnnl_version_t *v = dnnl_version();
    snprintf(identity_versions, sizeof identity_versions, "onednn %d.%d.%d %s", v->major, v->minor, v->patch,
             v->hash ? v->hash : "");
}

void kiln_onednn_tune_identity(void *self, void *ctx, char *device, size_t device_size, char *versions,
                               size_t versions_size) {
    (void)self, (void)ctx;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, identity_init);
    snprintf(device, device_size, "%s", identity_device);
    snprintf(versions, versions_size, "%s", identity_versions);
}

/* What the CPU allocator can surely give: a Winograd workspace of 1-10 MiB
 * takes a 20 MiB segment where no cached block holds it, so under a tight
 * limit (KILN_ALLOC_CONF=limit_mb:3) the tuner falls back to direct instead
 * of running out of memory. */
size_t kiln_onednn_tune_workspace_limit(void *self, void *ctx) {
    (void)self, (void)ctx;
    return kiln_autotune_allocator_fit(KILN_CPU);
}

kiln_status kiln_onednn_tune_workspace_alloc(void *self, void *ctx, size_t bytes, void **ptr) {
    (void)self, (void)ctx;
    return kiln_memory_alloc(KILN_CPU, bytes, NULL, ptr);
}

void kiln_onednn_tune_workspace_free(void *self, void *ctx, void *ptr) {
    (void)self, (void)ctx;
    if (kiln_memory_free(KILN_CPU, ptr) != KILN_OK) kiln_error_clear();
}

#else
typedef int kiln_onednn_cache_unused; /* ISO C: a translation unit is not empty */
#endif
