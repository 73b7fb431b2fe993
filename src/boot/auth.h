/* auth.h - the job secret's challenge-response: HMAC-SHA256 from libcrypto, constant-time compare. */
#ifndef KOLO_AUTH_H
#define KOLO_AUTH_H

#include "../common/common.h"

#define KOLO_NONCE_LEN 32
#define KOLO_MAC_LEN 32

/* Fills out with cryptographically random bytes (getrandom). Returns status. */
int kolo__random_bytes(void *out, size_t n);

/* out = HMAC-SHA256(key, label || msg). `label` separates uses (e.g. "kolo-store-client",
 * "kolo-mesh-accept") so that one answer can never be replayed for another purpose. */
int kolo__hmac(uint8_t out[KOLO_MAC_LEN], const void *key, size_t keylen, const char *label,
               const void *msg, size_t msglen);

/* Constant-time equality of two MACs. */
bool kolo__mac_equal(const uint8_t a[KOLO_MAC_LEN], const uint8_t b[KOLO_MAC_LEN]);

/* Writes a fresh random secret as 64 hex characters plus NUL (cap >= 65). */
int kolo__secret_make(char *hex, size_t cap);

#endif
