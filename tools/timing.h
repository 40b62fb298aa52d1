/* The clock and order statistics the kiln command's tools and benchmarks
 * share (tools/timing.c): one of each, not one per file. The library's own
 * clock is src/base/clock.h. */
#ifndef KILN_TOOLS_TIMING_H
#define KILN_TOOLS_TIMING_H

/* Seconds on the monotonic clock. */
double tool_now_s(void);
/* qsort's comparison for doubles, ascending. */
int tool_cmp_double(const void *a, const void *b);
/* The median of v[0..n) (the mean of the middle two when n is even);
 * sorts v in place. n > 0. */
double tool_median(double *v, int n);

#endif
