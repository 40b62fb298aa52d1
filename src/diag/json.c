/* The cJSON helpers of json.h. The cursor tokenises only the structure
 * between values (white space, brackets, ',' and ':'); strings, numbers and
 * whole values are cJSON's, through cJSON_ParseWithLengthOpts, which stops
 * after one value and says where. */
#include "diag/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && is_ws(*s)) s++;
    return s;
}

size_t kiln_json_control_byte(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] < 0x20 && !is_ws(text[i])) return i;
    return len;
}

cJSON *kiln_json_parse(const char *text, size_t len, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!text) {
        if (err && err_size) snprintf(err, err_size, "no text");
        return NULL;
    }
    size_t bad = kiln_json_control_byte(text, len);
    if (bad < len) {
        if (err && err_size)
            snprintf(err, err_size, "control byte 0x%02x at byte %zu", (unsigned)(unsigned char)text[bad],
                     bad);
        return NULL;
    }
    const char *stop = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text, len, &stop, false);
    if (!v) {
        /* cJSON cannot tell running out of memory from bad text. */
        if (err && err_size)
            snprintf(err, err_size, "not valid JSON at byte %zu", stop ? (size_t)(stop - text) : (size_t)0);
        return NULL;
    }
    const char *rest = skip_ws(stop, text + len);
    if (rest != text + len) {
        if (err && err_size)
            snprintf(err, err_size, "text after the value at byte %zu", (size_t)(rest - text));
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

const cJSON *kiln_json_get(const cJSON *obj, const char *key) {
    return cJSON_IsObject(obj) && key ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

const cJSON *kiln_json_at(const cJSON *arr, int i) {
    return cJSON_IsArray(arr) ? cJSON_GetArrayItem(arr, i) : NULL;
}

bool kiln_json_number(const cJSON *v, double *out) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return false;
    *out = v->valuedouble;
    return true;
}

int64_t kiln_json_int(const cJSON *v, int64_t fallback) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -9.2e18 && v->valuedouble <= 9.2e18)) return fallback;
    return (int64_t)v->valuedouble;
}

const char *kiln_json_string(const cJSON *v, const char *fallback) {
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : fallback;
}

const cJSON *kiln_json_path(const cJSON *v, ...) {
    va_list ap;
    va_start(ap, v);
    for (const char *k = va_arg(ap, const char *); k && v; k = va_arg(ap, const char *))
        v = kiln_json_get(v, k);
    va_end(ap);
    return v;
}

char *kiln_json_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *b = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!b) {
                free(buf);
                buf = NULL;
                errno = ENOMEM;
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (!buf) return NULL;
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* ---- The cursor ---------------------------------------------------------------------- */

static bool fail_at(kiln_json_cursor *c, const char *at) {
    if (!c->failed) c->failed = true, c->err_at = (size_t)(at - c->start);
    return false;
}

void kiln_json_cursor_init(kiln_json_cursor *c, const char *text, size_t len) {
    memset(c, 0, sizeof *c);
    c->s = c->start = text;
    c->end = text + len;
}

bool kiln_json_cursor_enter(kiln_json_cursor *c, char open) {
    if (c->failed) return false;
    const char *s = skip_ws(c->s, c->end);
    if (s >= c->end || *s != open || (open != '[' && open != '{')) return false;
    if (c->depth == KILN_JSON_CURSOR_DEPTH) return fail_at(c, s);
    c->close[c->depth] = open == '[' ? ']' : '}';
    c->first[c->depth] = true;
    c->depth++;
    c->s = s + 1;
    return true;
}

bool kiln_json_cursor_next(kiln_json_cursor *c) {
    cJSON_Delete(c->key);
    c->key = NULL;
    if (c->failed || c->depth == 0) return false;
    int d = c->depth - 1;
    const char *s = skip_ws(c->s, c->end);
    if (s < c->end && *s == c->close[d]) { /* also "[]" and "{}" */
        c->depth--;
        c->s = s + 1;
        return false;
    }
    if (!c->first[d]) {
        if (s >= c->end || *s != ',') return fail_at(c, s);
        s = skip_ws(s + 1, c->end);
    }
    c->first[d] = false;
    if (c->close[d] == '}') { /* "name": */
        const char *stop = NULL;
        c->key = cJSON_ParseWithLengthOpts(s, (size_t)(c->end - s), &stop, false);
        if (!cJSON_IsString(c->key)) return fail_at(c, c->key ? s : stop ? stop : s);
        s = skip_ws(stop, c->end);
        if (s >= c->end || *s != ':') return fail_at(c, s);
        s++;
    }
    c->s = s;
    return true;
}

const char *kiln_json_cursor_key(const kiln_json_cursor *c) { return c->key ? c->key->valuestring : ""; }

cJSON *kiln_json_cursor_value(kiln_json_cursor *c) {
    if (c->failed) return NULL;
    const char *s = skip_ws(c->s, c->end), *stop = NULL;
    cJSON *v = s < c->end ? cJSON_ParseWithLengthOpts(s, (size_t)(c->end - s), &stop, false) : NULL;
    if (!v) {
        fail_at(c, stop ? stop : s);
        return NULL;
    }
    c->s = stop;
    return v;
}

bool kiln_json_cursor_at_end(kiln_json_cursor *c) {
    if (c->failed || c->depth) return false;
    const char *s = skip_ws(c->s, c->end);
    return s == c->end || fail_at(c, s);
}

void kiln_json_cursor_free(kiln_json_cursor *c) {
    cJSON_Delete(c->key);
    c->key = NULL;
}
