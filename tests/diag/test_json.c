/* The cJSON helpers of src/diag/json.h, which kiln report and the snapshot
 * tests rely on: a parse bounded by a length that refuses trailing text
 * and names the byte of an error, typed reads and their fallbacks, and the
 * cursor that reads a large document one value at a time (its structure
 * errors found, escaped names decoded, nesting bounded). */
#include <unistd.h>

#include "diag/json.h"
#include "test_util.h"

static void check_fails(const char *text, const char *needle) {
    char err[128];
    cJSON *v = kiln_json_parse(text, strlen(text), err, sizeof err);
    CHECK_MSG(v == NULL, "'%s' parsed", text);
    CHECK_MSG(strstr(err, needle) != NULL, "'%s': error '%s' does not mention '%s'", text, err, needle);
    cJSON_Delete(v);
}

static void test_parse(void) {
    const char *text =
        " {\"a\": [1, -2.5e3, true, false, null, \"x\\\"\\n\\u00e9\"], \"big\": 4503599627370497,"
        " \"a\": {\"b\": {}}, \"inf\": 1e999} trailing";
    /* The length bounds the parse: the text after it is never looked at. */
    cJSON *v = kiln_json_parse(text, strlen(text) - strlen(" trailing"), NULL, 0);
    CHECK(cJSON_IsObject(v));
    const cJSON *arr = kiln_json_get(v, "a");
    CHECK_EQ_I(cJSON_GetArraySize(arr), 6);
    CHECK_EQ_I(kiln_json_int(kiln_json_at(arr, 0), 0), 1);
    double x = 0;
    CHECK(kiln_json_number(kiln_json_at(arr, 1), &x) && x == -2500);
    CHECK(cJSON_IsTrue(kiln_json_at(arr, 2)) && cJSON_IsFalse(kiln_json_at(arr, 3)) &&
          cJSON_IsNull(kiln_json_at(arr, 4)));
    CHECK(!strcmp(kiln_json_string(kiln_json_at(arr, 5), ""), "x\"\n\xc3\xa9"));
    /* Integers are exact up to 2^53; infinities are not numbers to read. */
    CHECK_EQ_I(kiln_json_int(kiln_json_get(v, "big"), 0), 4503599627370497LL);
    CHECK(!kiln_json_number(kiln_json_get(v, "inf"), &x) && kiln_json_int(kiln_json_get(v, "inf"), -7) == -7);
    /* A repeated key reads as the first; paths stop at a missing step. */
    CHECK(cJSON_IsArray(kiln_json_path(v, "a", NULL)));
    CHECK(kiln_json_path(v, "a", "b", NULL) == NULL && kiln_json_path(v, "nope", "b", NULL) == NULL);
    /* get only on objects, at only on arrays, fallbacks on the wrong type. */
    CHECK(kiln_json_at(v, 0) == NULL && kiln_json_get(arr, "x") == NULL && kiln_json_at(arr, 6) == NULL);
    CHECK(kiln_json_get(NULL, "a") == NULL && kiln_json_at(NULL, 0) == NULL);
    CHECK(!strcmp(kiln_json_string(kiln_json_get(v, "big"), "fb"), "fb"));
    CHECK_EQ_I(kiln_json_int(kiln_json_at(arr, 5), -3), -3);
    cJSON_Delete(v);

    check_fails("", "not valid JSON at byte 0");
    check_fails("{\"a\":1,}", "not valid JSON");
    check_fails("[1, @]", "not valid JSON at byte 4");
    check_fails("{} x", "text after the value at byte 3");
    check_fails("1 2", "text after the value at byte 2");
    char err[64];
    CHECK(kiln_json_parse(NULL, 0, err, sizeof err) == NULL && !strcmp(err, "no text"));
    /* A NUL inside a string would cut it short in cJSON: refused. Raw
     * white space between values is fine. */
    static const char nul[] = "{\"event\":\"st\0ep\"}";
    CHECK(kiln_json_parse(nul, sizeof nul - 1, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "control byte 0x00 at byte 12") != NULL, "%s", err);
    CHECK_EQ_I(kiln_json_control_byte(nul, sizeof nul - 1), 12);
    check_fails("[1,\x01 2]", "control byte 0x01 at byte 3");
    v = kiln_json_parse("\t[1,\r\n2]\n", 9, NULL, 0);
    CHECK(cJSON_GetArraySize(v) == 2);
    cJSON_Delete(v);
    /* Deep nesting is an error, not a stack overflow. */
    size_t deep = 100000;
    char *d = malloc(2 * deep);
    memset(d, '[', deep);
    memset(d + deep, ']', deep);
    v = kiln_json_parse(d, 2 * deep, NULL, 0);
    CHECK(v == NULL);
    free(d);
}

/* {"t":[[{...}, {...}]], "s":3} read entry by entry, as report_memory does. */
static void test_cursor(void) {
    const char *text =
        " {\"t\" : [[{\"k\":[1,\"]\"]} , {\"k\":2}], [5]], \"s\\u0041\":3, \"e\":[], \"o\":{}} ";
    kiln_json_cursor c;
    kiln_json_cursor_init(&c, text, strlen(text));
    CHECK(!kiln_json_cursor_enter(&c, '[')); /* an object is there */
    CHECK(kiln_json_cursor_enter(&c, '{'));
    int members = 0, entries = 0;
    double s = 0;
    while (kiln_json_cursor_next(&c)) {
        members++;
        const char *key = kiln_json_cursor_key(&c);
        if (!strcmp(key, "t") && kiln_json_cursor_enter(&c, '[')) {
            for (int k = 0; kiln_json_cursor_next(&c); k++) {
                if (k == 0 && kiln_json_cursor_enter(&c, '[')) {
                    while (kiln_json_cursor_next(&c)) {
                        cJSON *e = kiln_json_cursor_value(&c);
                        CHECK(cJSON_IsObject(e));
                        if (entries == 0)
                            CHECK(!strcmp(kiln_json_string(kiln_json_at(kiln_json_get(e, "k"), 1), ""), "]"));
                        entries++;
                        cJSON_Delete(e);
                    }
                } else {
                    cJSON *rest = kiln_json_cursor_value(&c);
                    CHECK(cJSON_IsArray(rest) && kiln_json_int(kiln_json_at(rest, 0), 0) == 5);
                    cJSON_Delete(rest);
                }
            }
            continue;
        }
        cJSON *v = kiln_json_cursor_value(&c);
        if (!strcmp(key, "sA")) kiln_json_number(v, &s); /* the escaped name decoded */
        cJSON_Delete(v);
    }
    CHECK_MSG(!c.failed, "failed at byte %zu", c.err_at);
    CHECK(kiln_json_cursor_at_end(&c));
    CHECK_EQ_I(members, 4);
    CHECK_EQ_I(entries, 2);
    CHECK(s == 3);
    CHECK(!strcmp(kiln_json_cursor_key(&c), ""));
    kiln_json_cursor_free(&c);
}

/* Walks every value of `text`; the cursor must fail at byte `at`. */
static void cursor_fails(const char *text, size_t at) {
    kiln_json_cursor c;
    kiln_json_cursor_init(&c, text, strlen(text));
    int guard = 0;
    if (kiln_json_cursor_enter(&c, '{') || kiln_json_cursor_enter(&c, '['))
        while (guard++ < 100) {
            if (kiln_json_cursor_next(&c)) {
                if (!kiln_json_cursor_enter(&c, '[') && !kiln_json_cursor_enter(&c, '{'))
                    cJSON_Delete(kiln_json_cursor_value(&c));
            } else if (c.failed || c.depth == 0) {
                break;
            }
        }
    bool end = kiln_json_cursor_at_end(&c);
    CHECK_MSG(!end && c.failed && c.err_at == at, "'%s': failed %d at byte %zu, wanted %zu", text, c.failed,
              c.err_at, at);
    kiln_json_cursor_free(&c);
}

static void test_cursor_errors(void) {
    cursor_fails("[1 2]", 3);         /* no comma */
    cursor_fails("[1,,2]", 3);        /* empty item */
    cursor_fails("{\"a\" 1}", 5);     /* no colon */
    cursor_fails("{1:2}", 1);         /* a name that is not a string */
    cursor_fails("{\"a:1}", 2);       /* an unterminated name: where cJSON stopped */
    cursor_fails("[1,", 3);           /* the end of the text */
    cursor_fails("[{\"a\":tru}]", 6); /* a bad value, where cJSON stopped */
    cursor_fails("[1] x", 4);         /* text after the document */
    /* Nesting beyond KILN_JSON_CURSOR_DEPTH containers entered. */
    char deep[2 * KILN_JSON_CURSOR_DEPTH + 4];
    memset(deep, '[', KILN_JSON_CURSOR_DEPTH + 1);
    memset(deep + KILN_JSON_CURSOR_DEPTH + 1, ']', KILN_JSON_CURSOR_DEPTH + 1);
    deep[2 * KILN_JSON_CURSOR_DEPTH + 2] = '\0';
    kiln_json_cursor c;
    kiln_json_cursor_init(&c, deep, strlen(deep));
    int entered = 0;
    while (kiln_json_cursor_enter(&c, '[')) entered++;
    CHECK_EQ_I(entered, KILN_JSON_CURSOR_DEPTH);
    CHECK(c.failed && c.err_at == KILN_JSON_CURSOR_DEPTH);
    kiln_json_cursor_free(&c);
}

static void test_read_file(void) {
    char path[] = "/tmp/kiln_json_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    /* Past the reader's first 64 KiB buffer, so it grows. */
    size_t n = 200000;
    char *big = malloc(n);
    memset(big, 'x', n);
    CHECK(write(fd, big, n) == (ssize_t)n);
    close(fd);
    size_t len = 0;
    char *text = kiln_json_read_file(path, &len);
    CHECK(text && len == n && text[n] == '\0' && !memcmp(text, big, n));
    free(text);
    free(big);
    unlink(path);
    CHECK(kiln_json_read_file(path, &len) == NULL);
}

int main(void) {
    test_parse();
    test_cursor();
    test_cursor_errors();
    test_read_file();
    return kt_finish();
}
