/* DataParallel (PyTorch's nn.DataParallel): one process, several devices.
 * The master module lives on devices[0]. Each forward
 *   1. scatters the input along dim 0 (uneven splits allowed: the first
 *      n % k chunks get one more sample), with kiln_to;
 *   2. brings each replica's parameters up to date: a kiln_to of the
 *      master's parameter, recorded by autograd, so backward returns every
 *      replica's gradient to the master's device, where the leaf sums them
 *      (the reduce); buffers are copied from the master when its version
 *      changed. Without grad mode a replica's copies are kept while the
 *      master's versions are unchanged, so inference copies once per update;
 *   3. runs the replicas, one host thread per device (PyTorch's
 *      parallel_apply): the calling thread runs the master on devices[0],
 *      persistent worker threads run the persistent replicas (the module's
 *      structure cloned once) on the others, each with the caller's grad
 *      mode, autocast regions and current streams;
 *   4. gathers the outputs on output_device with kiln_to and kiln_cat.
 * Every replica is brought up to date (2) before any forward (3) starts,
 * so no replica reads a buffer the master's forward is updating.
 * kiln_nn_data_parallel_loss runs a loss inside each replica instead of on
 * the gathered output (the tutorials' remedy for the main device's load). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kiln/amp.h"
#include "base/log_internal.h"
#include "nn/module_internal.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

#define DP_MAX_DEVICES 16 /* kiln_cat's limit */

/* One device's share of a forward: what the caller hands a worker, and
 * what comes back. */
typedef struct dp_job {
    kiln_module *run; /* the master or a replica */
    kiln_tensor *x, *target; /* the whole batch (borrowed); target NULL without a loss */
    int64_t start, len;
    kiln_device dev, output;
    kiln_nn_dp_loss_fn loss;
    void *loss_user;
    /* The caller's context, set on the worker thread. */
    bool grad;
    bool autocast[KILN_DEVICE_TYPE_COUNT];
    kiln_dtype autocast_dtype[KILN_DEVICE_TYPE_COUNT];
    int n_streams;
    kiln_stream *streams[DP_MAX_DEVICES + 1];
    kiln_tensor *y; /* the share's output (or loss) on `output`; NULL with err set */
    kiln_error err;
} dp_job;

typedef struct dp_state dp_state;
typedef struct dp_worker {
    dp_state *s;
    pthread_t thread;
    bool started;
    dp_job *job; /* set by the caller, cleared by the worker when done */
} dp_worker;

struct dp_state {
    int n;
    kiln_device devices[DP_MAX_DEVICES];
    kiln_device output;
    kiln_module *replicas[DP_MAX_DEVICES]; /* [0] NULL: the master runs there */
    /* Worker threads for devices 1..n-1, started at the first forward
     * that uses them; mu guards their job slots and quit. */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    bool quit, sync_ready;
    dp_worker workers[DP_MAX_DEVICES];
};

static void *worker_main(void *arg);

static void dp_free(void *p) {
    dp_state *s = p;
    if (!s) return;
    if (s->sync_ready) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->mu);
        for (int i = 1; i < s->n; i++)
            if (s->workers[i].started) pthread_join(s->workers[i].thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->done);
    }
    for (int i = 0; i < s->n; i++) kiln_module_free(s->replicas[i]);
    free(s);
}

/* Starts the worker of device i (once); false when the thread could not be
 * made, in which case the caller runs that share itself. */
static bool worker_start(dp_state *s, int i) {
    dp_worker *w = &s->workers[i];
    if (w->started) return true;
    w->s = s;
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        static bool warned;
        if (!warned) kiln_log_write(KILN_LOG_WARN, "DataParallel: could not start a host thread for a replica; it runs from the calling thread");
        warned = true;
        return false;
    }
    w->started = true;
    return true;
}

/* The master's structure with no-grad copies of its tensors on `dev`. */
static kiln_module *clone_on(const kiln_module *m, kiln_device dev) {
    kiln_module *r = kiln_module_new(m->kind, m->forward);
    if (!r) return NULL;
    if (m->kind_owned) {
        char *k = malloc(strlen(m->kind) + 1);
        if (!k) {
            kiln_module_free(r);
            return NULL;
        }
        strcpy(k, m->kind);
        r->kind = k, r->kind_owned = true;
    }
    r->training = m->training, r->keep_f32 = m->keep_f32, r->cfg = m->cfg;
    r->user_forward = m->user_forward, r->user = m->user;
    /* The master's version of each parameter and buffer at the last copy. */
    r->state = calloc((size_t)(m->params.n + m->buffers.n) + 1, sizeof(uint64_t));
    r->free_state = free;
    kiln_status st = r->state ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < 2 && !st; k++) {
        const kiln_module_slots *set = k == 0 ? &m->params : &m->buffers;
        for (int i = 0; i < set->n && !st; i++) {
            kiln_tensor *t = set->items[i].u.tensor;
            kiln_tensor *c = kiln_to(t, dev, kiln_dtype_of(t), KILN_COPY);
            if (!c) {
                st = kiln_error_last()->status;
                break;
            }
            ((uint64_t *)r->state)[(k == 0 ? 0 : m->params.n) + i] = kiln_tensor_version(t);
            st = k == 0 ? kiln_module_add_parameter(r, set->items[i].name, c)
                        : kiln_module_add_buffer(r, set->items[i].name, c);
            kiln_tensor_drop(c);
        }
    }
    for (int i = 0; i < m->children.n && !st; i++) {
        kiln_module *c = clone_on(m->children.items[i].u.child, dev);
        st = c ? kiln_module_add_child(r, m->children.items[i].name, c) : kiln_error_last()->status;
    }
    if (st) {
        kiln_module_free(r);
        return NULL;
    }
    return r;
}

/* Replica r (same structure as m) brought up to date: parameters as
 * recorded copies of the master's under grad mode (else refreshed only
 * when the master's version moved), buffers when their version moved;
 * the mode follows the master's. */
static kiln_status refresh(const kiln_module *m, kiln_module *r, kiln_device dev) {
    r->training = m->training;
    bool grad = kiln_is_grad_enabled();
    for (int k = 0; k < 2; k++) {
        const kiln_module_slots *set = k == 0 ? &m->params : &m->buffers;
        kiln_module_slots *rset = k == 0 ? &r->params : &r->buffers;
        for (int i = 0; i < set->n; i++) {
            kiln_tensor *t = set->items[i].u.tensor, **slot = &rset->items[i].u.tensor;
            uint64_t *seen = &((uint64_t *)r->state)[(k == 0 ? 0 : m->params.n) + i];
            bool recorded = k == 0 && grad;
            if (!recorded && *seen == kiln_tensor_version(t)) continue; /* unchanged since the last copy */
            kiln_tensor *c;
            if (recorded) {
                c = kiln_to(t, dev, kiln_dtype_of(t), 0);
            } else {
                kiln_no_grad_begin();
                c = kiln_to(t, dev, kiln_dtype_of(t), 0);
                kiln_grad_mode_end();
            }
            if (!c) return kiln_error_last()->status;
            kiln_tensor_drop(*slot);
            *slot = c;
            *seen = kiln_tensor_version(t);
        }
    }
    for (int i = 0; i < m->children.n; i++)
        KILN_TRY(refresh(m->children.items[i].u.child, r->children.items[i].u.child, dev));
    return KILN_OK;
}

/* After a replica's forward: its recorded parameter copies become plain
 * aliases (the ops saved what backward needs), so the replica keeps the
 * data between steps but no autograd node outlives the step. */
static kiln_status detach_params(kiln_module *r) {
    for (int i = 0; i < r->params.n; i++) {
        kiln_tensor **slot = &r->params.items[i].u.tensor;
        if (!kiln_grad_fn_name(*slot)) continue;
        kiln_tensor *d = kiln_detach(*slot);
        if (!d) return kiln_error_last()->status;
        kiln_tensor_drop(*slot);
        *slot = d;
    }
    for (int i = 0; i < r->children.n; i++) KILN_TRY(detach_params(r->children.items[i].u.child));
    return KILN_OK;
}

/* The share's forward (and loss), run on whichever thread holds the job:
 * its slice of the batch to its device, the replica, the output (or the
 * loss) to the output device. */
static kiln_tensor *share_body(dp_job *j, bool replica) {
    kiln_tensor *xj = kiln_narrow(j->x, 0, j->start, j->len);
    kiln_tensor *xd = xj ? kiln_to(xj, j->dev, kiln_dtype_of(xj), 0) : NULL;
    if (xj) kiln_tensor_drop(xj);
    kiln_tensor *yj = xd ? kiln_module_forward(j->run, xd) : NULL;
    if (xd) kiln_tensor_drop(xd);
    if (yj && j->loss) {
        kiln_tensor *tj = kiln_narrow(j->target, 0, j->start, j->len);
        kiln_tensor *td = tj ? kiln_to(tj, j->dev, kiln_dtype_of(tj), 0) : NULL;
        if (tj) kiln_tensor_drop(tj);
        kiln_tensor *l = td ? j->loss(yj, td, j->loss_user) : NULL;
        if (td) kiln_tensor_drop(td);
        kiln_tensor_drop(yj);
        yj = l;
        if (l && kiln_numel(l) != 1) {
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "return the mean loss over the share, a scalar",
                       "kiln_nn_data_parallel_loss: the loss function returned %lld elements, not one",
                       (long long)kiln_numel(l));
            kiln_tensor_drop(l);
            yj = NULL;
        }
    }
    if (replica && detach_params(j->run) && yj) {
        kiln_tensor_drop(yj);
        yj = NULL;
    }
    kiln_tensor *y = yj ? kiln_to(yj, j->output, kiln_dtype_of(yj), 0) : NULL;
    if (yj) kiln_tensor_drop(yj);
    return y;
}

/* On a worker thread: the caller's grad mode, autocast regions, device and
 * streams around share_body; the error, if any, into the job. */
static void run_on_worker(dp_job *j) {
    kiln_error_clear();
    kiln_api_enter();
    if (j->grad) kiln_enable_grad_begin();
    else kiln_no_grad_begin();
    int casts = 0;
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++)
        if (j->autocast[t] && !kiln_autocast_begin((kiln_device_type)t, j->autocast_dtype[t])) casts++;
    for (int i = 0; i < j->n_streams; i++) kiln_set_stream(j->streams[i]);
    kiln_tensor *y = kiln_set_device(j->dev) ? NULL : share_body(j, true);
    while (casts-- > 0) kiln_autocast_end();
    kiln_grad_mode_end();
    kiln_api_leave();
    j->y = y;
    if (!y) j->err = *kiln_error_last();
}

static void *worker_main(void *arg) {
    dp_worker *w = arg;
    dp_state *s = w->s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!w->job && !s->quit) pthread_cond_wait(&s->work, &s->mu);
        if (s->quit) break;
        dp_job *j = w->job;
        pthread_mutex_unlock(&s->mu);
        run_on_worker(j);
        pthread_mutex_lock(&s->mu);
        w->job = NULL;
        pthread_cond_broadcast(&s->done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Scatter, replicate, parallel apply, gather: the outputs (loss NULL) or
 * the sample-weighted mean of the shares' losses, on the output device. */
static kiln_tensor *dp_run(kiln_module *m, kiln_tensor *x, kiln_tensor *target, kiln_nn_dp_loss_fn loss, void *user) {
    dp_state *s = m->state;
    kiln_module *master = m->children.items[0].u.child;
    int64_t n = x->shape[0];
    int k = s->n < n ? s->n : (int)(n > 0 ? n : 1);
    dp_job jobs[DP_MAX_DEVICES];
    memset(jobs, 0, sizeof jobs);
    /* Replicate: every replica up to date before any forward. */
    for (int d = 1; d < k; d++) {
        if (!s->replicas[d] && !(s->replicas[d] = clone_on(master, s->devices[d]))) return NULL;
        if (refresh(master, s->replicas[d], s->devices[d])) return NULL;
    }
    dp_job ctx = {.x = x, .target = target, .loss = loss, .loss_user = user, .output = s->output,
                  .grad = kiln_is_grad_enabled()};
    for (int t = 0; t < KILN_DEVICE_TYPE_COUNT; t++) {
        ctx.autocast[t] = kiln_autocast_enabled((kiln_device_type)t);
        ctx.autocast_dtype[t] = kiln_autocast_dtype((kiln_device_type)t);
    }
    for (int d = 0; d < k; d++) ctx.streams[ctx.n_streams++] = kiln_current_stream(s->devices[d]);
    ctx.streams[ctx.n_streams++] = kiln_current_stream(s->output);
    if (!s->sync_ready && k > 1) {
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->work, NULL);
        pthread_cond_init(&s->done, NULL);
        s->sync_ready = true;
    }
    bool threaded[DP_MAX_DEVICES] = {false};
    for (int d = 0; d < k; d++) {
        jobs[d] = ctx;
        jobs[d].run = d == 0 ? master : s->replicas[d];
        jobs[d].dev = s->devices[d];
        kiln_nn_batch_chunk(n, k, d, &jobs[d].start, &jobs[d].len);
    }
    /* Apply: the workers take devices 1..k-1, this thread device 0. */
    if (k > 1) {
        pthread_mutex_lock(&s->mu);
        for (int d = 1; d < k; d++)
            if ((threaded[d] = worker_start(s, d))) s->workers[d].job = &jobs[d];
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->mu);
    }
    for (int d = 0; d < k; d++) {
        if (threaded[d]) continue;
        jobs[d].y = share_body(&jobs[d], d > 0);
        if (!jobs[d].y) jobs[d].err = *kiln_error_last();
    }
    if (k > 1) {
        pthread_mutex_lock(&s->mu);
        for (int d = 1; d < k; d++)
            while (threaded[d] && s->workers[d].job) pthread_cond_wait(&s->done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    /* Gather. */
    kiln_tensor *outs[DP_MAX_DEVICES], *y = NULL;
    int failed = -1;
    for (int d = 0; d < k; d++) {
        outs[d] = jobs[d].y;
        if (!outs[d] && failed < 0) failed = d;
    }
    if (failed >= 0) {
        const kiln_error *e = &jobs[failed].err;
        char dev[32];
        kiln_device_str(s->devices[failed], dev, sizeof dev);
        kiln_error_raise(e->status ? e->status : KILN_ERR_INTERNAL, e->file ? e->file : __FILE__, e->line,
                         e->hint[0] ? e->hint : NULL, "DataParallel: the replica on %s failed: %s", dev, e->message);
    } else if (!loss) {
        y = k == 1 ? kiln_retain(outs[0]) : kiln_cat(k, outs, 0);
    } else {
        /* sum_d (len_d / n) loss_d: the whole batch's mean for uneven shares too. */
        for (int d = 0; d < k; d++) {
            kiln_tensor *w = kiln_mul_scalar(outs[d], (double)jobs[d].len / (double)n);
            kiln_tensor *acc = w && y ? kiln_add(y, w) : NULL;
            if (y) kiln_tensor_drop(y);
            y = y ? acc : w;
            if (w && acc) kiln_tensor_drop(w);
            if (!y) break;
        }
    }
    for (int d = 0; d < k; d++)
        if (outs[d]) kiln_tensor_drop(outs[d]);
    return y;
}

static kiln_status check_batch(const kiln_tensor *x, const char *what) {
    KILN_TRY(kiln_tensor_check(x, what));
    if (x->ndim < 1)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a batch: dim 0 is scattered over the devices",
                          "%s: the input is a scalar", what);
    return KILN_OK;
}

static kiln_tensor *dp_forward(kiln_module *m, kiln_tensor *x) {
    if (check_batch(x, "DataParallel")) return NULL;
    return dp_run(m, x, NULL, NULL, NULL);
}

static bool is_data_parallel(const kiln_module *m) { return m && m->forward == dp_forward; }

kiln_tensor *kiln_nn_data_parallel_loss(kiln_module *dp, kiln_tensor *x, kiln_tensor *target, kiln_nn_dp_loss_fn loss,
                                        void *user) {
    kiln_api_enter();
    kiln_tensor *y = NULL;
    const char *fn = "kiln_nn_data_parallel_loss";
    if (!is_data_parallel(dp))
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass the module kiln_nn_data_parallel returned",
                   "%s: the module is %s, not DataParallel", fn, dp ? kiln_module_kind(dp) : "NULL");
    else if (!loss)
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass a loss function", "%s: the loss function is NULL", fn);
    else if (!check_batch(x, fn) && !check_batch(target, fn)) {
        if (target->shape[0] != x->shape[0])
            KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "give one target per sample",
                       "%s: the input has %lld samples but the target %lld", fn, (long long)x->shape[0],
                       (long long)target->shape[0]);
        else
            y = dp_run(dp, x, target, loss, user);
    }
    return kiln_api_return(y);
}

kiln_module *kiln_nn_data_parallel(kiln_module *module, const kiln_device *devices, int n, kiln_device output_device) {
    const char *bad = NULL;
    kiln_device named = output_device;
    if (!module) bad = "the module is NULL (check its constructor's error)";
    else if (n < 1 || n > DP_MAX_DEVICES || !devices) bad = "give 1..16 devices";
    for (int i = 0; !bad && i < n; i++) {
        named = devices[i];
        if (!kiln_device_is_available(devices[i]) || devices[i].type == KILN_DEVICE_META)
            bad = "a device is not available";
        for (int j = 0; !bad && j < i; j++)
            if (kiln_device_equal(devices[i], devices[j])) bad = "a device is listed twice";
    }
    if (!bad && !kiln_device_is_available(output_device)) {
        named = output_device;
        bad = "the output device is not available";
    }
    if (bad) {
        char dev[32] = "";
        if (module && n >= 1 && n <= DP_MAX_DEVICES && devices) kiln_device_str(named, dev, sizeof dev);
        KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "see kiln_nn_data_parallel in kiln/nn.h", "kiln_nn_data_parallel: %s%s%s%s",
                   bad, dev[0] ? " (" : "", dev, dev[0] ? ")" : "");
        kiln_module_free(module);
        return NULL;
    }
    dp_state *s = calloc(1, sizeof *s);
    kiln_module *m = s ? kiln_module_new("DataParallel", dp_forward) : NULL;
    if (!m) {
        free(s);
        kiln_module_free(module);
        KILN_RAISE(KILN_ERR_OUT_OF_MEMORY, NULL, "kiln_nn_data_parallel: out of host memory");
        return NULL;
    }
    m->state = s, m->free_state = dp_free;
    m->spans_devices = true;
    s->n = n, s->output = output_device;
    memcpy(s->devices, devices, sizeof(kiln_device) * (size_t)n);
    kiln_status st = kiln_module_to(module, devices[0]);
    if (st) kiln_module_free(module);
    else st = kiln_module_add_child(m, "module", module);
    if (st) {
        kiln_module_free(m);
        return NULL;
    }
    m->training = module->training;
    return m;
}
