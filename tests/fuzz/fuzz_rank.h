/* fuzz_rank.h - the real rank of the harnesses that start one through the mesh (fuzz_mesh.c,
 * fuzz_frames.c, fuzz_shm.c): a fresh store on 127.0.0.1, the rank's identity, its start-up on a
 * thread, and the proofs of the mesh's handshake as the other ranks make them.
 *
 * The includer has kolo__mesh_build in reach (mesh.c, or an object that links it), includes
 * fuzz_net.h, and defines, before including this: SECRET and JOB (strings), NCH (the channels),
 * ANSWER_S, and fail() as fuzz_net.h asks. */
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

#endif
