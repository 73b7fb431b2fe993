/* json.c - JSON strings out of arbitrary bytes, and a growing text buffer to build documents
 * in (the timeline's writer and kolo_status_json write JSON; names of tensors are the user's
 * bytes and need not be text). */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

size_t kolo__utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

void kolo__json_str(kolo__put_fn put, void *ctx, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    put(ctx, "\"", 1);
    for (size_t i = 0; i < n;) {
        size_t j = i; /* a run of printable ASCII that needs no escape goes out in one copy */
        while (j < n && p[j] >= 0x20 && p[j] < 0x80 && p[j] != '"' && p[j] != '\\') j++;
        if (j > i) {
            put(ctx, s + i, j - i);
            i = j;
            continue;
        }
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(ctx, e, 2);
            i++;
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            if (c == '\n') put(ctx, "\\n", 2);
            else if (c == '\t') put(ctx, "\\t", 2);
            else if (c == '\r') put(ctx, "\\r", 2);
            else put(ctx, e, 6);
            i++;
        } else {
            size_t k = kolo__utf8_len(p + i, n - i);
            if (k) put(ctx, s + i, k);
            else put(ctx, "\\ufffd", 6);
            i += k ? k : 1;
        }
    }
    put(ctx, "\"", 1);
}

static bool sb_room(kolo__sbuf *b, size_t n)
{
    if (b->oom) return false;
    if (b->len + n + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = kolo__realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void kolo__sb_put(void *ctx, const char *s, size_t n)
{
    kolo__sbuf *b = ctx;
    if (!sb_room(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void kolo__sb_printf(kolo__sbuf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof(small)) {
        kolo__sb_put(b, small, (size_t)n);
        return;
    }
    if (!sb_room(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void kolo__sb_jstr(kolo__sbuf *b, const char *s) { kolo__json_str(kolo__sb_put, b, s, strlen(s)); }

void kolo__sb_free(kolo__sbuf *b)
{
    kolo__free(b->p);
    memset(b, 0, sizeof(*b));
}
