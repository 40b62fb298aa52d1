/* Saving and loading a module's state dict as a safetensors file. The
 * writer builds the whole header first (offsets follow from the shapes),
 * then streams each tensor's bytes through one host buffer into a
 * temporary file that is fsync'd and renamed over the target. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "diag/strbuf.h"
#include "io/safetensors_internal.h"
#include "kiln/io.h"
#include "tensor/tensor_internal.h"

static size_t tensor_bytes(const kiln_tensor *t) {
    return (size_t)kiln_numel(t) * kiln_dtype_size(kiln_dtype_of(t));
}

/* JSON string with the escapes a name could need. */
static void json_string(kiln_strbuf *b, const char *s) {
    kiln_strbuf_printf(b, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') kiln_strbuf_printf(b, "\\%c", ch);
        else if (ch < 0x20) kiln_strbuf_printf(b, "\\u%04x", ch);
        else kiln_strbuf_printf(b, "%c", ch);
    }
    kiln_strbuf_printf(b, "\"");
}

/* The header JSON, padded with spaces to a multiple of 8 bytes (the
 * reference writer's alignment, so the data starts aligned). */
static kiln_status build_header(const char *path, const kiln_named_tensor *items, int n, const char *const *meta,
                                int n_meta, kiln_strbuf *b) {
    uint64_t off = 0;
    kiln_strbuf_printf(b, "{\"__metadata__\":{\"format\":\"pt\"");
    for (int i = 0; i < n_meta; i++) {
        kiln_strbuf_printf(b, ",");
        json_string(b, meta[2 * i]);
        kiln_strbuf_printf(b, ":");
        json_string(b, meta[2 * i + 1]);
    }
    kiln_strbuf_printf(b, "}");
    for (int i = 0; i < n; i++) {
        const char *dt = kiln_st_dtype_name(kiln_dtype_of(items[i].tensor));
        if (!dt)
            return KILN_RAISE(KILN_ERR_UNSUPPORTED, NULL, "%s: tensor '%s' has a dtype safetensors cannot hold", path,
                              items[i].name);
        kiln_strbuf_printf(b, ",");
        json_string(b, items[i].name);
        kiln_strbuf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        kiln_shape s = kiln_shape_of(items[i].tensor);
        for (int d = 0; d < s.ndim; d++) kiln_strbuf_printf(b, "%s%lld", d ? "," : "", (long long)s.d[d]);
        uint64_t bytes = tensor_bytes(items[i].tensor);
        kiln_strbuf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                           (unsigned long long)(off + bytes));
        off += bytes;
    }
    kiln_strbuf_printf(b, "}");
    while (b->len % 8) kiln_strbuf_printf(b, " ");
    return b->failed ? KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: out of memory building the header", path)
                     : KILN_OK;
}

static kiln_status write_all(int fd, const void *p, size_t n, const char *tmp) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return KILN_RAISE(KILN_ERR_IO, "check free disk space and permissions", "cannot write %s: %s", tmp,
                              strerror(errno));
        c += w;
        n -= (size_t)w;
    }
    return KILN_OK;
}

/* The crash-safety test's hook (tests/tools/checkpoint_kill.sh): with
 * KILN_CHECKPOINT_PAUSE_MS=N the writer sleeps N ms after the header, after
 * the data's fsync and after the rename, so a SIGKILL sent at a random
 * moment lands inside a write. Unset (always, outside that test): nothing. */
static void test_pause(void) {
    static int pause_ms = -1;
    if (pause_ms < 0) {
        const char *env = getenv("KILN_CHECKPOINT_PAUSE_MS");
        long v = env ? strtol(env, NULL, 10) : 0;
        pause_ms = v > 0 && v < 10000 ? (int)v : 0;
    }
    if (pause_ms) usleep((useconds_t)pause_ms * 1000);
}

static kiln_status write_file(int fd, const char *tmp, const kiln_strbuf *hdr, const kiln_named_tensor *items,
                              int n) {
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hdr->len >> (8 * i));
    KILN_TRY(write_all(fd, len8, 8, tmp));
    KILN_TRY(write_all(fd, hdr->data, hdr->len, tmp));
    test_pause();
    size_t cap = 0;
    for (int i = 0; i < n; i++)
        if (tensor_bytes(items[i].tensor) > cap) cap = tensor_bytes(items[i].tensor);
    void *buf = KILN_MALLOC(cap ? cap : 1);
    if (!buf) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++) {
        size_t bytes = tensor_bytes(items[i].tensor);
        if (bytes) st = kiln_to_host(items[i].tensor, buf, bytes);
        if (st == KILN_OK) st = write_all(fd, buf, bytes, tmp);
    }
    free(buf);
    if (st == KILN_OK && fsync(fd) != 0)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot fsync %s: %s", tmp, strerror(errno));
    if (st == KILN_OK) test_pause();
    return st;
}

/* fsync the directory holding `path`, so the rename itself is durable. */
static kiln_status sync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return KILN_RAISE(KILN_ERR_IO, NULL, "cannot open directory %s: %s", dir, strerror(errno));
    kiln_status st = KILN_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot fsync directory %s: %s", dir, strerror(errno));
    close(fd);
    return st;
}

kiln_status kiln_st_write(const char *path, const kiln_named_tensor *items, int n, const char *const *meta,
                          int n_meta) {
    kiln_strbuf hdr = {0};
    kiln_status st = build_header(path, items, n, meta, n_meta, &hdr);
    char *tmp = NULL;
    if (st == KILN_OK) {
        size_t len = strlen(path) + 32;
        tmp = KILN_MALLOC(len);
        if (!tmp) st = KILN_ERR_OUT_OF_MEMORY;
        else snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    }
    int fd = -1;
    if (st == KILN_OK) {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            st = KILN_RAISE(KILN_ERR_IO, "check that the directory exists and is writable", "cannot create %s: %s",
                            tmp, strerror(errno));
    }
    if (st == KILN_OK) st = write_file(fd, tmp, &hdr, items, n);
    if (fd >= 0 && close(fd) != 0 && st == KILN_OK)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot close %s: %s", tmp, strerror(errno));
    if (st == KILN_OK && rename(tmp, path) != 0)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != KILN_OK && fd >= 0) unlink(tmp);
    if (st == KILN_OK) test_pause();
    if (st == KILN_OK) st = sync_dir(path);
    free(tmp);
    free(hdr.data);
    return st;
}

kiln_status kiln_safetensors_save(const char *path, kiln_module *m) {
    if (!path || !m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_safetensors_save: NULL path or module");
    kiln_named_tensor *items = NULL;
    int n = 0;
    KILN_TRY(kiln_module_state_dict(m, &items, &n));
    kiln_status st = kiln_st_write(path, items, n, NULL, 0);
    free(items);
    return st;
}

static const kiln_st_entry *find_entry(const kiln_st_index *idx, const char *name) {
    for (int i = 0; i < idx->n; i++)
        if (strcmp(idx->items[i].name, name) == 0) return &idx->items[i];
    return NULL;
}

/* Missing and unexpected names, listed (the first few of each). */
static kiln_status check_names(const char *path, const kiln_st_index *idx, const kiln_named_tensor *items, int n,
                               const char *ignore_prefix) {
    kiln_strbuf missing = {0}, extra = {0};
    int n_missing = 0, n_extra = 0;
    for (int i = 0; i < n; i++)
        if (!find_entry(idx, items[i].name) && n_missing++ < 8)
            kiln_strbuf_printf(&missing, "%s'%s'", n_missing > 1 ? ", " : "", items[i].name);
    size_t ignore_len = ignore_prefix ? strlen(ignore_prefix) : 0;
    for (int i = 0; i < idx->n; i++) {
        if (ignore_len && strncmp(idx->items[i].name, ignore_prefix, ignore_len) == 0) continue;
        bool known = false;
        for (int j = 0; j < n && !known; j++) known = strcmp(items[j].name, idx->items[i].name) == 0;
        if (!known && n_extra++ < 8)
            kiln_strbuf_printf(&extra, "%s'%s'", n_extra > 1 ? ", " : "", idx->items[i].name);
    }
    kiln_status st = KILN_OK;
    if (n_missing || n_extra)
        st = KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model spec",
                        "%s does not match the model: %d missing (%s), %d unexpected (%s)", path, n_missing,
                        n_missing ? missing.data : "none", n_extra, n_extra ? extra.data : "none");
    free(missing.data);
    free(extra.data);
    return st;
}

static kiln_status load_tensors(const char *path, const kiln_st_index *idx, const uint8_t *data, kiln_module *m,
                                const kiln_named_tensor *items, int n) {
    /* Every dtype and shape is checked before anything is copied. */
    for (int i = 0; i < n; i++) {
        const kiln_st_entry *e = find_entry(idx, items[i].name);
        kiln_shape ms = kiln_shape_of(items[i].tensor);
        bool same = ms.ndim == e->shape.ndim;
        for (int d = 0; same && d < ms.ndim; d++) same = ms.d[d] == e->shape.d[d];
        if (!same) {
            char a[96], b[96];
            return KILN_RAISE(KILN_ERR_IO, "the checkpoint was saved from a different model spec",
                              "%s: tensor '%s' has shape %s in the file but %s in the model", path, e->name,
                              kiln_shape_format(e->shape.ndim, e->shape.d, a, sizeof a),
                              kiln_shape_format(ms.ndim, ms.d, b, sizeof b));
        }
    }
    for (int i = 0; i < n; i++) {
        const kiln_st_entry *e = find_entry(idx, items[i].name);
        if (e->dtype != kiln_dtype_of(items[i].tensor))
            return KILN_RAISE(KILN_ERR_IO, NULL, "%s: tensor '%s' is %s in the file but %s in the model", path,
                              e->name, kiln_dtype_name(e->dtype), kiln_dtype_name(kiln_dtype_of(items[i].tensor)));
        kiln_tensor *t = kiln_from_data(e->shape, e->dtype, KILN_CPU, data + e->begin);
        if (!t) return kiln_error_last()->status;
        kiln_status st = kiln_module_state_set(m, items[i].name, t);
        kiln_release(t);
        if (st != KILN_OK)
            return KILN_RAISE(st, NULL, "%s: %s", path, kiln_error_message());
    }
    return KILN_OK;
}

kiln_status kiln_st_load_module(const char *path, const kiln_st_index *idx, const uint8_t *data, kiln_module *m,
                                const char *ignore_prefix) {
    kiln_named_tensor *items = NULL;
    int n = 0;
    kiln_status st = kiln_module_state_dict(m, &items, &n);
    if (st == KILN_OK) st = check_names(path, idx, items, n, ignore_prefix);
    if (st == KILN_OK) st = load_tensors(path, idx, data, m, items, n);
    free(items);
    return st;
}

kiln_status kiln_safetensors_load(const char *path, kiln_module *m) {
    if (!path || !m) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_safetensors_load: NULL path or module");
    uint8_t *bytes;
    const uint8_t *data;
    kiln_st_index idx;
    KILN_TRY(kiln_st_read(path, &bytes, &data, &idx));
    kiln_status st = kiln_st_load_module(path, &idx, data, m, NULL);
    kiln_st_index_free(&idx);
    free(bytes);
    return st;
}
