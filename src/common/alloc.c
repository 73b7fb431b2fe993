/* alloc.c - the library's allocator, with the fault-injection hooks that tests use. */
#include "common.h"

#include <stdlib.h>

/* Per thread: a test arms the hook for its own calls, and the engine thread's allocations and
 * sends (which run at any time) can neither consume the failure nor be hit by it.
 * Fires when the countdown reaches 0 on decrement; <= 0 is disabled. */
static _Thread_local long alloc_countdown;
static _Thread_local long send_countdown;

void kolo_test_fail_alloc(long nth) { alloc_countdown = nth; }
void kolo_test_fail_send(long nth) { send_countdown = nth; }

static bool fire(long *c)
{
    if (KOLO_LIKELY(*c <= 0)) return false;
    return --*c == 0;
}

bool kolo__inject_send_failure(void) { return fire(&send_countdown); }

void *kolo__malloc(size_t n)
{
    if (fire(&alloc_countdown)) return NULL;
    return malloc(n ? n : 1);
}

void *kolo__calloc(size_t count, size_t size)
{
    if (fire(&alloc_countdown)) return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *kolo__realloc(void *p, size_t n)
{
    if (fire(&alloc_countdown)) return NULL;
    return realloc(p, n ? n : 1);
}

void *kolo__malloc_aligned(size_t n)
{
    if (fire(&alloc_countdown)) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}

char *kolo__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kolo__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void kolo__free(void *p) { free(p); }

uint64_t kolo__wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000u;
}
