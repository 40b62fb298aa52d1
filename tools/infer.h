/* kiln infer and the traced part of kiln export (tools/infer.c). */
#ifndef KILN_TOOLS_INFER_H
#define KILN_TOOLS_INFER_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/kiln.h"

/* kiln export --traced --example NxCxHxW: the flags, taken out of argv
 * (so the export command's own parser never sees them). */
typedef struct export_traced {
    bool on;
    int64_t example[4]; /* N, C, H, W */
} export_traced;

/* Removes --traced and --example SHAPE from argv (argc updated). 0, or 2
 * after a message for a malformed or missing --example. */
int kiln_export_traced_flags(int *argc, char **argv, export_traced *out);
/* Traces m's inference forward (eval mode, grad off) on an example of
 * t->example, which must be (N, c, h, w) of the checkpoint's input, and
 * writes DIR/model.kiln (kiln_program_save). 0, or 1 after a message. */
int kiln_export_traced(kiln_module *m, const export_traced *t, const char *dir, int64_t c, int64_t h,
                       int64_t w);
/* kiln infer --program FILE (--input FILE.safetensors [--input-name NAME] | --random) [--out FILE] */
int kiln_cmd_infer(int argc, char **argv);

#endif
