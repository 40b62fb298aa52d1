/* The diag layer's JSON reader (src/diag/json_read.c), which kiln report
 * and the snapshot tests rely on: values, escapes, exact integers, errors
 * with their byte offset, the depth limit, and lazy parsing. */
#include "diag/json_read.h"
#include "test_util.h"

static kiln_json *parse(const char *s) { return kiln_json_parse(s, strlen(s), NULL, 0); }

static void check_fails(const char *text, const char *needle) {
    char err[128];
    kiln_json *v = kiln_json_parse(text, strlen(text), err, sizeof err);
    CHECK_MSG(v == NULL, "'%s' parsed", text);
    CHECK_MSG(strstr(err, needle) != NULL, "'%s': error '%s' does not mention '%s'", text, err, needle);
    kiln_json_free(v);
}

int main(void) {
    kiln_json *v = parse(" {\"a\": [1, -2.5e3, true, false, null, \"x\\\"\\\\\\/\\n\\u00e9\\ud83d\\ude00\"],"
                         " \"big\": 9007199254740993, \"a\": {\"b\": {}}} ");
    CHECK(v && v->type == KILN_JSON_OBJECT && v->n == 3);
    const kiln_json *arr = v ? v->items[0] : NULL;
    CHECK(arr && arr->type == KILN_JSON_ARRAY && arr->n == 6);
    if (arr && arr->n == 6) {
        CHECK(arr->items[0]->is_int && arr->items[0]->integer == 1);
        CHECK(!arr->items[1]->is_int && arr->items[1]->number == -2500);
        CHECK(arr->items[2]->type == KILN_JSON_BOOL && arr->items[2]->boolean);
        CHECK(arr->items[3]->type == KILN_JSON_BOOL && !arr->items[3]->boolean);
        CHECK(arr->items[4]->type == KILN_JSON_NULL);
        CHECK(!strcmp(arr->items[5]->string, "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80"));
    }
    /* Integers beyond 2^53 stay exact; a repeated key reads as the last. */
    CHECK_EQ_I(kiln_json_int(kiln_json_get(v, "big"), 0), 9007199254740993LL);
    CHECK(kiln_json_path(v, "a", "b", NULL) && kiln_json_path(v, "a", "b", NULL)->type == KILN_JSON_OBJECT);
    CHECK(kiln_json_path(v, "a", "c", NULL) == NULL);
    CHECK(kiln_json_at(v, 0) == NULL && kiln_json_get(arr, "x") == NULL);
    CHECK(!strcmp(kiln_json_string(kiln_json_get(v, "nope"), "fb"), "fb"));
    kiln_json_free(v);

    check_fails("", "end of input");
    check_fails("{\"a\":1,}", "member name");
    check_fails("[1 2]", "expected ','");
    check_fails("\"abc", "unterminated");
    check_fails("\"a\tb\"", "control character");
    check_fails("\"\\x\"", "bad escape");
    check_fails("\"\\u12G4\"", "\\u escape");
    check_fails("1.", "digits expected");
    check_fails("1e+", "exponent");
    check_fails("-", "unexpected character");
    check_fails("tru", "unexpected character");
    check_fails("{} x", "text after the value");
    char err[128];
    kiln_json_free(kiln_json_parse("[1, @]", 6, err, sizeof err));
    CHECK_MSG(strstr(err, "at byte 4") != NULL, "offset not named: %s", err);
    /* Depth: 64 levels parse, 65 do not (no stack exhaustion on 100000). */
    char deep[200001];
    for (int d = 64; d <= 65; d++) {
        memset(deep, '[', (size_t)d);
        memset(deep + d, ']', (size_t)d);
        v = kiln_json_parse(deep, (size_t)(2 * d), NULL, 0);
        CHECK_MSG((v != NULL) == (d == 64), "depth %d", d);
        kiln_json_free(v);
    }
    memset(deep, '[', 100000);
    memset(deep + 100000, ']', 100000);
    check_fails(deep, "too deep");

    /* Lazy: deeper containers stay raw until expanded. */
    const char *text = "{\"t\":[[{\"k\":[1,\"]\"]},{\"k\":2}]],\"s\":3}";
    v = kiln_json_parse_lazy(text, strlen(text), 2, NULL, 0);
    const kiln_json *inner = kiln_json_at(kiln_json_get(v, "t"), 0);
    CHECK(inner && inner->type == KILN_JSON_ARRAY && inner->n == 2);
    if (inner && inner->n == 2) {
        kiln_json *e = inner->items[0];
        CHECK(e->type == KILN_JSON_RAW && e->raw_len == strlen("{\"k\":[1,\"]\"]}"));
        CHECK(kiln_json_expand(e, NULL, 0) && e->type == KILN_JSON_OBJECT);
        CHECK(!strcmp(kiln_json_string(kiln_json_at(kiln_json_get(e, "k"), 1), ""), "]"));
    }
    CHECK_EQ_I(kiln_json_int(kiln_json_get(v, "s"), 0), 3);
    kiln_json_free(v);
    const char *unbalanced = "{\"t\":[[{\"k\":]]}";
    CHECK(kiln_json_parse_lazy(unbalanced, strlen(unbalanced), 1, NULL, 0) == NULL);
    return kt_finish();
}
