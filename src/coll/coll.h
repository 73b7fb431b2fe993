/* coll.h - the collective algorithms. They see ranks (a group of world ranks) and the mesh's
 * non-blocking point-to-point calls, never sockets or shared memory.
 *
 * Every function here is blocking for the calling thread, runs on one mesh (one thread at a
 * time per mesh), validates nothing the public API already validated, and returns a status with
 * kolo__err's message set. Counts are elements; `es` is the element size where no dtype is needed.
 * All members of the group must call the same function with matching arguments in the same order.
 */
#ifndef KOLO_COLL_H
#define KOLO_COLL_H

#include "../net/transport.h"

#include <assert.h>

typedef struct kolo__hosts kolo__hosts;
typedef struct kolo__group {
    int size;    /* members */
    int rank;    /* this process's index in ranks[], or -1 when not a member */
    int *ranks;  /* world ranks, strictly increasing */
    /* how the members lie over the hosts, made once with the group (kolo__group_hosts_make); NULL
     * where they are on one host */
    const kolo__hosts *hosts;
    /* the direct collectives this rank started on the group (core/kolo.c, under its direct lock):
     * the stall warning and the status number each call, so that ranks can be compared */
    uint64_t direct_calls;
} kolo__group;

/* World rank of group member i. */
static inline int kolo__g2w(const kolo__group *g, int i) { return g->ranks[i]; }

/* How count elements split into n blocks, as every algorithm that gives each member a block
 * splits them (the ring, direct reads, the hierarchical stages, kolo_reducescatter_rows):
 * count / n each, one more for each of the first count % n. Block i's length, and where it
 * starts when start is not NULL. */
static inline size_t kolo__coll_block(size_t count, int n, int i, size_t *start)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n;
    if (start) *start = (size_t)i * base + KOLO_MIN((size_t)i, extra);
    return base + ((size_t)i < extra);
}

/* Per-member bookkeeping (block offsets and lengths, transfers) lives on the stack up to
 * KOLO_STACK_MEMBERS members and on the heap beyond: an allocation is nothing beside a collective
 * among more ranks, and no member count is refused. kolo__coll_members gives `n` elements of
 * `size` bytes, the stack array `own` where they fit; release with kolo__coll_members_free. */
#define KOLO_STACK_MEMBERS 64
static inline void *kolo__coll_members(void *own, int n, size_t size)
{
    if (n <= KOLO_STACK_MEMBERS) return own;
    void *p = kolo__malloc((size_t)n * size);
    if (!p) kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the bookkeeping of %d members", n);
    return p;
}
static inline void kolo__coll_members_free(void *p, void *own)
{
    if (p != own) kolo__free(p);
}

/* All n blocks: lengths into cnt, starts into off (when not NULL). */
static inline void kolo__coll_blocks(size_t count, int n, size_t *off, size_t *cnt)
{
    for (int i = 0; i < n; i++) cnt[i] = kolo__coll_block(count, n, i, off ? &off[i] : NULL);
}

/* What the algorithms that read or write a peer's buffers, or that a crowded host favours,
 * need to know of g's pairs: KOLO_HOST_* (transport.h). Of every pair of the world where the
 * world says so (kolo__mesh.world_shm, _single, _oversubscribed); of its host's pairs where g
 * lies on one host of a job on several (host_flags); else none. Agreed at init, the same on
 * every member. Only the world's on one host: no walk over the members. */
static inline unsigned kolo__coll_group_flags(const kolo__mesh *m, const kolo__group *g)
{
    unsigned f = (m->world_shm ? KOLO_HOST_SHM : 0u) | (m->world_single ? KOLO_HOST_SINGLE : 0u) |
                 (m->world_cma ? KOLO_HOST_CMA : 0u) | (m->world_oversubscribed ? KOLO_HOST_CROWDED : 0u);
    if (!m->host_of || !m->host_flags || (f & KOLO_HOST_SINGLE)) return f;
    int h = m->host_of[kolo__g2w(g, 0)];
    for (int i = 1; i < g->size; i++)
        if (m->host_of[kolo__g2w(g, i)] != h) return f;
    return m->host_flags[h];
}

/* Where a collective may read or write its members' buffers itself (the allgather's push, the
 * direct reducescatter): every pair of g reads single-copy, and beyond 2 members only on a host
 * with more ranks than cores (where it was measured: allgather.c, allreduce.c). */
static inline bool kolo__coll_single_copy_group(const kolo__mesh *m, const kolo__group *g)
{
    unsigned f = kolo__coll_group_flags(m, g);
    return (f & KOLO_HOST_SINGLE) && (g->size == 2 || (f & KOLO_HOST_CROWDED));
}

/* Every pair of g shares memory on a host with more ranks than cores: the exchanges' home. */
static inline bool kolo__coll_shm_crowded(const kolo__mesh *m, const kolo__group *g)
{
    unsigned want = KOLO_HOST_SHM | KOLO_HOST_CROWDED;
    return (kolo__coll_group_flags(m, g) & want) == want;
}

/* Whether small collectives on n members go by recursive doubling instead of a one-round
 * exchange: n a power of two, and some pair of the job runs over TCP on a host with more ranks
 * than cores, where each of the exchange's n-1 sends runs the receiver's TCP stack in the
 * sender's time slice while the ranks take turns on the cores (allreduce.c, allgather.c have
 * the measurements). The flags are the world's, agreed at init, so every member decides alike;
 * a process set whose own pairs all share memory follows them too. */
static inline bool kolo__coll_doubling_world(const kolo__mesh *m, int n)
{
    return m->world_oversubscribed && !m->world_shm && (n & (n - 1)) == 0;
}

/* recv = post * OP_r(pre * send_r); AVERAGE divides by the group size. send may equal recv. */
int kolo__coll_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                         kolo_dtype_t dtype, kolo_op_t op, double pre, double post);

/* recv = concatenation of each member's counts[i] elements, in member order. send may already
 * be in place at its offset in recv. */
int kolo__coll_allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                         const size_t *counts, size_t es);

/* The same by Bruck's algorithm at any size and member count: each member exchanges with
 * ceil(log2 n) others, not all of them. For the ranks' agreement at init (core/kolo.c): a pair's
 * shared-memory rings are filled in at their first use, and a one-round exchange at init used
 * every pair of the direct channel, which most jobs (the engine's, on its own channel) never use
 * again. */
int kolo__coll_allgather_few_peers(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                                   const size_t *counts, size_t es);

/* root (a member index) sends bytes to everyone. */
int kolo__coll_broadcast(kolo__mesh *m, const kolo__group *g, void *buf, size_t bytes, int root);

/* member i receives sendcounts[i] elements from here; here receives recvcounts[i] from i. */
int kolo__coll_alltoall(kolo__mesh *m, const kolo__group *g, const void *send, const size_t *sendcounts,
                        void *recv, const size_t *recvcounts, size_t es);

/* recv = this member's block (counts[rank] elements at the prefix-sum offset) of the reduction. */
int kolo__coll_reducescatter(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                             const size_t *counts, kolo_dtype_t dtype, kolo_op_t op, double pre, double post);

int kolo__coll_barrier(kolo__mesh *m, const kolo__group *g);

/* The hierarchical allreduce, allgather and reducescatter (hier.c), which kolo__coll_allreduce,
 * kolo__coll_allgather and kolo__coll_reducescatter try first: KOLO_HIER_DECLINED (on every member
 * alike) where it does not run (the mode, the size, or a group not spread evenly over 2 or more
 * hosts), else the collective's status; how many of each this process ran. The reducescatter
 * follows the allreduce's mode (it is half of one). */
#define KOLO_HIER_DECLINED 1
int kolo__coll_hier_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                              kolo_dtype_t dtype, kolo_op_t op, double pre, double post);
int kolo__coll_hier_allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                              size_t es);
int kolo__coll_hier_reducescatter(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                                  const size_t *counts, kolo_dtype_t dtype, kolo_op_t op, double pre, double post);
uint64_t kolo__coll_hier_runs(void);
uint64_t kolo__coll_hier_ag_runs(void);
uint64_t kolo__coll_hier_rs_runs(void);
void kolo__coll_hier_ran(void); /* counts one, for the engine's over a list (ring_iov.c) */
/* Where an allreduce of `bytes` on g runs hierarchically, its groups: *lg the members on this
 * member's host, *xg those of its local index on every host (both made with g's hosts); false
 * where it does not (as kolo__coll_hier_allreduce declines). */
bool kolo__coll_hier_groups(const kolo__mesh *m, const kolo__group *g, size_t bytes, const kolo__group **lg,
                            const kolo__group **xg);

/* Adasum (adasum.c): ntensor tensors of counts[i] elements lie one after another in send and
 * recv (send may equal recv), each combined as its own vector; floating dtypes only.
 * kolo__coll_allreduce with KOLO_ADASUM runs it for one tensor. */
int kolo__coll_adasum(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                      size_t ntensor, kolo_dtype_t dtype, double pre, double post);
/* Allreduce reading and writing the other members' buffers directly (direct.c), when every
 * member is on this host and the call has 64 KiB or more: mapped when all pass kolo_mem_alloc
 * buffers, else by CMA from 256 KiB when member 0 chooses so. Returns KOLO_DIRECT_DECLINED (on
 * every member alike) when the ring should run (the exchange, where the ticket says so), else the
 * collective's status. After a declined call the caller runs the ring (or the exchange) and
 * then calls kolo__direct_ring_done with the ticket, which times it for the choice. */
#define KOLO_DIRECT_DECLINED 1
typedef struct kolo__direct_ticket {
    uint64_t start, bytes;
    int plan;
    bool learn, in_place;
    bool can_exchange; /* in: 2 members, out of place, below 256 KiB: the caller can run the
                        * one-round exchange instead of the ring, if member 0 chooses it (direct.c,
                        * "the exchange") */
    bool exchange;     /* out, declined: member 0 chose the exchange */
} kolo__direct_ticket;
/* One part of a virtual buffer: count elements read from src, results written to dst (src may
 * equal dst). */
typedef struct kolo__seg {
    const char *src;
    char *dst;
    size_t count;
} kolo__seg;
/* dst = post * OP over members (src) over the concatenation of segs (every member passes
 * segments of the same lengths; one segment for a plain buffer, mapped only then). */
int kolo__direct_allreduce(kolo__mesh *m, const kolo__group *g, const kolo__seg *segs, int nseg, kolo_dtype_t dtype,
                           kolo_op_t op, double post, kolo__direct_ticket *t);
void kolo__direct_ring_done(kolo__mesh *m, const kolo__direct_ticket *t, int status);
/* How many allreduces in this process mapped the others' buffers, and read them by CMA (tests). */
uint64_t kolo__zc_runs(void);
uint64_t kolo__direct_cma_runs(void);
/* How many 2-member allreduces in this process ran the one-round exchange above the small ones
 * (allreduce.c, PAIR_EXCHANGE_BELOW; tests). */
uint64_t kolo__coll_pair_exchange_runs(void);
/* How many broadcasts so far the root sent to every member itself on a host with more ranks
 * than cores (broadcast.c, "spread"), and how many went down the tree read single-copy there
 * (broadcast.c, "tree"), for tests. */
uint64_t kolo__coll_broadcast_spread_runs(void);
uint64_t kolo__coll_broadcast_tree_runs(void);
/* How many broadcast sends this process split, writing half into the receiver (broadcast.c, "split"). */
uint64_t kolo__coll_broadcast_split_runs(void);
/* Test hook: the nth split write from now (1: the next) is refused, as CMA refuses it (EPERM). */
void kolo__coll_broadcast_test_refuse_write(int nth);
/* How many 2-member broadcasts this process rooted by ring copies, choosing them over the split
 * (broadcast.c, "Split or ring copies"); and a test hook: each such call by the split (0) or ring
 * copies (1) takes ns longer on the root. */
uint64_t kolo__coll_broadcast_copies_runs(void);
void kolo__coll_broadcast_test_delay(int way, uint64_t ns);
/* Calls of the world's broadcasts on a crowded host that took the chain by the members' agreed
 * choice (broadcast.c, "Agreed"), and the test hook that slows one way there (0 the spread or
 * tree, 1 the chain) by ns after each call, inside its timing. */
uint64_t kolo__coll_broadcast_crowd_chain_runs(void);
void kolo__coll_broadcast_test_crowd_delay(int way, uint64_t ns);
/* How many allgathers this process ran by writing its block into every other member itself,
 * every write done (allgather.c, "push"); and a test hook: the nth write from now is refused. */
uint64_t kolo__coll_allgather_push_runs(void);
void kolo__coll_allgather_test_refuse_write(int nth);
/* How many reducescatters this process ran direct, reading every other member's share of its
 * block itself (allreduce.c, "Direct"); and a test hook: the nth read from now fails (EFAULT). */
uint64_t kolo__coll_reducescatter_direct_runs(void);
void kolo__coll_reducescatter_test_fail_read(int nth);
/* Test hook: each reducescatter that could go direct and ran by the ring or the exchange (way 0)
 * or direct (1) takes ns longer, on every member. */
void kolo__coll_reducescatter_test_delay(int way, uint64_t ns);
/* How g lies over the hosts (hier.c): made once per group, where the group is made (the world
 * and each process set in core/kolo.c, the engine's copies, the hierarchical stages' groups), from
 * the host of every world rank (host_of, NULL where the world is on one host), and the same on
 * every member. g->hosts stays NULL where the members are on one host; KOLO_ERR_NO_MEMORY where
 * it cannot be made. kolo__group_hosts_free releases it (and leaves g->hosts NULL). */
int kolo__group_hosts_make(kolo__group *g, const int *host_of);
void kolo__group_hosts_free(kolo__group *g);
/* g's members host by host (hosts in the order of their numbers, a host's members in member
 * order; the same list on every member), and how many hosts they are on; NULL and 0 where that
 * is one. */
const int *kolo__coll_host_order(const kolo__group *g, int *hosts);
/* Where an allreduce of count elements of es bytes on g goes by recursive halving across hosts
 * where the three stages do not run (allreduce.c: 4 or more members on 2 or more hosts, from
 * HALVING_MIN): the members host by host (kolo__coll_host_order); else NULL. */
const int *kolo__coll_halving_order(const kolo__group *g, size_t count, size_t es);
/* The schedule of recursive halving and doubling (allreduce.c) for this member of g over count
 * elements, the members in `order`: members beyond the largest power of two p2 first hand their
 * buffer to a neighbour in the order (`handover`, a member index, or -1; `gives`: this one hands
 * over and sits out the rounds), then round k (distance 2^k among the p2) swaps halves with
 * `partner`: this member keeps and combines [keep_lo, keep_hi) (`low`: the lower half, its own
 * part first in each combination), sends [send_lo, send_hi). The doubling runs the rounds
 * backwards, sending the kept range and receiving the sent one. */
#define KOLO_HALVING_ROUNDS 31 /* log2 of the most members a group can have (INT_MAX) */
typedef struct kolo__halving_round {
    int partner;
    bool low;
    size_t keep_lo, keep_hi, send_lo, send_hi;
} kolo__halving_round;
typedef struct kolo__halving_plan {
    int handover, rounds;
    bool gives;
    kolo__halving_round r[KOLO_HALVING_ROUNDS];
} kolo__halving_plan;
void kolo__coll_halving_plan(const kolo__group *g, const int *order, size_t count, kolo__halving_plan *p);
/* How many allreduces in this process ran recursive halving across hosts (allreduce.c; tests). */
uint64_t kolo__coll_halving_runs(void);
void kolo__coll_halving_ran(void); /* counts one, for the engine's over a list (ring_iov.c) */
/* How many mapped allreduces (in place or not) stored their results through the cache, and in
 * how many this member reached every member's buffers through its mappings alone (tests). */
uint64_t kolo__zc_cached_runs(void);
uint64_t kolo__zc_push_runs(void);
/* Test hooks: member 0 plans ring (0) or direct (1) instead of choosing (-1: choose); the nth CMA
 * read (or write) from now on fails with EFAULT (0 disarms), or with `err` (as when the process
 * is gone: ESRCH); each call by the ring (0) or direct (1) takes ns longer. */
void kolo__direct_test_force(int plan);
void kolo__direct_test_fail_read(int nth);
void kolo__direct_test_fail_read_with(int nth, int err);
void kolo__direct_test_fail_write(int nth);
void kolo__direct_test_delay(int plan, uint64_t ns);
/* Test hooks: member 0 plans the ring (0) or the one-round exchange (1) for a call that can take
 * either instead of choosing (-1); each such call by the ring (0) or the exchange (1) takes ns
 * longer. */
void kolo__direct_test_force_exchange(int way);
void kolo__direct_test_delay_exchange(int way, uint64_t ns);
/* Test hooks for mapped allreduces in place: member 0 plans streaming stores (0) or cached ones
 * (1) instead of choosing (-1); each such call with streaming (0) or cached (1) stores takes ns
 * longer. */
void kolo__direct_test_force_store(int mode);
void kolo__direct_test_delay_store(int mode, uint64_t ns);

/* ---- shared by the algorithm files (coll_util.c) ---- */

/* The way (0 or 1) to run the next call of the size class c by; `hint`, the way to start with,
 * or -1 (way 0), and `wait`, whether a hinted start waits out the usual interval before its first
 * probe or probes as early as an unhinted one. Then kolo__choice_learn with the call's way, its
 * start (kolo__now_ns), its bytes, and for the trace log what it was and the ways' names. */
int kolo__choice_pick(kolo__choice *c, uint64_t now, int hint, bool wait);
/* The way c settled on, if it has timed both ways and ran its way within the last few seconds
 * (the longest interval between probes), also while it probes the other; else -1. For a class's
 * first call to start from a neighbouring class's verdict. */
int kolo__choice_verdict(const kolo__choice *c, uint64_t now);
/* A hint that comes after a class's first call (a neighbouring class decided later): a class that
 * started from a waiting hint, or patiently by way 0, and has not yet timed the other way moves to
 * `way` as if it started now with that hint: both ways' figures dropped, its first probe 0.1 s on
 * telling whether the hint holds here. Returns whether it moved. */
bool kolo__choice_late_hint(kolo__choice *c, uint64_t now, int way);
void kolo__choice_learn(kolo__choice *c, int way, uint64_t start, uint64_t bytes, const char *what,
                        const char *const ways[2]);
/* kolo__choice_learn's part after the timing: a call by `way` cost ps per byte, ending at now. */
void kolo__choice_take(kolo__choice *c, int way, uint64_t ps, uint64_t now);
/* Notes that a call of c's class runs by `way` (-1: neither, as the transport picks), and says
 * whether the class's last call ran by the same way: only such a call is timed, not a class's
 * first, nor the first after a change of way, which pays for caches and pages the other way left
 * cold (coll_util.c, "pair", has the traces). */
bool kolo__choice_repeat(kolo__choice *c, int way);
/* The same, as the number of calls in a row by `way` this one makes (1: the first after a change). */
unsigned kolo__choice_run(kolo__choice *c, int way);

/* KOLO_SMALL_ALLREDUCE_MAX: allreduces of at most this many bytes take the small algorithms
 * (allreduce.c; adasum.c likewise). */
size_t kolo__coll_small_max(void);
/* Whether KOLO_SMALL_ALLREDUCE_MAX was set (2-member allreduces then never take the exchange:
 * allreduce.c, PAIR_EXCHANGE_BELOW). */
bool kolo__coll_small_max_set(void);
/* Makes this rank follow rank 0's KOLO_SMALL_ALLREDUCE_MAX (value, and whether set) and
 * KOLO_RING_CHUNK, which cut the ranks' messages and so must be alike (core/kolo.c, at init,
 * before any thread but the caller's runs collectives). */
void kolo__coll_follow(size_t small_max, bool small_set, size_t chunk);
void kolo__coll_follow_small(size_t small_max, bool small_set); /* its allreduce.c half */

/* Rings of m->stream_min bytes or more write their blocks around the cache and fuse their
 * middle steps (ring.c, where the rule is measured). The ranks agree on it at init (core/kolo.c:
 * the smallest of every rank's kolo__stream_min_local), since fusing changes which messages a
 * ring sends; before that, and in a world of one (no mesh), it is KOLO_STREAM_MIN_FLOOR. */
#define KOLO_STREAM_MIN_FLOOR ((size_t)16 << 20)
size_t kolo__stream_min_local(void);
static inline size_t kolo__coll_stream_min(const kolo__mesh *m)
{
    return m && m->stream_min ? m->stream_min : KOLO_STREAM_MIN_FLOOR;
}
/* Results that are computed in cache and then written out to memory (a reduced chunk of the ring,
 * ring.c; a block pushed to every member, direct.c) go a piece of this many bytes at a time:
 * reduce a piece, write it out, reduce the next. A core that first reduces a whole chunk and then
 * writes it out runs a phase of reads alone and then one of writes alone; pieces keep both going
 * at once. Around the cache (non-temporal stores) elements of 4 and 8 bytes take 256 B; through
 * it, 1 KiB, and so do elements of 1 and 2 bytes (float16 and bfloat16, whose kernels go through
 * float32 with a setup per call, gained nothing from 256 B; the small integers were not measured).
 * Measured on a Zen 4 VM (AMD EPYC family 25), 2 ranks: see direct.c ("Pushing") and
 * kolo__coll_reduce_out in coll_util.c. */
#define KOLO_OUT_PIECE_MAX ((size_t)1024)
static inline size_t kolo__out_piece(size_t es, bool cached) { return cached || es < 4 ? KOLO_OUT_PIECE_MAX : 256; }
/* Allgather's exchange and alltoall, which write their output once and never read it back,
 * write it around the cache from this many bytes of output. Against 16 MiB, 2 ranks, 5 launches
 * interleaved (out of place, us): allgather 8 MiB 797-1201 against 956-1521, faster in 5 of 5;
 * alltoall 8 MiB 963-1667 against 1268-1883, faster in 4 of 5; at 4 MiB no better (2 of 5 each),
 * at 2 MiB slower. */
#define KOLO_STREAM_OUT_MIN ((size_t)8 << 20)

/* Whether an allgather or alltoall of `bytes` of output writes it around the cache: by the rule
 * above, or from 8 to 64 MiB as this rank's timings of such calls choose (coll_util.c). The caller
 * passes the ticket to kolo__coll_out_done when the call has ended, with its status. */
typedef struct kolo__out_ticket {
    uint64_t start, bytes;
    int way;
    bool stream;
} kolo__out_ticket;
bool kolo__coll_out_stream(kolo__mesh *m, size_t bytes, kolo__out_ticket *t);
void kolo__coll_out_done(kolo__mesh *m, const kolo__out_ticket *t, const char *what, int st);
/* Test hooks: stream (1) or not (0) instead of choosing (-1); each call of 8 to 64 MiB that
 * streams (1) or not (0) takes ns longer; such calls so far that did not stream [0] and did [1]. */
void kolo__coll_test_force_out(int stream);
void kolo__coll_test_delay_out(int stream, uint64_t ns);
void kolo__coll_test_out_calls(uint64_t got[2]);

/* A reduce-scatter (KOLO_PAIR_RS) of a 2-member group of `bytes` in all: where the pair picks
 * its ways from timings (KOLO_SHM_CMA=auto) and bytes are at least KOLO_PAIR_MIN, the member of
 * lower rank chooses from its timings of whole calls how both send their chunks, and the call's
 * sends go that way (coll_util.c, "pair"); an allgather (KOLO_PAIR_AG), whether both push or
 * exchange (below). The call begins with kolo__pair_begin, before
 * posting, and ends with kolo__pair_end, with its status; it runs no other collective between
 * them. */
#define KOLO_PAIR_MIN ((size_t)256 << 10)
/* A 2-member allgather or alltoall (KOLO_PAIR_EX) of `bytes` of output: from KOLO_PAIR_EX_MIN,
 * whether both send by ring copies or single-copy, chosen the same way (allgather.c, "Ring or
 * single-copy"); a single-copy allgather of 1-16 MiB then pushes or exchanges as its own
 * KOLO_PAIR_AG choice says, nested in this one. So does a world's allgather of 3 or more members
 * on a host with more ranks than cores, member 0 choosing for all (coll_util.c, "Crowded"):
 * single-copy is the push there. */
#define KOLO_PAIR_EX_MIN ((size_t)64 << 10)
/* From this many bytes such a choice is patient (kolo__pair_ticket): a benchmark's 25 calls a size
 * lost what ring copies gained to a probe of single-copy (allgather.c, "Ring or single-copy"); a
 * push-or-exchange choice from KOLO_PAIR_AG_PATIENT_MIN (allgather.c, "Push or exchange"). */
#define KOLO_PAIR_EX_PATIENT_MIN ((size_t)1 << 20)
#define KOLO_PAIR_AG_PATIENT_MIN KOLO_STREAM_OUT_MIN
/* A world's alltoall of 3 or more members on a host with more ranks than cores (KOLO_PAIR_A2A):
 * ring copies or single-copy as member 0's timings choose, as for the allgathers there, in slots
 * of its own (alltoall.c, "Crowded"). Its bytes, and so its classes, are the member's own. */
enum { KOLO_PAIR_RS = 0, KOLO_PAIR_AG = 1, KOLO_PAIR_EX = 2, KOLO_PAIR_A2A = 3 };
/* The ways of a KOLO_PAIR_AG call (allgather.c, "Push"): t->way KOLO_PAIR_PUSH (the choice's way
 * 0; a class's first two calls, KOLO_WAY_AUTO, push too) or KOLO_PAIR_EXCHANGE. It sets no way
 * for its messages: an exchange's go as the KOLO_PAIR_EX choice it runs inside says (single-copy,
 * or the transport's pick in that choice's first calls of a class), a push's few as the transport
 * picks. */
enum { KOLO_PAIR_PUSH = KOLO_WAY_RING, KOLO_PAIR_EXCHANGE = KOLO_WAY_SINGLE };
typedef struct kolo__pair_ticket {
    kolo__conn *conn; /* NULL: no choice (the transport picks the ways; an allgather pushes) */
    int peer, slot, way; /* slot: kind x class (coll_util.c) */
    bool lead;
    bool patient; /* a class of its kind's patient sizes (KOLO_PAIR_*_PATIENT_MIN): a new class takes
                   * the nearest smaller class's verdict (else way 0) and probes first after 0.1 s,
                   * not after 4 calls */
    bool changed; /* (the lead's) this call goes another way than the class's call before */
    bool untimed; /* set by the caller after kolo__pair_begin: not timed (a choice this one is
                   * nested in changed its way with this call: the first such call runs slow) */
    bool crowd;   /* a world of 3 or more on a crowded host, whose member 0 leads (coll_util.c) */
    uint64_t call, start, bytes;
} kolo__pair_ticket;
void kolo__pair_begin(kolo__mesh *m, const kolo__group *g, int kind, uint64_t bytes, kolo__pair_ticket *t);
void kolo__pair_end(kolo__mesh *m, const kolo__pair_ticket *t, int st, const char *what);
/* Test hooks: each such call of a kind (KOLO_PAIR_*) by ring (KOLO_WAY_RING) or single-copy
 * takes ns longer; the ways of this process's calls of a kind so far, by KOLO_WAY_* (got[0]: left
 * to the transport). */
void kolo__pair_test_delay(int kind, int way, uint64_t ns);
/* ... and the lead's second and third calls in a row by `way` take these ns longer besides (a way
 * that warms up over its first calls after a change, coll_util.c, SETTLE_MIN). */
void kolo__pair_test_settle_delay(int kind, int way, uint64_t second_ns, uint64_t third_ns);
void kolo__pair_test_calls(int kind, uint64_t got[3]);

/* Scratch memory owned by the mesh, at least n bytes, 64-byte aligned; NULL on no memory
 * (message set). Area KOLO_SCRATCH_RING holds the ring's receive slots; KOLO_SCRATCH_WORK is for
 * the algorithm that calls the ring; KOLO_SCRATCH_HIER for the hierarchical reducescatter (hier.c),
 * which calls algorithms that use the other two. Valid until the next call for the same area. */
enum { KOLO_SCRATCH_RING = 0, KOLO_SCRATCH_WORK = 1, KOLO_SCRATCH_HIER = 2 };
void *kolo__coll_scratch(kolo__mesh *m, int area, size_t n);
/* Whether the byte ranges [a, a + na) and [b, b + nb) share no byte. */
static inline bool kolo__coll_apart(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return x + na <= y || y + nb <= x;
}
/* A member's own block copied into its output (allgather, alltoall): when the received blocks
 * are written around the cache (`stream`), so is this one, if it does not overlap its source;
 * memmove otherwise. */
void kolo__coll_copy_own(void *dst, const void *src, size_t n, bool stream);
/* The same while transfers are in flight: in slices, with a progress pass of the mesh before
 * each, so that the sends just posted leave (and arriving data is taken) while this rank copies
 * instead of after it. */
void kolo__coll_copy_own_moving(kolo__mesh *m, void *dst, const void *src, size_t n, bool stream);
/* Writes n bytes of src at addr in the buffer of world rank `peer` (process_vm_writev), for a
 * collective that writes into the others' buffers itself (allgather.c "push", broadcast.c
 * "split"): 0, or ECANCELED without writing where the peer has marked its side aborted (its
 * buffers may be its user's again), or the kernel's errno (EPERM where the test hook *refuse
 * counts down to 0), which it warns of once per process, naming `what` and the rank (the caller
 * then sends the bytes as a message). */
int kolo__coll_write_peer(kolo__mesh *m, int peer, uint64_t addr, const void *src, size_t n, int *refuse,
                          const char *what);
/* A collective's single-copy read or write of world rank `peer`'s buffer failed with errno e, as
 * every member agreed: sets the error and returns its status. A peer that is gone (ESRCH) or
 * marked its side aborted (ECANCELED) is the peer's loss, KOLO_ERR_PEER_LOST naming it (with its
 * reason, if it gave one), as the transport reports it, with `what` in brackets; anything else
 * is KOLO_ERR_SYSTEM with `what` as its message (e.g. "allreduce of 4096 bytes: rank 0 could not
 * read the buffer of rank 1 with process_vm_readv (Bad address)"). */
int kolo__coll_cma_failed(kolo__mesh *m, int peer, int e, const char *what);
/* Applies the post-reduction scaling of an allreduce: post, and 1/n for AVERAGE. */
void kolo__coll_finish_scale(void *buf, size_t count, kolo_dtype_t dtype, kolo_op_t op, double post, int n);
/* dst = a OP b, finished: kolo__reduce then kolo__coll_finish_scale, the same bits, in one pass
 * over the data where the kernels have one (kolo__reduce_scale). */
void kolo__coll_reduce_finish(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                              double post, int n);
/* out = a OP b over `bytes` (finished, kolo__coll_reduce_finish, when `finish`), and the same bytes
 * written to d around the cache, a piece at a time (kolo__out_piece): a ring's reduced chunk. out
 * may be b. The caller fences (kolo__stream_fence) before others read d. */
void kolo__coll_reduce_out(char *d, char *out, const char *a, const char *b, size_t bytes, kolo_dtype_t dtype,
                           kolo_op_t op, bool finish, double post, int n);
/* Ring chunk size in bytes, a multiple of 64 (KOLO_RING_CHUNK). */
size_t kolo__coll_chunk(void);
/* Ring reduce-scatter over blocks (off[b], cnt[b] in elements). Member `rank` ends with the fully
 * reduced block `final_block(rank)` = (rank + shift) mod n, stored at `out` or, when that is
 * NULL, at dst + off[that block], finished (kolo__coll_finish_scale with post and n members) when
 * `finish`. The blocks passed on are accumulated in dst (a full-size buffer; with 2 members there
 * are none and dst is not touched when `out` is given). src holds this member's contribution (may
 * equal dst); `out` must not overlap the rest of src. n >= 2. */
int kolo__ring_reduce_scatter(kolo__mesh *m, const kolo__group *g, const char *src, char *dst, char *out,
                              const size_t *off, const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, int shift,
                              bool finish, double post);
/* Ring allgather of blocks already placed: member i's block is at buf + off[i]*es (bytes of
 * cnt[i]*es); member `rank` owns block (rank + shift) mod n. `own`, when not NULL, holds a copy
 * of that block to send from instead (the caller's send buffer, clean in cache). */
int kolo__ring_allgather(kolo__mesh *m, const kolo__group *g, char *buf, const size_t *off, const size_t *cnt,
                         size_t es, int shift, const char *own);
/* Ring allreduce over blocks that follow one another from element 0 (at least 2 members):
 * reduce-scatter, the post-scaling of each member's block (kolo__coll_finish_scale), allgather;
 * the last reduce-scatter step and the first allgather step run as one, each chunk sent on as
 * soon as it is reduced. src may equal dst. */
int kolo__ring_allreduce(kolo__mesh *m, const kolo__group *g, const char *src, char *dst, const size_t *off,
                         const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, double post);
/* Walks the pieces of the element range [pos, end) of the concatenation of segs: each piece lies
 * inside one segment and has at most `chunk` elements. start[i] is the first element of segment
 * i, start[nseg] the total. Two members cutting the same range of segments of the same lengths
 * get the same pieces, so their messages match one to one. */
typedef struct kolo__walker {
    const kolo__seg *segs;
    const size_t *start;
    int seg;
    int nseg; /* the segments, where the caller sets it after kolo__walk_init (0: not given); for the assert */
    size_t pos, end, chunk;
} kolo__walker;
static inline void kolo__walk_init(kolo__walker *w, const kolo__seg *segs, const size_t *start, size_t pos,
                                   size_t end, size_t chunk)
{
    *w = (kolo__walker){segs, start, 0, 0, pos, end, chunk};
}
/* The next piece: segment, offset inside it and length, in elements; false at the end. */
static inline bool kolo__walk_next(kolo__walker *w, int *seg, size_t *off, size_t *len)
{
    if (w->pos >= w->end) return false;
    /* pos < end <= start[nseg] (the range lies inside the segments), so the walk never passes the
     * last segment: asserted at each segment passed, where the caller gave nseg. clang's analyzer
     * cannot follow pos through the pieces' sums, and without it took ring.c's one-segment walk
     * past start[1]. */
    while (w->start[w->seg + 1] <= w->pos) {
        w->seg++;
        assert(!w->nseg || w->seg < w->nseg);
    }
    size_t n = w->end - w->pos < w->chunk ? w->end - w->pos : w->chunk;
    if (n > w->start[w->seg + 1] - w->pos) n = w->start[w->seg + 1] - w->pos;
    *seg = w->seg;
    *off = w->pos - w->start[w->seg];
    *len = n;
    w->pos += n;
    return true;
}
/* The piece size, in elements, of a ring allreduce over `total` elements on n members:
 * KOLO_RING_CHUNK, grown so that a block needs at most KOLO_RING_PIECES pieces (plus the
 * segment boundaries inside it). */
#define KOLO_RING_PIECES 64
size_t kolo__ring_chunk_elems(size_t total, int n, size_t es);
/* The last reduce-scatter step and the first allgather step of a ring allreduce as one (ring.c),
 * over the concatenation of the nseg segments segs (one for a plain buffer; start as for
 * kolo__walker), with blocks off[b], cnt[b] inside them and pieces of `chunk` elements, the same
 * on every member. Each piece of this member's block is reduced, scaled, written out and sent on
 * from a slot in cache.
 * slots: 2 * kolo__fused_slots(chunk * es) pieces' bytes; the piece lists and transfers live in
 * the mesh's KOLO_SCRATCH_WORK area. */
int kolo__ring_fused_step(kolo__mesh *m, const kolo__group *g, const kolo__seg *segs, const size_t *start, int nseg,
                          const size_t *off, const size_t *cnt, size_t chunk, kolo_dtype_t dtype, kolo_op_t op,
                          double post, char *slots);
/* Test hook: kolo__ring_allreduce and the engine's ring over a list of buffers run reduce-scatter,
 * scaling and allgather one after the other (the same reductions in the same order, so the same
 * bits) while on; kolo__ring_fusing says whether the hook leaves the fused step on. */
void kolo__ring_test_unfused(bool on);
bool kolo__ring_fusing(void);
/* The fused step keeps each chunk of a member's block in a receive slot and a send slot: as many
 * of each as fit KOLO_FUSED_CACHE bytes together, at least 1, at most KOLO_FUSED_SLOTS (ring.c
 * has the measurements). */
#define KOLO_FUSED_SLOTS 4
#define KOLO_FUSED_CACHE ((size_t)1 << 20)
static inline int kolo__fused_slots(size_t chunk_bytes)
{
    size_t w = KOLO_FUSED_CACHE / (2 * (chunk_bytes ? chunk_bytes : 1));
    return (int)(w < 1 ? 1 : w > KOLO_FUSED_SLOTS ? KOLO_FUSED_SLOTS : w);
}

#endif
