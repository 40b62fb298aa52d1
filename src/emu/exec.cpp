/* Kiln CUDA emulator: running a kernel launch on the CPU.
 *
 * Blocks are handed out one at a time from an atomic counter to the stream
 * worker that owns the launch and to a small pool of helper host threads
 * (KILN_CUDA_EMU_THREADS in all, default 2). A host thread runs one block at
 * a time: each CUDA thread is a fiber with its own small stack, and the
 * scheduler below resumes each runnable fiber in order until it exits or
 * waits at a barrier. A kernel without barriers thus runs each thread to
 * completion in turn (one stack, reused). When every fiber is waiting or
 * done, the scheduler releases the warp collectives and block barriers
 * whose participants have all arrived; if none can be released, the block
 * can never finish and the process aborts with a message naming the kernel,
 * the block and the waiting threads.
 *
 * Context switches: a few lines of x86-64 assembly (callee-saved registers
 * and the stack pointer); ucontext elsewhere and under AddressSanitizer,
 * whose fiber-switch annotations are made in both cases. */
#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "emu_internal.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KILN_EMU_ASAN 1
#endif

#if defined(KILN_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__) && !defined(KILN_EMU_ASAN) && !defined(KILN_EMU_FORCE_UCONTEXT)
#define KILN_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#if defined(KILN_EMU_ASM_SWITCH)
/* kiln_emu_switch(save, to): push the callee-saved registers, store the
 * stack pointer in *save, load `to` and pop the other context's registers.
 * MXCSR and the x87 control word are per host thread and never changed by
 * kernels, so they are not switched. */
extern "C" void kiln_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".globl kiln_emu_switch\n"
        ".hidden kiln_emu_switch\n"
        ".type kiln_emu_switch,@function\n"
        "kiln_emu_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size kiln_emu_switch, .-kiln_emu_switch\n");
#endif

namespace kiln_emu {

/* initial-exec: these are read by every CUDA thread, and the default model
 * of position-independent code would call __tls_get_addr for each read. */
thread_local block_builtins tls_block;
thread_local uint3 tls_thread_idx;

std::atomic<unsigned long long> stat_launches{0}, stat_blocks{0}, stat_switches{0}, stat_async_ops{0};

namespace {

enum fiber_state : unsigned char { F_NEW, F_RUNNABLE, F_BLOCK_BAR, F_WARP_BAR, F_EXITED };

struct fiber {
#if defined(KILN_EMU_ASM_SWITCH)
    void *sp;
#else
    ucontext_t ctx;
#endif
    void *stack; /* NULL until first run; returned to the pool on exit */
    uint3 tid;
    int linear;
    fiber_state state;
    /* block barrier */
    barrier_kind bar_kind;
    int bar_pred;
    int bar_result;
    const char *bar_file;
    int bar_line;
    /* warp collective */
    warp_kind w_kind;
    unsigned w_mask;
    int w_src;
    unsigned w_size;
    int w_pred;
    unsigned w_result;
    unsigned w_participants;
    const char *w_file;
    int w_line;
    unsigned char w_value[16];
    unsigned char w_out[16];
#if defined(KILN_EMU_ASAN)
    void *fake_stack;
#endif
};

/* Everything one host thread needs to run blocks. */
struct block_runner {
    std::vector<fiber> fibers;
    std::vector<void *> free_stacks;
    size_t stack_bytes = 0;
    fiber *current = nullptr;
    launch_job *job = nullptr;
    unsigned long long switches = 0;
#if defined(KILN_EMU_ASM_SWITCH)
    void *sched_sp = nullptr;
#else
    ucontext_t sched_ctx;
#endif
#if defined(KILN_EMU_ASAN)
    const void *host_stack_bottom = nullptr;
    size_t host_stack_size = 0;
    void *sched_fake_stack = nullptr;
#endif
    ~block_runner() {
        for (void *s : free_stacks) munmap((char *)s - guard_bytes(), stack_bytes + guard_bytes());
    }
    static size_t guard_bytes() { return 4096; }
};

thread_local block_runner *tls_runner;

block_runner &runner() {
    if (!tls_runner) {
        static thread_local block_runner r;
        r.stack_bytes = config_stack_bytes();
        tls_runner = &r;
    }
    return *tls_runner;
}

void *stack_get(block_runner &r) {
    if (!r.free_stacks.empty()) {
        void *s = r.free_stacks.back();
        r.free_stacks.pop_back();
        return s;
    }
    size_t total = r.stack_bytes + block_runner::guard_bytes();
    void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "kiln CUDA emulator: cannot map a %zu-byte fiber stack\n", total);
        abort();
    }
    /* A guard page below the stack turns an overflow into a crash. */
    mprotect(m, block_runner::guard_bytes(), PROT_NONE);
    return (char *)m + block_runner::guard_bytes();
}

void stack_put(block_runner &r, void *s) {
#if defined(KILN_EMU_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(s, r.stack_bytes);
#endif
    r.free_stacks.push_back(s);
}

[[noreturn]] void fiber_finish(block_runner &r, fiber &f);

/* A fiber's first code. When its CUDA thread returns, the next thread of
 * the block that has not started yet continues on the same stack without
 * a switch, so a kernel without barriers costs one switch per block, not
 * per thread. A thread that waits at a barrier suspends the chain; the
 * scheduler starts the threads after it. */
extern "C" void kiln_emu_fiber_entry(void) {
    block_runner &r = *tls_runner;
#if defined(KILN_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &r.host_stack_bottom, &r.host_stack_size);
#endif
    kernel_body *body = r.job->body.get();
    for (;;) {
        fiber &f = *r.current;
        body->run();
        size_t next = (size_t)f.linear + 1;
        if (next >= r.fibers.size() || r.fibers[next].state != F_NEW) fiber_finish(r, f);
        fiber &n = r.fibers[next];
        f.state = F_EXITED;
        n.stack = f.stack;
        f.stack = nullptr;
        n.state = F_RUNNABLE;
        r.current = &n;
        tls_thread_idx = n.tid;
    }
}

/* Switch from the scheduler into fiber f; returns when f waits or exits. */
void resume(block_runner &r, fiber &f) {
    r.current = &f;
    tls_thread_idx = f.tid;
    r.switches++;
    if (f.state == F_NEW) {
        f.stack = stack_get(r);
        f.state = F_RUNNABLE;
#if defined(KILN_EMU_ASM_SWITCH)
        /* The initial frame: six zero registers, then kiln_emu_fiber_entry as
         * the return address, then a zero return address for it; at its
         * entry rsp % 16 == 8, as after a call. */
        uintptr_t top = ((uintptr_t)f.stack + r.stack_bytes) & ~(uintptr_t)15;
        void **sp = (void **)top;
        *--sp = nullptr;
        *--sp = (void *)&kiln_emu_fiber_entry;
        for (int k = 0; k < 6; k++) *--sp = nullptr;
        f.sp = sp;
#else
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = r.stack_bytes;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, (void (*)())kiln_emu_fiber_entry, 0);
#endif
    }
#if defined(KILN_EMU_ASAN)
    __sanitizer_start_switch_fiber(&r.sched_fake_stack, f.stack, r.stack_bytes);
#endif
#if defined(KILN_EMU_ASM_SWITCH)
    kiln_emu_switch(&r.sched_sp, f.sp);
#else
    swapcontext(&r.sched_ctx, &f.ctx);
#endif
#if defined(KILN_EMU_ASAN)
    __sanitizer_finish_switch_fiber(r.sched_fake_stack, nullptr, nullptr);
#endif
    /* The fiber that switched back may be a later thread of the chain. */
    fiber &last = *r.current;
    r.current = nullptr;
    if (last.state == F_EXITED) {
        stack_put(r, last.stack);
        last.stack = nullptr;
    }
}

/* From fiber f back to the scheduler (f has set its state). */
void yield(block_runner &r, fiber &f) {
#if defined(KILN_EMU_ASAN)
    __sanitizer_start_switch_fiber(&f.fake_stack, r.host_stack_bottom, r.host_stack_size);
#endif
#if defined(KILN_EMU_ASM_SWITCH)
    kiln_emu_switch(&f.sp, r.sched_sp);
#else
    swapcontext(&f.ctx, &r.sched_ctx);
#endif
#if defined(KILN_EMU_ASAN)
    __sanitizer_finish_switch_fiber(f.fake_stack, &r.host_stack_bottom, &r.host_stack_size);
#endif
    tls_thread_idx = f.tid;
}

[[noreturn]] void fiber_finish(block_runner &r, fiber &f) {
    f.state = F_EXITED;
#if defined(KILN_EMU_ASAN)
    __sanitizer_start_switch_fiber(nullptr, r.host_stack_bottom, r.host_stack_size);
#endif
#if defined(KILN_EMU_ASM_SWITCH)
    kiln_emu_switch(&f.sp, r.sched_sp);
#else
    swapcontext(&f.ctx, &r.sched_ctx);
#endif
    abort(); /* never resumed */
}

fiber &current_fiber(const char *what) {
    block_runner *r = tls_runner;
    if (!r || !r->current) {
        fprintf(stderr, "kiln CUDA emulator: %s called outside a kernel\n", what);
        abort();
    }
    return *r->current;
}

const char *kind_name(warp_kind k) {
    switch (k) {
    case WARP_SYNC:
        return "__syncwarp";
    case WARP_SHFL:
        return "a warp shuffle (__shfl_*_sync)";
    default:
        return "a warp vote (__ballot_sync/__any_sync/__all_sync)";
    }
}

[[noreturn]] void die_in_block(block_runner &r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

[[noreturn]] void die_in_block(block_runner &r, const char *fmt, ...) {
    /* One report: a second host thread finding another block stuck waits
     * here until the first has aborted the process. */
    static std::mutex report_mutex;
    report_mutex.lock();
    const launch_params &p = r.job->params;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "kiln CUDA emulator: kernel %s (launched at %s:%d, grid (%u,%u,%u), block (%u,%u,%u)) on cuda:%d, "
            "block (%u,%u,%u): %s\n",
            p.name, p.file, p.line, p.grid.x, p.grid.y, p.grid.z, p.block.x, p.block.y, p.block.z, r.job->device,
            tls_block.block_idx.x, tls_block.block_idx.y, tls_block.block_idx.z, msg);
    fflush(stderr);
    abort();
}

/* Release every warp collective whose participants have all arrived.
 * Returns whether any was released. */
bool release_warps(block_runner &r) {
    bool released = false;
    int n = (int)r.fibers.size();
    for (int base = 0; base < n; base += 32) {
        int lanes = n - base < 32 ? n - base : 32;
        unsigned alive = 0, waiting = 0;
        for (int l = 0; l < lanes; l++) {
            fiber_state s = r.fibers[base + l].state;
            if (s != F_EXITED) alive |= 1u << l;
            if (s == F_WARP_BAR) waiting |= 1u << l;
        }
        unsigned done = 0;
        for (int l = 0; l < lanes; l++) {
            if (!(waiting & (1u << l)) || (done & (1u << l))) continue;
            unsigned mask = r.fibers[base + l].w_mask;
            unsigned need = mask & alive;
            /* Ready when every live lane named in the mask waits at a warp
             * collective with the same mask. */
            bool ready = true;
            for (int m = 0; m < lanes && ready; m++) {
                if (!(need & (1u << m))) continue;
                const fiber &o = r.fibers[base + m];
                if (o.state != F_WARP_BAR || o.w_mask != mask) ready = false;
            }
            if (!ready) continue;
            unsigned group = need;
            warp_kind kind = r.fibers[base + l].w_kind;
            unsigned ballot = 0;
            for (int m = 0; m < lanes; m++) {
                if (!(group & (1u << m))) continue;
                const fiber &o = r.fibers[base + m];
                if (o.w_kind != kind || (kind == WARP_SHFL && o.w_size != r.fibers[base + l].w_size))
                    die_in_block(r,
                                 "warp %d: lane %d is at %s (%s:%d) while lane %d is at %s (%s:%d): the lanes of a "
                                 "mask must meet at the same collective",
                                 base / 32, l, kind_name(kind), r.fibers[base + l].w_file,
                                 r.fibers[base + l].w_line, m, kind_name(o.w_kind), o.w_file, o.w_line);
                if (o.w_pred) ballot |= 1u << m;
            }
            for (int m = 0; m < lanes; m++) {
                if (!(group & (1u << m))) continue;
                fiber &o = r.fibers[base + m];
                if (kind == WARP_SHFL) {
                    int src = o.w_src;
                    if (src == m)
                        memcpy(o.w_out, o.w_value, o.w_size);
                    else if (src >= 0 && src < 32 && (group & (1u << src)))
                        memcpy(o.w_out, r.fibers[base + src].w_value, o.w_size);
                    else
                        memset(o.w_out, 0xFF, o.w_size); /* an inactive source lane: undefined on a GPU */
                }
                o.w_result = ballot;
                o.w_participants = group;
                o.state = F_RUNNABLE;
            }
            done |= group;
            released = true;
        }
    }
    return released;
}

/* Release the block barrier if every live thread waits at it. */
bool release_block_barrier(block_runner &r) {
    fiber *first = nullptr;
    int count = 0, all = 1, any = 0;
    for (fiber &f : r.fibers) {
        if (f.state == F_EXITED) continue;
        if (f.state != F_BLOCK_BAR) return false;
        if (!first) {
            first = &f;
        } else if (f.bar_line != first->bar_line || f.bar_kind != first->bar_kind ||
                   (f.bar_file != first->bar_file && strcmp(f.bar_file, first->bar_file) != 0)) {
            die_in_block(r,
                         "thread (%u,%u,%u) waits at __syncthreads at %s:%d but thread (%u,%u,%u) at %s:%d: "
                         "divergent __syncthreads (every thread of a block must reach the same barrier)",
                         first->tid.x, first->tid.y, first->tid.z, first->bar_file, first->bar_line, f.tid.x, f.tid.y,
                         f.tid.z, f.bar_file, f.bar_line);
        }
        if (f.bar_pred) {
            count++;
            any = 1;
        } else {
            all = 0;
        }
    }
    if (!first) return false;
    int result = 0;
    switch (first->bar_kind) {
    case BAR_COUNT:
        result = count;
        break;
    case BAR_AND:
        result = all;
        break;
    case BAR_OR:
        result = any;
        break;
    default:
        break;
    }
    for (fiber &f : r.fibers)
        if (f.state == F_BLOCK_BAR) {
            f.bar_result = result;
            f.state = F_RUNNABLE;
        }
    return true;
}

[[noreturn]] void deadlock(block_runner &r) {
    const fiber *at_block = nullptr, *at_warp = nullptr;
    for (const fiber &f : r.fibers) {
        if (f.state == F_BLOCK_BAR && !at_block) at_block = &f;
        if (f.state == F_WARP_BAR && !at_warp) at_warp = &f;
    }
    char a[256] = "", b[256] = "";
    if (at_block)
        snprintf(a, sizeof a, "thread (%u,%u,%u) waits at __syncthreads (%s:%d)", at_block->tid.x, at_block->tid.y,
                 at_block->tid.z, at_block->bar_file, at_block->bar_line);
    if (at_warp)
        snprintf(b, sizeof b, "%sthread (%u,%u,%u) waits at %s with mask 0x%08x (%s:%d)", at_block ? "; " : "",
                 at_warp->tid.x, at_warp->tid.y, at_warp->tid.z, kind_name(at_warp->w_kind), at_warp->w_mask,
                 at_warp->w_file, at_warp->w_line);
    die_in_block(r, "deadlock: no thread can make progress: %s%s (divergent __syncthreads, or a warp collective "
                    "whose mask names lanes that wait elsewhere?)",
                 a, b);
}

void run_block(launch_job &job, uint64_t linear_block) {
    block_runner &r = runner();
    const launch_params &p = job.params;
    uint3 bidx;
    bidx.x = (unsigned)(linear_block % p.grid.x);
    bidx.y = (unsigned)((linear_block / p.grid.x) % p.grid.y);
    bidx.z = (unsigned)(linear_block / ((uint64_t)p.grid.x * p.grid.y));
    tls_block.block_idx = bidx;
    tls_block.block_dim = p.block;
    tls_block.grid_dim = p.grid;
    /* Dynamic shared memory: exactly the requested size, so ASan sees an
     * overrun, and filled with all-ones bytes (NaN) since a GPU leaves it
     * undefined. */
    void *smem = p.shmem ? malloc(p.shmem) : nullptr;
    if (p.shmem && !smem) {
        fprintf(stderr, "kiln CUDA emulator: out of host memory for %zu bytes of shared memory\n", p.shmem);
        abort();
    }
    if (smem) memset(smem, 0xFF, p.shmem);
    tls_block.dynamic_smem = smem;
    r.job = &job;
    int n = (int)(p.block.x * p.block.y * p.block.z);
    r.fibers.resize((size_t)n);
    for (int i = 0; i < n; i++) {
        fiber &f = r.fibers[(size_t)i];
        f.stack = nullptr;
        f.tid.x = (unsigned)i % p.block.x;
        f.tid.y = ((unsigned)i / p.block.x) % p.block.y;
        f.tid.z = (unsigned)i / (p.block.x * p.block.y);
        f.linear = i;
        f.state = F_NEW;
    }
    for (;;) {
        int alive = 0;
        for (int i = 0; i < n; i++) {
            fiber &f = r.fibers[(size_t)i];
            if (f.state == F_NEW || f.state == F_RUNNABLE) resume(r, f);
            if (f.state != F_EXITED) alive++;
        }
        if (alive == 0) break;
        if (release_warps(r)) continue;
        if (release_block_barrier(r)) continue;
        deadlock(r);
    }
    free(smem);
    tls_block.dynamic_smem = nullptr;
    r.job = nullptr;
    stat_blocks.fetch_add(1, std::memory_order_relaxed);
    stat_switches.fetch_add(r.switches, std::memory_order_relaxed);
    r.switches = 0;
}

/* ---- The block pool ---------------------------------------------------------------- */

struct grid_work {
    launch_job *job;
    uint64_t total;
    std::atomic<uint64_t> next{0};
    uint64_t done = 0; /* under pool.m */
    int users = 0;     /* helpers working on it, under pool.m */
};

struct block_pool {
    std::mutex m;
    std::condition_variable work_cv; /* helpers wait for work */
    std::condition_variable done_cv; /* owners wait for their grid */
    std::deque<grid_work *> active;
    int helpers = 0;
};

block_pool &pool() {
    static block_pool *p = new block_pool; /* never destroyed: helpers outlive static destructors */
    return *p;
}

void helper_main() {
    block_pool &p = pool();
    std::unique_lock<std::mutex> lock(p.m);
    for (;;) {
        grid_work *w = nullptr;
        for (grid_work *g : p.active)
            if (g->next.load(std::memory_order_relaxed) < g->total) {
                w = g;
                break;
            }
        if (!w) {
            p.work_cv.wait(lock);
            continue;
        }
        w->users++;
        lock.unlock();
        uint64_t ran = 0;
        for (;;) {
            uint64_t b = w->next.fetch_add(1, std::memory_order_relaxed);
            if (b >= w->total) break;
            run_block(*w->job, b);
            ran++;
        }
        lock.lock();
        w->done += ran;
        w->users--;
        p.done_cv.notify_all();
    }
}

void ensure_helpers() {
    block_pool &p = pool();
    std::lock_guard<std::mutex> lock(p.m);
    int want = config_worker_threads() - 1;
    while (p.helpers < want) {
        std::thread(helper_main).detach();
        p.helpers++;
    }
}

} // namespace

void run_grid(launch_job &job) {
    const launch_params &p = job.params;
    uint64_t total = (uint64_t)p.grid.x * p.grid.y * p.grid.z;
    stat_launches.fetch_add(1, std::memory_order_relaxed);
    if (total == 1 || config_worker_threads() <= 1) {
        for (uint64_t b = 0; b < total; b++) run_block(job, b);
        return;
    }
    ensure_helpers();
    block_pool &bp = pool();
    grid_work w;
    w.job = &job;
    w.total = total;
    {
        std::lock_guard<std::mutex> lock(bp.m);
        bp.active.push_back(&w);
    }
    bp.work_cv.notify_all();
    uint64_t ran = 0;
    for (;;) {
        uint64_t b = w.next.fetch_add(1, std::memory_order_relaxed);
        if (b >= total) break;
        run_block(job, b);
        ran++;
    }
    std::unique_lock<std::mutex> lock(bp.m);
    w.done += ran;
    bp.done_cv.wait(lock, [&] { return w.done == total && w.users == 0; });
    for (auto it = bp.active.begin(); it != bp.active.end(); ++it)
        if (*it == &w) {
            bp.active.erase(it);
            break;
        }
}

/* ---- Device-side calls ----------------------------------------------------------------- */

int block_barrier(barrier_kind kind, int pred, const char *file, int line) {
    fiber &f = current_fiber("__syncthreads");
    f.state = F_BLOCK_BAR;
    f.bar_kind = kind;
    f.bar_pred = pred != 0;
    f.bar_file = file;
    f.bar_line = line;
    yield(*tls_runner, f);
    return f.bar_result;
}

unsigned warp_collective(warp_kind kind, unsigned mask, const void *value, unsigned size, int src_lane, void *out,
                         int pred, const char *file, int line) {
    fiber &f = current_fiber("a warp collective");
    int lane = f.linear & 31;
    if (!(mask & (1u << lane)))
        die_in_block(*tls_runner,
                     "thread (%u,%u,%u) (lane %d) calls %s at %s:%d with mask 0x%08x, which does not include its "
                     "own lane",
                     f.tid.x, f.tid.y, f.tid.z, lane, kind_name(kind), file, line, mask);
    f.state = F_WARP_BAR;
    f.w_kind = kind;
    f.w_mask = mask;
    f.w_src = src_lane;
    f.w_size = size;
    f.w_pred = pred != 0;
    f.w_file = file;
    f.w_line = line;
    if (size) memcpy(f.w_value, value, size);
    yield(*tls_runner, f);
    if (kind == WARP_SHFL && out) memcpy(out, f.w_out, size);
    if (kind == WARP_VOTE && out) memcpy(out, &f.w_participants, sizeof f.w_participants);
    return f.w_result;
}

const uint3 &thread_idx() { return tls_thread_idx; }
const block_builtins &block() { return tls_block; }

unsigned lane_id() { return (unsigned)(current_fiber("the lane index").linear & 31); }

unsigned active_mask() {
    fiber &f = current_fiber("__activemask");
    block_runner &r = *tls_runner;
    int base = f.linear & ~31;
    unsigned m = 0;
    for (int l = 0; l < 32 && base + l < (int)r.fibers.size(); l++)
        if (r.fibers[(size_t)(base + l)].state != F_EXITED) m |= 1u << l;
    return m;
}

} // namespace kiln_emu

void *kiln_emu_dynamic_shared() { return kiln_emu::tls_block.dynamic_smem; }
