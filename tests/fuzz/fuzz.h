/* fuzz.h - what kolo's libFuzzer harnesses share: taking a fuzzer's bytes apart.
 *
 * A harness draws its choices (how many ranks, which message) and its messages from the one input
 * libFuzzer hands it. Past the input's end every draw is zero, so that every input, however
 * short, runs whole. */
#ifndef KOLO_FUZZ_H
#define KOLO_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline void fz_bytes(fz *f, void *out, size_t n)
{
    size_t k = n < f->n ? n : f->n;
    memcpy(out, f->p, k);
    memset((uint8_t *)out + k, 0, n - k);
    f->p += k;
    f->n -= k;
}

static inline uint8_t fz_u8(fz *f)
{
    uint8_t v;
    fz_bytes(f, &v, 1);
    return v;
}

static inline uint16_t fz_u16(fz *f)
{
    uint16_t v;
    fz_bytes(f, &v, 2);
    return v;
}

/* Up to `max` bytes: the length drawn first (two bytes), then as many as remain. */
static inline const uint8_t *fz_span(fz *f, size_t max, size_t *len)
{
    size_t want = fz_u16(f) % (max + 1);
    if (want > f->n) want = f->n;
    const uint8_t *p = f->p;
    f->p += want;
    f->n -= want;
    *len = want;
    return p;
}

#endif
