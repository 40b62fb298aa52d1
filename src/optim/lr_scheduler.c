/* Learning-rate schedules in the closed forms of torch.optim.lr_scheduler.
 * A schedule is a pure function of the epoch; stepping sets the
 * optimizer's lr to it. */
#include <math.h>
#include <stdlib.h>

#include "base/error.h"
#include "optim/optim_internal.h"

typedef enum sched_kind { SCHED_STEP, SCHED_COSINE, SCHED_WARMUP, SCHED_ONE_CYCLE } sched_kind;

struct kiln_lr_scheduler {
    sched_kind kind;
    kiln_optimizer *opt; /* borrowed */
    double base_lr, last_lr;
    int64_t epoch;
    int64_t n;    /* step_size, t_max, total_iters, total_steps */
    double a, b;  /* gamma; eta_min; start_factor; (one-cycle: initial lr, max lr) */
    double c, d;  /* one-cycle: min lr, end of the warm-up phase (a step, float) */
};

static const double PI = 3.14159265358979323846;

/* OneCycleLR's _annealing_cos: from start (pct 0) to end (pct 1). */
static double anneal_cos(double start, double end, double pct) {
    return end + (start - end) / 2.0 * (cos(PI * pct) + 1.0);
}

static double lr_at(const kiln_lr_scheduler *s, int64_t e) {
    switch (s->kind) {
    case SCHED_STEP: return s->base_lr * pow(s->a, (double)(e / s->n));
    case SCHED_COSINE: return s->a + (s->base_lr - s->a) * (1.0 + cos(PI * (double)e / (double)s->n)) / 2.0;
    case SCHED_WARMUP: {
        int64_t k = e < s->n ? e : s->n;
        return s->base_lr * (s->a + (1.0 - s->a) * (double)k / (double)s->n);
    }
    case SCHED_ONE_CYCLE: {
        /* Two phases: [0, d] initial -> max, [d, total - 1] max -> min. */
        double step = (double)e;
        if (step <= s->d) return anneal_cos(s->a, s->b, step / s->d);
        return anneal_cos(s->b, s->c, (step - s->d) / ((double)(s->n - 1) - s->d));
    }
    }
    return s->base_lr;
}

static kiln_lr_scheduler *sched_new(const char *fn, kiln_optimizer *opt, sched_kind kind, int64_t n, double a) {
    if (!opt) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "%s: optimizer is NULL", fn);
        return NULL;
    }
    if (n <= 0) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "the period must be at least one step", "%s: period %lld", fn,
                   (long long)n);
        return NULL;
    }
    kiln_lr_scheduler *s = KILN_CALLOC(1, sizeof *s);
    if (!s) return NULL;
    s->kind = kind;
    s->opt = opt;
    s->base_lr = kiln_optimizer_get_lr(opt);
    s->n = n;
    s->a = a;
    return s;
}

/* The constructor's initial step (epoch 0), as PyTorch's schedulers do. */
static kiln_lr_scheduler *sched_start(kiln_lr_scheduler *s) {
    if (!s) return NULL;
    s->last_lr = lr_at(s, 0);
    if (kiln_optimizer_set_lr(s->opt, s->last_lr)) {
        free(s);
        return NULL;
    }
    return s;
}

kiln_lr_scheduler *kiln_lr_step_create(kiln_optimizer *opt, int64_t step_size, double gamma) {
    return sched_start(sched_new("kiln_lr_step_create", opt, SCHED_STEP, step_size, gamma));
}

kiln_lr_scheduler *kiln_lr_cosine_create(kiln_optimizer *opt, int64_t t_max, double eta_min) {
    return sched_start(sched_new("kiln_lr_cosine_create", opt, SCHED_COSINE, t_max, eta_min));
}

kiln_lr_scheduler *kiln_lr_warmup_create(kiln_optimizer *opt, double start_factor, int64_t total_iters) {
    if (!(start_factor > 0 && start_factor <= 1)) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "PyTorch's LinearLR default is 1/3",
                   "kiln_lr_warmup_create: start_factor %g must be in (0, 1]", start_factor);
        return NULL;
    }
    return sched_start(sched_new("kiln_lr_warmup_create", opt, SCHED_WARMUP, total_iters, start_factor));
}

kiln_lr_scheduler *kiln_lr_one_cycle_create(kiln_optimizer *opt, double max_lr, int64_t total_steps,
                                            double pct_start, double div_factor, double final_div_factor) {
    double warm_end = pct_start * (double)total_steps - 1.0;
    if (!(max_lr > 0) || !(pct_start > 0 && pct_start < 1) || !(div_factor > 0) || !(final_div_factor > 0) ||
        total_steps < 2 || !(warm_end > 0) || !(warm_end < (double)(total_steps - 1))) {
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "PyTorch's defaults: pct_start 0.3, div_factor 25, final_div_factor 1e4",
                   "kiln_lr_one_cycle_create: max_lr %g, total_steps %lld, pct_start %g, div_factor %g, "
                   "final_div_factor %g leave no room for both phases",
                   max_lr, (long long)total_steps, pct_start, div_factor, final_div_factor);
        return NULL;
    }
    kiln_lr_scheduler *s = sched_new("kiln_lr_one_cycle_create", opt, SCHED_ONE_CYCLE, total_steps, 0.0);
    if (!s) return NULL;
    s->a = max_lr / div_factor;
    s->b = max_lr;
    s->c = s->a / final_div_factor;
    s->d = warm_end;
    s->base_lr = s->a;
    return sched_start(s);
}

kiln_status kiln_lr_scheduler_step(kiln_lr_scheduler *s) {
    if (!s) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_lr_scheduler_step: scheduler is NULL");
    if (s->kind == SCHED_ONE_CYCLE && s->epoch + 1 > s->n)
        return KILN_RAISE(KILN_ERR_STATE, "create the schedule with more total_steps",
                          "kiln_lr_scheduler_step: one-cycle stepped %lld times, past total_steps %lld",
                          (long long)(s->epoch + 1), (long long)s->n);
    double lr = lr_at(s, s->epoch + 1);
    KILN_TRY(kiln_optimizer_set_lr(s->opt, lr));
    s->epoch++;
    s->last_lr = lr;
    return KILN_OK;
}

double kiln_lr_scheduler_get_lr(const kiln_lr_scheduler *s) { return s ? s->last_lr : NAN; }

int64_t kiln_lr_scheduler_epoch(const kiln_lr_scheduler *s) { return s ? s->epoch : 0; }

void kiln_lr_scheduler_free(kiln_lr_scheduler *s) { free(s); }
