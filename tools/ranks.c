/* tools/ranks.h */
#include <stdlib.h>
#include <unistd.h>

#include "ranks.h"

int tool_rank_threads(long ranks) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (getenv("KILN_NUM_THREADS") || getenv("OMP_NUM_THREADS") || ranks <= 1 || cores < 1) return 0;
    return cores / ranks > 0 ? (int)(cores / ranks) : 1;
}
