/* A complete training program on the public API: the tutorial CNN on
 * Fashion-MNIST, the C counterpart of the tutorials' PyTorch loop
 *
 *     for epoch in range(EPOCHS):
 *         model.train()
 *         for x, y in train_loader:
 *             opt.zero_grad(); loss = F.cross_entropy(model(x), y)
 *             loss.backward(); opt.step()
 *         model.eval(); evaluate(model, test_loader)
 *     save(model, opt)
 *
 * usage: example_train [LIMIT [EPOCHS]]: LIMIT > 0 trains and tests on the
 * first LIMIT samples of each split (a quick run). Needs the Debian package
 * dataset-fashion-mnist; without it, says so and exits 77. */
#include <stdio.h>
#include <stdlib.h>

#include <kiln/kiln.h>

static const char *const model_spec = /* OptimizedCNN, models/tutorial_cnn_28x28x1.txt */
    "conv 32 k3 p1\nrelu\nmaxpool 2\nconv 64 k3 p1\nrelu\nmaxpool 2\n"
    "conv 128 k3 p1\nrelu\nmaxpool 2\nflatten\nlinear 512\nrelu\nlinear 10\n";

static int fail(const char *what) {
    fprintf(stderr, "train: %s: %s\n", what, kiln_error_message());
    return 1;
}

/* The first `limit` samples of `ds` (all when limit <= 0), as an in-memory dataset. */
static kiln_dataset *first_samples(kiln_dataset *ds, int64_t limit) {
    int64_t n = limit > 0 && limit < kiln_dataset_length(ds) ? limit : kiln_dataset_length(ds);
    kiln_sample_info info = kiln_dataset_info(ds);
    size_t bytes = kiln_sample_bytes(info);
    unsigned char *data = malloc((size_t)n * bytes);
    int64_t *labels = malloc((size_t)n * sizeof *labels);
    kiln_dataset *out = NULL;
    bool ok = data && labels;
    for (int64_t i = 0; ok && i < n; i++) ok = kiln_dataset_get(ds, i, data + (size_t)i * bytes, &labels[i]) == KILN_OK;
    kiln_tensor *x = ok ? kiln_from_data(KILN_SHAPE(n, info.channels, info.height, info.width), KILN_U8, KILN_CPU, data)
                        : NULL;
    kiln_tensor *y = x ? kiln_from_data(KILN_SHAPE(n), KILN_I64, KILN_CPU, labels) : NULL;
    if (y && kiln_dataset_from_tensors(x, y, info.num_classes, &out) != KILN_OK) out = NULL;
    kiln_release(x); /* the dataset keeps its own references */
    kiln_release(y);
    free(data);
    free(labels);
    kiln_dataset_free(ds);
    return out;
}

static kiln_loader *loader(kiln_dataset *ds, bool shuffle) {
    kiln_loader_opts o = kiln_loader_opts_default();
    o.batch_size = 128;
    o.shuffle = shuffle;
    o.num_workers = 1;
    o.transforms.normalize = true;
    o.transforms.mean[0] = 0.2860f; /* Fashion-MNIST's statistics */
    o.transforms.std[0] = 0.3530f;
    kiln_loader *l = NULL;
    return kiln_loader_create(ds, &o, &l) == KILN_OK ? l : NULL;
}

/* Test accuracy in eval mode, without autograd. */
static double evaluate(kiln_module *model, kiln_loader *test) {
    kiln_module_train(model, false);
    kiln_no_grad_begin();
    int64_t correct = 0, seen = 0;
    kiln_loader_epoch_begin(test, 0);
    for (;;) {
        kiln_scope_begin();
        kiln_tensor *x = NULL, *y = NULL, *hits = NULL;
        double h = 0;
        if (kiln_loader_next(test, &x, &y) != KILN_OK || !x) {
            kiln_scope_end();
            break;
        }
        hits = kiln_sum(kiln_eq(kiln_argmax(kiln_module_forward(model, x), 1, false), y), 0, NULL, false);
        if (hits && kiln_item(hits, &h) == KILN_OK) correct += (int64_t)h;
        seen += kiln_size(x, 0);
        kiln_scope_end();
    }
    kiln_grad_mode_end();
    kiln_module_train(model, true);
    return seen ? (double)correct / (double)seen : 0;
}

int main(int argc, char **argv) {
    int64_t limit = argc > 1 ? atoll(argv[1]) : 0;
    int epochs = argc > 2 ? atoi(argv[2]) : 1;
    if (kiln_init()) return fail("kiln_init");
    kiln_dataset *train_ds = NULL, *test_ds = NULL;
    if (kiln_dataset_open_fashion_mnist(NULL, "train", &train_ds) != KILN_OK ||
        kiln_dataset_open_fashion_mnist(NULL, "test", &test_ds) != KILN_OK) {
        printf("SKIPPED: Fashion-MNIST not found (install the Debian package dataset-fashion-mnist): %s\n",
               kiln_error_message());
        kiln_dataset_free(train_ds);
        return 77;
    }
    train_ds = first_samples(train_ds, limit);
    test_ds = first_samples(test_ds, limit);
    kiln_loader *train = train_ds ? loader(train_ds, true) : NULL, *test = test_ds ? loader(test_ds, false) : NULL;
    if (!train || !test) return fail("data");

    kiln_manual_seed(0);
    kiln_module *model = NULL;
    if (kiln_model_spec_parse(model_spec, "tutorial_cnn", 1, 28, 28, &model) != KILN_OK) return fail("model");
    kiln_tensor **params = NULL;
    int n_params = 0;
    if (kiln_module_parameters(model, &params, &n_params) != KILN_OK) return fail("parameters");
    kiln_optimizer *opt = kiln_adam(params, n_params, NULL); /* Adam, lr 1e-3 */
    free(params);
    if (!opt) return fail("optimizer");

    for (int epoch = 0; epoch < epochs; epoch++) {
        double loss_sum = 0;
        int64_t steps = 0;
        kiln_loader_epoch_begin(train, epoch);
        for (;;) {
            kiln_scope_begin(); /* owns every tensor of the step */
            kiln_tensor *x = NULL, *y = NULL;
            if (kiln_loader_next(train, &x, &y) != KILN_OK || !x) {
                kiln_scope_end();
                break;
            }
            kiln_optimizer_zero_grad(opt, true);
            kiln_tensor *loss = kiln_cross_entropy(kiln_module_forward(model, x), y, NULL);
            double v = 0;
            if (!loss || kiln_backward(loss, NULL, false) || kiln_optimizer_step(opt) || kiln_item(loss, &v))
                return fail("step");
            loss_sum += v, steps++;
            kiln_scope_end();
        }
        printf("epoch %d: train loss %.4f, test accuracy %.2f%%\n", epoch + 1, steps ? loss_sum / (double)steps : 0,
               100 * evaluate(model, test));
    }

    kiln_train_state state = {.epoch = epochs, .epochs_done = epochs, .step = kiln_optimizer_step_count(opt),
                              .input_c = 1, .input_h = 28, .input_w = 28, .model_spec = (char *)model_spec};
    if (kiln_checkpoint_save("example_train.safetensors", model, opt, &state)) return fail("checkpoint");
    printf("checkpoint: example_train.safetensors\n");
    kiln_loader_free(train);
    kiln_loader_free(test);
    kiln_dataset_free(train_ds);
    kiln_dataset_free(test_ds);
    kiln_optimizer_free(opt);
    kiln_module_free(model);
    kiln_shutdown();
    return 0;
}
