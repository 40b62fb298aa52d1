/* Host-side helpers shared by the nn and optim tests (included, not a test). */
#include <stdlib.h>

#include "test_util.h"

/* The elements of t as doubles in a malloc'd array (free() it); NULL on error. */
static inline double *kt_values(kiln_tensor *t) {
    if (!t) return NULL;
    kiln_tensor *d = kiln_to(t, KILN_CPU, KILN_F64, 0);
    int64_t n = kiln_numel(t);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!d || !v || kiln_to_host(d, v, (size_t)n * sizeof *v)) {
        fprintf(stderr, "kt_values: %s\n", kiln_error_message());
        free(v);
        v = NULL;
    }
    kiln_release(d);
    return v;
}

/* A new f64 CPU tensor (or f32 when dtype says so) from doubles. */
static inline kiln_tensor *kt_tensor(kiln_shape shape, kiln_dtype dtype, const double *v) {
    kiln_tensor *d = kiln_from_data(shape, KILN_F64, KILN_CPU, v);
    if (!d || dtype == KILN_F64) return d;
    kiln_tensor *c = kiln_to(d, KILN_CPU, dtype, 0);
    kiln_release(d);
    return c;
}

static inline bool kt_shape_is(kiln_tensor *t, kiln_shape s) {
    kiln_shape a = kiln_shape_of(t);
    if (!t || a.ndim != s.ndim) return false;
    for (int i = 0; i < s.ndim; i++)
        if (a.d[i] != s.d[i]) return false;
    return true;
}
