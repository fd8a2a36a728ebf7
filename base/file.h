/* Opening files named by users: regular files only, never blocking in open(). */
#ifndef KPT_BASE_FILE_H
#define KPT_BASE_FILE_H

#include <stdio.h>

#include <kpt/status.h>

/* Opens `path` for reading when it is a regular file; *size is its size. A FIFO, a device or
 * a directory is refused with KPT_ERR_IO naming `what` ("script", "bundle") instead of blocking
 * or reading without end. NULL with the reason in diag otherwise. */
FILE *kpt_open_regular(const char *path, const char *what, long long *size, kpt_diag *diag);

#endif
