/* The library's monotonic clock (the loader's wait statistics, the host
 * process sampler): one definition instead of one per file. */
#ifndef KILN_SRC_BASE_CLOCK_H
#define KILN_SRC_BASE_CLOCK_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double kiln_clock_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
