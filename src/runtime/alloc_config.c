/* KILN_ALLOC_CONF parsing: "key:value,key:value", PyTorch's
 * PYTORCH_CUDA_ALLOC_CONF syntax for the keys Kiln understands. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "runtime/caching_allocator.h"

#define ACCEPTED_KEYS                                                                                        \
    "backend:native|malloc, max_split_size_mb:N (N > 20), limit_mb:N, "                                      \
    "per_process_memory_fraction:F (0 < F <= 1), roundup_power2_divisions:N (a power of two)"
#define CONF_HINT "KILN_ALLOC_CONF accepts " ACCEPTED_KEYS ", separated by commas"

kiln_alloc_config kiln_alloc_config_default(void) {
    kiln_alloc_config cfg = {.caching = true, .max_split_size = UINT64_MAX};
    return cfg;
}

/* Copy text[0..n) into buf without surrounding blanks. */
static void trim_copy(const char *text, size_t n, char *buf, size_t size) {
    while (n && isspace((unsigned char)*text)) text++, n--;
    while (n && isspace((unsigned char)text[n - 1])) n--;
    if (n >= size) n = size - 1;
    memcpy(buf, text, n);
    buf[n] = '\0';
}

static bool parse_u64(const char *v, uint64_t *out) {
    if (!isdigit((unsigned char)v[0])) return false;
    errno = 0;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static kiln_status bad_value(const char *key, const char *value, const char *want) {
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, CONF_HINT,
                      "KILN_ALLOC_CONF: bad value '%s' for %s (expected %s)", value, key, want);
}

static kiln_status apply_pair(const char *key, const char *value, kiln_alloc_config *cfg) {
    const uint64_t mib = (uint64_t)1 << 20;
    uint64_t n = 0;
    if (strcmp(key, "backend") == 0) {
        if (strcmp(value, "native") == 0)
            cfg->caching = true;
        else if (strcmp(value, "malloc") == 0)
            cfg->caching = false;
        else
            return bad_value(key, value, "native or malloc");
    } else if (strcmp(key, "max_split_size_mb") == 0) {
        /* At most 20 MiB would let the 20 MiB buffers of small large
         * requests count as oversize; PyTorch refuses it too. */
        if (!parse_u64(value, &n) || n <= 20 || n > UINT64_MAX / mib)
            return bad_value(key, value, "a whole number of MiB above 20");
        cfg->max_split_size = n * mib;
    } else if (strcmp(key, "limit_mb") == 0) {
        if (!parse_u64(value, &n) || n > UINT64_MAX / mib)
            return bad_value(key, value, "a whole number of MiB, 0 for no limit");
        cfg->limit_bytes = n * mib;
    } else if (strcmp(key, "per_process_memory_fraction") == 0) {
        char *end = NULL;
        errno = 0;
        double f = strtod(value, &end);
        if (!value[0] || errno || *end || !isfinite(f) || f < 0 || f > 1)
            return bad_value(key, value, "a number in (0, 1], 0 for none");
        cfg->fraction = f;
    } else if (strcmp(key, "roundup_power2_divisions") == 0) {
        if (!parse_u64(value, &n) || n > 64 || (n & (n - 1)) != 0)
            return bad_value(key, value, "a power of two up to 64 (0 or 1: plain 512-byte rounding)");
        cfg->roundup_power2_divisions = (int)n;
    } else {
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, CONF_HINT,
                          "KILN_ALLOC_CONF: unknown key '%s' (accepted keys: backend, "
                          "max_split_size_mb, limit_mb, per_process_memory_fraction, "
                          "roundup_power2_divisions)",
                          key);
    }
    return KILN_OK;
}

kiln_status kiln_alloc_config_parse(const char *text, kiln_alloc_config *cfg) {
    if (!cfg) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_alloc_config_parse: cfg is NULL");
    if (!text) return KILN_OK;
    /* Parse into a copy so a bad setting leaves *cfg untouched. */
    kiln_alloc_config out = *cfg;
    const char *p = text;
    while (*p) {
        size_t len = strcspn(p, ",");
        char item[256], key[128], value[128];
        trim_copy(p, len, item, sizeof item);
        p += len + (p[len] == ',');
        if (!item[0]) continue;
        char *colon = strchr(item, ':');
        if (!colon)
            return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, CONF_HINT,
                              "KILN_ALLOC_CONF: '%s' has no value (write key:value)", item);
        trim_copy(item, (size_t)(colon - item), key, sizeof key);
        trim_copy(colon + 1, strlen(colon + 1), value, sizeof value);
        KILN_TRY(apply_pair(key, value, &out));
    }
    *cfg = out;
    return KILN_OK;
}
