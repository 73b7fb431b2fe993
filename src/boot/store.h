/* store.h - the rendezvous key-value store: a small authenticated TCP server and its client. */
#ifndef KOLO_STORE_H
#define KOLO_STORE_H

#include "../common/common.h"

#include <sys/socket.h>

/* ---- Addresses, as every message of the store's and the mesh's prints them ----
 * "host:port", an IPv6 literal bracketed; and a socket address so (numeric, a v4-mapped IPv6
 * address as IPv4, "(unknown address)" where it cannot be read). */
void kolo__fmt_hostport(char *out, size_t cap, const char *host, int port);
void kolo__fmt_sockaddr(char *out, size_t cap, const struct sockaddr *sa, socklen_t len);

/* ---- Server ----
 * Runs on its own thread; serves any number of clients until stopped.
 * Every connection must first pass the challenge-response with the job secret;
 * a stranger, a wrong secret, a malformed or oversized frame closes that connection
 * and logs one warning line with the peer's address. Other clients are unaffected.
 * fork() in a process running servers waits (pthread_atfork) until each server thread is
 * idle in poll(), so a child never inherits a lock held by it. */
typedef struct kolo__store_server kolo__store_server;

/* Binds host:port (host "" or NULL: all interfaces; port 0: any free port) and starts.
 * A taken port fails with KOLO_ERR_SYSTEM and a message that prints host:port. */
int kolo__store_server_start(kolo__store_server **out, const char *host, int port,
                             const void *secret, size_t secret_len);
/* The port actually bound. */
int kolo__store_server_port(const kolo__store_server *s);
/* Stops the thread, closes every connection, frees. NULL is a no-op. */
void kolo__store_server_stop(kolo__store_server *s);
/* Tests only: seconds a new connection has to greet (default 10), and one that greeted has to
 * prove the secret (default 60; store.c says why). Process-wide; call before starting a server. */
void kolo__store_test_handshake_timeout(double greeting_s, double proof_s);
/* Unauthenticated connections a server holds at once (store.c says why): descriptors a process
 * serving the store keeps room for, beside its own, so that strangers cannot take its last. */
#define KOLO_STORE_PENDING_MAX 256

/* ---- Client ----
 * One connection, used by one thread at a time. Keys are <= 255 bytes of text, values
 * <= 16 MiB of bytes. */
typedef struct kolo__store kolo__store;

/* Connects and authenticates, retrying a refused connection until timeout_s passes (the
 * server may start after us), and a handshake the server closed for room. Fails with KOLO_ERR_TIMEOUT naming host:port, or
 * KOLO_ERR_AUTH when the server does not accept our secret (or cannot prove its own). */
int kolo__store_connect(kolo__store **out, const char *host, int port, const void *secret,
                        size_t secret_len, double timeout_s);
int kolo__store_set(kolo__store *c, const char *key, const void *val, size_t len);
/* Waits until key exists (at most timeout_s; 0 means just look) and returns a copy of the
 * value in *val (free with kolo__free), its length in *len. KOLO_ERR_TIMEOUT if absent.
 * The copy is followed by a NUL byte not counted in *len, so text values read as strings. */
int kolo__store_get(kolo__store *c, const char *key, void **val, size_t *len, double timeout_s);
/* Atomically adds delta to the integer stored at key (absent: 0) and returns the new value
 * (result may be NULL). Counters are stored as decimal text, so a GET of one reads e.g. "3".
 * KOLO_ERR_INVALID_ARG when the stored value is not an integer or the sum overflows. */
int kolo__store_add(kolo__store *c, const char *key, int64_t delta, int64_t *result);
/* Closes. NULL is a no-op. */
void kolo__store_close(kolo__store *c);

#endif
