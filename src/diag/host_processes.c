/* Host CPU and memory of the processes using Kiln, read from /proc: what
 * `kiln smi` shows where there is no GPU to show.
 *
 * A process counts as a Kiln process when it is the calling process, when
 * its executable is named `kiln`, or when it maps libkiln (a program linked
 * against the shared library). CPU use is the growth of utime + stime in
 * /proc/PID/stat over the sampling interval; memory is the resident set
 * from /proc/PID/statm. Processes of other users cannot be read and are
 * skipped. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "kiln/diag.h"

static bool read_small_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0;
}

/* utime + stime in clock ticks; false when the process is gone. */
static bool cpu_ticks(int pid, unsigned long long *ticks) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (!read_small_file(path, buf, sizeof buf)) return false;
    /* The command name (field 2) may hold spaces and parentheses: fields
     * are counted from the last ')'. utime and stime are fields 14 and 15. */
    const char *p = strrchr(buf, ')');
    if (!p) return false;
    unsigned long long utime = 0, stime = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return false;
    *ticks = utime + stime;
    return true;
}

static uint64_t rss_bytes(int pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/statm", pid);
    unsigned long long size = 0, resident = 0;
    if (!read_small_file(path, buf, sizeof buf) || sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static bool maps_libkiln(int pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, "/libkiln.so") != NULL;
    fclose(f);
    return found;
}

static bool is_kiln_process(int pid) {
    char path[64], exe[512];
    snprintf(path, sizeof path, "/proc/%d/exe", pid);
    ssize_t n = readlink(path, exe, sizeof exe - 1);
    if (n <= 0) return false; /* another user's process, or a kernel thread */
    exe[n] = '\0';
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    if (strcmp(base, "kiln") == 0 || strncmp(base, "kiln ", 5) == 0) return true;
    return maps_libkiln(pid);
}

static void fill_name(int pid, char *name, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    if (!read_small_file(path, name, size)) snprintf(name, size, "?");
    name[strcspn(name, "\n")] = '\0';
}

kiln_status kiln_host_processes_sample(kiln_host_process *out, int max, int interval_ms, int *count) {
    if (count) *count = 0;
    if (!out || !count || max < 1 || interval_ms < 0)
        return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, "pass an array, its size (>= 1) and an interval >= 0",
                          "kiln_host_processes_sample: invalid arguments (max %d, interval %d ms)", max,
                          interval_ms);
    DIR *dir = opendir("/proc");
    if (!dir)
        return KILN_RAISE(KILN_ERR_UNSUPPORTED, "this needs Linux's /proc",
                          "kiln_host_processes_sample: cannot open /proc (%s)", strerror(errno));
    int self = (int)getpid(), n = 0;
    unsigned long long *t0 = KILN_CALLOC((size_t)max, sizeof *t0);
    if (!t0) {
        closedir(dir);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    out[n++] = (kiln_host_process){.pid = self, .self = true};
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < max) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        if (pid == self || !is_kiln_process(pid)) continue;
        out[n++] = (kiln_host_process){.pid = pid};
    }
    closedir(dir);
    for (int i = 0; i < n; i++) cpu_ticks(out[i].pid, &t0[i]);
    double start = kiln_clock_now_s();
    if (interval_ms > 0) {
        struct timespec ts = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    double elapsed = kiln_clock_now_s() - start;
    double hz = (double)sysconf(_SC_CLK_TCK);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        unsigned long long t1 = 0;
        if (!cpu_ticks(out[i].pid, &t1)) continue; /* exited meanwhile */
        kiln_host_process p = out[i];
        p.cpu_percent =
            interval_ms > 0 && elapsed > 0 && t1 >= t0[i] ? 100.0 * (double)(t1 - t0[i]) / hz / elapsed : 0.0;
        p.rss_bytes = rss_bytes(p.pid);
        fill_name(p.pid, p.name, sizeof p.name);
        out[kept++] = p;
    }
    free(t0);
    *count = kept;
    return KILN_OK;
}
