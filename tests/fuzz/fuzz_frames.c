/* fuzz_frames.c - the TCP transport's frames (tcp.c) as a garbled peer sends them on an established
 * connection, and the direct collectives that read them (xfer.c's receive path and wait loop).
 *
 * Each input is a job of 2 ranks of which rank 0, R, is real: it starts with kolo__mesh_build
 * against a real store (store.c, a fresh server on 127.0.0.1, port 0) and the harness, as rank 1
 * of another host (so that R offers no shared memory), completes both channels' handshakes
 * rightly, as fuzz_mesh.c's right connector does. Then R runs up to 8 operations, one at a time,
 * each on a thread of its own, on the very meshes its start-up built; the harness plays rank 1's
 * side of each, and writes whatever the input says on that channel's connection. The operations
 * (kolo_broadcast and the rest as core/kolo.c calls them: the call tag set on the direct mesh):
 *
 *   0 BCAST      kolo__coll_broadcast rooted at rank 1: R receives one frame of L bytes;
 *   1 ALLREDUCE  kolo__coll_allreduce of L uint8 by sum, out of place: R sends its buffer, receives
 *                rank 1's, and returns the sums (mod 256) in member order;
 *   2 ALLGATHER  kolo__coll_allgather of uint8, R's count A and rank 1's L: R sends A bytes, receives
 *                L into the output after its own;
 *   3 BARRIER    kolo__coll_barrier: a frame of 0 bytes each way;
 *   4 RAW        kolo__irecv and kolo__wait1 on the engine's channel (1), whose mesh has no call tag:
 *                R receives one frame of L bytes, whatever tag it carries.
 *
 * Every buffer R writes has guard bytes either side. Where R sends, the harness reads R's frame
 * first and checks it as the protocol has it: magic "KOLM", flags 0 (no filler below 128 KiB),
 * the length with R's call tag in its top 16 bits, and the payload R was given. The harness keeps
 * everything it wrote on each channel and what R has taken of it, and predicts from the protocol
 * (the top of tcp.c, transport.h's header, xfer.c's "Call tags"), not from their code, how R's
 * receive of L bytes under its call tag T (0 on channel 1) ends, from the next 16 bytes:
 *
 *   - magic KOLM with the ABORT flag: KOLO_ERR_PEER_LOST (rank 1 aborted the job); with the GOODBYE
 *     flag: KOLO_ERR_PEER_LOST (rank 1 left while R expected bytes);
 *   - any other magic: KOLO_ERR_PROTOCOL (a garbled message), whatever its flags' bits;
 *   - a tag (the length's top 16 bits) that is not 0 and not T, where T is not 0: KOLO_ERR_MISMATCH;
 *     the low 48 bits not L: KOLO_ERR_MISMATCH;
 *   - filler (flags bits 16-27 before the payload, bits 0-11 after it) on a frame below 128 KiB:
 *     KOLO_ERR_PROTOCOL; from 128 KiB the filler is skipped, its bytes never read;
 *   - otherwise R completes the operation once header, filler and payload have come, with exactly
 *     the predicted bytes (the broadcast's, the sums, the gathered blocks), and leaves what follows
 *     the frame for the next operation;
 *   - the connection closed (or reset) before that: KOLO_ERR_PEER_LOST; silent: KOLO_ERR_TIMEOUT
 *     after KOLO_OP_TIMEOUT (0.3 s here, set before the first input unless already set). A reset
 *     may also throw away bytes R had not read yet (the harness waits until R's kernel has all it
 *     wrote, but Linux then fails the receive at once), and an operation that sends to rank 1
 *     after it hung up fails however right the bytes before the close were: after either,
 *     KOLO_ERR_PEER_LOST will do.
 *
 * A failure's message must name rank 1 ("rank 1 on fake1 (127.0.0.1)", or "rank(s) 1" for a
 * timeout). Then R must have told rank 1 why, where the harness still listens: R's connection
 * carries an ABORT frame (magic, the ABORT flag, the reason's length, no tag) whose reason is R's
 * message (its first 384 bytes), and then ends. A second call on the failed mesh must fail at once
 * with the same status and message. Either way the guards are intact, R's input unchanged; after
 * the input R's meshes are destroyed, the store stopped, and the process holds exactly the
 * descriptors it held before.
 *
 * The input: operations until it ends or R fails, each:
 *   u8 op        op % 5 the operation; bit 7 a size around 128 KiB (BCAST, RAW: L = 128 KiB - 2048
 *                + u16 % 4096), else u16 % 2048 (ALLGATHER: A = u16 % 1024, then L = u16 % 1024);
 *   u16 size     (and ALLGATHER's second);
 *   u8 pieces    % 5 pieces, each a u8 kind (% 8) and its arguments, written one after another:
 *     0 RIGHT    the right frame: header and L bytes of payload (u8 seed);
 *     1 FILLER   the right frame with filler: u16 before (& 0xfff), u16 after (& 0xfff), u8 seed;
 *     2 BADHDR   the right frame with its header changed (u8 what % 6: 0 the magic's byte u8 % 4 set
 *                to u8; 1 the flags a u32; 2 the length plus an i8 (not 0); 3 the whole length field a
 *                u64 (four u16, high first); 4 the tag a u16; 5 the length 2^48 + L), u8 seed;
 *     3 GOODBYE  a goodbye: the GOODBYE flag, u8 extra flags (<< 8), a u16 length, no payload;
 *     4 ABORT    an abort: u8 how (bit 0: the length field a u64 instead of the reason's length),
 *                a span (<= 400 bytes) as the reason;
 *     5 RAW      a span (<= 64 bytes) of raw bytes;
 *     6 HEADER   the right header alone (its payload may follow in other pieces);
 *     7 PAYLOAD  L bytes of payload alone (u8 seed);
 *   u8 write     how the pieces go out (% 4): at once; in writes of u8 % 16 + 1 bytes (the first
 *                4 KiB, then the rest); in two writes cut at u16 with a pause of 200 us between;
 *                the first 64 bytes one by one, 20 us apart, then the rest;
 *   u8 end       % 8: 5 a close (a FIN: the harness still reads R's ABORT), 6 a reset, 7 silence;
 *                else nothing (a close, when R still waits for bytes the input never sends). A
 *                close or reset is for good: R's later operations on that channel must fail as the
 *                peer lost (R, having seen the hang-up already, may then send nothing).
 *   A span is a u16 length and then as many bytes (fz_span); past the input's end every draw is 0.
 *
 * Not reached: frames R sends with filler (R's sends stay below 128 KiB: the harness would read
 * its filler too), the ring allreduce and the other algorithms of 3 or more members, shared memory
 * (fuzz_mesh.c covers its handshake), the engine's goodbye at shutdown, KOLO_TCP_KEEPALIVE; a frame
 * of 2^48 bytes or near it is announced, never sent.
 *
 * tcp.c's constants are its own: this file includes tcp.c. Set KOLO_LOG_LEVEL to see R's errors,
 * KOLO_FUZZ_VERBOSE for how each operation ended. */
#include "../../src/net/tcp.c"

#include "../../src/boot/auth.h"
#include "../../src/boot/store.h"
#include "../../src/coll/coll.h"
#include "fuzz.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The frame, from transport.h and the top of tcp.c (checked against tcp.c's below). */
#define F_MAGIC 0x4b4f4c4du /* "KOLM" in the hosts' order */
#define F_HDR 16
#define F_GOODBYE 0x80000000u
#define F_ABORT 0x40000000u
#define F_REASON_MAX 384
#define F_LEN_BITS 48
#define F_PAD_MIN ((size_t)128 << 10)
_Static_assert(F_MAGIC == KOLO_MSG_MAGIC && F_HDR == KOLO_HDR_LEN && F_GOODBYE == KOLO_HDR_GOODBYE &&
                   F_ABORT == KOLO_HDR_ABORT && F_REASON_MAX == KOLO_ABORT_REASON_MAX &&
                   F_LEN_BITS == KOLO_HDR_LEN_BITS && F_PAD_MIN == TCP_PAD_MIN && TCP_PAD_SHIFT == 16 &&
                   TCP_PAD_MASK == 0xfff,
               "the harness's frame differs from tcp.c's");


static const char SECRET[] = "fuzz-frames-secret";
static const char JOB[] = "fuzz-frames-job";
#define NCH KOLO_NCHANNELS
#define MAX_OPS 8
#define GUARD 64
#define ANSWER_S 5.0  /* seconds R has for anything it owes */
#define OP_TIMEOUT "0.3"
static const char PEER[] = "rank 1 on fake1 (127.0.0.1)"; /* how R's messages name the harness */

KOLO_PRINTF(1, 2) static _Noreturn void fail(const char *fmt, ...);
#define FZ_PEER "R"
#include "fuzz_net.h"
#include "fuzz_rank.h"

enum { OP_BCAST, OP_ALLREDUCE, OP_ALLGATHER, OP_BARRIER, OP_RAW, OP_KINDS };
static const char *const op_names[] = {"broadcast", "allreduce", "allgather", "barrier", "receive"};

/* ---------------------------------------------------------------- the real rank */

/* One operation of R's, as the harness sets it up and R runs it. */
typedef struct rop {
    int kind, ch;
    size_t len;         /* what R receives from rank 1 */
    size_t alen;        /* what R sends (allreduce: len; allgather: its own count) */
    uint16_t tag;       /* R's call tag on the direct mesh; 0 on the engine's */
    uint8_t *rbuf;      /* GUARD + what R writes + GUARD */
    size_t rcap;        /* the bytes between the guards */
    uint8_t *sbuf;      /* what R sends, and a copy to compare it with afterwards */
    uint8_t *scopy;
    pthread_t thread;
    atomic_int done;
    int st;
    char msg[1024];
} rop;

static int lfd_keep, lport_keep;
static int hfd[NCH];        /* the harness's end of each channel's connection, -1 once closed */
static bool verbose;
static rop *cur;             /* the operation running, for a finding's message */
static int op_no;

static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_frames: ");
    if (cur)
        fprintf(stderr, "operation %d (%s of %zu bytes on channel %d): ", op_no, op_names[cur->kind], cur->len,
                cur->ch);
    vfprintf(stderr, fmt, ap);
    if (cur && atomic_load(&cur->done)) fprintf(stderr, " (R ended with %s: '%s')", kolo_strerror(cur->st), cur->msg);
    else if (cur) fprintf(stderr, " (R is still in it)");
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* R's side of an operation, as core/kolo.c runs the direct collectives (the call tag set around
 * the call) and the engine its receives. */
static void *run_op(void *arg)
{
    rop *o = arg;
    kolo__mesh *m = rr.meshes[o->ch];
    int ranks[2] = {0, 1};
    kolo__group g = {.size = 2, .rank = 0, .ranks = ranks};
    uint8_t *r = o->rbuf + GUARD;
    int st;
    m->call_tag = o->ch == KOLO_CHANNEL_DIRECT ? o->tag : 0;
    switch (o->kind) {
    case OP_BCAST: st = kolo__coll_broadcast(m, &g, r, o->len, 1); break;
    case OP_ALLREDUCE: st = kolo__coll_allreduce(m, &g, o->sbuf, r, o->len, KOLO_UINT8, KOLO_SUM, 1.0, 1.0); break;
    case OP_ALLGATHER: {
        size_t counts[2] = {o->alen, o->len};
        st = kolo__coll_allgather(m, &g, o->sbuf, r, counts, 1);
        break;
    }
    case OP_BARRIER: st = kolo__coll_barrier(m, &g); break;
    default: {
        kolo__xfer x;
        kolo__irecv(m, 1, r, o->len, &x);
        st = kolo__wait1(m, &x);
        break;
    }
    }
    m->call_tag = 0;
    o->st = st;
    snprintf(o->msg, sizeof(o->msg), "%s", st == KOLO_OK ? "" : kolo__errmsg());
    atomic_store(&o->done, 1);
    return NULL;
}

static void join_op(rop *o, double within_s)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)(within_s * 1e9);
    int one = 1;
    while (!atomic_load(&o->done)) {
        if (kolo__now_ns() > deadline) fail("R did not end the operation within %g s", within_s);
        /* R, failing, waits until rank 1 has acknowledged its ABORT frame (tcp.c, tcp_abort): a
         * delayed acknowledgement cost every failing input 40-200 ms */
        if (hfd[o->ch] >= 0) setsockopt(hfd[o->ch], IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
        usleep(50);
    }
    pthread_join(o->thread, NULL);
}

/* ---------------------------------------------------------------- sockets and the handshake */

/* Rank 1 connects to R on channel ch rightly and takes no shared memory (none is offered). */
static void handshake(int rport, uint32_t ch)
{
    uint8_t ack[W_ACK], res[W_RESULT], fin[W_FINAL];
    int fd = connect_as_rank_1(rport, ch, 0x5c, ack);
    if (r32(ack + KOLO_MAC_LEN) != 0) fail("channel %u: R offers shared memory to another host", ch);
    memset(res, 0, sizeof(res));
    send_bytes(fd, res, sizeof(res));
    if (read_full(fd, fin, sizeof(fin), ANSWER_S) != RD_OK || r32(fin) != 0)
        fail("channel %u: no final answer from R, or one saying CMA works without shared memory", ch);
    hfd[ch] = fd;
}

/* R started, rank 1 by TCP (another host's key) on both channels. */
static void start(void)
{
    start_as_rank_1(lport_keep, "otherboot/fuzz", handshake);
    for (int ch = 0; ch < NCH; ch++) {
        kolo__conn *c = rr.meshes[ch]->conns[1];
        if (!c || c->tp != &kolo__tcp_transport) fail("channel %d: R's connection to rank 1 is not by TCP", ch);
    }
}

/* ---------------------------------------------------------------- what the harness wrote */

/* Per channel: every byte the harness wrote, and how many of them R has taken (its finished
 * receives' frames). What lies beyond is what R's next receive reads. */
typedef struct wstream {
    uint8_t *b;
    size_t n, cap, taken;
    bool closed, reset; /* the harness closed its end (FIN), or reset it */
} wstream;

static wstream out[NCH];

static void put(wstream *s, const void *p, size_t n)
{
    if (!n) return;
    if (s->n + n > s->cap) {
        size_t cap = KOLO_MAX(s->cap * 2, s->n + n + 4096);
        uint8_t *b = realloc(s->b, cap);
        if (!b) fail("no memory for the harness's stream");
        s->b = b;
        s->cap = cap;
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

/* A payload the harness can tell from others: byte i of the one drawn with seed. */
static uint8_t pay(uint8_t seed, size_t i) { return (uint8_t)(seed * 29u + i * 131u + (i >> 8) * 7u + 1u); }

static void put_payload(wstream *s, size_t len, uint8_t seed)
{
    uint8_t chunk[4096];
    for (size_t i = 0; i < len; i += sizeof(chunk)) {
        size_t k = KOLO_MIN(len - i, sizeof(chunk));
        for (size_t j = 0; j < k; j++) chunk[j] = pay(seed, i + j);
        put(s, chunk, k);
    }
}

static void put_hdr(wstream *s, uint32_t magic, uint32_t flags, uint64_t len)
{
    uint8_t h[F_HDR];
    w32(h, magic);
    w32(h + 4, flags);
    w64(h + 8, len);
    put(s, h, sizeof(h));
}

/* A call tag as xfer.c's "Call tags" lays it out: kind, dtype + 1, op + 1, 6 bits of root or scales. */
static uint16_t tag_of(int kind, int dtype, int op, int low6)
{
    return (uint16_t)((unsigned)kind << 13 | (unsigned)(dtype + 1) << 9 | (unsigned)(op + 1) << 6 | (unsigned)low6);
}

/* One piece (see the top) for R's receive of o->len bytes. */
static void piece(fz *f, wstream *s, const rop *o)
{
    uint64_t right = o->len | (uint64_t)o->tag << F_LEN_BITS;
    uint8_t kind = fz_u8(f) % 8, b, seed;
    size_t n;
    const uint8_t *x;
    switch (kind) {
    case 0:
        seed = fz_u8(f);
        put_hdr(s, F_MAGIC, 0, right);
        put_payload(s, o->len, seed);
        break;
    case 1: {
        uint32_t pad = fz_u16(f) & 0xfff, tail = fz_u16(f) & 0xfff;
        seed = fz_u8(f);
        put_hdr(s, F_MAGIC, pad << 16 | tail, right);
        uint8_t junk[4096];
        memset(junk, 0xee, sizeof(junk)); /* filler is never read: anything will do */
        put(s, junk, pad);
        put_payload(s, o->len, seed);
        put(s, junk, tail);
        break;
    }
    case 2: {
        uint8_t h[F_HDR];
        w32(h, F_MAGIC);
        w32(h + 4, 0);
        w64(h + 8, right);
        switch (fz_u8(f) % 6) {
        case 0:
            b = fz_u8(f);
            h[b % 4] = fz_u8(f);
            break;
        case 1: {
            uint32_t hi = fz_u16(f);
            w32(h + 4, hi << 16 | fz_u16(f));
            break;
        }
        case 2: {
            int8_t d = (int8_t)fz_u8(f);
            w64(h + 8, right + (uint64_t)(int64_t)(d ? d : 1));
            break;
        }
        case 3: {
            uint64_t v = 0;
            for (int i = 0; i < 4; i++) v = v << 16 | fz_u16(f);
            w64(h + 8, v);
            break;
        }
        case 4: w64(h + 8, o->len | (uint64_t)fz_u16(f) << F_LEN_BITS); break;
        default: w64(h + 8, ((uint64_t)1 << F_LEN_BITS) + o->len); break;
        }
        seed = fz_u8(f);
        put(s, h, sizeof(h));
        put_payload(s, o->len, seed);
        break;
    }
    case 3:
        b = fz_u8(f);
        put_hdr(s, F_MAGIC, F_GOODBYE | (uint32_t)b << 8, fz_u16(f));
        break;
    case 4: {
        b = fz_u8(f);
        uint64_t v = 0;
        if (b & 1)
            for (int i = 0; i < 4; i++) v = v << 16 | fz_u16(f);
        x = fz_span(f, 400, &n);
        put_hdr(s, F_MAGIC, F_ABORT, b & 1 ? v : n);
        put(s, x, n);
        break;
    }
    case 5:
        x = fz_span(f, 64, &n);
        put(s, x, n);
        break;
    case 6: put_hdr(s, F_MAGIC, 0, right); break;
    default:
        seed = fz_u8(f);
        put_payload(s, o->len, seed);
        break;
    }
}

/* Writes s's bytes from `from` on as the input says. */
static void write_out(fz *f, int fd, const wstream *s, size_t from)
{
    const uint8_t *p = s->b + from;
    size_t n = s->n - from, k;
    switch (fz_u8(f) % 4) {
    case 0: send_bytes(fd, p, n); break;
    case 1: {
        size_t step = fz_u8(f) % 16 + 1, head = KOLO_MIN(n, (size_t)4096);
        for (k = 0; k < head; k += step) send_bytes(fd, p + k, KOLO_MIN(step, head - k));
        send_bytes(fd, p + head, n - head);
        break;
    }
    case 2:
        k = fz_u16(f); /* drawn once: KOLO_MIN evaluates its arguments twice */
        k = KOLO_MIN(n, k);
        send_bytes(fd, p, k);
        usleep(200);
        send_bytes(fd, p + k, n - k);
        break;
    default:
        for (k = 0; k < KOLO_MIN(n, (size_t)64); k++) {
            send_bytes(fd, p + k, 1);
            usleep(20);
        }
        send_bytes(fd, p + k, n - k);
        break;
    }
}

/* ---------------------------------------------------------------- the prediction */

enum { J_NEED, J_OK, J_FAIL };

/* How R's receive of len bytes under call tag mine ends on what the harness wrote on s so far
 * (see the top): J_NEED (it still waits), J_OK (*payload where its bytes lie; *frame the frame's
 * length on the wire) or J_FAIL (*st). */
static int judge(const wstream *s, size_t len, uint16_t mine, size_t *payload, size_t *frame, int *st)
{
    size_t avail = s->n - s->taken;
    if (avail < F_HDR) return J_NEED;
    const uint8_t *h = s->b + s->taken;
    uint32_t magic = r32(h), flags = r32(h + 4);
    uint64_t field = r64(h + 8), flen = field & (((uint64_t)1 << F_LEN_BITS) - 1);
    uint16_t theirs = (uint16_t)(field >> F_LEN_BITS);
    *st = KOLO_OK;
    if (magic == F_MAGIC && (flags & (F_ABORT | F_GOODBYE))) *st = KOLO_ERR_PEER_LOST;
    else if (magic != F_MAGIC) *st = KOLO_ERR_PROTOCOL;
    else if (theirs && mine && theirs != mine) *st = KOLO_ERR_MISMATCH;
    else if (flen != len) *st = KOLO_ERR_MISMATCH;
    if (*st) return J_FAIL;
    size_t pad = flags >> 16 & 0xfff, tail = flags & 0xfff;
    if (len < F_PAD_MIN && (pad || tail)) {
        *st = KOLO_ERR_PROTOCOL;
        return J_FAIL;
    }
    if (len < F_PAD_MIN) pad = tail = 0; /* no filler below 128 KiB: the bits mean nothing (none set here) */
    *frame = F_HDR + pad + len + tail;
    *payload = s->taken + F_HDR + pad;
    return avail >= *frame ? J_OK : J_NEED;
}

/* ---------------------------------------------------------------- one operation */

static rop *op_new(int kind, size_t len, size_t alen)
{
    rop *o = calloc(1, sizeof(*o));
    if (!o) fail("no memory");
    o->kind = kind;
    o->ch = kind == OP_RAW ? KOLO_CHANNEL_ENGINE : KOLO_CHANNEL_DIRECT;
    o->len = kind == OP_BARRIER ? 0 : len;
    o->alen = kind == OP_ALLREDUCE ? o->len : kind == OP_ALLGATHER ? alen : 0;
    o->rcap = kind == OP_ALLGATHER ? o->alen + o->len : kind == OP_BARRIER ? 0 : o->len;
    o->rbuf = malloc(o->rcap + 2 * GUARD);
    o->sbuf = malloc(o->alen + 1);
    o->scopy = malloc(o->alen + 1);
    if (!o->rbuf || !o->sbuf || !o->scopy) fail("no memory");
    memset(o->rbuf, 0xa5, GUARD);
    memset(o->rbuf + GUARD, 0x5a, o->rcap);
    memset(o->rbuf + GUARD + o->rcap, 0xa5, GUARD);
    for (size_t i = 0; i < o->alen; i++) o->sbuf[i] = (uint8_t)(i * 7u + (unsigned)op_no * 13u + 3u);
    memcpy(o->scopy, o->sbuf, o->alen);
    switch (kind) {
    case OP_BCAST: o->tag = tag_of(KOLO_CALL_BROADCAST, KOLO_UINT8, -1, 1); break; /* root 1 */
    case OP_ALLREDUCE: o->tag = tag_of(KOLO_CALL_ALLREDUCE, KOLO_UINT8, KOLO_SUM, 0); break; /* scales 1 and 1 */
    case OP_ALLGATHER: o->tag = tag_of(KOLO_CALL_ALLGATHER, KOLO_UINT8, -1, 0); break;
    case OP_BARRIER: o->tag = tag_of(KOLO_CALL_BARRIER, -1, -1, 0); break;
    default: o->tag = 0; break;
    }
    return o;
}

static void op_free(rop *o)
{
    free(o->rbuf);
    free(o->sbuf);
    free(o->scopy);
    free(o);
}

static void check_guards(const rop *o)
{
    for (size_t i = 0; i < GUARD; i++)
        if (o->rbuf[i] != 0xa5 || o->rbuf[GUARD + o->rcap + i] != 0xa5)
            fail("R wrote %s its buffer (guard byte %zu)", o->rbuf[i] != 0xa5 ? "before" : "past", i);
    if (memcmp(o->sbuf, o->scopy, o->alen) != 0) fail("R changed its input");
}

/* The payload of R's frame: what R was given to send. */
static void read_r_payload(const rop *o)
{
    uint8_t *p = malloc(o->alen + 1);
    if (!p) fail("no memory");
    if (read_full(hfd[o->ch], p, o->alen, ANSWER_S) != RD_OK || memcmp(p, o->sbuf, o->alen) != 0)
        fail("R's frame does not carry its %zu bytes", o->alen);
    free(p);
}

/* R's frame for this operation, read and checked before the harness answers. */
static void read_r_frame(const rop *o)
{
    uint8_t h[F_HDR];
    int r = read_full(hfd[o->ch], h, sizeof(h), ANSWER_S);
    if (r != RD_OK) fail("%s instead of R's frame", r == RD_EOF ? "the connection ended" : "nothing");
    uint64_t want = o->alen | (uint64_t)o->tag << F_LEN_BITS;
    if (r32(h) != F_MAGIC || r32(h + 4) != 0 || r64(h + 8) != want)
        fail("R's frame begins 0x%08x, flags 0x%08x, length field 0x%016llx; the protocol says 0x%08x, 0, 0x%016llx",
             r32(h), r32(h + 4), (unsigned long long)r64(h + 8), F_MAGIC, (unsigned long long)want);
    read_r_payload(o);
}

/* R has failed: it told rank 1 why in an ABORT frame, unless rank 1 hung up, and ended the
 * connection; its mesh refuses the next call at once, alike. */
static void check_told(const rop *o, bool maybe_frame)
{
    if (hfd[o->ch] >= 0) {
        uint8_t h[F_HDR], why[F_REASON_MAX + 1];
        int r = read_full(hfd[o->ch], h, sizeof(h), ANSWER_S);
        if (r != RD_OK)
            fail("R did not tell rank 1 why it failed (%s)", r == RD_EOF ? "the connection ended" : "silence");
        uint64_t frame = o->alen | (uint64_t)o->tag << F_LEN_BITS;
        if (maybe_frame && r32(h) == F_MAGIC && r32(h + 4) == 0 && r64(h + 8) == frame) {
            read_r_payload(o);
            if ((r = read_full(hfd[o->ch], h, sizeof(h), ANSWER_S)) != RD_OK)
                fail("R did not tell rank 1 why it failed (%s)", r == RD_EOF ? "the connection ended" : "silence");
        }
        size_t want = KOLO_MIN(strlen(o->msg), (size_t)F_REASON_MAX);
        if (r32(h) != F_MAGIC || r32(h + 4) != F_ABORT || r64(h + 8) != want)
            fail("R's last frame begins 0x%08x, flags 0x%08x, length 0x%016llx: not an ABORT of its %zu-byte reason",
                 r32(h), r32(h + 4), (unsigned long long)r64(h + 8), want);
        if (read_full(hfd[o->ch], why, want, ANSWER_S) != RD_OK || memcmp(why, o->msg, want) != 0)
            fail("R's ABORT frame does not carry its message");
        uint8_t more;
        r = read_full(hfd[o->ch], &more, 1, ANSWER_S);
        if (r != RD_EOF) fail("R %s after its ABORT frame", r == RD_OK ? "sent more" : "left the connection open");
    }
    kolo__mesh *m = rr.meshes[o->ch];
    uint8_t b;
    kolo__xfer x;
    kolo__irecv(m, 1, &b, 1, &x);
    int st = kolo__wait1(m, &x);
    if (st != o->st || strcmp(kolo__errmsg(), o->msg) != 0)
        fail("the failed mesh's next call ended with %s: '%s'", kolo_strerror(st), kolo__errmsg());
}

/* Everything R must have of a right frame, the payload at s->b + at. */
static void check_success(const rop *o, const wstream *s, size_t at)
{
    const uint8_t *r = o->rbuf + GUARD, *p = s->b + at;
    switch (o->kind) {
    case OP_ALLREDUCE:
        for (size_t i = 0; i < o->len; i++)
            if (r[i] != (uint8_t)(o->sbuf[i] + p[i]))
                fail("byte %zu is %u, the sum of %u and %u is not", i, r[i], o->sbuf[i], p[i]);
        break;
    case OP_ALLGATHER:
        if (memcmp(r, o->sbuf, o->alen) != 0) fail("R's own block is not its input");
        if (memcmp(r + o->alen, p, o->len) != 0) fail("rank 1's block is not what rank 1 sent");
        break;
    case OP_BARRIER: break;
    default:
        if (memcmp(r, p, o->len) != 0) fail("R received other bytes than rank 1 sent");
        break;
    }
}

static bool names_peer(const rop *o)
{
    return strstr(o->msg, o->st == KOLO_ERR_TIMEOUT ? "rank(s) 1" : PEER) != NULL;
}

/* One operation (see the top); false once R has failed. */
static bool one_op(fz *f)
{
    uint8_t sel = fz_u8(f);
    int kind = (sel & 0x7f) % OP_KINDS;
    size_t len = fz_u16(f), alen = 0;
    if ((kind == OP_BCAST || kind == OP_RAW) && (sel & 0x80)) len = F_PAD_MIN - 2048 + len % 4096;
    else if (kind == OP_ALLGATHER) {
        alen = len % 1024;
        len = fz_u16(f) % 1024;
    } else len %= 2048;
    rop *o = op_new(kind, len, alen);
    cur = o;
    wstream *s = &out[o->ch];
    if (pthread_create(&o->thread, NULL, run_op, o) != 0) fail("pthread_create failed");
    /* towards a peer that hung up, R may already know it (a wait saw the hang-up) and send nothing */
    bool sends = o->kind == OP_ALLREDUCE || o->kind == OP_ALLGATHER || o->kind == OP_BARRIER;
    bool maybe_frame = sends && s->closed;
    if (sends && !s->closed) read_r_frame(o);
    /* on a connection the harness closed, the pieces are drawn (the input's layout holds) and dropped */
    wstream gone = {0}, *w = s->closed ? &gone : s;
    size_t from = w->n;
    int np = fz_u8(f) % 5;
    for (int i = 0; i < np; i++) piece(f, w, o);
    if (!s->closed && s->n > from) write_out(f, hfd[o->ch], s, from);
    free(gone.b);
    int end = fz_u8(f) % 8, st = KOLO_OK;
    size_t at = 0, frame = 0;
    int j = judge(s, o->len, o->ch == KOLO_CHANNEL_DIRECT ? o->tag : 0, &at, &frame, &st);
    bool silent = j == J_NEED && end == 7 && !s->closed;
    if (!s->closed && (end == 5 || end == 6 || (j == J_NEED && end != 7))) {
        /* a close is a FIN, as R sees it; the harness still reads what R says back */
        if (end == 6) {
            s->reset = true;
            /* a reset throws away what the kernel has not sent yet (a small write held back behind
             * the one before it): the bytes written must be R's before the reset is, unless R is
             * done (one that failed reads nothing more, and acknowledges nothing) */
            int q = 0;
            uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
            while (ioctl(hfd[o->ch], SIOCOUTQ, &q) == 0 && q > 0 && !atomic_load(&o->done)) {
                if (kolo__now_ns() > deadline) fail("R did not take %d bytes in %g s", q, ANSWER_S);
                usleep(20);
            }
            close_reset(hfd[o->ch]);
            hfd[o->ch] = -1;
        } else {
            shutdown(hfd[o->ch], SHUT_WR);
        }
        s->closed = true;
    }
    if (j == J_NEED) st = silent ? KOLO_ERR_TIMEOUT : KOLO_ERR_PEER_LOST;
    join_op(o, silent ? 0.3 * 2 + ANSWER_S : ANSWER_S);
    if (verbose)
        fprintf(stderr, "fuzz_frames: %d %s of %zu on channel %d: R %s '%s', the protocol %s\n", op_no,
                op_names[o->kind], o->len, o->ch, kolo_strerror(o->st), o->msg, kolo_strerror(st));
    check_guards(o);
    /* A reset may throw away what R had not read yet (Linux's receive then fails at once), and a
     * send to a peer that hung up before the call fails, or is refused where R saw the hang-up
     * already (xfer.c, keep_loss): then the peer is lost, whatever the bytes before said. */
    if ((s->reset || maybe_frame) && o->st == KOLO_ERR_PEER_LOST) st = KOLO_ERR_PEER_LOST;
    if (st == KOLO_OK) {
        if (o->st != KOLO_OK) fail("R failed where the protocol has it succeed");
        /* towards a peer that half-closed, R's send went out all the same (its success says so):
         * the harness reads it now, or the next failure's ABORT would be read behind it */
        if (maybe_frame && hfd[o->ch] >= 0) read_r_frame(o);
        check_success(o, s, at);
        s->taken += frame;
    } else {
        if (o->st == KOLO_OK) fail("R succeeded where the protocol has it fail with %s", kolo_strerror(st));
        if (o->st != st) fail("R failed with %s, the protocol says %s", kolo_strerror(o->st), kolo_strerror(st));
        if (!names_peer(o)) fail("R's message does not name rank 1");
        check_told(o, maybe_frame);
    }
    cur = NULL;
    op_free(o);
    return st == KOLO_OK;
}

/* ---------------------------------------------------------------- one input */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (getenv("KOLO_LOG_LEVEL")) kolo__log_init();
    else kolo__log_level = KOLO_LOG_NONE; /* an error per failed input would drown the fuzzer's output */
    signal(SIGPIPE, SIG_IGN);
    setenv("KOLO_OP_TIMEOUT", OP_TIMEOUT, 0);
    verbose = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    /* rank 1's record names a listening port, which R (rank 0) never dials */
    lfd_keep = listen_loopback(&lport_keep);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    int fds = count_fds();
    memset(out, 0, sizeof(out));
    start();
    for (op_no = 0; op_no < MAX_OPS && f.n && one_op(&f); op_no++) {}
    for (int ch = 0; ch < NCH; ch++) {
        kolo__mesh_destroy(rr.meshes[ch]);
        if (hfd[ch] >= 0) close(hfd[ch]);
        free(out[ch].b);
    }
    kolo__free(rr.peers);
    kolo__store_server_stop(srv);
    srv = NULL;
    if (count_fds() != fds) fail("the process holds %d descriptors after the input, %d before", count_fds(), fds);
    return 0;
}
