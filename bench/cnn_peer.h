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
    bool skipped;     /* the peer declined the setup (exit 3: bf16 on a CPU without it); reason says why */
    char reason[512]; /* why there is no result (python or torch missing, a crash) */
    long rss_kib;     /* the peer process's peak resident set (KiB, wait4's ru_maxrss); 0: unknown */
} bench_cnn_peer_result;

/* A peer's exit status for "this setup does not apply here" (bf16 on a
 * CPU without native bf16): not a failure, the reason is its last line. */
#define BENCH_PEER_EXIT_SKIPPED 3

/* The peer script bench/peer/<name>: `explicit_path` when given (it must be
 * readable), else under the working directory, beside this source file,
 * or two levels above the kiln binary. Writes the path into buf and
 * returns buf, or returns NULL with the places tried in `why`. */
const char *bench_peer_find(const char *name, const char *explicit_path, char *buf, size_t n, char *why,
                            size_t why_n);

/* Run argv (argv[0] a path, no PATH search) with stdout and stderr on one
 * pipe and wait for it (blocks for the child's whole run). The text after
 * "RESULT " on its last such line goes to result, its last other non-empty
 * line that is not a rule of dashes ("---...", as mpirun draws around its
 * messages) to last (both "" when absent), its exit status to *code (128+N
 * when it died of signal N, as a shell reports it). Returns 0, or the
 * errno that kept it from starting. */
int bench_peer_spawn(char *const argv[], char *result, size_t result_n, char *last, size_t last_n, int *code);
/* The peak resident set (KiB) of the child the last bench_peer_spawn on
 * this thread waited for (wait4's ru_maxrss: the child alone, not its own
 * children); 0 before any. */
long bench_peer_last_rss_kib(void);

/* The CNN peer script (bench_peer_find for torch_cnn_bench.py): `explicit_path` when given (it must be
 * readable), else bench/peer/torch_cnn_bench.py under the working directory, beside this source file, or two
 * levels above the kiln binary. Writes the path into buf and returns buf, or returns NULL with the places
 * tried in `why`. */
const char *bench_cnn_peer_find(const char *explicit_path, char *buf, size_t n, char *why, size_t why_n);

/* Run `python script --mode mode --setup setup [--bf16 [--allow-emulated-bf16]] --batch B --steps S
 * --repeats 1 --warmup W --threads T` (setup: "eager" or "best", see the
 * script; T: Kiln's compute threads, so both sides get the same cores)
 * and wait for it (blocks for the child's whole run: import, warm-up and
 * the timed steps). A peer that declines the setup (exit 3: bf16 on a CPU
 * without it) leaves out->skipped true with its reason. Never fails outright: a missing interpreter, a
 * missing torch or a crash leave out->ok false with the reason (the child's last line of output and its exit
 * status); so does a peer whose RESULT does not parse or that ran on another thread count than `threads`. */
void bench_cnn_peer_run(const char *python, const char *script, const char *mode, const char *setup,
                        bool bf16, bool allow_emulated, int batch, int steps, int warmup, int threads,
                        bench_cnn_peer_result *out);
#endif
