/* The profiler's shared state between recording (profiler.c), the table
 * (profiler_table.c) and the Chrome trace (profiler_trace.c). */
#ifndef KILN_SRC_DIAG_PROFILER_INTERNAL_H
#define KILN_SRC_DIAG_PROFILER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/diag.h"
#include "kiln/runtime.h"

typedef enum prof_kind {
    PROF_OP = 0, /* a dispatched op */
    PROF_RANGE,  /* a user range, a backward formula or ProfilerStep#N */
    PROF_SYNC,   /* the host blocked on a device */
    PROF_ASYNC,  /* work that went on beside the thread (a collective in flight),
                  * recorded when it ended: no parent, no self CPU time */
} prof_kind;

/* One finished record of the last recording. Times are CLOCK_MONOTONIC ns;
 * dev_* are 0 when the record ran no kernel on a device with a stream. */
typedef struct prof_record {
    char *name; /* owned */
    prof_kind kind;
    uint64_t tid;   /* the OS thread id */
    int64_t parent; /* index into the same array, -1 at top level */
    uint64_t start_ns, end_ns;
    uint64_t launch_ns; /* when the kernel was launched (0: none) */
    uint64_t dev_start_ns, dev_end_ns;
    kiln_device device;
    uint64_t stream_id;
    uint64_t out_bytes; /* bytes allocated by the outputs */
    uint64_t flops;     /* floating-point operations of a matmul or convolution op (a multiply-add
                         * counts 2, as PyTorch's with_flops); 0 for every other record */
} prof_record;

/* The last recording, owned by profiler.c. Parents come before children. */
typedef struct prof_result {
    prof_record *rec;
    size_t n;
} prof_result;

/* Lock the last recording for reading; unlock when done. */
const prof_result *kiln_profiler_result_lock(void);
void kiln_profiler_result_unlock(void);

/* Registers the dispatcher's profiler hook and observer; from kiln_init. */
void kiln_profiler_init(void);

#endif
