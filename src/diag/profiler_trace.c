/* Chrome trace JSON (the format Kineto writes; Perfetto and chrome://tracing
 * open it). Host records go on the process's pid with the OS thread id as
 * tid; device work goes on pid = device (type * 1000 + index: cpu:0 is 0,
 * cuda:0 is 1000) with tid = stream id; a flow ("ph":"s" -> "ph":"f", cat
 * ac2g) joins each launch to its device work. ts and dur are microseconds. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "diag/profiler_internal.h"

static void write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* Timestamps are relative to the first record, so microseconds with three
 * decimals keep every nanosecond exactly in a double. */
static uint64_t trace_base_ns;

static double us(uint64_t ns) { return (double)(ns - trace_base_ns) / 1e3; }
static double dur_us(uint64_t ns) { return (double)ns / 1e3; }

static int device_pid(kiln_device d) { return (int)d.type * 1000 + d.index; }

static const char *category(const prof_record *r) {
    switch (r->kind) {
    case PROF_OP: return "cpu_op";
    case PROF_RANGE: return "user_annotation";
    case PROF_ASYNC: return "async";
    default: return "cuda_runtime"; /* a host sync, as Kineto files cudaDeviceSynchronize */
    }
}

static void write_record(FILE *f, const prof_record *r, size_t id, int pid) {
    fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", category(r));
    write_string(f, r->name);
    fprintf(f, ",\"pid\":%d,\"tid\":%llu,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"External id\":%zu", pid,
            (unsigned long long)r->tid, us(r->start_ns), dur_us(r->end_ns - r->start_ns), id);
    if (r->kind == PROF_OP) fprintf(f, ",\"Output bytes\":%llu", (unsigned long long)r->out_bytes);
    if (r->flops) fprintf(f, ",\"flops\":%llu", (unsigned long long)r->flops);
    fprintf(f, "}}");
    if (!r->dev_end_ns) return;
    int dpid = device_pid(r->device);
    unsigned long long stream = (unsigned long long)r->stream_id;
    fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":");
    write_string(f, r->name);
    fprintf(f,
            ",\"pid\":%d,\"tid\":%llu,\"ts\":%.3f,\"dur\":%.3f,"
            "\"args\":{\"External id\":%zu,\"device\":%d,\"stream\":%llu,\"correlation\":%zu}}",
            dpid, stream, us(r->dev_start_ns), dur_us(r->dev_end_ns - r->dev_start_ns), id, r->device.index, stream, id);
    fprintf(f, ",\n{\"ph\":\"s\",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"id\":%zu,\"pid\":%d,\"tid\":%llu,\"ts\":%.3f}", id,
            pid, (unsigned long long)r->tid, us(r->launch_ns));
    fprintf(f,
            ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"id\":%zu,\"pid\":%d,\"tid\":%llu,"
            "\"ts\":%.3f}",
            id, dpid, stream, us(r->dev_start_ns));
}

/* Metadata: a name for the host process, each host thread, each device
 * and each stream seen. The lists of seen tracks are short (threads and
 * streams, not records), so they are searched linearly. */
#define MAX_TRACKS 256

static bool seen(uint64_t *list, int *n, uint64_t key) {
    for (int i = 0; i < *n; i++)
        if (list[i] == key) return true;
    if (*n < MAX_TRACKS) list[(*n)++] = key;
    return false;
}

static void write_metadata(FILE *f, const prof_result *res, int pid) {
    uint64_t threads[MAX_TRACKS], devices[MAX_TRACKS], streams[MAX_TRACKS];
    int n_threads = 0, n_devices = 0, n_streams = 0;
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"kiln (host)\"}}", pid);
    for (size_t i = 0; i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        if (!seen(threads, &n_threads, r->tid))
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%llu,"
                    "\"args\":{\"name\":\"thread %llu\"}}",
                    pid, (unsigned long long)r->tid, (unsigned long long)r->tid);
        if (!r->dev_end_ns) continue;
        char dev[32];
        kiln_device_str(r->device, dev, sizeof dev);
        int dpid = device_pid(r->device);
        if (!seen(devices, &n_devices, (uint64_t)dpid))
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}}"
                    ",\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
                    "\"args\":{\"sort_index\":%d}}",
                    dpid, dev, dpid, 1000000 + dpid);
        if (!seen(streams, &n_streams, ((uint64_t)dpid << 48) ^ r->stream_id))
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%llu,"
                    "\"args\":{\"name\":\"stream %llu\"}}",
                    dpid, (unsigned long long)r->stream_id, (unsigned long long)r->stream_id);
    }
}

kiln_status kiln_profiler_export_chrome_trace(const char *path) {
    if (!path) return KILN_RAISE(KILN_ERR_INVALID_ARGUMENT, NULL, "kiln_profiler_export_chrome_trace: path is NULL");
    FILE *f = fopen(path, "w");
    if (!f)
        return KILN_RAISE(KILN_ERR_IO, "check that the directory exists and is writable",
                          "kiln_profiler_export_chrome_trace: cannot open %s: %s", path, strerror(errno));
    int pid = (int)getpid();
    const prof_result *res = kiln_profiler_result_lock();
    trace_base_ns = UINT64_MAX;
    for (size_t i = 0; i < res->n; i++) {
        const prof_record *r = &res->rec[i];
        if (r->start_ns < trace_base_ns) trace_base_ns = r->start_ns;
        if (r->dev_end_ns && r->dev_start_ns < trace_base_ns) trace_base_ns = r->dev_start_ns;
    }
    if (!res->n) trace_base_ns = 0;
    fprintf(f, "{\"schemaVersion\":1,\"displayTimeUnit\":\"ms\",\"traceName\":");
    write_string(f, path);
    fprintf(f, ",\"traceEvents\":[\n");
    write_metadata(f, res, pid);
    for (size_t i = 0; i < res->n; i++) write_record(f, &res->rec[i], i + 1, pid);
    fprintf(f, "\n]}\n");
    kiln_profiler_result_unlock();
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    if (failed)
        return KILN_RAISE(KILN_ERR_IO, "check the free space on the disk",
                          "kiln_profiler_export_chrome_trace: writing %s failed", path);
    return KILN_OK;
}
