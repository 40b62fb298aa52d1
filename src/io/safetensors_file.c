/* Reading a safetensors file by name (include/kiln/io.h): the header is
 * read and validated first, from a file descriptor that stays open; a
 * tensor's bytes are read (pread) only when it is asked for. The whole-file
 * reader the module loaders use (kiln_st_read) is built on the same open. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "io/safetensors_internal.h"
#include "kiln/io.h"

struct kiln_safetensors {
    char *path;
    int fd;
    uint64_t data_start; /* file offset of the data section: 8 + header length */
    kiln_st_index idx;
    const kiln_st_entry **by_name; /* (idx.n,) the entries sorted by name, for lookups */
};

/* Read exactly n bytes at `offset`. */
static kiln_status read_at(const char *path, int fd, void *buf, size_t n, uint64_t offset) {
    char *p = buf;
    while (n) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return KILN_RAISE(KILN_ERR_IO, NULL, "cannot read %s: %s", path, strerror(errno));
        if (got == 0)
            return KILN_RAISE(
                KILN_ERR_IO, "the file changed while it was read, or is truncated",
                "cannot read %s: it ends at byte %llu, before the %zu bytes the header promised", path,
                (unsigned long long)offset, n);
        p += got, n -= (size_t)got, offset += (uint64_t)got;
    }
    return KILN_OK;
}

/* Opened read-only, refused unless a regular file. O_NONBLOCK keeps open()
 * from waiting on a FIFO's writer; it changes nothing for regular files. */
static kiln_status open_regular(const char *path, int *fd_out, uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return KILN_RAISE(KILN_ERR_IO, errno == ENOENT ? "check the path" : NULL, "cannot open %s: %s", path,
                          strerror(errno));
    struct stat sb;
    kiln_status st = KILN_OK;
    if (fstat(fd, &sb) != 0)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot stat %s: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        st = KILN_RAISE(KILN_ERR_IO, "pass the .safetensors file inside it (e.g. DIR/model.safetensors)",
                        "%s is a directory, not a safetensors file", path);
    else if (!S_ISREG(sb.st_mode))
        st = KILN_RAISE(
            KILN_ERR_IO, "copy it to a regular file first",
            "%s is not a regular file (a pipe, socket or device): a safetensors file is read by offset",
            path);
    if (st != KILN_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return KILN_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const kiln_st_entry *const *)a)->name, (*(const kiln_st_entry *const *)b)->name);
}

static kiln_status build_lookup(kiln_safetensors *f) {
    f->by_name = KILN_MALLOC((size_t)(f->idx.n ? f->idx.n : 1) * sizeof *f->by_name);
    if (!f->by_name) return KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < f->idx.n; i++) f->by_name[i] = &f->idx.items[i];
    qsort(f->by_name, (size_t)f->idx.n, sizeof *f->by_name, cmp_name);
    return KILN_OK;
}

static kiln_status read_header(kiln_safetensors *f, uint64_t size) {
    uint8_t len8[8] = {0};
    uint64_t n = 0;
    if (size >= 8) KILN_TRY(read_at(f->path, f->fd, len8, 8, 0));
    KILN_TRY(kiln_st_header_length(f->path, len8, size, &n));
    char *json = KILN_MALLOC((size_t)n + 1);
    if (!json) return KILN_ERR_OUT_OF_MEMORY;
    kiln_status st = read_at(f->path, f->fd, json, (size_t)n, 8);
    if (st == KILN_OK) st = kiln_st_header_parse(f->path, json, (size_t)n, size - 8 - n, &f->idx);
    free(json);
    f->data_start = 8 + n;
    return st;
}

kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out) {
    if (!path || !out)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "kiln_safetensors_open: NULL path or output pointer");
    *out = NULL;
    kiln_safetensors *f = KILN_MALLOC(sizeof *f);
    if (!f) return KILN_ERR_OUT_OF_MEMORY;
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "out of host memory opening %s", path);
    }
    uint64_t size = 0;
    kiln_status st = open_regular(path, &f->fd, &size);
    if (st == KILN_OK) st = read_header(f, size);
    if (st == KILN_OK) st = build_lookup(f);
    if (st != KILN_OK) {
        kiln_safetensors_close(f);
        return st;
    }
    *out = f;
    return KILN_OK;
}

void kiln_safetensors_close(kiln_safetensors *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    kiln_st_index_free(&f->idx);
    free(f->by_name);
    free(f->path);
    free(f);
}

int kiln_safetensors_tensor_count(const kiln_safetensors *f) { return f ? f->idx.n : 0; }

const char *kiln_safetensors_tensor_name(const kiln_safetensors *f, int i) {
    return f && i >= 0 && i < f->idx.n ? f->idx.items[i].name : NULL;
}

/* The entry called `name`, or an error that names it, the file, and a few
 * of the names the file does hold. */
static const kiln_st_entry *find(const kiln_safetensors *f, const char *name) {
    int lo = 0, hi = f->idx.n;
    while (name && lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    char some[256] = "";
    for (int i = 0, len = 0; i < f->idx.n && i < 4 && len < (int)sizeof some; i++)
        len += snprintf(some + len, sizeof some - (size_t)len, "%s'%s'", i ? ", " : "", f->idx.items[i].name);
    KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "list the names with kiln_safetensors_tensor_name",
               "%s has no tensor named '%s' (it holds %d: %s%s)", f->path, name ? name : "(null)", f->idx.n,
               f->idx.n ? some : "none", f->idx.n > 4 ? ", ..." : "");
    return NULL;
}

kiln_status kiln_safetensors_tensor_info(const kiln_safetensors *f, const char *name, kiln_dtype *dtype,
                                         kiln_shape *shape) {
    if (!f) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_safetensors_tensor_info: NULL handle");
    const kiln_st_entry *e = find(f, name);
    if (!e) return kiln_error_last()->status;
    if (dtype) *dtype = e->dtype;
    if (shape) *shape = e->shape;
    return KILN_OK;
}

kiln_tensor *kiln_safetensors_get(kiln_safetensors *f, const char *name, kiln_device device) {
    if (!f) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_safetensors_get: NULL handle");
        return NULL;
    }
    const kiln_st_entry *e = find(f, name);
    if (!e) return NULL;
    /* The header check bounded end - begin by the file's size. */
    size_t bytes = (size_t)(e->end - e->begin);
    void *buf = KILN_MALLOC(bytes ? bytes : 1);
    if (!buf) return NULL;
    kiln_tensor *t = NULL;
    if (read_at(f->path, f->fd, buf, bytes, f->data_start + e->begin) == KILN_OK)
        t = kiln_from_data(e->shape, e->dtype, device, buf);
    free(buf);
    return t;
}

int kiln_safetensors_metadata_count(const kiln_safetensors *f) { return f ? f->idx.n_meta : 0; }

const char *kiln_safetensors_metadata_key(const kiln_safetensors *f, int i) {
    return f && i >= 0 && i < f->idx.n_meta ? f->idx.meta[i].key : NULL;
}

const char *kiln_safetensors_metadata(const kiln_safetensors *f, const char *key) {
    return f && key ? kiln_st_meta_get(&f->idx, key) : NULL;
}

kiln_status kiln_st_read(const char *path, uint8_t **bytes, const uint8_t **data, kiln_st_index *idx) {
    *bytes = NULL;
    memset(idx, 0, sizeof *idx);
    kiln_safetensors *f = NULL;
    KILN_TRY(kiln_safetensors_open(path, &f));
    uint64_t n = f->idx.data_size;
    uint8_t *buf = KILN_MALLOC((size_t)n + 1);
    kiln_status st = buf ? read_at(path, f->fd, buf, (size_t)n, f->data_start) : KILN_ERR_OUT_OF_MEMORY;
    if (st != KILN_OK) {
        free(buf);
        kiln_safetensors_close(f);
        return st;
    }
    *idx = f->idx; /* moved out of the handle: by_name points into it */
    memset(&f->idx, 0, sizeof f->idx);
    kiln_safetensors_close(f);
    *bytes = buf;
    *data = buf;
    return KILN_OK;
}
