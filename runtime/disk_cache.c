/* The on-disk kernel cache (see disk_cache.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/disk_cache.h"

#define MAGIC "KPTCACHE"
#define TEMP_PREFIX ".tmp-"
#define ENTRY_SUFFIX ".kpt"
#define STALE_TEMP_SECONDS 3600 /* a temp file this old belongs to a writer that died */

struct kpt_disk_cache {
    char *dir;
    uint64_t max_bytes;
    const kpt_logger *log;
    atomic_bool put_failed_logged;
    pthread_mutex_t evict_lock; /* one eviction scan at a time in this process */
};

bool kpt_disk_cache_default_dir(char *out, size_t n)
{
    const char *env = getenv("KPT_CACHE_DIR");
    if (env && *env)
        return (size_t)snprintf(out, n, "%s", env) < n;
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg == '/')
        return (size_t)snprintf(out, n, "%s/kpt", xdg) < n;
    const char *home = getenv("HOME");
    if (home && *home == '/')
        return (size_t)snprintf(out, n, "%s/.cache/kpt", home) < n;
    return false;
}

void kpt_disk_cache_entry_name(const kpt_key *key, char out[40])
{
    char hex[33];
    kpt_key_hex(key, hex);
    snprintf(out, 40, "%s%s", hex, ENTRY_SUFFIX);
}

/* mkdir -p, with mode 0700 for what it creates. */
static int make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
        return ENAMETOOLONG;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(path, 0700) && errno != EEXIST)
            return errno;
        *p = '/';
    }
    if (mkdir(path, 0700) && errno != EEXIST)
        return errno;
    return 0;
}

/* A new temp file in the cache directory, or -1 with errno set. */
static int temp_file(const kpt_disk_cache *c, char *path, size_t n)
{
    if ((size_t)snprintf(path, n, "%s/" TEMP_PREFIX "XXXXXX", c->dir) >= n) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkstemp(path);
}

kpt_disk_cache *kpt_disk_cache_open(const char *dir, uint64_t max_bytes, const kpt_logger *log)
{
    int err = make_dirs(dir);
    kpt_disk_cache *c = calloc(1, sizeof(*c));
    if (c)
        c->dir = strdup(dir);
    if (!c || !c->dir) {
        free(c);
        kpt_log(log, KPT_LOG_WARN, "no disk cache: out of memory");
        return NULL;
    }
    c->max_bytes = max_bytes;
    c->log = log;
    char probe[4096];
    int fd = err ? -1 : temp_file(c, probe, sizeof(probe));
    if (fd < 0) {
        kpt_log(log, KPT_LOG_WARN,
                "disk cache disabled: cannot %s '%s': %s; compiled kernels stay in memory",
                err ? "create" : "write to", dir, strerror(err ? err : errno));
        free(c->dir);
        free(c);
        return NULL;
    }
    close(fd);
    unlink(probe);
    pthread_mutex_init(&c->evict_lock, NULL);
    return c;
}

void kpt_disk_cache_close(kpt_disk_cache **cp)
{
    kpt_disk_cache *c = *cp;
    if (!c)
        return;
    pthread_mutex_destroy(&c->evict_lock);
    free(c->dir);
    free(c);
    *cp = NULL;
}

static void entry_path(const kpt_disk_cache *c, const kpt_key *key, char *path, size_t n)
{
    char name[40];
    kpt_disk_cache_entry_name(key, name);
    snprintf(path, n, "%s/%s", c->dir, name);
}

static void encode_header(uint8_t *h, const kpt_key *key, const void *data, size_t size)
{
    memset(h, 0, KPT_DISK_CACHE_HEADER);
    memcpy(h, MAGIC, 8);
    kpt_put_u32le(h + 8, KPT_DISK_CACHE_VERSION);
    kpt_put_u32le(h + 12, KPT_DISK_CACHE_HEADER);
    memcpy(h + 16, key->b, 16);
    kpt_put_u64le(h + 32, size);
    kpt_put_u64le(h + 40, kpt_checksum(data, size));
    kpt_put_u64le(h + 48, kpt_checksum(h, 48));
}

/* Why the header `h` of an entry file of `file_size` bytes cannot be used for `key`, or NULL.
 * Checked before a byte of the payload is read or memory is reserved for it. */
static const char *check_header(const uint8_t *h, uint64_t file_size, const kpt_key *key)
{
    if (memcmp(h, MAGIC, 8))
        return "bad magic";
    if (kpt_get_u64le(h + 48) != kpt_checksum(h, 48))
        return "header checksum mismatch";
    if (kpt_get_u32le(h + 8) != KPT_DISK_CACHE_VERSION)
        return "stale format version";
    if (kpt_get_u32le(h + 12) != KPT_DISK_CACHE_HEADER)
        return "bad header size";
    if (memcmp(h + 16, key->b, 16))
        return "key mismatch";
    if (kpt_get_u64le(h + 32) != file_size - KPT_DISK_CACHE_HEADER)
        return "payload size mismatch (truncated or extended)";
    return NULL;
}

static bool read_all(int fd, uint8_t *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        done += (size_t)r;
    }
    return true;
}

static bool write_all(int fd, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Opens the entry file at `path` for reading: a regular file, not a symlink (O_NOFOLLOW), and
 * never waiting on a FIFO planted there (O_NONBLOCK). Returns the descriptor and its size, or
 * -1 with *why saying what is wrong (NULL: there is no entry). */
static int open_entry(const char *path, uint64_t *file_size, const char **why)
{
    *why = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            *why = "a symbolic link, not an entry";
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode))
        *why = "not a regular file";
    else if (st.st_size < KPT_DISK_CACHE_HEADER)
        *why = "truncated header";
    else if ((uint64_t)st.st_size - KPT_DISK_CACHE_HEADER > KPT_DISK_CACHE_MAX_ENTRY)
        *why = "larger than any entry (1 GiB)";
    if (*why) {
        close(fd);
        return -1;
    }
    *file_size = (uint64_t)st.st_size;
    return fd;
}

bool kpt_disk_cache_get(kpt_disk_cache *c, const kpt_key *key, void **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    if (!c)
        return false;
    char path[4096];
    entry_path(c, key, path, sizeof(path));
    uint64_t file_size = 0;
    const char *why = NULL;
    uint8_t header[KPT_DISK_CACHE_HEADER], *buf = NULL;
    int fd = open_entry(path, &file_size, &why);
    size_t n = fd >= 0 ? (size_t)(file_size - KPT_DISK_CACHE_HEADER) : 0;
    if (fd >= 0)
        why = read_all(fd, header, sizeof(header)) ? check_header(header, file_size, key)
                                                   : "unreadable header";
    if (fd >= 0 && !why && (!(buf = malloc(n ? n : 1)) || !read_all(fd, buf, n)))
        why = buf ? "unreadable payload" : "out of memory";
    if (fd >= 0 && !why && kpt_get_u64le(header + 40) != kpt_checksum(buf, n))
        why = "payload checksum mismatch";
    if (why) {
        kpt_log(c->log, KPT_LOG_WARN, "disk cache: ignoring %s: %s; recompiling", path, why);
        free(buf);
        if (fd >= 0)
            close(fd);
        return false;
    }
    if (fd < 0)
        return false;
    futimens(fd, NULL); /* recently used: last to be evicted (this file, not a link's target) */
    close(fd);
    *data = buf;
    *size = n;
    return true;
}

typedef struct entry_stat {
    char name[64];
    uint64_t bytes;
    struct timespec mtime;
} entry_stat;

static int by_mtime(const void *a, const void *b)
{
    const entry_stat *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Whether `name` is one the cache itself writes: an entry (32 hex digits and ".kpt") or a temp
 * file (".tmp-" and mkstemp's six characters). Nothing else in the directory is ever removed: a
 * user's bundle "app.kpt" beside the entries stays. */
static bool own_name(const char *name, bool *temp)
{
    size_t n = strlen(name), t = strlen(TEMP_PREFIX);
    *temp = n == t + 6 && !strncmp(name, TEMP_PREFIX, t);
    if (*temp)
        return strspn(name + t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 6;
    return n == 32 + strlen(ENTRY_SUFFIX) && strspn(name, "0123456789abcdef") == 32 &&
           !strcmp(name + 32, ENTRY_SUFFIX);
}

/* Removes the least recently used entries until the directory fits the cap (and temp files
 * that writers left behind when they died). Other processes may evict concurrently: a file that
 * vanished meanwhile is simply skipped. */
static void evict(kpt_disk_cache *c, const char *keep)
{
    pthread_mutex_lock(&c->evict_lock);
    DIR *d = opendir(c->dir);
    entry_stat *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        bool temp;
        if (!own_name(e->d_name, &temp))
            continue;
        if (strlen(e->d_name) >= sizeof(v->name))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
            continue;
        if (temp) {
            if (now - st.st_mtime > STALE_TEMP_SECONDS)
                unlinkat(dirfd(d), e->d_name, 0);
            continue;
        }
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 64;
            entry_stat *nv = realloc(v, ncap * sizeof(*v));
            if (!nv)
                break;
            v = nv;
            cap = ncap;
        }
        memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1); /* length checked above */
        v[n].bytes = (uint64_t)st.st_size;
        v[n].mtime = st.st_mtim;
        total += v[n].bytes;
        n++;
    }
    if (d && total > c->max_bytes) {
        qsort(v, n, sizeof(*v), by_mtime);
        for (size_t i = 0; i < n && total > c->max_bytes; i++) {
            if (!strcmp(v[i].name, keep))
                continue;
            if (!unlinkat(dirfd(d), v[i].name, 0)) {
                kpt_log(c->log, KPT_LOG_DEBUG, "disk cache: evicted %s (%llu bytes)", v[i].name,
                        (unsigned long long)v[i].bytes);
                total -= v[i].bytes;
            }
        }
    }
    if (d)
        closedir(d);
    free(v);
    pthread_mutex_unlock(&c->evict_lock);
}

void kpt_disk_cache_put(kpt_disk_cache *c, const kpt_key *key, const void *data, size_t size)
{
    if (!c)
        return;
    char tmp[4096], path[4096], name[40];
    uint8_t header[KPT_DISK_CACHE_HEADER];
    encode_header(header, key, data, size);
    entry_path(c, key, path, sizeof(path));
    kpt_disk_cache_entry_name(key, name);
    int fd = temp_file(c, tmp, sizeof(tmp));
    bool ok = fd >= 0 && write_all(fd, header, sizeof(header)) && write_all(fd, data, size) &&
              !fsync(fd);
    int err = errno;
    if (fd >= 0 && close(fd))
        ok = false;
    if (ok && rename(tmp, path)) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        if (fd >= 0)
            unlink(tmp);
        if (!atomic_exchange(&c->put_failed_logged, true))
            kpt_log(c->log, KPT_LOG_WARN, "disk cache: cannot write %s: %s (said once)", path,
                    strerror(err));
        return;
    }
    evict(c, name);
}
