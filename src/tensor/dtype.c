/* dtypes: sizes, names and parsing. */
#include <string.h>

#include "base/error.h"
#include "kiln/tensor.h"

typedef struct dtype_info {
    const char *name;
    size_t size;
    bool floating;
} dtype_info;

static const dtype_info infos[KILN_DTYPE_COUNT] = {
    [KILN_F32] = {"f32", 4, true}, [KILN_F16] = {"f16", 2, true},    [KILN_BF16] = {"bf16", 2, true},
    [KILN_F64] = {"f64", 8, true}, [KILN_I32] = {"i32", 4, false},   [KILN_I64] = {"i64", 8, false},
    [KILN_U8] = {"u8", 1, false},  [KILN_BOOL] = {"bool", 1, false},
};

/* Accepted spellings: Kiln's short names first, then PyTorch's. */
static const struct {
    const char *text;
    kiln_dtype dtype;
} aliases[] = {
    {"f32", KILN_F32},     {"float32", KILN_F32}, {"float", KILN_F32},  {"f16", KILN_F16},
    {"float16", KILN_F16}, {"half", KILN_F16},    {"bf16", KILN_BF16},  {"bfloat16", KILN_BF16},
    {"f64", KILN_F64},     {"float64", KILN_F64}, {"double", KILN_F64}, {"i32", KILN_I32},
    {"int32", KILN_I32},   {"int", KILN_I32},     {"i64", KILN_I64},    {"int64", KILN_I64},
    {"long", KILN_I64},    {"u8", KILN_U8},       {"uint8", KILN_U8},   {"bool", KILN_BOOL},
};

static bool valid(kiln_dtype dtype) { return (unsigned)dtype < KILN_DTYPE_COUNT; }

size_t kiln_dtype_size(kiln_dtype dtype) { return valid(dtype) ? infos[dtype].size : 0; }

const char *kiln_dtype_name(kiln_dtype dtype) { return valid(dtype) ? infos[dtype].name : "invalid"; }

bool kiln_dtype_is_floating(kiln_dtype dtype) { return valid(dtype) && infos[dtype].floating; }

kiln_status kiln_dtype_parse(const char *text, kiln_dtype *out) {
    static const char *hint = "write f32, f16, bf16, f64, i32, i64, u8 or bool";
    if (!text || !out) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "kiln_dtype_parse: NULL argument");
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(text, aliases[i].text) == 0) {
            *out = aliases[i].dtype;
            return KILN_OK;
        }
    }
    return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, hint, "invalid dtype \"%s\"", text);
}
