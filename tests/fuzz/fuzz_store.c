/* fuzz_store.c - the rendezvous store's server (store.c), as strangers and garbling clients reach it.
 *
 * One real server runs on 127.0.0.1 for the whole run, on its own thread as in a job. Each input
 * opens TCP connections to it and writes what the input says; the harness predicts from the
 * protocol (the top of store.c), independently of the server's code, what the server must answer
 * or that it must drop the connection, and abort()s when the server does otherwise. A crash,
 * a hang, a leak, a wrong answer, a dropped client that did nothing wrong, or a server that no
 * longer serves a proper client (the store's own client API, after every input) is a finding.
 *
 * An input's first byte picks one of two modes:
 *   even: a stranger. The rest of the input goes as it is onto one connection, which then
 *         half-closes. The server must close it without a word, or (past a right greeting) after
 *         sending its challenge, whose MAC must be right.
 *   odd:  a script of commands, each a byte (mod 10) and its arguments:
 *     0 OPEN      u8 how: a connection in a free slot (it becomes the current one) that does the
 *                 handshake: how%4 = 0 at once, 1 its greeting in two writes (split at u8),
 *                 2 with a wrong proof (the server must close it), 3 leaving after the challenge
 *     1 STRANGER  u8 how, span raw: raw bytes on a new connection, closed abruptly (how odd) or
 *                 half-closed and checked as in the stranger mode
 *     2 SELECT    u8 slot: the current connection (an empty slot opens on first use)
 *     3 FRAMES    u8 count-1 (mod 4), then each frame: a request the harness lays out (below)
 *     4 RAW       span bytes: onto the current connection's request stream as they are
 *     5 TWEAK     a frame (below), then u8 how: how < 0x80 its length field plus (i8)u8,
 *                 how < 0xff its length field a u32, how 0xff a SET of a value near 16 MiB
 *                 (u8: MAX_VALUE - 4 + u8 bytes) whose length field is right
 *     6 CLOSE     u8 how: the current connection ends: 0 close(), 1 shutdown(SHUT_WR) and the
 *                 server must close it too, 2 a reset (SO_LINGER 0)
 *     7 PAUSE     u8: (u8 % 4) * 0.5 ms, for parked GETs to time out
 *     8 MANY      u8 n, span prefix (<= 8 bytes): 2n + 2 SETs in one write, of keys prefix and a
 *                 2-byte index (the table grows past its buckets beyond 128 keys)
 *     9 FLOOD     u8 n, u8 klen, key: the current connection sets key to (n % 16 + 1) * 16 KiB,
 *                 then sends 64 GETs of it without reading an answer and resets the connection
 *                 (the server's answers back up, and its send() fails)
 *   A frame: u8 op (%4: SET, GET, ADD, an op the server does not know), u8 klen, klen bytes of
 *   key (klen 0 is malformed), then SET: span value; GET: u8 wait (0: none, < 0xc0: %12 ms, else
 *   a long wait of 250 ms per step above 0xbf, which parks the GET until another connection sets
 *   the key or the connection is closed); ADD: u8 d (d < 0x80: delta d - 64, else 8 bytes big-endian);
 *   unknown op: span body.
 *   A span is a u16 length and then as many bytes (fz_span).
 *
 * A request stream is cut by the prediction where the server stops reading it or where what
 * follows would depend on timing: at a frame that must close the connection, after a set that
 * answers a parked GET, and after a GET that parks, except that behind a GET that waits 10 s or
 * more go the requests whose answers cannot depend on when the server reads them (GETs that do
 * not wait, frames that close it). What follows in that input's bytes is not sent. A parked
 * connection is answered when another connection sets its key (the harness reads the answer, and
 * then those behind it, right after that set's), or is closed when the script uses it again
 * before its wait ends.
 *
 * After each input every connection is closed; the store's own client reads back up to 32 keys
 * the input set and sets and reads one of its own; the server must then have freed every
 * connection within 3 s, and its table must hold exactly what the input's prediction holds. The
 * table is then emptied, so that one input does not depend on the ones before it.
 *
 * Not reached: the handshake's deadlines (10 s and 60 s: test_store.c covers them with short
 * ones), the limit of 4096 connections, and the server's out-of-memory paths.
 *
 * The server's functions and struct are static: this file includes store.c itself. Set
 * KOLO_LOG_LEVEL to see the server's warnings (one per dropped connection: silent by default). */
#include "../../src/boot/store.c"

#include "fuzz.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char SECRET[] = "fuzz-store-secret";
#define ALIVE_KEY "fuzz-store-alive"
#define SLOTS 8             /* connections one input holds open at once */
#define MAX_OPENS 24        /* connections one input opens, at most */
#define MAX_MODEL 4096      /* keys one input sets, at most */
#define INLINE_MS 12u       /* a GET that waits at most this long is waited for in line */
#define INLINE_PARKS 3      /* ... at most this many times per input; others park */
#define PIPE_MS 10000u      /* a GET that waits this long may have requests sent behind it */
#define ANSWER_S 3.0        /* seconds the server has for any answer it owes */

static kolo__store_server *srv;
static int srv_port;

KOLO_PRINTF(1, 2) static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_store: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

#define FZ_PEER "the server"
#include "fuzz_net.h"

/* ---------------------------------------------------------------- growing byte buffer */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void buf_put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) fail("out of memory growing a buffer to %zu bytes", cap);
        b->p = q;
        b->cap = cap;
    }
    if (n && p) memcpy(b->p + b->n, p, n); /* p NULL: room only, the caller fills it */
    b->n += n;
}

static void buf_put32(buf *b, uint32_t v)
{
    uint8_t q[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    buf_put(b, q, 4);
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint8_t *dup_bytes(const uint8_t *p, size_t n)
{
    uint8_t *q = malloc(n ? n : 1);
    if (!q) fail("out of memory copying %zu bytes", n);
    if (n) memcpy(q, p, n);
    return q;
}

/* ---------------------------------------------------------------- the prediction's table */

typedef struct mentry {
    uint8_t key[MAX_KEY];
    uint8_t klen;
    uint8_t *val;
    size_t len;
} mentry;

static mentry model[MAX_MODEL];
static size_t nmodel;

static mentry *model_get(const uint8_t *k, size_t n)
{
    for (size_t i = 0; i < nmodel; i++)
        if (model[i].klen == n && memcmp(model[i].key, k, n) == 0) return &model[i];
    return NULL;
}

static void model_set(const uint8_t *k, size_t n, const uint8_t *v, size_t len)
{
    mentry *e = model_get(k, n);
    if (!e) {
        if (nmodel == MAX_MODEL) fail("more than %d keys in one input", MAX_MODEL);
        e = &model[nmodel++];
        memcpy(e->key, k, n);
        e->klen = (uint8_t)n;
    } else {
        free(e->val);
    }
    e->val = dup_bytes(v, len);
    e->len = len;
}

static void model_clear(void)
{
    for (size_t i = 0; i < nmodel; i++) free(model[i].val);
    nmodel = 0;
}

/* The protocol's integer: decimal, an optional '-', at most 31 characters, within int64. */
static bool model_int(const uint8_t *v, size_t n, int64_t *out)
{
    if (n == 0 || n > 31) return false;
    bool neg = v[0] == '-';
    size_t i = neg;
    if (i == n) return false;
    uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, acc = 0;
    for (; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return false;
        uint64_t d = (uint64_t)(v[i] - '0');
        if (acc > (lim - d) / 10) return false;
        acc = acc * 10 + d;
    }
    *out = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
    return true;
}

/* ---------------------------------------------------------------- sockets */


/* The server must close fd, saying nothing more. */
static void expect_eof(int fd, const char *what)
{
    uint8_t b[64];
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    for (;;) {
        ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r == 0) return;
        if (r > 0)
            fail("%s: the server sent %zd bytes (first 0x%02x) instead of closing the connection", what, r, b[0]);
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return;
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail("%s: recv: %s", what, strerror(errno));
        uint64_t now = kolo__now_ns();
        if (now >= deadline) fail("%s: the server did not close the connection within %g s", what, ANSWER_S);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
    }
}

/* ---------------------------------------------------------------- strangers */

/* Raw bytes on a new connection. Checked (unless abrupt): the server closes at a wrong magic or a
 * short greeting without a word, and past a whole greeting after a challenge that proves the
 * secret (the proof that follows cannot be right: it would need the server's fresh nonce). */
static void stranger(const uint8_t *raw, size_t n, bool abrupt)
{
    int fd = dial(srv_port);
    send_bytes(fd, raw, n);
    if (abrupt) {
        close(fd);
        return;
    }
    shutdown(fd, SHUT_WR);
    size_t m = KOLO_MIN(n, (size_t)MAGIC_LEN);
    if (memcmp(raw, MAGIC, m) == 0 && n >= HELLO_LEN) {
        uint8_t ch[CHALLENGE_LEN], want[KOLO_MAC_LEN];
        int r = read_full(fd, ch, sizeof(ch), ANSWER_S);
        if (r != RD_OK)
            fail("stranger with a whole greeting: %s instead of the challenge", r == RD_EOF ? "closed" : "no answer");
        if (memcmp(ch, MAGIC, MAGIC_LEN) != 0) fail("stranger: the challenge has the wrong magic");
        if (hs_mac(want, SECRET, strlen(SECRET), LABEL_SERVER, raw + MAGIC_LEN, ch + MAGIC_LEN) != KOLO_OK)
            fail("hmac: %s", kolo__errmsg());
        if (!kolo__mac_equal(want, ch + MAGIC_LEN + KOLO_NONCE_LEN)) fail("stranger: the challenge's MAC is wrong");
    }
    expect_eof(fd, "stranger");
    close(fd);
}

/* ---------------------------------------------------------------- clients */

typedef struct expect {
    uint8_t status;
    uint8_t *body;
    size_t len;
} expect;

typedef struct slot {
    int fd;                 /* -1: free */
    buf pend;               /* sent bytes the server has not taken yet: a frame it does not have
                             * whole, or the requests pipelined behind a parked GET */
    bool parked;            /* a GET waits on the server for wkey */
    uint8_t wkey[MAX_KEY], wklen;
    uint64_t park_ns;       /* when its GET was sent */
    uint32_t park_ms;
    bool woken;             /* a set of wkey has been sent: its answer is wake */
    expect wake;
} slot;

static slot slots[SLOTS];
static int cur, opens, inline_parks;
static uint32_t nonce_counter;

static void slot_close(slot *h, int how)
{
    if (h->fd < 0) return;
    if (how == 1 && !h->parked) {
        shutdown(h->fd, SHUT_WR);
        expect_eof(h->fd, h->pend.n ? "closed in the middle of a frame" : "closed between frames");
    }
    if (how == 2) close_reset(h->fd);
    else close(h->fd);
    h->fd = -1;
    free(h->pend.p);
    h->pend = (buf){0};
    h->parked = h->woken = false;
    free(h->wake.body);
    h->wake.body = NULL;
}

/* The handshake of a proper client (how 0, 1), a wrong proof (2) or one that leaves (3).
 * Returns the socket of an authenticated connection, or -1 for the last two. */
static int handshake(fz *f, uint8_t how)
{
    int fd = dial(srv_port);
    uint8_t hello[HELLO_LEN], ch[CHALLENGE_LEN], mac[KOLO_MAC_LEN], ack[ACK_LEN];
    memcpy(hello, MAGIC, MAGIC_LEN);
    memset(hello + MAGIC_LEN, 0x5a, KOLO_NONCE_LEN);
    put32(hello + MAGIC_LEN, ++nonce_counter);
    if (how % 4 == 1) {
        size_t at = 1 + fz_u8(f) % (HELLO_LEN - 1);
        send_bytes(fd, hello, at);
        usleep(100); /* so that the server is likely to read the first part alone */
        send_bytes(fd, hello + at, HELLO_LEN - at);
    } else {
        send_bytes(fd, hello, HELLO_LEN);
    }
    int r = read_full(fd, ch, sizeof(ch), ANSWER_S);
    if (r != RD_OK) fail("handshake: %s instead of the challenge", r == RD_EOF ? "closed" : "no answer");
    if (memcmp(ch, MAGIC, MAGIC_LEN) != 0) fail("handshake: the challenge has the wrong magic");
    if (hs_mac(mac, SECRET, strlen(SECRET), LABEL_SERVER, hello + MAGIC_LEN, ch + MAGIC_LEN) != KOLO_OK)
        fail("hmac: %s", kolo__errmsg());
    if (!kolo__mac_equal(mac, ch + MAGIC_LEN + KOLO_NONCE_LEN)) fail("handshake: the challenge's MAC is wrong");
    if (how % 4 == 3) {
        close(fd);
        return -1;
    }
    if (hs_mac(mac, SECRET, strlen(SECRET), LABEL_CLIENT, hello + MAGIC_LEN, ch + MAGIC_LEN) != KOLO_OK)
        fail("hmac: %s", kolo__errmsg());
    if (how % 4 == 2) {
        uint8_t bit = fz_u8(f);
        mac[bit % KOLO_MAC_LEN] ^= (uint8_t)(1u << (bit / KOLO_MAC_LEN % 8));
    }
    send_bytes(fd, mac, sizeof(mac));
    if (how % 4 == 2) {
        expect_eof(fd, "wrong proof of the secret");
        close(fd);
        return -1;
    }
    r = read_full(fd, ack, sizeof(ack), ANSWER_S);
    if (r != RD_OK) fail("handshake: %s instead of the acceptance", r == RD_EOF ? "closed" : "no answer");
    if (memcmp(ack, ACK, ACK_LEN) != 0) fail("handshake: the acceptance is not KSOK");
    return fd;
}

static void open_slot(fz *f, uint8_t how)
{
    if (opens >= MAX_OPENS) return;
    opens++;
    int fd = handshake(f, how);
    if (fd < 0) return;
    int i = 0;
    while (i < SLOTS && slots[i].fd >= 0) i++;
    if (i == SLOTS) {
        i = (cur + 1) % SLOTS;
        slot_close(&slots[i], 0);
    }
    slots[i].fd = fd;
    cur = i;
}

/* Reads one response and compares it with e. A GET's parked answer may instead be TIMEOUT once
 * its wait has passed (timeout_ok). */
static void expect_answer(slot *h, const expect *e, const char *what, bool timeout_ok)
{
    uint8_t hd[5];
    int r = read_full(h->fd, hd, sizeof(hd), ANSWER_S);
    if (r != RD_OK)
        fail("%s: %s instead of a response (status %u, %zu bytes)", what,
             r == RD_EOF ? "the server closed the connection" : "no response", e->status, e->len);
    uint32_t n = rd32(hd);
    if (timeout_ok && hd[4] == ST_TIMEOUT && n == 1) return;
    if (hd[4] != e->status || n != 1 + e->len)
        fail("%s: response of status %u and %u bytes, expected status %u and %zu bytes", what, hd[4], n - 1,
             e->status, e->len);
    uint8_t *body = malloc(e->len ? e->len : 1);
    if (!body) fail("out of memory");
    r = read_full(h->fd, body, e->len, ANSWER_S);
    if (r != RD_OK) fail("%s: the response's body did not come whole", what);
    if (e->len && memcmp(body, e->body, e->len) != 0) fail("%s: the response's body differs from the value", what);
    free(body);
}

enum { OUT_KEEP, OUT_DROP, OUT_PARK };

/* A set of k answers the GETs parked on it: returns how many. */
static int wake(slot *self, const uint8_t *k, size_t n)
{
    const mentry *e = model_get(k, n);
    int woke = 0;
    for (int i = 0; i < SLOTS; i++) {
        slot *w = &slots[i];
        if (w == self || w->fd < 0 || !w->parked || w->woken || w->wklen != n || memcmp(w->wkey, k, n) != 0) continue;
        w->woken = true;
        w->wake = (expect){ST_OK, dup_bytes(e->val, e->len), e->len};
        woke++;
    }
    return woke;
}

/* The requests a client may send behind a GET that parks for at least PIPE_MS, from at: frames
 * whose answers cannot depend on when the server gets to them (GETs that do not wait, and frames
 * the server closes at), up to the first other one; a frame still incomplete at the end. Returns
 * where they end. Longer than any input runs, the wait never ends within one. */
static size_t pipelined_after_park(const buf *s, size_t at)
{
    while (s->n - at >= 4) {
        uint32_t len = rd32(s->p + at);
        if (len < 2 || len > MAX_REQ) return at + 4;
        if (s->n - at - 4 < len) return s->n;
        const uint8_t *fr = s->p + at + 4;
        bool closes = fr[1] == 0 || 2u + fr[1] > len || fr[0] < OP_SET || fr[0] > OP_ADD ||
                      (fr[0] == OP_GET && len - 2u - fr[1] != 4) || (fr[0] == OP_ADD && len - 2u - fr[1] != 8) ||
                      (fr[0] == OP_SET && len - 2u - fr[1] > MAX_VALUE);
        if (!closes && (fr[0] != OP_GET || rd32(fr + 2 + fr[1]) != 0)) return at;
        at += 4 + len;
        if (closes) return at;
    }
    return s->n;
}

/* A parked connection the script uses again: read its answer when its wait is over or nearly,
 * else close it (a client that gives up waiting). */
static void unpark(slot *h)
{
    uint64_t due = h->park_ns + (uint64_t)h->park_ms * 1000000u, now = kolo__now_ns();
    if (due > now + INLINE_MS * 1000000ull) {
        slot_close(h, 0);
        return;
    }
    expect t = {ST_TIMEOUT, NULL, 0};
    expect_answer(h, &t, "a parked GET's timeout", false);
    if (kolo__now_ns() < due) fail("a GET that waits %u ms timed out early", h->park_ms);
    h->parked = false;
}

/* Sends bytes on slot idx's request stream and checks what the server does with them and with
 * what was sent before and not yet taken, predicted from the protocol: answers, a drop, or a
 * parked GET. A set that answers a parked GET ends what is sent (the server takes that GET's
 * connection's next requests in its next round, after this connection's); the parked
 * connections' answers and their own pipelined requests are checked after this one's. */
static void run_stream(int idx, const uint8_t *bytes, size_t nbytes)
{
    slot *h = &slots[idx];
    buf s = {0};
    buf_put(&s, h->pend.p, h->pend.n);
    buf_put(&s, bytes, nbytes);
    size_t sent = h->pend.n, p = 0, cut = s.n, nexp = 0, cap = 0;
    expect *ex = NULL;
    int out = OUT_KEEP, woke = 0;
    uint32_t park_ms = 0;
    const char *why = "";
    while (s.n - p >= 4) {
        uint32_t len = rd32(s.p + p);
        if (len < 2 || len > MAX_REQ) {
            out = OUT_DROP;
            cut = p + 4;
            why = "a frame length out of range";
            break;
        }
        if (s.n - p - 4 < len) break; /* the rest of the frame is still to come */
        const uint8_t *fr = s.p + p + 4, *key = fr + 2;
        uint8_t op = fr[0], klen = fr[1];
        size_t end = p + 4 + len;
        if (nexp == cap) {
            cap = cap ? 2 * cap : 8;
            ex = realloc(ex, cap * sizeof(*ex));
            if (!ex) fail("out of memory");
        }
        expect *e = &ex[nexp];
        *e = (expect){0};
        if (klen == 0 || 2u + klen > len) {
            out = OUT_DROP;
            why = "a malformed key length";
        } else {
            const uint8_t *rest = key + klen;
            size_t restlen = len - 2u - klen;
            int64_t d, curv = 0, sum;
            mentry *m = model_get(key, klen);
            if (op == OP_SET && restlen <= MAX_VALUE) {
                model_set(key, klen, rest, restlen);
                woke += wake(h, key, klen);
                nexp++;
            } else if (op == OP_GET && restlen == 4) {
                uint32_t ms = rd32(rest);
                if (m) {
                    *e = (expect){ST_OK, dup_bytes(m->val, m->len), m->len};
                    nexp++;
                } else if (ms == 0 || (ms <= INLINE_MS && inline_parks < INLINE_PARKS)) {
                    inline_parks += ms != 0;
                    e->status = ST_TIMEOUT;
                    nexp++;
                } else {
                    out = OUT_PARK;
                    park_ms = ms;
                    memcpy(h->wkey, key, klen);
                    h->wklen = klen;
                }
            } else if (op == OP_ADD && restlen == 8) {
                d = (int64_t)((uint64_t)rd32(rest) << 32 | rd32(rest + 4));
                if ((m && !model_int(m->val, m->len, &curv)) || __builtin_add_overflow(curv, d, &sum)) {
                    e->status = ST_NOT_INTEGER;
                } else {
                    char text[32];
                    int tn = snprintf(text, sizeof(text), "%lld", (long long)sum);
                    model_set(key, klen, (const uint8_t *)text, (size_t)tn);
                    woke += wake(h, key, klen);
                    uint8_t r8[8];
                    put64(r8, (uint64_t)sum);
                    *e = (expect){ST_OK, dup_bytes(r8, 8), 8};
                }
                nexp++;
            } else {
                out = OUT_DROP;
                why = op == OP_SET    ? "a value over 16 MiB"
                      : op <= OP_ADD ? "a body of the wrong size"
                                     : "an unknown op";
            }
        }
        p = end;
        if (out == OUT_PARK && park_ms >= PIPE_MS) {
            cut = KOLO_MAX(pipelined_after_park(&s, end), sent);
            break;
        }
        if (out != OUT_KEEP || woke) {
            cut = KOLO_MAX(end, sent);
            break;
        }
    }
    uint64_t t_send = kolo__now_ns();
    if (cut > sent) send_bytes(h->fd, s.p + sent, cut - sent);
    char what[96];
    for (size_t i = 0; i < nexp; i++) {
        snprintf(what, sizeof(what), "response %zu of %zu to a batch on slot %d", i + 1, nexp, idx);
        expect_answer(h, &ex[i], what, false);
        free(ex[i].body);
    }
    free(ex);
    if (out == OUT_DROP) {
        snprintf(what, sizeof(what), "slot %d sent %s", idx, why);
        expect_eof(h->fd, what);
        slot_close(h, 0);
    } else if (out == OUT_PARK) {
        h->parked = true;
        h->park_ns = t_send;
        h->park_ms = park_ms;
        h->pend.n = 0;
        if (cut > p) buf_put(&h->pend, s.p + p, cut - p);
    } else {
        h->pend.n = 0;
        if (cut > p) buf_put(&h->pend, s.p + p, cut - p);
    }
    free(s.p);
    /* the parked GETs this batch's sets answered */
    for (int i = 0; i < SLOTS; i++) {
        slot *w = &slots[i];
        if (w->fd < 0 || !w->woken) continue;
        bool late = kolo__now_ns() >= w->park_ns + (uint64_t)w->park_ms * 1000000u;
        snprintf(what, sizeof(what), "the parked GET on slot %d, its key set by slot %d", i, idx);
        expect_answer(w, &w->wake, what, late);
        free(w->wake.body);
        w->wake.body = NULL;
        w->woken = w->parked = false;
        if (w->pend.n) run_stream(i, NULL, 0); /* what it pipelined behind the GET */
    }
}

/* Bytes onto the current connection (opened first if its slot is empty). */
static void send_stream(const uint8_t *bytes, size_t nbytes)
{
    slot *h = &slots[cur];
    if (h->fd < 0) {
        static const uint8_t nothing[1];
        fz none = {nothing, 0};
        open_slot(&none, 0);
        h = &slots[cur];
        if (h->fd < 0) return;
    }
    if (h->parked) {
        unpark(h);
        if (h->fd < 0) return;
    }
    run_stream(cur, bytes, nbytes);
}

/* One frame as the script lays it out (see the top), appended to b. */
static void frame(fz *f, buf *b)
{
    uint8_t opc = fz_u8(f), klen = fz_u8(f), key[MAX_KEY];
    fz_bytes(f, key, klen);
    buf body = {0};
    uint8_t op = opc % 4 == 3 ? (uint8_t)(opc | 4) : (uint8_t)(opc % 4 + 1);
    if (op == OP_SET || op > OP_ADD) {
        size_t n;
        const uint8_t *v = fz_span(f, op == OP_SET ? 1024 : 64, &n);
        buf_put(&body, v, n);
    } else if (op == OP_GET) {
        uint8_t w = fz_u8(f);
        buf_put32(&body, w == 0 ? 0 : w < 0xc0 ? w % 12u : 250u * (w - 0xbfu));
    } else {
        uint8_t d = fz_u8(f), q[8];
        if (d < 0x80) {
            put64(q, (uint64_t)((int64_t)d - 64));
        } else {
            fz_bytes(f, q, 8);
        }
        buf_put(&body, q, 8);
    }
    buf_put32(b, (uint32_t)(2 + klen + body.n));
    buf_put(b, &op, 1);
    buf_put(b, &klen, 1);
    buf_put(b, key, klen);
    buf_put(b, body.p, body.n);
    free(body.p);
}

/* A SET of a value near the 16 MiB limit, under a key of u8 % 4 + 1 bytes. */
static void big_set(fz *f, buf *b)
{
    uint8_t klen = (uint8_t)(fz_u8(f) % 4 + 1), key[4] = {'b', 'i', 'g', '!'};
    size_t vlen = MAX_VALUE - 4 + fz_u8(f);
    buf_put32(b, (uint32_t)(2 + klen + vlen));
    uint8_t hd[2] = {OP_SET, klen};
    buf_put(b, hd, 2);
    buf_put(b, key, klen);
    size_t at = b->n;
    buf_put(b, NULL, vlen);
    memset(b->p + at, 'v', vlen);
}

/* MANY (see the top): distinct keys, to grow the table. */
static void many(fz *f)
{
    size_t count = 2 * (size_t)fz_u8(f) + 2, plen;
    const uint8_t *prefix = fz_span(f, 8, &plen);
    if (nmodel + count > MAX_MODEL - 1100) return; /* room for what the rest of a 4 KiB input sets */
    buf b = {0};
    for (size_t i = 0; i < count; i++) {
        uint8_t hd[2] = {OP_SET, (uint8_t)(plen + 2)}, ix[2] = {(uint8_t)(i >> 8), (uint8_t)i};
        char v[8];
        int vn = snprintf(v, sizeof(v), "%zu", i);
        buf_put32(&b, (uint32_t)(2 + plen + 2 + (size_t)vn));
        buf_put(&b, hd, 2);
        buf_put(&b, prefix, plen);
        buf_put(&b, ix, 2);
        buf_put(&b, v, (size_t)vn);
    }
    send_stream(b.p, b.n);
    free(b.p);
}

/* FLOOD (see the top): answers the client never reads, then a reset. */
static void flood(fz *f)
{
    uint8_t n = fz_u8(f), klen = (uint8_t)(fz_u8(f) | 1), key[MAX_KEY];
    fz_bytes(f, key, klen);
    size_t vlen = (n % 16u + 1) * 16384u;
    buf b = {0};
    buf_put32(&b, (uint32_t)(2 + klen + vlen));
    uint8_t hd[2] = {OP_SET, klen};
    buf_put(&b, hd, 2);
    buf_put(&b, key, klen);
    buf_put(&b, NULL, vlen);
    memset(b.p + b.n - vlen, 'f', vlen);
    send_stream(b.p, b.n);
    slot *h = &slots[cur];
    if (h->fd < 0 || h->parked || h->pend.n) { /* the SET did not leave a clean stream: no flood */
        free(b.p);
        return;
    }
    b.n = 0;
    for (int i = 0; i < 64; i++) {
        uint8_t gh[2] = {OP_GET, klen}, ms[4] = {0};
        buf_put32(&b, (uint32_t)(2 + klen + 4));
        buf_put(&b, gh, 2);
        buf_put(&b, key, klen);
        buf_put(&b, ms, 4);
    }
    /* what the socket takes now: the server stops reading once its answers back up */
    size_t off = 0;
    while (off < b.n) {
        ssize_t w = send(h->fd, b.p + off, b.n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) break;
        off += (size_t)w;
    }
    usleep(200); /* for the server to fill its side */
    free(b.p);
    slot_close(h, 2);
}

static void script(fz *f)
{
    while (f->n) {
        uint8_t cmd = fz_u8(f) % 10;
        buf b = {0};
        switch (cmd) {
        case 0:
            open_slot(f, fz_u8(f));
            break;
        case 1: {
            uint8_t how = fz_u8(f);
            size_t n;
            const uint8_t *raw = fz_span(f, 1024, &n);
            if (opens < MAX_OPENS) {
                opens++;
                stranger(raw, n, how & 1);
            }
            break;
        }
        case 2:
            cur = fz_u8(f) % SLOTS;
            break;
        case 3: {
            int count = 1 + fz_u8(f) % 4;
            for (int i = 0; i < count; i++) frame(f, &b);
            send_stream(b.p, b.n);
            break;
        }
        case 4: {
            size_t n;
            const uint8_t *raw = fz_span(f, 1024, &n);
            send_stream(raw, n);
            break;
        }
        case 5: {
            frame(f, &b);
            uint8_t how = fz_u8(f);
            if (how < 0x80) {
                put32(b.p, rd32(b.p) + (uint32_t)(int32_t)(int8_t)fz_u8(f));
            } else if (how < 0xff) {
                uint8_t q[4];
                fz_bytes(f, q, 4);
                memcpy(b.p, q, 4);
            } else {
                b.n = 0;
                big_set(f, &b);
            }
            send_stream(b.p, b.n);
            break;
        }
        case 6:
            if (slots[cur].fd >= 0) slot_close(&slots[cur], fz_u8(f) % 3);
            break;
        case 8:
            many(f);
            break;
        case 9:
            flood(f);
            break;
        default:
            usleep((useconds_t)(fz_u8(f) % 4 * 500));
            break;
        }
        free(b.p);
    }
}

/* ---------------------------------------------------------------- after each input */

/* The server has freed every connection of the input. */
static void wait_drained(void)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    for (;;) {
        pthread_mutex_lock(&srv->busy);
        size_t n = srv->nconns;
        pthread_mutex_unlock(&srv->busy);
        if (n == 0) return;
        if (kolo__now_ns() >= deadline)
            fail("%zu connections still open on the server %g s after every client closed", n, ANSWER_S);
        usleep(50);
    }
}

/* The table holds what the prediction holds; then both are emptied. */
static void check_and_reset_table(void)
{
    pthread_mutex_lock(&srv->busy);
    size_t count = 0;
    for (size_t b = 0; b < srv->nbuckets; b++)
        for (entry *e = srv->tab[b]; e; e = e->next) count++;
    if (count != srv->nentries) fail("the table holds %zu entries but counts %zu", count, srv->nentries);
    if (count != nmodel) fail("the table holds %zu keys, the protocol says %zu", count, nmodel);
    for (size_t i = 0; i < nmodel; i++) {
        entry *e = lookup(srv, model[i].key, model[i].klen);
        if (!e) fail("key %zu of the input (%u bytes) is missing from the table", i, model[i].klen);
        if (e->len != model[i].len || (e->len && memcmp(e->val, model[i].val, e->len) != 0))
            fail("key %zu of the input: the table holds %zu bytes, the protocol says %zu", i, e->len, model[i].len);
    }
    for (size_t b = 0; b < srv->nbuckets; b++) {
        entry *e = srv->tab[b];
        while (e) {
            entry *next = e->next;
            kolo__free(e->val);
            kolo__free(e);
            e = next;
        }
    }
    kolo__free(srv->tab);
    srv->nbuckets = 64;
    srv->tab = kolo__calloc(srv->nbuckets, sizeof(*srv->tab));
    if (!srv->tab) fail("out of memory resetting the table");
    srv->nentries = 0;
    pthread_mutex_unlock(&srv->busy);
    model_clear();
}

/* A proper client, through the store's own API, still gets served and reads what the input set. */
static void check_serves(void)
{
    kolo__store *c = NULL;
    if (kolo__store_connect(&c, "127.0.0.1", srv_port, SECRET, strlen(SECRET), ANSWER_S) != KOLO_OK)
        fail("a proper client cannot connect: %s", kolo__errmsg());
    int checked = 0;
    for (size_t i = 0; i < nmodel && checked < 32; i++) {
        char key[MAX_KEY + 1];
        if (memchr(model[i].key, 0, model[i].klen)) continue; /* the API's keys are strings */
        memcpy(key, model[i].key, model[i].klen);
        key[model[i].klen] = 0;
        void *v = NULL;
        size_t n = 0;
        if (kolo__store_get(c, key, &v, &n, 0) != KOLO_OK)
            fail("a proper client cannot read key %zu of the input: %s", i, kolo__errmsg());
        if (n != model[i].len || (n && memcmp(v, model[i].val, n) != 0))
            fail("a proper client reads %zu bytes for key %zu of the input, which set %zu", n, i, model[i].len);
        kolo__free(v);
        checked++;
    }
    if (kolo__store_set(c, ALIVE_KEY, "yes", 3) != KOLO_OK) fail("a proper client cannot set: %s", kolo__errmsg());
    void *v = NULL;
    size_t n = 0;
    if (kolo__store_get(c, ALIVE_KEY, &v, &n, 1.0) != KOLO_OK)
        fail("a proper client cannot get: %s", kolo__errmsg());
    if (n != 3 || memcmp(v, "yes", 3) != 0) fail("a proper client reads back %zu bytes instead of 'yes'", n);
    kolo__free(v);
    kolo__store_close(c);
    model_set((const uint8_t *)ALIVE_KEY, strlen(ALIVE_KEY), (const uint8_t *)"yes", 3);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (getenv("KOLO_LOG_LEVEL")) kolo__log_init();
    else kolo__log_level = KOLO_LOG_NONE; /* a warning per dropped connection would drown the fuzzer's output */
    signal(SIGPIPE, SIG_IGN);
    if (kolo__store_server_start(&srv, "127.0.0.1", 0, SECRET, strlen(SECRET)) != KOLO_OK)
        fail("cannot start the store: %s", kolo__errmsg());
    srv_port = kolo__store_server_port(srv);
    for (int i = 0; i < SLOTS; i++) slots[i].fd = -1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint8_t mode = fz_u8(&f);
    cur = opens = inline_parks = 0;
    if (mode % 2 == 0) stranger(f.p, f.n, false);
    else script(&f);
    for (int i = 0; i < SLOTS; i++) slot_close(&slots[i], 0);
    check_serves();
    wait_drained();
    check_and_reset_table();
    return 0;
}
