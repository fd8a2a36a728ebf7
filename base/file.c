/* Opening files named by users (see file.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/diag.h"
#include "base/file.h"

FILE *kpt_open_regular(const char *path, const char *what, long long *size, kpt_diag *diag)
{
    /* O_NONBLOCK: open() of a FIFO with no writer would wait forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        kpt_diag_set(diag, KPT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        kpt_diag_set(diag, KPT_ERR_IO, "%s '%s' is not a regular file", what, path);
        close(fd);
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) ? NULL : fdopen(fd, "rb");
    if (!f) {
        kpt_diag_set(diag, KPT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    *size = (long long)sb.st_size;
    return f;
}
