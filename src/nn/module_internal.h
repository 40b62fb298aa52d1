/* The module record shared by module.c (structure, state dict, devices)
 * and layers.c (constructors and forwards). */
#ifndef KILN_SRC_NN_MODULE_INTERNAL_H
#define KILN_SRC_NN_MODULE_INTERNAL_H

#include "kiln/nn.h"

/* One named slot: a parameter, a buffer or a child. */
typedef struct kiln_module_slot {
    char *name;
    union {
        kiln_tensor *tensor;
        kiln_module *child;
    } u;
} kiln_module_slot;

typedef struct kiln_module_slots {
    int n, cap;
    kiln_module_slot *items;
} kiln_module_slots;

/* Where one name lives: which slot list and its index there. */
typedef struct kiln_module_name_ref {
    uint32_t hash;
    uint8_t kind; /* 0: empty bucket; 1: a parameter, 2: a buffer, 4: a child */
    int32_t index;
} kiln_module_name_ref;

/* Every name of a module's parameters, buffers and children in one
 * open-addressed hash table (linear probing, at most half full), so that
 * adding or finding a member is O(1) expected however many the module
 * has: a model spec of n layers is one Sequential of n children, and the
 * linear scan this replaces made building it O(n^2) (issue 20: 209k
 * layers in 275 s). `probes` counts the buckets that adding members has
 * looked at, for the test that holds the cost linear. */
typedef struct kiln_module_names {
    int cap, n; /* cap: 0 or a power of two */
    kiln_module_name_ref *refs;
    int64_t probes;
} kiln_module_names;

/* What a layer's forward needs besides its parameters. */
typedef struct kiln_module_config {
    kiln_conv2d_opts conv;
    kiln_pool2d_opts pool;
    int64_t out_hw[2]; /* adaptive pooling */
    double p;          /* dropout */
    double eps, momentum;
    int start_dim, end_dim;
    bool approximate; /* gelu */
    int micro_batches; /* Pipeline, a placed Sequential (pipeline.c) */
    /* A placed Sequential (kiln_nn_sequential_place): its stages (0: not
     * placed) and the first child of each (place_start[0] == 0). */
    int place_stages;
    int place_start[KILN_NN_MAX_PLACE_STAGES];
    /* Sequential: the checkpoint segments (0: off), the first child of
     * each (checkpoint_start[0] == 0) and each segment's children [begin,
     * end), the checkpoint's ctx. */
    int checkpoint_segments;
    int checkpoint_start[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
    struct kiln_checkpoint_segment {
        kiln_module *seq;
        int begin, end;
    } segment[KILN_NN_MAX_CHECKPOINT_SEGMENTS];
} kiln_module_config;

/* Runs the layer: x borrowed, result a new reference. Called inside an
 * entered API region (results of public calls are not scope-registered). */
typedef kiln_tensor *(*kiln_layer_forward)(kiln_module *m, kiln_tensor *x);

struct kiln_module {
    const char *kind; /* static for built-in layers, owned copy for custom ones */
    bool kind_owned;
    bool training;
    bool keep_f32; /* BatchNorm: parameters and buffers stay f32 under to_dtype(f16/bf16) */
    bool spans_devices; /* placed, pipelined or DataParallel: its layers run on several devices */
    kiln_module_slots params, buffers, children;
    kiln_module_names names; /* the index over all three */
    kiln_module_config cfg;
    kiln_layer_forward forward;
    kiln_module_forward_fn user_forward;
    void *user;
    /* A built-in module's own state (DataParallel's replicas), released
     * with the module by free_state. */
    void *state;
    void (*free_state)(void *state);
};

/* Chunk j of k over n samples along the batch (the first n % k chunks get
 * one more): the micro-batches of a Pipeline, the shares of DataParallel. */
static inline void kiln_nn_batch_chunk(int64_t n, int k, int j, int64_t *start, int64_t *len) {
    int64_t base = n / k, extra = n % k;
    *start = j * base + (j < extra ? j : extra);
    *len = base + (j < extra ? 1 : 0);
}

/* A placed Sequential's forward: its stages on their devices, pipelined
 * over micro-batches (pipeline.c). */
kiln_tensor *kiln_nn_placed_forward(kiln_module *m, kiln_tensor *x);

/* A Sequential's forward in its checkpoint segments (checkpoint_sequential.c). */
kiln_tensor *kiln_sequential_checkpoint_forward(kiln_module *m, kiln_tensor *x);

/* Children [begin, end) of a Sequential on x (borrowed; a new reference
 * or NULL), with the fused ops in place of the layer runs they cover when
 * fusion is on (fusion.c). */
kiln_tensor *kiln_nn_sequential_run(kiln_module *seq, int begin, int end, kiln_tensor *x);
/* The same, taking the reference to x: it is dropped as soon as the first
 * layer has run, so nothing keeps it alive that the layers did not save. */
kiln_tensor *kiln_nn_sequential_run_take(kiln_module *seq, int begin, int end, kiln_tensor *x);

/* A new empty module of `kind` (a static string) with `forward`. */
kiln_module *kiln_module_new(const char *kind, kiln_layer_forward forward);
/* The parameter or buffer `name` of m itself (no dots), borrowed, or NULL. */
kiln_tensor *kiln_module_own_tensor(const kiln_module *m, const char *name);
/* The hash buckets that adding members to m has looked at so far (tests). */
int64_t kiln_module_name_probes(const kiln_module *m);

#endif
