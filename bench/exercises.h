/* kiln bench exercises (bench/exercises.c: the helpers, the page and the
 * command; bench/exercises_five.c: the five exercises). Shared by those two
 * files only. */
#ifndef KILN_BENCH_EXERCISES_H
#define KILN_BENCH_EXERCISES_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../tools/report.h"
#include "../tools/train.h"
#include "bench.h"
#include "cpu_peak.h"
#include "kiln/plan.h"

#define EX_MAX_ROUNDS 9
#define EX_MAX_OPS    64
/* snprintf into an array, truncating (display text: a cut is harmless). */
#define TEXT(buf, ...) ((void)(snprintf((buf), sizeof(buf), __VA_ARGS__) < 0))

typedef struct ex {
    char exe[PATH_MAX], out[PATH_MAX], cifar[PATH_MAX + 32], device[64], devflag[80], cpu[160];
    const char *fmnist; /* Fashion-MNIST's directory, or NULL when it is not installed */
    bool quick, synthetic, cuda;
    int rounds, only;
    bench_cpu_info cpuinfo;
    kiln_strbuf body;
    cJSON *list;
    int sections, plots, tables;
} ex;

typedef struct spread {
    double med, lo, hi;
    int n;
} spread;

/* This binary run with the arguments `fmt` makes (shell-quoted), stdout and
 * stderr into DIR/logs/TAG.out and .err and read back (malloc'd; NULL
 * allowed); the exit code (-1: not started). */
int ex_run(ex *e, const char *tag, char **out, char **err, const char *fmt, ...);
/* A file's whole text (malloc'd), or NULL. */
char *ex_slurp(const char *path);
/* The last line of text that parses as a JSON object holding key (the
 * caller deletes it), or NULL. */
cJSON *ex_last_json(const char *text, const char *key);
/* A number field, NaN when absent. */
double ex_num(const cJSON *o, const char *key);
/* The median and range of the finite values of v[0..n). */
spread ex_spread_of(const double *v, int n);
/* A table cell "median [min-max]unit" (the median alone for one round). */
void ex_cell(kiln_strbuf *b, spread s, const char *unit);
cJSON *ex_json_spread(spread s);
/* k configurations' medians with the slowest and fastest rounds, a plot. */
void ex_spread_plot(ex *e, const char *title, const char *ylabel, const spread *s, int k, const char *xlabel);
/* A section: its heading, the tutorial's question and the command; its
 * answer and meaning at the end; a note (escaped) in between. */
void ex_section_begin(ex *e, int id, const char *title, const char *asked, const char *command);
void ex_section_end(ex *e, const char *answer, const char *meaning);
void ex_note(ex *e, const char *fmt, ...);
/* The exercise's JSON object, added to the list. */
cJSON *ex_add(ex *e, int id, const char *command);

/* The five exercises (exercises_five.c), each one section and one JSON object. */
void ex_profile(ex *e);
void ex_amp(ex *e);
void ex_pinned(ex *e);
void ex_checkpoint(ex *e);
void ex_ddp(ex *e);

#endif
