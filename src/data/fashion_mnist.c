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
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "data/readers.h"

#define FASHION_MNIST_DEBIAN_DIR "/usr/share/datasets/fashion-mnist"
#define FASHION_MNIST_CLASSES    10

/* A path that exists but cannot serve as a dataset file or directory:
 * the message names it and the errno, not "not found". */
static kiln_status unusable(const char *path, int err) {
    if (err == EACCES || err == EPERM)
        return KILN_RAISE(KILN_ERR_IO,
                          "give this user read permission on the files and search (x) permission on the "
                          "directory",
                          "cannot read %s: %s", path, strerror(err));
    if (err == ELOOP)
        return KILN_RAISE(KILN_ERR_IO,
                          "the path runs through a symbolic link loop: point it at the real files",
                          "cannot read %s: %s", path, strerror(err));
    return KILN_RAISE(KILN_ERR_IO, "pass the directory that holds the four Fashion-MNIST files",
                      "cannot read %s: %s", path, strerror(err));
}

/* The first existing entry among dir/base.gz and dir/base into `path`
 * (*found true). Names that do not exist (ENOENT) are appended to `tried`
 * and the next is looked at; an entry that exists but is not a regular file,
 * or a path that cannot be looked at (EACCES, ELOOP, ...), is an error that
 * says so. */
static kiln_status find_file(const char *dir, const char *base, char *path, size_t size, char *tried,
                             size_t tried_size, bool *found) {
    static const char *const suffixes[2] = {".gz", ""};
    *found = false;
    for (int i = 0; i < 2; i++) {
        snprintf(path, size, "%s/%s%s", dir, base, suffixes[i]);
        struct stat st;
        if (stat(path, &st) == 0) {
            if (!S_ISREG(st.st_mode))
                return KILN_RAISE(
                    KILN_ERR_IO, "put the Fashion-MNIST file itself there, or pass another --data",
                    "%s is %s, not a regular file", path, kiln_file_type_name((unsigned)st.st_mode));
            *found = true;
            return KILN_OK;
        }
        if (errno != ENOENT) return unusable(path, errno);
        size_t used = strlen(tried);
        /* A list cut short still says where Kiln looked first. */
        if (snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "", path) < 0) tried[used] = '\0';
    }
    return KILN_OK;
}

/* The dataset directory must be one: a file or an unreadable path there
 * is named as such. ENOENT falls through to "not found" with its hint. */
static kiln_status check_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) return errno == ENOENT ? KILN_OK : unusable(dir, errno);
    if (!S_ISDIR(st.st_mode))
        return KILN_RAISE(KILN_ERR_IO, "pass the directory that holds the four Fashion-MNIST files",
                          "%s is %s, not a directory", dir, kiln_file_type_name((unsigned)st.st_mode));
    return KILN_OK;
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
    bool have_images = false, have_labels = false;
    KILN_TRY(check_dir(where));
    KILN_TRY(find_file(where, images_base, images, sizeof images, tried, sizeof tried, &have_images));
    KILN_TRY(find_file(where, labels_base, labels, sizeof labels, tried, sizeof tried, &have_labels));
    if (!have_images || !have_labels)
        return KILN_RAISE(KILN_ERR_IO,
                          dir ? "pass the directory that holds the four Fashion-MNIST files"
                              : "install the Debian package dataset-fashion-mnist, or pass the directory "
                                "that holds the files",
                          "Fashion-MNIST %s split not found: tried %s", split, tried);
    return kiln_idx_open(images, labels, FASHION_MNIST_CLASSES, out);
}
