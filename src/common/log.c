/* log.c - leveled, line-at-a-time diagnostics on stderr (KOLO_LOG_LEVEL). */
#include "common.h"

#include <stdio.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int kolo__log_level = KOLO_LOG_WARNING;
static int log_rank = -1;
static bool log_time;

static const char *const level_names[] = {"trace", "debug", "info", "warning", "error", "none"};

void kolo__log_init(void)
{
    log_time = kolo__setting_long(KOLO_SET_LOG_TIME) > 0;
    const char *v = kolo__setting_str(KOLO_SET_LOG_LEVEL);
    if (!*v) return;
    for (int i = 0; i < (int)KOLO_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(v, level_names[i]) == 0) {
            kolo__log_level = i;
            return;
        }
    }
    /* Horovod also accepts "fatal" and "warn" */
    if (strcasecmp(v, "fatal") == 0) kolo__log_level = KOLO_LOG_ERROR;
    else if (strcasecmp(v, "warn") == 0) kolo__log_level = KOLO_LOG_WARNING;
    else fprintf(stderr, "[kolo] unknown KOLO_LOG_LEVEL '%s' (trace, debug, info, warning, error, none); using warning\n", v);
}

void kolo__log_set_rank(int rank) { log_rank = rank; }

size_t kolo__wall_time(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    size_t w = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    int m = snprintf(out + w, cap - w, ".%03ld", ts.tv_nsec / 1000000);
    return m > 0 && (size_t)m < cap - w ? w + (size_t)m : w;
}

void kolo__log(int level, const char *fmt, ...)
{
    char line[2048], when[40] = "";
    int n;
    if (log_time) {
        size_t w = kolo__wall_time(when, sizeof(when) - 1);
        when[w] = ' ';
        when[w + 1] = '\0';
    }
    if (log_rank >= 0)
        n = snprintf(line, sizeof(line), "%s[kolo %d %s] ", when, log_rank, level_names[level]);
    else
        n = snprintf(line, sizeof(line), "%s[kolo %s] ", when, level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : KOLO_MIN((size_t)m, sizeof(line) - (size_t)n - 2));
    line[len++] = '\n';
    /* one write() so that lines of concurrent threads and processes do not interleave */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
