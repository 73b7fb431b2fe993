/* fuzz_shm.c - the shared-memory transport's rings (shm.c) as a garbled peer holding the job secret
 * writes them, and the direct collectives that read them (xfer.c's receive path and wait loop).
 *
 * Each input is a job of 2 ranks of which rank 0, R, is real: it starts with kolo__mesh_build
 * against a real store (store.c, a fresh server on 127.0.0.1, port 0) and the harness, as rank 1
 * of R's own host (it publishes R's host key), completes both channels' handshakes rightly, as
 * fuzz_mesh.c's right connector does: it takes the segment R offers (shm_open of the name R sent,
 * mapped whole, R's token checked), says so, and declines single-copy (its result's CMA verdict 0
 * and a probe at address 0: R must answer 0), so that the pair moves ring copies only. Rings are
 * 64 KiB (KOLO_SHM_RING_SIZE, set before the first input unless already set: the smallest size
 * mesh.c ever picks, so that frames and counters wrap and a payload outgrows a ring). R, the
 * segment's creator, sends on ring 0 and reads ring 1: the harness writes ring 1 and its control
 * block (as the producer, and, where the input says, the words R owns too), and reads ring 0.
 *
 * Then R runs up to 8 operations, one at a time, each on a thread of its own, on the very meshes
 * its start-up built (kolo_broadcast and the rest as core/kolo.c calls them: the call tag set on
 * the direct mesh):
 *
 *   0 BCAST      kolo__coll_broadcast rooted at rank 1: R receives one frame of L bytes;
 *   1 ALLREDUCE  kolo__coll_allreduce of L uint8 by sum, out of place (L < 2048: the one-round
 *                exchange): R sends its buffer, receives rank 1's, returns the sums (mod 256);
 *   2 BARRIER    kolo__coll_barrier: a frame of 0 bytes each way;
 *   3 RAW        kolo__irecv and kolo__wait1 on the engine's channel (1), whose mesh has no call tag:
 *                R receives one frame of L bytes, whatever tag it carries;
 *   4 SEND       kolo__isend and kolo__wait1 on the engine's channel: R sends one frame of L bytes.
 *
 * The ring as the protocol has it (the top of shm.c, "framing"): positions are 64-bit stream
 * counters, a ring byte at position p lies at p mod the ring's size. A frame starts on a line of
 * 64 bytes at position t: a mark (8 bytes, t + 1 once the frame may be read), the 16-byte header
 * of every transport (transport.h), then the payload: at t + 24 when it is at most 4096 bytes
 * (written whole before the mark), else at t + 64, streamed behind the producer's counter `head`.
 * The frame ends on the next line, where the producer zeroes the next mark before it publishes.
 * The consumer owns `tail`, the producer `head`: each side's counter is its own, and the peer's
 * writes to it mean nothing (a peer that garbles R's own counters changes nothing R does).
 *
 * The harness keeps a copy of everything it wrote into ring 1 (and the head it published), and
 * predicts from the protocol, not from shm.c's code, how R's receive of L bytes under its call
 * tag T (0 on channel 1), from its tail t (where its last frame ended), ends:
 *
 *   - the mark at t is 0: R waits; any other value but t + 1: KOLO_ERR_PROTOCOL (garbled);
 *   - the header as fuzz_frames.c has it: magic KOLM with the ABORT or the GOODBYE flag:
 *     KOLO_ERR_PEER_LOST; another magic: KOLO_ERR_PROTOCOL; a tag neither 0 nor T (T not 0), or a
 *     length not L: KOLO_ERR_MISMATCH; the single-copy flag (bit 0), this pair never having passed
 *     the probe: KOLO_ERR_PROTOCOL; other flags' bits are the transport's and mean nothing here;
 *   - L <= 4096: R completes with the L bytes at t + 24;
 *   - else, with the head h the harness published and p = t + 64: h <= p, R waits; h - p larger
 *     than the ring: KOLO_ERR_PROTOCOL (a head past what the ring can hold); h - p < L, R waits
 *     (for the rest); else R completes with the L bytes at p;
 *   - where R waits: a close (or reset) of the TCP sentinel socket, KOLO_ERR_PEER_LOST (whatever
 *     the control block's closed word and reason say: they name the cause only); silence,
 *     KOLO_ERR_TIMEOUT after KOLO_OP_TIMEOUT (0.3 s here, set before the first input unless set).
 *   After a success R's tail (its control word, which the harness reads) is the frame's end.
 *
 * Where R sends, the harness reads R's frame from ring 0 as the consumer, checks its mark, its
 * header (magic, flags 0, the length with R's call tag in its top 16 bits) and its payload, and
 * moves ring 0's tail. SEND may read it wrongly on purpose; after a tail garbled so (or the
 * sentinel closed), R's sends are no longer followed: the harness reads no more of ring 0, and
 * any operation may then also end in KOLO_ERR_PROTOCOL (a tail beyond R's head or a ring behind
 * it), KOLO_ERR_TIMEOUT (no room) or, the sentinel closed, KOLO_ERR_PEER_LOST; a SEND in success.
 * A peer whose sentinel was closed in an earlier operation may be refused at once
 * (KOLO_ERR_PEER_LOST, xfer.c keep_loss), however right its bytes.
 *
 * A failure's message must name rank 1 ("rank 1 on fake1 (127.0.0.1)", or "rank(s) 1" for a
 * timeout). Then R must have told rank 1 why: ring 0's control block reads closed = ABORTED with
 * R's message (its first 383 bytes) as the reason, and R's end of the sentinel is shut. A second
 * call on the failed mesh fails at once alike. Whatever happened: R's guard bytes either side of
 * each buffer intact, its input unchanged, and R wrote nothing outside its own words of the
 * segment (ring 1's data and head read back exactly as the harness wrote them: a write past ring
 * 0's end lands there, since ASan cannot see inside the mapping). After the input the meshes are
 * destroyed, no /kolo-<pid>-* segment is left in /dev/shm, and the process holds exactly the
 * descriptors it held before.
 *
 * The input: operations until it ends or R fails, each:
 *   u8 op        (op & 63) % 5 the operation; bit 7 a streamed size (BCAST, RAW, SEND: L = 4097 + u16,
 *                and 65536 more with bit 6: up to twice the ring), else u16 % 4097 (ALLREDUCE: % 2048);
 *   u16 size
 *   SEND:        u8 how (% 4): 0 read R's frame rightly; 1 rightly, then ring 0's tail set to a u64
 *                (four u16, high first); 2 u16 % (L + 1) bytes of its payload, then the tail a u64;
 *                3 read nothing (R's frame stays); after 1-3 R's sends are no longer predicted;
 *   else:        u8 pieces % 8, u8 late (% (pieces + 1): the pieces from there on are written after
 *                R has started, 100 us on: appends only), then each piece, a u8 kind (% 10) and its
 *                arguments, at the harness's next frame position (the line after what it wrote):
 *     0 RIGHT    the right frame, u8 seed (one that does not fit where R has not read yet is
 *                written as far as it fits: mark, header and what of a streamed payload fits);
 *     1 BADHDR   the right frame with its header changed (u8 what % 7: 0 the magic's byte u8 % 4 set
 *                to u8; 1 the flags a u32 (two u16); 2 the length plus an i8 (not 0); 3 the whole
 *                length field a u64; 4 the tag a u16; 5 the length 2^48 + L; 6 the single-copy
 *                flag with u8 << 1 beside it), u8 seed;
 *     2 BADMARK  the right frame under a mark of a u64, u8 seed;
 *     3 RAW      a span (<= 64 bytes) of raw bytes, its first 8 (the mark's slot) stored last;
 *     4 HEADER   the mark and right header alone (its streamed payload may follow);
 *     5 PAYLOAD  L bytes of payload (u8 seed) from where the harness wrote last, head moved past;
 *     6 HEAD     ring 1's head (u8 how % 4): past what was written by u16; a ring and u16 beyond
 *                it; u16 + 1 behind it; a u64. Early only; later appends then wait for the next
 *                operation (R may already be reading bytes a late append would write);
 *     7 OWN      a word R owns garbled with a u64 (u8 which % 3: ring 1's tail, ring 0's head, ring
 *                0's acks), early only; ring 0's head is put back after the operation (the harness
 *                reads it to follow R's streamed frames); predicted: nothing changes;
 *     8 CTL      ring 1's closed word (u8 % 4: 0, CLOSED, ABORTED, a u32) and reason (a span <= 384,
 *                the rest zeroed), then a u32 into ring 1's nudge and ring 0's want_cma and asleep,
 *                and with a u8 slot into ring 0's call_way[slot % slots]: R reads closed and reason
 *                only at a hang-up, asleep to wake a sleeper that is not there, the others never here;
 *     9 BELL     ring 1's doorbell bumped and woken, with no data;
 *   u8 end       % 8: 5 a close (FIN), 6 a reset, 7 silence; else nothing (a close where R still
 *                waits). A close or reset is for good.
 *   A span is a u16 length and then as many bytes (fz_span); past the input's end every draw is 0.
 *
 * Not reached here: single-copy (CMA) descriptors (fuzz_cma.c reaches them), the way choice by
 * timings and its control words' effects (want_cma, nudge, call_way are written, never read by R
 * here), the sleeping producer's side of the doorbell on ring 0, receives of payloads longer than
 * the ring (the harness writes a receive's bytes before R reads them; SEND streams R's longer
 * frames; fuzz_cma.c streams them to R, rightly only), the allgather, the ring allreduce and every
 * algorithm of 3 or more members, the engine's goodbye.
 *
 * shm.c's layout (ring_ctl) is the wire's: this file includes shm.c. Set KOLO_LOG_LEVEL to see
 * R's errors, KOLO_FUZZ_VERBOSE for how each operation ended. */
#include "../../src/net/shm.c"

#include "../../src/boot/auth.h"
#include "../../src/boot/store.h"
#include "../../src/coll/coll.h"
#include "fuzz.h"

#include <pthread.h>
#include <stdarg.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char SECRET[] = "fuzz-shm-secret";
static const char JOB[] = "fuzz-shm-job";
#define NCH KOLO_NCHANNELS
#define MAX_OPS 8
#define GUARD 64
#define ANSWER_S 5.0
#define OP_TIMEOUT "0.3"
#define RING "65536"
static const char PEER[] = "rank 1 on fake1 (127.0.0.1)";

KOLO_PRINTF(1, 2) static _Noreturn void fail(const char *fmt, ...);
#define FZ_PEER "R"
#define FZ_SHM_RING
#include "fuzz_net.h"
#include "fuzz_rank.h"

enum { OP_BCAST, OP_ALLREDUCE, OP_BARRIER, OP_RAW, OP_SEND, OP_KINDS };
static const char *const op_names[] = {"broadcast", "allreduce", "barrier", "receive", "send"};

/* ---------------------------------------------------------------- the real rank */

typedef struct rop {
    int kind, ch;
    size_t len;   /* what R receives from rank 1, or (SEND) sends */
    size_t alen;  /* what R sends (allreduce: len; SEND: len) */
    uint16_t tag; /* R's call tag on the direct mesh; 0 on the engine's */
    uint8_t *rbuf; /* GUARD + what R writes + GUARD */
    size_t rcap;
    uint8_t *sbuf, *scopy; /* what R sends, and a copy to compare it with afterwards */
    pthread_t thread;
    bool started;
    atomic_int done;
    int st;
    char msg[1024];
} rop;

/* One channel's pair as the harness holds it. */
typedef struct chan {
    int fd;             /* the sentinel socket, -1 once reset */
    bool closed, reset; /* the harness closed its end (FIN), or reset it */
    uint8_t *base;      /* the segment, mapped */
    size_t maplen, size;
    ring_ctl *txc, *rxc; /* R's tx (ring 0: the harness reads) and rx (ring 1: the harness writes) */
    uint8_t *tx, *rx;
    uint8_t *shadow;    /* everything the harness wrote into ring 1, by offset */
    uint64_t head;      /* ring 1's head as the harness published it */
    uint64_t hp;        /* where the harness wrote last; its next frame starts on the line after */
    uint64_t rt;        /* R's tail: where R's next frame begins (its last frame's end) */
    uint64_t ct;        /* the harness's tail on ring 0: where R's next frame begins there */
    bool full;          /* an append did not fit: later ones of this operation are dropped */
    bool no_late;       /* a head moved on purpose: no late appends this operation */
    bool tx_garbled;    /* ring 0's tail garbled: R's sends are no longer predicted */
} chan;

static int lfd_keep, lport_keep;
static char hostkey[96];
static chan chs[NCH];
static bool verbose;
static rop *cur;
static int op_no;

static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_shm: ");
    if (cur)
        fprintf(stderr, "operation %d (%s of %zu bytes on channel %d): ", op_no, op_names[cur->kind], cur->len,
                cur->ch);
    vfprintf(stderr, fmt, ap);
    if (cur && atomic_load(&cur->done)) fprintf(stderr, " (R ended with %s: '%s')", kolo_strerror(cur->st), cur->msg);
    else if (cur && cur->started) fprintf(stderr, " (R is still in it)");
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void *run_op(void *arg)
{
    rop *o = arg;
    kolo__mesh *m = rr.meshes[o->ch];
    int ranks[2] = {0, 1};
    kolo__group g = {.size = 2, .rank = 0, .ranks = ranks};
    uint8_t *r = o->rbuf + GUARD;
    int st;
    kolo__xfer x;
    m->call_tag = o->ch == KOLO_CHANNEL_DIRECT ? o->tag : 0;
    switch (o->kind) {
    case OP_BCAST: st = kolo__coll_broadcast(m, &g, r, o->len, 1); break;
    case OP_ALLREDUCE: st = kolo__coll_allreduce(m, &g, o->sbuf, r, o->len, KOLO_UINT8, KOLO_SUM, 1.0, 1.0); break;
    case OP_BARRIER: st = kolo__coll_barrier(m, &g); break;
    case OP_RAW:
        kolo__irecv(m, 1, r, o->len, &x);
        st = kolo__wait1(m, &x);
        break;
    default:
        kolo__isend(m, 1, o->sbuf, o->len, &x);
        st = kolo__wait1(m, &x);
        break;
    }
    m->call_tag = 0;
    o->st = st;
    snprintf(o->msg, sizeof(o->msg), "%s", st == KOLO_OK ? "" : kolo__errmsg());
    atomic_store(&o->done, 1);
    return NULL;
}

static void join_op(rop *o, double within_s) { fz_join_op(&o->done, o->thread, within_s); }

/* ---------------------------------------------------------------- the handshake and the segment */

/* Maps the segment R offered (fuzz_rank.h), and makes the harness's copy of ring 1. */
static void take_segment(chan *c, const uint8_t *name_field, uint32_t ch)
{
    fz_seg sg;
    fz_take_segment(&sg, name_field, ch, 65536);
    c->base = sg.base;
    c->maplen = sg.maplen;
    c->size = sg.size;
    c->txc = sg.txc;
    c->rxc = sg.rxc;
    c->tx = sg.tx;
    c->rx = sg.rx;
    c->shadow = calloc(1, c->size);
    if (!c->shadow) fail("no memory");
}

/* Rank 1 connects to R on channel ch rightly, takes the shared memory, declines single-copy. */
static void handshake(int rport, uint32_t ch)
{
    chan *c = &chs[ch];
    uint8_t ack[W_ACK], res[W_RESULT], fin[W_FINAL];
    int fd = connect_as_rank_1(rport, ch, 0x3c, ack);
    if (r32(ack + KOLO_MAC_LEN) != 1)
        fail("channel %u: R offers no shared memory to a rank of its host (is /dev/shm full?)", ch);
    take_segment(c, ack + KOLO_MAC_LEN + 4, ch);
    memset(res, 0, sizeof(res));
    w32(res, 1); /* taken; CMA 0, probe at address 0 (nothing R could read) */
    send_bytes(fd, res, sizeof(res));
    if (read_full(fd, fin, sizeof(fin), ANSWER_S) != RD_OK || r32(fin) != 0)
        fail("channel %u: no final answer from R, or one saying it read a probe at address 0", ch);
    c->fd = fd;
}

/* R started, rank 1 on its host (R's own host key) by shared memory on both channels. */
static void start(void)
{
    start_as_rank_1(lport_keep, hostkey, handshake);
    for (int ch = 0; ch < NCH; ch++) {
        kolo__conn *c = rr.meshes[ch]->conns[1];
        if (!c || c->tp != &kolo__shm_transport)
            fail("channel %d: R's connection to rank 1 is not by shared memory", ch);
        if (kolo__shm_cma_state(c) != -1) fail("channel %d: R reads single-copy from a rank that declined it", ch);
    }
}

/* ---------------------------------------------------------------- writing ring 1 */

static uint8_t pay(uint8_t seed, size_t i) { return (uint8_t)(seed * 29u + i * 131u + (i >> 8) * 7u + 1u); }

/* Bytes into ring 1 at stream position pos (wrapping), and into the harness's copy. */
static void rx_put(chan *c, uint64_t pos, const void *src, size_t n)
{
    ring_copy(c->rx, c->size, pos, (void *)(uintptr_t)src, n, true);
    ring_copy(c->shadow, c->size, pos, (void *)(uintptr_t)src, n, true);
}

static void rx_payload(chan *c, uint64_t pos, size_t len, uint8_t seed)
{
    uint8_t chunk[4096];
    for (size_t i = 0; i < len; i += sizeof(chunk)) {
        size_t k = KOLO_MIN(len - i, sizeof(chunk));
        for (size_t j = 0; j < k; j++) chunk[j] = pay(seed, i + j);
        rx_put(c, pos + i, chunk, k);
    }
}

/* An 8-byte word at a line's start (a mark's slot), stored with release: last, as a mark is. */
static void rx_word(chan *c, uint64_t pos, uint64_t v, memory_order mo)
{
    size_t off = (size_t)(pos & (c->size - 1));
    memcpy(c->shadow + off, &v, 8);
    atomic_store_explicit((_Atomic uint64_t *)(void *)(c->rx + off), v, mo);
}

static uint64_t shadow_word(const chan *c, uint64_t pos)
{
    uint64_t v;
    memcpy(&v, c->shadow + (pos & (c->size - 1)), 8);
    return v;
}

static void shadow_get(const chan *c, uint64_t pos, void *dst, size_t n)
{
    ring_copy(c->shadow, c->size, pos, dst, n, false);
}

static void set_head(chan *c, uint64_t h)
{
    c->head = h;
    atomic_store_explicit(&c->rxc->head, h, memory_order_release);
}

/* The producer's doorbell: bumped and woken, whether R sleeps or not. */
static void ring_rx_bell(chan *c) { fz_bell(c->rxc); }

/* Whether [.., end) and the next mark's slot lie where R has nothing unread. */
static bool fits(const chan *c, uint64_t end) { return !c->full && end + R_MARK <= c->rt + c->size; }

/* A frame at the line after what was written: header h, mark value mark, payload of len bytes
 * drawn with seed (or none). Written as the protocol's producer does: payload and header, the
 * next mark zeroed, the mark, then head. */
static void put_frame(chan *c, const uint8_t h[F_HDR], uint64_t mark, size_t len, bool payload, uint8_t seed)
{
    uint64_t t = pad(c->hp);
    bool inl = len <= R_INLINE;
    uint64_t at = t + (inl ? R_MARK + F_HDR : R_LINE), end = pad(at + len);
    size_t n = len;
    if (!fits(c, end)) {
        /* as far as it fits: a streamed payload in part, an inline frame not at all */
        if (inl || !fits(c, at)) {
            c->full = true;
            return;
        }
        n = (size_t)(c->rt + c->size - R_MARK - at);
        end = at + n;
        c->full = true;
    }
    if (payload) rx_payload(c, at, n, seed);
    rx_put(c, t + R_MARK, h, F_HDR);
    if (!c->full) rx_word(c, end, 0, memory_order_relaxed);
    /* the mark before the head: a receive still streaming an earlier frame's payload reads only
     * below the head, so never this frame's mark half written */
    rx_word(c, t, mark, memory_order_release);
    set_head(c, payload || inl ? end : at);
    c->hp = payload || inl ? end : at;
}

static void right_hdr(uint8_t h[F_HDR], uint32_t magic, uint32_t flags, uint64_t field)
{
    w32(h, magic);
    w32(h + 4, flags);
    w64(h + 8, field);
}

static uint64_t fz_u64(fz *f)
{
    uint64_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 16 | fz_u16(f);
    return v;
}

/* One piece (see the top) for R's receive of o->len bytes; late: R is running. */
static void piece(fz *f, chan *c, const rop *o, bool late)
{
    uint64_t right = o->len | (uint64_t)o->tag << F_LEN_BITS, t = pad(c->hp);
    uint8_t h[F_HDR], kind = fz_u8(f) % 10, b;
    size_t n;
    const uint8_t *x;
    bool drop = late && c->no_late; /* drawn all the same: the layout holds */
    right_hdr(h, F_MAGIC, 0, right);
    switch (kind) {
    case 0:
        b = fz_u8(f);
        if (!drop) put_frame(c, h, t + 1, o->len, true, b);
        break;
    case 1: {
        switch (fz_u8(f) % 7) {
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
        case 3: w64(h + 8, fz_u64(f)); break;
        case 4: w64(h + 8, o->len | (uint64_t)fz_u16(f) << F_LEN_BITS); break;
        case 5: w64(h + 8, ((uint64_t)1 << F_LEN_BITS) + o->len); break;
        default: w32(h + 4, R_CMA | (uint32_t)fz_u8(f) << 1); break;
        }
        b = fz_u8(f);
        if (!drop) put_frame(c, h, t + 1, o->len, true, b);
        break;
    }
    case 2: {
        uint64_t m = fz_u64(f);
        b = fz_u8(f);
        if (!drop) put_frame(c, h, m, o->len, true, b);
        break;
    }
    case 3:
        x = fz_span(f, 64, &n);
        if (drop || !fits(c, t + KOLO_MAX(n, (size_t)R_MARK))) break;
        if (n > R_MARK) rx_put(c, t + R_MARK, x + R_MARK, n - R_MARK);
        {
            uint64_t w = 0;
            memcpy(&w, x, KOLO_MIN(n, (size_t)R_MARK));
            rx_word(c, t, w, memory_order_release);
        }
        c->hp = t + KOLO_MAX(n, (size_t)1);
        break;
    case 4:
        if (!drop) put_frame(c, h, t + 1, o->len, false, 0);
        break;
    case 5: {
        b = fz_u8(f);
        if (drop) break;
        uint64_t at = c->hp, end = at + o->len;
        if (!fits(c, end)) {
            c->full = true;
            break;
        }
        rx_payload(c, at, o->len, b);
        if (pad(end) + R_MARK <= c->rt + c->size) rx_word(c, pad(end), 0, memory_order_relaxed);
        set_head(c, end);
        c->hp = end;
        break;
    }
    case 6: {
        b = fz_u8(f) % 4;
        uint64_t v = b == 3 ? fz_u64(f) : fz_u16(f), hd;
        if (late) break;
        hd = b == 0 ? c->hp + v : b == 1 ? c->hp + c->size + v : b == 2 ? c->hp - v - 1 : v;
        set_head(c, hd);
        c->no_late = true;
        break;
    }
    case 7: {
        b = fz_u8(f) % 3;
        uint64_t v = fz_u64(f);
        if (late) break;
        if (b == 0) atomic_store(&c->rxc->tail, v);
        else if (b == 1) atomic_store(&c->txc->head, v);
        else atomic_store(&c->txc->acks, v);
        break;
    }
    case 8: {
        b = fz_u8(f) % 4;
        uint32_t word = b == 3 ? (uint32_t)fz_u16(f) << 16 | fz_u16(f) : b == 2 ? R_ABORTED : b;
        x = fz_span(f, F_REASON_MAX, &n);
        uint32_t junk = (uint32_t)fz_u16(f) << 16 | fz_u16(f);
        uint8_t slot = fz_u8(f);
        memcpy(c->rxc->reason, x, n);
        memset(c->rxc->reason + n, 0, F_REASON_MAX - n);
        atomic_store(&c->rxc->nudge, junk);
        atomic_store(&c->txc->want_cma, junk);
        atomic_store(&c->txc->call_way[slot % KOLO_PAIR_SLOTS], (uint64_t)junk << 7 | slot);
        atomic_store(&c->txc->asleep, junk);
        atomic_store(&c->rxc->closed, word);
        break;
    }
    default: ring_rx_bell(c); break;
    }
}

/* ---------------------------------------------------------------- reading ring 0 */

static uint64_t tx_word(const chan *c, uint64_t pos)
{
    return atomic_load_explicit((_Atomic uint64_t *)(void *)(c->tx + (pos & (c->size - 1))), memory_order_acquire);
}

static void tx_get(const chan *c, uint64_t pos, void *dst, size_t n)
{
    ring_copy(c->tx, c->size, pos, dst, n, false);
}

static void set_tx_tail(chan *c, uint64_t v)
{
    atomic_store_explicit(&c->txc->tail, v, memory_order_release);
    ring_rx_bell(c); /* R sleeps on ring 1's doorbell for room too (shm.c, "Sleeping") */
}

/* R's frame for operation o at the harness's tail, read and checked: up to `upto` payload bytes
 * (all of it: o->alen), the tail moved past what was read. */
static void read_r_frame(chan *c, const rop *o, size_t upto)
{
    uint64_t t = c->ct, deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    uint64_t m;
    while ((m = tx_word(c, t)) != t + 1) {
        if (m != 0) fail("R's frame at %llu has the mark %#llx", (unsigned long long)t, (unsigned long long)m);
        if (kolo__now_ns() > deadline) fail("no frame from R within %g s", ANSWER_S);
        usleep(20);
    }
    uint8_t h[F_HDR];
    tx_get(c, t + R_MARK, h, F_HDR);
    uint64_t want = o->alen | (uint64_t)o->tag << F_LEN_BITS;
    if (r32(h) != F_MAGIC || r32(h + 4) != 0 || r64(h + 8) != want)
        fail("R's frame begins 0x%08x, flags 0x%08x, length field 0x%016llx; the protocol says 0x%08x, 0, 0x%016llx",
             r32(h), r32(h + 4), (unsigned long long)r64(h + 8), F_MAGIC, (unsigned long long)want);
    bool inl = o->alen <= R_INLINE;
    uint64_t at = t + (inl ? R_MARK + F_HDR : R_LINE);
    uint8_t *p = malloc(o->alen + 1);
    if (!p) fail("no memory");
    size_t got = 0;
    upto = KOLO_MIN(upto, o->alen);
    if (inl) {
        tx_get(c, at, p, o->alen);
        got = o->alen;
    }
    while (got < upto) {
        uint64_t hd = atomic_load_explicit(&c->txc->head, memory_order_acquire);
        if (hd > at + got && hd - (at + got) <= c->size) {
            size_t k = (size_t)KOLO_MIN(hd - (at + got), (uint64_t)(upto - got));
            tx_get(c, at + got, p + got, k);
            got += k;
            set_tx_tail(c, at + got);
            continue;
        }
        if (kolo__now_ns() > deadline) fail("R streamed %zu of its %zu bytes in %g s", got, o->alen, ANSWER_S);
        usleep(10);
    }
    if (memcmp(p, o->sbuf, KOLO_MIN(got, upto)) != 0) fail("R's frame does not carry its %zu bytes", o->alen);
    free(p);
    if (upto == o->alen) {
        c->ct = pad(at + o->alen);
        set_tx_tail(c, c->ct);
    }
}

/* ---------------------------------------------------------------- the prediction */

enum { J_NEED, J_OK, J_FAIL };

/* How R's receive of len bytes under call tag mine ends on what the harness wrote (see the top). */
static int judge(const chan *c, size_t len, uint16_t mine, uint64_t *payload, uint64_t *end, int *st)
{
    uint64_t t = c->rt, mark = shadow_word(c, t);
    *st = KOLO_OK;
    if (mark == 0) return J_NEED;
    if (mark != t + 1) {
        *st = KOLO_ERR_PROTOCOL;
        return J_FAIL;
    }
    uint8_t h[F_HDR];
    shadow_get(c, t + R_MARK, h, F_HDR);
    uint32_t magic = r32(h), flags = r32(h + 4);
    uint64_t field = r64(h + 8), flen = field & (((uint64_t)1 << F_LEN_BITS) - 1);
    uint16_t theirs = (uint16_t)(field >> F_LEN_BITS);
    if (magic == F_MAGIC && (flags & (F_ABORT | F_GOODBYE))) *st = KOLO_ERR_PEER_LOST;
    else if (magic != F_MAGIC) *st = KOLO_ERR_PROTOCOL;
    else if (theirs && mine && theirs != mine) *st = KOLO_ERR_MISMATCH;
    else if (flen != len) *st = KOLO_ERR_MISMATCH;
    else if (flags & R_CMA) *st = KOLO_ERR_PROTOCOL;
    if (*st) return J_FAIL;
    if (len <= R_INLINE) {
        *payload = t + R_MARK + F_HDR;
        *end = pad(*payload + len);
        return J_OK;
    }
    uint64_t p = t + R_LINE, hd = c->head;
    if (hd <= p) return J_NEED;
    if (hd - p > c->size) {
        *st = KOLO_ERR_PROTOCOL;
        return J_FAIL;
    }
    if (hd - p < len) return J_NEED;
    *payload = p;
    *end = pad(p + len);
    return J_OK;
}

/* ---------------------------------------------------------------- one operation */

static uint16_t tag_of(int kind, int dtype, int op, int low6)
{
    return (uint16_t)((unsigned)kind << 13 | (unsigned)(dtype + 1) << 9 | (unsigned)(op + 1) << 6 | (unsigned)low6);
}

static rop *op_new(int kind, size_t len)
{
    rop *o = calloc(1, sizeof(*o));
    if (!o) fail("no memory");
    o->kind = kind;
    o->ch = kind == OP_RAW || kind == OP_SEND ? KOLO_CHANNEL_ENGINE : KOLO_CHANNEL_DIRECT;
    o->len = kind == OP_BARRIER ? 0 : len;
    o->alen = kind == OP_ALLREDUCE || kind == OP_SEND ? o->len : 0;
    o->rcap = kind == OP_BARRIER || kind == OP_SEND ? 0 : o->len;
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
    case OP_BCAST: o->tag = tag_of(KOLO_CALL_BROADCAST, KOLO_UINT8, -1, 1); break;
    case OP_ALLREDUCE: o->tag = tag_of(KOLO_CALL_ALLREDUCE, KOLO_UINT8, KOLO_SUM, 0); break;
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

/* R wrote nothing but its own: its guards, its input, and ring 1's data and head as written. */
static void check_bounds(const rop *o, const chan *c)
{
    for (size_t i = 0; i < GUARD; i++)
        if (o->rbuf[i] != 0xa5 || o->rbuf[GUARD + o->rcap + i] != 0xa5)
            fail("R wrote %s its buffer (guard byte %zu)", o->rbuf[i] != 0xa5 ? "before" : "past", i);
    if (memcmp(o->sbuf, o->scopy, o->alen) != 0) fail("R changed its input");
    if (memcmp(c->rx, c->shadow, c->size) != 0) fail("ring 1's bytes are not what the harness wrote: R wrote there");
    if (atomic_load(&c->rxc->head) != c->head) fail("ring 1's head is not what the harness wrote: R wrote there");
}

static void start_op(rop *o)
{
    o->started = true;
    if (pthread_create(&o->thread, NULL, run_op, o) != 0) fail("pthread_create failed");
}

/* R has failed: it marked its ring aborted with its message and shut the sentinel; its mesh
 * refuses the next call at once, alike. */
static void check_told(const rop *o, chan *c) { fz_check_told(c->txc, c->fd, rr.meshes[o->ch], o->st, o->msg); }

static void check_success(const rop *o, const chan *c, uint64_t at)
{
    const uint8_t *r = o->rbuf + GUARD;
    uint8_t *p = malloc(o->len + 1);
    if (!p) fail("no memory");
    shadow_get(c, at, p, o->len);
    if (o->kind == OP_ALLREDUCE) {
        for (size_t i = 0; i < o->len; i++)
            if (r[i] != (uint8_t)(o->sbuf[i] + p[i]))
                fail("byte %zu is %u, the sum of %u and %u is not", i, r[i], o->sbuf[i], p[i]);
    } else if (o->kind != OP_BARRIER && memcmp(r, p, o->len) != 0) {
        fail("R received other bytes than the ring held");
    }
    free(p);
}

static bool names_peer(const rop *o)
{
    return strstr(o->msg, o->st == KOLO_ERR_TIMEOUT ? "rank(s) 1" : PEER) != NULL;
}

/* The sentinel's end (see the top): 6 a reset, else a close (FIN). */
static void hang_up(chan *c, int end)
{
    if (c->closed) return;
    if (end == 6) {
        c->reset = true;
        close_reset(c->fd);
        c->fd = -1;
    } else {
        shutdown(c->fd, SHUT_WR);
    }
    c->closed = true;
}

static bool one_op(fz *f)
{
    uint8_t sel = fz_u8(f);
    int kind = (sel & 0x3f) % OP_KINDS;
    size_t len = fz_u16(f);
    if ((kind == OP_BCAST || kind == OP_RAW || kind == OP_SEND) && (sel & 0x80))
        len = R_INLINE + 1 + len + (sel & 0x40 ? 65536u : 0u);
    else len = kind == OP_ALLREDUCE ? len % 2048 : len % (R_INLINE + 1);
    rop *o = op_new(kind, len);
    cur = o;
    chan *c = &chs[o->ch];
    /* after a hang-up R may refuse its sends, or write them: they are no longer followed */
    if (c->closed) c->tx_garbled = true;
    bool was_closed = c->closed, weak = c->tx_garbled;
    bool sends = kind == OP_ALLREDUCE || kind == OP_BARRIER || kind == OP_SEND;
    uint64_t r_head = c->ct; /* R's own head, as the harness has followed it */
    int st = KOLO_OK, j = J_NEED;
    uint64_t at = 0, end_pos = 0;
    c->full = c->no_late = false;
    if (kind == OP_SEND) {
        int how = fz_u8(f) % 4;
        start_op(o);
        if (weak) {
            /* R's frame may go unwritten (a tail it finds garbled, a loss it kept): not read */
        } else if (how == 0) {
            read_r_frame(c, o, o->alen);
            j = J_OK;
        } else {
            size_t k = how == 1 ? o->alen : how == 2 ? fz_u16(f) % (o->alen + 1) : 0;
            if (how != 3) read_r_frame(c, o, k);
            if (how != 3) set_tx_tail(c, fz_u64(f));
            c->tx_garbled = true;
            j = how == 1 ? J_OK : J_NEED;
            weak = how != 1;
        }
    } else {
        int np = fz_u8(f) % 8, late = fz_u8(f) % (np + 1), i;
        for (i = 0; i < late; i++) piece(f, c, o, false);
        start_op(o);
        if (sends && !weak) read_r_frame(c, o, o->alen);
        if (i < np) usleep(100);
        for (; i < np; i++) piece(f, c, o, true);
        ring_rx_bell(c);
        j = judge(c, o->len, o->ch == KOLO_CHANNEL_DIRECT ? o->tag : 0, &at, &end_pos, &st);
    }
    int end = fz_u8(f) % 8;
    bool silent = j == J_NEED && end == 7 && !c->closed;
    if (end == 5 || end == 6 || (j == J_NEED && end != 7)) hang_up(c, end);
    if (j == J_NEED) st = silent ? KOLO_ERR_TIMEOUT : KOLO_ERR_PEER_LOST;
    join_op(o, silent || weak ? 0.3 * 2 + ANSWER_S : ANSWER_S);
    atomic_store(&c->txc->head, r_head > c->ct ? r_head : c->ct); /* put back where OWN garbled it */
    if (verbose)
        fprintf(stderr, "fuzz_shm: %d %s of %zu on channel %d: R %s '%s', the protocol %s%s\n", op_no,
                op_names[o->kind], o->len, o->ch, kolo_strerror(o->st), o->msg, kolo_strerror(st),
                weak ? " (R's sends unpredicted)" : "");
    check_bounds(o, c);
    /* a peer that hung up in an earlier operation may be refused at once (xfer.c, keep_loss) */
    if (was_closed && o->st == KOLO_ERR_PEER_LOST) st = KOLO_ERR_PEER_LOST;
    /* R's sends unpredicted: no room (a timeout, or the peer lost while R waits for it), or a
     * ring 0 tail it finds garbled */
    if (weak && (o->st == KOLO_ERR_PROTOCOL || (o->st == KOLO_ERR_TIMEOUT && !c->closed) ||
                 (o->st == KOLO_ERR_PEER_LOST && c->closed)))
        st = o->st;
    if (weak && kind == OP_SEND && o->st == KOLO_OK) st = KOLO_OK;
    if (st == KOLO_OK) {
        if (o->st != KOLO_OK) fail("R failed where the protocol has it succeed");
        if (kind != OP_SEND) {
            check_success(o, c, at);
            uint64_t rt = atomic_load(&c->rxc->tail);
            if (rt != end_pos)
                fail("R's tail reads %llu after the frame, which ends at %llu", (unsigned long long)rt,
                     (unsigned long long)end_pos);
            c->rt = end_pos;
            if (pad(c->hp) < c->rt) c->hp = c->rt; /* R read past what was written (a head moved on) */
        }
    } else {
        if (o->st == KOLO_OK) fail("R succeeded where the protocol has it fail with %s", kolo_strerror(st));
        if (o->st != st) fail("R failed with %s, the protocol says %s", kolo_strerror(o->st), kolo_strerror(st));
        if (!names_peer(o)) fail("R's message does not name rank 1");
        check_told(o, c);
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
    else kolo__log_level = KOLO_LOG_NONE;
    signal(SIGPIPE, SIG_IGN);
    setenv("KOLO_OP_TIMEOUT", OP_TIMEOUT, 0);
    setenv("KOLO_SHM_RING_SIZE", RING, 0);
    verbose = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    kolo__host_key(hostkey, sizeof(hostkey));
    lfd_keep = listen_loopback(&lport_keep);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    int fds = count_fds();
    memset(chs, 0, sizeof(chs));
    start();
    if (own_segments() != 0) fail("R left its segment's name in /dev/shm after the handshake");
    for (op_no = 0; op_no < MAX_OPS && f.n && one_op(&f); op_no++) {}
    for (int ch = 0; ch < NCH; ch++) {
        kolo__mesh_destroy(rr.meshes[ch]);
        if (chs[ch].fd >= 0) close(chs[ch].fd);
        munmap(chs[ch].base, chs[ch].maplen);
        free(chs[ch].shadow);
    }
    kolo__free(rr.peers);
    kolo__store_server_stop(srv);
    srv = NULL;
    if (own_segments() != 0) fail("a segment of this process is left in /dev/shm");
    if (count_fds() != fds) fail("the process holds %d descriptors after the input, %d before", count_fds(), fds);
    return 0;
}
