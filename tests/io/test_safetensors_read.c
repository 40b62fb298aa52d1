/* Reading named tensors (kiln_safetensors_open/get): a round trip through
 * Kiln's writer gives back every tensor's dtype, shape and bytes, on the
 * CPU and on a CUDA device when one exists, and the metadata; an unknown
 * name is an error naming the name and the file; bad files (a directory, a
 * pipe, a short or truncated file, a header with repeated names, fields or
 * "__metadata__", a bad dtype, shape or range) are refused at open with an
 * error naming the file. */
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors_internal.h"
#include "test_util.h"

static char dir[] = "/tmp/kiln_st_read_XXXXXX";

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static bool same_bytes(const kiln_tensor *a, const kiln_tensor *b) {
    size_t n = (size_t)kiln_numel(a) * kiln_dtype_size(kiln_dtype_of(a));
    if (kiln_dtype_of(a) != kiln_dtype_of(b) || kiln_numel(b) != kiln_numel(a)) return false;
    char *p = malloc(n + 1), *q = malloc(n + 1);
    bool same = kiln_to_host(a, p, n) == KILN_OK && kiln_to_host(b, q, n) == KILN_OK && memcmp(p, q, n) == 0;
    free(p);
    free(q);
    return same;
}

static bool same_shape(kiln_shape a, kiln_shape b) {
    bool same = a.ndim == b.ndim;
    for (int i = 0; same && i < a.ndim; i++) same = a.d[i] == b.d[i];
    return same;
}

/* Tensors of several dtypes and ranks (a scalar, an empty one) written by
 * kiln_st_write with metadata, read back by name. */
static void test_round_trip(void) {
    char path[600];
    path_of(path, sizeof path, "rt.safetensors");
    kiln_manual_seed(7);
    kiln_named_tensor items[5] = {
        {"conv.weight", kiln_randn(KILN_SHAPE(4, 1, 3, 3), KILN_F32, KILN_CPU)},
        {"steps", kiln_full(KILN_SHAPE(3), 12345678901.0, KILN_I64, KILN_CPU)},
        {"half", kiln_randn(KILN_SHAPE(2, 5), KILN_F16, KILN_CPU)},
        {"scalar", kiln_full(KILN_SHAPE(), 2.5, KILN_F64, KILN_CPU)},
        {"empty", kiln_zeros(KILN_SHAPE(0, 4), KILN_F32, KILN_CPU)},
    };
    const char *meta[] = {"kiln.note", "a \"quoted\" value\nover two lines", "kiln.step", "42"};
    CHECK_OK(kiln_st_write(path, items, 5, meta, 2));

    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(path, &f));
    if (!f) return;
    CHECK_EQ_I(kiln_safetensors_tensor_count(f), 5);
    for (int i = 0; i < 5; i++) CHECK(!strcmp(kiln_safetensors_tensor_name(f, i), items[i].name));
    CHECK(kiln_safetensors_tensor_name(f, 5) == NULL && kiln_safetensors_tensor_name(f, -1) == NULL);
    int n_cuda = kiln_device_count(KILN_DEVICE_CUDA);
    for (int i = 0; i < 5; i++) {
        kiln_dtype dt;
        kiln_shape s;
        CHECK_OK(kiln_safetensors_tensor_info(f, items[i].name, &dt, &s));
        CHECK(dt == kiln_dtype_of(items[i].tensor) && same_shape(s, kiln_shape_of(items[i].tensor)));
        kiln_tensor *t = kiln_safetensors_get(f, items[i].name, KILN_CPU);
        CHECK_MSG(t && same_bytes(t, items[i].tensor), "%s: %s", items[i].name, kiln_error_message());
        CHECK(t && same_shape(kiln_shape_of(t), s) && kiln_get_device(t).type == KILN_DEVICE_CPU);
        kiln_release(t);
        if (n_cuda > 0) { /* the caller's device: a real GPU or the emulated one */
            kiln_device d = {KILN_DEVICE_CUDA, 0};
            t = kiln_safetensors_get(f, items[i].name, d);
            CHECK_MSG(t && kiln_get_device(t).type == KILN_DEVICE_CUDA && same_bytes(t, items[i].tensor),
                      "%s: %s", items[i].name, kiln_error_message());
            kiln_release(t);
        }
    }
    /* Metadata: Kiln's "format" first, then the pairs given, escapes decoded. */
    CHECK_EQ_I(kiln_safetensors_metadata_count(f), 3);
    CHECK(!strcmp(kiln_safetensors_metadata_key(f, 0), "format"));
    CHECK(!strcmp(kiln_safetensors_metadata_key(f, 1), "kiln.note"));
    CHECK(kiln_safetensors_metadata_key(f, 3) == NULL);
    CHECK(!strcmp(kiln_safetensors_metadata(f, "kiln.note"), meta[1]));
    CHECK(!strcmp(kiln_safetensors_metadata(f, "kiln.step"), "42"));
    CHECK(kiln_safetensors_metadata(f, "kiln.absent") == NULL);

    /* An unknown name: the error names it, the file, and what is there. */
    kiln_error_clear();
    CHECK(kiln_safetensors_get(f, "conv.wieght", KILN_CPU) == NULL);
    CHECK_MSG(strstr(kiln_error_message(), "'conv.wieght'") && strstr(kiln_error_message(), path) &&
                  strstr(kiln_error_message(), "'conv.weight'"),
              "%s", kiln_error_message());
    CHECK(kiln_error_last()->status == KILN_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(kiln_safetensors_tensor_info(f, "nope", NULL, NULL), KILN_ERR_INVALID_ARGUMENT,
                "no tensor named 'nope'");
    kiln_safetensors_close(f);
    kiln_safetensors_close(NULL);
    for (int i = 0; i < 5; i++) kiln_release(items[i].tensor);
    unlink(path);
}

/* A module saved by kiln_safetensors_save reads back tensor by tensor. */
static void test_module_file(void) {
    char path[600];
    path_of(path, sizeof path, "m.safetensors");
    kiln_module *m = NULL;
    CHECK_OK(
        kiln_model_spec_parse("conv 4 k3 p1\nbatchnorm\nrelu\nflatten\nlinear 3\n", "t.txt", 1, 4, 4, &m));
    if (!m) return;
    CHECK_OK(kiln_safetensors_save(path, m));
    kiln_named_tensor *sd = NULL;
    int n = 0;
    CHECK_OK(kiln_module_state_dict(m, &sd, &n));
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(path, &f));
    CHECK_EQ_I(kiln_safetensors_tensor_count(f), n);
    for (int i = 0; f && i < n; i++) {
        kiln_tensor *t = kiln_safetensors_get(f, sd[i].name, KILN_CPU);
        CHECK_MSG(t && same_bytes(t, sd[i].tensor), "%s", sd[i].name);
        kiln_release(t);
    }
    kiln_safetensors_close(f);
    free(sd);
    kiln_module_free(m);
    unlink(path);
}

/* A file of the 8-byte length, `json` padded to 8 bytes, and `data_bytes`
 * zero bytes. */
static void write_file(const char *path, const char *json, size_t data_bytes) {
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 8; i++) fputc((int)((padded >> (8 * i)) & 0xff), f);
    fputs(json, f);
    for (size_t i = n; i < padded; i++) fputc(' ', f);
    for (size_t i = 0; i < data_bytes; i++) fputc(0, f);
    fclose(f);
}

static void open_fails(const char *path, const char *needle) {
    kiln_safetensors *f = (kiln_safetensors *)1;
    CHECK_FAILS(kiln_safetensors_open(path, &f), KILN_ERR_IO, needle);
    CHECK_MSG(strstr(kiln_error_message(), path) != NULL, "'%s' not named: %s", path, kiln_error_message());
    CHECK(f == NULL);
}

static void header_fails(const char *json, size_t data_bytes, const char *needle) {
    char path[600];
    path_of(path, sizeof path, "bad.safetensors");
    write_file(path, json, data_bytes);
    open_fails(path, needle);
    unlink(path);
}

#define E8 "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_bad_files(void) {
    char path[600];
    open_fails(dir, "is a directory");
    path_of(path, sizeof path, "fifo");
    CHECK(mkfifo(path, 0600) == 0);
    open_fails(path, "not a regular file");
    unlink(path);
    path_of(path, sizeof path, "missing.safetensors");
    open_fails(path, "cannot open");
    path_of(path, sizeof path, "short.safetensors");
    FILE *f = fopen(path, "wb");
    fputs("abc", f);
    fclose(f);
    open_fails(path, "too short");
    unlink(path);
    /* The header's length past the end of the file. */
    path_of(path, sizeof path, "long.safetensors");
    f = fopen(path, "wb");
    fwrite("\xff\x00\x00\x00\x00\x00\x00\x00{}", 1, 10, f);
    fclose(f);
    open_fails(path, "header length 255 does not fit the file's 10 bytes");
    unlink(path);

    /* Good: one tensor, and an empty header. */
    path_of(path, sizeof path, "ok.safetensors");
    write_file(path, "{\"a\":" E8 "}", 8);
    kiln_safetensors *ok = NULL;
    CHECK_OK(kiln_safetensors_open(path, &ok));
    CHECK_EQ_I(kiln_safetensors_tensor_count(ok), 1);
    kiln_safetensors_close(ok);
    write_file(path, "{}", 0);
    CHECK_OK(kiln_safetensors_open(path, &ok));
    CHECK_EQ_I(kiln_safetensors_tensor_count(ok), 0);
    CHECK_FAILS(kiln_safetensors_tensor_info(ok, "a", NULL, NULL), KILN_ERR_INVALID_ARGUMENT,
                "it holds 0: none");
    kiln_safetensors_close(ok);
    unlink(path);

    /* cJSON keeps repeated keys: every repeat is refused. */
    header_fails("{\"a\":" E8 ",\"a\":" E8 "}", 8, "tensor 'a' appears twice");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                 "tensor 'a': field 'dtype' appears twice");
    header_fails("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "\"__metadata__\" appears twice");
    /* A control byte, which cJSON would keep inside a name. */
    header_fails("{\"a\x01\":" E8 "}", 8, "at byte 11: control byte 0x01");
    /* Shape of the header. */
    header_fails("[1,2]", 0, "the header must be a JSON object");
    header_fails("{\"a\":" E8 "} x", 8, "text after the header object");
    header_fails("{\"a\":" E8, 8, "not valid JSON");
    header_fails("{\"a\":[1]}", 8, "tensor 'a': the entry must be an object");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "needs dtype, shape and data_offsets");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
                 "unknown field 'x'");
    header_fails("{\"__metadata__\":{\"k\":1}}", 0, "value of 'k' is not a string");
    header_fails("{\"__metadata__\":[]}", 0, "\"__metadata__\" must be an object");
    /* Values. */
    header_fails("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                 "unknown dtype 'F31'");
    header_fails("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                 "\"dtype\" must be a string");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                 "not a non-negative integer");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                 "not a non-negative integer");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                 "9 dimensions");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2199023255553],\"data_offsets\":[0,8]}}", 8,
                 "dimension too large");
    header_fails("{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776,1099511627776],"
                 "\"data_offsets\":[0,8]}}",
                 8, "overflows");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                 "data_offsets must be [begin, end]");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                 "outside the 8 data bytes");
    header_fails("{\"a\":" E8 "}", 4, "outside the 4 data bytes"); /* truncated data */
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12,
                 "its dtype and shape need 8");
    header_fails("{\"a\":" E8 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                 "tensors 'a' and 'b' overlap");
    /* The data section is exactly the tensors' bytes (the reference
     * library's rule): no bytes after the last tensor, no gap. */
    header_fails("{\"a\":" E8 "}", 12, "4 bytes after the data section's last tensor");
    header_fails("{}", 1, "1 bytes after the data section's last tensor");
    header_fails("{\"a\":" E8 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
                 "data bytes 8..12 belong to no tensor (a gap before 'b'");
    header_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                 "data bytes 0..4 belong to no tensor");
    /* An empty tensor inside another's bytes overlaps it; one between two
     * tensors, or at the end, is where the data is. */
    header_fails("{\"a\":" E8 ",\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8,
                 "tensors 'a' and 'z' overlap");
    path_of(path, sizeof path, "empty_between.safetensors");
    write_file(path,
               "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
               "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},\"a\":" E8
               ",\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[16,16]}}",
               16);
    CHECK_OK(kiln_safetensors_open(path, &ok));
    CHECK_EQ_I(kiln_safetensors_tensor_count(ok), 4);
    kiln_safetensors_close(ok);
    unlink(path);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    if (!mkdtemp(dir)) return 1;
    test_round_trip();
    test_module_file();
    test_bad_files();
    rmdir(dir);
    kiln_shutdown();
    return kt_finish();
}
