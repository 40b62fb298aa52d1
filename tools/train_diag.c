/* kiln train's diagnostics switches (--profile, --monitor, --detect-leaks,
 * --detect-anomaly, --memory-history): started before the first step,
 * stepped after each optimizer step, reported and stopped at the end. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "train.h"
#include "train_run.h"

/* ---- Diagnostics switches -------------------------------------------------------------- */

static void on_trace_ready(void *user) { ((train_run *)user)->trace_ready = true; }

static void monitor_sample(const kiln_gpu_stats *gpus, int count, kiln_status status, void *user) {
    train_run *r = user;
    double t = tool_now_s() - r->t0;
    (void)status;
    for (int i = 0; i < count; i++)
        train_metric(r,
               "{\"event\":\"monitor\",\"t\":%.3f,\"gpu\":%d,\"util_gpu\":%u,\"util_memory\":%u,"
               "\"memory_used\":%llu,\"memory_total\":%llu,\"power_w\":%.1f,\"temperature_c\":%u}\n",
               t, gpus[i].index, gpus[i].util_gpu, gpus[i].util_memory, (unsigned long long)gpus[i].memory_used,
               (unsigned long long)gpus[i].memory_total, gpus[i].power_watts, gpus[i].temperature_c);
    if (count > 0) return;
    /* No GPU: this process's CPU use (over 200 ms) and resident memory. */
    kiln_host_process p[1];
    int n = 0;
    if (kiln_host_processes_sample(p, 1, 200, &n) == KILN_OK && n > 0)
        train_metric(r, "{\"event\":\"monitor\",\"t\":%.3f,\"gpu\":null,\"cpu_percent\":%.1f,\"rss_bytes\":%llu}\n", t,
               p[0].cpu_percent, (unsigned long long)p[0].rss_bytes);
}

kiln_status train_diag_begin(train_run *r) {
    if (r->a.memory_history) {
        KILN_TRY(kiln_memory_record_history(r->dev, true, 0));
        fprintf(stderr, "kiln train: memory history on (every allocator event, with its op and line)\n");
    }
    if (r->a.detect_anomaly) {
        kiln_set_detect_anomaly(true);
        fprintf(stderr, "kiln train: anomaly detection on (every op's outputs checked for NaN/inf)\n");
    }
    if (r->a.detect_leaks) {
        KILN_TRY(kiln_leak_check_begin(0));
        fprintf(stderr, "kiln train: leak detection on (live autograd graph counted at each step boundary)\n");
    }
    if (r->a.monitor) {
        KILN_TRY(kiln_gpu_monitor_start(1000, monitor_sample, r));
        r->monitoring = true;
    }
    if (r->a.profile_steps > 0) {
        kiln_profiler_opts po = {.schedule = {.wait = 1, .warmup = 0, .active = r->a.profile_steps, .repeat = 1},
                                 .on_trace_ready = on_trace_ready,
                                 .user = r};
        KILN_TRY(kiln_profiler_start(&po));
        r->profiling = true;
    }
    return KILN_OK;
}

/* After each optimizer step (its scope closed). */
kiln_status train_diag_step(train_run *r, bool *leak_reported) {
    if (r->profiling) KILN_TRY(kiln_profiler_step());
    if (r->a.detect_leaks) {
        kiln_leak_report rep;
        KILN_TRY(kiln_leak_check_step(&rep));
        if (rep.leaking && !*leak_reported) {
            char *text = kiln_leak_report_format(&rep);
            if (text) fprintf(stderr, "\n%s\n", text);
            free(text);
            *leak_reported = true;
        }
    }
    return KILN_OK;
}

static void profile_report(train_run *r) {
    if (!r->profiling) return;
    kiln_profiler_stop();
    r->profiling = false;
    char *table = kiln_profiler_table(KILN_SORT_CPU_TOTAL, 25);
    if (table) fprintf(stderr, "kiln train: profile of %d step%s:\n%s", r->a.profile_steps,
                       r->a.profile_steps == 1 ? "" : "s", table);
    free(table);
    kiln_counters c;
    kiln_profiler_step_counters(&c);
    fprintf(stderr,
            "kiln train: last profiled step: %llu kernel launches, %llu host syncs, %llu raw allocations, "
            "%llu pageable copies, %llu bytes to device, %llu bytes to host\n",
            (unsigned long long)c.kernel_launches, (unsigned long long)c.host_syncs,
            (unsigned long long)c.raw_allocs, (unsigned long long)c.pageable_copies,
            (unsigned long long)c.bytes_h2d, (unsigned long long)c.bytes_d2h);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/trace.json", r->out_dir);
    if (kiln_profiler_export_chrome_trace(path) == KILN_OK)
        fprintf(stderr, "kiln train: Chrome trace %s (open in Perfetto)%s\n", path,
                r->trace_ready ? "" : " (fewer steps than --profile ran)");
    else train_fail("train", "profile trace");
}

void train_diag_end(train_run *r, bool leak_reported) {
    if (r->a.memory_history && kiln_memory_history_enabled(r->dev)) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/memory_snapshot.json", r->out_dir);
        if (kiln_memory_snapshot(r->dev, path) == KILN_OK)
            fprintf(stderr, "kiln train: memory snapshot %s (kiln report %s draws it)\n", path, r->out_dir);
        else train_fail("train", "memory snapshot");
        kiln_memory_record_history(r->dev, false, 0);
    }
    if (r->monitoring) kiln_gpu_monitor_stop();
    r->monitoring = false;
    profile_report(r);
    if (r->a.detect_leaks) {
        kiln_leak_report rep;
        if (!leak_reported && kiln_leak_check_step(&rep) == KILN_OK)
            fprintf(stderr, "kiln train: leak check: no autograd graph kept across steps (%lld live nodes)\n",
                    (long long)rep.live_nodes);
        kiln_leak_check_end();
    }
    if (r->a.detect_anomaly) {
        kiln_anomaly_report rep;
        kiln_anomaly_last(&rep);
        if (!rep.found) fprintf(stderr, "kiln train: anomaly check: no NaN or infinity in any op's output\n");
        kiln_set_detect_anomaly(false);
    }
}

