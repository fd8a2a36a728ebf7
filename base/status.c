#include <kpt/kpt.h>

#include "kpt_version.h"

const char *kpt_status_string(kpt_status status)
{
    switch (status) {
    case KPT_OK: return "ok";
    case KPT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case KPT_ERR_PARSE: return "parse error";
    case KPT_ERR_TYPE: return "type error";
    case KPT_ERR_UNSUPPORTED: return "unsupported";
    case KPT_ERR_NO_MEMORY: return "out of memory";
    case KPT_ERR_IO: return "i/o error";
    case KPT_ERR_NOT_FOUND: return "not found";
    case KPT_ERR_LIMIT: return "limit exceeded";
    case KPT_ERR_INTERNAL: return "internal error";
    case KPT_ERR_NO_DEVICE: return "no device";
    case KPT_ERR_COMPILE: return "kernel compilation failed";
    case KPT_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

const char *kpt_version(void)
{
    return KPT_VERSION_STRING;
}
