/* internal.h - the engine's private types, shared by its files:
 *   request.c    the public submission API, request handles, completion
 *   engine.c     the thread, its cycle, lifecycle, process-set activation, the world step
 *   negotiate.c  one process set's negotiation: blobs, message table, response cache, stalls
 *   execute.c    running a cycle's responses: fusion, the collectives, copying results out
 *   hmap.c       an intrusive string hash map
 * Ownership and lock order are described at the top of engine.c. */
#ifndef KOLO_ENGINE_INTERNAL_H
#define KOLO_ENGINE_INTERNAL_H

#include "../core/world.h"
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- request kinds (the wire values) ---- */
enum {
    KOLO__ALLREDUCE = 0,
    KOLO__ALLGATHER,
    KOLO__BROADCAST,
    KOLO__ALLTOALL,
    KOLO__REDUCESCATTER,
    KOLO__JOIN,
    KOLO__BARRIER,
    KOLO__KIND_COUNT
};
extern const char *const kolo__kind_lower[KOLO__KIND_COUNT]; /* "allreduce" */
extern const char *const kolo__kind_upper[KOLO__KIND_COUNT]; /* "ALLREDUCE" */
/* The timeline's name of an operation: kolo__kind_upper, but "ADASUM" for an allreduce with that
 * op (Horovod's request type). */
const char *kolo__op_upper(int kind, int op);

/* ---- intrusive string hash map ----
 * Objects embed a kolo__hnode; the key string is owned by the object. `tag` is part of the key
 * (the process set of an in-flight name). Lookups never allocate; put grows the bucket array
 * when it can and otherwise just makes chains longer, so it cannot fail once created. */
typedef struct kolo__hnode {
    struct kolo__hnode *next;
    uint64_t hash;
    const char *key;
    int tag;
} kolo__hnode;
typedef struct kolo__hmap {
    kolo__hnode **b;
    size_t nb, count;
} kolo__hmap;
uint64_t kolo__hash(const char *s, int tag);
int kolo__hmap_init(kolo__hmap *m, size_t nb);
void kolo__hmap_free(kolo__hmap *m);
kolo__hnode *kolo__hmap_get(const kolo__hmap *m, const char *key, int tag, uint64_t hash);
void kolo__hmap_put(kolo__hmap *m, kolo__hnode *n, const char *key, int tag, uint64_t hash);
void kolo__hmap_del(kolo__hmap *m, kolo__hnode *n);

#define KOLO__CONTAINER(ptr, type, field) ((type *)(void *)((char *)(ptr)-offsetof(type, field)))

/* ---- what a rank says about one request (the wire record and the cache key) ---- */
#define KOLO__DEVICE_MAX 16
typedef struct kolo__desc {
    uint8_t kind, dtype, op, ndim;
    int32_t root;
    double pre, post;
    int64_t dims[KOLO_MAX_DIMS];
    char device[KOLO__DEVICE_MAX];
} kolo__desc;

/* elements of the whole tensor, and of one row (dims[1..]) */
size_t kolo__desc_count(const kolo__desc *d);
size_t kolo__desc_row(const kolo__desc *d);
/* "[2, 3]" into buf */
const char *kolo__shape_str(const int64_t *dims, int ndim, char *buf, size_t cap);

/* ---- a request (the public handle) ---- */
typedef struct kolo__rgroup kolo__rgroup;

enum { KOLO__L_NEW = 0, KOLO__L_CACHED, KOLO__L_NEEDDESC, KOLO__L_SENT };

struct kolo_request {
    kolo__hnode dup; /* the in-flight name table (engine lock) */
    kolo__hnode loc; /* the set's local name map (engine thread) */
    char *name;
    int pset;
    kolo__desc d;
    const void *send;
    void *recv;
    int64_t *splits; /* alltoall: rows to each rank of the set (nsplits = set size) */
    int nsplits;
    kolo_callback_t cb;
    void *user;
    kolo__rgroup *group; /* grouped allreduce: completes with its group */

    /* result: written by the engine thread before `done` is published (release) */
    int status;
    char *err;
    void *out;               /* allgather/alltoall/reducescatter output, owned by the request */
    size_t out_bytes;        /* its size (kolo__out_alloc) */
    kolo_shape_t out_shape;
    int64_t *out_splits;     /* alltoall: rows received from each rank */
    int n_out_splits;
    int last_joined;
    _Atomic int ready;       /* results readable (set before the callback runs) */
    _Atomic int done;        /* completed, callback run (what test and wait see) */
    _Atomic int refs;        /* the user's and the engine's */
    int waiters;             /* threads in kolo_request_wait on it (done_lock) */

    /* engine thread only */
    kolo_request_t *qnext;          /* submission queue (engine lock) */
    kolo_request_t *lnext, *lprev;  /* the set's local pending list */
    int lstate;                     /* KOLO__L_* */
    int slot;                       /* cache slot while KOLO__L_CACHED */
    int stashed;                    /* grouped: finished, waiting for its group */
};

struct kolo__rgroup {
    int remaining;
    int n;
    kolo_request_t *members[];
};

/* ---- the response cache (identical on every member of a set) ---- */
typedef struct kolo__slot {
    kolo__hnode node;
    char *name;
    int valid;
    kolo__desc d;
    int64_t *per_rank;      /* allgather: dim0 of each rank; alltoall: n x n splits */
    uint64_t lru;
    double partial_since;   /* some ranks have set the bit since (local clock), or 0 */
    double stall_logged;    /* when the stall warning last named it */
    int stall_fail;         /* KOLO__STALL_* */
    int negotiating;        /* timeline: NEGOTIATE span open */
    uint64_t seen_mask;     /* timeline: ranks (< 64) already ticked */
} kolo__slot;

/* ---- the message table: names negotiated through descriptions (identical on every member) ---- */
typedef struct kolo__entry {
    kolo__hnode node;
    char *name;
    struct kolo__entry *next, *prev;
    double first_seen;      /* local clock */
    int nrep;
    uint8_t *rep;           /* [n] this rank has reported */
    kolo__desc *descs;      /* [n] */
    int64_t *splits;        /* alltoall: [n * n] */
    int64_t *per_rank;      /* allgather: dim0 of each rank, once ready */
    int kind, op;           /* of the first report (timeline) */
    int negotiating;        /* timeline: NEGOTIATE span open */
    double stall_logged;    /* when the stall warning last named it */
    int stall_fail;         /* KOLO__STALL_* */
} kolo__entry;

/* A stall error's way: the coordinator decides it, sends it in its next blob, and every member
 * applies it when it reads that blob. */
enum { KOLO__STALL_NONE = 0, KOLO__STALL_DECIDED, KOLO__STALL_SENT, KOLO__STALL_APPLY };

/* ---- one response of a cycle (same list on every member) ---- */
typedef struct kolo__resp {
    const char *name;
    kolo__desc d;               /* canonical description */
    const int64_t *per_rank;    /* as kolo__slot.per_rank; valid during the cycle */
    kolo_request_t *req;        /* this rank's request, or NULL (joined, or did not report) */
    int status;                 /* KOLO_OK, or the error every reporter gets */
    char *err;                  /* message for status != OK (owned) */
    int slot;                   /* from the cache, or -1 */
    kolo__entry *e;             /* from the message table, or NULL */
    size_t count, bytes;        /* allreduce: elements and bytes of the whole tensor */
    int done;                   /* executed (fusion bookkeeping) */
    int traced;                 /* timeline: op span open */
    size_t off;                 /* fused allgather: bytes of the output written so far */
} kolo__resp;

/* ---- one process set's negotiation state (engine thread only) ---- */
typedef struct kolo__pset_state {
    int id;
    kolo__group g;              /* own copy of the set (the core's table may change under us) */
    int n, me;
    /* local requests of this rank, in submission order */
    kolo_request_t *lhead, *ltail;
    size_t nlocal;
    kolo__hmap lmap;
    kolo_request_t *join_req;
    /* response cache */
    int cap, words;
    kolo__slot *slots;
    kolo__hmap cmap;
    uint64_t clock;
    kolo_request_t **slot_req;  /* this cycle: local request that set each bit */
    uint64_t *erased, *partial_prev, *and_bits, *any_bits;
    /* message table */
    kolo__entry *ehead, *etail;
    kolo__hmap emap;
    size_t nentries;
    /* join */
    uint8_t *joined;
    uint8_t *has, *miss; /* a cycle's scratch, a byte per member each (in joined's allocation) */
    int njoined, last_joined;
    /* the cycle's exchange */
    size_t fixed_len;
    unsigned char *fix_mine, *fix_all;
    unsigned char *var_mine, *var_all;
    size_t var_cap, var_all_cap, var_len;
    size_t *counts;
    kolo_request_t **sent;
    size_t nsent, sent_cap;
    /* responses */
    kolo__resp *resp;
    size_t nresp, resp_cap;
    /* stall inspector */
    double last_stall_check, last_stall_warn;
    int had_stall;
} kolo__pset_state;

/* fixed part of a member's blob: header, presence bitmap (world only), cache bits */
/* World only: BUSY, this rank holds requests (engine.c, "Cycle timing") */
enum { KOLO__F_JOINED = 1, KOLO__F_LEAVING = 2, KOLO__F_BUSY = 4 };
typedef struct kolo__fixed_hdr {
    uint32_t flags;
    uint32_t varlen;
    /* world, with KOLO_AUTOTUNE: rank 0's engine values, which every rank applies (autotune.c) */
    uint64_t tune_fusion;
    uint32_t tune_cycle_us;
    uint32_t tune_state; /* kolo__tune_word() */
    uint64_t present[KOLO_MAX_PSETS / 64];
    /* world: the process sets (not the world) in which this rank holds requests, and those of
     * them while a thread of it waits (engine.c, "Cycle timing") */
    uint64_t holds[KOLO_MAX_PSETS / 64];
    uint64_t waits[KOLO_MAX_PSETS / 64];
} kolo__fixed_hdr;

/* ---- the engine (one per process) ---- */
typedef struct kolo__stats_atomic {
    _Atomic uint64_t cycles, requests, cache_hits, cache_misses, cache_evictions, fused_collectives,
        collectives, stall_warnings, negotiations, negotiation_ns, negotiation_local_ns;
} kolo__stats_atomic;

typedef struct kolo__engine {
    /* shared with user threads, under `lock` */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    kolo_request_t *qhead, *qtail;
    kolo__hmap inflight;
    int running;        /* between start and the end of stop */
    int stop;           /* stop requested */
    int down;           /* the engine stopped working (a job error, or a rank left) */
    int down_status;
    char down_msg[768];
    /* unnamed requests are numbered per process set: a barrier that only the members of one set
     * run must not shift the world's next unnamed barrier */
    uint64_t noname[KOLO_MAX_PSETS][KOLO__KIND_COUNT];
    int blocked;        /* threads blocked in kolo_request_wait: cycles do not wait (engine.c) */
    bool doze;          /* cycles while no thread is blocked doze (KOLO_SPIN_US unset; engine.c) */
    uint64_t spin_ns;   /* with doze: the mesh's spin in the other cycles */
    uint64_t blocked_since; /* when `blocked` last became nonzero */

    /* engine thread only */
    pthread_t thread;
    kolo__mesh *mesh;
    int rank, size;
    double cycle_s;
    size_t fusion;          /* agreed at start (rank 0's) */
    int capacity;           /* agreed at start (rank 0's) */
    double stall_check, stall_shutdown;
    int stall_disable;
    int leave_grace_s; /* kolo__engine_stop's wait for the goodbye (LEAVE_GRACE_S, more on crowded cores) */
    int autotune;           /* KOLO_AUTOTUNE_* at start, agreed (rank 0's); not OFF: apply rank 0's values */
    int tune_state, tune_samples; /* KOLO_AUTOTUNE_*, configurations scored (rank 0's) */
    int world_busy;         /* last world step: some rank had work */
    _Atomic int quiet_cycles; /* cycles in a row in which this rank could hold back its period
                               * (it held nothing, nor did any rank in a set that leaves it out:
                               * engine.c, "Cycle timing") */
    /* for the tests: world exchanges; those that showed a set leaving this rank out holding
     * requests ("needed"), and the cycles after such a one that waited out the period */
    _Atomic uint64_t world_cycles, needed_cycles, needed_timed, set_steps;
    int used;               /* some rank has had requests since start */
    uint64_t t_last;        /* start of the last cycle (ns) */
    kolo__pset_state *sets[KOLO_MAX_PSETS];
    /* the core's table as last seen, to notice added, removed and replaced sets */
    const kolo__group *seen_ptr[KOLO_MAX_PSETS];
    kolo__group seen[KOLO_MAX_PSETS];
    uint64_t present[KOLO_MAX_PSETS / 64];
    uint64_t holds[KOLO_MAX_PSETS / 64], waits[KOLO_MAX_PSETS / 64]; /* this cycle's, for kolo__fixed_hdr */
    bool hurry;   /* last world step: a thread waits on a set's requests, and this rank is not in it */
    bool needed;  /* last world step: a set that leaves this rank out holds requests */
    int cycle_blocked; /* `blocked` when this cycle started */
    kolo_request_t *waiting[KOLO_MAX_PSETS]; /* submitted on a set not active yet */
    /* execution scratch */
    void *fbuf;
    size_t fbuf_cap;
    bool fbuf_shared; /* from kolo_mem_alloc (fusion_buffer in execute.c) */
    void *zbuf;
    size_t zbuf_cap;
    size_t *cnt_a, *cnt_b;
    int cnt_cap;
    size_t *bidx;
    size_t bidx_cap;
    kolo_request_t **done_reqs; /* [bidx_cap]: a collective's requests, completed together */
    int local_pending;      /* requests this rank holds in any set (or waiting for one) */

    kolo__stats_atomic st;
    /* kolo_status_json (engine.c, "Status"): requests for the sets' pending tables, asked by
     * user threads and served by the engine thread between cycles (under `lock`, status_cv),
     * and what the engine thread is doing, for when it cannot answer: act_phase (KOLO__ACT_*),
     * act_set, act_since (atomics), and under act_lock the collective it runs, act_name, fused
     * with act_more others */
    uint64_t status_asked, status_served;
    char *status_text;
    _Atomic int act_phase, act_set;
    _Atomic uint64_t act_since;
    pthread_mutex_t act_lock;
    char act_name[128];
    size_t act_more;
    /* kolo_engine_params: the values in use, for user threads */
    _Atomic uint64_t pub_fusion, pub_cycle_ns;
    _Atomic uint32_t pub_state;
} kolo__engine;

extern kolo__engine kolo__E;

enum { KOLO__ACT_IDLE = 0, KOLO__ACT_EXCHANGE, KOLO__ACT_RUN };
/* engine.c: the engine thread runs the collective of set `set` named `name`, fused with `more`
 * other requests (kolo_status_json) */
void kolo__engine_act_run(int set, const char *name, size_t more);

/* Below: called on the engine thread only. */

/* request.c: completion (removes the name from the in-flight table, publishes, runs the
 * callback, drops the engine's reference). msg may be NULL for success. */
void kolo__req_complete(kolo_request_t *r, int status, const char *msg);
/* The n requests one collective completed, all successful: their waiters see them done at once
 * (one wake-up). Takes over the array's contents. */
void kolo__req_complete_ok(kolo_request_t **rs, size_t n);
void kolo__req_unref(kolo_request_t *r);
/* What is wrong with description d of a set of n ranks (id pset) and its alltoall splits (n
 * int64 as bytes, or NULL), written into buf, or NULL: checked at submission and on every
 * member's description in a negotiation (request.c). */
const char *kolo__desc_problem(const kolo__desc *d, const void *splits, int n, int pset, char *buf, size_t cap);
/* Outputs the engine allocates for a request (allgather, alltoall, reducescatter), from blocks
 * kept from call to call (request.c): *bytes in, the block's size (as large or larger) out;
 * kolo__out_clear frees the idle ones (kolo_shutdown). */
void *kolo__out_alloc(size_t *bytes);
void kolo__out_clear(void);

/* negotiate.c */
/* The set's names some members have submitted and others not yet, as a JSON object's members
 * ("pending": [...], ...) appended to b, from the engine thread (kolo_status_json). */
void kolo__negotiate_status(const kolo__pset_state *s, kolo__sbuf *b);
kolo__pset_state *kolo__pset_new(int id, const kolo__group *g, int me, int capacity);
void kolo__pset_free(kolo__pset_state *s);
void kolo__pset_add_local(kolo__pset_state *s, kolo_request_t *r);
/* Fails and removes every local request of the set (and its join). */
void kolo__pset_fail_all(kolo__pset_state *s, int status, const char *msg);
/* Builds this member's blob. world: fill the control fields with `flags` and `present`. */
int kolo__negotiate_build(kolo__pset_state *s, uint32_t flags, const uint64_t *present);
/* Exchanges the fixed parts (one allgather). */
int kolo__negotiate_gather_fixed(kolo__pset_state *s);
/* Exchanges the variable parts when any member has one; decides the responses. */
int kolo__negotiate_decide(kolo__pset_state *s);
/* After execution: cache updates, frees finished entries and responses. */
int kolo__negotiate_finish(kolo__pset_state *s);
/* Completes this rank's request r of the set (removing it from the set's lists). */
void kolo__pset_complete(kolo__pset_state *s, kolo_request_t *r, int status, const char *msg);
/* The same for the n successful requests of one collective, published together */
void kolo__pset_complete_ok(kolo__pset_state *s, kolo_request_t **rs, size_t n);
/* Stall inspector (every rank logs; the coordinator decides stall errors). */
void kolo__negotiate_stall_check(kolo__pset_state *s);
static inline const kolo__fixed_hdr *kolo__fixed_of(const kolo__pset_state *s, int r)
{
    return (const kolo__fixed_hdr *)(const void *)(s->fix_all + s->fixed_len * (size_t)r);
}
/* Member r's cache bits (s->words words), after its header in the gathered fixed parts. */
static inline const uint64_t *kolo__cache_bits_of(const kolo__pset_state *s, int r)
{
    return (const uint64_t *)(const void *)(s->fix_all + s->fixed_len * (size_t)r + sizeof(kolo__fixed_hdr));
}

/* execute.c: runs s->resp[0 .. nresp) in order; completes this rank's requests. A returned
 * error is a job error (the mesh is failed). */
int kolo__execute(kolo__pset_state *s);
void kolo__execute_free(void);

/* autotune.c: Bayesian optimisation of a score over [0, 1]^dim (dim 1 or 2), and the tuner */
#define KOLO__BO_MAX 64
typedef struct kolo__bo {
    int dim, n;
    double noise;             /* added to the diagonal, in units of the scores' variance */
    double x[KOLO__BO_MAX][2];
    double y[KOLO__BO_MAX];
    uint64_t rng;
} kolo__bo;
void kolo__bo_init(kolo__bo *b, int dim, double noise, uint64_t seed);
int kolo__bo_add(kolo__bo *b, const double *x, double y);
/* The next point to sample: the candidate of most expected improvement. */
void kolo__bo_next(kolo__bo *b, double *x);
/* The sample with the best posterior mean, or -1 with none. */
int kolo__bo_best(const kolo__bo *b);
/* After the engine's settings are agreed: rank 0 sets up tuning (E.autotune). */
void kolo__tune_start(void);
void kolo__tune_stop(void);
/* Rank 0, tuning: a response this rank executed successfully. */
void kolo__tune_observe(int pset, const kolo__resp *rp);
/* Rank 0, tuning: after each cycle, moves to the next configuration when a sample ended. */
void kolo__tune_after_cycle(void);
/* Every rank, E.autotune: the values of rank 0's world header, applied in the same cycle.
 * KOLO_ERR_PROTOCOL, naming rank 0, for values no kolo sends (a garbled header). */
int kolo__tune_apply(uint64_t fusion, uint32_t cycle_us, uint32_t state);
/* Tests (kolo__engine_test_garble): true, once, when the garbling asked for is `how`. */
bool kolo__engine_garble_take(int how);
uint32_t kolo__tune_word(void);

/* engine.c: a job error found on the engine thread */
void kolo__engine_fail_mesh(int status);
/* engine.c: a user thread blocks on a request (+1) or stops (-1); while any does, the engine
 * does not wait out the cycle time (any thread) */
void kolo__engine_waiting(int delta);

#endif
