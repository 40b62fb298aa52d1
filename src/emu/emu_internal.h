/* Kiln CUDA emulator internals shared by exec.cpp (running kernels),
 * streams.cpp (configuration, streams, events, launch) and runtime.cpp (the
 * runtime API: devices, memory, streams, events). */
#ifndef KILN_EMU_EMU_INTERNAL_H
#define KILN_EMU_EMU_INTERNAL_H

#include <atomic>
#include <memory>

#include "kiln_emu.h"

namespace kiln_emu {

/* A launch accepted by submit_launch, run by a stream worker. */
struct launch_job {
    launch_params params;
    std::unique_ptr<kernel_body> body;
    int device;
};

/* Runs every block of the launch (spread over the block pool) and returns
 * when all have finished. Called on a stream worker thread. Aborts the
 * process on a deadlock inside a block. */
void run_grid(launch_job &job);

/* Environment-configured sizes (streams.cpp reads them once). */
int config_worker_threads();
size_t config_stack_bytes();

extern std::atomic<unsigned long long> stat_launches, stat_blocks, stat_switches, stat_async_ops;
/* graphs.cpp: host-queued kernel launches, launches recorded by a capture,
 * cudaGraphLaunch calls. */
extern std::atomic<unsigned long long> stat_direct_launches, stat_captured_launches, stat_graph_launches;

} // namespace kiln_emu

#endif
