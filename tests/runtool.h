/* Running a program (kptc) from a test and capturing its exit status, stdout and stderr.
 * Header-only; tests that run tools include it. */
#ifndef KPT_TESTS_RUNTOOL_H
#define KPT_TESTS_RUNTOOL_H

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct tool_result {
    int status;      /* the exit status, or 128 + the signal */
    char out[1 << 18]; /* generated kernel source is ~70 KB; more is cut off */
    char err[8192];
} tool_result;

/* Reads fd into buf until the end or until buf is full (then the rest is cut off). */
static inline void tool_drain(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = 0;
}

/* Runs argv[0] with argv (NULL-terminated). stdout and stderr go to files, not pipes, so a
 * chatty program cannot deadlock the test. Returns false if the program could not be run. */
static inline bool tool_run(tool_result *res, const char *const *argv)
{
    char out_path[] = "/tmp/kpt_test_outXXXXXX", err_path[] = "/tmp/kpt_test_errXXXXXX";
    int out = mkstemp(out_path), err = mkstemp(err_path);
    if (out < 0 || err < 0)
        return false;
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    lseek(out, 0, SEEK_SET);
    lseek(err, 0, SEEK_SET);
    tool_drain(out, res->out, sizeof(res->out));
    tool_drain(err, res->err, sizeof(res->err));
    close(out);
    close(err);
    unlink(out_path);
    unlink(err_path);
    return true;
}

#endif
