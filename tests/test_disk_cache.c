/* The on-disk kernel cache (runtime/disk_cache.c): hits and misses, every corruption of the
 * header and payload, truncation, concurrent writers, a writer killed mid-write, an unwritable
 * directory and LRU eviction under the size cap. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/disk_cache.h"

typedef struct logbook {
    int warnings;
    char last[1024];
} logbook;

static void record(void *user, kpt_log_level level, const char *msg)
{
    logbook *lb = user;
    if (level <= KPT_LOG_WARN)
        lb->warnings++;
    snprintf(lb->last, sizeof(lb->last), "%s", msg);
}

typedef struct fixture {
    char dir[64];
    logbook book;
    kpt_logger log;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/kpt_disk_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    f->log = (kpt_logger){.fn = record, .user = &f->book, .level = KPT_LOG_DEBUG};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    if (system(cmd))
        return -1;
    free(f);
    return 0;
}

static kpt_key key_n(int n)
{
    kpt_key_part part = {&n, sizeof(n)};
    return kpt_key_of(&part, 1);
}

static void payload(uint8_t *p, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + (size_t)seed * 7);
}

static void entry_file(const fixture *f, const kpt_key *k, char *path, size_t n)
{
    char name[40];
    kpt_disk_cache_entry_name(k, name);
    snprintf(path, n, "%s/%s", f->dir, name);
}

static void test_keys_are_stable(void **state)
{
    (void)state;
    /* fixed inputs, fixed key: the file names must not change between runs or builds */
    kpt_key_part parts[] = {{"disk", 4}, {"src", 3}};
    kpt_key k = kpt_key_of(parts, 2);
    char hex[33];
    kpt_key_hex(&k, hex);
    kpt_key again = kpt_key_of(parts, 2);
    assert_true(kpt_key_equal(&k, &again));
    /* the length prefix separates parts: ("ab","c") differs from ("a","bc") */
    kpt_key_part x[] = {{"ab", 2}, {"c", 1}}, y[] = {{"a", 1}, {"bc", 2}};
    kpt_key kx = kpt_key_of(x, 2), ky = kpt_key_of(y, 2);
    assert_false(kpt_key_equal(&kx, &ky));
    /* the golden values: if these change, every cache entry and bundle key changes, which
     * needs a format version bump */
    assert_string_equal(hex, "2fef62cc92985746e68670a507038001");
    assert_true(kpt_checksum("kpt", 3) == 0x5f19b1ee40b2c1c5ull);
}

static void test_hit_and_miss(void **state)
{
    fixture *f = *state;
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 1 << 20, &f->log);
    assert_non_null(c);
    kpt_key k = key_n(1);
    void *data;
    size_t size;
    assert_false(kpt_disk_cache_get(c, &k, &data, &size));
    uint8_t buf[1000];
    payload(buf, sizeof(buf), 1);
    kpt_disk_cache_put(c, &k, buf, sizeof(buf));
    assert_true(kpt_disk_cache_get(c, &k, &data, &size));
    assert_int_equal(size, sizeof(buf));
    assert_memory_equal(data, buf, sizeof(buf));
    free(data);
    kpt_key other = key_n(2);
    assert_false(kpt_disk_cache_get(c, &other, &data, &size));
    /* the directory is private */
    struct stat st;
    assert_int_equal(stat(f->dir, &st), 0);
    char sub[128];
    snprintf(sub, sizeof(sub), "%s/a/b", f->dir);
    kpt_disk_cache *c2 = kpt_disk_cache_open(sub, 1 << 20, &f->log);
    assert_non_null(c2);
    assert_int_equal(stat(sub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    kpt_disk_cache_close(&c2);
    kpt_disk_cache_close(&c);
    assert_null(c);
    assert_int_equal(f->book.warnings, 0);
}

/* Rewrites one entry's file through `edit`, then checks the entry is refused with `why` and that
 * a new put makes it usable again. */
static void corrupt_and_check(fixture *f, kpt_disk_cache *c, int n,
                              void (*edit)(uint8_t *buf, size_t *size), const char *why)
{
    kpt_key k = key_n(n);
    uint8_t buf[512];
    payload(buf, sizeof(buf), n);
    kpt_disk_cache_put(c, &k, buf, sizeof(buf));
    char path[256];
    entry_file(f, &k, path, sizeof(path));
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    uint8_t file[1024];
    size_t size = fread(file, 1, sizeof(file), fp);
    fclose(fp);
    edit(file, &size);
    fp = fopen(path, "wb");
    assert_int_equal(fwrite(file, 1, size, fp), size);
    fclose(fp);
    int warnings = f->book.warnings;
    void *data = NULL;
    size_t got;
    assert_false(kpt_disk_cache_get(c, &k, &data, &got));
    assert_null(data);
    assert_int_equal(f->book.warnings, warnings + 1);
    if (!strstr(f->book.last, why))
        fail_msg("expected '%s' in '%s'", why, f->book.last);
    kpt_disk_cache_put(c, &k, buf, sizeof(buf)); /* the recompiled kernel replaces it */
    assert_true(kpt_disk_cache_get(c, &k, &data, &got));
    assert_memory_equal(data, buf, sizeof(buf));
    free(data);
}

static void reseal(uint8_t *b)
{
    kpt_put_u64le(b + 48, kpt_checksum(b, 48));
}

static void edit_magic(uint8_t *b, size_t *n) { b[0] ^= 1; reseal(b); (void)n; }
static void edit_version(uint8_t *b, size_t *n) { kpt_put_u32le(b + 8, 99); reseal(b); (void)n; }
static void edit_hsize(uint8_t *b, size_t *n) { kpt_put_u32le(b + 12, 32); reseal(b); (void)n; }
static void edit_key(uint8_t *b, size_t *n) { b[20] ^= 0x40; reseal(b); (void)n; }
static void edit_size(uint8_t *b, size_t *n) { kpt_put_u64le(b + 32, 511); reseal(b); (void)n; }
static void edit_sum(uint8_t *b, size_t *n) { b[41] ^= 2; reseal(b); (void)n; }
static void edit_hsum(uint8_t *b, size_t *n) { b[50] ^= 8; (void)n; }
static void edit_payload(uint8_t *b, size_t *n) { b[64 + 100] ^= 1; (void)n; }
static void edit_truncate_header(uint8_t *b, size_t *n) { (void)b; *n = 40; }
static void edit_truncate_payload(uint8_t *b, size_t *n) { (void)b; *n = 64 + 200; }
static void edit_extend(uint8_t *b, size_t *n) { b[*n] = 0; *n += 1; }
static void edit_empty(uint8_t *b, size_t *n) { (void)b; *n = 0; }

static void test_corruption(void **state)
{
    fixture *f = *state;
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 1 << 20, &f->log);
    assert_non_null(c);
    corrupt_and_check(f, c, 10, edit_magic, "bad magic");
    corrupt_and_check(f, c, 11, edit_version, "stale format version");
    corrupt_and_check(f, c, 12, edit_hsize, "bad header size");
    corrupt_and_check(f, c, 13, edit_key, "key mismatch");
    corrupt_and_check(f, c, 14, edit_size, "payload size mismatch");
    corrupt_and_check(f, c, 15, edit_sum, "payload checksum mismatch");
    corrupt_and_check(f, c, 16, edit_hsum, "header checksum mismatch");
    corrupt_and_check(f, c, 17, edit_payload, "payload checksum mismatch");
    corrupt_and_check(f, c, 18, edit_truncate_header, "truncated header");
    corrupt_and_check(f, c, 19, edit_truncate_payload, "payload size mismatch");
    corrupt_and_check(f, c, 20, edit_extend, "payload size mismatch");
    corrupt_and_check(f, c, 21, edit_empty, "truncated header");
    kpt_disk_cache_close(&c);
}

static void test_unwritable(void **state)
{
    fixture *f = *state;
    /* a path below a regular file cannot be created, even by root */
    char file[128], dir[160];
    snprintf(file, sizeof(file), "%s/plainfile", f->dir);
    FILE *fp = fopen(file, "w");
    fclose(fp);
    snprintf(dir, sizeof(dir), "%s/cache", file);
    kpt_disk_cache *c = kpt_disk_cache_open(dir, 1 << 20, &f->log);
    assert_null(c);
    assert_int_equal(f->book.warnings, 1);
    assert_non_null(strstr(f->book.last, "disk cache disabled"));
    /* a NULL cache is a cache that always misses */
    kpt_key k = key_n(1);
    void *data;
    size_t n;
    kpt_disk_cache_put(NULL, &k, "x", 1);
    assert_false(kpt_disk_cache_get(NULL, &k, &data, &n));
}

static void set_mtime(const fixture *f, const kpt_key *k, time_t t)
{
    char path[256];
    entry_file(f, k, path, sizeof(path));
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static bool present(const fixture *f, const kpt_key *k)
{
    char path[256];
    entry_file(f, k, path, sizeof(path));
    return access(path, F_OK) == 0;
}

static void test_eviction(void **state)
{
    fixture *f = *state;
    enum { SIZE = 1000, ENTRY = SIZE + KPT_DISK_CACHE_HEADER };
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 3 * ENTRY, &f->log);
    assert_non_null(c);
    uint8_t buf[SIZE];
    kpt_key k[5];
    time_t base = time(NULL) - 1000;
    for (int i = 0; i < 3; i++) {
        k[i] = key_n(100 + i);
        payload(buf, SIZE, i);
        kpt_disk_cache_put(c, &k[i], buf, SIZE);
        set_mtime(f, &k[i], base + i); /* 0 oldest, 2 newest */
    }
    /* a hit makes entry 0 the most recently used */
    void *data;
    size_t n;
    assert_true(kpt_disk_cache_get(c, &k[0], &data, &n));
    free(data);
    k[3] = key_n(103);
    kpt_disk_cache_put(c, &k[3], buf, SIZE); /* over the cap: the least recently used goes */
    assert_true(present(f, &k[0]));
    assert_false(present(f, &k[1]));
    assert_true(present(f, &k[2]));
    assert_true(present(f, &k[3]));
    /* an entry larger than the cap evicts everything else but is kept itself */
    k[4] = key_n(104);
    uint8_t big[4 * ENTRY];
    payload(big, sizeof(big), 9);
    kpt_disk_cache_put(c, &k[4], big, sizeof(big));
    assert_true(present(f, &k[4]));
    assert_false(present(f, &k[0]) || present(f, &k[2]) || present(f, &k[3]));
    kpt_disk_cache_close(&c);
}

/* What someone else put in the directory: a FIFO, a symlink or a huge sparse file at an entry's
 * name is a miss (never a hang, a read of gigabytes or an mtime refreshed through the link),
 * and eviction removes only names of the cache's own format. */
static void test_foreign_files(void **state)
{
    fixture *f = *state;
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 1 << 20, &f->log);
    assert_non_null(c);
    char path[256], target[256];
    void *data;
    size_t n;
    kpt_key fifo = key_n(300), link = key_n(301), huge = key_n(302), good = key_n(303);
    entry_file(f, &fifo, path, sizeof(path));
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_false(kpt_disk_cache_get(c, &fifo, &data, &n)); /* returns: no writer is awaited */
    assert_non_null(strstr(f->book.last, "not a regular file"));
    /* a valid entry elsewhere, linked at another key's name... */
    kpt_disk_cache_put(c, &good, "payload", 7);
    entry_file(f, &good, target, sizeof(target));
    struct timespec old[2] = {{1000000, 0}, {1000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, target, old, 0), 0);
    entry_file(f, &link, path, sizeof(path));
    assert_int_equal(symlink(target, path), 0);
    assert_false(kpt_disk_cache_get(c, &link, &data, &n));
    assert_non_null(strstr(f->book.last, "symbolic link"));
    struct stat st;
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_mtime, 1000000); /* not refreshed through the link */
    /* a 20 GB sparse file: refused from its size, nothing read */
    entry_file(f, &huge, path, sizeof(path));
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)20 << 30), 0);
    close(fd);
    assert_false(kpt_disk_cache_get(c, &huge, &data, &n));
    assert_non_null(strstr(f->book.last, "larger than any entry"));
    assert_int_equal(unlink(path), 0);
    kpt_disk_cache_close(&c);
    /* a user's files beside the entries survive eviction to a cap of 0 */
    static const char *const foreign[] = {"app.kpt", "notes.tmp-abcdef", ".tmp-abc",
                                          ".tmp-abcdefg", "0123456789ABCDEF0123456789abcdef.kpt"};
    for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", f->dir, foreign[i]);
        FILE *fp = fopen(path, "w");
        assert_non_null(fp);
        fputs("not the cache's", fp);
        fclose(fp);
        struct timespec ancient[2] = {{1, 0}, {1, 0}}; /* older than any stale temp file */
        assert_int_equal(utimensat(AT_FDCWD, path, ancient, 0), 0);
    }
    c = kpt_disk_cache_open(f->dir, 0, &f->log);
    kpt_key last = key_n(304);
    kpt_disk_cache_put(c, &last, "x", 1);
    for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", f->dir, foreign[i]);
        if (access(path, F_OK))
            fail_msg("eviction removed '%s', a file the cache did not write", foreign[i]);
    }
    assert_false(present(f, &good)); /* the cache's own entries do go */
    kpt_disk_cache_close(&c);
}

/* Every *.kpt file in the directory is a whole, valid entry. Returns how many there are. */
static int check_all_entries(const fixture *f, kpt_disk_cache *c)
{
    DIR *d = opendir(f->dir);
    assert_non_null(d);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len != 36 || strcmp(e->d_name + 32, ".kpt"))
            continue;
        kpt_key k;
        for (int i = 0; i < 16; i++) {
            unsigned v;
            sscanf(e->d_name + 2 * i, "%2x", &v);
            k.b[i] = (uint8_t)v;
        }
        void *data;
        size_t n;
        if (!kpt_disk_cache_get(c, &k, &data, &n))
            fail_msg("entry %s is visible but not valid", e->d_name);
        free(data);
        count++;
    }
    closedir(d);
    return count;
}

/* Two processes write the same keys at once, with different payloads: readers only ever see
 * one writer's whole entry. */
static void test_concurrent_writers(void **state)
{
    fixture *f = *state;
    pid_t pid[2];
    for (int w = 0; w < 2; w++) {
        if ((pid[w] = fork()) == 0) {
            kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 64 << 20, NULL);
            static uint8_t buf[200000];
            for (int i = 0; i < 40; i++) {
                payload(buf, sizeof(buf) - (size_t)w * 1000, w * 100 + i);
                kpt_key k = key_n(i % 4);
                kpt_disk_cache_put(c, &k, buf, sizeof(buf) - (size_t)w * 1000);
            }
            kpt_disk_cache_close(&c);
            _exit(0);
        }
    }
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 64 << 20, &f->log);
    for (int round = 0; round < 50; round++) /* read while they write */
        check_all_entries(f, c);
    for (int w = 0; w < 2; w++) {
        int st;
        waitpid(pid[w], &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    assert_int_equal(check_all_entries(f, c), 4);
    assert_int_equal(f->book.warnings, 0);
    kpt_disk_cache_close(&c);
}

/* A writer killed at random moments never leaves a partial entry visible. */
static void test_killed_writer(void **state)
{
    fixture *f = *state;
    for (int round = 0; round < 8; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 256 << 20, NULL);
            static uint8_t buf[4 << 20];
            for (int i = 0;; i++) {
                payload(buf, sizeof(buf), i);
                kpt_key k = key_n(1000 + i % 16);
                kpt_disk_cache_put(c, &k, buf, sizeof(buf));
            }
        }
        struct timespec ts = {0, (round + 1) * 7000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFSIGNALED(st));
    }
    kpt_disk_cache *c = kpt_disk_cache_open(f->dir, 256 << 20, &f->log);
    check_all_entries(f, c);
    assert_int_equal(f->book.warnings, 0);
    kpt_disk_cache_close(&c);
}

static void test_default_dir(void **state)
{
    (void)state;
    char dir[256];
    setenv("KPT_CACHE_DIR", "/x/kpt-cache", 1);
    assert_true(kpt_disk_cache_default_dir(dir, sizeof(dir)));
    assert_string_equal(dir, "/x/kpt-cache");
    unsetenv("KPT_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/y", 1);
    assert_true(kpt_disk_cache_default_dir(dir, sizeof(dir)));
    assert_string_equal(dir, "/y/kpt");
    setenv("XDG_CACHE_HOME", "relative", 1); /* the XDG spec says: ignore relative paths */
    setenv("HOME", "/home/u", 1);
    assert_true(kpt_disk_cache_default_dir(dir, sizeof(dir)));
    assert_string_equal(dir, "/home/u/.cache/kpt");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_are_stable),
        cmocka_unit_test_setup_teardown(test_hit_and_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eviction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_writers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_writer, setup, teardown),
        cmocka_unit_test(test_default_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
