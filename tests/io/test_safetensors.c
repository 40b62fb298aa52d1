/* Safetensors: a round trip restores every parameter and buffer exactly;
 * the file's layout is the format's (header length, 8-byte aligned JSON,
 * offsets in state-dict order); corrupted headers and another model's file
 * are clear errors naming the file; a failed save leaves no file behind. */
#include <unistd.h>

#include "test_util.h"

static const char spec[] = "conv 4 k3 p1\nbatchnorm\nrelu\nflatten\nlinear 3\n";

static kiln_module *make(uint64_t seed) {
    kiln_manual_seed(seed);
    kiln_module *m = NULL;
    CHECK_OK(kiln_model_spec_parse(spec, "t.txt", 1, 4, 4, &m));
    return m;
}

static bool same_state(kiln_module *a, kiln_module *b) {
    kiln_named_tensor *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    bool same = kiln_module_state_dict(a, &x, &nx) == KILN_OK && kiln_module_state_dict(b, &y, &ny) == KILN_OK &&
                nx == ny;
    for (int i = 0; same && i < nx; i++) {
        size_t bytes = (size_t)kiln_numel(x[i].tensor) * kiln_dtype_size(kiln_dtype_of(x[i].tensor));
        char *p = malloc(bytes + 1), *q = malloc(bytes + 1);
        same = strcmp(x[i].name, y[i].name) == 0 && kiln_to_host(x[i].tensor, p, bytes) == KILN_OK &&
               kiln_to_host(y[i].tensor, q, bytes) == KILN_OK && memcmp(p, q, bytes) == 0;
        free(p);
        free(q);
    }
    free(x);
    free(y);
    return same;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *size = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void test_round_trip(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    kiln_module *a = make(1), *b = make(2);
    CHECK(!same_state(a, b));
    CHECK_OK(kiln_safetensors_save(path, a));
    CHECK_OK(kiln_safetensors_load(path, b));
    CHECK(same_state(a, b));
    size_t size = 0;
    char *bytes = slurp(path, &size);
    CHECK(bytes && size > 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (uint8_t)bytes[i];
    CHECK(n % 8 == 0 && n + 8 < size);
    /* 0.weight (4,1,3,3) f32 first, num_batches_tracked is I64. */
    CHECK(strstr(bytes + 8, "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[4,1,3,3],\"data_offsets\":[0,144]}") != NULL);
    CHECK(strstr(bytes + 8, "\"1.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[]") != NULL);
    /* Corruptions, each a clear error naming the file. */
    char *bad = malloc(size);
    memcpy(bad, bytes, size);
    bad[0] = (char)0xff, bad[1] = (char)0xff, bad[2] = (char)0xff;
    spit(path, bad, size);
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "does not fit the file");
    CHECK(strstr(kiln_error_message(), path) != NULL);
    memcpy(bad, bytes, size);
    char *dt = strstr(bad + 8, "F32");
    memcpy(dt, "X32", 3);
    spit(path, bad, size);
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "unknown dtype");
    memcpy(bad, bytes, size);
    bad[8] = '[';
    spit(path, bad, size);
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "bad safetensors header at byte 23: not valid JSON");
    spit(path, bytes, size - 4); /* truncated data */
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "outside the");
    memcpy(bad, bytes, size);
    char *off = strstr(bad + 8, "[0,144]");
    memcpy(off, "[0,140]", 7);
    spit(path, bad, size);
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "its dtype and shape need 144");
    spit(path, "abc", 3);
    CHECK_FAILS(kiln_safetensors_load(path, b), KILN_ERR_IO, "too short");
    free(bad);
    free(bytes);
    /* Another model: the names are listed. */
    spit(path, "", 0);
    CHECK_OK(kiln_safetensors_save(path, a));
    kiln_module *other = NULL;
    CHECK_OK(kiln_model_spec_parse("conv 4 k3 p1\nrelu\nflatten\nlinear 3\n", "o.txt", 1, 4, 4, &other));
    CHECK_FAILS(kiln_safetensors_load(path, other), KILN_ERR_IO, "unexpected ('1.weight'");
    kiln_module_free(other);
    CHECK_FAILS(kiln_safetensors_load("/nonexistent/x.safetensors", b), KILN_ERR_IO, "/nonexistent/x.safetensors");
    unlink(path);
    kiln_module_free(a);
    kiln_module_free(b);
}

/* A save into a missing directory fails, and no temporary is left; a save
 * over an existing file replaces it whole. */
static void test_atomic(const char *dir) {
    kiln_module *a = make(3);
    char path[512];
    snprintf(path, sizeof path, "%s/missing/m.safetensors", dir);
    CHECK_FAILS(kiln_safetensors_save(path, a), KILN_ERR_IO, "missing/m.safetensors.tmp");
    CHECK(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/keep.safetensors", dir);
    spit(path, "old", 3);
    CHECK_OK(kiln_safetensors_save(path, a));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);
    size_t size = 0;
    char *b = slurp(path, &size);
    CHECK(size > 100);
    free(b);
    unlink(path);
    kiln_module_free(a);
}

int main(void) {
    if (kiln_init() != KILN_OK) return 1;
    char dir[] = "/tmp/kiln_st_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_round_trip(dir);
    test_atomic(dir);
    rmdir(dir);
    kiln_shutdown();
    return kt_finish();
}
