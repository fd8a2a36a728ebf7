/* What kptc needs from a context beyond the public API: the compiled binaries of an offline
 * context, to write bundles. */
#ifndef KPT_RUNTIME_CONTEXT_H
#define KPT_RUNTIME_CONTEXT_H

#include <kpt/runtime.h>

#include "runtime/backend.h"
#include "runtime/bundle.h"

/* The backend a context uses (for backend-specific internals: timings in tests/gpu). */
kpt_backend *kpt_context_backend_impl(kpt_context *ctx);

/* Calls fn once per compiled kernel of ctx with a bundle entry describing it (valid during the
 * call only). Only contexts made with KPT_CONTEXT_OFFLINE keep their binaries. */
void kpt_context_foreach_binary(kpt_context *ctx,
                                void (*fn)(void *user, const kpt_bundle_entry *entry), void *user);

#endif
