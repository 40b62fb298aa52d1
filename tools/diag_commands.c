/* `kiln smi` (a showUtilization-style table, refreshed with --watch) and
 * `kiln memory` (the allocator statistics of one device). */
#include "diag_commands.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/kiln.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static int print_error(const char *what) {
    const kiln_error *e = kiln_error_last();
    fprintf(stderr, "kiln %s: %s\n", what, e->message);
    if (e->hint[0]) fprintf(stderr, "  hint: %s\n", e->hint);
    return 1;
}

/* Sleep `seconds` unless Ctrl-C arrives first. */
static void wait_seconds(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (!interrupted && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int smi_usage(void) {
    fprintf(stderr, "usage: kiln smi [--watch SEC] [--count N]\n"
                    "  --watch SEC  refresh every SEC seconds until Ctrl-C (or N tables with --count)\n");
    return 2;
}

int kiln_cmd_smi(int argc, char **argv) {
    double watch = 0;
    long count = 0;
    for (int i = 0; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--watch") == 0 && i + 1 < argc) {
            watch = strtod(argv[++i], &end);
            if (*end || watch <= 0) return smi_usage();
        } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            count = strtol(argv[++i], &end, 10);
            if (*end || count < 1) return smi_usage();
        } else {
            return smi_usage();
        }
    }
    if (watch <= 0) count = 1;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old);
    int rc = 0;
    for (long n = 0; !interrupted && (count == 0 || n < count); n++) {
        if (n > 0) wait_seconds(watch);
        if (interrupted) break;
        char *text = NULL;
        /* CPU use is measured over a short interval (200 ms). */
        if (kiln_smi_table(200, &text) != KILN_OK) {
            rc = print_error("smi");
            break;
        }
        time_t now = time(NULL);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&now));
        printf("%s%s\n%s", n > 0 ? "\n" : "", stamp, text);
        fflush(stdout);
        free(text);
    }
    sigaction(SIGINT, &old, NULL);
    return rc;
}

int kiln_cmd_memory(int argc, char **argv) {
    if (argc > 1) {
        fprintf(stderr, "usage: kiln memory [DEVICE]   (cpu, cuda:0, ...; default cpu)\n");
        return 2;
    }
    kiln_device dev = KILN_CPU;
    if (argc == 1 && kiln_device_parse(argv[0], &dev) != KILN_OK) return print_error("memory");
    char *summary = kiln_memory_summary(dev, false);
    if (!summary) return print_error("memory");
    fputs(summary, stdout);
    free(summary);
    return 0;
}
