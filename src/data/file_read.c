/* Whole-file reads and bounded gzip decompression for the dataset readers.
 *
 * Dataset files are small enough to hold whole (Fashion-MNIST's training
 * images are 47 MB decoded, CIFAR-10 180 MB), and holding them whole lets
 * every parser work on one bounded buffer. The size limits are what keep a
 * hostile file from exhausting memory: a file is refused above a limit
 * before it is read, and gzip output is refused past a limit while it is
 * produced (deflate can expand 1000-fold, so the compressed size says
 * nothing about the decoded size). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/error.h"
#include "data/readers.h"

const char *kiln_file_type_name(unsigned mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISREG(mode)) return "a regular file";
    return "not a regular file";
}

/* The hint for an errno from open or stat of a dataset path. */
static const char *open_hint(int err) {
    if (err == EACCES || err == EPERM)
        return "give this user read permission on the file and search (x) permission on its directories";
    if (err == ELOOP) return "the path runs through a symbolic link loop: point it at the real file";
    if (err == ENOTDIR) return "a part of the path is a file, not a directory: check the path";
    return "check the path, or pass the directory that holds the dataset";
}

kiln_status kiln_file_read_all(const char *path, size_t limit, uint8_t **out, size_t *out_size) {
    *out = NULL;
    *out_size = 0;
    /* O_NONBLOCK: open() of a FIFO would otherwise wait for a writer
     * forever; the type is checked below before anything is read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        return KILN_RAISE(KILN_ERR_IO, open_hint(err), "cannot open %s: %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return KILN_RAISE(KILN_ERR_IO, NULL, "cannot stat %s: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return KILN_RAISE(KILN_ERR_IO, "pass the path of a dataset file (a regular file)",
                          "%s is %s, not a regular file", path, kiln_file_type_name((unsigned)st.st_mode));
    }
    /* Reads of a regular file never block; clear the flag all the same so
     * short reads mean what they usually mean. */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    char buf[32];
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        close(fd);
        return KILN_RAISE(KILN_ERR_IO, NULL, "%s is %lld bytes, more than the %s a dataset file may hold",
                          path, (long long)st.st_size, kiln_format_bytes(limit, buf, sizeof buf));
    }
    size_t size = (size_t)st.st_size;
    /* One spare byte so an empty file still gets a buffer to own. */
    uint8_t *data = KILN_MALLOC(size + 1);
    if (!data) {
        close(fd);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = n < 0 ? errno : 0;
            close(fd);
            free(data);
            return KILN_RAISE(KILN_ERR_IO, NULL, "%s: read failed at byte %zu of %zu: %s", path, got, size,
                              err ? strerror(err) : "the file shrank while it was read");
        }
        got += (size_t)n;
    }
    close(fd);
    *out = data;
    *out_size = size;
    return KILN_OK;
}

int kiln_is_gzip(const uint8_t *bytes, size_t size) {
    return size >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

/* The error for a zlib return code, at compressed byte `at`. */
static kiln_status gunzip_error(const char *name, int ret, const z_stream *zs, size_t at) {
    if (ret == Z_MEM_ERROR)
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: zlib ran out of memory decompressing", name);
    if (ret == Z_BUF_ERROR)
        return KILN_RAISE(
            KILN_ERR_IO, "the file is truncated: download or copy it again",
            "%s: the gzip stream ends early at compressed byte %zu: expected more compressed data", name, at);
    return KILN_RAISE(KILN_ERR_IO, "the file is corrupt: download or copy it again",
                      "%s: corrupt gzip data near compressed byte %zu: %s", name, at,
                      zs->msg ? zs->msg : "invalid stream");
}

/* Grow the output buffer for another inflate call; `hard` is the most the
 * buffer may hold. */
static kiln_status gunzip_grow(uint8_t **buf, size_t *cap, size_t hard) {
    size_t next = *cap > hard / 2 ? hard : *cap * 2;
    uint8_t *grown = KILN_REALLOC(*buf, next + 1);
    if (!grown) return KILN_ERR_OUT_OF_MEMORY;
    *buf = grown;
    *cap = next;
    return KILN_OK;
}

/* The inflate loop of kiln_gunzip_memory; *buf and *produced are always
 * left describing the output so far (the caller frees *buf on error). */
static kiln_status gunzip_run(z_stream *zs, const char *name, const uint8_t *src, size_t size, size_t limit,
                              int prefix_only, uint8_t **buf, size_t *produced) {
    /* Room for one byte past the limit tells "exactly the limit" from "more". */
    size_t hard = prefix_only ? limit : limit + 1;
    /* Start at 4x the input (typical for images), then double. The +1
     * keeps a zero-byte limit from asking malloc for nothing. */
    size_t cap = size > hard / 4 ? hard : (size * 4 < 65536 ? 65536 : size * 4);
    if (cap > hard) cap = hard;
    *buf = KILN_MALLOC(cap + 1);
    if (!*buf) return KILN_ERR_OUT_OF_MEMORY;
    size_t consumed = 0;
    char lim[32];
    for (;;) {
        if (*produced == cap && cap < hard) KILN_TRY(gunzip_grow(buf, &cap, hard));
        size_t in_left = size - consumed, out_left = cap - *produced;
        zs->next_in = (Bytef *)(uintptr_t)(src + consumed); /* zlib never writes through next_in */
        zs->avail_in = in_left > UINT_MAX ? UINT_MAX : (uInt)in_left;
        zs->next_out = *buf + *produced;
        zs->avail_out = out_left > UINT_MAX ? UINT_MAX : (uInt)out_left;
        uInt in_before = zs->avail_in, out_before = zs->avail_out;
        int ret = inflate(zs, Z_NO_FLUSH);
        consumed += in_before - zs->avail_in;
        *produced += out_before - zs->avail_out;
        if (*produced == hard) {
            if (prefix_only) return KILN_OK;
            return KILN_RAISE(KILN_ERR_IO, "the file is corrupt or not what its header says",
                              "%s: decompresses to more than %s (%zu bytes): expected at most that", name,
                              kiln_format_bytes(limit, lim, sizeof lim), limit);
        }
        if (ret == Z_STREAM_END) {
            if (consumed == size) return KILN_OK;
            if (!kiln_is_gzip(src + consumed, size - consumed))
                return KILN_RAISE(KILN_ERR_IO, "the file is corrupt: download or copy it again",
                                  "%s: %zu bytes after the end of the gzip stream at compressed byte %zu: "
                                  "expected the end of the file or another gzip member (1f 8b)",
                                  name, size - consumed, consumed);
            /* `cat a.gz b.gz` is a valid gzip file: decode the next member. */
            if (inflateReset(zs) != Z_OK) return gunzip_error(name, Z_STREAM_ERROR, zs, consumed);
            continue;
        }
        if (ret == Z_OK) continue;
        /* Z_BUF_ERROR with output room left means the input ran out. */
        if (ret == Z_BUF_ERROR && *produced == cap && cap < hard) continue;
        return gunzip_error(name, ret, zs, consumed);
    }
}

kiln_status kiln_gunzip_memory(const char *name, const uint8_t *src, size_t size, size_t limit,
                               int prefix_only, uint8_t **out, size_t *out_size) {
    *out = NULL;
    *out_size = 0;
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    /* 16 + MAX_WBITS: a gzip wrapper (header and CRC checked), not raw zlib. */
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)
        return KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "%s: cannot start zlib's decoder", name);
    uint8_t *buf = NULL;
    size_t produced = 0;
    kiln_status st = gunzip_run(&zs, name, src, size, limit, prefix_only, &buf, &produced);
    inflateEnd(&zs);
    if (st != KILN_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_size = produced;
    return KILN_OK;
}
