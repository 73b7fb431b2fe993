/* store.c - the rendezvous key-value store: an authenticated TCP server on its own thread, and its client.
 *
 * Protocol, version 1. Integers are big-endian. K is the job secret, HMAC is HMAC-SHA256 (auth.c).
 *
 * Handshake: mutual challenge-response with fresh nonces from both sides.
 *   C -> S  "KOLOSTv1" | Nc (32 random bytes)
 *   S -> C  "KOLOSTv1" | Ns (32 random bytes) | HMAC(K, "kolo-store-v1 server" || Nc || Ns)
 *   C -> S  HMAC(K, "kolo-store-v1 client" || Nc || Ns)
 *   S -> C  "KSOK"     (only when the client's MAC is right; otherwise the server closes)
 * The client checks the server's MAC right after sending its own (a client with the wrong secret
 * thus shows up in the server's log as such, and gets KOLO_ERR_AUTH itself). Each MAC covers
 * both fresh nonces and each direction has its own label, so no answer can be replayed in
 * another connection or reflected back to its sender. There is no encryption: the secret keeps
 * strangers and other jobs out; it does not hide the keys from someone who can sniff the wire.
 * The server gives every connection 10 s to greet, and a client that greeted 60 s from then to
 * prove the secret. The greeting costs a client nothing; the proof is its first use of libcrypto,
 * and a worker starting among many on one CPU (kolorun binds a crowded host's workers, several to
 * a CPU) can be slow to get there: twice in CI, with another job running beside, the two ASan
 * workers of 3 that kolorun had bound to one of 2 CPUs reached the store 6-10 s late and were cut
 * off 10 s after connecting, in the middle of the handshake, while the third finished its own.
 * 60 s outlasts the workers' own deadline (KOLO_START_TIMEOUT, 30 s), so theirs is the one that
 * speaks, and it says how far the handshake got and when.
 *
 * Strangers cannot hold the door: a connection that greets and then says nothing costs its sender
 * 40 bytes and held a slot for those 60 s, so 4,096 of them (the table's size), or fewer where the
 * process ran out of descriptors first, locked the job's workers out of its start-up. The server
 * now holds at most 256 unauthenticated connections (KOLO_STORE_PENDING_MAX); one more, or an accept() out of
 * descriptors, closes the oldest handshake of the address holding the most (an IPv6 /64 counts as
 * one address), which under a flood is the flood's own, so that workers from other addresses are
 * never the ones closed. A worker can still be, when the flood comes from its own address or a
 * start-up of more than 256 handshakes at once outruns the server: before closing it the server
 * sends it "KBSY" in place of its challenge or its "KSOK" (having read what the client sent, so
 * that the close is no reset, which could overtake it), and the client, seeing that, connects
 * again until its deadline. Refused strangers are logged 10 in 10 s at most, then counted in one
 * line per 10 s.
 *
 * Requests, one at a time per connection (the client waits for each response):
 *   u32 len | u8 op | u8 klen | key[klen] | body          len counts every byte after itself
 *   SET 1   body = the value (len - 2 - klen bytes, at most 16 MiB)
 *   GET 2   body = u32 timeout_ms. The answer comes when the key exists or the timeout passes;
 *           meanwhile the server serves everyone else (the waiting connection is only parked).
 *   ADD 3   body = i64 delta. Counters are stored as decimal text, so GET of a counter reads "3".
 * Responses:
 *   u32 len | u8 status | body
 *   0 OK          SET: empty; GET: the value; ADD: i64 new value
 *   1 TIMEOUT     GET: the key did not appear in time
 *   2 NOT_INTEGER ADD: the stored value is not a decimal int64, or the sum overflows
 * Limits: 1 <= klen <= 255, values <= 16 MiB, so 2 <= len <= 2 + 255 + 16 MiB. Wrong magic, a
 * wrong MAC, a length out of range, an unknown op or a silent stranger closes that connection
 * with one warning naming the peer address and the reason; other connections are unaffected.
 *
 * Server threading: start() binds and listens on the caller's thread, then one thread owns the
 * listening socket, every connection and the table, in a poll() loop over non-blocking sockets.
 * stop() sets a flag, wakes the loop through an eventfd, joins the thread and frees everything.
 * Servers share only the registry that makes fork() wait until each server thread is parked in
 * poll() (see "fork safety" below); several may run at once in one process, started and
 * stopped from any threads.
 */
#include "store.h"

#include "auth.h"

#include <arpa/inet.h>
#include <assert.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAGIC "KOLOSTv1"
#define MAGIC_LEN 8
#define ACK "KSOK"
#define ACK_LEN 4
#define BUSY "KBSY" /* in place of the challenge or the ack: too many handshakes, connect again */
#define HELLO_LEN (MAGIC_LEN + KOLO_NONCE_LEN)
#define CHALLENGE_LEN (MAGIC_LEN + KOLO_NONCE_LEN + KOLO_MAC_LEN)
#define LABEL_SERVER "kolo-store-v1 server"
#define LABEL_CLIENT "kolo-store-v1 client"

#define MAX_KEY 255u
#define MAX_VALUE (16u << 20)
#define MAX_REQ (2u + MAX_KEY + MAX_VALUE)
#define MAX_RESP (1u + MAX_VALUE)
#define MAX_CONNS 4096
#define ACCEPTS_PER_ROUND 64 /* evicted connections are closed at once, but a round's accepts are bounded */
#define LOG_WINDOW_NS 10000000000ull /* refused strangers: LOG_BURST warnings per window, then a count */
#define LOG_BURST 10
#define ADDR_KEY_LEN 9      /* family, then 4 bytes of IPv4 or the 8 of an IPv6 /64 */

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3 };
enum { ST_OK = 0, ST_TIMEOUT = 1, ST_NOT_INTEGER = 2 };

/* Seconds a new connection has to greet, and one that greeted has to prove the secret (see the
 * top of the file). Changed only by tests, before a server starts. */
static double greeting_timeout_s = 10.0, proof_timeout_s = 60.0;

void kolo__store_test_handshake_timeout(double greeting_s, double proof_s)
{
    greeting_timeout_s = greeting_s > 0 ? greeting_s : 10.0;
    proof_timeout_s = proof_s > 0 ? proof_s : 60.0;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

/* MAC over Nc || Ns under one of the two labels. */
static int hs_mac(uint8_t out[KOLO_MAC_LEN], const void *key, size_t keylen, const char *label,
                  const uint8_t nc[KOLO_NONCE_LEN], const uint8_t ns[KOLO_NONCE_LEN])
{
    uint8_t msg[2 * KOLO_NONCE_LEN];
    memcpy(msg, nc, KOLO_NONCE_LEN);
    memcpy(msg + KOLO_NONCE_LEN, ns, KOLO_NONCE_LEN);
    return kolo__hmac(out, key, keylen, label, msg, sizeof(msg));
}

void kolo__fmt_hostport(char *out, size_t cap, const char *host, int port)
{
    if (strchr(host, ':')) snprintf(out, cap, "[%s]:%d", host, port);
    else snprintf(out, cap, "%s:%d", host, port);
}

void kolo__fmt_sockaddr(char *out, size_t cap, const struct sockaddr *sa, socklen_t len)
{
    char h[64], p[NI_MAXSERV]; /* numeric: INET6_ADDRSTRLEN plus a scope id */
    if (getnameinfo(sa, len, h, sizeof(h), p, sizeof(p), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "(unknown address)");
        return;
    }
    const char *host = h;
    if (strncmp(host, "::ffff:", 7) == 0 && strchr(host + 7, '.')) host += 7; /* v4-mapped */
    kolo__fmt_hostport(out, cap, host, atoi(p));
}

/* ======================================================================== server */

typedef struct entry {
    struct entry *next;
    uint8_t *val;
    size_t len;
    uint8_t klen;
    uint8_t key[];
} entry;

enum cstate { C_HELLO, C_PROOF, C_READY, C_WAIT };

typedef struct conn {
    struct kolo__store_server *srv;
    int fd;
    enum cstate state;
    bool dead;
    char peer[80];
    uint8_t addr[ADDR_KEY_LEN];    /* the peer's address, as the eviction counts it */
    uint64_t since_ns;             /* accepted */
    uint64_t deadline_ns;          /* end of the handshake, or of a parked GET */
    uint8_t nc[KOLO_NONCE_LEN], ns[KOLO_NONCE_LEN];
    uint8_t small[HELLO_LEN];      /* handshake messages and frame headers */
    size_t got;                    /* bytes of the current unit received */
    uint8_t *body;                 /* current request after its length, or NULL */
    uint32_t body_len;
    uint8_t *out;                  /* pending output */
    size_t out_len, out_off;
    uint8_t wkey[MAX_KEY];         /* the key a parked GET waits for */
    uint8_t wklen;
} conn;

struct kolo__store_server {
    int lfd, wakefd, port;
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t busy;          /* held by the thread while it works (see fork_prepare) */
    pthread_cond_t started;        /* with busy: the thread has reached its loop */
    bool running;
    struct kolo__store_server *next_running;
    uint8_t *secret;
    size_t secret_len;
    conn **conns;
    size_t nconns, capconns;
    size_t npending;               /* connections not dead in C_HELLO or C_PROOF */
    /* refused strangers' log: the window's start, its warnings, and what went unsaid */
    uint64_t log_since_ns;
    unsigned log_warned, log_quiet, log_evicted;
    char log_peer[80], log_why[96], log_evicted_from[80];
    entry **tab;
    size_t nbuckets, nentries;
};

static entry *lookup(kolo__store_server *s, const uint8_t *k, size_t n)
{
    for (entry *e = s->tab[kolo__fnv1a(k, n) & (s->nbuckets - 1)]; e; e = e->next)
        if (e->klen == n && memcmp(e->key, k, n) == 0) return e;
    return NULL;
}

static void grow_table(kolo__store_server *s)
{
    size_t nb = s->nbuckets * 2;
    entry **t = kolo__calloc(nb, sizeof(*t));
    if (!t) return; /* longer chains, still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->tab[i];
        while (e) {
            entry *next = e->next;
            size_t b = kolo__fnv1a(e->key, e->klen) & (nb - 1);
            e->next = t[b];
            t[b] = e;
            e = next;
        }
    }
    kolo__free(s->tab);
    s->tab = t;
    s->nbuckets = nb;
}

/* Stores a copy of val under key. false when out of memory (the old value stays). */
static bool put_entry(kolo__store_server *s, const uint8_t *k, size_t n, const uint8_t *val, size_t len)
{
    uint8_t *copy = kolo__malloc(len ? len : 1);
    if (!copy) return false;
    if (len) memcpy(copy, val, len);
    entry *e = lookup(s, k, n);
    if (e) {
        kolo__free(e->val);
    } else {
        e = kolo__malloc(sizeof(*e) + n);
        if (!e) {
            kolo__free(copy);
            return false;
        }
        e->klen = (uint8_t)n;
        memcpy(e->key, k, n);
        size_t b = kolo__fnv1a(k, n) & (s->nbuckets - 1);
        e->next = s->tab[b];
        s->tab[b] = e;
        if (++s->nentries > 2 * s->nbuckets) grow_table(s);
    }
    e->val = copy;
    e->len = len;
    return true;
}

static bool is_pending(const conn *c) { return !c->dead && (c->state == C_HELLO || c->state == C_PROOF); }

/* Says what the window's quiet refusals were, once the window is over (or at once: now 0). */
static void log_window_end(kolo__store_server *s, uint64_t now)
{
    if (now && now - s->log_since_ns < LOG_WINDOW_NS) return;
    double secs = (double)((now ? now : kolo__now_ns()) - s->log_since_ns) / 1e9;
    if (s->log_quiet)
        KOLO_WARN("store: %u more unauthenticated connections closed in %.1f s, unlogged (the latest from %s: %s)",
                  s->log_quiet, secs, s->log_peer, s->log_why);
    if (s->log_evicted)
        KOLO_WARN("store: %u handshakes closed for room in %.1f s (the latest from %s)", s->log_evicted, secs,
                  s->log_evicted_from);
    s->log_since_ns = now;
    s->log_warned = s->log_quiet = s->log_evicted = 0;
}

/* The warning for a refused stranger: the first LOG_BURST of a window say each, the rest are counted
 * (a port scan, or a flood, would otherwise write a line per connection). */
static void log_refusal(kolo__store_server *s, const conn *c, const char *why)
{
    log_window_end(s, kolo__now_ns());
    if (s->log_warned < LOG_BURST) {
        s->log_warned++;
        KOLO_WARN("store: closing connection from %s: %s%s", c->peer, why,
                  s->log_warned == LOG_BURST ? " (more such are counted, not logged, for up to 10 s)" : "");
        return;
    }
    s->log_quiet++;
    snprintf(s->log_peer, sizeof(s->log_peer), "%s", c->peer);
    snprintf(s->log_why, sizeof(s->log_why), "%s", why);
}

static void drop_conn(conn *c, const char *why, bool warn)
{
    if (c->dead) return;
    bool pending = is_pending(c);
    if (warn && pending) log_refusal(c->srv, c, why);
    else if (warn) KOLO_WARN("store: closing connection from %s: %s", c->peer, why);
    else KOLO_DEBUG("store: connection from %s ends: %s", c->peer, why);
    if (pending) c->srv->npending--;
    c->dead = true;
}

/* Queues a response. false (and the connection is dropped) when out of memory. */
static bool respond(conn *c, uint8_t status, const void *body, size_t len)
{
    size_t need = c->out_len + 5 + len;
    uint8_t *o = kolo__realloc(c->out, need);
    if (!o) {
        drop_conn(c, "out of memory for a response", true);
        return false;
    }
    c->out = o;
    put32(o + c->out_len, (uint32_t)(1 + len));
    o[c->out_len + 4] = status;
    if (len) memcpy(o + c->out_len + 5, body, len);
    c->out_len = need;
    return true;
}

/* Sends what it can of the pending output without blocking. */
static void flush_out(conn *c)
{
    while (!c->dead && c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char why[128];
            snprintf(why, sizeof(why), "send: %s", strerror(errno));
            drop_conn(c, why, c->state == C_HELLO || c->state == C_PROOF);
            return;
        }
        c->out_off += (size_t)w;
    }
    if (c->out_off == c->out_len && c->out) {
        kolo__free(c->out);
        c->out = NULL;
        c->out_len = c->out_off = 0;
    }
}

/* Answers every connection parked on key k. */
static void wake_waiters(kolo__store_server *s, const uint8_t *k, size_t n, const entry *e)
{
    for (size_t i = 0; i < s->nconns; i++) {
        conn *w = s->conns[i];
        if (w->dead || w->state != C_WAIT || w->wklen != n || memcmp(w->wkey, k, n) != 0) continue;
        w->state = C_READY;
        w->deadline_ns = 0;
        if (respond(w, ST_OK, e->val, e->len)) flush_out(w);
    }
}

static bool parse_i64(const uint8_t *v, size_t n, int64_t *out)
{
    char buf[32];
    if (n == 0 || n >= sizeof(buf)) return false;
    memcpy(buf, v, n);
    buf[n] = '\0';
    for (size_t i = (buf[0] == '-'); i < n; i++)
        if (buf[i] < '0' || buf[i] > '9') return false;
    if (buf[0] == '-' && n == 1) return false;
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}

/* One complete request in c->body. */
static void handle_request(kolo__store_server *s, conn *c)
{
    const uint8_t *b = c->body;
    uint32_t len = c->body_len;
    uint8_t op = b[0], klen = b[1];
    char why[96];
    if (klen == 0 || 2u + klen > len) {
        snprintf(why, sizeof(why), "malformed request (key of %u bytes in a frame of %u)", klen, len);
        drop_conn(c, why, true);
        return;
    }
    const uint8_t *key = b + 2, *rest = b + 2 + klen;
    size_t restlen = len - 2u - klen;
    switch (op) {
    case OP_SET: {
        /* The frame's limit leaves room for the longest key, so under a shorter one a value can
         * pass it and still be over 16 MiB: stored, no client could read it back (the answer to
         * its GET would be over MAX_RESP, which the client takes for a broken stream). */
        if (restlen > MAX_VALUE) {
            snprintf(why, sizeof(why), "value of %zu bytes (allowed: at most %u)", restlen, MAX_VALUE);
            drop_conn(c, why, true);
            return;
        }
        if (!put_entry(s, key, klen, rest, restlen)) {
            drop_conn(c, "out of memory storing a value", true);
            return;
        }
        if (!respond(c, ST_OK, NULL, 0)) return;
        wake_waiters(s, key, klen, lookup(s, key, klen));
        return;
    }
    case OP_GET: {
        if (restlen != 4) break;
        uint32_t ms = get32(rest);
        entry *e = lookup(s, key, klen);
        if (e) respond(c, ST_OK, e->val, e->len);
        else if (ms == 0) respond(c, ST_TIMEOUT, NULL, 0);
        else {
            c->state = C_WAIT;
            memcpy(c->wkey, key, klen);
            c->wklen = klen;
            c->deadline_ns = kolo__now_ns() + (uint64_t)ms * 1000000ull;
        }
        return;
    }
    case OP_ADD: {
        if (restlen != 8) break;
        int64_t delta = (int64_t)get64(rest), cur = 0, sum;
        entry *e = lookup(s, key, klen);
        if ((e && !parse_i64(e->val, e->len, &cur)) || __builtin_add_overflow(cur, delta, &sum)) {
            respond(c, ST_NOT_INTEGER, NULL, 0);
            return;
        }
        char text[32];
        int tn = snprintf(text, sizeof(text), "%lld", (long long)sum);
        if (!put_entry(s, key, klen, (const uint8_t *)text, (size_t)tn)) {
            drop_conn(c, "out of memory storing a counter", true);
            return;
        }
        uint8_t r[8];
        put64(r, (uint64_t)sum);
        if (!respond(c, ST_OK, r, sizeof(r))) return;
        wake_waiters(s, key, klen, lookup(s, key, klen));
        return;
    }
    default:
        snprintf(why, sizeof(why), "unknown request op %u", op);
        drop_conn(c, why, true);
        return;
    }
    snprintf(why, sizeof(why), "malformed request (op %u with a body of %zu bytes)", op, restlen);
    drop_conn(c, why, true);
}

/* A complete unit (handshake message, frame header or body) has arrived. */
static void on_unit(kolo__store_server *s, conn *c)
{
    char why[96];
    c->got = 0;
    switch (c->state) {
    case C_HELLO: {
        memcpy(c->nc, c->small + MAGIC_LEN, KOLO_NONCE_LEN);
        uint8_t msg[CHALLENGE_LEN];
        memcpy(msg, MAGIC, MAGIC_LEN);
        if (kolo__random_bytes(c->ns, KOLO_NONCE_LEN) != KOLO_OK ||
            hs_mac(msg + MAGIC_LEN + KOLO_NONCE_LEN, s->secret, s->secret_len, LABEL_SERVER, c->nc, c->ns) != KOLO_OK) {
            snprintf(why, sizeof(why), "handshake failed: %s", kolo__errmsg());
            drop_conn(c, why, true);
            return;
        }
        memcpy(msg + MAGIC_LEN, c->ns, KOLO_NONCE_LEN);
        c->out = kolo__malloc(sizeof(msg));
        if (!c->out) {
            drop_conn(c, "out of memory in the handshake", true);
            return;
        }
        memcpy(c->out, msg, sizeof(msg));
        c->out_len = sizeof(msg);
        c->out_off = 0;
        c->state = C_PROOF;
        c->deadline_ns = kolo__now_ns() + (uint64_t)(proof_timeout_s * 1e9);
        return;
    }
    case C_PROOF: {
        uint8_t want[KOLO_MAC_LEN];
        if (hs_mac(want, s->secret, s->secret_len, LABEL_CLIENT, c->nc, c->ns) != KOLO_OK) {
            snprintf(why, sizeof(why), "handshake failed: %s", kolo__errmsg());
            drop_conn(c, why, true);
            return;
        }
        if (!kolo__mac_equal(want, c->small)) {
            drop_conn(c, "wrong secret (the client could not prove the job secret)", true);
            return;
        }
        c->out = kolo__malloc(ACK_LEN);
        if (!c->out) {
            drop_conn(c, "out of memory in the handshake", true);
            return;
        }
        memcpy(c->out, ACK, ACK_LEN);
        c->out_len = ACK_LEN;
        c->out_off = 0;
        c->state = C_READY;
        c->deadline_ns = 0;
        s->npending--;
        KOLO_DEBUG("store: %s authenticated", c->peer);
        return;
    }
    case C_READY:
        if (!c->body) {
            uint32_t len = get32(c->small);
            if (len < 2 || len > MAX_REQ) {
                snprintf(why, sizeof(why), "request frame of %u bytes (allowed: 2 to %u)", len, MAX_REQ);
                drop_conn(c, why, true);
                return;
            }
            c->body = kolo__malloc(len);
            if (!c->body) {
                snprintf(why, sizeof(why), "out of memory for a request of %u bytes", len);
                drop_conn(c, why, true);
                return;
            }
            c->body_len = len;
            return;
        }
        handle_request(s, c);
        kolo__free(c->body);
        c->body = NULL;
        c->body_len = 0;
        return;
    case C_WAIT:
        return;
    }
}

/* Reads what is available until the socket would block, the connection parks on a GET, or
 * output is pending (a client reads its answer before the next request is taken). */
static void on_readable(kolo__store_server *s, conn *c)
{
    while (!c->dead && c->state != C_WAIT && c->out_len == 0) {
        uint8_t *dst;
        size_t need;
        switch (c->state) {
        case C_HELLO: dst = c->small; need = HELLO_LEN; break;
        case C_PROOF: dst = c->small; need = KOLO_MAC_LEN; break;
        default:
            if (c->body) {
                dst = c->body;
                need = c->body_len;
            } else {
                dst = c->small;
                need = 4;
            }
            break;
        }
        ssize_t r = recv(c->fd, dst + c->got, need - c->got, MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            char why[128];
            snprintf(why, sizeof(why), "recv: %s", strerror(errno));
            drop_conn(c, why, c->state != C_READY);
            return;
        }
        if (r == 0) {
            if (c->state == C_HELLO)
                drop_conn(c, c->got ? "closed in the middle of the greeting" : "closed without a greeting", true);
            else if (c->state == C_PROOF)
                drop_conn(c, "closed during the handshake (the client may hold another secret)", true);
            else if (c->got || c->body)
                drop_conn(c, "closed in the middle of a request", true);
            else
                drop_conn(c, "closed by the client", false);
            return;
        }
        /* Reject a stranger at its first wrong byte rather than at the deadline. */
        if (c->state == C_HELLO && c->got < MAGIC_LEN) {
            size_t n = KOLO_MIN(c->got + (size_t)r, (size_t)MAGIC_LEN);
            if (memcmp(c->small, MAGIC, n) != 0) {
                drop_conn(c, "wrong magic (not a kolo store client)", true);
                return;
            }
        }
        c->got += (size_t)r;
        if (c->got == need) on_unit(s, c);
        flush_out(c);
    }
}

/* The address as eviction counts it: IPv4 (a v4-mapped one too) whole, IPv6 by its /64 (one
 * host's privacy addresses, which it may change at will, are one). */
static void addr_key(uint8_t key[ADDR_KEY_LEN], const struct sockaddr *sa)
{
    memset(key, 0, ADDR_KEY_LEN);
    if (sa->sa_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            key[0] = 4;
            memcpy(key + 1, a->s6_addr + 12, 4);
        } else {
            key[0] = 6;
            memcpy(key + 1, a->s6_addr, 8);
        }
    }
}

static int by_addr_then_age(const void *a, const void *b)
{
    const conn *x = *(conn *const *)a, *y = *(conn *const *)b;
    int d = memcmp(x->addr, y->addr, ADDR_KEY_LEN);
    if (d) return d;
    return (x->since_ns > y->since_ns) - (x->since_ns < y->since_ns);
}

/* Closes the oldest handshake of the address holding the most (ties: the older of the two), after
 * telling it BUSY, and its descriptor at once: the caller may be out of them. false when no
 * connection is unauthenticated. */
static bool evict_one(kolo__store_server *s, const char *trigger)
{
    if (s->npending == 0) return false;
    conn **p = kolo__malloc(s->npending * sizeof(*p));
    if (!p) return false;
    size_t n = 0;
    for (size_t i = 0; i < s->nconns && n < s->npending; i++)
        if (is_pending(s->conns[i])) p[n++] = s->conns[i];
    qsort(p, n, sizeof(*p), by_addr_then_age);
    size_t best = 0, best_n = 0;
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && memcmp(p[j]->addr, p[i]->addr, ADDR_KEY_LEN) == 0; j++) {}
        if (j - i > best_n || (j - i == best_n && p[i]->since_ns < p[best]->since_ns)) {
            best = i;
            best_n = j - i;
        }
    }
    conn *v = n ? p[best] : NULL;
    kolo__free(p);
    if (!v) return false;
    if (v->out_len == 0) { /* a challenge half sent would make the BUSY unreadable: then only close */
        ssize_t w = send(v->fd, BUSY, ACK_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
    uint8_t drain[512]; /* unread bytes at close() send a reset, which may discard the BUSY unread */
    for (int i = 0; i < 8 && recv(v->fd, drain, sizeof(drain), MSG_DONTWAIT) > 0; i++) {}
    log_window_end(s, kolo__now_ns());
    if (s->log_evicted == 0) { /* the first of a window says what is going on; the rest are counted */
        char host[80];
        snprintf(host, sizeof(host), "%s", v->peer[0] == '[' ? v->peer + 1 : v->peer);
        char *colon = strrchr(host, ':'); /* the port off: they come from many */
        if (colon) *colon = '\0';
        if (colon && colon > host && colon[-1] == ']') colon[-1] = '\0';
        KOLO_WARN("store: %zu unauthenticated connections open, %zu of them from %s%s: closing the oldest handshakes "
                  "from there (%s; a port scan or a flood?)", s->npending, best_n, host,
                  v->addr[0] == 6 ? " and its /64" : "", trigger);
    }
    s->log_evicted++;
    snprintf(s->log_evicted_from, sizeof(s->log_evicted_from), "%s", v->peer);
    s->npending--;
    v->dead = true;
    close(v->fd);
    v->fd = -1;
    return true;
}

static int add_conn(kolo__store_server *s, int fd, const struct sockaddr *sa, socklen_t salen)
{
    char peer[80];
    kolo__fmt_sockaddr(peer, sizeof(peer), sa, salen);
    if (s->npending >= KOLO_STORE_PENDING_MAX) {
        char trigger[48];
        snprintf(trigger, sizeof(trigger), "the store holds at most %d", KOLO_STORE_PENDING_MAX);
        evict_one(s, trigger);
    }
    if (s->nconns >= MAX_CONNS) {
        KOLO_WARN("store: refusing connection from %s: %d connections already open", peer, MAX_CONNS);
        return -1;
    }
    if (s->nconns == s->capconns) {
        size_t cap = s->capconns ? 2 * s->capconns : 16;
        conn **a = kolo__realloc(s->conns, cap * sizeof(*a));
        if (!a) goto nomem;
        s->conns = a;
        s->capconns = cap;
    }
    conn *c = kolo__calloc(1, sizeof(*c));
    if (!c) goto nomem;
    c->srv = s;
    c->fd = fd;
    c->state = C_HELLO;
    c->since_ns = kolo__now_ns();
    c->deadline_ns = c->since_ns + (uint64_t)(greeting_timeout_s * 1e9);
    memcpy(c->peer, peer, sizeof(peer));
    addr_key(c->addr, sa);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    s->conns[s->nconns++] = c;
    s->npending++;
    return 0;
nomem:
    KOLO_WARN("store: refusing connection from %s: out of memory", peer);
    return -1;
}

static void free_conn(conn *c)
{
    if (c->fd >= 0) close(c->fd);
    kolo__free(c->body);
    kolo__free(c->out);
    kolo__free(c);
}

/* Accepts the pending connections, ACCEPTS_PER_ROUND at most (the next round takes the rest).
 * Out of descriptors, it closes a handshake to take the next; false when out of descriptors with
 * none to close, or of memory: the caller then stops polling the listening socket for a moment
 * instead of spinning on it. */
static bool accept_all(kolo__store_server *s)
{
    for (int taken = 0; taken < ACCEPTS_PER_ROUND;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        /* accept4 fills it with the peer's address; zeroed first so that addr_key always reads a
         * family the kernel wrote or AF_UNSPEC (clang's analyzer, which does not model accept4,
         * took it for garbage). A memset per connection, not per message. */
        memset(&ss, 0, sizeof(ss));
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
            int e = errno;
            if ((e == EMFILE || e == ENFILE) && evict_one(s, e == EMFILE ? "this process is out of file descriptors"
                                                                          : "the system is out of file descriptors")) {
                taken++;
                continue;
            }
            KOLO_WARN("store: accept on port %d: %s", s->port, strerror(e));
            return false;
        }
        taken++;
        if (add_conn(s, fd, (struct sockaddr *)&ss, sl) != 0) close(fd);
    }
    return true;
}

/* The poll set of one round, reused from round to round. */
typedef struct pollset {
    struct pollfd *pfd;
    conn **pc;   /* pc[i] is the connection behind pfd[i] (i >= 2) */
    size_t cap;
    bool accept_ok;
} pollset;

/* Fills the poll set: the wake fd, the listening socket, every connection. Returns the count,
 * 0 when out of memory; *ms is the time to the nearest deadline. */
static size_t build_pollset(kolo__store_server *s, pollset *ps, int *ms)
{
    /* add_conn refuses a connection past MAX_CONNS, so n cannot wrap around to below ps->cap
     * while the arrays are still NULL. */
    assert(s->nconns <= MAX_CONNS);
    size_t n = 2 + s->nconns;
    if (n > ps->cap) {
        struct pollfd *np = kolo__realloc(ps->pfd, n * sizeof(*np));
        if (!np) return 0;
        ps->pfd = np;
        conn **nc = kolo__realloc(ps->pc, n * sizeof(*nc));
        if (!nc) return 0;
        ps->pc = nc;
        ps->cap = n;
    }
    uint64_t now = kolo__now_ns(), next = now + 60000000000ull;
    ps->pfd[0] = (struct pollfd){.fd = s->wakefd, .events = POLLIN};
    ps->pfd[1] = (struct pollfd){.fd = ps->accept_ok ? s->lfd : -1, .events = POLLIN};
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        short ev = POLLRDHUP;
        if (c->out_len) ev |= POLLOUT;
        else if (c->state != C_WAIT) ev |= POLLIN;
        if (c->state != C_READY && c->deadline_ns < next) next = c->deadline_ns;
        ps->pfd[2 + i] = (struct pollfd){.fd = c->fd, .events = ev};
        ps->pc[2 + i] = c;
    }
    if ((s->log_quiet || s->log_evicted) && s->log_since_ns + LOG_WINDOW_NS < next)
        next = s->log_since_ns + LOG_WINDOW_NS; /* the count is told when its window ends */
    *ms = next > now ? (int)((next - now + 999999) / 1000000) : 0;
    if (!ps->accept_ok) *ms = KOLO_MIN(*ms, 100);
    return n;
}

/* Acts on what poll() reported, then on expired deadlines, then frees closed connections. */
static void handle_events(kolo__store_server *s, pollset *ps, size_t polled)
{
    if (ps->pfd[0].revents) {
        uint64_t v;
        ssize_t rd = read(s->wakefd, &v, sizeof(v));
        (void)rd;
    }
    for (size_t i = 2; i < polled; i++) {
        conn *c = ps->pc[i];
        short re = ps->pfd[i].revents;
        if (!re || c->dead) continue;
        if (re & POLLNVAL) {
            drop_conn(c, "invalid descriptor", true);
            continue;
        }
        if (re & POLLOUT) flush_out(c);
        if (re & (POLLIN | POLLERR | POLLHUP | POLLRDHUP)) {
            if (c->out_len == 0 && c->state != C_WAIT) on_readable(s, c);
            flush_out(c);
        }
        /* A peer that hung up while parked or while we still owe it bytes is gone:
         * without this, a level-triggered RDHUP would spin the loop. */
        if (!c->dead && (re & (POLLERR | POLLHUP | POLLRDHUP)) && (c->state == C_WAIT || c->out_len))
            drop_conn(c, "the client went away", c->state == C_HELLO || c->state == C_PROOF);
    }
    ps->accept_ok = true;
    if (ps->pfd[1].revents & POLLIN) ps->accept_ok = accept_all(s);

    uint64_t now = kolo__now_ns();
    for (size_t i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (c->dead || c->deadline_ns == 0 || c->deadline_ns > now) continue;
        if (c->state == C_HELLO || c->state == C_PROOF) {
            char why[128];
            if (c->state == C_HELLO)
                snprintf(why, sizeof(why), "no complete greeting within %g s (%zu of %d bytes)", greeting_timeout_s,
                         c->got, HELLO_LEN);
            else
                snprintf(why, sizeof(why), "greeted, but no proof of the secret within %g s (%zu of %d bytes)",
                         proof_timeout_s, c->got, KOLO_MAC_LEN);
            drop_conn(c, why, true);
        } else if (c->state == C_WAIT) {
            c->state = C_READY;
            c->deadline_ns = 0;
            if (respond(c, ST_TIMEOUT, NULL, 0)) flush_out(c);
        }
    }
    size_t j = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i]->dead) free_conn(s->conns[i]);
        else s->conns[j++] = s->conns[i];
    }
    s->nconns = j;
    log_window_end(s, now);
}

/* The server thread. It holds s->busy except while it sleeps in poll(), so that fork() (see
 * fork_prepare) never copies it in the middle of malloc or libcrypto. */
static void *server_main(void *arg)
{
    kolo__store_server *s = arg;
    pollset ps = {.accept_ok = true};
    pthread_mutex_lock(&s->busy);
    s->running = true;
    pthread_cond_signal(&s->started);
    while (!atomic_load(&s->stop)) {
        int ms = 0;
        size_t polled = build_pollset(s, &ps, &ms);
        if (polled == 0) {
            KOLO_ERROR("store: out of memory in the server loop; retrying");
            ms = 10;
        }
        pthread_mutex_unlock(&s->busy);
        int r = polled ? poll(ps.pfd, (nfds_t)polled, ms) : poll(NULL, 0, ms);
        int e = errno;
        pthread_mutex_lock(&s->busy);
        if (polled == 0) continue;
        if (r < 0) {
            if (e != EINTR) {
                KOLO_ERROR("store: poll: %s", strerror(e));
                pthread_mutex_unlock(&s->busy);
                usleep(10000);
                pthread_mutex_lock(&s->busy);
            }
            continue;
        }
        handle_events(s, &ps, polled);
    }
    kolo__free(ps.pfd);
    kolo__free(ps.pc);
    pthread_mutex_unlock(&s->busy);
    return NULL;
}

/* ---- fork safety ----
 * A process that forks while the server thread is inside malloc or libcrypto gives the child
 * a lock nobody will release (the ASan allocator and OpenSSL's method store are not fork-safe),
 * and the child hangs at its first allocation. Test harnesses and launchers fork ranks while a
 * store serves, so fork waits until every running server thread is parked in poll().
 * Lock order: registry_lock, then each server's busy. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static kolo__store_server *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
    pthread_mutex_lock(&registry_lock);
    for (kolo__store_server *s = registry; s; s = s->next_running) pthread_mutex_lock(&s->busy);
}

static void fork_done(void)
{
    for (kolo__store_server *s = registry; s; s = s->next_running) pthread_mutex_unlock(&s->busy);
    pthread_mutex_unlock(&registry_lock);
}

static void atfork_register(void) { pthread_atfork(fork_prepare, fork_done, fork_done); }

static void registry_add(kolo__store_server *s)
{
    pthread_once(&atfork_once, atfork_register);
    pthread_mutex_lock(&registry_lock);
    s->next_running = registry;
    registry = s;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(kolo__store_server *s)
{
    pthread_mutex_lock(&registry_lock);
    for (kolo__store_server **p = &registry; *p; p = &(*p)->next_running) {
        if (*p == s) {
            *p = s->next_running;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

/* Creates, binds and listens. Returns the socket or -1 with errno set. */
static int listen_on(const struct sockaddr *sa, socklen_t len, bool dual)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (sa->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual ? &zero : &one, sizeof(int));
    if (bind(fd, sa, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int bind_server(kolo__store_server *s, const char *host, int port)
{
    char where[300];
    if (!host || !*host) {
        /* all interfaces: IPv6 and IPv4 on one dual-stack socket, or IPv4 alone where the
         * kernel has no IPv6 */
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
        int fd = listen_on((struct sockaddr *)&a6, sizeof(a6), true);
        if (fd < 0 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL || errno == EPROTONOSUPPORT)) {
            struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                     .sin_addr.s_addr = htonl(INADDR_ANY)};
            fd = listen_on((struct sockaddr *)&a4, sizeof(a4), false);
        }
        if (fd < 0) return kolo__err_sys(errno, "store: cannot listen on *:%d (all interfaces)", port);
        s->lfd = fd;
        return KOLO_OK;
    }
    kolo__fmt_hostport(where, sizeof(where), host, port);
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0)
        return kolo__err(KOLO_ERR_SYSTEM, "store: cannot listen on %s: %s", where,
                         g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    int e = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = listen_on(ai->ai_addr, ai->ai_addrlen, false);
        if (fd >= 0) {
            freeaddrinfo(res);
            s->lfd = fd;
            return KOLO_OK;
        }
        e = errno;
    }
    freeaddrinfo(res);
    return kolo__err_sys(e, "store: cannot listen on %s", where);
}

int kolo__store_server_start(kolo__store_server **out, const char *host, int port, const void *secret,
                             size_t secret_len)
{
    if (!out || !secret || secret_len == 0 || port < 0 || port > 65535)
        return kolo__err(KOLO_ERR_INVALID_ARG, "store server: %s",
                         !out ? "out is NULL" : (port < 0 || port > 65535) ? "port out of range" : "empty secret");
    int st;
    kolo__store_server *s = kolo__calloc(1, sizeof(*s));
    if (!s) return kolo__err(KOLO_ERR_NO_MEMORY, "store server: out of memory");
    s->lfd = s->wakefd = -1;
    s->log_since_ns = kolo__now_ns();
    pthread_mutex_init(&s->busy, NULL);
    pthread_cond_init(&s->started, NULL);
    s->nbuckets = 64;
    s->tab = kolo__calloc(s->nbuckets, sizeof(*s->tab));
    s->secret = kolo__malloc(secret_len);
    if (!s->tab || !s->secret) {
        st = kolo__err(KOLO_ERR_NO_MEMORY, "store server: out of memory");
        goto err_free;
    }
    memcpy(s->secret, secret, secret_len);
    s->secret_len = secret_len;
    if ((st = bind_server(s, host, port)) != KOLO_OK) goto err_free;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    memset(&ss, 0, sizeof(ss)); /* getsockname fills it on success; zeroed, as in accept_all */
    if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) != 0) {
        st = kolo__err_sys(errno, "store: getsockname");
        goto err_close;
    }
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wakefd < 0) {
        st = kolo__err_sys(errno, "store: eventfd");
        goto err_close;
    }
    /* The thread takes no signals: the application's handlers run on its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    registry_add(s);
    /* Return only once the thread runs its loop: a fork right after start() must not catch
     * the thread inside its start-up code (which allocates) but under fork_prepare's lock. */
    pthread_mutex_lock(&s->busy);
    int e = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    while (e == 0 && !s->running) pthread_cond_wait(&s->started, &s->busy);
    pthread_mutex_unlock(&s->busy);
    if (e != 0) {
        registry_remove(s);
        st = kolo__err_sys(e, "store: cannot start the server thread");
        goto err_close;
    }
    KOLO_DEBUG("store: serving on %s:%d", host && *host ? host : "*", s->port);
    *out = s;
    return KOLO_OK;

err_close:
    if (s->wakefd >= 0) close(s->wakefd);
    close(s->lfd);
err_free:
    if (s->secret) kolo__free(s->secret);
    kolo__free(s->tab);
    pthread_cond_destroy(&s->started);
    pthread_mutex_destroy(&s->busy);
    kolo__free(s);
    return st;
}

int kolo__store_server_port(const kolo__store_server *s) { return s ? s->port : 0; }

void kolo__store_server_stop(kolo__store_server *s)
{
    if (!s) return;
    atomic_store(&s->stop, 1);
    uint64_t one = 1;
    ssize_t w = write(s->wakefd, &one, sizeof(one));
    (void)w;
    pthread_join(s->thread, NULL);
    registry_remove(s);
    pthread_cond_destroy(&s->started);
    pthread_mutex_destroy(&s->busy);
    log_window_end(s, 0);
    for (size_t i = 0; i < s->nconns; i++) free_conn(s->conns[i]);
    kolo__free(s->conns);
    for (size_t b = 0; b < s->nbuckets; b++) {
        entry *e = s->tab[b];
        while (e) {
            entry *next = e->next;
            kolo__free(e->val);
            kolo__free(e);
            e = next;
        }
    }
    kolo__free(s->tab);
    close(s->lfd);
    close(s->wakefd);
    memset(s->secret, 0, s->secret_len);
    kolo__free(s->secret);
    kolo__free(s);
}

/* ======================================================================== client */

struct kolo__store {
    int fd;
    bool broken;           /* a request failed half-way: the stream is out of step */
    double io_timeout;     /* seconds to wait for an answer the server owes at once */
    char where[300];       /* host:port, for messages */
};

enum { IO_OK = 0, IO_TIMEOUT, IO_EOF, IO_ERR };

/* Waits until fd is ready for `events` or deadline_ns passes. */
static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kolo__now_ns();
        if (now >= deadline_ns) return IO_TIMEOUT;
        uint64_t left = (deadline_ns - now + 999999) / 1000000;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)KOLO_MIN(left, (uint64_t)INT32_MAX));
        if (r < 0) {
            if (errno == EINTR) continue;
            return IO_ERR;
        }
        if (r > 0) return IO_OK;
    }
}

static int send_all(int fd, const void *buf, size_t n, int flags, uint64_t deadline_ns)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT | flags);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int r = wait_fd(fd, POLLOUT, deadline_ns);
                if (r != IO_OK) return r;
                continue;
            }
            return (errno == EPIPE || errno == ECONNRESET) ? IO_EOF : IO_ERR;
        }
        p += w;
        n -= (size_t)w;
    }
    return IO_OK;
}

static int recv_all(int fd, void *buf, size_t n, uint64_t deadline_ns)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r == 0) return IO_EOF;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int w = wait_fd(fd, POLLIN, deadline_ns);
                if (w != IO_OK) return w;
                continue;
            }
            return errno == ECONNRESET ? IO_EOF : IO_ERR;
        }
        p += r;
        n -= (size_t)r;
    }
    return IO_OK;
}

static uint64_t deadline_after(double s)
{
    if (!(s > 0)) return kolo__now_ns();
    if (s > 1e8) s = 1e8; /* about three years: "forever" without overflow */
    return kolo__now_ns() + (uint64_t)(s * 1e9);
}

/* One TCP connection attempt to any address of host:port before deadline. */
static int try_connect(const char *host, int port, uint64_t deadline_ns, int *fd_out, int *err, int *gai)
{
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        *gai = g;
        *err = g == EAI_SYSTEM ? errno : 0;
        return -1;
    }
    *gai = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline_ns);
            if (w == IO_OK) {
                int so = 0;
                socklen_t sl = sizeof(so);
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) != 0) so = errno;
                r = so ? -1 : 0;
                errno = so;
            } else {
                errno = w == IO_TIMEOUT ? ETIMEDOUT : errno;
                r = -1;
            }
        }
        if (r == 0) {
            freeaddrinfo(res);
            *fd_out = fd;
            return 0;
        }
        *err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return -1;
}

/* The client's side of the handshake (see the top of the file). *again: the server closed it for
 * room (it said BUSY), and a new connection may pass. */
static int client_handshake(kolo__store *c, const void *secret, size_t secret_len, uint64_t deadline_ns, bool *again)
{
    uint8_t hello[HELLO_LEN], ch[CHALLENGE_LEN], mac[KOLO_MAC_LEN], want[KOLO_MAC_LEN], ack[ACK_LEN];
    memcpy(hello, MAGIC, MAGIC_LEN);
    uint64_t t0 = kolo__now_ns();
    int s = kolo__random_bytes(hello + MAGIC_LEN, KOLO_NONCE_LEN);
    if (s) return s;
    int r = send_all(c->fd, hello, sizeof(hello), 0, deadline_ns);
    if (r == IO_OK) r = recv_all(c->fd, ch, ACK_LEN, deadline_ns);
    if (r == IO_OK && memcmp(ch, BUSY, ACK_LEN) == 0) {
        *again = true;
        return kolo__err(KOLO_ERR_TIMEOUT, "the store at %s was too busy with other handshakes to take ours (its "
                         "log names where they come from)", c->where);
    }
    if (r == IO_OK) r = recv_all(c->fd, ch + ACK_LEN, sizeof(ch) - ACK_LEN, deadline_ns);
    if (r == IO_TIMEOUT)
        return kolo__err(KOLO_ERR_TIMEOUT, "the store at %s accepted the connection but did not answer the "
                         "handshake in %.1f s (is it a kolo store?)", c->where, (double)(kolo__now_ns() - t0) / 1e9);
    if (r == IO_EOF)
        return kolo__err(KOLO_ERR_PEER_LOST, "the store at %s closed the connection during the handshake", c->where);
    if (r == IO_ERR) return kolo__err_sys(errno, "store %s: handshake", c->where);
    if (memcmp(ch, MAGIC, MAGIC_LEN) != 0)
        return kolo__err(KOLO_ERR_PROTOCOL, "%s does not speak kolo's store protocol (wrong greeting)", c->where);
    const uint8_t *nc = hello + MAGIC_LEN, *ns = ch + MAGIC_LEN;
    uint64_t t_ch = kolo__now_ns();
    if ((s = hs_mac(mac, secret, secret_len, LABEL_CLIENT, nc, ns)) ||
        (s = hs_mac(want, secret, secret_len, LABEL_SERVER, nc, ns)))
        return s;
    r = send_all(c->fd, mac, sizeof(mac), 0, deadline_ns);
    /* when each step ended, for the errors below (a slow client is cut off: see the top) */
    char when[96];
    snprintf(when, sizeof(when), "its challenge came %.1f s after our greeting, our proof went %.1f s later",
             (double)(t_ch - t0) / 1e9, (double)(kolo__now_ns() - t_ch) / 1e9);
    if (!kolo__mac_equal(want, ch + MAGIC_LEN + KOLO_NONCE_LEN))
        return kolo__err(KOLO_ERR_AUTH, "the store at %s could not prove the job secret (another job's store, or "
                         "a different KOLO_SECRET)", c->where);
    if (r == IO_EOF)
        return kolo__err(KOLO_ERR_PEER_LOST, "the store at %s closed the connection during the handshake (%s)",
                         c->where, when);
    if (r == IO_OK) r = recv_all(c->fd, ack, sizeof(ack), deadline_ns);
    /* not a wrong secret: the store proved the same one */
    *again = r == IO_OK && memcmp(ack, BUSY, ACK_LEN) == 0;
    if (r == IO_EOF)
        return kolo__err(KOLO_ERR_PEER_LOST, "the store at %s closed the connection instead of accepting our proof of "
                         "the secret (%s): it gave up waiting for the proof, or stopped; its log says which",
                         c->where, when);
    if (*again)
        return kolo__err(KOLO_ERR_TIMEOUT, "the store at %s was too busy with other handshakes to take ours (%s; its "
                         "log names where they come from)", c->where, when);
    if (r == IO_TIMEOUT)
        return kolo__err(KOLO_ERR_TIMEOUT, "the store at %s did not finish the handshake (%s)", c->where, when);
    if (r == IO_ERR) return kolo__err_sys(errno, "store %s: handshake", c->where);
    if (memcmp(ack, ACK, ACK_LEN) != 0)
        return kolo__err(KOLO_ERR_PROTOCOL, "the store at %s sent a malformed handshake answer", c->where);
    return KOLO_OK;
}

int kolo__store_connect(kolo__store **out, const char *host, int port, const void *secret, size_t secret_len,
                        double timeout_s)
{
    if (!out || !host || !*host || port < 1 || port > 65535 || !secret || secret_len == 0 || isnan(timeout_s) ||
        timeout_s < 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "store connect: %s",
                         !out ? "out is NULL" : (!host || !*host) ? "no host" : (port < 1 || port > 65535) ? "port out of range"
                         : (!secret || !secret_len) ? "empty secret" : "bad timeout");
    kolo__store *c = kolo__calloc(1, sizeof(*c));
    if (!c) return kolo__err(KOLO_ERR_NO_MEMORY, "store connect: out of memory");
    c->fd = -1;
    c->io_timeout = KOLO_MAX(timeout_s, 10.0);
    kolo__fmt_hostport(c->where, sizeof(c->where), host, port);

    uint64_t deadline = deadline_after(timeout_s);
    uint64_t sleep_us = 1000;
    int err = 0, gai = 0, st = KOLO_OK;
    for (unsigned tries = 1;; tries++) {
        uint64_t attempt = KOLO_MAX(deadline, deadline_after(1.0));
        bool again = false;
        if (try_connect(host, port, attempt, &c->fd, &err, &gai) == 0) {
            int one = 1;
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            /* A store on a machine that went down or was cut off answers nothing more: an elastic
             * worker there, waiting on kolorun's store for its next round, waited out
             * KOLO_START_TIMEOUT (kolorun's 600 s) after its job had ended without it. The server
             * always reads what comes (its thread parks waiting requests, not their connections),
             * so bytes left unacknowledged end the connection too (TCP_USER_TIMEOUT). */
            (void)kolo__keepalive(c->fd, kolo__keepalive_s(), true);
            uint64_t hs_deadline = KOLO_MAX(deadline, deadline_after(10.0));
            if ((st = client_handshake(c, secret, secret_len, hs_deadline, &again)) == KOLO_OK) break;
            close(c->fd);
            c->fd = -1;
            if (!again) goto err_free;
            KOLO_DEBUG("store %s: %s; connecting again", c->where, kolo__errmsg());
        }
        uint64_t now = kolo__now_ns();
        if (now >= deadline && again) { /* the handshake's error, and how often it came */
            char msg[512];
            snprintf(msg, sizeof(msg), "%s", kolo__errmsg());
            if (tries > 1) kolo__err(st, "%s; %u connections tried in %g s", msg, tries, timeout_s);
            goto err_free;
        }
        if (now >= deadline) {
            char why[160];
            if (gai) snprintf(why, sizeof(why), "%s", gai == EAI_SYSTEM ? strerror(err) : gai_strerror(gai));
            else snprintf(why, sizeof(why), "%s", err ? strerror(err) : "no address");
            st = kolo__err(KOLO_ERR_TIMEOUT, "could not connect to the rendezvous store at %s within %g s: %s",
                           c->where, timeout_s, why);
            goto err_free;
        }
        /* The server may start after us: retry with short, growing sleeps. */
        uint64_t left_us = (deadline - now) / 1000;
        usleep((useconds_t)KOLO_MIN(sleep_us, left_us));
        sleep_us = KOLO_MIN(sleep_us * 2, (uint64_t)100000);
    }
    *out = c;
    return KOLO_OK;

err_free:
    kolo__free(c);
    return st;
}

static int check_key(const kolo__store *c, const char *key)
{
    if (!c) return kolo__err(KOLO_ERR_INVALID_ARG, "store: no connection");
    if (!key || !*key || strlen(key) > MAX_KEY)
        return kolo__err(KOLO_ERR_INVALID_ARG, "store: keys are 1 to %u bytes (got %zu)", MAX_KEY, key ? strlen(key) : 0);
    if (c->broken)
        return kolo__err(KOLO_ERR_PEER_LOST, "the connection to the store at %s was lost by an earlier error", c->where);
    return KOLO_OK;
}

/* Turns a failed I/O into the status of the request; the stream is then out of step. */
static int io_fail(kolo__store *c, int r, const char *key, const char *what)
{
    c->broken = true;
    if (r == IO_EOF) return kolo__err(KOLO_ERR_PEER_LOST, "the store at %s closed the connection (%s '%s')", c->where, what, key);
    if (r == IO_TIMEOUT) return kolo__err(KOLO_ERR_TIMEOUT, "the store at %s did not answer (%s '%s')", c->where, what, key);
    return kolo__err_sys(errno, "store %s: %s '%s'", c->where, what, key);
}

/* Sends one request: header and key, then body parts a and b (either may be empty). */
static int send_request(kolo__store *c, uint8_t op, const char *key, const void *a, size_t alen, uint64_t deadline)
{
    size_t klen = strlen(key);
    uint8_t hdr[6 + MAX_KEY];
    put32(hdr, (uint32_t)(2 + klen + alen));
    hdr[4] = op;
    hdr[5] = (uint8_t)klen;
    memcpy(hdr + 6, key, klen);
    int r = send_all(c->fd, hdr, 6 + klen, alen ? MSG_MORE : 0, deadline);
    if (r == IO_OK && alen) r = send_all(c->fd, a, alen, 0, deadline);
    return r;
}

/* Reads one response; *body (kolo__malloc, NUL-terminated for convenience) unless it is empty. */
static int recv_response(kolo__store *c, const char *key, const char *what, uint64_t deadline, uint8_t *status,
                         uint8_t **body, size_t *len)
{
    uint8_t h[5];
    int r = recv_all(c->fd, h, sizeof(h), deadline);
    if (r != IO_OK) return io_fail(c, r, key, what);
    uint32_t n = get32(h);
    if (n < 1 || n > MAX_RESP || h[4] > ST_NOT_INTEGER) {
        c->broken = true;
        return kolo__err(KOLO_ERR_PROTOCOL, "the store at %s sent a malformed response (%u bytes, status %u) to %s '%s'",
                         c->where, n, h[4], what, key);
    }
    *status = h[4];
    *len = n - 1;
    *body = kolo__malloc(*len + 1);
    if (!*body) {
        c->broken = true;
        return kolo__err(KOLO_ERR_NO_MEMORY, "store: out of memory for a value of %zu bytes", *len);
    }
    r = recv_all(c->fd, *body, *len, deadline);
    if (r != IO_OK) {
        kolo__free(*body);
        *body = NULL;
        return io_fail(c, r, key, what);
    }
    (*body)[*len] = 0;
    return KOLO_OK;
}

static int bad_response(kolo__store *c, const char *key, const char *what, uint8_t st, size_t len)
{
    c->broken = true;
    return kolo__err(KOLO_ERR_PROTOCOL, "the store at %s answered %s '%s' with status %u and %zu bytes", c->where,
                     what, key, st, len);
}

int kolo__store_set(kolo__store *c, const char *key, const void *val, size_t len)
{
    int s = check_key(c, key);
    if (s) return s;
    if (len > MAX_VALUE || (len && !val))
        return kolo__err(KOLO_ERR_INVALID_ARG, "store set '%s': values are at most %u bytes (got %zu%s)", key,
                         MAX_VALUE, len, len && !val ? ", NULL pointer" : "");
    uint64_t deadline = deadline_after(c->io_timeout);
    int r = send_request(c, OP_SET, key, val, len, deadline);
    if (r != IO_OK) return io_fail(c, r, key, "set");
    uint8_t st, *body;
    size_t blen;
    if ((s = recv_response(c, key, "set", deadline, &st, &body, &blen))) return s;
    kolo__free(body);
    if (st != ST_OK || blen != 0) return bad_response(c, key, "set", st, blen);
    return KOLO_OK;
}

int kolo__store_get(kolo__store *c, const char *key, void **val, size_t *len, double timeout_s)
{
    int s = check_key(c, key);
    if (s) return s;
    if (!val || !len || isnan(timeout_s) || timeout_s < 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "store get '%s': %s", key, (!val || !len) ? "NULL output" : "bad timeout");
    double ms = ceil(timeout_s * 1000.0);
    uint32_t tms = ms >= 4294967295.0 ? 4294967295u : (uint32_t)ms;
    uint8_t body4[4];
    put32(body4, tms);
    uint64_t deadline = deadline_after(timeout_s + c->io_timeout);
    int r = send_request(c, OP_GET, key, body4, sizeof(body4), deadline);
    if (r != IO_OK) return io_fail(c, r, key, "get");
    uint8_t st, *body;
    size_t blen;
    if ((s = recv_response(c, key, "get", deadline, &st, &body, &blen))) return s;
    if (st == ST_OK) {
        *val = body;
        *len = blen;
        return KOLO_OK;
    }
    kolo__free(body);
    if (st == ST_TIMEOUT && blen == 0)
        return kolo__err(KOLO_ERR_TIMEOUT, "key '%s' did not appear in the store at %s within %g s", key, c->where,
                         timeout_s);
    return bad_response(c, key, "get", st, blen);
}

int kolo__store_add(kolo__store *c, const char *key, int64_t delta, int64_t *result)
{
    int s = check_key(c, key);
    if (s) return s;
    uint8_t d[8];
    put64(d, (uint64_t)delta);
    uint64_t deadline = deadline_after(c->io_timeout);
    int r = send_request(c, OP_ADD, key, d, sizeof(d), deadline);
    if (r != IO_OK) return io_fail(c, r, key, "add");
    uint8_t st, *body;
    size_t blen;
    if ((s = recv_response(c, key, "add", deadline, &st, &body, &blen))) return s;
    if (st == ST_OK && blen == 8) {
        int64_t v = (int64_t)get64(body);
        kolo__free(body);
        if (result) *result = v;
        return KOLO_OK;
    }
    kolo__free(body);
    if (st == ST_NOT_INTEGER && blen == 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "store add '%s' %+lld: the value is not an integer or the sum overflows",
                         key, (long long)delta);
    return bad_response(c, key, "add", st, blen);
}

void kolo__store_close(kolo__store *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    kolo__free(c);
}
