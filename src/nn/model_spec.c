/* The plain-text model spec: one layer per line, parsed into a Sequential
 * whose in-channels and in-features are inferred from the input shape, line
 * by line. The grammar is in include/kiln/nn.h (kiln_model_spec_parse).
 *
 * The parser walks the text once. Each layer line becomes one child of the
 * innermost open Sequential; `residual {` opens a new one (the block's
 * body), and the matching `}` closes it into a kiln_nn_residual whose
 * shortcut is decided only then, when the body's output shape is known. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/checked.h"
#include "base/error.h"
#include "kiln/nn.h"

#define SPEC_MAX_TOKENS 8
#define SPEC_MAX_DEPTH 16
#define SPEC_LINE_MAX 256

/* The activation shape between layers: (c, h, w) for images, (c) alone
 * (features) once flattened. */
typedef struct spec_shape {
    bool flat;
    int64_t c, h, w;
} spec_shape;

/* The layer that produced the current shape, for mismatch messages. */
typedef struct spec_origin {
    int line;
    char text[SPEC_LINE_MAX];
} spec_origin;

/* One open Sequential: the top level or a residual body. */
typedef struct spec_frame {
    kiln_module *seq; /* NULL when only checking (kiln_model_spec_check) */
    spec_shape in;    /* shape entering the block */
    int open_line;    /* line of `residual {` (0 for the top level) */
    int layers;       /* the block's layers so far */
} spec_frame;

typedef struct spec_parser {
    const char *name; /* file name for messages */
    int line;
    char text[SPEC_LINE_MAX]; /* the current line, trimmed */
    int ntok;
    char *tok[SPEC_MAX_TOKENS];
    spec_shape shape;
    spec_origin origin;
    spec_frame stack[SPEC_MAX_DEPTH];
    int depth;
    int layers;  /* in the whole spec, residual blocks and their bodies included */
    bool build;  /* false: check only, no module is made (kiln_model_spec_check) */
    kiln_model_spec_budget budget; /* the caller's limits; the counts so far (saturating) */
} spec_parser;

static const char *shape_str(spec_shape s, char *buf, size_t size) {
    if (s.flat) snprintf(buf, size, "(%lld features)", (long long)s.c);
    else snprintf(buf, size, "(%lld, %lld, %lld)", (long long)s.c, (long long)s.h, (long long)s.w);
    return buf;
}

static kiln_status spec_error(const spec_parser *p, const char *expected, const char *what) {
    if (expected)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s:%d: %s in '%s'; expected: %s", p->name, p->line, what,
                          p->text, expected);
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s:%d: %s", p->name, p->line, what);
}

/* `line L 'text' needs X but line M 'text' gives SHAPE`. */
static kiln_status spec_mismatch(const spec_parser *p, const char *needs) {
    char sb[96];
    shape_str(p->shape, sb, sizeof sb);
    if (p->origin.line == 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s:%d: '%s' needs %s but the model input is %s", p->name,
                          p->line, p->text, needs, sb);
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s:%d: '%s' needs %s but line %d '%s' gives %s", p->name,
                      p->line, p->text, needs, p->origin.line, p->origin.text, sb);
}

/* A positive integer, optionally after a one-letter prefix ("k3", "p1"). */
static bool parse_int(const char *s, const char *prefix, int64_t min, int64_t *out) {
    size_t n = prefix ? strlen(prefix) : 0;
    if (n && strncmp(s, prefix, n) != 0) return false;
    s += n;
    if (!isdigit((unsigned char)*s)) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < min || v > (1LL << 30)) return false;
    *out = v;
    return true;
}

/* a * b and a + b, or INT64_MAX where they would not fit (src/base/checked.h). */
#define sat_mul kiln_sat_mul_i64
#define sat_add kiln_sat_add_i64

/* The bytes of n f32 values, "1.50 GiB", for messages. */
typedef struct f32_size {
    char s[32];
} f32_size;

static f32_size size_f32(int64_t n) {
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)n * 4.0;
    int u = 0;
    while (v >= 1024.0 && u < 6) v /= 1024.0, u++;
    f32_size r;
    snprintf(r.s, sizeof r.s, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
    return r;
}

/* The layer on this line adds n parameters: refused, before anything of it
 * is allocated, where that takes the model past the caller's limit. */
static kiln_status count_params(spec_parser *p, int64_t n) {
    kiln_model_spec_budget *b = &p->budget;
    int64_t total = sat_add(b->parameters, n);
    b->parameters = total; /* past the limit on failure: the caller can tell which limit it was */
    if (b->max_parameters > 0 && total > b->max_parameters)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "make the layer smaller or raise the limit",
                          "%s:%d: '%s' adds %lld parameters, taking the model to %lld, above the limit of %lld "
                          "(%s of f32 weights against %s)",
                          p->name, p->line, p->text, (long long)n, (long long)total, (long long)b->max_parameters,
                          size_f32(total).s, size_f32(b->max_parameters).s);
    return KILN_OK;
}

/* The values of one sample of shape s, checked against the caller's limit
 * before the layer that gives it is built. */
static kiln_status count_activation(spec_parser *p, spec_shape s) {
    kiln_model_spec_budget *b = &p->budget;
    int64_t n = s.flat ? s.c : sat_mul(sat_mul(s.c, s.h), s.w);
    if (n > b->largest_activation) b->largest_activation = n;
    if (b->max_activation > 0 && n > b->max_activation) {
        char buf[96];
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "make the layer's output smaller or raise the limit",
                          "%s:%d: '%s' gives %s, %lld values per sample, above the limit of %lld (%s of f32 per "
                          "sample against %s)",
                          p->name, p->line, p->text, shape_str(s, buf, sizeof buf), (long long)n,
                          (long long)b->max_activation, size_f32(n).s, size_f32(b->max_activation).s);
    }
    return KILN_OK;
}

/* Layers with parameters count them (count_params) before they are built;
 * the output's size is checked here, after: building costs no more than
 * the parameters. When only checking, m is NULL and nothing is built. */
static kiln_status append(spec_parser *p, kiln_module *m, spec_shape next) {
    if (p->build && !m) return KILN_ERR_INVALID_ARGUMENT; /* the constructor's error stands */
    kiln_status st = count_activation(p, next);
    if (st == KILN_OK && p->layers == KILN_MODEL_SPEC_MAX_LAYERS)
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT,
                        "a spec is a model a person wrote: is this the right file? (ResNet-1202 is about 4,800 "
                        "layers)",
                        "%s:%d: '%s' is layer %d, past the %d layers a model spec may hold", p->name, p->line, p->text,
                        p->layers + 1, KILN_MODEL_SPEC_MAX_LAYERS);
    if (st != KILN_OK) {
        kiln_module_free(m);
        return st;
    }
    if (p->build) KILN_TRY(kiln_nn_sequential_append(p->stack[p->depth - 1].seq, m));
    p->layers++;
    p->stack[p->depth - 1].layers++;
    p->shape = next;
    p->origin.line = p->line;
    snprintf(p->origin.text, sizeof p->origin.text, "%s", p->text);
    return KILN_OK;
}

static kiln_status need_image(spec_parser *p) {
    return p->shape.flat ? spec_mismatch(p, "an image input (C, H, W); remove the flatten before it") : KILN_OK;
}

/* Output size of a window of k with padding and stride over n. */
static kiln_status window_out(spec_parser *p, int64_t k, int64_t pad, int64_t stride, spec_shape *s) {
    int64_t h = (p->shape.h + 2 * pad - k) / stride + 1, w = (p->shape.w + 2 * pad - k) / stride + 1;
    if (p->shape.h + 2 * pad < k || p->shape.w + 2 * pad < k || h < 1 || w < 1) {
        char buf[64];
        snprintf(buf, sizeof buf, "an image of at least %lldx%lld (with padding)", (long long)k, (long long)k);
        return spec_mismatch(p, buf);
    }
    *s = p->shape;
    s->h = h;
    s->w = w;
    return KILN_OK;
}

static kiln_status layer_conv(spec_parser *p) {
    static const char form[] = "conv OUT kK [pP] [sS] [nobias], e.g. 'conv 32 k3 p1'";
    int64_t out = 0, k = 0, pad = 0, stride = 1;
    bool bias = true;
    if (p->ntok < 3 || !parse_int(p->tok[1], NULL, 1, &out)) return spec_error(p, form, "bad arguments");
    for (int i = 2; i < p->ntok; i++) {
        const char *t = p->tok[i];
        bool ok = (t[0] == 'k' && parse_int(t, "k", 1, &k)) || (t[0] == 'p' && parse_int(t, "p", 0, &pad)) ||
                  (t[0] == 's' && parse_int(t, "s", 1, &stride));
        if (strcmp(t, "nobias") == 0) bias = false, ok = true;
        if (!ok) return spec_error(p, form, "bad argument");
    }
    if (k == 0) return spec_error(p, form, "missing kernel size");
    KILN_TRY(need_image(p));
    spec_shape s = p->shape;
    KILN_TRY(window_out(p, k, pad, stride, &s));
    s.c = out;
    KILN_TRY(count_params(p, sat_add(sat_mul(sat_mul(p->shape.c, out), sat_mul(k, k)), bias ? out : 0)));
    return append(p, p->build ? kiln_nn_conv2d(p->shape.c, out, k, stride, pad, 1, 1, bias) : NULL, s);
}

static kiln_status layer_pool(spec_parser *p, bool max) {
    const char *form = max ? "maxpool K [sS] [pP], e.g. 'maxpool 2'" : "avgpool K [sS] [pP], e.g. 'avgpool 2'";
    int64_t k = 0, stride = 0, pad = 0;
    if (p->ntok < 2 || !parse_int(p->tok[1], NULL, 1, &k)) return spec_error(p, form, "bad arguments");
    for (int i = 2; i < p->ntok; i++) {
        const char *t = p->tok[i];
        if (!((t[0] == 's' && parse_int(t, "s", 1, &stride)) || (t[0] == 'p' && parse_int(t, "p", 0, &pad))))
            return spec_error(p, form, "bad argument");
    }
    /* The layer's own rule (PyTorch's): checked here so that the error
     * names the line, and so that checking alone refuses it too. */
    if (2 * pad > k) return spec_error(p, form, "padding more than half the kernel");
    KILN_TRY(need_image(p));
    spec_shape s = p->shape;
    KILN_TRY(window_out(p, k, pad, stride ? stride : k, &s));
    if (!p->build) return append(p, NULL, s);
    return append(p, max ? kiln_nn_max_pool2d(k, stride, pad) : kiln_nn_avg_pool2d(k, stride, pad), s);
}

static kiln_status layer_adaptive(spec_parser *p) {
    static const char form[] = "adaptiveavgpool N, e.g. 'adaptiveavgpool 1'";
    int64_t n = 0;
    if (p->ntok != 2 || !parse_int(p->tok[1], NULL, 1, &n)) return spec_error(p, form, "bad arguments");
    KILN_TRY(need_image(p));
    spec_shape s = p->shape;
    s.h = s.w = n;
    return append(p, p->build ? kiln_nn_adaptive_avg_pool2d(n, n) : NULL, s);
}

static kiln_status layer_linear(spec_parser *p) {
    static const char form[] = "linear OUT [nobias], e.g. 'linear 512'";
    int64_t out = 0;
    bool bias = true;
    if (p->ntok < 2 || p->ntok > 3 || !parse_int(p->tok[1], NULL, 1, &out)) return spec_error(p, form, "bad arguments");
    if (p->ntok == 3) {
        if (strcmp(p->tok[2], "nobias") != 0) return spec_error(p, form, "bad argument");
        bias = false;
    }
    if (!p->shape.flat) return spec_mismatch(p, "flat features (N, F); add 'flatten' before it");
    spec_shape s = {.flat = true, .c = out};
    KILN_TRY(count_params(p, sat_add(sat_mul(p->shape.c, out), bias ? out : 0)));
    return append(p, p->build ? kiln_nn_linear(p->shape.c, out, bias) : NULL, s);
}

static kiln_status layer_dropout(spec_parser *p) {
    static const char form[] = "dropout P with 0 <= P < 1, e.g. 'dropout 0.1'";
    if (p->ntok != 2) return spec_error(p, form, "bad arguments");
    errno = 0;
    char *end;
    double prob = strtod(p->tok[1], &end);
    if (*end || errno || !(prob >= 0.0 && prob < 1.0)) return spec_error(p, form, "bad probability");
    return append(p, p->build ? kiln_nn_dropout(prob) : NULL, p->shape);
}

static kiln_status layer_plain(spec_parser *p, const char *form, kiln_module *m, spec_shape s) {
    if (p->ntok != 1) {
        kiln_module_free(m);
        return spec_error(p, form, "unexpected arguments");
    }
    return append(p, m, s);
}

static kiln_status residual_open(spec_parser *p) {
    if (p->ntok != 2 || strcmp(p->tok[1], "{") != 0)
        return spec_error(p, "'residual {' on its own line, the body, then '}'", "bad residual block");
    KILN_TRY(need_image(p));
    if (p->depth == SPEC_MAX_DEPTH) return spec_error(p, NULL, "residual blocks nested too deeply");
    kiln_module *seq = p->build ? kiln_nn_sequential(0, NULL) : NULL;
    if (p->build && !seq) return KILN_ERR_OUT_OF_MEMORY;
    p->stack[p->depth++] = (spec_frame){.seq = seq, .in = p->shape, .open_line = p->line};
    return KILN_OK;
}

/* The shortcut that takes the block's input shape to its output shape:
 * identity when they agree, else a 1x1 conv (no bias) with the stride the
 * spatial sizes imply, then BatchNorm: PyTorch's ResNet downsample. */
static kiln_status make_shortcut(spec_parser *p, spec_shape in, spec_shape out, kiln_module **sc) {
    *sc = NULL;
    char a[96], b[96];
    if (out.flat)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "%s:%d: the residual block opened at line %d must end in an image shape, but its body "
                          "gives %s",
                          p->name, p->line, p->stack[p->depth - 1].open_line, shape_str(out, a, sizeof a));
    if (in.c == out.c && in.h == out.h && in.w == out.w) return KILN_OK;
    int64_t stride = out.h ? in.h / out.h : 0;
    if (stride < 1 || (in.h - 1) / stride + 1 != out.h || (in.w - 1) / stride + 1 != out.w)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL,
                          "%s:%d: the residual block opened at line %d takes %s to %s: no 1x1 strided shortcut "
                          "fits (keep the spatial size or divide it by an integer stride)",
                          p->name, p->line, p->stack[p->depth - 1].open_line, shape_str(in, a, sizeof a),
                          shape_str(out, b, sizeof b));
    KILN_TRY(count_params(p, sat_add(sat_mul(in.c, out.c), 2 * out.c))); /* 1x1 conv, BatchNorm's weight and bias */
    if (!p->build) return KILN_OK;
    kiln_module *parts[2] = {kiln_nn_conv2d(in.c, out.c, 1, stride, 0, 1, 1, false),
                             kiln_nn_batch_norm2d(out.c, 1e-5, 0.1, true, true)};
    if (!parts[0] || !parts[1]) {
        kiln_module_free(parts[0]);
        kiln_module_free(parts[1]);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    *sc = kiln_nn_sequential(2, parts);
    return *sc ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
}

static kiln_status residual_close(spec_parser *p) {
    if (p->ntok != 1) return spec_error(p, "'}' alone on its line", "unexpected text after '}'");
    if (p->depth == 1) return spec_error(p, NULL, "'}' without an open 'residual {'");
    spec_frame f = p->stack[p->depth - 1];
    if (f.layers == 0) return spec_error(p, NULL, "empty residual block");
    kiln_module *sc;
    KILN_TRY(make_shortcut(p, f.in, p->shape, &sc));
    p->depth--;
    return append(p, p->build ? kiln_nn_residual(f.seq, sc) : NULL, p->shape);
}

static kiln_status parse_layer(spec_parser *p) {
    const char *op = p->tok[0];
    spec_shape s = p->shape;
    if (strcmp(op, "conv") == 0) return layer_conv(p);
    if (strcmp(op, "maxpool") == 0) return layer_pool(p, true);
    if (strcmp(op, "avgpool") == 0) return layer_pool(p, false);
    if (strcmp(op, "adaptiveavgpool") == 0) return layer_adaptive(p);
    if (strcmp(op, "linear") == 0) return layer_linear(p);
    if (strcmp(op, "dropout") == 0) return layer_dropout(p);
    if (strcmp(op, "residual") == 0) return residual_open(p);
    if (strcmp(op, "}") == 0) return residual_close(p);
    bool b = p->build;
    if (strcmp(op, "relu") == 0) return layer_plain(p, "relu", b ? kiln_nn_relu() : NULL, s);
    if (strcmp(op, "gelu") == 0) return layer_plain(p, "gelu", b ? kiln_nn_gelu(false) : NULL, s);
    if (strcmp(op, "flatten") == 0) {
        spec_shape f = {.flat = true, .c = s.flat ? s.c : sat_mul(sat_mul(s.c, s.h), s.w)};
        return layer_plain(p, "flatten", b ? kiln_nn_flatten(1, -1) : NULL, f);
    }
    if (strcmp(op, "batchnorm") == 0) {
        if (p->ntok != 1) return spec_error(p, "batchnorm", "unexpected arguments");
        if (s.flat) return spec_mismatch(p, "an image input (C, H, W) (batchnorm is BatchNorm2d)");
        KILN_TRY(count_params(p, sat_mul(2, s.c)));
        return append(p, b ? kiln_nn_batch_norm2d(s.c, 1e-5, 0.1, true, true) : NULL, s);
    }
    return spec_error(p,
                      "one of conv, relu, gelu, maxpool, avgpool, adaptiveavgpool, flatten, linear, dropout, "
                      "batchnorm, residual {",
                      "unknown layer");
}

/* Copy line `src` (len bytes) into p->text without its comment and outer
 * blanks, and split it into tokens. False when the line is too long. */
static bool split_line(spec_parser *p, const char *src, size_t len) {
    const char *hash = memchr(src, '#', len);
    if (hash) len = (size_t)(hash - src);
    while (len && isspace((unsigned char)src[len - 1])) len--;
    while (len && isspace((unsigned char)*src)) src++, len--;
    if (len >= sizeof p->text) return false;
    memcpy(p->text, src, len);
    p->text[len] = '\0';
    return true;
}

static int tokenize(char *s, char **tok, int max) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, " \t\r\v\f", &save); t; t = strtok_r(NULL, " \t\r\v\f", &save)) {
        if (n == max) return max + 1;
        tok[n++] = t;
    }
    return n;
}

static kiln_status parse_line(spec_parser *p, const char *src, size_t len) {
    if (memchr(src, '\0', len)) return spec_error(p, NULL, "a NUL byte in the text");
    if (!split_line(p, src, len)) return spec_error(p, NULL, "line too long (at most 255 characters)");
    if (!p->text[0]) return KILN_OK;
    char work[SPEC_LINE_MAX];
    memcpy(work, p->text, sizeof work);
    p->ntok = tokenize(work, p->tok, SPEC_MAX_TOKENS);
    if (p->ntok > SPEC_MAX_TOKENS) return spec_error(p, NULL, "too many words on one line");
    return parse_layer(p);
}

/* Parse, building the Sequential into *out when out is not NULL, else
 * only checking (kiln_model_spec_check). */
static kiln_status spec_run(const char *text, size_t size, const char *name, int64_t channels, int64_t height,
                            int64_t width, kiln_model_spec_budget *budget, kiln_module **out) {
    if (!text) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_model_spec_parse: text is NULL");
    if (!name) name = "<model spec>";
    if (budget && (budget->max_parameters < 0 || budget->max_activation < 0))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass 0 for no limit",
                          "%s: the budget's max_parameters (%lld) or max_activation (%lld) is negative", name,
                          (long long)budget->max_parameters, (long long)budget->max_activation);
    /* Bounded like every number in a spec (2^30), so the shape arithmetic
     * below (h + 2 * pad - k, c * h * w saturating) cannot overflow. */
    if (channels < 1 || height < 1 || width < 1 || channels > (1LL << 30) || height > (1LL << 30) ||
        width > (1LL << 30))
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give the dataset's sample shape",
                          "%s: input shape (%lld, %lld, %lld): each size must be 1..%lld", name,
                          (long long)channels, (long long)height, (long long)width, 1LL << 30);
    spec_parser *p = KILN_CALLOC(1, sizeof *p);
    if (!p) return KILN_ERR_OUT_OF_MEMORY;
    p->name = name;
    p->build = out != NULL;
    if (budget) p->budget.max_parameters = budget->max_parameters, p->budget.max_activation = budget->max_activation;
    p->shape = (spec_shape){.c = channels, .h = height, .w = width};
    p->stack[0] = (spec_frame){.seq = p->build ? kiln_nn_sequential(0, NULL) : NULL, .in = p->shape};
    p->depth = 1;
    kiln_status st = p->stack[0].seq || !p->build ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    size_t pos = 0;
    while (st == KILN_OK && pos < size) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - (text + pos)) : size - pos;
        p->line++;
        /* A NUL would end the line's text early and drop the rest unseen. */
        const char *nul = memchr(text + pos, '\0', len);
        if (nul) {
            st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "a model spec is text: is this the right file?",
                            "%s:%d: a NUL byte at column %zu", name, p->line, (size_t)(nul - (text + pos)) + 1);
            break;
        }
        st = parse_line(p, text + pos, len);
        pos += len + 1;
    }
    if (st == KILN_OK && p->depth > 1)
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "close it with '}' on its own line",
                        "%s:%d: 'residual {' is never closed", name, p->stack[p->depth - 1].open_line);
    if (st == KILN_OK && p->stack[0].layers == 0)
        st = KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "one layer per line, e.g. 'conv 32 k3 p1'",
                        "%s: the model spec has no layers", name);
    if (budget) budget->parameters = p->budget.parameters, budget->largest_activation = p->budget.largest_activation;
    if (st == KILN_OK && out) *out = p->stack[0].seq;
    else
        for (int i = p->depth - 1; i >= 0; i--) kiln_module_free(p->stack[i].seq);
    free(p);
    return st;
}

kiln_status kiln_model_spec_parse_limited(const char *text, size_t size, const char *name, int64_t channels,
                                          int64_t height, int64_t width, kiln_model_spec_budget *budget,
                                          kiln_module **out) {
    if (!out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass kiln_model_spec_check to check without building",
                                "kiln_model_spec_parse: out is NULL");
    *out = NULL;
    return spec_run(text, size, name, channels, height, width, budget, out);
}

kiln_status kiln_model_spec_check(const char *text, size_t size, const char *name, int64_t channels, int64_t height,
                                  int64_t width, kiln_model_spec_budget *budget) {
    return spec_run(text, size, name, channels, height, width, budget, NULL);
}

kiln_status kiln_model_spec_parse_n(const char *text, size_t size, const char *name, int64_t channels, int64_t height,
                                    int64_t width, kiln_module **out) {
    return kiln_model_spec_parse_limited(text, size, name, channels, height, width, NULL, out);
}

kiln_status kiln_model_spec_parse(const char *text, const char *name, int64_t channels, int64_t height, int64_t width,
                                  kiln_module **out) {
    return kiln_model_spec_parse_n(text, text ? strlen(text) : 0, name, channels, height, width, out);
}

kiln_status kiln_model_spec_load(const char *path, int64_t channels, int64_t height, int64_t width,
                                 kiln_module **out) {
    if (out) *out = NULL;
    if (!path) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_model_spec_load: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return KILN_RAISE(KILN_ERR_IO, "check the path (models/ ships the standard specs)", "cannot open model spec %s: %s",
                          path, strerror(errno));
    /* The type and size from the open file before a byte is read: a
     * directory, a FIFO or /dev/zero is refused, not read until it ends. */
    struct stat sb = {0};
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return KILN_RAISE(KILN_ERR_IO, "pass a model spec file (models/ ships the standard specs)",
                          "model spec %s is %s, not a regular file", path,
                          S_ISDIR(sb.st_mode) ? "a directory" : "a device, pipe or socket");
    }
    enum { SPEC_FILE_MAX = 1 << 20 };
    if (sb.st_size > SPEC_FILE_MAX) {
        fclose(f);
        return KILN_RAISE(KILN_ERR_IO, "a spec is one layer a line: is this the right file?",
                          "model spec %s is %lld bytes, more than the 1 MiB (%d bytes) a spec may hold", path,
                          (long long)sb.st_size, SPEC_FILE_MAX);
    }
    char *buf = KILN_MALLOC(SPEC_FILE_MAX + 1);
    if (!buf) {
        fclose(f);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    size_t n = fread(buf, 1, SPEC_FILE_MAX + 1, f);
    bool bad = ferror(f) != 0;
    fclose(f);
    kiln_status st;
    if (bad) st = KILN_RAISE(KILN_ERR_IO, NULL, "cannot read model spec %s", path);
    else if (n > SPEC_FILE_MAX)
        st = KILN_RAISE(KILN_ERR_IO, NULL, "model spec %s grew past 1 MiB (%d bytes) while it was read", path,
                        SPEC_FILE_MAX);
    else st = kiln_model_spec_parse_n(buf, n, path, channels, height, width, out);
    free(buf);
    return st;
}
