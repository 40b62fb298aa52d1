/* How many compute threads each of several processes on one host takes
 * (tools/ranks.c): one rule for kiln train under mpirun and kiln bench ddp. */
#ifndef KILN_TOOLS_RANKS_H
#define KILN_TOOLS_RANKS_H

/* Each of `ranks` processes on this host should compute on its share of
 * the online cores (at least 1): N ranks of every core's threads would
 * oversubscribe the host, and OpenMP's spinning threads then crawl. 0
 * when there is nothing to choose: the user chose a count (--threads,
 * which sets KILN_NUM_THREADS, or KILN_NUM_THREADS / OMP_NUM_THREADS), or
 * there is one rank. As torchrun sets OMP_NUM_THREADS=1. */
int tool_rank_threads(long ranks);

#endif
