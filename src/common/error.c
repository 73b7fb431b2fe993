/* error.c - status names and the per-thread message behind kolo_last_error(). */
#include "common.h"

#include <stdio.h>

static _Thread_local char errbuf[1024];

const char *kolo_strerror(int status)
{
    switch (status) {
    case KOLO_OK: return "success";
    case KOLO_ERR_INVALID_ARG: return "invalid argument";
    case KOLO_ERR_NO_MEMORY: return "out of memory";
    case KOLO_ERR_NOT_INITIALIZED: return "kolo is not initialized";
    case KOLO_ERR_NOT_MEMBER: return "this rank is not a member of the process set";
    case KOLO_ERR_PEER_LOST: return "peer lost";
    case KOLO_ERR_TIMEOUT: return "timed out";
    case KOLO_ERR_MISMATCH: return "ranks disagree";
    case KOLO_ERR_SHUT_DOWN: return "kolo was shut down";
    case KOLO_ERR_PROTOCOL: return "protocol error";
    case KOLO_ERR_AUTH: return "authentication failed";
    case KOLO_ERR_STARTUP: return "job start-up failed";
    case KOLO_ERR_REMOVED: return "removed from the elastic job";
    case KOLO_ERR_SYSTEM: return "system error";
    case KOLO_ERR_INTERNAL: return "internal error";
    default: return "unknown status";
    }
}

const char *kolo_last_error(void) { return errbuf; }
const char *kolo__errmsg(void) { return errbuf; }
void kolo__err_clear(void) { errbuf[0] = '\0'; }

static void vset(const char *fmt, va_list ap)
{
    char tmp[sizeof(errbuf)];
    /* fmt may print the old message (e.g. "while X: %s", kolo__errmsg()) */
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    memcpy(errbuf, tmp, sizeof(errbuf));
}

int kolo__err(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    return status;
}

int kolo__err_sys(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    size_t n = strlen(errbuf);
    snprintf(errbuf + n, sizeof(errbuf) - n, ": %s", strerror(err));
    return KOLO_ERR_SYSTEM;
}
