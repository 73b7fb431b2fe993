/* auth.c - the job secret's primitives: random bytes, HMAC-SHA256 (libcrypto), constant-time compare. */
#include "auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

int kolo__random_bytes(void *out, size_t n)
{
    unsigned char *p = out;
    while (n > 0) {
        /* getrandom() may return fewer bytes than asked for requests over 256 bytes
         * or when a signal arrives; it only blocks before the pool is initialised. */
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return kolo__err_sys(errno, "getrandom(%zu bytes)", n);
        }
        p += r;
        n -= (size_t)r;
    }
    return KOLO_OK;
}

int kolo__hmac(uint8_t out[KOLO_MAC_LEN], const void *key, size_t keylen, const char *label,
               const void *msg, size_t msglen)
{
    static const unsigned char nokey = 0;
    size_t lablen = label ? strlen(label) : 0;
    if (keylen > INT32_MAX || msglen > SIZE_MAX - lablen)
        return kolo__err(KOLO_ERR_INVALID_ARG, "hmac: key or message too long");
    /* The one-shot HMAC() is the non-deprecated libcrypto call in 3.x; it takes one
     * message, so label || msg is assembled first (messages here are a few nonces). */
    unsigned char stackbuf[512];
    unsigned char *buf = stackbuf;
    size_t total = lablen + msglen;
    if (total > sizeof(stackbuf)) {
        buf = kolo__malloc(total);
        if (!buf) return kolo__err(KOLO_ERR_NO_MEMORY, "hmac: out of memory (%zu bytes)", total);
    }
    if (lablen) memcpy(buf, label, lablen);
    if (msglen) memcpy(buf + lablen, msg, msglen);
    unsigned int outlen = 0;
    /* A NULL key means "reuse the previous key" to parts of libcrypto: never pass one. */
    const void *k = (key && keylen) ? key : &nokey;
    unsigned char *r = HMAC(EVP_sha256(), k, (int)keylen, buf, total, out, &outlen);
    if (buf != stackbuf) {
        OPENSSL_cleanse(buf, total);
        kolo__free(buf);
    } else {
        OPENSSL_cleanse(stackbuf, total);
    }
    if (!r || outlen != KOLO_MAC_LEN) return kolo__err(KOLO_ERR_INTERNAL, "HMAC-SHA256 failed in libcrypto");
    return KOLO_OK;
}

bool kolo__mac_equal(const uint8_t a[KOLO_MAC_LEN], const uint8_t b[KOLO_MAC_LEN])
{
    return CRYPTO_memcmp(a, b, KOLO_MAC_LEN) == 0;
}

int kolo__secret_make(char *hex, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    uint8_t raw[32];
    if (!hex || cap < 2 * sizeof(raw) + 1)
        return kolo__err(KOLO_ERR_INVALID_ARG, "secret buffer too small (%zu bytes, need 65)", cap);
    int s = kolo__random_bytes(raw, sizeof(raw));
    if (s != KOLO_OK) return s;
    for (size_t i = 0; i < sizeof(raw); i++) {
        hex[2 * i] = digits[raw[i] >> 4];
        hex[2 * i + 1] = digits[raw[i] & 15];
    }
    hex[2 * sizeof(raw)] = '\0';
    OPENSSL_cleanse(raw, sizeof(raw));
    return KOLO_OK;
}
