/* alloc.c - the library's allocator, with the fault-injection hooks that tests use. */
#include "common.h"

#include <stdatomic.h>
#include <stdlib.h>

static atomic_long alloc_countdown; /* fail when it reaches 0 on decrement; <= 0 disabled */
static atomic_long send_countdown;

void kolo_test_fail_alloc(long nth) { atomic_store(&alloc_countdown, nth); }
void kolo_test_fail_send(long nth) { atomic_store(&send_countdown, nth); }

static bool fire(atomic_long *c)
{
    long v = atomic_load_explicit(c, memory_order_relaxed);
    if (KOLO_LIKELY(v <= 0)) return false;
    return atomic_fetch_sub(c, 1) == 1;
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
