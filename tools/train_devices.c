/* kiln train on several devices in one process (docs/multi-device.md):
 *   --devices LIST      DataParallel (kiln_nn_data_parallel) over the listed
 *                       devices; the batches, the gather and the loss live
 *                       on the first one;
 *   --split L:D,L:D,... model parallelism: the model's layers (the top-level
 *                       Sequential's children) from each L up to the next
 *                       placed on D (kiln_nn_sequential_place); the batches
 *                       arrive on the first stage's device, the labels and
 *                       the loss live where the output comes out (the last
 *                       stage's device);
 *   --micro-batches K   --split's pipeline: each batch in K micro-batches
 *                       (1..16, default 1).
 * The checkpoint is always the plain model's (no "module." prefix: r->model
 * is the inner module, r->net the wrapper), so a run trained here evaluates
 * with kiln eval on any device and resumes with or without these flags. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "train.h"
#include "train_run.h"

#define DP_MAX_DEVICES 16 /* kiln_nn_data_parallel's limit */
#define MAX_MICRO_BATCHES 16

static const char *const devices_example = "e.g. --devices cuda:0,cuda:1";
static const char *const split_example = "e.g. --split 0:cuda:0,6:cuda:1";

/* `item` (one entry of `flag`'s list `value`) into *out: an available cpu
 * or cuda:N device, never meta. 0, or 2 with the message printed. */
static int parse_device(const char *flag, const char *value, const char *item, const char *example,
                        kiln_device *out) {
    if (kiln_device_parse(item, out) != KILN_OK) {
        const kiln_error *e = kiln_error_last();
        fprintf(stderr, "kiln train: %s %s: device '%s': %s (give devices that kiln info lists, %s)\n", flag, value,
                item, e->message, example);
        return 2;
    }
    if (out->type == KILN_DEVICE_META) {
        fprintf(stderr, "kiln train: %s %s: device 'meta' holds no data: nothing can train there (give cpu or cuda:N, "
                        "%s)\n",
                flag, value, example);
        return 2;
    }
    return 0;
}

/* The next comma-separated entry of *p into buf; false (with the message)
 * when it is empty or too long. */
static bool next_entry(const char *flag, const char *value, const char **p, int index, char *buf, size_t size,
                       const char *example) {
    const char *end = strchr(*p, ',');
    size_t len = end ? (size_t)(end - *p) : strlen(*p);
    if (len == 0 || len >= size) {
        fprintf(stderr, "kiln train: %s '%s': entry %d is %s: give a comma-separated list without spaces, %s\n", flag,
                value, index + 1, len ? "too long" : "empty", example);
        return false;
    }
    memcpy(buf, *p, len);
    buf[len] = '\0';
    *p = end ? end + 1 : *p + len;
    return true;
}

static int parse_devices(train_run *r) {
    const char *v = r->a.devices, *p = v;
    int n = 0, entries = 1;
    for (const char *c = v; *c; c++) entries += *c == ',';
    if (entries > DP_MAX_DEVICES) {
        fprintf(stderr, "kiln train: --devices %s: %d entries, more than %d devices: DataParallel takes 1..%d\n", v,
                entries, DP_MAX_DEVICES, DP_MAX_DEVICES);
        return 2;
    }
    char item[64];
    do {
        if (!next_entry("--devices", v, &p, n, item, sizeof item, devices_example)) return 2;
        if (parse_device("--devices", v, item, devices_example, &r->devices[n])) return 2;
        for (int j = 0; j < n; j++)
            if (kiln_device_equal(r->devices[j], r->devices[n])) {
                fprintf(stderr, "kiln train: --devices %s: %s is listed twice: DataParallel runs one replica per "
                                "device; list each device once (%s)\n",
                        v, item, devices_example);
                return 2;
            }
        n++;
    } while (*p || (p > v && p[-1] == ','));
    r->n_devices = n;
    return 0;
}

/* "LAYER:DEVICE": split at the first colon (the device may hold one). */
static int parse_split(train_run *r) {
    const char *v = r->a.split, *p = v;
    int n = 0;
    char item[96];
    do {
        if (n == KILN_NN_MAX_PLACE_STAGES) {
            fprintf(stderr, "kiln train: --split %s: more than %d stages\n", v, KILN_NN_MAX_PLACE_STAGES);
            return 2;
        }
        if (!next_entry("--split", v, &p, n, item, sizeof item, split_example)) return 2;
        char *colon = strchr(item, ':'), *end = NULL;
        long layer = colon && colon > item && item[0] >= '0' && item[0] <= '9' ? strtol(item, &end, 10) : -1;
        if (layer < 0 || end != colon || layer > 1000000) {
            fprintf(stderr, "kiln train: --split %s: entry '%s' is not LAYER:DEVICE (the first layer of a stage, a "
                            "colon, its device; %s)\n",
                    v, item, split_example);
            return 2;
        }
        if (parse_device("--split", v, colon + 1, split_example, &r->devices[n])) return 2;
        if (n == 0 && layer != 0) {
            fprintf(stderr, "kiln train: --split %s: the first stage starts at layer %ld: it must start at layer 0 "
                            "(%s)\n",
                    v, layer, split_example);
            return 2;
        }
        if (n > 0 && layer <= r->split_first[n - 1]) {
            fprintf(stderr, "kiln train: --split %s: stage %d starts at layer %ld, not after the previous stage's "
                            "layer %d: give the stages' first layers in increasing order (%s)\n",
                    v, n + 1, layer, r->split_first[n - 1], split_example);
            return 2;
        }
        r->split_first[n++] = (int)layer;
    } while (*p || (p > v && p[-1] == ','));
    r->n_devices = n;
    return 0;
}

/* Gradient checkpointing with --devices or --split: refused. The library
 * refuses to checkpoint a placed Sequential; inside DataParallel the
 * replicas' parameter copies are detached after their forward, so a
 * segment recomputed in backward would not return its gradient to the
 * master. The value may come from the resumed run's configuration. */
static int refuse_checkpoint(const train_run *r, const char *flag, const char *value, const char *why) {
    if (r->a.checkpoint <= 1 && !r->a.checkpoint_auto) return 0;
    char ckpt[16];
    if (r->a.checkpoint_auto) snprintf(ckpt, sizeof ckpt, "auto");
    else snprintf(ckpt, sizeof ckpt, "%d", r->a.checkpoint);
    if (r->a.given & TRAIN_GIVEN_CHECKPOINT)
        fprintf(stderr, "kiln train: %s %s cannot be combined with --checkpoint %s: %s; drop one of them\n", flag,
                value, ckpt, why);
    else
        fprintf(stderr, "kiln train: %s %s: the resumed run used --checkpoint %s, which cannot be combined with it "
                        "(%s); add --checkpoint 0 to turn checkpointing off for this run\n",
                flag, value, ckpt, why);
    return 2;
}

/* --device D alone, or --devices, or --split, each checked. */
static int parse_one_device(train_run *r) {
    if (kiln_device_parse(r->a.device, &r->dev) != KILN_OK) {
        fprintf(stderr, "kiln train: --device %s: %s\n", r->a.device, kiln_error_last()->message);
        if (kiln_error_last()->hint[0]) fprintf(stderr, "  hint: %s\n", kiln_error_last()->hint);
        return 2;
    }
    if (r->dev.type != KILN_DEVICE_META) return 0;
    fprintf(stderr, "kiln train: --device %s: meta tensors hold no data: nothing can train there\n"
                    "  hint: train on cpu or cuda:N\n",
            r->a.device);
    return 2;
}

int train_devices_parse(train_run *r) {
    const train_args *a = &r->a;
    r->dev = kiln_default_device();
    if (a->micro_batches && !a->split) {
        fprintf(stderr, "kiln train: --micro-batches %d needs --split: it splits each batch for the pipelined "
                        "stages (--accum N splits a batch on one device)\n",
                a->micro_batches);
        return 2;
    }
    const char *multi = a->devices ? "--devices" : a->split ? "--split" : NULL;
    const char *value = a->devices ? a->devices : a->split;
    if (a->devices && a->split) {
        fprintf(stderr, "kiln train: --devices %s and --split %s cannot be combined (DataParallel replicates the whole "
                        "model; --split places its layers): give one of them\n",
                a->devices, a->split);
        return 2;
    }
    if (multi && a->device) {
        fprintf(stderr, "kiln train: --device %s and %s %s: give one of them (%s names every device the run uses; "
                        "the batches arrive on its first)\n",
                a->device, multi, value, multi);
        return 2;
    }
    if (!multi) return a->device ? parse_one_device(r) : 0;
    int rc = a->devices ? parse_devices(r) : parse_split(r);
    if (rc) return rc;
    if (a->devices)
        rc = refuse_checkpoint(r, "--devices", value,
                               "DataParallel's replicas detach their parameter copies after the forward, so a "
                               "segment recomputed in backward would not reach the master's gradients");
    else
        rc = refuse_checkpoint(r, "--split", value, "a Sequential placed on devices cannot also be checkpointed");
    r->dev = r->devices[0];
    return rc;
}

int train_devices_setup(train_run *r) {
    r->net = r->model;
    r->out_dev = r->dev;
    if (r->a.split) {
        const char *kind = kiln_module_kind(r->model);
        int layers = kiln_module_num_children(r->model);
        if (!kind || strcmp(kind, "Sequential")) {
            fprintf(stderr, "kiln train: --split %s: the model is a %s, not a Sequential: --split places a "
                            "Sequential's layers (a model spec's top-level lines)\n",
                    r->a.split, kind ? kind : "module");
            return 2;
        }
        for (int i = 0; i < r->n_devices; i++)
            if (r->split_first[i] >= layers) {
                fprintf(stderr, "kiln train: --split %s: layer %d is out of range: the model has %d layers (0..%d); "
                                "each stage's first layer must be one of them\n",
                        r->a.split, r->split_first[i], layers, layers - 1);
                return 2;
            }
        int k = r->a.micro_batches ? r->a.micro_batches : 1;
        if (kiln_nn_sequential_place(r->model, r->n_devices, r->split_first, r->devices, k) != KILN_OK)
            return train_fail("train", "--split");
    } else if (r->a.devices) {
        r->net = kiln_nn_data_parallel(r->model, r->devices, r->n_devices, r->devices[0]);
        if (!r->net) {
            r->model = NULL; /* taken by kiln_nn_data_parallel, also on failure */
            return train_fail("train", "--devices");
        }
        r->model = kiln_module_child(r->net, "module");
    }
    return 0;
}

kiln_status train_devices_labels(train_run *r, kiln_tensor **y) {
    if (kiln_device_equal(kiln_get_device(*y), r->out_dev)) return KILN_OK;
    kiln_tensor *moved = kiln_to(*y, r->out_dev, kiln_dtype_of(*y), 0);
    if (!moved) return kiln_error_last()->status;
    *y = moved; /* scoped: the caller's scope releases it */
    return KILN_OK;
}

void train_devices_text(const train_run *r, char *buf, size_t size) {
    char dev[32];
    size_t len = 0;
    buf[0] = '\0';
    if (!r->n_devices) {
        snprintf(buf, size, "%s", kiln_device_str(r->dev, dev, sizeof dev));
        return;
    }
    int layers = r->a.split ? kiln_module_num_children(r->model) : 0;
    for (int i = 0; i < r->n_devices && len < size; i++) {
        kiln_device_str(r->devices[i], dev, sizeof dev);
        if (r->a.split) {
            int last = i + 1 < r->n_devices ? r->split_first[i + 1] - 1 : layers - 1;
            len += (size_t)snprintf(buf + len, size - len, "%s%s (layers %d-%d)", i ? ", " : "", dev,
                                    r->split_first[i], last);
        } else {
            len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", dev);
        }
    }
    if (len >= size) return;
    if (r->a.split)
        snprintf(buf + len, size - len, " in %d micro-batch%s", r->a.micro_batches ? r->a.micro_batches : 1,
                 r->a.micro_batches > 1 ? "es" : "");
    else
        snprintf(buf + len, size - len, " by DataParallel");
}

/* The allocator's peak on `d` over the run (0 when nothing was allocated
 * there: a device the run did not use). */
static long long device_peak(kiln_device d) {
    kiln_memory_stats ms;
    memset(&ms, 0, sizeof ms);
    if (kiln_memory_stats_get(d, &ms) != KILN_OK) {
        kiln_error_clear();
        return 0;
    }
    return (long long)ms.allocated_bytes[KILN_POOL_ALL].peak;
}

/* What ran, not what was asked: the split and micro-batches as the model
 * holds them (kiln_nn_sequential_placement), and each device's peak, so a
 * device the work never reached shows 0 bytes. */
void train_devices_json(const train_run *r, char *buf, size_t size) {
    char dev[32];
    size_t len = 0;
    buf[0] = '\0';
    if (!r->n_devices) return;
    len += (size_t)snprintf(buf, size, ",\"devices\":[");
    for (int i = 0; i < r->n_devices && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s\"%s\"", i ? "," : "",
                                kiln_device_str(r->devices[i], dev, sizeof dev));
    if (len < size) len += (size_t)snprintf(buf + len, size - len, "],\"device_peak_bytes\":[");
    for (int i = 0; i < r->n_devices && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "", device_peak(r->devices[i]));
    if (len < size) len += (size_t)snprintf(buf + len, size - len, "]");
    if (!r->a.split || len >= size) {
        if (len < size) snprintf(buf + len, size - len, ",\"parallel\":\"data\"");
        return;
    }
    int first[KILN_NN_MAX_PLACE_STAGES], micro = 0;
    int n = kiln_nn_sequential_placement(r->model, first, KILN_NN_MAX_PLACE_STAGES, &micro);
    len += (size_t)snprintf(buf + len, size - len, ",\"parallel\":\"pipeline\",\"split\":[");
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s{\"layer\":%d,\"device\":\"%s\"}", i ? "," : "", first[i],
                                kiln_device_str(r->devices[i], dev, sizeof dev));
    if (len < size) snprintf(buf + len, size - len, "],\"micro_batches\":%d", micro);
}
