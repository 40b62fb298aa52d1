/* The planner's pieces (include/kiln/plan.h): the step shared by the plan
 * and the measurement (plan_step.c), and the breakdown read from the meta
 * allocator's memory history (plan_breakdown.c). */
#ifndef KILN_SRC_PLAN_PLAN_INTERNAL_H
#define KILN_SRC_PLAN_PLAN_INTERNAL_H

#include "kiln/kiln.h"

/* What the step is doing, for the memory history's context of its
 * allocations on the planning thread (plan_breakdown.c's provider). */
typedef enum plan_phase {
    PLAN_PHASE_NONE = 0, /* not planning: the ops layer's context */
    PLAN_PHASE_SETUP,    /* model, optimizer, segment placement */
    PLAN_PHASE_BATCH,    /* the loader's buffers */
    PLAN_PHASE_STEP,     /* forward / backward, told apart by the autograd engine */
    PLAN_PHASE_OPTIMIZER,
} plan_phase;
void plan_phase_set(plan_phase phase);
/* While set, the planning thread's allocations are a library's workspace
 * (the breakdown's "workspaces" part), whatever the dispatcher is doing. */
void plan_library_workspace_set(bool on);

/* The persistent per-stream GEMM workspace a step on `device` holds
 * (runtime/backend.h stream_workspace_bytes: cuBLASLt's 32 MiB on an H100
 * with the fast table; 0 on the CPU, in the emulation build and with
 * KILN_CUDA_KERNELS=reference), or the override when one is set. */
size_t plan_stream_workspace_bytes(kiln_device device);
/* Tests: plan as if the device's backend said `bytes` (>= 0); -1 asks the
 * backend again. Stands in for the real CUDA build's workspace where there
 * is none (the emulation build). Not thread-safe: set it between plans. */
void plan_stream_workspace_override(int64_t bytes);

/* Addresses the breakdown sorts blocks by. */
typedef struct plan_addrs {
    uintptr_t *a;
    int n, cap;
} plan_addrs;
kiln_status plan_addrs_add(plan_addrs *s, const kiln_tensor *t);
void plan_addrs_free(plan_addrs *s);

/* Where the gradients, Adam's state and the batch are at the end of a
 * planned step (filled by plan_step.c, read by the breakdown). */
typedef struct plan_sets {
    plan_addrs grads, optimizer_state, batch;
    uint64_t batch_stream; /* the CPU plan's pinned batch's meta stream (kiln_stream_id), else 0 */
} plan_sets;

/* Start the context provider and the meta history (plan), stop them. */
kiln_status plan_breakdown_begin(void);
void plan_breakdown_end(void);
/* Read meta's history and fill mem's peaks, phase, op and parts; what
 * happened on the meta stream `excluded_stream` (the CPU plan's pinned
 * batch; 0: none) is left out of the device's numbers. */
kiln_status plan_breakdown_read(const plan_sets *sets, uint64_t excluded_stream, kiln_plan_memory *mem);

/* The model of o: parsed from o->model_text when given, else loaded from
 * the file o->model, on the current device. */
kiln_status plan_load_model(const kiln_plan_opts *o, kiln_module **out);

/* Set up and run the step on meta (a plan: peaks, phase, op and parts) or,
 * when measure is true, on opts->device (the peaks only); *out's memories
 * are filled, their names by the caller. */
kiln_status plan_run(const kiln_plan_opts *o, bool measure, kiln_plan *out);

#endif
