/* `kiln bench plan`: kiln plan's accuracy over the whole matrix (docs/memory.md,
 * "Predicting a step's memory: kiln plan"): every model in models/, batch
 * 1, 32 and 128, AMP off and on (bf16 on the CPU, f16 on CUDA),
 * checkpointing off and 2 segments, on the CPU and, where the build has
 * one, on cuda:0 (emulated or real). Each case plans the step
 * (kiln_plan_step) and runs it (kiln_plan_measure) in a process of its
 * own, as kiln train's first step is, and prints predicted, measured and
 * the error for the peak of allocated and of reserved bytes on the device;
 * then one JSON line.
 *
 *   kiln bench plan [--devices cpu,cuda:0] [--models DIR] */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define MAX_MODELS 16

typedef struct plan_row {
    int64_t pa, ma, pr, mr; /* predicted / measured allocated and reserved peaks */
    int ok;
} plan_row;

/* Plan and measure one case in a child; the figures come back through a pipe. */
static plan_row run_case(const kiln_plan_opts *o) {
    plan_row r = {0};
    int fd[2];
    if (pipe(fd)) return r;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        kiln_plan p, m;
        plan_row w = {0};
        /* The parent ran no kernel: the child starts from kiln_init's state. */
        if (kiln_plan_step(o, &p) == KILN_OK && kiln_plan_measure(o, &m) == KILN_OK)
            w = (plan_row){p.memory[0].allocated_peak, m.memory[0].allocated_peak, p.memory[0].reserved_peak,
                           m.memory[0].reserved_peak, 1};
        else
            fprintf(stderr, "kiln bench plan: %s\n", kiln_error_message());
        ssize_t n = write(fd[1], &w, sizeof w);
        _exit(n == (ssize_t)sizeof w ? 0 : 1);
    }
    close(fd[1]);
    if (pid > 0 && read(fd[0], &r, sizeof r) != (ssize_t)sizeof r) r.ok = 0;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return r;
}

static double pct(int64_t p, int64_t m) { return m ? 100.0 * (double)(p - m) / (double)m : 0; }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kiln_bench_plan(int argc, char **argv) {
    const char *devices = NULL, *dir = "models";
    for (int i = 1; i < argc; i++) { /* argv[0] is "plan" */
        if (!strcmp(argv[i], "--devices") && i + 1 < argc)
            devices = argv[++i];
        else if (!strcmp(argv[i], "--models") && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: kiln bench plan [--devices cpu,cuda:0] [--models DIR]\n");
            return 2;
        }
    }
    char *models[MAX_MODELS];
    int n_models = 0;
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "kiln bench plan: --models %s: cannot open the directory\n", dir);
        return 2;
    }
    for (struct dirent *e; (e = readdir(d)) && n_models < MAX_MODELS;) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".txt")) continue;
        char *path = malloc(strlen(dir) + len + 2);
        if (!path) break;
        sprintf(path, "%s/%s", dir, e->d_name);
        models[n_models++] = path;
    }
    closedir(d);
    qsort(models, (size_t)n_models, sizeof *models, cmp_str);
    kiln_device devs[2] = {KILN_CPU, KILN_CUDA(0)};
    int n_devs = kiln_device_count(KILN_DEVICE_CUDA) > 0 ? 2 : 1;
    if (devices) {
        n_devs = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", devices);
        for (char *tok = strtok(buf, ","); tok && n_devs < 2; tok = strtok(NULL, ","))
            if (kiln_device_parse(tok, &devs[n_devs]) != KILN_OK || !kiln_device_is_available(devs[n_devs])) {
                fprintf(stderr, "kiln bench plan: --devices %s: %s is not a device kiln info lists\n",
                        devices, tok);
                return 2;
            } else {
                n_devs++;
            }
    }
    static const int64_t batches[] = {1, 32, 128};
    printf("%-28s %-7s %5s %4s %4s %11s %11s %7s %11s %11s %7s\n", "model", "device", "batch", "amp", "ckpt",
           "alloc plan", "measured", "error", "resv plan", "measured", "error");
    double worst = 0;
    int n = 0, failed = 0;
    char json[65536];
    size_t at = 0;
    for (int di = 0; di < n_devs; di++)
        for (int mi = 0; mi < n_models; mi++)
            for (int bi = 0; bi < 3; bi++)
                for (int amp = 0; amp < 2; amp++)
                    for (int ck = 0; ck <= 2; ck += 2) {
                        kiln_plan_opts o = kiln_plan_defaults();
                        o.model = models[mi];
                        o.device = devs[di];
                        o.batch = batches[bi];
                        o.amp = !amp ? KILN_F32 : devs[di].type == KILN_DEVICE_CUDA ? KILN_F16 : KILN_BF16;
                        o.checkpoint = ck;
                        plan_row r = run_case(&o);
                        char dn[32];
                        kiln_device_str(devs[di], dn, sizeof dn);
                        const char *base =
                            strrchr(models[mi], '/') ? strrchr(models[mi], '/') + 1 : models[mi];
                        if (!r.ok) {
                            printf("%-28s %-7s %5lld %4s %4d   failed (see stderr)\n", base, dn,
                                   (long long)o.batch, amp ? "on" : "off", ck);
                            failed++;
                            continue;
                        }
                        double ea = pct(r.pa, r.ma), er = pct(r.pr, r.mr);
                        worst = fmax(worst, fmax(fabs(ea), fabs(er)));
                        printf("%-28s %-7s %5lld %4s %4d %9.2f M %9.2f M %+6.2f%% %9.2f M %9.2f M %+6.2f%%\n",
                               base, dn, (long long)o.batch, amp ? "on" : "off", ck, r.pa / 1048576.0,
                               r.ma / 1048576.0, ea, r.pr / 1048576.0, r.mr / 1048576.0, er);
                        fflush(stdout);
                        if (at < sizeof json - 256)
                            at += (size_t)snprintf(
                                json + at, sizeof json - at,
                                "%s{\"model\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"amp\":%s,"
                                "\"checkpoint\":%d,\"allocated\":[%lld,%lld],\"reserved\":[%lld,%lld]}",
                                n ? "," : "", base, dn, (long long)o.batch, amp ? "true" : "false", ck,
                                (long long)r.pa, (long long)r.ma, (long long)r.pr, (long long)r.mr);
                        n++;
                    }
    printf("%d cases, %d failed to run, worst error %.2f%%\n", n, failed, worst);
    printf("{\"bench\":\"plan\",\"threads\":%d,\"worst_error_pct\":%.3f,\"cases\":[%s]}\n",
           kiln_num_threads(), worst, json);
    for (int i = 0; i < n_models; i++) free(models[i]);
    return failed ? 1 : 0;
}
