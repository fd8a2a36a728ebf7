/* The in-memory kernel cache of a context: a hash map from key bytes to a built value, where
 * concurrent requests for one missing key build it once: the first caller builds (without
 * holding the lock), the others wait for its result. A failed build is reported to everyone
 * waiting on it and then forgotten, so a later request tries again.
 *
 * Thread-safety: every call is safe from any thread. */
#ifndef KPT_RUNTIME_KERNEL_CACHE_H
#define KPT_RUNTIME_KERNEL_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include <kpt/status.h>

typedef struct kpt_kcache kpt_kcache;

typedef kpt_status (*kpt_kcache_build_fn)(void *user, void **value, kpt_diag *diag);

/* `destroy` frees values when the cache is freed. NULL when out of memory. */
kpt_kcache *kpt_kcache_new(void (*destroy)(void *value));
void kpt_kcache_free(kpt_kcache **cache);

/* The value of `key` (key_size bytes, compared exactly): found (*hit = true, also when this call
 * waited for another thread's build) or built now by `build(user, ...)`. */
kpt_status kpt_kcache_get(kpt_kcache *cache, const void *key, size_t key_size,
                          kpt_kcache_build_fn build, void *user, void **value, bool *hit,
                          kpt_diag *diag);

/* Calls fn on every built value (under the cache's lock: fn must not use the cache). */
void kpt_kcache_foreach(kpt_kcache *cache, void (*fn)(void *user, void *value), void *user);

#endif
