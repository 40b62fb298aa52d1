/* kiln train asks the plan before its first step (docs/memory.md, "kiln
 * train plans its step"; --no-plan turns it off).
 *
 * After the model, the optimizer, --amp and --checkpoint are set up, the
 * run's step is planned on the meta device (include/kiln/plan.h, steps 2:
 * the first step and the steady state after it) with the run's own model
 * spec, input, batch, device, autocast dtype, checkpoint segments and
 * accumulation, and the prediction is said on stderr and as a `plan`
 * record. The memory the step may use is the allocator's limit
 * (KILN_ALLOC_CONF=limit_mb:N, or kiln_memory_set_limit) and on CUDA also
 * the device's free memory plus what the allocator holds already. When the
 * planned reserved peak is above it, the micro-batch is halved (the
 * accumulation doubled: the effective batch and the math stay the same, as
 * in the out-of-memory recovery) until the plan fits; the choice is said
 * once. When not even micro-batches of one sample fit, the run stops
 * before its first step with the peak the plan needed and the limit.
 *
 * The device's cache is emptied and its peaks reset after planning, so
 * that after the second step the measured peaks can be held against the
 * plan: train_plan_check says both (and a plan_check record).
 *
 * Not planned: several processes (DDP's buckets and communication
 * buffers) and several devices (--devices, --split); the run says so and
 * relies on the out-of-memory recovery. */
#include <stdio.h>

#include "train.h"
#include "train_run.h"

static double mib(int64_t b) { return (double)b / 1048576.0; }

/* The bytes the step may reserve on the device: 0 when there is no bound. */
static int64_t device_bound(const train_run *r) {
    kiln_memory_stats ms;
    int64_t bound = 0;
    if (kiln_memory_stats_get(r->dev, &ms) == KILN_OK && ms.limit_bytes) bound = (int64_t)ms.limit_bytes;
    if (r->dev.type == KILN_DEVICE_CUDA) {
        size_t free_b = 0, total_b = 0;
        if (kiln_device_mem_info(r->dev, &free_b, &total_b) == KILN_OK && total_b) {
            int64_t room = (int64_t)free_b + (int64_t)kiln_memory_reserved(r->dev);
            if (!bound || room < bound) bound = room;
        }
    }
    kiln_error_clear();
    return bound;
}

kiln_status train_plan_run(const train_run *r, int accum, int checkpoint, kiln_plan *p) {
    kiln_plan_opts o = kiln_plan_defaults();
    o.model = r->a.model ? r->a.model : r->a.resume ? r->resume_from : "the default model";
    o.model_text = r->spec_text;
    o.channels = r->info.channels, o.height = r->info.height, o.width = r->info.width;
    o.batch = r->a.batch;
    o.device = r->dev;
    o.amp = r->amp;
    o.checkpoint = checkpoint >= 0 ? checkpoint : kiln_nn_sequential_checkpoint_segments(r->model);
    o.accum = accum;
    o.steps = 2;
    return kiln_plan_step(&o, p);
}

static void say_plan(const kiln_plan *p, int64_t bound) {
    const kiln_plan_memory *d = &p->memory[0];
    fprintf(stderr,
            "kiln train: plan: the step needs %.1f MiB reserved on %s at its peak (%.1f MiB allocated, in the %s%s%s)",
            mib(d->reserved_peak), d->name, mib(d->allocated_peak), d->phase, d->op[0] ? " at " : "", d->op);
    if (bound)
        fprintf(stderr, ", %s the %.1f MiB it may use\n", d->reserved_peak <= bound ? "within" : "over", mib(bound));
    else
        fprintf(stderr, "; no limit set\n");
}

static void record(train_run *r, const kiln_plan *p, int64_t bound, int accum) {
    const kiln_plan_memory *d = &p->memory[0];
    int64_t micro = (r->a.batch + accum - 1) / accum;
    train_metric(r,
                 "{\"event\":\"plan\",\"device\":\"%s\",\"reserved_peak\":%lld,\"allocated_peak\":%lld,"
                 "\"pinned_reserved_peak\":%lld,\"phase\":\"%s\",\"op\":\"%s\",\"limit\":%lld,\"micro_batch\":%lld,"
                 "\"accum\":%d}\n",
                 d->name, (long long)d->reserved_peak, (long long)d->allocated_peak,
                 (long long)p->memory[1].reserved_peak, d->phase, d->op, (long long)bound, (long long)micro, accum);
}

int train_plan_setup(train_run *r) {
    r->planned = false;
    if (r->a.no_plan) return 0;
    if (r->world > 1 || r->n_devices > 0) {
        fprintf(stderr, "kiln train: plan: not planned with %s (the plan covers one process on one device); the "
                        "out-of-memory recovery still applies\n",
                r->world > 1 ? "several processes" : "several devices");
        return 0;
    }
    kiln_plan p;
    if (train_plan_run(r, r->accum_live, -1, &p) != KILN_OK) {
        /* The run can go on without a prediction: say why there is none. */
        fprintf(stderr, "kiln train: plan: no prediction: %s; going on without one\n", kiln_error_message());
        kiln_error_clear();
        return 0;
    }
    int64_t bound = device_bound(r);
    say_plan(&p, bound);
    int accum = r->accum_live;
    int64_t n = r->a.batch;
    if (bound && p.memory[0].reserved_peak > bound) {
        if (r->a.no_auto_batch) {
            fprintf(stderr, "kiln train: plan: the first steps will run out of memory; --no-auto-batch: the "
                            "micro-batch stays\n");
        } else {
            kiln_plan q = p;
            while (q.memory[0].reserved_peak > bound && (n + accum - 1) / accum > 1) {
                accum = (int64_t)accum * 2 < n ? accum * 2 : (int)n;
                if (train_plan_run(r, accum, -1, &q) != KILN_OK) return train_fail("train", "the plan of a smaller micro-batch");
            }
            if (q.memory[0].reserved_peak > bound) {
                fprintf(stderr,
                        "kiln train: plan: even micro-batches of one sample need %.1f MiB reserved on %s, more than "
                        "the %.1f MiB it may use: use a smaller model, --checkpoint N, --amp, or a device with more "
                        "memory (--no-plan runs it anyway)\n",
                        mib(q.memory[0].reserved_peak), q.memory[0].name, mib(bound));
                record(r, &q, bound, accum);
                return 1;
            }
            fprintf(stderr,
                    "kiln train: plan: micro-batches of %lld (accumulation %d, the batch of %lld unchanged) need "
                    "%.1f MiB: the step runs in those\n",
                    (long long)((n + accum - 1) / accum), accum, (long long)n, mib(q.memory[0].reserved_peak));
            p = q;
            r->accum_live = accum;
        }
    }
    record(r, &p, bound, accum);
    r->plan_reserved = p.memory[0].reserved_peak;
    r->plan_allocated = p.memory[0].allocated_peak;
    r->planned = true;
    /* As the plan starts: nothing cached, the peaks from here. */
    if (kiln_device_synchronize(r->dev) != KILN_OK || kiln_empty_cache(r->dev) != KILN_OK ||
        kiln_memory_reset_peak(r->dev) != KILN_OK)
        return train_fail("train", "the allocator's peaks");
    return 0;
}

void train_plan_check(train_run *r) {
    if (!r->planned) return;
    r->planned = false;
    kiln_memory_stats ms;
    if (kiln_memory_stats_get(r->dev, &ms) != KILN_OK) {
        kiln_error_clear();
        return;
    }
    int64_t res = ms.reserved_bytes[KILN_POOL_ALL].peak, alloc = ms.allocated_bytes[KILN_POOL_ALL].peak;
    double er = res ? 100.0 * (double)(r->plan_reserved - res) / (double)res : 0;
    double ea = alloc ? 100.0 * (double)(r->plan_allocated - alloc) / (double)alloc : 0;
    fprintf(stderr,
            "kiln train: plan against the first two steps: %.1f MiB reserved measured (plan %+.1f%%), %.1f MiB "
            "allocated (plan %+.1f%%)\n",
            mib(res), er, mib(alloc), ea);
    train_metric(r,
                 "{\"event\":\"plan_check\",\"reserved_peak\":%lld,\"allocated_peak\":%lld,\"planned_reserved_peak\":"
                 "%lld,\"planned_allocated_peak\":%lld}\n",
                 (long long)res, (long long)alloc, (long long)r->plan_reserved, (long long)r->plan_allocated);
}
