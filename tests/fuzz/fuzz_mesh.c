/* fuzz_mesh.c - the start-up mesh handshake (mesh.c), as strangers and garbled peers reach a real rank.
 *
 * Each input is a job of 2 or 3 ranks of which one, R, is real: it runs kolo__mesh_build, the
 * start-up kolo_init runs, on a thread of its own, against a real rendezvous store (store.c, a
 * fresh server on 127.0.0.1, port 0, for every input). The harness plays every other rank and
 * any number of strangers. It publishes the other ranks' address records in the store before R
 * arrives (each names a listening socket of the harness, this process's pid, and either R's host
 * key, so that R offers shared memory to it, or another host's), so that R finds the records
 * whole at once and goes straight to the handshakes: R accepts from the ranks above it and
 * connects to the ranks below it, one connection per channel. The harness, holding the job's
 * secret, can answer either way rightly or wrongly, and predicts from the protocol (the top of
 * mesh.c), not from mesh.c's code, what R must answer, when it must refuse a connection (close
 * it without a word and go on) and when it must fail its start-up, and with which status:
 *
 *   - a connection to R that does not send a whole greeting with the magic KOLOMSH6, a rank
 *     above R's and below the size, a channel below KOLO_NCHANNELS, a pair not connected yet, and
 *     the MAC of the connect label over job, R's nonce, rank, channel and R, is refused; R goes on;
 *   - a right greeting gets the acceptance: the MAC of the accept label over the connector's
 *     nonce, a transport offer (shared memory only to a rank of R's host key), R's pid and its CMA
 *     probe; then R waits for the connector's result and answers it with its own CMA verdict,
 *     which may say yes only where shared memory was offered and taken and R could read the
 *     probe the connector named; a connector that hangs up in between fails R's start-up
 *     (KOLO_ERR_STARTUP naming its rank), one whose result says it took shared memory R did not
 *     offer fails it with KOLO_ERR_PROTOCOL naming the rank and its address;
 *   - towards a rank below it R connects and must prove itself (its greeting checked as above);
 *     an acceptor's greeting of another wire version fails R with KOLO_ERR_PROTOCOL saying so, a
 *     wrong magic or rank with KOLO_ERR_PROTOCOL, a wrong acceptance MAC with KOLO_ERR_AUTH, each
 *     naming the rank and the address it published; an acceptor that hangs up before accepting
 *     is connected to again (it may have closed R's connection for room: see mesh.c), one that
 *     hangs up after fails R with KOLO_ERR_STARTUP naming the rank. Offered a segment that does
 *     not exist, R must go by TCP.
 *
 * When the input ends without a failure predicted, the harness completes every handshake still
 * open rightly, and R must then succeed with exactly the predicted mesh: on every channel one
 * connection per other rank, whose socket is the very one the harness completed that pair's
 * handshake on (a stranger's or a refused connection never takes a place), by shared memory
 * exactly where R offered it and the connector took it, by TCP elsewhere; the peers' records as
 * published. Either way, after R returns: every stranger's connection is closed, R's listening
 * port is closed, no segment of this process is left in /dev/shm, and once the store is stopped
 * the process holds exactly the descriptors it held before the input.
 *
 * The input's first byte shapes the job: bit 0 the size (2 or 3), bits 1-3 R (mod the size),
 * bits 4-6 which ranks publish R's host key. Then commands, each a byte (mod 5) and its arguments:
 *   0 STRANGER  u8 how, span raw (<= 200 bytes): a new connection to R that reads R's greeting
 *               first (how bit 0) or not, writes raw, and then (how >> 1 & 3) half-closes (R must
 *               close it), closes, resets, or stays silent until the end.
 *   1 CONNECT   u8 rank, u8 channel, u8 mut, a u32 rank where rank has bit 7 (else rank mod 4),
 *               a u32 channel where channel has bit 7 (else channel mod 4), then mut's arguments:
 *               a connection to R that reads its greeting and answers as that rank on that
 *               channel, mut % 9: 0 rightly, 1 magic of another version (u8), 2 a magic of 8
 *               bytes, 3 one MAC bit flipped (u8), 4 a MAC over a zero nonce, 5 under the accept
 *               label, 6 binding another acceptor rank, 7 under another secret, 8 only u8 % 80
 *               bytes of the right greeting and then u8 as STRANGER's end. With mut bit 4 a span
 *               (<= 40 bytes) follows a whole greeting in the same write: R reads what follows an
 *               accepted greeting as the start of the result.
 *   2 RESULT    u8 pick, u8 flags, then per flags: the result on a pair R accepted and waits on
 *               (pick among them): shared memory taken (flags & 3: 0, 1, a u32, 1), the CMA
 *               verdict (>> 2 & 3: the same), the probe (>> 4 & 3: this process's own, right
 *               address and wrong value, a u64 address and value, R's own probe); flags bit 6:
 *               only u8 % 24 bytes, then a close (a reset with bit 7), else a span (<= 40 bytes)
 *               of trailing bytes.
 *   3 ACCEPT    u8 rank, u8 mut, ...: takes R's next connection to a rank below it (rank mod
 *               R), greets it (mut % 7: 0 rightly, 1 another version (u8), 2 a wrong magic, 3
 *               another rank (u8), 4 u8 % 44 bytes and a close, 5 a close at once, 6 rightly but
 *               a close after R's greeting), checks R's greeting, then u8 ack, u8 offer, the
 *               offer's arguments and the ack's: the offer (% 4: none; a span (<= 96 bytes) as
 *               segment name; a well-formed name of no segment; a u32 offer and a span), the MAC
 *               (% 6: right, a bit flipped (u8), the connect label, another channel's, u8 % 152
 *               bytes and a close, a close); checks R's result (no shared memory), and sends u8
 *               final (% 4: 0, 1, a u32, u8 % 4 bytes and a close). The closes before the
 *               acceptance (mut 4-6, MAC 4-5) are hang-ups R answers by connecting again; past
 *               CONNECT_HANGUPS_MAX - 2 on one rank they are played as the proper step instead.
 *   4 PAUSE     u8: (u8 % 4) * 250 us.
 *   A span is a u16 length and then as many bytes (fz_span). A command whose preconditions do
 *   not hold (no pair waiting, no rank below R, every pair done: R's port closed) is skipped;
 *   after a command that must fail R's start-up the rest of the input is not used.
 *
 * Not reached: the greeting deadline (5 s) and KOLO_START_TIMEOUT (10 s here: never reached,
 * and a start-up that ends by it is a finding), which test_faults.c covers with short ones; a
 * rendezvous whose records are garbled (fuzz_store.c covers the store); a real segment offered
 * by a peer (R never takes shared memory as connector here); an elastic round superseded.
 *
 * mesh.c's functions are static: this file includes mesh.c itself. Set KOLO_LOG_LEVEL to see R's
 * warnings (one per refused connection: silent by default), KOLO_FUZZ_VERBOSE for how each input
 * ended. */
#include "../../src/net/mesh.c"

#include "fuzz.h"

#include <dirent.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);


static const char SECRET[] = "fuzz-mesh-secret";
static const char JOB[] = "fuzz-mesh-job";
#define NMAX 3
#define NCH KOLO_NCHANNELS
#define MAX_CONNS 16      /* connections one input opens to R, at most */
#define MAX_SILENT 4      /* of them left silent until the end, at most */
#define ANSWER_S 5.0      /* seconds R has for any answer it owes */
#define START_S 10.0      /* KOLO_START_TIMEOUT: never reached by an input */

KOLO_PRINTF(1, 2) static _Noreturn void fail(const char *fmt, ...);
#define FZ_PEER "R"
#include "fuzz_net.h"
#include "fuzz_rank.h"

/* the wire as fuzz_rank.h has it, from the protocol at the top of mesh.c */
_Static_assert(W_HELLO_A == HELLO_A_LEN && W_HELLO_C == HELLO_C_LEN && W_ACK == ACK_LEN && W_RESULT == RESULT_LEN &&
                   W_FINAL == FINAL_LEN && W_NAME == SHM_NAME_LEN,
               "the harness's wire differs from mesh.c's");

/* ---------------------------------------------------------------- the real rank */

/* What R did, for a finding's message. */
static const char *rr_state(void)
{
    static char s[1200];
    if (!atomic_load(&rr.done)) return "R is still starting";
    snprintf(s, sizeof(s), "R ended with %s: '%s'", kolo_strerror(rr.st), rr.msg);
    return s;
}

static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_mesh: rank %d of %d: ", rr.wi.rank, rr.wi.size);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (%s)\n", rr_state());
    va_end(ap);
    abort();
}

static void join_real_rank(void)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)((START_S + ANSWER_S) * 1e9);
    while (!atomic_load(&rr.done)) {
        if (kolo__now_ns() > deadline) fail("the start-up did not end within %g s", START_S + ANSWER_S);
        usleep(100);
    }
    pthread_join(rr.thread, NULL);
}

/* ---------------------------------------------------------------- sockets */


/* R must close fd without a word. `greeting` bytes of R's greeting may still be unread on it. */
static void expect_refused(int fd, size_t greeting, const char *what)
{
    uint8_t b[256];
    size_t got = 0;
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    for (;;) {
        ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r == 0) return;
        if (r > 0) {
            got += (size_t)r;
            if (got > greeting) fail("%s: R sent %zu bytes instead of closing the connection", what, got - greeting);
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return;
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail("%s: recv: %s", what, strerror(errno));
        uint64_t now = kolo__now_ns();
        if (now >= deadline) fail("%s: R did not close the connection within %g s", what, ANSWER_S);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
    }
}

/* ---------------------------------------------------------------- the input's job */

enum { P_NONE, P_ACKED, P_DONE };

/* A pair (other rank, channel) as the harness has played it. */
typedef struct pair {
    int state;
    int fd;               /* the harness's end of the connection that holds the pair's place */
    bool offered;         /* R offered shared memory (R accepts) */
    bool shm;             /* the pair must end on shared memory */
    uint8_t nonce_c[KOLO_NONCE_LEN];
    uint8_t result[W_RESULT]; /* what R has of the result already (pipelined behind the greeting) */
    size_t result_have;
} pair;

static int N, R, rport;   /* the job's size, the real rank, its listening port */
static bool same_host[NMAX];
static int lfd[NMAX], lport[NMAX]; /* the harness's listeners, one per other rank */
static pair pairs[NMAX][NCH];
static int accepted[NMAX];         /* R's connections to a rank below it taken so far */
static int hangups[NMAX];          /* the harness, as rank q, closed R's connection before accepting it */
static int conns_opened;
static int silent[MAX_SILENT], nsilent;
static size_t silent_greeting[MAX_SILENT]; /* bytes of R's greeting left unread on each */
static char my_hostkey[96];
static bool cma_works, tcp_only, verbose;
static int want_cma;
static volatile uint64_t fake_probe; /* the other ranks' CMA probe: they live in this process */
static uint32_t nonce_counter;

/* The failure predicted, if any: R's status and what its message must name. */
static int want_st;
static char want_text[2][96];

static void predict_failure(int st, const char *text0, const char *text1)
{
    want_st = st;
    snprintf(want_text[0], sizeof(want_text[0]), "%s", text0);
    snprintf(want_text[1], sizeof(want_text[1]), "%s", text1 ? text1 : "");
}

static void fresh_nonce(uint8_t n[KOLO_NONCE_LEN])
{
    memset(n, 0xa5, KOLO_NONCE_LEN);
    uint32_t c = ++nonce_counter;
    memcpy(n, &c, 4);
}

/* Reads R's greeting on fd and checks it: KOLOMSH6, R's rank, a nonce. */
static void read_greeting(int fd, uint8_t nonce_a[KOLO_NONCE_LEN], const char *what)
{
    uint8_t h[W_HELLO_A];
    int r = read_full(fd, h, sizeof(h), ANSWER_S);
    if (r != RD_OK) fail("%s: %s instead of R's greeting", what, r == RD_EOF ? "closed" : "nothing");
    if (memcmp(h, W_MAGIC, 8) != 0) fail("%s: R's greeting does not begin with %s", what, W_MAGIC);
    if (r32(h + 8) != (uint32_t)R) fail("%s: R's greeting names rank %u", what, r32(h + 8));
    memcpy(nonce_a, h + 12, KOLO_NONCE_LEN);
}

/* Two u16s, the first the high half (one at a time: the order of a call's operands is unspecified). */
static uint32_t fz_u32(fz *f)
{
    uint32_t hi = fz_u16(f);
    return hi << 16 | fz_u16(f);
}

/* Whether R's start-up may be over: every pair done. Its listening port is closed then. */
static bool all_done(void)
{
    for (int q = 0; q < N; q++)
        for (int c = 0; c < NCH && q != R; c++)
            if (pairs[q][c].state != P_DONE) return false;
    return true;
}

static bool can_open(void) { return conns_opened < MAX_CONNS && !want_st && !all_done(); }

/* A connection that sent less than a whole greeting ends as `how` says. */
static void end_short(int fd, uint8_t how, size_t greeting, const char *what)
{
    switch (how % 4) {
    case 0:
        shutdown(fd, SHUT_WR);
        expect_refused(fd, greeting, what);
        close(fd);
        break;
    case 1: close(fd); break;
    case 2: close_reset(fd); break;
    default:
        if (nsilent < MAX_SILENT) {
            silent_greeting[nsilent] = greeting;
            silent[nsilent++] = fd;
            return;
        }
        close(fd);
        break;
    }
}

/* STRANGER (see the top). */
static void cmd_stranger(fz *f)
{
    uint8_t how = fz_u8(f);
    size_t n;
    const uint8_t *raw = fz_span(f, 200, &n);
    if (!can_open()) return;
    conns_opened++;
    int fd = dial(rport);
    uint8_t nonce_a[KOLO_NONCE_LEN];
    size_t greeting = W_HELLO_A;
    if (how & 1) {
        read_greeting(fd, nonce_a, "stranger");
        greeting = 0;
    }
    send_bytes(fd, raw, n);
    if (n >= W_HELLO_C) {
        /* a whole greeting, which cannot prove the secret over a nonce R drew after the input */
        expect_refused(fd, greeting, "stranger with a whole greeting");
        close(fd);
        return;
    }
    end_short(fd, (uint8_t)(how >> 1), greeting, "stranger");
}

/* Whether R, reading this process (where the other ranks live) at the result's probe address,
 * finds the value the result names: this process's probe or R's own. */
static bool probe_good(const uint8_t res[W_RESULT])
{
    uint64_t a = r64(res + 8), v = r64(res + 16);
    return (a == (uint64_t)(uintptr_t)&fake_probe && v == fake_probe) ||
           (a == (uint64_t)(uintptr_t)&cma_probe && v == cma_probe);
}

/* R has the whole result res: its final answer (the CMA verdict), and the pair's transport. */
static void settle_result(pair *p, int rank, int ch, const uint8_t res[W_RESULT])
{
    bool taken = r32(res) != 0;
    if (taken && !p->offered) { /* taken where R offered none: refused (mesh.c, on_result) */
        char who[32], where[48];
        snprintf(who, sizeof(who), "rank %d", rank);
        snprintf(where, sizeof(where), "127.0.0.1:%d", lport[rank]);
        predict_failure(KOLO_ERR_PROTOCOL, who, where);
        p->state = P_DONE;
        return;
    }
    bool expect = taken && p->offered && probe_good(res) && cma_works && want_cma;
    uint8_t fin[W_FINAL];
    int r = read_full(p->fd, fin, sizeof(fin), ANSWER_S);
    if (r != RD_OK)
        fail("rank %d channel %d: %s instead of R's final answer", rank, ch, r == RD_EOF ? "closed" : "nothing");
    uint32_t v = r32(fin);
    if (v > 1) fail("rank %d channel %d: R's CMA verdict is %u, not 0 or 1", rank, ch, v);
    /* where R offered no shared memory the protocol asks for no verdict: either will do */
    if (p->offered && v != (uint32_t)expect)
        fail("rank %d channel %d: R's CMA verdict is %u, the protocol says %d (taken %d)", rank, ch, v, expect, taken);
    if (!taken && v) fail("rank %d channel %d: R says CMA works on a pair without shared memory", rank, ch);
    p->state = P_DONE;
    p->shm = taken && p->offered;
}

/* Sends the rest of res (R goes on from what it has, even where that began another result), then
 * tail, and settles the result R then holds. */
static void finish_result(pair *p, int rank, int ch, const uint8_t res[W_RESULT], const uint8_t *tail, size_t tail_n)
{
    uint8_t eff[W_RESULT], out[W_RESULT + 40];
    memcpy(eff, res, W_RESULT);
    memcpy(eff, p->result, p->result_have);
    size_t n = W_RESULT - p->result_have;
    memcpy(out, eff + p->result_have, n);
    if (tail_n) memcpy(out + n, tail, tail_n);
    send_bytes(p->fd, out, n + tail_n);
    p->result_have = W_RESULT;
    settle_result(p, rank, ch, eff);
}

static void make_result(uint8_t res[W_RESULT], uint32_t taken, uint32_t cma, int probe_kind, uint64_t a, uint64_t v)
{
    w32(res, taken);
    w32(res + 4, cma);
    switch (probe_kind) {
    case 0:
        a = (uint64_t)(uintptr_t)&fake_probe;
        v = fake_probe;
        break;
    case 1:
        a = (uint64_t)(uintptr_t)&fake_probe;
        v = fake_probe + 1;
        break;
    case 3:
        a = (uint64_t)(uintptr_t)&cma_probe;
        v = cma_probe;
        break;
    default: break;
    }
    w64(res + 8, a);
    w64(res + 16, v);
}

/* CONNECT (see the top); also the completion's right connections (f NULL). */
static void cmd_connect(fz *f, int rank_c, int ch_c)
{
    uint8_t rsel = 0, csel = 0, mut = 0;
    uint32_t rc = (uint32_t)rank_c, ch = (uint32_t)ch_c;
    if (f) {
        rsel = fz_u8(f);
        csel = fz_u8(f);
        mut = fz_u8(f);
        rc = rsel & 0x80 ? fz_u32(f) : (uint32_t)(rsel % 4);
        ch = csel & 0x80 ? fz_u32(f) : (uint32_t)(csel % 4);
        if (!can_open()) return;
    }
    conns_opened++;
    int fd = dial(rport);
    uint8_t nonce_a[KOLO_NONCE_LEN], hello[W_HELLO_C + 40], right[KOLO_MAC_LEN];
    read_greeting(fd, nonce_a, "connection");
    memcpy(hello, W_MAGIC, 8);
    w32(hello + 8, rc);
    w32(hello + 12, ch);
    uint8_t *nonce_c = hello + 16, *mac = hello + 16 + KOLO_NONCE_LEN;
    fresh_nonce(nonce_c);
    proof(right, SECRET, "kolo-mesh-connect", nonce_a, rc, ch, (uint32_t)R);
    memcpy(mac, right, KOLO_MAC_LEN);
    size_t len = W_HELLO_C;
    uint8_t zero[KOLO_NONCE_LEN] = {0}, b;
    switch (mut % 9) {
    case 0: break;
    case 1:
        b = fz_u8(f);
        hello[7] = b;
        break;
    case 2: fz_bytes(f, hello, 8); break;
    case 3:
        b = fz_u8(f);
        mac[b % KOLO_MAC_LEN] ^= (uint8_t)(1u << (b / KOLO_MAC_LEN % 8));
        break;
    case 4: proof(mac, SECRET, "kolo-mesh-connect", zero, rc, ch, (uint32_t)R); break;
    case 5: proof(mac, SECRET, "kolo-mesh-accept", nonce_a, rc, ch, (uint32_t)R); break;
    case 6: proof(mac, SECRET, "kolo-mesh-connect", nonce_a, rc, ch, (uint32_t)R + 1); break;
    case 7: proof(mac, "another-secret", "kolo-mesh-connect", nonce_a, rc, ch, (uint32_t)R); break;
    default: len = fz_u8(f) % W_HELLO_C; break;
    }
    size_t extra = 0;
    if (f && (mut & 16) && len == W_HELLO_C) {
        const uint8_t *x = fz_span(f, 40, &extra);
        memcpy(hello + W_HELLO_C, x, extra);
    }
    send_bytes(fd, hello, len + extra);
    if (len < W_HELLO_C) {
        end_short(fd, fz_u8(f), 0, "a part of a greeting");
        return;
    }
    /* the protocol's conditions, on the bytes sent */
    bool valid = memcmp(hello, W_MAGIC, 8) == 0 && kolo__mac_equal(mac, right) && (int64_t)rc > R &&
                 (int64_t)rc < N && ch < NCH && pairs[rc][ch].state == P_NONE;
    if (!valid) {
        expect_refused(fd, 0, "a wrong greeting");
        close(fd);
        return;
    }
    uint8_t ack[W_ACK], want[KOLO_MAC_LEN];
    int r = read_full(fd, ack, sizeof(ack), ANSWER_S);
    if (r != RD_OK)
        fail("rank %u channel %u: %s instead of R's acceptance", rc, ch, r == RD_EOF ? "closed" : "nothing");
    proof(want, SECRET, "kolo-mesh-accept", nonce_c, (uint32_t)R, ch, rc);
    if (!kolo__mac_equal(want, ack)) fail("rank %u channel %u: R's acceptance does not prove the secret", rc, ch);
    uint32_t offer = r32(ack + KOLO_MAC_LEN);
    const char *name = (const char *)ack + KOLO_MAC_LEN + 4;
    if (offer > 1) fail("rank %u channel %u: R offers transport %u", rc, ch, offer);
    if (offer && (!same_host[rc] || tcp_only))
        fail("rank %u channel %u: R offers shared memory to a rank of another host%s", rc, ch,
             tcp_only ? " (KOLO_TRANSPORT=tcp)" : "");
    if (offer && (name[0] != '/' || !memchr(name, 0, W_NAME)))
        fail("rank %u channel %u: R offers a segment without a proper name", rc, ch);
    if (r32(ack + KOLO_MAC_LEN + 4 + W_NAME) != (uint32_t)getpid())
        fail("rank %u channel %u: R's acceptance names pid %u, not its own", rc, ch,
             r32(ack + KOLO_MAC_LEN + 4 + W_NAME));
    if (r64(ack + KOLO_MAC_LEN + 8 + W_NAME) != (uint64_t)(uintptr_t)&cma_probe ||
        r64(ack + KOLO_MAC_LEN + 16 + W_NAME) != cma_probe)
        fail("rank %u channel %u: R's acceptance does not name its CMA probe", rc, ch);
    pair *p = &pairs[rc][ch];
    *p = (pair){.state = P_ACKED, .fd = fd, .offered = offer == 1};
    memcpy(p->nonce_c, nonce_c, KOLO_NONCE_LEN);
    memcpy(p->result, hello + W_HELLO_C, KOLO_MIN(extra, (size_t)W_RESULT));
    p->result_have = KOLO_MIN(extra, (size_t)W_RESULT);
    if (p->result_have == W_RESULT) settle_result(p, (int)rc, (int)ch, p->result);
}

/* RESULT (see the top); also the completion's (f NULL). */
static void cmd_result(fz *f, pair *p)
{
    int rank = -1, ch = -1;
    if (!p) {
        uint8_t pick = fz_u8(f);
        int n = 0;
        for (int q = 0; q < N; q++)
            for (int c = 0; c < NCH; c++) n += pairs[q][c].state == P_ACKED;
        if (n == 0) return;
        n = pick % n;
        for (int q = 0; q < N && !p; q++)
            for (int c = 0; c < NCH && !p; c++)
                if (pairs[q][c].state == P_ACKED && n-- == 0) p = &pairs[q][c];
    }
    for (int q = 0; q < N; q++)
        for (int c = 0; c < NCH; c++)
            if (p == &pairs[q][c]) rank = q, ch = c;
    uint8_t flags = f ? fz_u8(f) : 0;
    uint32_t taken = flags & 3, cma = flags >> 2 & 3;
    int probe_kind = flags >> 4 & 3;
    if (taken == 2) taken = fz_u32(f);
    else if (taken == 3) taken = 1;
    if (!f) taken = p->offered; /* the completion takes what R offers */
    if (cma == 2) cma = fz_u32(f);
    else if (cma == 3) cma = 1;
    uint64_t a = 0, v = 0;
    if (probe_kind == 2) {
        uint8_t q[16];
        fz_bytes(f, q, 16);
        a = r64(q);
        v = r64(q + 8);
    }
    uint8_t res[W_RESULT];
    make_result(res, taken, cma, probe_kind, a, v);
    if (flags & 64) {
        size_t cut = fz_u8(f) % W_RESULT;
        if (cut > p->result_have) send_bytes(p->fd, res + p->result_have, cut - p->result_have);
        if (flags & 128) close_reset(p->fd);
        else close(p->fd);
        p->fd = -1;
        p->state = P_DONE;
        char who[32];
        snprintf(who, sizeof(who), "rank %d", rank);
        predict_failure(KOLO_ERR_STARTUP, who, NULL);
        return;
    }
    size_t extra = 0;
    const uint8_t *tail = f ? fz_span(f, 40, &extra) : NULL;
    finish_result(p, rank, ch, res, tail, extra); /* trailing bytes are the transport's, after the handshake */
}

/* The harness, as rank p, closes R's connection before accepting it: R connects again after 20
 * ms (mesh.c, on_readable: the acceptor may have closed it for room), and gives up after
 * CONNECT_HANGUPS_MAX on one pair. The harness hangs up fewer times than that on each rank (the
 * count per rank bounds each pair's), so R never gives up: false when the input's hang-up is to
 * be played as a proper step instead. */
static bool may_hang_up(int p) { return hangups[p] < CONNECT_HANGUPS_MAX - 1; }

static void hang_up(int p, int fd, pair *pp)
{
    if (fd >= 0) close(fd);
    hangups[p]++;
    accepted[p]--; /* R's next connection to p takes its place */
    if (pp) *pp = (pair){.state = P_NONE, .fd = -1};
}

/* ACCEPT (see the top); also the completion's (f NULL). */
static void cmd_accept(fz *f, int p_rank)
{
    uint8_t psel = f ? fz_u8(f) : 0, mut = f ? fz_u8(f) : 0;
    if (R == 0) return;
    int p = f ? psel % R : p_rank;
    if (accepted[p] == NCH || want_st) return;
    struct pollfd pf = {.fd = lfd[p], .events = POLLIN};
    int pr;
    while ((pr = poll(&pf, 1, (int)(ANSWER_S * 1000))) < 0 && errno == EINTR) {}
    if (pr <= 0) fail("rank %d: R did not connect within %g s", p, ANSWER_S);
    int fd = accept4(lfd[p], NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) fail("accept: %s", strerror(errno));
    accepted[p]++;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char who[32], where[48];
    snprintf(who, sizeof(who), "rank %d", p);
    snprintf(where, sizeof(where), "127.0.0.1:%d", lport[p]);
    uint8_t hello[W_HELLO_A], nonce_a[KOLO_NONCE_LEN];
    memcpy(hello, W_MAGIC, 8);
    w32(hello + 8, (uint32_t)p);
    fresh_nonce(nonce_a);
    memcpy(hello + 12, nonce_a, KOLO_NONCE_LEN);
    uint8_t b;
    if ((mut % 7 == 4 || mut % 7 == 5 || mut % 7 == 6) && !may_hang_up(p)) mut = 0;
    switch (mut % 7) {
    case 1:
        b = fz_u8(f);
        hello[7] = b == '6' ? '7' : b;
        send_bytes(fd, hello, sizeof(hello));
        close(fd);
        predict_failure(KOLO_ERR_PROTOCOL, "another wire version", where);
        return;
    case 2:
        hello[0] ^= 0x20; /* "kOLOMSH6": not kolo's */
        send_bytes(fd, hello, sizeof(hello));
        close(fd);
        predict_failure(KOLO_ERR_PROTOCOL, who, where);
        return;
    case 3:
        w32(hello + 8, (uint32_t)(p + 1 + fz_u8(f)));
        send_bytes(fd, hello, sizeof(hello));
        close(fd);
        predict_failure(KOLO_ERR_PROTOCOL, who, where);
        return;
    case 4:
        send_bytes(fd, hello, fz_u8(f) % W_HELLO_A);
        hang_up(p, fd, NULL);
        return;
    case 5:
        hang_up(p, fd, NULL);
        return;
    default: break;
    }
    send_bytes(fd, hello, sizeof(hello));
    uint8_t hc[W_HELLO_C], want[KOLO_MAC_LEN];
    int r = read_full(fd, hc, sizeof(hc), ANSWER_S);
    if (r != RD_OK) fail("rank %d: %s instead of R's greeting", p, r == RD_EOF ? "closed" : "nothing");
    uint32_t ch = r32(hc + 12);
    if (memcmp(hc, W_MAGIC, 8) != 0 || r32(hc + 8) != (uint32_t)R)
        fail("rank %d: R greets as rank %u with the magic '%.8s'", p, r32(hc + 8), (const char *)hc);
    if (ch >= NCH || pairs[p][ch].state != P_NONE) fail("rank %d: R connects again on channel %u", p, ch);
    proof(want, SECRET, "kolo-mesh-connect", nonce_a, (uint32_t)R, ch, (uint32_t)p);
    if (!kolo__mac_equal(want, hc + 16 + KOLO_NONCE_LEN))
        fail("rank %d channel %u: R's greeting does not prove the secret", p, ch);
    pair *pp = &pairs[p][ch];
    *pp = (pair){.state = P_ACKED, .fd = fd};
    if (mut % 7 == 6) {
        hang_up(p, fd, pp);
        return;
    }
    /* the acceptance */
    uint8_t ack[W_ACK], am = f ? fz_u8(f) : 0, om = f ? fz_u8(f) : 0;
    if (am % 6 >= 4 && !may_hang_up(p)) am = 0;
    memset(ack, 0, sizeof(ack));
    const uint8_t *nonce_c = hc + 16;
    proof(ack, SECRET, "kolo-mesh-accept", nonce_c, (uint32_t)p, ch, (uint32_t)R);
    size_t n;
    const uint8_t *x;
    switch (om % 4) {
    case 0: break;
    case 1:
        w32(ack + KOLO_MAC_LEN, 1);
        x = fz_span(f, W_NAME, &n);
        memcpy(ack + KOLO_MAC_LEN + 4, x, n);
        break;
    case 2:
        w32(ack + KOLO_MAC_LEN, 1);
        snprintf((char *)ack + KOLO_MAC_LEN + 4, W_NAME, "/kolo-%d-%u-%d-%016llx", (int)getpid(), ch, R,
                 (unsigned long long)0x0123456789abcdefull);
        break;
    default:
        w32(ack + KOLO_MAC_LEN, fz_u32(f));
        x = fz_span(f, W_NAME, &n);
        memcpy(ack + KOLO_MAC_LEN + 4, x, n);
        break;
    }
    w32(ack + KOLO_MAC_LEN + 4 + W_NAME, (uint32_t)getpid());
    w64(ack + KOLO_MAC_LEN + 8 + W_NAME, (uint64_t)(uintptr_t)&fake_probe);
    w64(ack + KOLO_MAC_LEN + 16 + W_NAME, fake_probe);
    switch (am % 6) {
    case 0: break;
    case 1:
        b = fz_u8(f);
        ack[b % KOLO_MAC_LEN] ^= (uint8_t)(1u << (b / KOLO_MAC_LEN % 8));
        break;
    case 2: proof(ack, SECRET, "kolo-mesh-connect", nonce_c, (uint32_t)p, ch, (uint32_t)R); break;
    case 3: proof(ack, SECRET, "kolo-mesh-accept", nonce_c, (uint32_t)p, ch ^ 1, (uint32_t)R); break;
    case 4:
        send_bytes(fd, ack, fz_u8(f) % W_ACK);
        hang_up(p, fd, pp);
        return;
    default:
        hang_up(p, fd, pp);
        return;
    }
    send_bytes(fd, ack, sizeof(ack));
    if (am % 6 != 0) {
        predict_failure(KOLO_ERR_AUTH, who, where);
        return;
    }
    uint8_t res[W_RESULT];
    r = read_full(fd, res, sizeof(res), ANSWER_S);
    if (r != RD_OK) fail("rank %d channel %u: %s instead of R's result", p, ch, r == RD_EOF ? "closed" : "nothing");
    if (r32(res) != 0 || r32(res + 4) != 0)
        fail("rank %d channel %u: R says it took shared memory (%u, CMA %u) from a segment that does not exist", p,
             ch, r32(res), r32(res + 4));
    if (r64(res + 8) != (uint64_t)(uintptr_t)&cma_probe || r64(res + 16) != cma_probe)
        fail("rank %d channel %u: R's result does not name its CMA probe", p, ch);
    /* the final answer */
    uint8_t fm = f ? fz_u8(f) : 0, fin[W_FINAL];
    w32(fin, fm % 4 == 1);
    if (fm % 4 == 2) w32(fin, fz_u32(f));
    if (fm % 4 == 3) {
        send_bytes(fd, fin, fz_u8(f) % W_FINAL);
        close(fd);
        pp->fd = -1;
        predict_failure(KOLO_ERR_STARTUP, who, NULL);
        return;
    }
    send_bytes(fd, fin, sizeof(fin));
    pp->state = P_DONE;
}

/* ---------------------------------------------------------------- one input */

/* Segments of this process left in /dev/shm. */
static int count_segments(void)
{
    char prefix[32];
    int pl = snprintf(prefix, sizeof(prefix), "kolo-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, (size_t)pl) == 0;
    closedir(d);
    return n;
}

/* The other ranks' records, counted in before R arrives, and R's port once it publishes. */
static void rendezvous(void)
{
    kolo__store *s = NULL;
    if (kolo__store_connect(&s, "127.0.0.1", srv_port, SECRET, strlen(SECRET), ANSWER_S) != KOLO_OK)
        fail("the harness cannot reach the store: %s", kolo__errmsg());
    char key[160], val[512];
    for (int q = 0; q < N; q++) {
        if (q == R) continue;
        snprintf(key, sizeof(key), "%s/1/peer/%d", JOB, q);
        int n = snprintf(val, sizeof(val), "127.0.0.1 %d %d %s 0 0 fake%d", lport[q], (int)getpid(),
                         same_host[q] ? my_hostkey : "otherboot/fuzz", q);
        if (kolo__store_set(s, key, val, (size_t)n) != KOLO_OK) fail("store set: %s", kolo__errmsg());
    }
    snprintf(key, sizeof(key), "%s/1/arrived", JOB);
    if (kolo__store_add(s, key, N - 1, NULL) != KOLO_OK) fail("store add: %s", kolo__errmsg());
    if (pthread_create(&rr.thread, NULL, run_real_rank, NULL) != 0) fail("pthread_create failed");
    snprintf(key, sizeof(key), "%s/1/peer/%d", JOB, R);
    void *v = NULL;
    size_t len = 0;
    if (kolo__store_get(s, key, &v, &len, ANSWER_S) != KOLO_OK)
        fail("R did not publish its record: %s", kolo__errmsg());
    char text[512], addr[64];
    snprintf(text, sizeof(text), "%.*s", (int)KOLO_MIN(len, sizeof(text) - 1), (const char *)v);
    kolo__free(v);
    kolo__store_close(s);
    if (sscanf(text, "%63s %d", addr, &rport) != 2 || strcmp(addr, "127.0.0.1") != 0)
        fail("R published '%s', not an address on 127.0.0.1", text);
}

/* The socket at the other end of fd is exactly `theirs`' (the harness's end of that connection). */
static bool same_connection(int fd, int theirs)
{
    struct sockaddr_storage a, b, c, d;
    socklen_t al = sizeof(a), bl = sizeof(b), cl = sizeof(c), dl = sizeof(d);
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0 || getpeername(theirs, (struct sockaddr *)&b, &bl) != 0 ||
        getpeername(fd, (struct sockaddr *)&c, &cl) != 0 || getsockname(theirs, (struct sockaddr *)&d, &dl) != 0)
        return false;
    return al == bl && memcmp(&a, &b, al) == 0 && cl == dl && memcmp(&c, &d, cl) == 0;
}

static void check_success(void)
{
    if (rr.st != KOLO_OK) fail("the start-up failed where the protocol has it succeed");
    for (int ch = 0; ch < NCH; ch++) {
        kolo__mesh *m = rr.meshes[ch];
        if (!m || m->rank != R || m->size != N) fail("channel %d: no mesh, or one of another shape", ch);
        if (m->conns[R]) fail("channel %d: a connection to R itself", ch);
        for (int q = 0; q < N; q++) {
            if (q == R) continue;
            const kolo__conn *c = m->conns[q];
            const pair *p = &pairs[q][ch];
            if (!c) fail("channel %d: no connection to rank %d", ch, q);
            if (c->peer != q) fail("channel %d: the connection to rank %d says rank %d", ch, q, c->peer);
            if (p->state != P_DONE || p->fd < 0)
                fail("channel %d: a connection to rank %d the harness never made", ch, q);
            if (!same_connection(c->fd, p->fd))
                fail("channel %d: the connection to rank %d is not the one its handshake completed on", ch, q);
            const kolo__transport *tp = p->shm ? &kolo__shm_transport : &kolo__tcp_transport;
            if (c->tp != tp)
                fail("channel %d: rank %d's connection goes by %s, the protocol says %s", ch, q,
                     c->tp ? c->tp->name : "(no transport)", tp->name);
        }
    }
    for (int q = 0; q < N; q++) {
        if (q == R) continue;
        const kolo__peer_info *pi = &rr.peers[q];
        char host[16];
        snprintf(host, sizeof(host), "fake%d", q);
        if (strcmp(pi->addr, "127.0.0.1") != 0 || pi->port != lport[q] || pi->pid != getpid() ||
            strcmp(pi->hostname, host) != 0)
            fail("rank %d's record reads %s:%d pid %d '%s', not as published", q, pi->addr, pi->port, pi->pid,
                 pi->hostname);
    }
}

static void check_failure(void)
{
    if (rr.st == KOLO_OK) fail("the start-up succeeded where the protocol has it fail with %s", kolo_strerror(want_st));
    if (rr.st != want_st) fail("the start-up failed with %s, the protocol says %s", kolo_strerror(rr.st),
                               kolo_strerror(want_st));
    for (int i = 0; i < 2; i++)
        if (!strstr(rr.msg, want_text[i])) fail("the start-up's message does not name '%s'", want_text[i]);
    for (int ch = 0; ch < NCH; ch++)
        if (rr.meshes[ch]) fail("a failed start-up left the mesh of channel %d", ch);
}

static void begin(uint8_t shape)
{
    N = 2 + (shape & 1);
    R = (shape >> 1 & 7) % N;
    memset(pairs, 0, sizeof(pairs));
    memset(accepted, 0, sizeof(accepted));
    memset(hangups, 0, sizeof(hangups));
    for (int q = 0; q < NMAX; q++) {
        same_host[q] = shape >> (4 + q) & 1;
        lfd[q] = -1;
        for (int c = 0; c < NCH; c++) pairs[q][c].fd = -1;
    }
    conns_opened = nsilent = 0;
    want_st = KOLO_OK;
    want_text[0][0] = want_text[1][0] = '\0';
    uint64_t v = 0;
    if (kolo__random_bytes(&v, sizeof(v)) != KOLO_OK) fail("no random bytes");
    fake_probe = v;
    real_rank_begin(R, N, START_S);
    for (int q = 0; q < N; q++)
        if (q != R) lfd[q] = listen_loopback(&lport[q]);
    rendezvous();
}

/* Every handshake the input left open, rightly. */
static void complete(void)
{
    /* a result R already holds part of (pipelined behind its greeting) may still fail R: then stop */
    for (int q = R + 1; q < N && !want_st; q++)
        for (int c = 0; c < NCH && !want_st; c++) {
            if (pairs[q][c].state == P_NONE) cmd_connect(NULL, q, c);
            if (pairs[q][c].state == P_ACKED) cmd_result(NULL, &pairs[q][c]);
        }
    for (int p = 0; p < R && !want_st; p++)
        while (accepted[p] < NCH && !want_st) cmd_accept(NULL, p);
}

static void end(void)
{
    /* R's listening port is closed at the end of its start-up, whichever way it ended */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)rport),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) fail("R's listening port %d is still open", rport);
    close(fd);
    for (int i = 0; i < nsilent; i++) {
        expect_refused(silent[i], silent_greeting[i], "a silent stranger at the end");
        close(silent[i]);
    }
    if (rr.st == KOLO_OK) {
        for (int ch = 0; ch < NCH; ch++) kolo__mesh_destroy(rr.meshes[ch]);
        kolo__free(rr.peers);
    }
    for (int q = 0; q < NMAX; q++) {
        for (int c = 0; c < NCH; c++)
            if (pairs[q][c].fd >= 0) close(pairs[q][c].fd);
        if (lfd[q] >= 0) close(lfd[q]);
    }
    kolo__store_server_stop(srv);
    srv = NULL;
    if (count_segments()) fail("%d shared-memory segments of this process left in /dev/shm", count_segments());
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (getenv("KOLO_LOG_LEVEL")) kolo__log_init();
    else kolo__log_level = KOLO_LOG_NONE; /* a warning per refused connection would drown the fuzzer's output */
    signal(SIGPIPE, SIG_IGN);
    /* small rings: a segment per pair that R offers shared memory to, faulted in at every input */
    setenv("KOLO_SHM_RING_SIZE", "65536", 0);
    verbose = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    tcp_only = strcmp(kolo__setting_str(KOLO_SET_TRANSPORT), "tcp") == 0;
    if (kolo__setting_auto01(KOLO_SET_SHM_CMA, &want_cma) != KOLO_OK) want_cma = 0;
    kolo__host_key(my_hostkey, sizeof(my_hostkey));
    /* whether this process may read its own memory by pid, as R does the other ranks' probes */
    uint64_t v = 0;
    fake_probe = 0x5eed;
    struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)&fake_probe, sizeof(v)};
    cma_works = process_vm_readv(getpid(), &l, 1, &r, 1, 0) == (ssize_t)sizeof(v) && v == 0x5eed;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    int fds = count_fds();
    begin(fz_u8(&f));
    while (f.n && !want_st) {
        switch (fz_u8(&f) % 5) {
        case 0: cmd_stranger(&f); break;
        case 1: cmd_connect(&f, 0, 0); break;
        case 2: cmd_result(&f, NULL); break;
        case 3: cmd_accept(&f, 0); break;
        default: usleep((useconds_t)(fz_u8(&f) % 4 * 250)); break;
        }
    }
    if (!want_st) complete();
    join_real_rank();
    if (verbose)
        fprintf(stderr, "fuzz_mesh: rank %d of %d, %d connections opened: %s\n", R, N, conns_opened,
                rr.st == KOLO_OK ? "R started" : rr_state());
    if (want_st) check_failure();
    else check_success();
    end();
    if (count_fds() != fds) fail("the process holds %d descriptors after the input, %d before", count_fds(), fds);
    return 0;
}
