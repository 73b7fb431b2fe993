/* shm.c - the shared-memory transport between two ranks of one host.
 *
 * The pair shares one segment (POSIX shm, unlinked as soon as both sides have mapped it, so
 * nothing is left behind if a process dies) holding two rings, one per direction. A ring is a
 * power-of-two byte array with a producer counter `head` and a consumer counter `tail` on
 * their own cache lines; the stream in it has the same framing as TCP (16-byte header, then
 * payload), so the same matching and mismatch checks apply.
 *
 * Small messages are copied into the ring and out of it (two copies, but in cache). A message
 * of at least `cma_threshold` bytes, when the pair passed the CMA probe, sends only a
 * descriptor {address, length} of the sender's buffer: the receiver reads the payload
 * straight into its own buffer with process_vm_readv (one copy, done by the kernel) and then
 * bumps the ring's `acks` counter; the sender's xfer completes when it sees the ack. Until
 * then the sender's buffer must stay untouched, which the xfer contract already demands.
 *
 * Memory order: the producer writes bytes, then publishes head with release; the consumer
 * acquires head, reads, then publishes tail with release. acks likewise.
 */
#include "transport.h"

#include "../boot/auth.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#define MADV_POPULATE_WRITE 23
#endif

#define SHM_FLAG_CMA 1u
#define SHM_CLOSED 1u
#define SHM_ABORTED 2u
#define CMA_DESC_LEN 16

typedef struct ring_ctl {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint64_t acks;
    _Alignas(64) uint64_t token;
    _Atomic uint32_t closed; /* SHM_CLOSED: the producer shut down cleanly; SHM_ABORTED: it gave up */
    char reason[KOLO_ABORT_REASON_MAX]; /* why it gave up; written before `closed` */
} ring_ctl;

typedef struct shm_priv {
    void *base;
    size_t maplen;
    ring_ctl *tx_ctl, *rx_ctl;
    char *tx, *rx;
    uint64_t mask;
    int peer_pid;
    int cma_ok; /* the pair passed the CMA probe: descriptors from the peer can be read */
    int cma;    /* send messages of cma_threshold bytes and more as descriptors */
    size_t cma_threshold;
    uint64_t cma_sent;
    /* bytes from the start of each ring known to be mapped in: all of it when the segment was
     * mapped with MAP_POPULATE, else it grows in big steps during the first pass (first_pass) */
    uint64_t tx_ready, rx_ready;
} shm_priv;

static size_t seg_len(size_t ring)
{
    return 2 * (sizeof(ring_ctl) + ring);
}

static void ring_write(char *ring, uint64_t mask, uint64_t pos, const void *src, size_t n)
{
    size_t off = (size_t)(pos & mask), first = KOLO_MIN(n, (size_t)(mask + 1 - off));
    memcpy(ring + off, src, first);
    if (n > first) memcpy(ring, (const char *)src + first, n - first);
}

static void ring_read(const char *ring, uint64_t mask, uint64_t pos, void *dst, size_t n)
{
    size_t off = (size_t)(pos & mask), first = KOLO_MIN(n, (size_t)(mask + 1 - off));
    memcpy(dst, ring + off, first);
    if (n > first) memcpy((char *)dst + first, ring, n - first);
}

/* During a ring's first pass, maps its pages in ahead of use, 256 KiB at a time, with one
 * madvise instead of one page fault per 4 KiB on each side (rings not faulted in at start-up
 * because there were too many: mesh.c). `end` is the ring offset about to be reached; the
 * ring counters start at 0, so the first pass is exactly the offsets below the ring size. */
static void first_pass(char *ring, uint64_t size, uint64_t *ready, uint64_t end, int advice)
{
    if (end <= *ready || *ready >= size) return;
    uint64_t to = KOLO_MIN(size, (end + (256u << 10) - 1) & ~(uint64_t)((256u << 10) - 1));
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)(ring + *ready) & ~(page - 1), b = ((uintptr_t)(ring + to) + page - 1) & ~(page - 1);
    (void)madvise((void *)a, b - a, advice); /* before Linux 5.14: EINVAL, and pages fault in as before */
    *ready = to;
}

static void tx_write(shm_priv *s, uint64_t pos, const void *src, size_t n)
{
    first_pass(s->tx, s->mask + 1, &s->tx_ready, pos + n, MADV_POPULATE_WRITE);
    ring_write(s->tx, s->mask, pos, src, n);
}

static void rx_read(shm_priv *s, uint64_t pos, void *dst, size_t n)
{
    first_pass(s->rx, s->mask + 1, &s->rx_ready, pos + n, MADV_POPULATE_READ);
    ring_read(s->rx, s->mask, pos, dst, n);
}

static int progress_send(kolo__conn *c, shm_priv *s)
{
    ring_ctl *ctl = s->tx_ctl;
    uint64_t size = s->mask + 1;
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
    uint64_t start = head;
    while (c->sendq) {
        kolo__xfer *x = c->sendq;
        if (x->cma_seq) { /* descriptor written: wait for the reader's ack */
            if (atomic_load_explicit(&ctl->acks, memory_order_acquire) < x->cma_seq) break;
            kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
            continue;
        }
        uint64_t space = size - (head - tail);
        if (x->hdr_done == 0) {
            bool cma = s->cma && x->len >= s->cma_threshold;
            size_t need = KOLO_HDR_LEN + (cma ? CMA_DESC_LEN : 0);
            if (space < need) {
                tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
                space = size - (head - tail);
                if (space < need) break;
            }
            if (cma) {
                unsigned char msg[KOLO_HDR_LEN + CMA_DESC_LEN];
                uint64_t addr = (uint64_t)(uintptr_t)x->buf, len = x->len;
                kolo__hdr_pack(msg, SHM_FLAG_CMA, x->len);
                memcpy(msg + KOLO_HDR_LEN, &addr, 8);
                memcpy(msg + KOLO_HDR_LEN + 8, &len, 8);
                tx_write(s, head, msg, sizeof(msg));
                head += sizeof(msg);
                x->hdr_done = KOLO_HDR_LEN;
                x->done = x->len;
                x->cma_seq = ++s->cma_sent;
                continue;
            }
            tx_write(s, head, x->hdr, KOLO_HDR_LEN);
            head += KOLO_HDR_LEN;
            x->hdr_done = KOLO_HDR_LEN;
            space -= KOLO_HDR_LEN;
        }
        if (x->done < x->len) {
            if (space == 0) {
                tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
                space = size - (head - tail);
                if (space == 0) break;
            }
            size_t n = (size_t)KOLO_MIN((uint64_t)(x->len - x->done), space);
            tx_write(s, head, x->buf + x->done, n);
            head += n;
            x->done += n;
            if (x->done < x->len) {
                /* publish what fits now so the reader can start draining */
                atomic_store_explicit(&ctl->head, head, memory_order_release);
                start = head;
                tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
                if (size - (head - tail) == 0) break;
                continue;
            }
        }
        kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
    }
    if (head != start) atomic_store_explicit(&ctl->head, head, memory_order_release);
    return KOLO_OK;
}

/* The sender gave up while we were reading its memory: what we read cannot be trusted. */
static int aborted_peer(kolo__conn *c, shm_priv *s)
{
    char why[KOLO_ABORT_REASON_MAX + 1];
    snprintf(why, sizeof(why), "%.*s", (int)sizeof(s->rx_ctl->reason), s->rx_ctl->reason);
    return kolo__conn_fail(c, kolo__err_aborted(c, why));
}

static int cma_read(kolo__conn *c, shm_priv *s, kolo__xfer *x, uint64_t addr)
{
    while (x->done < x->len) {
        struct iovec local = {x->buf + x->done, x->len - x->done};
        struct iovec remote = {(void *)(uintptr_t)(addr + x->done), x->len - x->done};
        ssize_t k = process_vm_readv(s->peer_pid, &local, 1, &remote, 1, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EFAULT || atomic_load(&s->rx_ctl->closed) == SHM_ABORTED) return aborted_peer(c, s);
            if (errno == ESRCH)
                kolo__err(KOLO_ERR_PEER_LOST, "lost rank %d on %s: the process is gone", c->peer,
                          kolo__peer_name(c->mesh, c->peer));
            else
                kolo__err_sys(errno, "single-copy read of %zu bytes from rank %d on %s failed",
                              x->len, c->peer, kolo__peer_name(c->mesh, c->peer));
            return kolo__conn_fail(c, errno == ESRCH ? KOLO_ERR_PEER_LOST : KOLO_ERR_SYSTEM);
        }
        if (k == 0)
            return kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL, "rank %d on %s described a buffer that cannot be read",
                                                c->peer, kolo__peer_name(c->mesh, c->peer)));
        x->done += (size_t)k;
    }
    /* The sender marks its rings aborted before its buffers go back to its user; data read
     * before the mark was still its own. After it, the bytes may be anything. */
    if (atomic_load(&s->rx_ctl->closed) == SHM_ABORTED) return aborted_peer(c, s);
    return KOLO_OK;
}

static int progress_recv(kolo__conn *c, shm_priv *s)
{
    ring_ctl *ctl = s->rx_ctl;
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_acquire);
    uint64_t start = tail;
    int st = KOLO_OK;
    while (c->recvq) {
        kolo__xfer *x = c->recvq;
        if (x->hdr_done == 0) {
            if (head - tail < KOLO_HDR_LEN) break;
            rx_read(s, tail, x->hdr, KOLO_HDR_LEN);
            uint32_t flags;
            st = kolo__hdr_check(c, x, &flags);
            if (st != KOLO_OK) {
                kolo__conn_fail(c, st);
                break;
            }
            if (flags & SHM_FLAG_CMA) {
                if (!s->cma_ok) {
                    st = kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                                      "rank %d on %s sent a single-copy descriptor, but this "
                                                      "pair never passed the single-copy probe",
                                                      c->peer, kolo__peer_name(c->mesh, c->peer)));
                    break;
                }
                if (head - tail < KOLO_HDR_LEN + CMA_DESC_LEN) break; /* written together; re-read next time */
                unsigned char d[CMA_DESC_LEN];
                uint64_t addr;
                rx_read(s, tail + KOLO_HDR_LEN, d, CMA_DESC_LEN);
                memcpy(&addr, d, 8);
                x->hdr_done = KOLO_HDR_LEN;
                st = cma_read(c, s, x, addr);
                if (st != KOLO_OK) break;
                tail += KOLO_HDR_LEN + CMA_DESC_LEN;
                atomic_store_explicit(&ctl->tail, tail, memory_order_release);
                start = tail;
                atomic_fetch_add_explicit(&ctl->acks, 1, memory_order_release);
                kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
                continue;
            }
            x->hdr_done = KOLO_HDR_LEN;
            tail += KOLO_HDR_LEN;
        }
        if (x->done < x->len) {
            if (head == tail) {
                head = atomic_load_explicit(&ctl->head, memory_order_acquire);
                if (head == tail) break;
            }
            size_t n = (size_t)KOLO_MIN((uint64_t)(x->len - x->done), head - tail);
            rx_read(s, tail, x->buf + x->done, n);
            tail += n;
            x->done += n;
            if (x->done < x->len) {
                atomic_store_explicit(&ctl->tail, tail, memory_order_release);
                start = tail;
                head = atomic_load_explicit(&ctl->head, memory_order_acquire);
                continue;
            }
        }
        kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
    }
    if (tail != start) atomic_store_explicit(&ctl->tail, tail, memory_order_release);
    return st;
}

static int shm_progress(kolo__conn *c)
{
    if (c->error) return c->error;
    shm_priv *s = c->priv;
    int st = KOLO_OK;
    if (c->sendq) st = progress_send(c, s);
    if (st == KOLO_OK && c->recvq) st = progress_recv(c, s);
    return st;
}

static void shm_close(kolo__conn *c)
{
    shm_priv *s = c->priv;
    if (!s) return;
    if (s->base) munmap(s->base, s->maplen);
    kolo__free(s);
    c->priv = NULL;
}

static void shm_goodbye(kolo__conn *c)
{
    shm_priv *s = c->priv;
    if (s) atomic_store_explicit(&s->tx_ctl->closed, SHM_CLOSED, memory_order_release);
}

static bool shm_left_cleanly(kolo__conn *c)
{
    shm_priv *s = c->priv;
    return s && atomic_load_explicit(&s->rx_ctl->closed, memory_order_acquire) == SHM_CLOSED;
}

static void shm_abort(kolo__conn *c, const char *reason)
{
    shm_priv *s = c->priv;
    if (!s) return;
    snprintf(s->tx_ctl->reason, sizeof(s->tx_ctl->reason), "%s", reason);
    atomic_store(&s->tx_ctl->closed, SHM_ABORTED); /* seq_cst: before our user reuses buffers */
}

static bool shm_abort_reason(kolo__conn *c, char *buf, size_t cap)
{
    shm_priv *s = c->priv;
    if (!s || atomic_load(&s->rx_ctl->closed) != SHM_ABORTED) return false;
    snprintf(buf, cap, "%.*s", (int)sizeof(s->rx_ctl->reason), s->rx_ctl->reason);
    return buf[0] != '\0';
}

const kolo__transport kolo__shm_transport = {"shm",     shm_progress, shm_close, shm_goodbye, shm_left_cleanly,
                                             shm_abort, shm_abort_reason};

static int map_segment(kolo__conn *c, int fd, size_t ring, int creator, int populate)
{
    shm_priv *s = kolo__calloc(1, sizeof(*s));
    if (!s) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a shared-memory connection");
    s->maplen = seg_len(ring);
    s->base = mmap(NULL, s->maplen, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (s->base == MAP_FAILED) {
        int e = errno;
        kolo__free(s);
        return kolo__err_sys(e, "mapping %zu bytes of shared memory for rank %d", seg_len(ring), c->peer);
    }
    char *p = s->base;
    ring_ctl *c0 = (ring_ctl *)p, *c1 = (ring_ctl *)(p + sizeof(ring_ctl) + ring);
    char *d0 = p + sizeof(ring_ctl), *d1 = (char *)c1 + sizeof(ring_ctl);
    /* ring 0 carries creator -> opener */
    s->tx_ctl = creator ? c0 : c1;
    s->tx = creator ? d0 : d1;
    s->rx_ctl = creator ? c1 : c0;
    s->rx = creator ? d1 : d0;
    s->mask = ring - 1;
    s->tx_ready = s->rx_ready = populate ? ring : 0;
    c->priv = s;
    c->tp = &kolo__shm_transport;
    return KOLO_OK;
}

static size_t ring_pow2(size_t ring)
{
    size_t r = 65536;
    while (r < ring && r < ((size_t)1 << 30)) r <<= 1;
    return r;
}

int kolo__shm_create(kolo__conn *c, char *name, size_t cap, size_t ring, int populate)
{
    ring = ring_pow2(ring);
    uint64_t nonce;
    if (kolo__random_bytes(&nonce, sizeof(nonce)) != KOLO_OK) nonce = kolo__now_ns();
    snprintf(name, cap, "/kolo-%d-%d-%d-%016llx", (int)getpid(), c->mesh->channel, c->peer,
             (unsigned long long)nonce);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kolo__err_sys(errno, "shm_open(%s)", name);
    if (ftruncate(fd, (off_t)seg_len(ring)) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return kolo__err_sys(e, "sizing shared memory %s to %zu bytes (is /dev/shm full?)", name, seg_len(ring));
    }
    int st = map_segment(c, fd, ring, 1, populate);
    close(fd);
    if (st != KOLO_OK) {
        shm_unlink(name);
        return st;
    }
    shm_priv *s = c->priv;
    s->tx_ctl->token = nonce; /* the opener checks it to prove it mapped the same memory */
    return KOLO_OK;
}

int kolo__shm_open(kolo__conn *c, const char *name, size_t ring, int populate)
{
    ring = ring_pow2(ring);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kolo__err_sys(errno, "shm_open(%s)", name);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != seg_len(ring)) {
        close(fd);
        return kolo__err(KOLO_ERR_PROTOCOL, "shared memory %s has the wrong size", name);
    }
    int st = map_segment(c, fd, ring, 0, populate);
    close(fd);
    if (st != KOLO_OK) return st;
    /* the name embeds the creator's token: it must match what we mapped */
    shm_priv *s = c->priv;
    const char *dash = strrchr(name, '-');
    unsigned long long tok = dash ? strtoull(dash + 1, NULL, 16) : 0;
    if (s->rx_ctl->token != tok) {
        shm_close(c);
        c->tp = NULL;
        return kolo__err(KOLO_ERR_PROTOCOL, "shared memory %s does not hold rank %d's token: not the same host", name,
                         c->peer);
    }
    return KOLO_OK;
}

void kolo__shm_unlink(const char *name) { shm_unlink(name); }

void kolo__shm_enable_cma(kolo__conn *c, int peer_pid, size_t threshold, bool send)
{
    shm_priv *s = c->priv;
    s->cma_ok = 1;
    s->cma = send;
    s->peer_pid = peer_pid;
    s->cma_threshold = threshold;
}

bool kolo__shm_use_cma(kolo__conn *c, bool on)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return false;
    shm_priv *s = c->priv;
    if (!s->cma_ok) return false;
    s->cma = on;
    return true;
}

int kolo__shm_cma_state(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return -1;
    const shm_priv *s = c->priv;
    return s->cma_ok ? s->cma : -1;
}
