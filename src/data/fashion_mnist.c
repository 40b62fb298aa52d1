/* Fashion-MNIST (https://github.com/zalandoresearch/fashion-mnist): four IDX
 * files, named as in the original distribution and in Debian's
 * dataset-fashion-mnist package, which installs the gzip files in
 * /usr/share/datasets/fashion-mnist:
 *
 *   train-images-idx3-ubyte.gz   60000 images of 28x28
 *   train-labels-idx1-ubyte.gz   60000 labels, 0..9
 *   t10k-images-idx3-ubyte.gz    10000 images
 *   t10k-labels-idx1-ubyte.gz    10000 labels
 *
 * Users who unpacked the files (no .gz) are served too: each file is looked
 * for under both names. The class count is fixed at 10, so every label is
 * checked against it. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "data/readers.h"

#define FASHION_MNIST_DEBIAN_DIR "/usr/share/datasets/fashion-mnist"
#define FASHION_MNIST_CLASSES    10

/* The first existing regular file among dir/base.gz and dir/base; appends
 * each name tried to `tried`. False when neither exists. */
static bool find_file(const char *dir, const char *base, char *path, size_t size, char *tried,
                      size_t tried_size) {
    static const char *const suffixes[2] = {".gz", ""};
    for (int i = 0; i < 2; i++) {
        snprintf(path, size, "%s/%s%s", dir, base, suffixes[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return true;
        size_t used = strlen(tried);
        /* A list cut short still says where Kiln looked first. */
        if (snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "", path) < 0) tried[used] = '\0';
    }
    return false;
}

kiln_status kiln_dataset_open_fashion_mnist(const char *dir, const char *split, kiln_dataset **out) {
    if (!out)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_dataset_open_fashion_mnist: out is NULL");
    *out = NULL;
    const char *prefix = NULL;
    if (split && strcmp(split, "train") == 0) prefix = "train";
    if (split && strcmp(split, "test") == 0) prefix = "t10k";
    if (!prefix)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "use \"train\" (60000 images) or \"test\" (10000)",
                          "kiln_dataset_open_fashion_mnist: split \"%s\" is not a Fashion-MNIST split",
                          split ? split : "(null)");
    const char *where = dir ? dir : FASHION_MNIST_DEBIAN_DIR;
    char images_base[64], labels_base[64];
    snprintf(images_base, sizeof images_base, "%s-images-idx3-ubyte", prefix);
    snprintf(labels_base, sizeof labels_base, "%s-labels-idx1-ubyte", prefix);
    char images[4096], labels[4096], tried[1024] = "";
    bool found = find_file(where, images_base, images, sizeof images, tried, sizeof tried);
    found = find_file(where, labels_base, labels, sizeof labels, tried, sizeof tried) && found;
    if (!found)
        return KILN_RAISE(KILN_ERR_IO,
                          dir ? "pass the directory that holds the four Fashion-MNIST files"
                              : "install the Debian package dataset-fashion-mnist, or pass the directory "
                                "that holds the files",
                          "Fashion-MNIST %s split not found: tried %s", split, tried);
    return kiln_idx_open(images, labels, FASHION_MNIST_CLASSES, out);
}
