/* kiln train's model spec: where the default one lives, reading a spec
 * file (type, size and content checked before it is parsed) and parsing a
 * spec within what a checkpoint can hold. Shared by train, eval and
 * export (train.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "train.h"

/* The default model: next to an installed binary (PREFIX/share/kiln/models),
 * else in the source tree this binary was built from. */
const char *train_default_model(const char *file, char *buf, size_t size) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        int len = snprintf(buf, size, "%s/../share/kiln/models/%s", exe, file);
        if (len > 0 && (size_t)len < size && access(buf, R_OK) == 0) return buf;
    }
#ifdef KILN_SOURCE_DIR
    int n_src = snprintf(buf, size, "%s/models/%s", KILN_SOURCE_DIR, file);
    if (n_src > 0 && (size_t)n_src < size && access(buf, R_OK) == 0) return buf;
#endif
    return NULL;
}

/* One limit of kiln_model_spec_budget: the environment variable `var`
 * where set (a count; 0: no limit), else `dflt`. 0, or 1 after a message
 * naming the variable and its value. */
static int spec_limit(const char *cmd, const char *var, int64_t dflt, int64_t *out) {
    const char *v = getenv(var);
    *out = dflt;
    if (!v || !*v) return 0;
    errno = 0;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (*end || errno || n < 0 || end == v) {
        fprintf(stderr, "kiln %s: %s='%s' is not a count: give a whole number (0: no limit), e.g. %s=%lld\n", cmd,
                var, v, var, (long long)dflt * 4);
        return 1;
    }
    *out = n;
    return 0;
}

/* The bytes of n f32 values, "1.50 GiB", into buf. */
static const char *f32_bytes(int64_t n, char *buf, size_t size) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n * 4.0;
    int u = 0;
    while (v >= 1024.0 && u < 6) v /= 1024.0, u++;
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

/* The limit that refused the spec, with the whole spec's need (counted
 * again without limits: checking builds nothing) and the way to raise it. */
static void report_limit(const char *cmd, const char *spec, const char *name, const char *ckpt, int64_t file_size,
                         bool file_bound, const kiln_model_spec_budget *b, int64_t c, int64_t h, int64_t w) {
    kiln_model_spec_budget all = {0};
    kiln_status st = kiln_model_spec_check(spec, strlen(spec), name, c, h, w, &all);
    const char *atleast = st == KILN_OK ? "" : "at least ";
    char need[32];
    if (b->max_parameters > 0 && b->parameters > b->max_parameters) {
        if (file_bound)
            fprintf(stderr,
                    "kiln %s: %s is %lld bytes, room for at most %lld parameters: the model spec stored in it was "
                    "edited or the file is damaged; pass --model FILE with the spec it was trained with\n",
                    cmd, ckpt, (long long)file_size, (long long)b->max_parameters);
        else
            fprintf(stderr,
                    "kiln %s: the model %s needs %s%lld parameters (%s as f32; training holds about 4x that "
                    "with gradients and Adam's moments), more than the limit of %lld: if the model is meant to be "
                    "this large, run with KILN_MAX_PARAMETERS=%lld (0: no limit)\n",
                    cmd, name, atleast, (long long)all.parameters, f32_bytes(all.parameters, need, sizeof need),
                    (long long)b->max_parameters, (long long)all.parameters);
    } else if (b->max_activation > 0 && b->largest_activation > b->max_activation) {
        fprintf(stderr,
                "kiln %s: the model %s has a layer output of %s%lld values per sample (%s as f32, times the "
                "batch), more than the limit of %lld: if that is meant, run with KILN_MAX_ACTIVATION=%lld "
                "(0: no limit)\n",
                cmd, name, atleast, (long long)all.largest_activation,
                f32_bytes(all.largest_activation, need, sizeof need),
                (long long)b->max_activation, (long long)all.largest_activation);
    }
}

int train_parse_spec(const char *cmd, const char *spec, const char *name, const char *ckpt, int64_t c, int64_t h,
                     int64_t w, kiln_module **m) {
    kiln_model_spec_budget b = {0};
    if (spec_limit(cmd, "KILN_MAX_PARAMETERS", KILN_MODEL_SPEC_DEFAULT_MAX_PARAMETERS, &b.max_parameters) ||
        spec_limit(cmd, "KILN_MAX_ACTIVATION", KILN_MODEL_SPEC_DEFAULT_MAX_ACTIVATION, &b.max_activation))
        return 1;
    /* A checkpoint's stored spec may not need more parameters than the
     * file can hold, two bytes each at the least (f16, bf16), whichever
     * limit is lower. */
    struct stat sb;
    bool file_bound = false;
    if (ckpt && stat(ckpt, &sb) == 0) {
        int64_t room = sb.st_size / 2 > 0 ? (int64_t)sb.st_size / 2 : 1;
        if (b.max_parameters == 0 || room < b.max_parameters) b.max_parameters = room, file_bound = true;
    }
    if (kiln_model_spec_parse_limited(spec, strlen(spec), name, c, h, w, &b, m) == KILN_OK) return 0;
    train_fail(cmd, "model");
    report_limit(cmd, spec, name, ckpt, file_bound ? (int64_t)sb.st_size : 0, file_bound, &b, c, h, w);
    return 1;
}

/* The model spec file's text, NUL-terminated (free() it), or NULL after a
 * message: the file's type and size are checked before it is read (a
 * directory, FIFO or device is named as such, more than 1 MiB refused with
 * the size), and a NUL byte, which would end the text early, is an error
 * at its line and column. */
char *train_read_text(const char *cmd, const char *path) {
    enum { SPEC_MAX = 1 << 20 };
    /* Opened non-blocking and type-checked before any read: open() of a
     * FIFO for reading would wait for a writer (a hang). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fprintf(stderr, "kiln %s: cannot read model spec %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    bool stat_ok = fstat(fd, &sb) == 0;
    FILE *f = stat_ok && S_ISREG(sb.st_mode) && fcntl(fd, F_SETFL, 0) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (!stat_ok || S_ISREG(sb.st_mode))
            fprintf(stderr, "kiln %s: cannot read model spec %s: %s\n", cmd, path, strerror(errno));
        else if (S_ISDIR(sb.st_mode))
            fprintf(stderr, "kiln %s: model spec %s is a directory: pass a spec file (models/ ships them)\n", cmd, path);
        else
            fprintf(stderr, "kiln %s: model spec %s is not a regular file (a device, pipe or socket)\n", cmd, path);
        close(fd);
        return NULL;
    }
    if (sb.st_size > SPEC_MAX) {
        fprintf(stderr, "kiln %s: model spec %s is %lld bytes, more than the 1 MiB (%d bytes) a spec may hold\n", cmd,
                path, (long long)sb.st_size, SPEC_MAX);
        fclose(f);
        return NULL;
    }
    char *text = malloc(SPEC_MAX + 2);
    size_t len = text ? fread(text, 1, SPEC_MAX + 1, f) : 0;
    bool bad = text && ferror(f);
    fclose(f);
    if (!text || bad || len > SPEC_MAX) {
        fprintf(stderr, "kiln %s: cannot read model spec %s%s\n", cmd, path,
                !text ? ": out of memory" : len > SPEC_MAX ? ": it grew past 1 MiB while it was read" : "");
        free(text);
        return NULL;
    }
    text[len] = '\0';
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        int line = 1;
        const char *bol = text;
        for (const char *p = text; p < nul; p++)
            if (*p == '\n') line++, bol = p + 1;
        fprintf(stderr, "kiln %s: model spec %s:%d: a NUL byte at column %d: a model spec is text\n", cmd, path, line,
                (int)(nul - bol) + 1);
        free(text);
        return NULL;
    }
    return text;
}
