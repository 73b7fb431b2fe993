/* coll_util.c - scratch memory, chunk size and final scaling shared by the collective algorithms. */
#include "coll.h"

#include "../reduce/reduce.h"

#include <stdatomic.h>

void *kolo__coll_scratch(kolo__mesh *m, int area, size_t n)
{
    if (n == 0) n = 64; /* a valid pointer even for empty buffers */
    if (n <= m->scratch_cap[area]) return m->scratch[area];
    void *p = kolo__malloc_aligned(n);
    if (!p) {
        kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %zu bytes of collective scratch space", n);
        return NULL;
    }
    kolo__free(m->scratch[area]);
    m->scratch[area] = p;
    m->scratch_cap[area] = n;
    return p;
}

size_t kolo__coll_chunk(void)
{
    /* read once; threads racing on the first call store the same value */
    static _Atomic size_t chunk;
    size_t c = atomic_load_explicit(&chunk, memory_order_relaxed);
    if (!c) {
        c = kolo__setting_bytes(KOLO_SET_RING_CHUNK);
        if (c < 4096) c = 4096;
        c &= ~(size_t)63;
        atomic_store_explicit(&chunk, c, memory_order_relaxed);
    }
    return c;
}

void kolo__coll_finish_scale(void *buf, size_t count, kolo_dtype_t dtype, kolo_op_t op, double post, int n)
{
    bool integer = dtype != KOLO_FLOAT16 && dtype != KOLO_BFLOAT16 && dtype != KOLO_FLOAT32 && dtype != KOLO_FLOAT64;
    if (integer) {
        if (post != 1.0) kolo__scale(buf, buf, count, dtype, post);
        if (op == KOLO_AVERAGE && n > 1) kolo__divide(buf, count, dtype, n);
        return;
    }
    double f = post * (op == KOLO_AVERAGE ? 1.0 / n : 1.0);
    if (f != 1.0) kolo__scale(buf, buf, count, dtype, f);
}

/* Out of place, a 2-rank allgather of 256 MiB copies 128 MiB of its own and reads 128 MiB from
 * the other rank. With memmove the own copy took as long as the read (libc's copy reads every
 * destination line before writing it). Streamed, 4 and 3 launches interleaved with the build
 * before, both machine states: allgather 256 MiB 30-47 ms against 40-67, 64 MiB 8-13.5 against
 * 9.6-15.2; alltoall 256 MiB 29-35 against 42-49, 64 MiB 8.1-8.8 against 10.2-11.5 (Open MPI
 * in the same minutes: allgather 36-46 ms, alltoall 44-49 at 256 MiB). */
void kolo__coll_copy_own(void *dst, const void *src, size_t n, bool stream)
{
    if (!n || dst == src) return;
    const char *d = dst, *s = src;
    if (stream && (d + n <= s || s + n <= d)) {
        kolo__stream_copy(dst, src, n);
        kolo__stream_fence();
    } else {
        memmove(dst, src, n);
    }
}

#define OWN_SLICE ((size_t)256 << 10)

void kolo__coll_copy_own_moving(kolo__mesh *m, void *dst, const void *src, size_t n, bool stream)
{
    char *d = dst;
    const char *s = src;
    /* overlapping halves cannot be copied slice by slice in this order: one piece then */
    size_t slice = d + n <= s || s + n <= d ? OWN_SLICE : KOLO_MAX(n, (size_t)1);
    size_t at = 0;
    do {
        size_t k = KOLO_MIN(slice, n - at);
        kolo__poke(m);
        kolo__coll_copy_own(d + at, s + at, k, stream);
        at += k;
    } while (at < n);
}
