/* xfer.c - posting sends and receives on a mesh, and the one wait loop every collective uses.
 *
 * The wait loop is where latency and fairness are decided (see shared/reference/machine.md:
 * a blocking wake-up costs ~35 us on this kind of VM, a spinning poll ~0.2 us over shared
 * memory). So a waiter busy-polls for KOLO_SPIN_US, then yields its core between polls
 * (sched_yield lets an oversubscribed peer run), and after ~5 ms of nothing sleeps until a peer
 * moves: on the doorbells of its shared-memory connections (shm.c, "Sleeping"), in poll() when
 * only sockets are pending, else in short naps. About every millisecond (every 10 while the
 * mesh dozes, below) it also polls the sockets of ALL peers for a hang-up: a dead rank's kernel
 * closes its sockets, so every survivor learns of the death within milliseconds even if it was
 * waiting on someone else.
 *
 * A mesh marked `doze` (the engine's while no thread is blocked on it, or once one has been for 5
 * ms: engine/engine.c, "Dozing") skips the yield phase: after its spin it sleeps. Its waits are the
 * engine thread's, mostly for a peer whose engine has not reached the same cycle yet, a millisecond
 * or so away, on a core whose user thread is computing (a training step's backward pass). Measured
 * on the 2-vCPU Zen 4 VM, 2 ranks training ResNet-18 under kolo.torch (one torch thread each; perf
 * at 0.2 ms per sample, one launch each): the two engine threads took 10,500 samples, 5,900 of them
 * polling in kolo__wait, and 7,600 and 2,200 with the doze (the blocked thread's rule in engine.c
 * included); context switches rose from 56,000 to 93,000 in 36 s (a sleep is two). Images/s did not
 * move beyond the spread of the launches (5 interleaved launches each of the builds before and with
 * the first form of the doze: 50.5-52.9 and 49.6-52.3), as the step is bound by compute. What the
 * doze buys is a core's worth of polling given back where a wait is long: a rank blocked 2 s in
 * kolo.allreduce on a straggler used 2.0 s of CPU, 0.15 s with the doze (0.027 s since, with the
 * engine's back-off: engine.c, "Cycle timing").
 */
#include "transport.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* Linux 5.16, the same number on every architecture */
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

void kolo__hdr_pack(unsigned char hdr[KOLO_HDR_LEN], uint32_t flags, uint64_t len)
{
    uint32_t magic = KOLO_MSG_MAGIC;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &flags, 4);
    memcpy(hdr + 8, &len, 8);
}

const char *kolo__peer_name(const kolo__mesh *m, int peer)
{
    static _Thread_local char buf[224];
    if (!m->peers || peer < 0 || peer >= m->size) return "?";
    snprintf(buf, sizeof(buf), "%s (%s)", m->peers[peer].hostname, m->peers[peer].addr);
    return buf;
}

void kolo__hdr_set_flags(unsigned char hdr[KOLO_HDR_LEN], uint32_t flags) { memcpy(hdr + 4, &flags, 4); }

/* ---- Call tags ----
 * A stream between two ranks matches each send with the receive posted in the same place: when
 * the ranks called different collectives, one's message lands in the other's receive, and only
 * a length that differs showed it. Where the lengths agreed the call went on with the wrong
 * bytes: a 4-float allreduce against a broadcast returned success on the broadcasting rank,
 * a float32 against an int32 allreduce (or sum against max, or two roots of one broadcast)
 * succeeded on both with garbage; ranks whose allreduce postscale factors differed returned
 * different sums, and their models drifted apart without a word. Every message of a direct
 * collective now carries 16 bits of what its sender called, in its header's length field
 * (unused above 2^48): kind (3 bits), dtype + 1 (4), op + 1 (3), and 6 bits that are a
 * broadcast's root mod 64, or a reduction's scale factors (0 for 1 and 1, else 1-63 from a hash
 * of both: two different pairs look alike once in 63); a receive checks them against its own
 * call's and names both calls. Nothing on the fast path but a shift and a compare per message. */
_Static_assert(KOLO_DTYPE_COUNT < 16 && KOLO_OP_COUNT < 8, "the call tag's fields");

uint16_t kolo__call_tag(int kind, int dtype, int op, int root)
{
    return (uint16_t)((unsigned)kind << 13 | (unsigned)(dtype + 1) << 9 | (unsigned)(op + 1) << 6 |
                      (root < 0 ? 0u : (unsigned)root & 63u));
}

int kolo__call_scales(double prescale, double postscale)
{
    if (prescale == 1.0 && postscale == 1.0) return 0;
    uint64_t a, b;
    memcpy(&a, &prescale, 8);
    memcpy(&b, &postscale, 8);
    uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 31;
    return 1 + (int)(h % 63);
}

static bool reduces(int kind) { return kind == KOLO_CALL_ALLREDUCE || kind == KOLO_CALL_REDUCESCATTER; }

void kolo__call_text(uint16_t tag, int root, int size, char *buf, size_t cap)
{
    static const char *const kinds[] = {"?",           "kolo_allreduce",     "kolo_allgather", "kolo_broadcast",
                                        "kolo_alltoall", "kolo_reducescatter", "kolo_barrier",   "?"};
    int kind = tag >> 13, dtype = (tag >> 9 & 15) - 1, op = (tag >> 6 & 7) - 1;
    int n = snprintf(buf, cap, "%s", kinds[kind]);
    if (kind == KOLO_CALL_BARRIER || n < 0 || (size_t)n >= cap) return;
    n += snprintf(buf + n, cap - (size_t)n, " (%s",
                  dtype >= 0 && dtype < KOLO_DTYPE_COUNT ? kolo_dtype_name((kolo_dtype_t)dtype) : "?");
    if ((size_t)n < cap && op >= 0) n += snprintf(buf + n, cap - (size_t)n, ", %s", kolo_op_name((kolo_op_t)op));
    if ((size_t)n < cap && kind == KOLO_CALL_BROADCAST)
        n += snprintf(buf + n, cap - (size_t)n, root >= 0 || size <= 64 ? ", root %d" : ", a root of %d mod 64",
                      root >= 0 ? root : tag & 63);
    if ((size_t)n < cap && reduces(kind) && (tag & 63)) n += snprintf(buf + n, cap - (size_t)n, ", scaled");
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}

const char *kolo__op_timeout_text(const kolo__mesh *m, char buf[64])
{
    if (m->op_timeout_ns == UINT64_MAX) return "it waits on: KOLO_OP_TIMEOUT is 0";
    snprintf(buf, 64, "it fails after KOLO_OP_TIMEOUT, %.3g s", (double)m->op_timeout_ns * 1e-9);
    return buf;
}

int kolo__hdr_check(kolo__conn *c, const kolo__xfer *x, uint32_t *flags)
{
    uint32_t magic;
    uint64_t len;
    memcpy(&magic, x->hdr, 4);
    memcpy(flags, x->hdr + 4, 4);
    memcpy(&len, x->hdr + 8, 8);
    uint16_t theirs = (uint16_t)(len >> KOLO_HDR_LEN_BITS), mine = c->mesh->call_tag;
    len &= ((uint64_t)1 << KOLO_HDR_LEN_BITS) - 1;
    if (magic == KOLO_MSG_MAGIC && (*flags & KOLO_HDR_ABORT))
        return kolo__err(KOLO_ERR_PEER_LOST, "rank %d on %s aborted the job", c->peer, kolo__peer_name(c->mesh, c->peer));
    if (magic == KOLO_MSG_MAGIC && (*flags & KOLO_HDR_GOODBYE))
        return kolo__err(KOLO_ERR_PEER_LOST,
                         "rank %d on %s shut down while rank %d still expected %zu bytes from it: the ranks did not "
                         "call the same collectives",
                         c->peer, kolo__peer_name(c->mesh, c->peer), c->mesh->rank, x->len);
    if (magic != KOLO_MSG_MAGIC) {
        /* garbage's bits are no flags: read as such, one with the abort bit (byte 7 of 16 garbled
         * bytes at 0x40-0x7f, a letter) was "rank 1 aborted the job" (found by fuzz_frames) */
        *flags = 0;
        return kolo__err(KOLO_ERR_PROTOCOL,
                         "garbled message from rank %d on %s: bad magic 0x%08x (expected 0x%08x)", c->peer,
                         kolo__peer_name(c->mesh, c->peer), magic, KOLO_MSG_MAGIC);
    }
    if (theirs && mine && theirs != mine) {
        char a[96], b[96];
        kolo__call_text(theirs, -1, c->mesh->size, a, sizeof(a));
        kolo__call_text(mine, -1, c->mesh->size, b, sizeof(b));
        bool scales = (theirs ^ mine) < 64 && reduces(mine >> 13); /* all but the scale factors agree */
        return kolo__err(KOLO_ERR_MISMATCH, "rank %d on %s called %s where rank %d called %s: %s", c->peer,
                         kolo__peer_name(c->mesh, c->peer), a, c->mesh->rank, b,
                         scales ? "the ranks passed different prescale or postscale factors"
                                : "the ranks called different collectives, or the same in different orders");
    }
    if (len != x->len && theirs && theirs == mine) { /* the same call: its counts differ */
        char a[96];
        kolo__call_text(mine, -1, c->mesh->size, a, sizeof(a));
        return kolo__err(KOLO_ERR_MISMATCH,
                         "rank %d on %s sent %llu bytes where rank %d expected %zu, both in %s: the ranks passed "
                         "different counts or process sets",
                         c->peer, kolo__peer_name(c->mesh, c->peer), (unsigned long long)len, c->mesh->rank, x->len,
                         a);
    }
    if (len != x->len)
        return kolo__err(KOLO_ERR_MISMATCH,
                         "rank %d on %s sent %llu bytes where rank %d expected %zu: the ranks called "
                         "collectives with different counts, dtypes or orders",
                         c->peer, kolo__peer_name(c->mesh, c->peer), (unsigned long long)len, c->mesh->rank,
                         x->len);
    return KOLO_OK;
}

void kolo__xfer_complete(kolo__xfer **q, kolo__xfer ***tail, int status)
{
    kolo__xfer *x = *q;
    *q = x->next;
    if (!*q) *tail = q;
    x->next = NULL;
    x->status = status;
}

/* How long a rank that gives up may spend getting its reason to the peers that still read: over
 * TCP it may first have to send the rest of a frame it was in the middle of (tcp.c, tcp_abort). A
 * peer that reads takes a few MiB in milliseconds, even over a 1 Gb/s link 16 MiB in 140; one
 * that does not read (it computes, or is stuck) costs this much once. */
#define ABORT_TELL_NS 250000000ull

static void mesh_mark_failed(kolo__mesh *m, int status)
{
    if (m->failed) return;
    m->failed = status;
    snprintf(m->failmsg, sizeof(m->failmsg), "%s", kolo__errmsg());
    atomic_store_explicit(&m->failmsg_set, true, memory_order_release);
    /* abort: every peer sees us hang up without a goodbye and fails as well */
    uint64_t until = kolo__now_ns() + ABORT_TELL_NS;
    for (int p = 0; p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (!c) continue;
        if (c->tp) c->tp->abort(c, m->failmsg, until);
        if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
    }
}

void kolo__mesh_fail(kolo__mesh *m, int status)
{
    if (m) mesh_mark_failed(m, status);
}

/* A dead peer fails this rank's connection to it on every channel alike, often on two threads
 * (a collective's and the engine's): the same message is logged once, not once per channel. */
static bool first_telling(const char *msg)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char last[512];
    static uint64_t at;
    uint64_t now = kolo__now_ns();
    pthread_mutex_lock(&mu);
    bool again = strncmp(last, msg, sizeof(last) - 1) == 0 && now - at < 2000000000ull;
    if (!again) {
        snprintf(last, sizeof(last), "%s", msg);
        at = now;
    }
    pthread_mutex_unlock(&mu);
    return !again;
}

int kolo__conn_fail(kolo__conn *c, int status)
{
    if (!c->error) {
        c->error = status;
        if (first_telling(kolo__errmsg())) KOLO_ERROR("%s", kolo__errmsg());
    }
    mesh_mark_failed(c->mesh, status);
    while (c->sendq) kolo__xfer_complete(&c->sendq, &c->sendq_tail, status);
    while (c->recvq) kolo__xfer_complete(&c->recvq, &c->recvq_tail, status);
    return status;
}

static void post(kolo__mesh *m, int peer, char *buf, size_t len, kolo__xfer *x, int kind)
{
    x->next = NULL;
    x->buf = buf;
    x->len = len;
    x->done = 0;
    x->hdr_done = 0;
    x->pad = x->pad_done = x->tail = x->tail_done = 0;
    x->kind = kind;
    x->cma_seq = 0;
    x->looked_ns = 0;
    x->stream = false;
    x->single = false;
    x->way = kind == KOLO_XFER_SEND ? m->call_way : KOLO_WAY_AUTO;
    x->status = 1;
    kolo__conn *c = (peer >= 0 && peer < m->size) ? m->conns[peer] : NULL;
    x->conn = c;
    if (!c) {
        x->status = kolo__err(KOLO_ERR_INTERNAL, "no connection from rank %d to rank %d", m->rank, peer);
        return;
    }
    if (m->failed) {
        x->status = kolo__err(m->failed, "%s", m->failmsg);
        return;
    }
    if (c->lost && kind == KOLO_XFER_SEND) { /* the peer is gone (on_hangup): this exchange needs it */
        x->status = kolo__conn_fail(c, kolo__err(c->lost, "%s", c->lost_msg));
        return;
    }
    if (kind == KOLO_XFER_SEND) {
        if (kolo__inject_send_failure()) {
            x->status = kolo__err(KOLO_ERR_SYSTEM, "send to rank %d on %s failed: injected failure (test hook)",
                                  peer, kolo__peer_name(m, peer));
            kolo__conn_fail(c, x->status);
            return;
        }
        kolo__hdr_pack(x->hdr, 0, len | (uint64_t)m->call_tag << KOLO_HDR_LEN_BITS);
        *c->sendq_tail = x;
        c->sendq_tail = &x->next;
    } else {
        *c->recvq_tail = x;
        c->recvq_tail = &x->next;
        /* a receive from a peer that is gone may be in what it sent before it went (it aborted
         * right after sending it: its loss was kept before this receive was posted) */
        if (c->lost) {
            int st = c->tp->progress(c);
            if (st == KOLO_OK && x->status == 1) kolo__conn_fail(c, kolo__err(c->lost, "%s", c->lost_msg));
        }
    }
}

void kolo__isend(kolo__mesh *m, int peer, const void *buf, size_t len, kolo__xfer *x)
{
    post(m, peer, (char *)(uintptr_t)buf, len, x, KOLO_XFER_SEND);
}

void kolo__irecv(kolo__mesh *m, int peer, void *buf, size_t len, kolo__xfer *x)
{
    post(m, peer, buf, len, x, KOLO_XFER_RECV);
}

/* A peer that failed because a third rank aborted passes that rank's message on ("rank 1 on h
 * aborted the job because: ..."), maybe through more ranks: the error names the rank where it
 * began, with its reason, and this peer as the one that relayed it; blaming this peer for rank
 * 1's bad setting sent users to the wrong rank's logs. Only the last relay is named: each rank
 * that passed it on added itself, and 20 ranks' errors read "(passed on by rank 4 on ...)
 * (passed on by rank 1 on ...) (passed on by rank 0 on ...)". */
int kolo__err_aborted(kolo__conn *c, const char *reason)
{
    static const char tag[] = " aborted the job because: ";
    const char *last = NULL, *start = reason, *p = reason, *q;
    while ((q = strstr(p, tag)) != NULL) {
        if (last) start = last + strlen(tag); /* the innermost clause begins after the one before */
        last = q;
        p = q + strlen(tag);
    }
    if (last && strncmp(start, "rank ", 5) == 0) {
        const char *relayed = strstr(start, " (passed on by rank ");
        int len = relayed ? (int)(relayed - start) : (int)strlen(start);
        return kolo__err(KOLO_ERR_PEER_LOST, "%.*s (passed on by rank %d on %s)", len, start, c->peer,
                         kolo__peer_name(c->mesh, c->peer));
    }
    const char *root = last ? last + strlen(tag) : reason;
    return kolo__err(KOLO_ERR_PEER_LOST, "rank %d on %s aborted the job because: %s", c->peer,
                     kolo__peer_name(c->mesh, c->peer), *root ? root : "(no reason given)");
}

/* Sets "lost rank R on H: why" as the error; returns KOLO_ERR_PEER_LOST. */
static int lost(kolo__conn *c, const char *why)
{
    return kolo__err(KOLO_ERR_PEER_LOST, "lost rank %d on %s: %s", c->peer, kolo__peer_name(c->mesh, c->peer), why);
}

/* A peer that died or aborted the job with nothing of ours pending: it had sent all we asked of it
 * and taken all we sent, so it may have returned from the collective we are still in (the last
 * rank to finish a call, killed right after it). Failing at once failed that call on the others
 * (and, through their abort, on ranks that never talked to it) though no byte was missing; in
 * an elastic job the survivors then disagreed with the dead rank about whether the step ran. The
 * loss is kept instead and fails the next exchange that needs this peer (post: a send to it, or
 * a receive that what it sent before it went does not complete), or a wait that has sat idle for
 * LOST_GRACE_NS (check_liveness), with the same message, and from there the job as before. */
static int keep_loss(kolo__conn *c, int status)
{
    char *msg = kolo__strdup(kolo__errmsg());
    if (!msg) return kolo__conn_fail(c, status); /* no room to keep it: fail now, as before */
    c->lost = status;
    c->lost_msg = msg;
    KOLO_DEBUG("%s (nothing pending needed it: the next exchange with it fails)", msg);
    return KOLO_OK;
}

/* A peer hung up. It is an error if we still need bytes from it or have bytes for it; if it left
 * without a goodbye (it died, or it failed and aborted the job), the next exchange with it is one
 * (keep_loss). */
static int on_hangup(kolo__conn *c)
{
    int st = c->tp->progress(c); /* drain what it sent before leaving */
    if (st != KOLO_OK || c->error) return c->error ? c->error : st;
    if (c->lost) return KOLO_OK;
    if (!c->gone && !c->tp->left_cleanly(c)) {
        char why[KOLO_ABORT_REASON_MAX + 64];
        st = c->tp->abort_reason(c, why, sizeof(why))
                 ? kolo__err_aborted(c, why)
                 : lost(c, "its connection closed without a goodbye (the process died, or it hit an error and "
                           "aborted the job)");
        return c->sendq || c->recvq ? kolo__conn_fail(c, st) : keep_loss(c, st);
    }
    c->gone = 1;
    if (c->sendq || c->recvq)
        return kolo__conn_fail(c, lost(c, "it shut down while this rank still had messages to exchange with it: "
                                          "the ranks did not call the same collectives"));
    return KOLO_OK;
}

/* How long a wait may sit without progress while a peer's loss is kept (keep_loss) before it fails
 * with that loss: a rank whose call went on with the live ranks is not held up, and one that
 * waits on a rank that will never send (it is computing, or stuck outside kolo, and learns of
 * the loss only at its next call) still fails soon, not at KOLO_OP_TIMEOUT. 16 ranks on 2 cores
 * leave a live neighbour off its core for tens of milliseconds, not this long. */
#define LOST_GRACE_NS 500000000ull

/* Polls every peer's socket for a hang-up without consuming data; the wait calling it has made
 * no progress for idle_ns. */
static int check_liveness(kolo__mesh *m, uint64_t idle_ns)
{
    struct pollfd pfd[64];
    int idx[64];
    for (int base = 0; base < m->size; base += 64) {
        int n = 0;
        for (int p = base; p < m->size && p < base + 64; p++) {
            kolo__conn *c = m->conns[p];
            if (!c || c->error || c->lost || c->fd < 0) continue;
            if (c->gone && !c->sendq && !c->recvq) continue;
            pfd[n].fd = c->fd;
            pfd[n].events = POLLRDHUP;
            pfd[n].revents = 0;
            idx[n++] = p;
        }
        if (n == 0) continue;
        int r = poll(pfd, (nfds_t)n, 0);
        if (r <= 0) continue;
        for (int i = 0; i < n; i++) {
            if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                int st = on_hangup(m->conns[idx[i]]);
                if (st != KOLO_OK) return st;
            }
        }
    }
    for (int p = 0; idle_ns >= LOST_GRACE_NS && p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (c && c->lost && !c->error) return kolo__conn_fail(c, kolo__err(c->lost, "%s", c->lost_msg));
    }
    /* a machine lost while bytes to it were in flight: keepalive probes wait for those, and the
     * retransmissions go on for 15 minutes (tcp.c, keepalive) */
    for (int p = 0; m->keepalive_ns && idle_ns >= m->keepalive_ns && p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (!c || c->error || c->tp != &kolo__tcp_transport || (!c->sendq && !c->recvq)) continue;
        int st = kolo__tcp_unanswered(c, (unsigned)(m->keepalive_ns / 1000000u));
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

static int all_done(kolo__xfer *const *xs, int n, int *status)
{
    int done = 1;
    for (int i = 0; i < n; i++) {
        if (xs[i]->status < 0) {
            *status = xs[i]->status;
            return 1;
        }
        if (xs[i]->status != 0) done = 0;
    }
    return done;
}

/* test hook: naps of mixed waits that a socket ended (sleep_on_sockets) */
static _Thread_local uint64_t socket_naps;

uint64_t kolo__wait_test_socket_naps(void) { return socket_naps; }

/* Sleeps until a pending tcp conn's socket is ready: up to ms milliseconds when every pending conn
 * is tcp (1 where more than 64 are: the others' sockets would not end the sleep); else, with
 * shared-memory conns pending too (their doorbells are futexes, which poll() cannot wait on, so
 * doze_arm refused the wait), up to 100 us, so that their bytes are seen soon after they come,
 * while a socket that becomes ready ends the nap at once. A plain 100 us nap left
 * a tcp peer's message (a rank on another host, beside shared-memory ones on this host) waiting
 * for the rest of it. */
static void sleep_on_sockets(kolo__mesh *m, int ms)
{
    struct pollfd pfd[64];
    int n = 0;
    bool only_tcp = true;
    for (int p = 0; p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (!c || c->error || (!c->sendq && !c->recvq)) continue;
        if (c->tp != &kolo__tcp_transport) {
            only_tcp = false;
            continue;
        }
        if (n == 64) {
            ms = 1;
            continue;
        }
        pfd[n].fd = c->fd;
        pfd[n].events = (short)((c->recvq ? POLLIN : 0) | (c->sendq ? POLLOUT : 0));
        pfd[n].revents = 0;
        n++;
    }
    if (only_tcp && n > 0) {
        poll(pfd, (nfds_t)n, ms);
        return;
    }
    struct timespec ts = {0, 100000}; /* 100 us */
    if (ppoll(pfd, (nfds_t)n, &ts, NULL) > 0) socket_naps++;
}

/* test hook: this thread's idle passes, yields, sleeps on doorbells, sleeps a doorbell ended
 * (not the time limit) and liveness checks in kolo__wait so far */
static _Thread_local uint64_t idle_passes, yields, dozes, rung, checks;

void kolo__wait_test_counts(uint64_t out[5])
{
    out[0] = idle_passes;
    out[1] = yields;
    out[2] = dozes;
    out[3] = rung;
    out[4] = checks;
}

/* ---- sleeping on doorbells (shm.c, "Sleeping") ---- */

#define DOZE_MAX 64 /* connections one sleep waits on; more fall back to naps */
#define YIELD_NS 5000000ull
#define CHECK_NS 1000000ull       /* between liveness checks (hang-ups, KOLO_OP_TIMEOUT) */
#define DOZE_CHECK_NS 10000000ull /* the same while the mesh dozes (kolo__wait) */
/* A wait that has made no progress for a while checks less often: every eighth of the time it
 * has waited, up to CHECK_MAX_NS. Each check wakes a sleeping waiter, and on this project's
 * 2-vCPU Intel VM a wake-up, check and sleep cost ~20 us: a rank waiting in a barrier for a
 * straggler spent 1.2-3.1 % of a core on them (1,000 checks a second), and 63 ranks waiting on 2
 * cores for a 64th took 1.7 cores between them. bench/wait-bench.c, 2 s waits, 3 in each of 2
 * launches per build, the builds alternated: 2 ranks 1.9-2.6 % -> 0.51-0.59 %, 8 ranks 1.2-1.9 ->
 * 0.29-0.31, 64 ranks 2.5-3.1 -> 0.76-0.87, 8 over TCP 1.6-2.0 -> 0.45-0.54; 45-58 checks a wait.
 * What is left is mostly the 5 ms of yielding before a wait sleeps. A peer that dies is still seen
 * within an eighth of the time waited so far (a tenth of a second at most), KOLO_OP_TIMEOUT as
 * closely; the messages themselves wake the waiter (doorbells, sockets), not the checks. */
#define CHECK_MAX_NS 100000000ull

static uint64_t next_check_after(uint64_t base, uint64_t idle)
{
    uint64_t t = idle / 8;
    return t < base ? base : t > CHECK_MAX_NS ? CHECK_MAX_NS : t;
}

typedef struct dozing {
    int n; /* connections marked asleep; 0: none */
    kolo__conn *conns[DOZE_MAX];
    struct futex_waitv bells[DOZE_MAX];
} dozing;

static _Atomic int waitv_missing; /* futex_waitv failed (before Linux 5.16): nap instead */

/* Marks this side asleep on every connection with pending xfers and notes their doorbells; the
 * caller polls once more before it sleeps. False (nothing marked) when some such connection has
 * no doorbell (tcp) or there are too many. */
static bool doze_arm(kolo__mesh *m, dozing *d)
{
    if (atomic_load_explicit(&waitv_missing, memory_order_relaxed)) return false;
    d->n = 0;
    for (int p = 0; p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (!c || c->error || (!c->sendq && !c->recvq)) continue;
        uint32_t seen = 0;
        _Atomic uint32_t *word = d->n < DOZE_MAX && c->tp->doze ? c->tp->doze(c, &seen) : NULL;
        if (!word) {
            for (int i = 0; i < d->n; i++) d->conns[i]->tp->awake(d->conns[i]);
            d->n = 0;
            return false;
        }
        d->conns[d->n] = c;
        d->bells[d->n] = (struct futex_waitv){.val = seen, .uaddr = (uint64_t)(uintptr_t)word, .flags = FUTEX_32};
        d->n++;
    }
    return d->n > 0;
}

static void doze_end(dozing *d)
{
    for (int i = 0; i < d->n; i++) d->conns[i]->tp->awake(d->conns[i]);
    d->n = 0;
}

/* Sleeps until a doorbell rings (or already rang since doze_arm) or until `until` (monotonic ns). */
static void doze_sleep(dozing *d, uint64_t until)
{
    struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
    dozes++;
    /* a bell that rang since doze_arm ends it at once (EAGAIN: the word no longer reads `seen`) */
    if (syscall(SYS_futex_waitv, d->bells, (unsigned)d->n, 0u, &ts, CLOCK_MONOTONIC) >= 0 || errno == EAGAIN)
        rung++;
    else if (errno != ETIMEDOUT && errno != EINTR) /* ENOSYS, or a kernel that refuses it: nap instead */
        atomic_store_explicit(&waitv_missing, 1, memory_order_relaxed);
    doze_end(d);
}

/* Bytes of the frame at the head of a queue moved so far (header, filler, payload). */
static size_t moved_bytes(const kolo__xfer *x) { return x ? x->done + x->hdr_done + x->pad_done + x->tail_done : 0; }

/* A wait whose messages are all at most this long counts as small (below). */
#define QUICK_YIELD_MAX 1024

/* test hook: the calling thread's next waits check liveness before their first progress pass */
static _Thread_local bool test_liveness_first;

void kolo__wait_test_liveness_first(bool on) { test_liveness_first = on; }

/* check_liveness found a peer gone (status). It drained what that peer sent before it went, and
 * a wait that now has all its bytes succeeds: a peer may die right after its part of a
 * collective is sent (it returned from the call), and the others' calls must not fail for it;
 * the loss fails the next exchange that needs that peer (the mesh is marked failed). */
static int after_loss(kolo__xfer *const *xs, int n, int status)
{
    int mine = KOLO_OK;
    return all_done(xs, n, &mine) ? mine : status;
}

/* For kolo_status_json (kolo__mesh_stuck): at each liveness check of a wait, since when it has
 * made no progress and whom it waits on: the peers with transfers queued (only this thread
 * posts on the mesh), each once. Relaxed stores at the checks only: a reader on another thread
 * may see the peers of one check with the time of the next. */
static void publish_stuck(kolo__mesh *m, uint64_t since)
{
    int k = 0;
    for (int p = 0; p < m->size; p++) {
        const kolo__conn *c = m->conns[p];
        if (!c || (!c->sendq && !c->recvq)) continue;
        if (k < KOLO__STUCK_MAX) atomic_store_explicit(&m->stuck_peer[k], p, memory_order_relaxed);
        k++;
    }
    atomic_store_explicit(&m->stuck_n, k, memory_order_relaxed);
    atomic_store_explicit(&m->stuck_since, since, memory_order_relaxed);
}

uint64_t kolo__mesh_stuck(const kolo__mesh *m, int *peers, int cap, int *n)
{
    uint64_t since = atomic_load_explicit(&m->stuck_since, memory_order_relaxed);
    int k = atomic_load_explicit(&m->stuck_n, memory_order_relaxed);
    *n = since ? k : 0;
    for (int i = 0; i < *n && i < cap && i < KOLO__STUCK_MAX; i++)
        peers[i] = atomic_load_explicit(&m->stuck_peer[i], memory_order_relaxed);
    return since;
}

/* The peers of the unfinished ones of xs, in increasing order, as "1, 3-5" (for a message: a
 * pass over the peers per xfer) */
static void owed_ranks(const kolo__mesh *m, kolo__xfer *const *xs, int n, char *who, size_t cap)
{
    kolo__ranks_text t;
    kolo__ranks_begin(&t, who, cap);
    for (int p = 0; p < m->size; p++)
        for (int i = 0; i < n; i++)
            if (xs[i]->status == 1 && xs[i]->conn && xs[i]->conn->peer == p) {
                kolo__ranks_add(&t, p);
                break;
            }
    kolo__ranks_end(&t);
}

int kolo__wait(kolo__mesh *m, kolo__xfer *const *xs, int n)
{
    int status = KOLO_OK;
    dozing d; /* its arrays are written before they are read: no 2 KiB of zeroes per wait */
    d.n = 0;
    bool stuck = false; /* published for kolo_status_json */
    bool warned = false; /* m->on_stall called since the last progress */
    if (all_done(xs, n, &status)) goto out;
    if (test_liveness_first && (status = check_liveness(m, 0)) != KOLO_OK) {
        status = after_loss(xs, n, status);
        goto out;
    }
    /* A dozing mesh's waits are mostly for the engine exchanges of ranks that have nothing to
     * say (a straggler's, every 4 ms: engine.c, "Cycle timing"): a liveness check every
     * millisecond woke the waiter four times per exchange. A dead peer is seen within
     * DOZE_CHECK_NS instead. */
    uint64_t check_ns = m->doze ? DOZE_CHECK_NS : CHECK_NS;
    uint64_t start = kolo__now_ns(), last_progress = start, next_check = start + check_ns;
    uint64_t spin = m->spin_ns, yield_until = m->doze ? spin : YIELD_NS;
    /* Idle passes between readings of the clock (minus one; see below). A rank that must yield
     * at once (oversubscribed) and waits only for small messages reads it after every pass: what
     * it waits for is a peer that needs its core to send them. With 4 ranks on 2 cores over
     * shared memory, 8 B allreduce 4.2 us instead of 7.7 (20 launches interleaved); broadcasts of
     * 4-32 KiB, whose waits are for messages already being copied, did not gain, so larger waits
     * keep the batch. */
    unsigned batch = 63;
    if (m->spin_ns == 0) {
        size_t largest = 0;
        for (int i = 0; i < n; i++) largest = KOLO_MAX(largest, xs[i]->len);
        if (largest <= QUICK_YIELD_MAX) batch = 0;
    }
    for (unsigned iter = 0;; iter++) {
        bool moved = false, syscalls = false;
        for (int p = 0; p < m->size; p++) {
            kolo__conn *c = m->conns[p];
            if (!c || (!c->sendq && !c->recvq)) continue;
            syscalls |= c->tp == &kolo__tcp_transport;
            size_t before = moved_bytes(c->sendq) + moved_bytes(c->recvq);
            kolo__xfer *sq = c->sendq, *rq = c->recvq;
            int st = c->tp->progress(c);
            if (st != KOLO_OK) break; /* the conn failed its xfers; all_done sees it */
            size_t after = moved_bytes(c->sendq) + moved_bytes(c->recvq);
            if (after != before || sq != c->sendq || rq != c->recvq) moved = true;
        }
        if (all_done(xs, n, &status)) goto out;
        if (moved) {
            last_progress = 0; /* re-read the clock lazily */
            warned = false;
            doze_end(&d);
            continue;
        }
        if (d.n) { /* marked asleep, and the last poll found nothing */
            doze_sleep(&d, next_check);
            syscalls = true; /* read the clock after a sleep */
        }
        idle_passes++;
        /* the clock is read every 64th idle pass over shared memory (a pass is a few loads), but
         * every pass that polled a socket (a system call per tcp conn): 64 of those took ~100 us,
         * and a rank that must yield at once (oversubscribed) held its core that long. With 4
         * ranks on 2 cores over TCP an 8 B allreduce took 108-164 us that way, 37-46 now. */
        if ((iter & batch) != 0 && !syscalls) {
            cpu_relax();
            continue;
        }
        uint64_t now = kolo__now_ns();
        if (last_progress == 0) last_progress = now;
        if (now >= next_check) {
            next_check = now + next_check_after(check_ns, now - last_progress);
            checks++;
            publish_stuck(m, last_progress);
            stuck = true;
            status = check_liveness(m, now - last_progress);
            if (status != KOLO_OK) {
                status = after_loss(xs, n, status);
                goto out;
            }
            if (!warned && m->on_stall && m->stall_ns && now - last_progress >= m->stall_ns) {
                char who[256];
                owed_ranks(m, xs, n, who, sizeof(who));
                m->on_stall(m, now - last_progress, who);
                warned = true;
            }
            if (now - last_progress > m->op_timeout_ns) {
                char who[256], call[112] = "";
                owed_ranks(m, xs, n, who, sizeof(who));
                if (m->call_tag) { /* in a direct collective */
                    memcpy(call, " in ", 5);
                    kolo__call_text(m->call_tag, -1, m->size, call + 4, sizeof(call) - 4);
                }
                status = kolo__err(KOLO_ERR_TIMEOUT,
                                   "rank %d waited %g s for rank(s) %s without progress (KOLO_OP_TIMEOUT)%s: "
                                   "the peer is alive but sent nothing (stopped, swapping, or stuck outside kolo%s)",
                                   m->rank, (double)m->op_timeout_ns * 1e-9, who, call,
                                   call[0] ? "; or waiting itself, in a call that sends this rank nothing: another "
                                             "root, another process set"
                                           : "");
                KOLO_ERROR("%s", kolo__errmsg());
                mesh_mark_failed(m, status);
                goto out;
            }
        }
        uint64_t idle = now - last_progress;
        if (idle < spin) {
            cpu_relax();
        } else if (idle < yield_until) {
            yields++;
            sched_yield();
        } else if (!doze_arm(m, &d)) {
            sleep_on_sockets(m, (int)KOLO_MAX((next_check - KOLO_MIN(now, next_check)) / 1000000u, 1u));
        } /* else poll once more, then sleep (above) */
    }
out:
    doze_end(&d);
    if (stuck) atomic_store_explicit(&m->stuck_since, 0, memory_order_relaxed);
    /* Once this rank's mesh has failed, a later failure in the same wait follows from the first
     * (a peer that learned of it and left): the wait reports the first, which names the rank
     * where it began. Rank 0 killed in the engine's random mix (tests/test_engine.c), rank 2
     * told and gone, rank 1's alltoall waited on rank 2 alone and failed with "lost rank 2:
     * sending to it failed (Broken pipe)", a rank that had done nothing wrong. */
    if (status < 0 && m->failed && strcmp(kolo__errmsg(), m->failmsg) != 0) kolo__err(status, "%s", m->failmsg);
    return status;
}

int kolo__wait1(kolo__mesh *m, kolo__xfer *x) { return kolo__wait(m, &x, 1); }

void kolo__poke(kolo__mesh *m)
{
    if (!m || !m->conns) return; /* a job of one rank has no connections */
    for (int p = 0; p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (c && !c->error && (c->sendq || c->recvq)) c->tp->progress(c);
    }
}
