/* The GPU monitor: sampling without a driver returns a clear status (with a
 * driver, sane numbers); the host-process fallback lists this process with
 * a sane resident size; the background sampler calls back and stops; the
 * `kiln smi` table and the built `kiln smi` / `kiln memory` commands run. */
#include <pthread.h>
#include <unistd.h>

#include "test_util.h"

static void test_sample(void) {
    kiln_gpu_stats gpus[16];
    int n = -1;
    kiln_error_clear();
    kiln_status st = kiln_gpu_monitor_sample(gpus, 16, &n);
    if (st != KILN_OK) {
        CHECK_EQ_I(st, KILN_ERR_DEVICE);
        CHECK_EQ_I(n, 0);
        printf("no driver: %s\n", kiln_error_message());
        CHECK_MSG(strstr(kiln_error_message(), "libnvidia-ml.so.1") != NULL, "%s", kiln_error_message());
        return;
    }
    printf("%d GPU(s) sampled\n", n);
    CHECK(n >= 0 && n <= 16);
    for (int i = 0; i < n; i++) {
        CHECK_EQ_I(gpus[i].index, i);
        CHECK(gpus[i].name[0] != '\0');
        if (!(gpus[i].missing & KILN_GPU_MISSING_MEMORY)) CHECK(gpus[i].memory_used <= gpus[i].memory_total);
        if (!(gpus[i].missing & KILN_GPU_MISSING_UTIL)) CHECK(gpus[i].util_gpu <= 100);
    }
}

static void test_throttle_names(void) {
    char buf[128];
    CHECK(strcmp(kiln_gpu_throttle_reasons_str(0, buf, sizeof buf), "none") == 0);
    CHECK(strcmp(kiln_gpu_throttle_reasons_str(0x4 | 0x40, buf, sizeof buf),
                 "power cap, hw thermal slowdown") == 0);
}

static void test_host_processes(void) {
    kiln_host_process procs[32];
    int n = 0;
    CHECK_OK(kiln_host_processes_sample(procs, 32, 50, &n));
    CHECK(n >= 1);
    if (n < 1) return;
    CHECK(procs[0].self);
    CHECK_EQ_I(procs[0].pid, getpid());
    CHECK(procs[0].name[0] != '\0');
    CHECK_MSG(procs[0].rss_bytes > (1u << 20) && procs[0].rss_bytes < (64ull << 30), "rss %llu",
              (unsigned long long)procs[0].rss_bytes);
    CHECK(procs[0].cpu_percent >= 0.0 && procs[0].cpu_percent < 100.0 * 1024);
    for (int i = 1; i < n; i++) CHECK(!procs[i].self && procs[i].pid != getpid());
    CHECK_FAILS(kiln_host_processes_sample(procs, 0, 0, &n), KILN_ERR_INVALID_ARGUMENT, "invalid arguments");
}

static void test_smi_table(void) {
    char *text = NULL;
    CHECK_OK(kiln_smi_table(10, &text));
    CHECK(text != NULL);
    if (!text) return;
    printf("%s", text);
    kiln_gpu_stats g;
    int n = 0;
    if (kiln_gpu_monitor_sample(&g, 1, &n) != KILN_OK || n == 0) {
        CHECK(strstr(text, "showing host CPU and memory") != NULL);
        CHECK(strstr(text, "(this process)") != NULL);
    } else {
        CHECK(strstr(text, "GPU %") != NULL);
    }
    kiln_error_clear();
    free(text);
}

typedef struct sampler_seen {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int calls;
    kiln_status status;
} sampler_seen;

static void on_sample(const kiln_gpu_stats *gpus, int count, kiln_status status, void *user) {
    (void)gpus;
    sampler_seen *s = user;
    pthread_mutex_lock(&s->mutex);
    s->calls++;
    s->status = status;
    if (status != KILN_OK) CHECK_EQ_I(count, 0);
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mutex);
}

static void test_sampler(void) {
    sampler_seen seen = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, KILN_OK};
    CHECK_OK(kiln_gpu_monitor_start(10, on_sample, &seen));
    CHECK_FAILS(kiln_gpu_monitor_start(10, on_sample, &seen), KILN_ERR_STATE, "already running");
    pthread_mutex_lock(&seen.mutex);
    while (seen.calls < 2) pthread_cond_wait(&seen.cond, &seen.mutex);
    pthread_mutex_unlock(&seen.mutex);
    kiln_gpu_monitor_stop();
    int after_stop = seen.calls;
    kiln_gpu_monitor_stop(); /* a second stop is a no-op */
    CHECK(after_stop >= 2);
    CHECK(seen.status == KILN_OK || seen.status == KILN_ERR_DEVICE);
    CHECK_FAILS(kiln_gpu_monitor_start(1, on_sample, &seen), KILN_ERR_INVALID_ARGUMENT, "interval");
}

/* The built command, found next to the tests (build/bin/kiln). */
static void test_cli(void) {
    char exe[1024], cmd[1200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = '\0';
    snprintf(cmd, sizeof cmd, "%s/../bin/kiln", exe);
    if (access(cmd, X_OK) != 0) {
        printf("kiln binary not built (%s): CLI check left out\n", cmd);
        return;
    }
    char run[1400];
    snprintf(run, sizeof run, "%s smi > /dev/null", cmd);
    CHECK_EQ_I(system(run), 0);
    snprintf(run, sizeof run, "%s smi --watch 0.05 --count 2 > /dev/null", cmd);
    CHECK_EQ_I(system(run), 0);
    snprintf(run, sizeof run, "%s memory cpu > /dev/null", cmd);
    CHECK_EQ_I(system(run), 0);
    snprintf(run, sizeof run, "%s smi --watch 2>/dev/null", cmd);
    CHECK(system(run) != 0);
}

int main(void) {
    CHECK_OK(kiln_init());
    test_sample();
    test_throttle_names();
    test_host_processes();
    test_smi_table();
    test_sampler();
    test_cli();
    kiln_shutdown();
    return kt_finish();
}
