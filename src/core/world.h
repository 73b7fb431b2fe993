/* world.h - the process-wide state behind the public API, shared with the engine. */
#ifndef KOLO_WORLD_H
#define KOLO_WORLD_H

#include "../boot/env.h"
#include "../boot/store.h"
#include "../coll/coll.h"

#include <pthread.h>
#include <stdatomic.h>

#define KOLO_MAX_PSETS 256

typedef struct kolo__world {
    int initialized;
    kolo__world_info info;
    int local_rank, local_size, cross_rank, cross_size;
    kolo__mesh *mesh[KOLO_NCHANNELS];
    kolo__peer_info *peers;
    int *host_of; /* [size]: each rank's host, numbered in order of each host's lowest rank; NULL on one host */
    uint8_t *host_flags; /* [KOLO_NCHANNELS][hosts]: KOLO_HOST_* agreed at init; NULL on one host */
    int hosts;
    kolo__store_server *server; /* when this rank serves the rendezvous store */
    /* Serializes direct collectives of user threads on channel 0. Lock order: direct_lock,
     * then pset_lock. */
    pthread_mutex_t direct_lock;
    /* The direct collective running now (its function's name, a static string; its process
     * set; since when, 0 none), for kolo_status_json on other threads. */
    _Atomic(const char *) direct_fn;
    _Atomic int direct_pset;
    _Atomic uint64_t direct_since;
    /* ... and once past its checks (kolo.c, begin): its number among this rank's direct
     * collectives on that set, counted from 1 (0 until then), its call tag, a broadcast's root
     * and its element count, for the stall warning and the status (kolo__direct_call) */
    _Atomic uint64_t direct_number;
    _Atomic unsigned direct_tag;
    _Atomic int direct_root;
    _Atomic size_t direct_count;
    /* Guards the process-set table (the engine thread reads it). */
    pthread_mutex_t pset_lock;
    kolo__group *psets[KOLO_MAX_PSETS]; /* [0] is the world; NULL: free id */
    int next_pset;
    /* elastic jobs (elastic.c); kept across kolo_shutdown/kolo_init */
    int elastic;       /* this init joined an elastic round */
    int elastic_id;    /* KOLO_ELASTIC_ID */
    int elastic_round; /* the round joined last, 0 none */
    int elastic_asked; /* the round this worker last asked kolorun for */
    kolo__store *estore; /* connection to kolorun's store while elastic */
} kolo__world;

extern kolo__world kolo__W;

/* The group of a process set id, or NULL (message set) when the id is unknown. Caller holds
 * pset_lock or is the only thread touching the table. */
kolo__group *kolo__pset_get(int id);

/* elastic.c: kolo_init's part in elastic jobs. join places W.info in the newest round (after
 * kolo__env_detect); started records that this worker runs it; retry says whether a failed
 * start should wait for the next round; close drops the store connection. */
int kolo__elastic_join(void);
void kolo__elastic_started(void);
bool kolo__elastic_retry(int status);
void kolo__elastic_close(void);
/* A collective on m failed: where that failed m's connections (the round is over for this
 * worker), asks kolorun for the next round now, once a round; nothing outside an elastic round.
 * From the thread that owns m (a collective's, or the engine's with its own mesh). */
void kolo__elastic_ask(const kolo__mesh *m);

/* kolo.c: the direct collective a user thread runs now, as another thread reads it: its
 * function's name (NULL outside one), process set and start; once it has passed its checks, its
 * number on its process set (0 before), element count and call as text ("kolo_broadcast (float32,
 * root 1)"). kolo__direct_call fills it and returns fn. */
typedef struct kolo__direct_now {
    const char *fn;
    int pset;
    uint64_t since, number;
    size_t count;
    char what[96];
} kolo__direct_now;
const char *kolo__direct_call(kolo__direct_now *d);

/* kolo.c: in a child forked after kolo_init (kolo_init's pthread_atfork handler), sets the error
 * "fn: this process was forked ..." and returns KOLO_ERR_NOT_INITIALIZED; elsewhere KOLO_OK. The
 * child holds a copy of the job's state and none of its threads: the functions that would talk
 * to the peers or wait for the engine call this first. */
extern bool kolo__forked;
int kolo__forked_refuse(const char *fn);

/* status.c: KOLO_STATUS_SIGNAL's handler and thread, started at the end of kolo_init (an
 * unknown signal name fails it) and stopped first in kolo_shutdown; lock_out(true) waits for
 * kolo_status_json's readers and keeps new ones out until lock_out(false) (kolo_shutdown's
 * teardown). */
int kolo__status_start(void);
void kolo__status_stop(void);
void kolo__status_lock_out(bool on);

#endif
