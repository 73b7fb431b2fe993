/* tcp.c - the TCP transport: framed messages over one non-blocking socket per peer and channel.
 *
 * Sends go out with sendmsg() of [header remainder, payload remainder] straight from the user's
 * buffer; receives read [header, payload] with one readv() straight into the user's buffer, so
 * a message costs no copy in user space and one or two system calls (frames of 128 KiB and more
 * may carry filler around the payload, and their receivers read the header first: "filler"
 * below). Only the head of each queue is active; both directions progress independently, so a
 * ring step that sends and receives at once cannot deadlock on full socket buffers.
 */
#include "transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <limits.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Unsent bytes a connection within this host may queue in the kernel (TCP_NOTSENT_LOWAT); the
 * rest waits in our own queue until the socket drains. Over loopback, queued data is sent
 * whenever an ACK is processed, on whichever core processes it: with a 4 MiB send buffer, data
 * flowing both ways on one socket (a 2-rank allgather or alltoall) left from both cores, arrived
 * out of order and was retransmitted 400-900 times per 10 exchanges of 32 MiB. With 64-256 KiB
 * queued at most: none, and 64 MiB allgathers and alltoalls in 13-14 ms instead of 23-24 (one
 * direction alone, broadcast, is unchanged; with 1 MiB queued the reordering came back). */
#define TCP_LOCAL_UNSENT_MAX (128u << 10)

/* Bytes per system call at most: big enough to reach loopback's speed (machine.md: 1 MiB writes
 * give 6 GB/s, 128 KiB ones 2.6), small enough to let the other direction progress. */
#define TCP_IO_MAX (4u << 20)

static bool tcp_abort_reason(kolo__conn *c, char *buf, size_t cap);
static bool drop_to_reason(kolo__conn *c, char *buf, size_t cap);
static int progress_recv(kolo__conn *c);

/* c's peer's machine answers nothing more: its connections fail as lost (keepalive, below). */
static int machine_lost(kolo__conn *c, bool sending, int err)
{
    kolo__mesh *m = c->mesh;
    return kolo__conn_fail(c, kolo__err(KOLO_ERR_PEER_LOST,
                                        "lost rank %d on %s: %s failed (%s): its machine stopped answering, down or "
                                        "cut off from this one (it answered nothing for KOLO_TCP_KEEPALIVE, %g s)",
                                        c->peer, kolo__peer_name(m, c->peer),
                                        sending ? "sending to it" : "receiving from it", strerror(err),
                                        (double)m->keepalive_ns * 1e-9));
}

static int io_error(kolo__conn *c, bool sending, int err)
{
    kolo__mesh *m = c->mesh;
    const char *what = sending ? "sending to it" : "receiving from it";
    bool hangup = err == 0 || err == ECONNRESET || err == EPIPE;
    /* A send that finds the peer gone reads what the peer sent before it went first. A peer that
     * gave up finished the frame it was sending and put its ABORT after it (tcp_abort); this
     * side may be in the middle of receiving that frame, where the reason cannot be found
     * (tcp_abort_reason starts at a frame's start), and a receive the frame completes has its
     * bytes. The reading fails the conn itself if it meets the ABORT or the end. */
    while (hangup && sending && c->recvq && !c->error) {
        const kolo__xfer *x = c->recvq;
        size_t got = x->hdr_done + x->pad_done + x->done + x->tail_done;
        progress_recv(c);
        if (c->recvq == x && x->hdr_done + x->pad_done + x->done + x->tail_done == got) break;
    }
    if (c->error) return c->error;
    char why[KOLO_ABORT_REASON_MAX + 1];
    /* a peer that gave up sent its reason before closing: a send can meet the closed socket
     * before anything reads that frame */
    if (hangup && (tcp_abort_reason(c, why, sizeof(why)) || drop_to_reason(c, why, sizeof(why))))
        return kolo__conn_fail(c, kolo__err_aborted(c, why));
    if (err == ETIMEDOUT || err == EHOSTUNREACH) return machine_lost(c, sending, err);
    if (!hangup && err != ENOTCONN)
        return kolo__conn_fail(c, kolo__err_sys(err, "rank %d on %s: %s failed", c->peer, kolo__peer_name(m, c->peer),
                                                what));
    return kolo__conn_fail(c, kolo__err(KOLO_ERR_PEER_LOST,
                                        "lost rank %d on %s: %s failed (%s): the process died or aborted the job",
                                        c->peer, kolo__peer_name(m, c->peer), what,
                                        err ? strerror(err) : "connection closed"));
}

/* ---- filler: where the payload lands in the kernel's socket buffers ----
 *
 * sendmsg() copies the payload into the socket's page fragments with the kernel's copy_from_user,
 * which on CPUs with fast short REP MOVSB (FSRM: AMD Zen 3 and later, recent Intel) is one `rep
 * movsb`. On this project's Zen 4 VM that instruction copies at 3.5 GB/s instead of 55 when the
 * destination lies 1-15 bytes past the source modulo 4096 (the CPU takes the two for
 * overlapping), and at 30-42 GB/s for some other distances under 64. A frame's header usually
 * goes to the start of a fragment (a fresh one, or one the receiver has freed) or just past the
 * frame before, so its payload lands a few multiples of 16 bytes into a page: when the payload
 * also starts near the start of a page, the distance is small and the whole frame crawls. By
 * where the source starts in its page, alltoalls of 1 MiB between 2 ranks over loopback took (us
 * per call, the ranks' cores sharing a cache) 88-99 at most offsets, but 227-250 at 8 and 24
 * bytes, 118-149 at 56-80 (64 is where glibc's aligned_alloc(64) and PyTorch's CPU allocator put
 * large buffers), 102-111 at 112-136, 92-110 at 4072-4088; allgathers alike; broadcasts 125
 * against 134-143; the ring allreduce hardly (it sends from many offsets). perf put the
 * difference in the sender's _copy_from_iter (2.4x the samples at offset 64, 4x at 8). Open
 * MPI's TCP transport pays it too: 137 us at 16 (malloc's offset), 131-151 at 64, 418-444 at 8.
 *
 * So a frame of TCP_PAD_MIN bytes or more whose payload starts within TCP_PAD_NEAR bytes of a
 * page boundary carries filler: before the payload, enough to land it half a page away from its
 * source's offset, and after it, enough to make the frame whole pages, so that the next frame
 * through the same fragment starts where this one did (with filler before the payload only, the
 * offsets 8 and 4088 still took 123-157 us). Both lengths (0-4095) travel in the header's flags
 * (TCP_PAD_SHIFT). With it the same alltoalls took 85-93 us at every offset tried (0, 8, 16, 24,
 * 48, 64, 80, 128, 1024, 2048, 4072, 4088), allgathers at 64 89-94 against 89-154, broadcasts of
 * 64 KiB-1 MiB alike; with the cores on two CCDs, where every copy crawls anyway, no worse. The
 * filler costs no copy in user space; it is at most 8 KiB on the wire (3 % of a 128 KiB frame on
 * average, 0.4 % of 1 MiB). A receiver learns it from the header, so for frames that long it
 * reads the header alone first (one more system call per frame: no cost seen at 128 KiB-1 MiB);
 * for shorter frames it reads header and payload together as before, and filler on a frame it
 * expected short is a garbled stream.
 */
#define TCP_PAD_MIN ((size_t)128 << 10)
#define TCP_PAD_NEAR 160 /* bytes either side of a page boundary */
#define TCP_PAD_SHIFT 16 /* flags bits 16-27: filler before the payload */
#define TCP_PAD_MASK 0xfffu /* and bits 0-11: after it */

static const unsigned char filler[4096];
/* received filler, never read; per thread, as the engine's thread and the program's receive
 * filler at the same time (a shared sink was a data race, however harmless its bytes) */
static _Thread_local unsigned char filler_sink[4096];
static _Atomic uint64_t filler_sent;    /* bytes, for tests */
static _Atomic size_t test_step;        /* kolo__tcp_test_step: payload bytes per call, one call per pass */

uint64_t kolo__tcp_filler_sent(void) { return atomic_load(&filler_sent); }
void kolo__tcp_test_step(size_t bytes) { atomic_store(&test_step, bytes); }

static bool one_call_per_pass(void) { return atomic_load_explicit(&test_step, memory_order_relaxed) != 0; }

/* The filler a send of x puts before and after its payload (each 0 to 4095 bytes). */
static void send_pad(kolo__xfer *x)
{
    x->pad = x->tail = 0;
    if (x->len < TCP_PAD_MIN) return;
    unsigned at = (unsigned)((uintptr_t)x->buf & 4095);
    if (at >= TCP_PAD_NEAR && at <= 4096 - TCP_PAD_NEAR) return;
    x->pad = (at + 2048 - KOLO_HDR_LEN) & 4095; /* the payload then lands 2048 bytes from its source */
    x->tail = (unsigned)(((uintptr_t)0 - KOLO_HDR_LEN - x->pad - x->len) & 4095); /* the frame: whole pages */
}

/* The remaining [header, filler, payload] of an xfer as an iovec; returns the count, *want the
 * bytes. A long receive whose header is not complete asks for the header alone. */
static int remaining(kolo__xfer *x, struct iovec iov[4], size_t *want)
{
    int n = 0;
    *want = 0;
    if (x->hdr_done < KOLO_HDR_LEN) {
        iov[n].iov_base = x->hdr + x->hdr_done;
        iov[n].iov_len = KOLO_HDR_LEN - x->hdr_done;
        *want += iov[n++].iov_len;
        if (x->kind == KOLO_XFER_RECV && x->len >= TCP_PAD_MIN) return n;
    }
    if (x->pad_done < x->pad) {
        iov[n].iov_base = x->kind == KOLO_XFER_SEND ? (void *)(uintptr_t)filler : filler_sink;
        iov[n].iov_len = x->pad - x->pad_done;
        *want += iov[n++].iov_len;
    }
    size_t most = atomic_load_explicit(&test_step, memory_order_relaxed);
    size_t part = KOLO_MIN(x->len - x->done, most ? most : (size_t)TCP_IO_MAX);
    if (part) {
        iov[n].iov_base = x->buf + x->done;
        iov[n].iov_len = part;
        *want += iov[n++].iov_len;
    }
    if (x->done + part == x->len && x->tail_done < x->tail) {
        iov[n].iov_base = x->kind == KOLO_XFER_SEND ? (void *)(uintptr_t)filler : filler_sink;
        iov[n].iov_len = x->tail - x->tail_done;
        *want += iov[n++].iov_len;
    }
    return n;
}

/* Accounts k moved bytes; returns true when the header has just become complete. */
static bool advance(kolo__xfer *x, size_t k)
{
    bool hdr_now = false;
    if (x->hdr_done < KOLO_HDR_LEN) {
        size_t h = KOLO_MIN(k, (size_t)(KOLO_HDR_LEN - x->hdr_done));
        x->hdr_done += (unsigned)h;
        k -= h;
        hdr_now = x->hdr_done == KOLO_HDR_LEN;
    }
    size_t f = KOLO_MIN(k, (size_t)(x->pad - x->pad_done));
    x->pad_done += (unsigned)f;
    k -= f;
    size_t p = KOLO_MIN(k, x->len - x->done);
    x->done += p;
    x->tail_done += (unsigned)(k - p);
    return hdr_now;
}

static bool finished(const kolo__xfer *x)
{
    return x->hdr_done == KOLO_HDR_LEN && x->pad_done == x->pad && x->done == x->len && x->tail_done == x->tail;
}

/* One sendmsg() of what is left of x's frame: the bytes sent, or -1 with errno. */
static ssize_t send_more(kolo__conn *c, kolo__xfer *x, size_t *want)
{
    struct iovec iov[4];
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)remaining(x, iov, want)};
    ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k <= 0) return k;
    unsigned filled = x->pad_done + x->tail_done;
    advance(x, (size_t)k);
    if (x->pad_done + x->tail_done != filled) atomic_fetch_add(&filler_sent, x->pad_done + x->tail_done - filled);
    c->midframe = !finished(x);
    return k;
}

static int progress_send(kolo__conn *c)
{
    while (c->sendq) {
        kolo__xfer *x = c->sendq;
        if (x->hdr_done == 0) {
            send_pad(x);
            if (x->pad || x->tail) kolo__hdr_set_flags(x->hdr, x->pad << TCP_PAD_SHIFT | x->tail);
        }
        size_t want;
        ssize_t k = send_more(c, x, &want);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return KOLO_OK;
            if (errno == EINTR) continue;
            return io_error(c, true, errno);
        }
        if (finished(x)) kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
        else if ((size_t)k < want) return KOLO_OK; /* socket buffer full */
        if (one_call_per_pass()) return KOLO_OK;
    }
    return KOLO_OK;
}

/* The header of the frame we were receiving is the peer's ABORT: its payload (the reason) may
 * already sit partly in x->buf; read the rest and report it. */
static int aborted_mid_receive(kolo__conn *c, kolo__xfer *x, size_t got)
{
    uint64_t len;
    memcpy(&len, x->hdr + 8, 8);
    char why[KOLO_ABORT_REASON_MAX + 1];
    size_t have = KOLO_MIN(x->done, KOLO_MIN((size_t)len, sizeof(why) - 1));
    (void)got;
    if (have) memcpy(why, x->buf, have); /* a barrier's receive has no buffer */
    if (have < len && len < sizeof(why)) {
        ssize_t r = recv(c->fd, why + have, (size_t)len - have, MSG_DONTWAIT);
        if (r > 0) have += (size_t)r;
    }
    why[have] = '\0';
    return kolo__conn_fail(c, kolo__err_aborted(c, why));
}

static int progress_recv(kolo__conn *c)
{
    while (c->recvq) {
        kolo__xfer *x = c->recvq;
        struct iovec iov[4];
        size_t want;
        ssize_t k = readv(c->fd, iov, remaining(x, iov, &want));
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return KOLO_OK;
            if (errno == EINTR) continue;
            return io_error(c, false, errno);
        }
        if (k == 0) return io_error(c, false, 0);
        if (advance(x, (size_t)k)) {
            uint32_t flags;
            int st = kolo__hdr_check(c, x, &flags);
            if (st != KOLO_OK && (flags & KOLO_HDR_ABORT)) return aborted_mid_receive(c, x, (size_t)k);
            if (st != KOLO_OK) return kolo__conn_fail(c, st);
            x->pad = (flags >> TCP_PAD_SHIFT) & TCP_PAD_MASK;
            x->tail = flags & TCP_PAD_MASK;
            if ((x->pad || x->tail) && x->len < TCP_PAD_MIN)
                return kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                                    "garbled message from rank %d on %s: %u + %u filler bytes around "
                                                    "a payload of %zu (only frames of %zu bytes or more have filler)",
                                                    c->peer, kolo__peer_name(c->mesh, c->peer), x->pad, x->tail,
                                                    x->len, (size_t)TCP_PAD_MIN));
        }
        if (finished(x)) kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
        else if ((size_t)k < want) return KOLO_OK; /* drained the socket */
        if (one_call_per_pass()) return KOLO_OK;
    }
    return KOLO_OK;
}

static int tcp_progress(kolo__conn *c)
{
    if (c->error) return c->error;
    int st = progress_send(c);
    if (st == KOLO_OK) st = progress_recv(c);
    return st;
}

static void tcp_close(kolo__conn *c) { (void)c; }

static void tcp_goodbye(kolo__conn *c)
{
    unsigned char hdr[KOLO_HDR_LEN];
    kolo__hdr_pack(hdr, KOLO_HDR_GOODBYE, 0);
    ssize_t k = send(c->fd, hdr, sizeof(hdr), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)k; /* best effort: a peer that misses it only reports us as lost */
}

/* A frame's header at p, read from the stream rather than into an xfer: false if it is not kolo's. */
static bool frame_hdr(const unsigned char *p, uint32_t *flags, uint64_t *len)
{
    uint32_t magic;
    memcpy(&magic, p, 4);
    memcpy(flags, p + 4, 4);
    memcpy(len, p + 8, 8);
    return magic == KOLO_MSG_MAGIC;
}

/* The whole frame's bytes on the wire: header, filler ("filler" above) and payload. */
static uint64_t frame_bytes(uint32_t flags, uint64_t len)
{
    uint64_t fill = len >= TCP_PAD_MIN ? ((flags >> TCP_PAD_SHIFT) & TCP_PAD_MASK) + (flags & TCP_PAD_MASK) : 0;
    return KOLO_HDR_LEN + fill + len;
}

/* The unread bytes must be whole frames ending with a goodbye. More than we can peek is taken
 * as clean: a later receive that needs more than the peer sent still fails at EOF. */
static bool tcp_left_cleanly(kolo__conn *c)
{
    static _Thread_local unsigned char buf[1 << 16];
    ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return false;
    size_t pos = 0;
    while (pos + KOLO_HDR_LEN <= (size_t)n) {
        uint32_t flags;
        uint64_t len;
        if (!frame_hdr(buf + pos, &flags, &len)) return false;
        if (flags & KOLO_HDR_ABORT) return false;
        if (flags & KOLO_HDR_GOODBYE) return pos + KOLO_HDR_LEN == (size_t)n;
        if (len > (size_t)n) return true;
        pos += (size_t)frame_bytes(flags, len);
    }
    return pos > (size_t)n;
}

/* How long tcp_abort waits on a peer that takes none of its bytes: one that reads takes some
 * within microseconds here, within a round trip over a network; one that does not (it computes,
 * it is stuck, or it stopped reading when it failed itself and its receive buffer is full) would
 * hold every rank that gives up for the whole of ABORT_TELL_NS (xfer.c): in the engine's random
 * mix with a rank killed, 10 kills took 1.5-2 s longer so. */
#define ABORT_STALL_NS 50000000ull

/* Waits until c's socket may take more bytes, until_ns or stall_ns, whichever comes first; false
 * once that has passed. */
static bool room_by(kolo__conn *c, uint64_t until_ns, uint64_t stall_ns)
{
    uint64_t by = KOLO_MIN(until_ns, stall_ns), now = kolo__now_ns();
    if (now >= by) return false;
    struct pollfd p = {.fd = c->fd, .events = POLLOUT};
    poll(&p, 1, (int)((by - now + 999999) / 1000000));
    return true;
}

/* A TCP peer only ever holds copies of our bytes; tell it why we leave, in an ABORT frame after
 * what we sent. A frame half sent is finished first, from the buffer it is sent from (still
 * the caller's: it is queued): its receiver reads it whole and then the reason. Cut off, it
 * read a stream that ended mid-frame, and named this rank as lost whatever the cause was: rank
 * 2 killed, rank 0 heard first and aborted while sending rank 1 part of a 5 MiB ring chunk,
 * and rank 1 reported "lost rank 0" in 1 run of 20 (tests/test_faults.c). The bytes go out as
 * fast as the peer reads, until until_ns, or until it has taken none for ABORT_STALL_NS; a peer
 * that does not read keeps what fits in the socket's buffers, and then we leave as before. */
static void tcp_abort(kolo__conn *c, const char *reason, uint64_t until_ns)
{
    if (c->fd < 0) return;
    kolo__xfer *x = c->sendq;
    if (c->midframe && (!x || x->hdr_done == 0)) return; /* its xfer was failed: the bytes are gone */
    uint64_t stall = kolo__now_ns() + ABORT_STALL_NS;
    while (c->midframe) {
        size_t want;
        ssize_t k = send_more(c, x, &want);
        if (k > 0) stall = kolo__now_ns() + ABORT_STALL_NS;
        else if (k < 0 && errno == EINTR) continue;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return; /* the peer is gone */
        else if (!room_by(c, until_ns, stall)) return;
    }
    unsigned char frame[KOLO_HDR_LEN + KOLO_ABORT_REASON_MAX];
    size_t n = KOLO_HDR_LEN + KOLO_MIN(strlen(reason), (size_t)KOLO_ABORT_REASON_MAX), sent = 0;
    kolo__hdr_pack(frame, KOLO_HDR_ABORT, n - KOLO_HDR_LEN);
    memcpy(frame + KOLO_HDR_LEN, reason, n - KOLO_HDR_LEN);
    while (sent < n) {
        ssize_t k = send(c->fd, frame + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) sent += (size_t)k;
        else if (k < 0 && errno == EINTR) continue;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;
        else if (!room_by(c, until_ns, stall)) return;
    }
    c->midframe = 0;
    /* ... and stay until the peer has it all (SIOCOUTQ: bytes it has not acknowledged): our
     * close resets the connection when bytes the peer sent lie unread here, as they do when
     * a job fails, and a reset throws away what the kernel has not sent yet, the reason too.
     * Once the peer's own reset has come (it failed too and closed with our bytes unread),
     * nothing more will be acknowledged, yet SIOCOUTQ keeps its count (the kernel empties the
     * queue, not the sequence numbers it is counted from): the wait, woken by the reset, ends
     * there and not ABORT_STALL_NS later (tcp_abort_leaves_a_peer_that_reset_at_once). */
    int q, last = INT_MAX;
    while (ioctl(c->fd, SIOCOUTQ, &q) == 0 && q > 0) {
        uint64_t now = kolo__now_ns();
        if (q < last) stall = now + ABORT_STALL_NS;
        last = q;
        if (now >= KOLO_MIN(until_ns, stall)) return;
        struct pollfd p = {.fd = c->fd, .events = 0}; /* POLLERR and POLLHUP are reported anyway */
        struct timespec nap = {0, 100000};
        if (ppoll(&p, 1, &nap, NULL) > 0 && (p.revents & (POLLERR | POLLHUP))) return;
    }
}

/* The unread bytes after the last complete frame: an ABORT frame and its reason. */
static bool tcp_abort_reason(kolo__conn *c, char *buf, size_t cap)
{
    static _Thread_local unsigned char peek[1 << 16];
    ssize_t n = recv(c->fd, peek, sizeof(peek), MSG_PEEK | MSG_DONTWAIT);
    size_t pos = 0;
    while (n > 0 && pos + KOLO_HDR_LEN <= (size_t)n) {
        uint32_t flags;
        uint64_t len;
        if (!frame_hdr(peek + pos, &flags, &len) || len > (size_t)n) return false;
        if (flags & KOLO_HDR_ABORT) {
            size_t m = KOLO_MIN((size_t)len, KOLO_MIN(cap - 1, (size_t)n - pos - KOLO_HDR_LEN));
            memcpy(buf, peek + pos + KOLO_HDR_LEN, m);
            buf[m] = '\0';
            return true;
        }
        pos += (size_t)frame_bytes(flags, len);
    }
    return false;
}

/* The same in a connection that fails now (io_error): the frames in front of the ABORT are read
 * and dropped, however long (a peek sees 64 KiB; a peer that gave up finished its last frame, as
 * a ring's 128 KiB-4 MiB chunk, before the reason: tcp_abort). Only what has arrived is read. */
static bool drop_to_reason(kolo__conn *c, char *buf, size_t cap)
{
    static _Thread_local unsigned char sink[1 << 16];
    for (;;) {
        unsigned char hdr[KOLO_HDR_LEN];
        uint32_t flags;
        uint64_t len;
        if (recv(c->fd, hdr, sizeof(hdr), MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof(hdr)) return false;
        if (!frame_hdr(hdr, &flags, &len)) return false;
        if (flags & KOLO_HDR_ABORT) return tcp_abort_reason(c, buf, cap);
        for (uint64_t left = frame_bytes(flags, len); left;) {
            ssize_t k = recv(c->fd, sink, (size_t)KOLO_MIN(left, (uint64_t)sizeof(sink)), MSG_DONTWAIT);
            if (k <= 0) return false;
            left -= (uint64_t)k;
        }
    }
}

const kolo__transport kolo__tcp_transport = {"tcp",     tcp_progress,     tcp_close, tcp_goodbye, tcp_left_cleanly,
                                             tcp_abort, tcp_abort_reason, NULL,      NULL};

/* True when both ends of the connection are this host: a loopback address, or the same address
 * at both ends (a host's own address also routes over loopback). */
static bool stays_on_host(int fd)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    /* The kernel fills both on success; zeroed first so that the family read below is always one
     * it wrote or AF_UNSPEC (clang's analyzer, which does not model these calls, took it for garbage). */
    memset(&me, 0, sizeof(me));
    memset(&peer, 0, sizeof(peer));
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return false;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&me, *b = (const struct sockaddr_in *)&peer;
        return (ntohl(b->sin_addr.s_addr) >> 24) == 127 || a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&me, *b = (const struct sockaddr_in6 *)&peer;
        return IN6_IS_ADDR_LOOPBACK(&b->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&b->sin6_addr) && b->sin6_addr.s6_addr[12] == 127) ||
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(b->sin6_addr)) == 0;
    }
    return false;
}

static bool set_congestion(int fd, const char *name)
{
    return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0;
}

/* The algorithm a socket runs now ("" when it cannot be read). */
static void congestion_of(int fd, char *name, size_t cap)
{
    socklen_t len = (socklen_t)cap - 1;
    memset(name, 0, cap);
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) name[0] = '\0';
}

/* KOLO_TCP_CONGESTION. Over loopback both ends run on this host's cores, and BBR's model of the
 * path (a bandwidth-delay product of microseconds) caps the window at 12-26 segments of 64 KiB: the
 * sender becomes ACK-clocked, so segments leave from the receiver's core (where the ACKs are
 * processed) as well as the sender's, arrive out of order, and trigger spurious retransmissions.
 * 1 MiB broadcasts then took 90-450 us each instead of 90-110 (cubic as it was then set: below).
 * Loss-based algorithms see no loss over loopback and keep the window open. A connection to a rank
 * in another network namespace or container of this machine (the same boot id: a veth or a bridge)
 * runs on the same cores, and BBR did the same there: 4 ranks as 2 namespaces of 2 (bench/hosts.sh
 * --calls, 3 rounds of 50 calls, Open MPI beside), 256 KiB allreduces had a 90th percentile of
 * 586-1760 us against a median of 230-330 (1.7-6.4x Open MPI's); with cubic 271-385 (4 runs each
 * way, the veth not shaped and at 10 Gbit/s; medians alike). At 2 Gbit/s the two ran alike. Such
 * connections get cubic too; those to other machines keep the system's choice.
 *
 * The algorithm is chosen before the connection is established (kolo__tcp_congestion_early, on the
 * connecting socket and on the listening one, whose connections inherit it): the kernel starts the
 * system's default then, and BBR's start turns on the kernel's own pacing of the connection
 * (sk_pacing_status), which no algorithm set later turns off. Until 2026-12-01 kolo set cubic on
 * established connections, which then ran cubic paced by hrtimers: 4 ranks on this Intel VM's 2
 * vCPUs (kernel 6.18) over loopback took ~40,000 timer interrupts a second (HRTIMER in
 * /proc/softirqs; none unpaced), a third of perf's samples sat where the senders' tcp_write_xmit
 * re-enabled interrupts, and alltoalls of 512 KiB-4 MiB ran at 0.6-0.9x Open MPI's speed. Unpaced
 * from the start (medians of 3 rounds alternated with the build before), alltoalls of
 * 256 KiB-64 MiB take 0.39-0.82x the time they took, allgathers, broadcasts and reducescatters of
 * 4-64 MiB 0.55-0.88x; 2 ranks, allgathers and alltoalls of 1 MiB 0.66x and 0.81x, the rest alike
 * (docs/performance.md, "TCP"). Connections from other machines that a listener set to cubic
 * accepted go back to the system's default once their peer is known (choose_congestion); an
 * algorithm started on an established connection, as BBR is then, sets itself up whole. */

/* connections on this machine whose algorithm came after they were established */
static _Atomic uint64_t congestion_late;

uint64_t kolo__tcp_congestion_late(void) { return atomic_load(&congestion_late); }

/* test hook: connections over loopback count as connections to another machine */
static _Thread_local bool test_remote;

void kolo__tcp_test_remote(bool on) { test_remote = on; }

/* Sets the local choice of auto: cubic, or reno where cubic is not allowed. */
static bool set_local_choice(int fd) { return set_congestion(fd, "cubic") || set_congestion(fd, "reno"); }

void kolo__tcp_congestion_early(int fd, bool local)
{
    const char *want = kolo__setting_str(KOLO_SET_TCP_CONGESTION);
    if (strcmp(want, "system") == 0 || !*want) return;
    if (strcmp(want, "auto") != 0) set_congestion(fd, want); /* choose_congestion reports a refusal */
    else if (local) set_local_choice(fd);
}

/* The system's default algorithm: what a fresh socket gets. */
static void system_congestion(char *name, size_t cap)
{
    name[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    congestion_of(fd, name, cap);
    close(fd);
}

static void choose_congestion(kolo__conn *c, bool local)
{
    const char *want = kolo__setting_str(KOLO_SET_TCP_CONGESTION);
    if (strcmp(want, "system") == 0 || !*want) return;
    char now[32];
    congestion_of(c->fd, now, sizeof(now));
    if (strcmp(want, "auto") != 0) {
        if (strcmp(now, want) == 0) return;
        static _Atomic int warned;
        if (set_congestion(c->fd, want)) atomic_fetch_add(&congestion_late, 1);
        else if (!atomic_exchange(&warned, 1))
            KOLO_WARN("KOLO_TCP_CONGESTION=%s: cannot use it on the connection to rank %d (%s); keeping the "
                      "system's default (see /proc/sys/net/ipv4/tcp_allowed_congestion_control)",
                      want, c->peer,
                      errno == ENOENT  ? "this kernel has no such algorithm"
                      : errno == EPERM ? "not allowed to unprivileged processes"
                                       : strerror(errno));
        return;
    }
    if (local) {
        if (strcmp(now, "cubic") != 0 && strcmp(now, "reno") != 0 && set_local_choice(c->fd))
            atomic_fetch_add(&congestion_late, 1);
        return;
    }
    /* another machine: the system's choice, which a connection accepted by our listener lost */
    char sys[32];
    system_congestion(sys, sizeof(sys));
    if (sys[0] && strcmp(now, sys) != 0) set_congestion(c->fd, sys);
}

const char *kolo__tcp_congestion(const kolo__conn *c)
{
    static _Thread_local char name[32];
    congestion_of(c->fd, name, sizeof(name));
    return name[0] ? name : "?";
}

/* A peer's machine that goes down (power, a kernel panic, a VM stopped) or whose network is cut
 * sends nothing more, not even a reset: a rank waiting on it learned of it only when
 * KOLO_OP_TIMEOUT (300 s) ran out, as of a peer merely silent, and a rank with nothing in flight
 * never. Keepalive probes go out once a connection has been idle for a third of
 * KOLO_TCP_KEEPALIVE, then four more over the rest of it; the kernel fails the connection
 * (ETIMEDOUT, io_error) when none is answered. The peer's kernel answers them whatever its process
 * does, so a rank stopped by Ctrl-Z or busy for hours outside kolo is not lost by them; a probe is
 * a packet and its answer every 20 s per idle connection, nothing while it carries data. 60 s
 * by default: a minute without a word from a machine is no passing loss of packets (the stall
 * warning comes then too), and a network that comes back sooner loses the job nothing.
 * Connections on which bytes wait to be acknowledged send no probes, and the kernel's
 * retransmissions give up only after about 15 minutes: kolo__tcp_unanswered reads those. Measured
 * with a machine cut off (tests/test_multihost.c, KOLO_TCP_KEEPALIVE=3): the rank waiting on it
 * failed 3.1-3.4 s later, bytes in flight or not, in a direct collective and in the engine's; without,
 * it waited for KOLO_OP_TIMEOUT. */
static void keepalive(const kolo__conn *c)
{
    /* 0: off (mesh.c), also for a connection of the tests, in no mesh */
    int t = c->mesh ? (int)(c->mesh->keepalive_ns / 1000000000u) : 0;
    if (!kolo__keepalive(c->fd, t, false))
        KOLO_DEBUG("TCP keepalive not set (%s): a lost machine is told by KOLO_OP_TIMEOUT", strerror(errno));
}

/* A live machine acknowledges what reaches it within a round trip, retransmissions included, and
 * answers every probe of a zero window (a rank busy outside kolo, its socket full) even while the
 * rank is stopped; what is left unanswered for seconds went to a machine that is down or cut off.
 * The kernel's own verdict on such a connection comes only after its retransmissions give up,
 * about 15 minutes (tcp_retries2), past KOLO_OP_TIMEOUT, which then blamed a silent rank. Read
 * from the kernel's counters: a retransmission, or two probes in a row, waiting for an answer,
 * and no acknowledgement of anything for ms. After a connection idle that long, the first
 * segment lost and retransmitted reads so for the few hundred milliseconds until its
 * retransmission is acknowledged; the wait that calls this has had no progress for ms itself. */
int kolo__tcp_unanswered(kolo__conn *c, unsigned ms)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (c->fd < 0 || getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return KOLO_OK;
    if (!(ti.tcpi_retransmits > 0 || ti.tcpi_probes > 1) || ti.tcpi_last_ack_recv < ms) return KOLO_OK;
    return machine_lost(c, c->sendq != NULL, ETIMEDOUT);
}

int kolo__tcp_attach(kolo__conn *c, bool same_machine)
{
    int one = 1;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return kolo__err_sys(errno, "making the socket to rank %d non-blocking", c->peer);
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int buf = 4 << 20;
    setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    bool local = !test_remote && stays_on_host(c->fd);
    choose_congestion(c, local || (!test_remote && same_machine));
    if (local) {
        int unsent = (int)TCP_LOCAL_UNSENT_MAX;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &unsent, sizeof(unsent));
    }
    keepalive(c);
    c->tp = &kolo__tcp_transport;
    return KOLO_OK;
}
