/* Runs the PyTorch peers of `kiln bench cnn` and `kiln bench main-job`
 * with posix_spawn (no shell, so paths need no quoting), their stdout and
 * stderr on one pipe, and reads the JSON object on the line starting
 * "RESULT " (with cJSON, here for the CNN peer, in main_job.c for its). */
#include "cnn_peer.h"

#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

extern char **environ;

static bool readable(const char *path) { return access(path, R_OK) == 0; }

/* dir of `path` (up to its last '/') + suffix into buf; false if it does not fit. */
static bool beside(const char *path, const char *suffix, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) return false;
    int len = snprintf(buf, n, "%.*s/%s", (int)(slash - path), path, suffix);
    return len > 0 && (size_t)len < n;
}

const char *bench_peer_find(const char *name, const char *explicit_path, char *buf, size_t n, char *why,
                            size_t why_n) {
    if (explicit_path) {
        snprintf(buf, n, "%s", explicit_path);
        if (readable(buf)) return buf;
        snprintf(why, why_n, "--peer-script %s is not readable", explicit_path);
        return NULL;
    }
    char rel[256], here[300];
    snprintf(rel, sizeof rel, "bench/peer/%s", name);
    snprintf(buf, n, "%s", rel);
    if (readable(buf)) return buf;
    /* CMake compiles with absolute source paths: the checkout's copy. */
    snprintf(here, sizeof here, "peer/%s", name);
    if (beside(__FILE__, here, buf, n) && readable(buf)) return buf;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        snprintf(here, sizeof here, "../../%s", rel);
        if (beside(exe, here, buf, n) && readable(buf)) return buf;
    }
    snprintf(why, why_n,
             "%s not found (tried the working directory, the source tree and the binary's build tree; "
             "run from the checkout or pass --peer-script PATH)",
             rel);
    return NULL;
}

const char *bench_cnn_peer_find(const char *explicit_path, char *buf, size_t n, char *why, size_t why_n) {
    return bench_peer_find("torch_cnn_bench.py", explicit_path, buf, n, why, why_n);
}

/* The figures of the peer's RESULT object: img_s_median (> 0), threads
 * (what torch.get_num_threads() said) and the torch version. False, with
 * the reason, when the object does not parse or lacks them. */
static bool parse_result(const char *json, bench_cnn_peer_result *out, char *why, size_t why_n) {
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        snprintf(why, why_n, "its RESULT line is not a JSON object");
        cJSON_Delete(root);
        return false;
    }
    const cJSON *img_s = cJSON_GetObjectItemCaseSensitive(root, "img_s_median");
    const cJSON *threads = cJSON_GetObjectItemCaseSensitive(root, "threads");
    const cJSON *torch = cJSON_GetObjectItemCaseSensitive(root, "torch");
    bool ok = cJSON_IsNumber(img_s) && img_s->valuedouble > 0 && cJSON_IsNumber(threads) &&
              threads->valuedouble >= 1 && threads->valuedouble <= 1e6;
    if (ok) {
        out->img_s = img_s->valuedouble;
        out->threads = (int)threads->valuedouble;
        if (cJSON_IsString(torch))
            snprintf(out->torch_version, sizeof out->torch_version, "%s", torch->valuestring);
    } else {
        snprintf(why, why_n, "its RESULT line lacks a positive img_s_median or a threads count");
    }
    cJSON_Delete(root);
    return ok;
}

static void strip_newline(char *s) {
    size_t len = strlen(s);
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) s[--len] = '\0';
}

/* Read the child's output to the end: the RESULT line into `result`, the
 * last non-empty line into `last` (the reason when there is no result). */
static void read_output(int fd, char *result, size_t result_n, char *last, size_t last_n) {
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        strip_newline(line);
        if (strncmp(line, "RESULT ", 7) == 0)
            snprintf(result, result_n, "%s", line + 7);
        else if (line[0] && strncmp(line, "---", 3) != 0) /* mpirun's rules around its messages */
            snprintf(last, last_n, "%s", line);
    }
    fclose(f);
}

static _Thread_local long last_rss_kib;

long bench_peer_last_rss_kib(void) { return last_rss_kib; }

int bench_peer_spawn(char *const argv[], char *result, size_t result_n, char *last, size_t last_n,
                     int *code) {
    result[0] = last[0] = '\0';
    *code = -1;
    int fds[2];
    if (pipe(fds) != 0) return errno;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    int err = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        return err;
    }
    read_output(fds[0], result, result_n, last, last_n);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    last_rss_kib = ru.ru_maxrss;
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return 0;
}

void bench_cnn_peer_run(const char *python, const char *script, const char *mode, const char *setup,
                        bool bf16, bool allow_emulated, int batch, int steps, int warmup, int threads,
                        bench_cnn_peer_result *out) {
    memset(out, 0, sizeof *out);
    char b[16], s[16], w[16], t[16];
    snprintf(t, sizeof t, "%d", threads);
    snprintf(b, sizeof b, "%d", batch);
    snprintf(s, sizeof s, "%d", steps);
    snprintf(w, sizeof w, "%d", warmup);
    char *const argv[] = {(char *)python,
                          (char *)script,
                          "--mode",
                          (char *)mode,
                          "--setup",
                          (char *)setup,
                          "--batch",
                          b,
                          "--steps",
                          s,
                          "--repeats",
                          "1",
                          "--warmup",
                          w,
                          "--threads",
                          t,
                          bf16 ? "--bf16" : NULL,
                          allow_emulated ? "--allow-emulated-bf16" : NULL,
                          NULL};
    char result[2048], last[400];
    int code;
    int err = bench_peer_spawn(argv, result, sizeof result, last, sizeof last, &code);
    if (err) {
        snprintf(out->reason, sizeof out->reason,
                 "cannot run %s: %s (install python3-torch, or pass --python PATH)", python, strerror(err));
        return;
    }
    out->rss_kib = bench_peer_last_rss_kib();
    char why[160] = "no RESULT line";
    if (code == 0 && result[0] && parse_result(result, out, why, sizeof why)) {
        if (out->threads == threads) {
            out->ok = true;
            return;
        }
        snprintf(why, sizeof why, "it ran on %d threads, not the %d asked for", out->threads, threads);
    }
    if (code == BENCH_PEER_EXIT_SKIPPED) {
        out->skipped = true;
        snprintf(out->reason, sizeof out->reason, "%s", last[0] ? last : "the peer skipped this setup");
        return;
    }
    if (code == 0) {
        snprintf(out->reason, sizeof out->reason, "%s %s: %s%s%s", python, script, why, last[0] ? ": " : "",
                 last);
        return;
    }
    snprintf(out->reason, sizeof out->reason, "%s %s exited with status %d%s%s", python, script, code,
             last[0] ? ": " : "", last);
    if (strstr(last, "No module named 'torch'"))
        snprintf(out->reason + strlen(out->reason), sizeof out->reason - strlen(out->reason),
                 " (install python3-torch: apt-get install python3-torch)");
}
