/* Scopes and the API depth counter (the rule is described in scope.h).
 *
 * Each thread has a stack of scopes; each scope is a growable array of the
 * tensor references it owns, one entry per reference (a pointer may appear
 * more than once). Unregistering scans from the newest entry backwards:
 * early releases are nearly always of recent results, so the scan is short
 * in practice even in a scope holding thousands of tensors. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tensor/scope.h"
#include "tensor/tensor_internal.h"

typedef struct scope {
    kiln_tensor **entries;
    size_t count, capacity;
} scope;

static _Thread_local int api_depth;
static _Thread_local scope *stack; /* stack[0] is the outermost scope */
static _Thread_local int stack_depth, stack_capacity;

/* Call sites. The public headers' macros bracket each call: a mark just
 * before the function's arguments are evaluated, kiln_site_done just after
 * the function returns. So in `kiln_sum(kiln_mul(a, b))` the marks arrive
 * as sum, mul and mul's is gone again before sum is entered: the newest
 * mark is always the innermost macro call still running. An outermost
 * call (depth 0 -> 1) reads it without taking it, so a call without a
 * macro (kiln_module_forward through a function pointer, a tensor-layer
 * function) inside a macro call's arguments is given that call's line and
 * leaves the mark to its owner. */
#define SITE_STACK 32
static _Thread_local struct {
    const char *file;
    int line;
} site_stack[SITE_STACK], site_current;
static _Thread_local int site_count;

void kiln_site_mark(const char *file, int line) {
    if (api_depth > 0) return; /* inside the library: keep the user's site */
    if (site_count == SITE_STACK) { /* deeper than the stack, or marks never done: drop the oldest */
        memmove(site_stack, site_stack + 1, sizeof site_stack[0] * (SITE_STACK - 1));
        site_count--;
    }
    site_stack[site_count].file = file;
    site_stack[site_count].line = line;
    site_count++;
}

kiln_tensor *kiln_site_done(kiln_tensor *result) {
    if (api_depth == 0 && site_count > 0) site_count--;
    return result;
}

const char *kiln_site_get(int *line) {
    if (line) *line = site_current.file ? site_current.line : 0;
    return site_current.file ? site_current.file : "(unknown)";
}

void kiln_api_enter(void) {
    if (api_depth++ > 0) return;
    if (site_count > 0) site_current = site_stack[site_count - 1];
    else site_current.file = NULL;
}

void kiln_api_leave(void) {
    KILN_ASSERT(api_depth > 0);
    if (--api_depth == 0) site_current.file = NULL;
}

int kiln_api_depth(void) { return api_depth; }

static kiln_status scope_push_entry(scope *s, kiln_tensor *t) {
    if (s->count == s->capacity) {
        size_t cap = s->capacity ? s->capacity * 2 : 16;
        kiln_tensor **e = KILN_REALLOC(s->entries, cap * sizeof *e);
        if (!e) return KILN_ERR_OUT_OF_MEMORY;
        s->entries = e;
        s->capacity = cap;
    }
    s->entries[s->count++] = t;
    return KILN_OK;
}

kiln_tensor *kiln_api_return(kiln_tensor *t) {
    kiln_api_leave();
    if (api_depth > 0 || !t || stack_depth == 0) return t;
    if (scope_push_entry(&stack[stack_depth - 1], t)) {
        kiln_tensor_drop(t);
        return NULL;
    }
    return t;
}

/* Removes the newest entry equal to t; order of the others is kept so that
 * scope_end releases in creation order. */
static bool scope_remove(scope *s, const kiln_tensor *t) {
    for (size_t i = s->count; i-- > 0;) {
        if (s->entries[i] != t) continue;
        for (size_t j = i + 1; j < s->count; j++) s->entries[j - 1] = s->entries[j];
        s->count--;
        return true;
    }
    return false;
}

bool kiln_scope_unregister(const kiln_tensor *t) {
    for (int d = stack_depth - 1; d >= 0; d--)
        if (scope_remove(&stack[d], t)) return true;
    return false;
}

void kiln_scope_begin(void) {
    if (stack_depth == stack_capacity) {
        int cap = stack_capacity ? stack_capacity * 2 : 8;
        scope *ns = KILN_REALLOC(stack, (size_t)cap * sizeof *ns);
        /* No status to return: an open that cannot be recorded would make
         * the matching end close the caller's outer scope, so it is fatal. */
        KILN_ASSERT_MSG(ns, "kiln_scope_begin: out of host memory for the scope stack");
        stack = ns;
        stack_capacity = cap;
    }
    stack[stack_depth++] = (scope){0};
}

kiln_status kiln_scope_end(void) {
    if (stack_depth == 0)
        return KILN_RAISE(KILN_ERR_STATE,
                          "pair every kiln_scope_end with a kiln_scope_begin on the same thread",
                          "kiln_scope_end: no scope is open on this thread");
    /* Pop first: releases below run with the scope gone, so nothing they do
     * can register into or unregister from it. */
    scope s = stack[--stack_depth];
    kiln_status first = KILN_OK;
    for (size_t i = 0; i < s.count; i++) {
        kiln_status st = kiln_tensor_drop(s.entries[i]);
        if (st && !first) first = st;
    }
    free(s.entries);
    if (stack_depth == 0) {
        free(stack);
        stack = NULL;
        stack_capacity = 0;
    }
    return first;
}

kiln_tensor *kiln_keep(kiln_tensor *t) {
    if (!t || stack_depth == 0) return t;
    if (!scope_remove(&stack[stack_depth - 1], t)) return t;
    if (stack_depth >= 2 && scope_push_entry(&stack[stack_depth - 2], t)) {
        /* Could not record the move: leave the reference where it was. */
        scope_push_entry(&stack[stack_depth - 1], t);
        return t;
    }
    return t;
}

int kiln_scope_depth(void) { return stack_depth; }
