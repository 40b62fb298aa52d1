/* The per-sample random plan of the transforms (transform.c), shared with
 * the dataset-on-device path (device_data.c), which must draw exactly the
 * values the host pipeline draws. Not installed. */
#ifndef KILN_SRC_DATA_TRANSFORM_INTERNAL_H
#define KILN_SRC_DATA_TRANSFORM_INTERNAL_H

#include "kiln/data.h"

typedef struct transform_plan {
    int oy, ox; /* crop offsets in the padded image, in [0, 2 * pad] */
    bool flip;
    int cy0, cy1, cx0, cx1; /* cutout rows [cy0, cy1), cols [cx0, cx1); empty when off */
} transform_plan;

/* The random choices for sample `index` of `epoch`: a pure function of
 * (opts, info, seed, epoch, index). */
transform_plan transform_plan_sample(const kiln_transform_opts *o, kiln_sample_info info, uint64_t seed,
                                     int64_t epoch, int64_t index);
/* Source coordinate of padded coordinate p (0 <= p < n + 2*pad), or -1 for
 * a zero-padding pixel. Reflect assumes pad < n (kiln_transform_check). */
int transform_source_coord(int p, int pad, int n, kiln_pad_mode mode);

#endif
