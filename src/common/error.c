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

static void vset(const char *fmt, va_list ap) KOLO_PRINTF(1, 0);
static void vset(const char *fmt, va_list ap)
{
    char tmp[sizeof(errbuf)];
    /* fmt may print the old message (e.g. "while X: %s", kolo__errmsg()) */
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    memcpy(errbuf, tmp, sizeof(errbuf));
}

int(kolo__err)(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    return status;
}

int(kolo__err_sys)(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fmt, ap);
    va_end(ap);
    size_t n = strlen(errbuf);
    snprintf(errbuf + n, sizeof(errbuf) - n, ": %s", strerror(err));
    return KOLO_ERR_SYSTEM;
}

void kolo__ranks_begin(kolo__ranks_text *t, char *buf, size_t cap)
{
    *t = (kolo__ranks_text){.buf = buf, .cap = cap, .lo = -1};
    if (cap) buf[0] = '\0';
}

/* writes the run lo-hi, or counts it where it does not fit with room for " and N more" */
static void ranks_flush(kolo__ranks_text *t)
{
    if (t->lo < 0) return;
    int n = t->hi - t->lo + 1;
    char run[32];
    if (n == 1) snprintf(run, sizeof(run), "%s%d", t->w ? ", " : "", t->lo);
    else snprintf(run, sizeof(run), "%s%d-%d", t->w ? ", " : "", t->lo, t->hi);
    size_t len = strlen(run);
    if (t->more || t->w + len + 24 > t->cap) t->more += n;
    else {
        memcpy(t->buf + t->w, run, len + 1);
        t->w += len;
    }
    t->lo = -1;
}

void kolo__ranks_add(kolo__ranks_text *t, int rank)
{
    if (t->lo >= 0 && rank >= t->lo && rank <= t->hi + 1) { /* the run goes on (or repeats a rank) */
        t->hi = KOLO_MAX(t->hi, rank);
        return;
    }
    ranks_flush(t);
    t->lo = t->hi = rank;
}

const char *kolo__ranks_end(kolo__ranks_text *t)
{
    ranks_flush(t);
    if (t->more && t->w + 24 <= t->cap) snprintf(t->buf + t->w, t->cap - t->w, " and %d more", t->more);
    return t->buf;
}
