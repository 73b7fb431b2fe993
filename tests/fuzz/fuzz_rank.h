/* fuzz_rank.h - the real rank of the harnesses that start one through the mesh (fuzz_mesh.c,
 * fuzz_frames.c, fuzz_shm.c, fuzz_cma.c): a fresh store on 127.0.0.1, the rank's identity, its
 * start-up and its operations on threads, the proofs of the mesh's handshake as the other ranks
 * make them, and the process's segments in /dev/shm; with FZ_SHM_RING, the shared-memory rings as
 * the peer maps them, and what a rank that failed its connection must have told it.
 *
 * The includer has kolo__mesh_build in reach (mesh.c, or an object that links it), includes
 * fuzz_net.h, and defines, before including this: SECRET and JOB (strings), NCH (the channels),
 * ANSWER_S, and fail() as fuzz_net.h asks; FZ_SHM_RING only where it includes shm.c. */
#ifndef KOLO_FUZZ_RANK_H
#define KOLO_FUZZ_RANK_H

#include <pthread.h>
#include <stdatomic.h>

/* The mesh handshake's wire, from the protocol at the top of mesh.c (fuzz_mesh.c checks these
 * against mesh.c's lengths). */
#define W_MAGIC "KOLOMSH6"
#define W_HELLO_A (8 + 4 + KOLO_NONCE_LEN)                     /* magic, rank_a, nonce_a */
#define W_HELLO_C (8 + 4 + 4 + KOLO_NONCE_LEN + KOLO_MAC_LEN)  /* magic, rank_c, channel, nonce_c, mac */
#define W_NAME 96
#define W_ACK (KOLO_MAC_LEN + 4 + W_NAME + 4 + 8 + 8)          /* mac, offer, name, pid, probe address, value */
#define W_RESULT (4 + 4 + 8 + 8)                               /* shm taken, cma, probe address, value */
#define W_FINAL 4                                              /* cma */

typedef struct real_rank {
    pthread_t thread;
    atomic_int done;
    int st;
    char msg[1024];
    kolo__world_info wi;
    kolo__mesh *meshes[NCH];
    kolo__peer_info *peers;
} real_rank;

static real_rank rr;
static kolo__store_server *srv;
static int srv_port;

/* The rank's start-up, on its thread: the store's client, kolo__mesh_build, the outcome in rr. */
static void *run_real_rank(void *arg)
{
    (void)arg;
    kolo__store *s = NULL;
    int st = kolo__store_connect(&s, "127.0.0.1", srv_port, SECRET, strlen(SECRET), ANSWER_S);
    if (st == KOLO_OK) {
        st = kolo__mesh_build(rr.meshes, &rr.peers, &rr.wi, s);
        kolo__store_close(s);
    }
    rr.st = st;
    snprintf(rr.msg, sizeof(rr.msg), "%s", st == KOLO_OK ? "" : kolo__errmsg());
    atomic_store(&rr.done, 1);
    return NULL;
}

/* A fresh store, and rr as rank `rank` of `size` would find itself in kolo_init (not started). */
static void real_rank_begin(int rank, int size, double start_timeout_s)
{
    if (kolo__store_server_start(&srv, "127.0.0.1", 0, SECRET, strlen(SECRET)) != KOLO_OK)
        fail("cannot start the store: %s", kolo__errmsg());
    srv_port = kolo__store_server_port(srv);
    memset(&rr, 0, sizeof(rr));
    rr.wi.rank = rank;
    rr.wi.size = size;
    rr.wi.local_rank = rr.wi.local_size = rr.wi.cross_rank = rr.wi.cross_size = -1;
    snprintf(rr.wi.rdv_host, sizeof(rr.wi.rdv_host), "127.0.0.1");
    rr.wi.rdv_port = srv_port;
    snprintf(rr.wi.source, sizeof(rr.wi.source), "kolo");
    snprintf(rr.wi.job_id, sizeof(rr.wi.job_id), "%s", JOB);
    memcpy(rr.wi.secret, SECRET, sizeof(SECRET));
    rr.wi.secret_len = strlen(SECRET);
    rr.wi.epoch = 1;
    rr.wi.start_timeout = start_timeout_s;
}

/* The MAC of a mesh handshake's step: label over the job id, a nonce and three numbers (mesh.c,
 * hs_mac), under secret. */
static void proof(uint8_t out[KOLO_MAC_LEN], const char *secret, const char *label, const uint8_t *nonce, uint32_t a,
                  uint32_t b, uint32_t c)
{
    uint8_t msg[sizeof(JOB) + KOLO_NONCE_LEN + 12];
    size_t jl = strlen(JOB);
    memcpy(msg, JOB, jl);
    memcpy(msg + jl, nonce, KOLO_NONCE_LEN);
    w32(msg + jl + KOLO_NONCE_LEN, a);
    w32(msg + jl + KOLO_NONCE_LEN + 4, b);
    w32(msg + jl + KOLO_NONCE_LEN + 8, c);
    if (kolo__hmac(out, secret, strlen(secret), label, msg, jl + KOLO_NONCE_LEN + 12) != KOLO_OK)
        fail("hmac: %s", kolo__errmsg());
}

/* Rank 1's handshake with R, rank 0, on channel ch, as far as R's acceptance: R's greeting read,
 * the connector's proof sent (its nonce filled with nonce_fill and the channel), the acceptance
 * read into ack and its proof checked. Returns the socket; the offer in ack is the caller's. */
static inline int connect_as_rank_1(int rport, uint32_t ch, uint8_t nonce_fill, uint8_t ack[W_ACK])
{
    int fd = dial(rport);
    uint8_t ha[W_HELLO_A], hc[W_HELLO_C], want[KOLO_MAC_LEN];
    if (read_full(fd, ha, sizeof(ha), ANSWER_S) != RD_OK || memcmp(ha, W_MAGIC, 8) != 0 || r32(ha + 8) != 0)
        fail("channel %u: no greeting from R as rank 0", ch);
    memcpy(hc, W_MAGIC, 8);
    w32(hc + 8, 1);
    w32(hc + 12, ch);
    uint8_t *nonce_c = hc + 16;
    memset(nonce_c, nonce_fill, KOLO_NONCE_LEN);
    nonce_c[0] = (uint8_t)ch;
    proof(hc + 16 + KOLO_NONCE_LEN, SECRET, "kolo-mesh-connect", ha + 12, 1, ch, 0);
    send_bytes(fd, hc, sizeof(hc));
    if (read_full(fd, ack, W_ACK, ANSWER_S) != RD_OK) fail("channel %u: no acceptance from R", ch);
    proof(want, SECRET, "kolo-mesh-accept", nonce_c, 0, ch, 1);
    if (!kolo__mac_equal(want, ack)) fail("channel %u: R's acceptance does not prove the secret", ch);
    return fd;
}

/* A job of 2 whose rank 0, R, is real and rank 1 the harness: rank 1's record (a listener of the
 * harness at lport that R never dials, and host key hostkey) counted in before R starts, then
 * R's port once it publishes, handshake() on each channel, and R's start-up ended well. */
static inline void start_as_rank_1(int lport, const char *hostkey, void (*handshake)(int rport, uint32_t ch))
{
    real_rank_begin(0, 2, 10.0);
    kolo__store *s = NULL;
    if (kolo__store_connect(&s, "127.0.0.1", srv_port, SECRET, strlen(SECRET), ANSWER_S) != KOLO_OK)
        fail("the harness cannot reach the store: %s", kolo__errmsg());
    char key[160], val[256];
    snprintf(key, sizeof(key), "%s/1/peer/1", JOB);
    int n = snprintf(val, sizeof(val), "127.0.0.1 %d %d %s 0 0 fake1", lport, (int)getpid(), hostkey);
    if (kolo__store_set(s, key, val, (size_t)n) != KOLO_OK) fail("store set: %s", kolo__errmsg());
    snprintf(key, sizeof(key), "%s/1/arrived", JOB);
    if (kolo__store_add(s, key, 1, NULL) != KOLO_OK) fail("store add: %s", kolo__errmsg());
    if (pthread_create(&rr.thread, NULL, run_real_rank, NULL) != 0) fail("pthread_create failed");
    snprintf(key, sizeof(key), "%s/1/peer/0", JOB);
    void *v = NULL;
    size_t len = 0;
    if (kolo__store_get(s, key, &v, &len, ANSWER_S) != KOLO_OK)
        fail("R did not publish its record: %s", kolo__errmsg());
    char text[256], addr[64];
    int rport = 0;
    snprintf(text, sizeof(text), "%.*s", (int)KOLO_MIN(len, sizeof(text) - 1), (const char *)v);
    kolo__free(v);
    kolo__store_close(s);
    if (sscanf(text, "%63s %d", addr, &rport) != 2 || strcmp(addr, "127.0.0.1") != 0)
        fail("R published '%s', not an address on 127.0.0.1", text);
    for (int ch = 0; ch < NCH; ch++) handshake(rport, (uint32_t)ch);
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    while (!atomic_load(&rr.done)) {
        if (kolo__now_ns() > deadline) fail("R's start-up did not end within %g s", ANSWER_S);
        usleep(50);
    }
    pthread_join(rr.thread, NULL);
    if (rr.st != KOLO_OK) fail("R's start-up failed: %s", rr.msg);
}

/* Waits for the operation a thread of R runs to end (done set), then joins the thread. */
static inline void fz_join_op(atomic_int *done, pthread_t thread, double within_s)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)(within_s * 1e9);
    while (!atomic_load(done)) {
        if (kolo__now_ns() > deadline) fail("R did not end the operation within %g s", within_s);
        usleep(50);
    }
    pthread_join(thread, NULL);
}

/* Segments of this process left in /dev/shm (each input must leave none). */
static inline int own_segments(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    char prefix[32];
    int n = 0, k = snprintf(prefix, sizeof(prefix), "kolo-%d-", (int)getpid());
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, (size_t)k) == 0;
    closedir(d);
    return n;
}

#ifdef FZ_SHM_RING
/* ---- the shared-memory rings, for the harnesses that include shm.c (fuzz_shm.c, fuzz_cma.c) ----
 *
 * The frame and the ring, from transport.h and the top of shm.c, checked against shm.c's own. */
#define F_MAGIC 0x4b4f4c4du
#define F_HDR 16
#define F_GOODBYE 0x80000000u
#define F_ABORT 0x40000000u
#define F_REASON_MAX 384
#define F_LEN_BITS 48
#define R_MARK 8
#define R_LINE 64
#define R_INLINE 4096
#define R_CMA 1u
#define R_CALL 2u
#define R_DESC 24 /* a single-copy descriptor: {address, length, stamp} */
#define R_CLOSED 1u
#define R_ABORTED 2u
_Static_assert(F_MAGIC == KOLO_MSG_MAGIC && F_HDR == KOLO_HDR_LEN && F_GOODBYE == KOLO_HDR_GOODBYE &&
                   F_ABORT == KOLO_HDR_ABORT && F_REASON_MAX == KOLO_ABORT_REASON_MAX &&
                   F_LEN_BITS == KOLO_HDR_LEN_BITS && R_MARK == MARK_LEN && R_LINE == LINE &&
                   R_INLINE == INLINE_MAX && R_CMA == SHM_FLAG_CMA && R_CALL == SHM_FLAG_CALL &&
                   R_DESC == CMA_DESC_LEN && R_CLOSED == SHM_CLOSED && R_ABORTED == SHM_ABORTED,
               "the harness's ring differs from shm.c's");

/* A pair's segment as rank 1 maps it: ring 0 (R's tx, which rank 1 reads) and ring 1 (rank 1's). */
typedef struct fz_seg {
    uint8_t *base;
    size_t maplen, size;
    ring_ctl *txc, *rxc;
    uint8_t *tx, *rx;
} fz_seg;

/* Maps the segment R offered (its name field from R's acceptance) as kolo__shm_open does: its
 * size from the file, two control blocks and rings of a power of two, R's token checked; rings of
 * `ring` bytes unless KOLO_FUZZ_ANY_RING is set. The rings of a fresh segment are zeroes. */
static inline void fz_take_segment(fz_seg *sg, const uint8_t *name_field, uint32_t ch, size_t ring)
{
    char name[W_NAME + 1];
    memcpy(name, name_field, W_NAME);
    name[W_NAME] = '\0';
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) fail("channel %u: R offered segment '%s', which does not open: %s", ch, name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) fail("fstat: %s", strerror(errno));
    sg->maplen = (size_t)sb.st_size;
    sg->size = sg->maplen / 2 - sizeof(ring_ctl);
    if (sg->size != ring && !getenv("KOLO_FUZZ_ANY_RING"))
        fail("channel %u: R's rings are %zu bytes, not the %zu asked for", ch, sg->size, ring);
    if ((sg->size & (sg->size - 1)) || 2 * (sizeof(ring_ctl) + sg->size) != sg->maplen)
        fail("channel %u: R's segment is %zu bytes, not two control blocks and rings of a power of two", ch,
             sg->maplen);
    sg->base = mmap(NULL, sg->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sg->base == MAP_FAILED) fail("mmap: %s", strerror(errno));
    sg->txc = (ring_ctl *)(void *)sg->base;
    sg->tx = sg->base + sizeof(ring_ctl);
    sg->rxc = (ring_ctl *)(void *)(sg->tx + sg->size);
    sg->rx = (uint8_t *)sg->rxc + sizeof(ring_ctl);
    const char *dash = strrchr(name, '-');
    if (!dash || sg->txc->token != strtoull(dash + 1, NULL, 16))
        fail("channel %u: segment %s does not hold the token its name carries", ch, name);
    for (size_t i = 0; i < sg->size; i++)
        if (sg->rx[i] || sg->tx[i]) fail("channel %u: a fresh segment's rings are not zero", ch);
}

static inline uint64_t pad(uint64_t v) { return (v + R_LINE - 1) & ~(uint64_t)(R_LINE - 1); }

/* The doorbell of a ring's control block, bumped and woken whether the other side sleeps or not:
 * R sleeps on ring 1's, for bytes and for room (shm.c, "Sleeping"). */
static inline void fz_bell(ring_ctl *ctl)
{
    atomic_fetch_add(&ctl->bell, 1);
    syscall(SYS_futex, &ctl->bell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* R failed its connection on mesh m with st and msg: it marked ring 0 (txc) aborted with its
 * message (the first 383 bytes) as the reason, and shut its end of the sentinel fd (-1: the
 * harness reset it); the failed mesh refuses the next call at once, alike. */
static inline void fz_check_told(ring_ctl *txc, int fd, kolo__mesh *m, int st, const char *msg)
{
    if (atomic_load(&txc->closed) != R_ABORTED)
        fail("R failed but ring 0's closed word reads %u, not ABORTED", atomic_load(&txc->closed));
    size_t want = KOLO_MIN(strlen(msg), (size_t)F_REASON_MAX - 1);
    if (memchr(txc->reason, 0, F_REASON_MAX) != txc->reason + want || memcmp(txc->reason, msg, want) != 0)
        fail("R's ring gives the reason '%.*s', not its message", F_REASON_MAX, txc->reason);
    uint8_t b;
    if (fd >= 0) {
        int r = read_full(fd, &b, 1, ANSWER_S);
        if (r != RD_EOF) fail("R %s on the sentinel after failing", r == RD_OK ? "sent a byte" : "left it open");
    }
    kolo__xfer x;
    kolo__irecv(m, 1, &b, 1, &x);
    int again = kolo__wait1(m, &x);
    if (again != st || strcmp(kolo__errmsg(), msg) != 0)
        fail("the failed mesh's next call ended with %s: '%s'", kolo_strerror(again), kolo__errmsg());
}

/* n bytes between a ring of `size` bytes at stream position pos (wrapping) and flat memory:
 * into the ring (to_ring) or out of it. */
static inline void ring_copy(uint8_t *ring, size_t size, uint64_t pos, void *flat, size_t n, bool to_ring)
{
    uint8_t *f = flat;
    for (size_t k = 0; k < n;) {
        size_t off = (size_t)((pos + k) & (size - 1)), m = KOLO_MIN(n - k, size - off);
        if (to_ring) memcpy(ring + off, f + k, m);
        else memcpy(f + k, ring + off, m);
        k += m;
    }
}
#endif

#endif
