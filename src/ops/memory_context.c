/* The memory history's context (src/runtime/memory_history.c): which op the
 * dispatcher is running on this thread and the user's file:line behind the
 * outermost public call. The runtime sits below both, so kiln_init
 * registers this provider with it. */
#include "ops/op_registry.h"
#include "runtime/caching_allocator.h"
#include "tensor/scope.h"

void kiln_memory_context_fill(kiln_alloc_context *out) {
    int line = 0;
    const char *file = kiln_site_get(&line);
    out->op = kiln_dispatch_current_op();
    out->file = line > 0 ? file : NULL;
    out->line = line;
}

void kiln_memory_context_register(void) { kiln_alloc_set_context_provider(kiln_memory_context_fill); }
