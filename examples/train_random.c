/* A complete minimal training program: a small CNN learns a fixed random
 * dataset of 1x28x28 "images" with 10 classes, the C form of the
 * tutorials' PyTorch loop:
 *
 *     model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8),
 *                           nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
 *                           nn.Linear(8 * 14 * 14, 10))
 *     opt = torch.optim.Adam(model.parameters(), lr=3e-3)
 *     sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
 *     for step in range(STEPS):
 *         x, y = batch(step)
 *         loss = F.cross_entropy(model(x), y)
 *         opt.zero_grad(); loss.backward()
 *         clip_grad_norm_(model.parameters(), 5.0); opt.step(); sched.step()
 *
 * Every step runs inside a scope, which releases the step's tensors. */
#include <stdio.h>
#include <stdlib.h>

#include <kiln/kiln.h>

#define SAMPLES 64
#define BATCH 16
#define STEPS 24

static int fail(const char *what) {
    fprintf(stderr, "train_random: %s: %s\n", what, kiln_error_message());
    return 1;
}

static kiln_module *build_model(void) {
    kiln_module *layers[] = {
        kiln_nn_conv2d(1, 8, 3, 1, 1, 1, 1, true),      /* (N, 8, 28, 28) */
        kiln_nn_batch_norm2d(8, 1e-5, 0.1, true, true), /* statistics in f32 */
        kiln_nn_relu(),
        kiln_nn_max_pool2d(2, 0, 0),                    /* (N, 8, 14, 14) */
        kiln_nn_flatten(1, -1),                         /* (N, 1568) */
        kiln_nn_linear(8 * 14 * 14, 10, true),          /* (N, 10) logits */
    };
    return kiln_nn_sequential(6, layers); /* takes ownership of the layers */
}

/* One step on batch b; returns the loss, or a negative value on error. */
static double train_step(kiln_module *model, kiln_optimizer *opt, kiln_tensor *const *params, int n_params,
                         kiln_tensor *x, kiln_tensor *y, int b) {
    double loss_value = -1.0;
    kiln_scope_begin(); /* owns every tensor returned below */
    kiln_tensor *xb = kiln_narrow(x, 0, (int64_t)b * BATCH, BATCH); /* (16, 1, 28, 28) */
    kiln_tensor *yb = kiln_narrow(y, 0, (int64_t)b * BATCH, BATCH); /* (16) */
    kiln_tensor *logits = kiln_module_forward(model, xb);
    kiln_loss_opts lo = kiln_loss_defaults();
    kiln_tensor *loss = logits ? kiln_cross_entropy(logits, yb, &lo) : NULL;
    if (loss && !kiln_optimizer_zero_grad(opt, true) && !kiln_backward(loss, NULL, false) &&
        kiln_clip_grad_norm(params, n_params, 5.0, 2.0) >= 0 && !kiln_optimizer_step(opt) &&
        !kiln_item(loss, &loss_value)) {
        /* loss_value holds this step's loss (kiln_item waits for it) */
    } else {
        loss_value = -1.0;
    }
    kiln_scope_end(); /* frees xb, yb, logits, loss; grads and Adam state live on */
    return loss_value;
}

int main(void) {
    if (kiln_init()) return fail("kiln_init");
    kiln_manual_seed(0);
    kiln_device dev = kiln_current_device();

    /* A fixed dataset: 64 random images and labels 0..9. */
    kiln_tensor *x = kiln_randn(KILN_SHAPE(SAMPLES, 1, 28, 28), KILN_F32, dev);
    int64_t labels[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) labels[i] = (i * 7 + 3) % 10;
    kiln_tensor *y = kiln_from_data(KILN_SHAPE(SAMPLES), KILN_I64, dev, labels);

    kiln_module *model = build_model();
    if (!x || !y || !model) return fail("setup");
    kiln_tensor **params = NULL;
    int n_params = 0;
    if (kiln_module_parameters(model, &params, &n_params)) return fail("parameters");
    printf("model: %lld parameters in %d tensors\n", (long long)kiln_module_num_parameters(model), n_params);

    kiln_adam_opts ao = kiln_adam_defaults();
    ao.lr = 3e-3;
    kiln_optimizer *opt = kiln_adam(params, n_params, &ao);
    kiln_lr_scheduler *sched = opt ? kiln_lr_cosine_create(opt, STEPS, 0.0) : NULL;
    if (!opt || !sched) return fail("optimizer");

    double first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        double loss = train_step(model, opt, params, n_params, x, y, step % (SAMPLES / BATCH));
        if (loss < 0) return fail("train step");
        if (step == 0) first = loss;
        last = loss;
        if (step % 4 == 0 || step == STEPS - 1)
            printf("step %2d  lr %.5f  loss %.4f\n", step, kiln_optimizer_get_lr(opt), loss);
        if (kiln_lr_scheduler_step(sched)) return fail("scheduler");
    }
    kiln_module_train(model, false); /* eval mode: BatchNorm uses its running statistics */
    printf("loss %.4f -> %.4f\n", first, last);

    kiln_lr_scheduler_free(sched);
    kiln_optimizer_free(opt);
    free(params);
    kiln_module_free(model);
    kiln_release(x);
    kiln_release(y);
    kiln_shutdown();
    return last < first ? 0 : 1;
}
