/* Live tensor handles, for catching double releases.
 *
 * In KILN_DEBUG_HANDLES builds (Debug and sanitizer builds) every tensor
 * record is entered in a hash set when it is created and removed just
 * before it is freed, so kiln_release can tell a dead handle from a live one
 * without reading the dead record. The set is open addressing with linear
 * probing and backward-shift deletion (no tombstones), keyed by address,
 * behind one mutex: a cost paid only in those builds.
 *
 * The key is the record's address, so a stale handle whose address malloc
 * has since given to a new tensor looks live. AddressSanitizer's quarantine
 * delays such reuse, which is why detection is reliable in sanitizer builds
 * and best effort in plain Debug builds. */
#include <pthread.h>
#include <stdlib.h>

#include "base/error.h"
#include "kiln_config.h"
#include "tensor/tensor_internal.h"

#if KILN_DEBUG_HANDLES

static pthread_mutex_t handles_mutex = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *slots; /* 0 = empty */
static size_t capacity;  /* a power of two, or 0 */
static size_t count;

/* Records come from malloc (16-byte aligned): drop the always-zero bits
 * before mixing, then a 64-bit multiplicative hash. */
static size_t slot_of(uintptr_t key, size_t cap) {
    uint64_t h = (uint64_t)(key >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static void insert_unlocked(uintptr_t key) {
    size_t i = slot_of(key, capacity);
    while (slots[i]) i = (i + 1) & (capacity - 1);
    slots[i] = key;
    count++;
}

/* Keeps the load at most one half, so probes stay short. */
static kiln_status grow_unlocked(void) {
    size_t new_cap = capacity ? capacity * 2 : 1024;
    uintptr_t *new_slots = KILN_CALLOC(new_cap, sizeof *new_slots);
    if (!new_slots) return KILN_ERR_OUT_OF_MEMORY;
    uintptr_t *old = slots;
    size_t old_cap = capacity;
    slots = new_slots;
    capacity = new_cap;
    count = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i]) insert_unlocked(old[i]);
    free(old);
    return KILN_OK;
}

static bool find_unlocked(uintptr_t key, size_t *at) {
    if (!capacity) return false;
    for (size_t i = slot_of(key, capacity);; i = (i + 1) & (capacity - 1)) {
        if (!slots[i]) return false;
        if (slots[i] == key) {
            *at = i;
            return true;
        }
    }
}

kiln_status kiln_handle_add(const kiln_tensor *t) {
    pthread_mutex_lock(&handles_mutex);
    kiln_status st = KILN_OK;
    if ((count + 1) * 2 > capacity) st = grow_unlocked();
    if (!st) insert_unlocked((uintptr_t)t);
    pthread_mutex_unlock(&handles_mutex);
    return st;
}

void kiln_handle_remove(const kiln_tensor *t) {
    pthread_mutex_lock(&handles_mutex);
    size_t hole;
    if (find_unlocked((uintptr_t)t, &hole)) {
        /* Backward-shift deletion: move later members of the probe run into
         * the hole when their home slot does not lie after the hole. */
        slots[hole] = 0;
        count--;
        for (size_t j = (hole + 1) & (capacity - 1); slots[j]; j = (j + 1) & (capacity - 1)) {
            size_t home = slot_of(slots[j], capacity);
            bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
            if (movable) {
                slots[hole] = slots[j];
                slots[j] = 0;
                hole = j;
            }
        }
    }
    pthread_mutex_unlock(&handles_mutex);
}

bool kiln_handle_is_live(const kiln_tensor *t) {
    pthread_mutex_lock(&handles_mutex);
    size_t at;
    bool live = find_unlocked((uintptr_t)t, &at);
    pthread_mutex_unlock(&handles_mutex);
    return live;
}

int64_t kiln_handle_live_count(void) {
    pthread_mutex_lock(&handles_mutex);
    int64_t n = (int64_t)count;
    pthread_mutex_unlock(&handles_mutex);
    return n;
}

void kiln_handles_shutdown(void) {
    pthread_mutex_lock(&handles_mutex);
    if (count)
        kiln_log_write(KILN_LOG_WARN, "kiln_shutdown: %zu tensor%s still alive (not released)", count,
                 count == 1 ? " is" : "s are");
    free(slots);
    slots = NULL;
    capacity = count = 0;
    pthread_mutex_unlock(&handles_mutex);
}

#else /* release builds: nothing is tracked; kiln_release checks the magic word */

kiln_status kiln_handle_add(const kiln_tensor *t) {
    (void)t;
    return KILN_OK;
}
void kiln_handle_remove(const kiln_tensor *t) { (void)t; }
bool kiln_handle_is_live(const kiln_tensor *t) {
    (void)t;
    return true;
}
int64_t kiln_handle_live_count(void) { return -1; }
void kiln_handles_shutdown(void) {}

#endif
