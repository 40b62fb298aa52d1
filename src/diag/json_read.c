/* The JSON reader of json_read.h: a recursive descent parser over a
 * length-bounded buffer, building a tree of malloc'd nodes. */
#include "diag/json_read.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    const char *s, *end, *start;
    char *err;
    size_t err_size;
    bool failed;
    int lazy_depth; /* containers deeper than this stay raw; INT_MAX: none */
} parser;

static void fail(parser *p, const char *what) {
    if (p->failed) return;
    p->failed = true;
    if (p->err && p->err_size)
        snprintf(p->err, p->err_size, "%s at byte %zu", what, (size_t)(p->s - p->start));
}

static void skip_ws(parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static kiln_json *node(parser *p, kiln_json_type t) {
    kiln_json *v = calloc(1, sizeof *v);
    if (!v)
        fail(p, "out of host memory");
    else
        v->type = t;
    return v;
}

void kiln_json_free(kiln_json *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        kiln_json_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
               o[2] = (char)(0x80 | (cp & 0x3F)), 3;
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string after its opening quote; the decoded text is never longer than
 * the source. */
static char *parse_string(parser *p) {
    const char *q = p->s;
    while (q < p->end && *q != '"') q += (*q == '\\' && q + 1 < p->end) ? 2 : 1;
    if (q >= p->end) {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = malloc((size_t)(q - p->s) + 1), *o = out;
    if (!out) {
        fail(p, "out of host memory");
        return NULL;
    }
    while (p->s < q) {
        unsigned char c = (unsigned char)*p->s++;
        if (c < 0x20) {
            p->s--;
            fail(p, "control character in string");
            free(out);
            return NULL;
        }
        if (c != '\\') {
            *o++ = (char)c;
            continue;
        }
        char e = *p->s++;
        switch (e) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '/':
            *o++ = '/';
            break;
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u': {
            int cp = q - p->s >= 4 ? hex4(p->s) : -1;
            if (cp < 0) {
                fail(p, "bad \\u escape");
                free(out);
                return NULL;
            }
            p->s += 4;
            unsigned u = (unsigned)cp;
            if (u >= 0xD800 && u < 0xDC00 && q - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u') {
                int lo = hex4(p->s + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    u = 0x10000 + ((u - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
                    p->s += 6;
                }
            }
            /* 6 source bytes (12 for a pair) always cover the UTF-8 bytes. */
            o += utf8_put(o, u);
            break;
        }
        default:
            p->s--;
            fail(p, "bad escape in string");
            free(out);
            return NULL;
        }
    }
    *o = '\0';
    p->s = q + 1;
    return out;
}

static kiln_json *parse_value(parser *p, int depth);

static bool push(parser *p, kiln_json *v, kiln_json *item, char *key, size_t *cap) {
    if (v->n == *cap) {
        size_t c = *cap ? *cap * 2 : 4;
        kiln_json **items = realloc(v->items, c * sizeof *items);
        if (items) v->items = items;
        char **keys = NULL;
        if (items && v->type == KILN_JSON_OBJECT) {
            keys = realloc(v->keys, c * sizeof *keys);
            if (keys) v->keys = keys;
        }
        if (!items || (v->type == KILN_JSON_OBJECT && !keys)) {
            fail(p, "out of host memory");
            kiln_json_free(item);
            free(key);
            return false;
        }
        *cap = c;
    }
    v->items[v->n] = item;
    if (v->keys) v->keys[v->n] = key;
    v->n++;
    return true;
}

/* Skip a container, strings and brackets balanced, without building it. */
static kiln_json *skip_container(parser *p) {
    const char *from = p->s;
    char stack[KILN_JSON_MAX_DEPTH + 1];
    int top = 0;
    while (p->s < p->end) {
        char c = *p->s++;
        if (c == '"') {
            while (p->s < p->end && *p->s != '"') p->s += (*p->s == '\\' && p->s + 1 < p->end) ? 2 : 1;
            if (p->s >= p->end) break;
            p->s++;
        } else if (c == '{' || c == '[') {
            if (top > KILN_JSON_MAX_DEPTH) {
                fail(p, "nesting too deep");
                return NULL;
            }
            stack[top++] = c == '{' ? '}' : ']';
        } else if (c == '}' || c == ']') {
            if (top == 0 || stack[top - 1] != c) {
                p->s--;
                fail(p, "unbalanced bracket");
                return NULL;
            }
            if (--top == 0) {
                kiln_json *v = node(p, KILN_JSON_RAW);
                if (v) v->raw = from, v->raw_len = (size_t)(p->s - from);
                return v;
            }
        }
    }
    fail(p, "unexpected end of input");
    return NULL;
}

static kiln_json *parse_container(parser *p, int depth, bool object) {
    if (depth > p->lazy_depth) return skip_container(p);
    char close = object ? '}' : ']';
    kiln_json *v = node(p, object ? KILN_JSON_OBJECT : KILN_JSON_ARRAY);
    if (!v) return NULL;
    size_t cap = 0;
    p->s++; /* the opening bracket */
    skip_ws(p);
    if (p->s < p->end && *p->s == close) {
        p->s++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(p);
        if (object) {
            if (p->s >= p->end || *p->s != '"') {
                fail(p, "expected a member name");
                break;
            }
            p->s++;
            key = parse_string(p);
            if (!key) break;
            skip_ws(p);
            if (p->s >= p->end || *p->s != ':') {
                free(key);
                fail(p, "expected ':'");
                break;
            }
            p->s++;
        }
        kiln_json *item = parse_value(p, depth + 1);
        if (!item) {
            free(key);
            break;
        }
        if (!push(p, v, item, key, &cap)) break;
        skip_ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (p->s < p->end && *p->s == close) {
            p->s++;
            return v;
        }
        fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
    }
    kiln_json_free(v);
    return NULL;
}

static kiln_json *parse_number(parser *p) {
    const char *q = p->s;
    bool integer = true;
    if (q < p->end && *q == '-') q++;
    if (q >= p->end || !(*q >= '0' && *q <= '9')) {
        fail(p, "unexpected character");
        return NULL;
    }
    if (*q == '0')
        q++;
    else
        while (q < p->end && *q >= '0' && *q <= '9') q++;
    if (q < p->end && *q == '.') {
        integer = false;
        q++;
        if (q >= p->end || !(*q >= '0' && *q <= '9')) {
            p->s = q;
            fail(p, "digits expected after '.'");
            return NULL;
        }
        while (q < p->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < p->end && (*q == 'e' || *q == 'E')) {
        integer = false;
        q++;
        if (q < p->end && (*q == '+' || *q == '-')) q++;
        if (q >= p->end || !(*q >= '0' && *q <= '9')) {
            p->s = q;
            fail(p, "digits expected in exponent");
            return NULL;
        }
        while (q < p->end && *q >= '0' && *q <= '9') q++;
    }
    char tmp[64];
    size_t n = (size_t)(q - p->s);
    kiln_json *v = node(p, KILN_JSON_NUMBER);
    if (!v) return NULL;
    if (n < sizeof tmp) {
        memcpy(tmp, p->s, n);
        tmp[n] = '\0';
        v->number = strtod(tmp, NULL);
        if (integer) {
            errno = 0;
            long long i = strtoll(tmp, NULL, 10);
            if (errno == 0) v->is_int = true, v->integer = i;
        }
    } else { /* absurdly long: strtod on a copy */
        char *big = malloc(n + 1);
        if (!big) {
            free(v);
            fail(p, "out of host memory");
            return NULL;
        }
        memcpy(big, p->s, n);
        big[n] = '\0';
        v->number = strtod(big, NULL);
        free(big);
    }
    p->s = q;
    return v;
}

static bool literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) >= n && !memcmp(p->s, word, n)) {
        p->s += n;
        return true;
    }
    return false;
}

static kiln_json *parse_value(parser *p, int depth) {
    skip_ws(p);
    if (p->s >= p->end) {
        fail(p, "unexpected end of input");
        return NULL;
    }
    char c = *p->s;
    if (c == '{' || c == '[') {
        if (depth >= KILN_JSON_MAX_DEPTH) { /* the root container is level 1 */
            fail(p, "nesting too deep");
            return NULL;
        }
        return parse_container(p, depth, c == '{');
    }
    if (c == '"') {
        p->s++;
        char *s = parse_string(p);
        if (!s) return NULL;
        kiln_json *v = node(p, KILN_JSON_STRING);
        if (!v)
            free(s);
        else
            v->string = s;
        return v;
    }
    kiln_json *v = NULL;
    if (literal(p, "true") || literal(p, "false")) {
        v = node(p, KILN_JSON_BOOL);
        if (v) v->boolean = p->s[-1] == 'e' && p->s[-2] == 'u';
        return v;
    }
    if (literal(p, "null")) return node(p, KILN_JSON_NULL);
    return parse_number(p);
}

kiln_json *kiln_json_parse(const char *text, size_t len, char *err, size_t err_size) {
    return kiln_json_parse_lazy(text, len, INT_MAX, err, err_size);
}

bool kiln_json_expand(kiln_json *v, char *err, size_t err_size) {
    if (!v || v->type != KILN_JSON_RAW) return true;
    kiln_json *full = kiln_json_parse(v->raw, v->raw_len, err, err_size);
    if (!full) return false;
    *v = *full;
    free(full);
    return true;
}

kiln_json *kiln_json_parse_lazy(const char *text, size_t len, int depth, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!text) {
        if (err && err_size) snprintf(err, err_size, "no text");
        return NULL;
    }
    parser p = {
        .s = text, .end = text + len, .start = text, .err = err, .err_size = err_size, .lazy_depth = depth};
    kiln_json *v = parse_value(&p, 0);
    if (v) {
        skip_ws(&p);
        if (p.s != p.end) {
            fail(&p, "text after the value");
            kiln_json_free(v);
            v = NULL;
        }
    }
    return v;
}

const kiln_json *kiln_json_get(const kiln_json *obj, const char *key) {
    if (!obj || obj->type != KILN_JSON_OBJECT || !key) return NULL;
    for (size_t i = obj->n; i-- > 0;)
        if (!strcmp(obj->keys[i], key)) return obj->items[i];
    return NULL;
}

const kiln_json *kiln_json_at(const kiln_json *arr, size_t i) {
    if (!arr || arr->type != KILN_JSON_ARRAY || i >= arr->n) return NULL;
    return arr->items[i];
}

bool kiln_json_number(const kiln_json *v, double *out) {
    if (!v || v->type != KILN_JSON_NUMBER || !isfinite(v->number)) return false;
    *out = v->number;
    return true;
}

int64_t kiln_json_int(const kiln_json *v, int64_t fallback) {
    if (!v || v->type != KILN_JSON_NUMBER) return fallback;
    if (v->is_int) return v->integer;
    if (!(v->number >= -9.2e18 && v->number <= 9.2e18)) return fallback;
    return (int64_t)v->number;
}

const char *kiln_json_string(const kiln_json *v, const char *fallback) {
    return v && v->type == KILN_JSON_STRING ? v->string : fallback;
}

const kiln_json *kiln_json_path(const kiln_json *v, ...) {
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
            char *b = realloc(buf, cap * 2);
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
    bool err = ferror(f);
    fclose(f);
    if (!buf) return NULL;
    if (err) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}
