/* The in-memory kernel cache (see kernel_cache.h). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/diag.h"
#include "base/hash.h"
#include "runtime/kernel_cache.h"

typedef enum { PENDING, READY, FAILED } entry_state;

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    void *key;
    size_t key_size;
    entry_state state;
    bool linked; /* still in the table (a failed entry leaves it) */
    int waiters;
    void *value;
    kpt_diag error;
} entry;

struct kpt_kcache {
    pthread_mutex_t lock;
    pthread_cond_t done; /* broadcast when any build finishes */
    entry **buckets;
    size_t nbuckets, count;
    void (*destroy)(void *value);
};

kpt_kcache *kpt_kcache_new(void (*destroy)(void *value))
{
    kpt_kcache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->nbuckets = 64;
    c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->done, NULL);
    c->destroy = destroy;
    return c;
}

static void entry_free(entry *e)
{
    free(e->key);
    free(e);
}

void kpt_kcache_free(kpt_kcache **cp)
{
    kpt_kcache *c = *cp;
    if (!c)
        return;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            if (e->state == READY && c->destroy)
                c->destroy(e->value);
            entry_free(e);
        }
    }
    free(c->buckets);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *cp = NULL;
}

static entry *find(kpt_kcache *c, uint64_t hash, const void *key, size_t key_size)
{
    for (entry *e = c->buckets[hash & (c->nbuckets - 1)]; e; e = e->next)
        if (e->hash == hash && e->key_size == key_size && !memcmp(e->key, key, key_size))
            return e;
    return NULL;
}

/* Doubles the table when it is full; on allocation failure it simply stays (chains grow). */
static void grow(kpt_kcache *c)
{
    if (c->count < c->nbuckets)
        return;
    size_t n = c->nbuckets * 2;
    entry **b = calloc(n, sizeof(*b));
    if (!b)
        return;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = n;
}

static void unlink_entry(kpt_kcache *c, entry *e)
{
    entry **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    e->linked = false;
    c->count--;
}

/* Waits for another thread's build of e; called and returns with the lock held. */
static kpt_status wait_for(kpt_kcache *c, entry *e, void **value, kpt_diag *diag)
{
    e->waiters++;
    while (e->state == PENDING)
        pthread_cond_wait(&c->done, &c->lock);
    e->waiters--;
    if (e->state == READY) {
        *value = e->value;
        return KPT_OK;
    }
    kpt_status st = e->error.status;
    if (diag)
        *diag = e->error;
    if (!e->waiters && !e->linked)
        entry_free(e);
    return st;
}

kpt_status kpt_kcache_get(kpt_kcache *c, const void *key, size_t key_size,
                          kpt_kcache_build_fn build, void *user, void **value, bool *hit,
                          kpt_diag *diag)
{
    *value = NULL;
    *hit = false;
    uint64_t hash = kpt_checksum(key, key_size);
    pthread_mutex_lock(&c->lock);
    entry *e = find(c, hash, key, key_size);
    if (e) {
        kpt_status st = wait_for(c, e, value, diag);
        *hit = st == KPT_OK;
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    e = calloc(1, sizeof(*e));
    if (e)
        e->key = malloc(key_size ? key_size : 1);
    if (!e || !e->key) {
        pthread_mutex_unlock(&c->lock);
        free(e);
        return kpt_diag_set(diag, KPT_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(e->key, key, key_size);
    e->key_size = key_size;
    e->hash = hash;
    e->state = PENDING;
    grow(c);
    e->next = c->buckets[hash & (c->nbuckets - 1)];
    c->buckets[hash & (c->nbuckets - 1)] = e;
    e->linked = true;
    c->count++;
    pthread_mutex_unlock(&c->lock);

    kpt_diag err = {0};
    void *v = NULL;
    kpt_status st = build(user, &v, &err);

    pthread_mutex_lock(&c->lock);
    if (!st) {
        e->value = v;
        e->state = READY;
        *value = v;
    } else {
        e->error = err;
        e->error.status = st;
        e->state = FAILED;
        unlink_entry(c, e);
    }
    pthread_cond_broadcast(&c->done);
    if (st && !e->waiters)
        entry_free(e);
    pthread_mutex_unlock(&c->lock);
    if (st && diag)
        *diag = err;
    return st;
}

void kpt_kcache_foreach(kpt_kcache *c, void (*fn)(void *user, void *value), void *user)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nbuckets; i++)
        for (entry *e = c->buckets[i]; e; e = e->next)
            if (e->state == READY)
                fn(user, e->value);
    pthread_mutex_unlock(&c->lock);
}
