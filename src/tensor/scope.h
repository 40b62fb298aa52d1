/* The "outermost public call" rule of DESIGN.md, for every layer that
 * returns tensors to users.
 *
 * Each thread keeps an API depth counter. Every public function that
 * returns a tensor is written as
 *
 *     kiln_tensor *kiln_foo(...) {
 *         kiln_api_enter();
 *         return kiln_api_return(foo_impl(...));
 *     }
 *
 * and every public function that returns no tensor but calls tensor-
 * returning ones (kiln_copy_, kiln_item, an optimizer step) brackets its
 * body with kiln_api_enter / kiln_api_leave, or its temporaries would be
 * registered with the user's scope.
 *
 * kiln_api_return registers its result with the innermost open scope only
 * when the depth is back to 0, i.e. when the call came from the user. Public
 * functions called by the library itself run at depth > 0, so their results
 * (intermediates, saved tensors, module outputs inside a forward) are never
 * owned by a scope: the library holds them by its own references.
 *
 * Releasing: kiln_release at depth 0 (a user call) unregisters one
 * registration of the pointer, so a scoped reference released early is not
 * released again at scope end. Library code must not use kiln_release on
 * references it holds outside an entered region (it could unregister the
 * user's registration of the same tensor): it uses kiln_tensor_drop, or
 * brackets the work with kiln_api_enter / kiln_api_leave. */
#ifndef KILN_SRC_TENSOR_SCOPE_H
#define KILN_SRC_TENSOR_SCOPE_H

#include "kiln/tensor.h"

/* Enter a public call (depth++). */
void kiln_api_enter(void);
/* Leave a public call that returns no tensor (depth--). */
void kiln_api_leave(void);
/* Leave a public call returning `t` (depth--); if the depth is now 0, a
 * scope is open and t is not NULL, register t with the innermost scope.
 * Returns t, or NULL (t released, KILN_ERR_OUT_OF_MEMORY set) if the
 * scope's entry list cannot grow. */
kiln_tensor *kiln_api_return(kiln_tensor *t);
/* The user's file and line of the current outermost public call, as
 * marked by the public headers' call-site macros; "(unknown)" / 0 when the
 * call came through a function pointer or from a non-macro entry. */
const char *kiln_site_get(int *line);
/* This thread's API depth (0 outside the library). */
int kiln_api_depth(void);

/* Remove one registration of t from this thread's scopes, innermost first.
 * True when one was found. Used by kiln_release at depth 0. */
bool kiln_scope_unregister(const kiln_tensor *t);

#endif
