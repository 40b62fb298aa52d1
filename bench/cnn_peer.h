/* The PyTorch peer of `kiln bench cnn`: bench/peer/torch_cnn_bench.py run
 * as a child process, one process per repeat, its RESULT line parsed. */
#ifndef KILN_BENCH_CNN_PEER_H
#define KILN_BENCH_CNN_PEER_H
#include <stdbool.h>
#include <stddef.h>

typedef struct bench_cnn_peer_result {
    bool ok;                /* false: img_s is meaningless, reason says why */
    double img_s;           /* images/s of the timed steps */
    int threads;            /* torch.get_num_threads() in the peer */
    char torch_version[32]; /* torch.__version__ as the peer reports it */
    char reason[512];       /* why there is no result (python or torch missing, a crash) */
} bench_cnn_peer_result;

/* The peer script: `explicit_path` when given (it must be readable), else
 * bench/peer/torch_cnn_bench.py under the working directory, beside this
 * source file, or two levels above the kiln binary. Writes the path into
 * buf and returns buf, or returns NULL with the places tried in `why`. */
const char *bench_cnn_peer_find(const char *explicit_path, char *buf, size_t n, char *why, size_t why_n);

/* Run `python script --mode mode --batch B --steps S --repeats 1 --warmup W
 * --threads T` (T: Kiln's compute threads, so both sides get the same cores)
 * and wait for it (blocks for the child's whole run: import, warm-up and
 * the timed steps). Never fails outright: a missing interpreter, a missing
 * torch or a crash leave out->ok false with the reason (the child's last
 * line of output and its exit status); so does a peer whose RESULT does not
 * parse or that ran on another thread count than `threads`. */
void bench_cnn_peer_run(const char *python, const char *script, const char *mode, int batch, int steps,
                        int warmup, int threads, bench_cnn_peer_result *out);
#endif
