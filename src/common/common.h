/* common.h - what every kolo source file uses: errors, logging, allocation, clocks, settings. */
#ifndef KOLO_COMMON_H
#define KOLO_COMMON_H

#include "kolo.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define KOLO_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KOLO_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KOLO_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define KOLO_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define KOLO_LIKELY(x) __builtin_expect(!!(x), 1)
#define KOLO_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define KOLO_PRINTF(f, a)
#define KOLO_LIKELY(x) (x)
#define KOLO_UNLIKELY(x) (x)
#endif

/* ---- Errors ----------------------------------------------------------------
 * kolo__err() records a message for kolo_last_error() on this thread and
 * returns `status`, so a failing path reads `return kolo__err(KOLO_ERR_..., "...")`.
 * It does not log: the place that first finds an error logs it once with
 * KOLO_LOG_WARN/ERROR if a user would want to see it without asking. */
int kolo__err(int status, const char *fmt, ...) KOLO_PRINTF(2, 3);
/* Same, with ": <strerror(err)>" appended. Returns KOLO_ERR_SYSTEM. */
int kolo__err_sys(int err, const char *fmt, ...) KOLO_PRINTF(2, 3);
#ifdef __clang_analyzer__
/* For clang's static analyzer (make analyze), which cannot see into error.c: without these it
 * took a failed call's `return kolo__err(...)` for a success and reported the uninitialized
 * outputs of 21 paths that cannot happen. Only its pass sees them; error.c's definitions name
 * the functions in parentheses, which no function-like macro expands. */
#define kolo__err(status, ...) (kolo__err((status), __VA_ARGS__), (status))
#define kolo__err_sys(err, ...) (kolo__err_sys((err), __VA_ARGS__), KOLO_ERR_SYSTEM)
#endif
/* Copy of the current thread's message (for handing to another thread). */
const char *kolo__errmsg(void);
void kolo__err_clear(void);
/* Lists of ranks in messages: ranks added in increasing order come out as "0, 3-7, 9" (runs of
 * consecutive ranks as ranges), and what does not fit in the buffer as " and N more", so a
 * message about a job of thousands of ranks stays whole and says how many it names. */
typedef struct kolo__ranks_text {
    char *buf;
    size_t cap, w;
    int lo, hi, more; /* the run being added (lo -1: none) */
} kolo__ranks_text;
void kolo__ranks_begin(kolo__ranks_text *t, char *buf, size_t cap);
void kolo__ranks_add(kolo__ranks_text *t, int rank);
const char *kolo__ranks_end(kolo__ranks_text *t); /* the text (buf) */

/* ---- Logging -----------------------------------------------------------------
 * One line per call on stderr: "[kolo <rank> <level>] message". Level from
 * KOLO_LOG_LEVEL (trace, debug, info, warning, error, fatal, none; default warning). */
enum { KOLO_LOG_TRACE = 0, KOLO_LOG_DEBUG, KOLO_LOG_INFO, KOLO_LOG_WARNING, KOLO_LOG_ERROR, KOLO_LOG_NONE };
extern int kolo__log_level;
void kolo__log_init(void);
/* The local wall-clock time, ISO 8601 with milliseconds ("2026-11-27T17:14:11.435"), into out
 * (at least 32 bytes); returns its length. kolo's log lines (KOLO_LOG_TIME) and kolorun's
 * --prefix-timestamp both use it. */
size_t kolo__wall_time(char *out, size_t cap);
void kolo__log_set_rank(int rank);
void kolo__log(int level, const char *fmt, ...) KOLO_PRINTF(2, 3);
#define KOLO_LOG(lvl, ...)                                                                          \
    do {                                                                                            \
        if ((lvl) >= kolo__log_level) kolo__log((lvl), __VA_ARGS__);                                \
    } while (0)
#define KOLO_TRACE(...) KOLO_LOG(KOLO_LOG_TRACE, __VA_ARGS__)
#define KOLO_DEBUG(...) KOLO_LOG(KOLO_LOG_DEBUG, __VA_ARGS__)
#define KOLO_INFO(...) KOLO_LOG(KOLO_LOG_INFO, __VA_ARGS__)
#define KOLO_WARN(...) KOLO_LOG(KOLO_LOG_WARNING, __VA_ARGS__)
#define KOLO_ERROR(...) KOLO_LOG(KOLO_LOG_ERROR, __VA_ARGS__)

/* ---- Allocation ----------------------------------------------------------------
 * Every allocation in the library goes through these so that tests can make
 * the Nth one fail (kolo_test_fail_alloc). They return NULL on failure and
 * never abort; the caller turns NULL into KOLO_ERR_NO_MEMORY. */
void *kolo__malloc(size_t n);
void *kolo__calloc(size_t count, size_t size);
void *kolo__realloc(void *p, size_t n);
/* 64-byte aligned, freed with kolo__free */
void *kolo__malloc_aligned(size_t n);
char *kolo__strdup(const char *s);
void kolo__free(void *p);
/* true when the Nth-send failure hook fires for this send */
bool kolo__inject_send_failure(void);

/* ---- JSON (json.c) ----------------------------------------------------------------
 * kolo__json_str writes bytes s[0..n) through put as one JSON string: it escapes what JSON
 * requires and writes U+FFFD for bytes that are not well-formed UTF-8 (the rules Python's
 * decoder applies; kolo__utf8_len gives a sequence's length at p, or 0). A kolo__sbuf grows as
 * text is appended (zeroed to start); when memory runs out it stops growing and sets oom. */
typedef void (*kolo__put_fn)(void *ctx, const char *s, size_t n);
size_t kolo__utf8_len(const unsigned char *p, size_t n);
void kolo__json_str(kolo__put_fn put, void *ctx, const char *s, size_t n);
typedef struct kolo__sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} kolo__sbuf;
void kolo__sb_put(void *ctx, const char *s, size_t n); /* a kolo__put_fn; ctx is the kolo__sbuf */
void kolo__sb_printf(kolo__sbuf *b, const char *fmt, ...) KOLO_PRINTF(2, 3);
void kolo__sb_jstr(kolo__sbuf *b, const char *s);
void kolo__sb_free(kolo__sbuf *b);

/* ---- File descriptors ------------------------------------------------------------
 * Makes room for `need` more open files than this process holds now: raises the soft
 * RLIMIT_NOFILE (by need) where it is short and the hard limit allows, else fails with
 * KOLO_ERR_STARTUP naming `who` ("rank 3 of a job of 1200 ranks (...)") and how to raise the
 * limit. Call it before opening them (fds.c). */
int kolo__fd_room(size_t need, const char *who);
/* TCP keepalive on a connected socket: probes after a third of `seconds` idle, then four over the
 * rest, the connection failing (ETIMEDOUT) when none is answered; with user_timeout also bytes
 * sent but unacknowledged that long (TCP_USER_TIMEOUT: only where the peer always reads, since a
 * zero window it keeps counts too). seconds < 1: nothing. False where a setsockopt failed. */
bool kolo__keepalive(int fd, int seconds, bool user_timeout);
/* KOLO_TCP_KEEPALIVE in whole seconds, as every reader takes it: 0 (off) below 1, at most a day. */
int kolo__keepalive_s(void);

/* ---- Clocks ---------------------------------------------------------------------- */
static inline uint64_t kolo__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double kolo__now_s(void) { return (double)kolo__now_ns() * 1e-9; }

/* FNV-1a over n bytes: the store's buckets, job ids and ports from names, a rank's set of cores. */
static inline uint64_t kolo__fnv1a(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}
/* Sleeps ns nanoseconds (none for 0), through signals: to a deadline, since nanosleep's
 * remaining time includes the timer slack (50 us), so a loop that restarts it with what it
 * returns never ends under signals more frequent than that (a profiler's SIGPROF timer). */
static inline void kolo__sleep_ns(uint64_t ns)
{
    if (!ns) return;
    uint64_t end = kolo__now_ns() + ns;
    struct timespec until = {(time_t)(end / 1000000000u), (long)(end % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {}
}
/* Wall clock in microseconds since the epoch (for timestamps that cross processes). */
uint64_t kolo__wall_us(void);

/* ---- Timing windows ----------------------------------------------------------------
 * A way's figure in the adaptive choices (net/shm.c per message, coll/direct.c per allreduce):
 * the median of its last KOLO_WINDOW samples, the lower one of an even count, so that one
 * stalled sample (10-200x its neighbours' time on this project's VM) moves it not at all. */
#define KOLO_WINDOW 5
typedef struct kolo__window {
    uint64_t v[KOLO_WINDOW];
    int n, next;
} kolo__window;

static inline void kolo__window_clear(kolo__window *w) { w->n = w->next = 0; }

/* Adds sample x; returns the window's median. */
static inline uint64_t kolo__window_add(kolo__window *w, uint64_t x)
{
    w->v[w->next] = x;
    w->next = (w->next + 1) % KOLO_WINDOW;
    if (w->n < KOLO_WINDOW) w->n++;
    uint64_t s[KOLO_WINDOW] = {0};
    for (int i = 0; i < w->n; i++) { /* insertion sort of at most KOLO_WINDOW values */
        int j = i;
        for (; j > 0 && s[j - 1] > w->v[i]; j--) s[j] = s[j - 1];
        s[j] = w->v[i];
    }
    return s[(w->n - 1) / 2];
}

/* The window holds two samples or more and its largest is at least `times` its smallest. */
static inline bool kolo__window_spread(const kolo__window *w, uint64_t times)
{
    if (w->n < 2) return false;
    uint64_t lo = w->v[0], hi = w->v[0];
    for (int i = 1; i < w->n; i++) {
        lo = w->v[i] < lo ? w->v[i] : lo;
        hi = w->v[i] > hi ? w->v[i] : hi;
    }
    return hi >= times * lo;
}

/* ---- Settings --------------------------------------------------------------------
 * Every knob is one row of the table in settings.c: a KOLO_* name, Horovod
 * aliases, a default and a help line. Values are read from the environment at
 * each call (cheap: callers read them at init, not on hot paths). */
typedef enum kolo_setting {
    KOLO_SET_LOG_LEVEL,
    KOLO_SET_LOG_TIME,
    KOLO_SET_START_TIMEOUT,
    KOLO_SET_OP_TIMEOUT,
    KOLO_SET_TRANSPORT,
    KOLO_SET_IFACE,
    KOLO_SET_TCP_CONGESTION,
    KOLO_SET_TCP_KEEPALIVE,
    KOLO_SET_RENDEZVOUS,
    KOLO_SET_RENDEZVOUS_SERVER,
    KOLO_SET_SECRET,
    KOLO_SET_JOB_ID,
    KOLO_SET_HOSTNAME,
    KOLO_SET_SHM_CMA,
    KOLO_SET_SHM_RING_SIZE,
    KOLO_SET_SMALL_ALLREDUCE_MAX,
    KOLO_SET_RING_CHUNK,
    KOLO_SET_HIERARCHICAL_ALLREDUCE,
    KOLO_SET_HIERARCHICAL_ALLGATHER,
    KOLO_SET_STREAM_MIN,
    KOLO_SET_SPIN_US,
    KOLO_SET_BIND,
    KOLO_SET_FUSION_THRESHOLD,
    KOLO_SET_CYCLE_TIME,
    KOLO_SET_CACHE_CAPACITY,
    KOLO_SET_TIMELINE,
    KOLO_SET_TIMELINE_MARK_CYCLES,
    KOLO_SET_STALL_CHECK_DISABLE,
    KOLO_SET_STALL_CHECK_TIME,
    KOLO_SET_STALL_SHUTDOWN_TIME,
    KOLO_SET_STATUS_SIGNAL,
    KOLO_SET_ELASTIC_TIMEOUT,
    KOLO_SET_AUTOTUNE,
    KOLO_SET_AUTOTUNE_LOG,
    KOLO_SET_AUTOTUNE_WARMUP_SAMPLES,
    KOLO_SET_AUTOTUNE_STEPS_PER_SAMPLE,
    KOLO_SET_AUTOTUNE_BAYES_OPT_MAX_SAMPLES,
    KOLO_SET_AUTOTUNE_GAUSSIAN_PROCESS_NOISE,
    KOLO_SET_COUNT
} kolo_setting_t;

typedef struct kolo__setting_info {
    const char *name;     /* KOLO_... */
    const char *aliases;  /* space-separated other names (HOROVOD_...), or "" */
    const char *def;      /* default as text; "" means unset */
    const char *help;
} kolo__setting_info;

const kolo__setting_info *kolo__setting_table(size_t *n);
/* The value from the environment (the KOLO_ name first, then aliases), or the default.
 * Never NULL (an unset setting with no default is ""). */
const char *kolo__setting_str(kolo_setting_t s);
/* True when the environment gives it (under its name or an alias), false when it is at its default. */
bool kolo__setting_is_set(kolo_setting_t s);
/* Integer and float settings; a value that does not parse logs a warning once and gives the default. */
long kolo__setting_long(kolo_setting_t s);
double kolo__setting_double(kolo_setting_t s);
/* Byte sizes with K/M/G suffixes ("64M", "1048576"). */
size_t kolo__setting_bytes(kolo_setting_t s);
/* Settings of auto, 0 or 1 (KOLO_SHM_CMA, KOLO_HIERARCHICAL_*): *out = KOLO_SETTING_OFF, _ON or
 * _AUTO (also for a value set but empty); KOLO_ERR_INVALID_ARG naming the setting for another. */
enum { KOLO_SETTING_OFF = 0, KOLO_SETTING_ON = 1, KOLO_SETTING_AUTO = 2 };
int kolo__setting_auto01(kolo_setting_t s, int *out);
/* Parses "123", "4K", "64M", "1G" (powers of 1024). Returns false if malformed. */
bool kolo__parse_bytes(const char *s, size_t *out);

#endif /* KOLO_COMMON_H */
