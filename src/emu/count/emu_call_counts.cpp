/* The counters of emu_call_counts.h: one relaxed atomic per counted call
 * (the counts are statistics; nothing is ordered by them). */
#include "emu_call_counts.h"

#include <atomic>

namespace {

std::atomic<unsigned long long> counts[KILN_EMU_CALL_COUNT];

const char *const names[KILN_EMU_CALL_COUNT] = {
#define KILN_EMU_CALL_NAME_(name) #name,
    KILN_EMU_COUNTED_CALLS(KILN_EMU_CALL_NAME_)
#undef KILN_EMU_CALL_NAME_
};

} // namespace

extern "C" void kiln_emu_call_note(kiln_emu_call call) {
    if ((unsigned)call < (unsigned)KILN_EMU_CALL_COUNT) counts[call].fetch_add(1, std::memory_order_relaxed);
}

extern "C" void kiln_emu_call_counts_get(unsigned long long out[KILN_EMU_CALL_COUNT]) {
    for (int i = 0; i < KILN_EMU_CALL_COUNT; i++) out[i] = counts[i].load(std::memory_order_relaxed);
}

extern "C" void kiln_emu_call_counts_reset(void) {
    for (auto &c : counts) c.store(0, std::memory_order_relaxed);
}

extern "C" const char *kiln_emu_call_name(int call) {
    return call >= 0 && call < KILN_EMU_CALL_COUNT ? names[call] : nullptr;
}
