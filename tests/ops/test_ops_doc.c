/* docs/ops.md must carry the op table generated from ops.def. */
#include "ops/op_registry.h"
#include "test_util.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

int main(void) {
    if (kiln_init()) return 1;
    /* The source tree is found from this file's own path (CMake passes it absolute). */
    char path[4096];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strstr(path, "tests/ops/test_ops_doc.c");
    if (!slash) kt_missing("cannot locate the source tree from __FILE__");
    strcpy(slash, "docs/ops.md");
    char *doc = read_file(path);
    CHECK_MSG(doc != NULL, "cannot read %s", path);
    char *table = kiln_ops_markdown();
    CHECK(table != NULL);
    if (doc && table) {
        char *line = table;
        while (*line) {
            char *end = strchr(line, '\n');
            size_t len = end ? (size_t)(end - line) : strlen(line);
            char want[512];
            snprintf(want, sizeof want, "%.*s\n", (int)len, line);
            CHECK_MSG(strstr(doc, want) != NULL, "docs/ops.md lacks the row: %s (regenerate with `kiln ops`)", want);
            line += len + (end ? 1 : 0);
        }
    }
    free(doc);
    free(table);
    kiln_shutdown();
    return kt_finish();
}
