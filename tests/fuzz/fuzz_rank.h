/* fuzz_rank.h - the real rank of the harnesses that start one through the mesh (fuzz_mesh.c,
 * fuzz_frames.c, fuzz_shm.c): a fresh store on 127.0.0.1, the rank's identity, its start-up on a
 * thread, and the proofs of the mesh's handshake as the other ranks make them.
 *
 * The includer has kolo__mesh_build in reach (mesh.c, or an object that links it) and defines,
 * before including this: SECRET and JOB (strings), NCH (the channels), ANSWER_S, and fail() as
 * fuzz_net.h asks. */
#ifndef KOLO_FUZZ_RANK_H
#define KOLO_FUZZ_RANK_H

#include <pthread.h>
#include <stdatomic.h>

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

#endif
