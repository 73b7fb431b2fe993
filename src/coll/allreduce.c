/* allreduce.c - allreduce and reducescatter: a one-round exchange or recursive doubling for
 * small buffers, the ring for large ones; across hosts, recursive halving from 32 KiB where the
 * hierarchical allreduce (hier.c) does not run (HALVING_MIN, below).
 *
 * Small (at most KOLO_SMALL_ALLREDUCE_MAX bytes, or fewer elements than members):
 *  - At most 3 members, or tiny buffers on at most 8: every member sends its whole buffer to every other and
 *    combines all n buffers in member order 0..n-1, so every member computes the same bits.
 *    One round trip, n-1 messages each way: the latency optimum for a few ranks. Except tiny
 *    buffers on 4 or 8 members of a job with a TCP pair on an oversubscribed host (kolo__coll_doubling_world).
 *    On 2 members out of place the exchange also runs above that, below PAIR_EXCHANGE_BELOW, where
 *    member 0 chooses it over the ring (below; direct.c, "the exchange").
 *  - Otherwise recursive doubling: log2(n) rounds in which partners swap what they hold and
 *    both combine the lower member's part first, so the two hold the same bits after every
 *    round and all members do at the end. Each member moves and combines its buffer log2(n)
 *    times instead of n-1 times; with 8 ranks on 2 cores a 4 KiB allreduce took 152 us by
 *    one-round exchange (Open MPI: 59). Members beyond the largest power of two first hand
 *    their buffer to a partner and get the result back at the end.
 * Large: ring reduce-scatter, then the owner of each block applies the final scaling (post, and 1/n
 * for AVERAGE) to its block alone, then ring allgather; from the stream size (KOLO_STREAM_MIN) the
 * last reduce-scatter step and the first allgather step run as one (ring.c). When every member is
 * on this host, the members may read each other's buffers instead (direct.c): always when all pass
 * kolo_mem_alloc buffers, by CMA when that times faster than the ring.
 *
 * Reducescatter (below) runs the ring's reduce-scatter, or for at most EXCHANGE_MAX bytes in all
 * on 3 or more members a one-round exchange: each member sends every other its block at once.
 * 4 ranks on 2 cores, 8 interleaved pairs against the ring: over TCP 16 B 52 us against 60, 16
 * KiB 56 against 69; over shared memory 16 B 3.9 against 7.2, 64 KiB 28 against 31; 8 ranks over
 * TCP 16 B 211 against 262. Above 64 KiB the exchange was still faster over shared memory (4
 * ranks, 1 MiB 300 us against 388, 4 MiB 1.73 ms against 2.16) but not over TCP (128 KiB 158
 * against 97, 2 MiB 2.03 ms against 1.45), so it runs further only where the ranks agreed at
 * init that every pair shares memory on an oversubscribed host (kolo__mesh.world_shm; 6 pairs: 2
 * MiB 786 us against 1010), and since the ring writes its own block straight into the output
 * only to blocks of 256 KiB on average (EXCHANGE_SHM_BLOCK, below). There its messages of at most
 * SINGLE_RS_MAX go single-copy (the `single` mark; shm.c, SINGLE_MIN).
 */
#include "coll.h"

#include "../reduce/reduce.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* read once (threads racing on the first call store the same value), or rank 0's (kolo__coll_follow) */
static _Atomic size_t small_max = (size_t)-1, pair_below = (size_t)-1;

size_t kolo__coll_small_max(void)
{
    size_t r = atomic_load_explicit(&small_max, memory_order_relaxed);
    if (r == (size_t)-1) {
        r = kolo__setting_bytes(KOLO_SET_SMALL_ALLREDUCE_MAX);
        atomic_store_explicit(&small_max, r, memory_order_relaxed);
    }
    return r;
}

/* 2-member allreduces out of place below this size may run the one-round exchange instead of
 * the ring, unless the user set KOLO_SMALL_ALLREDUCE_MAX: over shared memory as member 0's timings
 * choose (direct.c, "the exchange"); where no member chooses (over TCP, a pair that cannot read
 * by CMA, a prescale) always. Over TCP, Intel Xeon VM, 2 ranks, 3 launches alternated: 128 KiB
 * 41-44 us against the ring's 44-51. */
#define PAIR_EXCHANGE_BELOW ((size_t)256 << 10)

static uint64_t pair_exchange_runs;

uint64_t kolo__coll_pair_exchange_runs(void) { return __atomic_load_n(&pair_exchange_runs, __ATOMIC_RELAXED); }

static size_t pair_exchange_below(void)
{
    size_t r = atomic_load_explicit(&pair_below, memory_order_relaxed); /* as kolo__coll_small_max */
    if (r == (size_t)-1) {
        r = kolo__setting_is_set(KOLO_SET_SMALL_ALLREDUCE_MAX) ? 0 : PAIR_EXCHANGE_BELOW;
        atomic_store_explicit(&pair_below, r, memory_order_relaxed);
    }
    return r;
}

bool kolo__coll_small_max_set(void) { return pair_exchange_below() == 0; }

void kolo__coll_follow_small(size_t max, bool set)
{
    atomic_store_explicit(&small_max, max, memory_order_relaxed);
    atomic_store_explicit(&pair_below, set ? 0 : PAIR_EXCHANGE_BELOW, memory_order_relaxed);
}

/* dst = src[0] OP src[1] OP ... OP src[n-1] (n >= 2), always in member order, so that members
 * combining the same buffers get the same bits, and finished (post, AVERAGE's 1/n) with the last
 * step. dst may be src[0] or src[1] (the reduction reads each element before it writes it), not a
 * later one, which the first step would overwrite. */
static void combine_in_order(void *dst, const char *const *src, int n, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                             double post)
{
    if (n > 2) kolo__reduce(dst, src[0], src[1], count, dtype, op);
    for (int i = 2; i < n - 1; i++) kolo__reduce(dst, dst, src[i], count, dtype, op);
    kolo__coll_reduce_finish(dst, n > 2 ? dst : src[0], src[n - 1], count, dtype, op, post, n);
}

/* Each member sends its buffer to every other and combines all of them in member order. It sends
 * straight from `send` and combines from there, unless its contribution is scaled first (pre) or,
 * in place as member 2 or later, the first combining step would overwrite it: then from a private
 * copy. When the wait returns every peer has its copy (a single-copy read ends with the reader's
 * ack), so recv may be written even where it is send.
 *
 * What this call or the next overwrites (in place, or the copy) goes by ring copies even where the
 * pair would send it single-copy (KOLO_SHM_CMA=auto): a peer that read it single-copy holds its
 * lines, and the writes that follow take each one back, a cost no timing of the message sees. On
 * an Intel Xeon guest, 2 ranks, 64 KiB in place: 24 us a call single-copy, 11 by ring, while the
 * receiver timed the message at 150 ps/B single-copy against 220. Until 2026-12 the copy was made
 * always, and a pair that chose single-copy for the size paid that in every call: kolo-bench 8
 * B-64 KiB, 8 launches alternated, 64 KiB out of place 26.3 us before, 10.4 after (Open MPI
 * 25.8), 4-32 KiB 0.87-0.93x the time.
 *
 * `single` (the 2-member exchange above the small sizes, PAIR_EXCHANGE_BELOW): out of place, the
 * sends straight from `send` are marked single (the peer keeps the bytes and forwards none), so a
 * pair that picks from timings sends them single-copy as the call's choice. Left to the pair,
 * a launch starting at 128 KiB probed single-copy once, on cold pages (208 ps/B against the ring's
 * 145), and kept the ring for the rest: 17-19 us a call against 11.7-13 marked. */
static int allreduce_small(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                           kolo_dtype_t dtype, kolo_op_t op, double pre, double post, bool single)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype), bytes = count * es;
    size_t stride = (bytes + 63) & ~(size_t)63;
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, stride * (size_t)n);
    if (!tmp) return KOLO_ERR_NO_MEMORY;
    const char *own = send;
    if (pre != 1.0 || (recv == send && r >= 2)) {
        char *mine = tmp + stride * (size_t)r;
        if (pre != 1.0) kolo__scale(mine, send, count, dtype, pre);
        else if (bytes) kolo__copy(mine, send, bytes);
        own = mine;
    }
    kolo__xfer xs[128];
    kolo__xfer *ptrs[128];
    const char *src[8] = {NULL}; /* n <= 8 here */
    int k = 0;
    /* what we overwrite goes by ring copies (above) */
    unsigned char way = m->call_way;
    if (own != send || recv == send) m->call_way = KOLO_WAY_RING;
    for (int i = 0; i < n; i++) {
        src[i] = i == r ? own : tmp + stride * (size_t)i;
        if (i == r) continue;
        kolo__isend(m, kolo__g2w(g, i), own, bytes, &xs[k]);
        xs[k++].single = single && own == send && recv != send;
        kolo__irecv(m, kolo__g2w(g, i), tmp + stride * (size_t)i, bytes, &xs[k++]);
    }
    m->call_way = way;
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    int st = kolo__wait(m, ptrs, k);
    if (st != KOLO_OK) return st;
    combine_in_order(recv, src, n, count, dtype, op, post); /* n >= 2: one member returned earlier */
    return KOLO_OK;
}

/* Buffers of at least this many bytes on 4 to 8 members, and all small ones on more, go by
 * recursive doubling. Tiny ones on a power of two of members do too where some pair runs over
 * TCP on a host with more ranks than cores (kolo__coll_doubling_world). 4 ranks on 2 cores over
 * TCP, 12 interleaved pairs: 8-512 B 31-34 us against 48-53 (a first set of 6 pairs read 8-128 B
 * alike, 512 B 37 against 54). Over shared memory the exchange stays (4.1 us against 5.5 by
 * doubling). */
#define DOUBLING_MIN 1024

/* One exchange with a partner: send `mine`, receive into `theirs`. */
static int swap(kolo__mesh *m, const kolo__group *g, int partner, const void *mine, void *theirs, size_t bytes)
{
    kolo__xfer xs[2];
    kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
    kolo__isend(m, kolo__g2w(g, partner), mine, bytes, &xs[0]);
    kolo__irecv(m, kolo__g2w(g, partner), theirs, bytes, &xs[1]);
    return kolo__wait(m, ptrs, 2);
}

static int allreduce_doubling(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                              kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    int n = g->size, r = g->rank;
    size_t bytes = count * kolo_dtype_size(dtype);
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, bytes);
    if (!tmp) return KOLO_ERR_NO_MEMORY;
    /* the running result lives in recv from the start (send may alias it) */
    if (pre != 1.0) kolo__scale(recv, send, count, dtype, pre);
    else if (send != recv) kolo__copy(recv, send, bytes);
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    int extra = n - p2; /* members 0 .. 2*extra-1 pair up: the even one hands over to the odd one */
    int st = KOLO_OK, v;  /* v: index among the p2 members that take part, or -1 */
    if (r < 2 * extra) {
        if (r % 2 == 0) {
            kolo__xfer x;
            kolo__isend(m, kolo__g2w(g, r + 1), recv, bytes, &x);
            st = kolo__wait1(m, &x);
            v = -1;
        } else {
            kolo__xfer x;
            kolo__irecv(m, kolo__g2w(g, r - 1), tmp, bytes, &x);
            st = kolo__wait1(m, &x);
            if (st == KOLO_OK) kolo__reduce(recv, tmp, recv, count, dtype, op); /* lower member first */
            v = r / 2;
        }
    } else {
        v = r - extra;
    }
    for (int mask = 1; v >= 0 && mask < p2 && st == KOLO_OK; mask <<= 1) {
        int pv = v ^ mask;
        int partner = pv < extra ? 2 * pv + 1 : pv + extra;
        st = swap(m, g, partner, recv, tmp, bytes);
        if (st != KOLO_OK) break;
        const char *x = pv < v ? tmp : recv, *y = pv < v ? recv : tmp;
        if (mask * 2 >= p2) kolo__coll_reduce_finish(recv, x, y, count, dtype, op, post, n); /* the last round */
        else kolo__reduce(recv, x, y, count, dtype, op);
    }
    /* the members that handed over get the finished result */
    if (st == KOLO_OK && r < 2 * extra) {
        kolo__xfer x;
        if (r % 2 == 0) kolo__irecv(m, kolo__g2w(g, r + 1), recv, bytes, &x);
        else kolo__isend(m, kolo__g2w(g, r - 1), recv, bytes, &x);
        st = kolo__wait1(m, &x);
    }
    return st;
}

/* Allreduces of at least HALVING_MIN bytes on 4 or more members spread
 * over 2 or more hosts, where the hierarchical allreduce does not run (below its threshold, an
 * uneven spread, KOLO_HIERARCHICAL_ALLREDUCE=0), go by recursive halving and doubling instead of
 * the ring or recursive doubling (below). 4 ranks as 2 hosts of 2 (bench/hosts.sh: network
 * namespaces, veth shaped to 10 Gbit/s, ranks yielding while they wait, 50 calls a size, 2
 * launches each way alternated), time against the ring / recursive doubling: 16 KiB 40-45 us
 * against 24 (recursive doubling's 2 rounds against its 4), 32 KiB 43-52 against 52, 64 KiB 57-66
 * against 109, 128 KiB 108 against 163, 1-2 MiB 0.58-0.82x, 4-8 MiB 0.61-0.83x, 16-64 MiB
 * 0.83-0.96x (10 calls a size). Open MPI 4.1's tuned allreduce, whose times match this algorithm's
 * at these sizes, took 64-68 us at 64 KiB and 107 at 128 KiB in the same launches. At 2 Gbit/s,
 * 256 KiB 1.09 ms against the ring's 1.63. Where the three stages run they carry the same bytes
 * over the network in fewer steps: 1.00-1.02x the halving's time at 2 Gbit/s, 0.63-0.92x at 10
 * Gbit/s and 0.80-0.91x not shaped from 512 KiB, so they keep their threshold. On one host over
 * TCP (KOLO_TRANSPORT=tcp, 4 ranks, 3 launches each way, out of place) it lost to recursive
 * doubling and the ring at 32-512 KiB (32 KiB 56-61 us against 32-44, 512 KiB 716-783 against
 * 389-423; 2 MiB 0.92-0.97x), where every pair's link is the same and fewer bytes between hosts
 * buy nothing: it runs only where the members span hosts. */
#define HALVING_MIN ((size_t)32 << 10)

static uint64_t halving_runs;

uint64_t kolo__coll_halving_runs(void) { return __atomic_load_n(&halving_runs, __ATOMIC_RELAXED); }

void kolo__coll_halving_ran(void) { __atomic_fetch_add(&halving_runs, 1, __ATOMIC_RELAXED); }

const int *kolo__coll_halving_order(const kolo__group *g, size_t count, size_t es)
{
    int hosts;
    const int *order = kolo__coll_host_order(g, &hosts);
    return g->size >= 4 && count * es >= HALVING_MIN && count >= (size_t)g->size ? order : NULL;
}

/* Recursive halving, then recursive doubling (Rabenseifner's allreduce), over the members in
 * `order` (host by host: kolo__coll_host_order). In round k (distance 2^k in that order) partners swap halves of what
 * they hold and each reduces the half it keeps, the lower member's part first; after log2(p)
 * rounds each holds one p-th of the buffer fully reduced, finishes its scaling (AVERAGE's 1/n,
 * the postscale), and the rounds run backwards, swapping finished parts, until every member
 * holds all of them. Each member sends 2(p-1)/p of the buffer, as on the ring, but in 2 log2(p)
 * steps instead of 2(p-1); and the rounds between hosts come last in the halving and first in
 * the doubling, with the smallest parts: with L members a host (a power of two), each host sends
 * 2(h-1)/h of the buffer over the network, the hierarchical allreduce's figure, against the
 * ring's 2(n-1)/n per link. Every block is finished by one member and copied to the others: all
 * get the same bits. Members beyond the largest power of two hand their buffer to a neighbour in
 * the order first and get the result back at the end, as in recursive doubling. */
void kolo__coll_halving_plan(const kolo__group *g, const int *order, size_t count, kolo__halving_plan *p)
{
    int n = g->size, q = 0, p2 = 1;
    while (order[q] != g->rank) q++;
    while (p2 * 2 <= n) p2 *= 2;
    int extra = n - p2, v = q < 2 * extra ? (q % 2 ? q / 2 : -1) : q - extra; /* index among the p2, or -1 */
    p->handover = q < 2 * extra ? order[q ^ 1] : -1;
    p->gives = v < 0;
    p->rounds = 0;
    size_t a = 0, b = count; /* the range held before each round */
    for (int mask = 1; v >= 0 && mask < p2; mask <<= 1) {
        int pv = v ^ mask;
        size_t mid = a + (b - a) / 2;
        bool low = v < pv;
        kolo__halving_round *r = &p->r[p->rounds++];
        *r = (kolo__halving_round){order[pv < extra ? 2 * pv + 1 : pv + extra], low, low ? a : mid, low ? mid : b,
                                   low ? mid : a, low ? b : mid};
        a = r->keep_lo;
        b = r->keep_hi;
    }
}

/* The schedule above on one buffer: each range one message, the received half into scratch. */
static int allreduce_halving(kolo__mesh *m, const kolo__group *g, const int *order, const void *send, void *recv,
                             size_t count, kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    kolo__halving_plan hp;
    kolo__coll_halving_plan(g, order, count, &hp);
    size_t es = kolo_dtype_size(dtype), bytes = count * es;
    int st = KOLO_OK;
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, hp.handover >= 0 ? bytes : (count + 1) / 2 * es);
    if (!tmp) return KOLO_ERR_NO_MEMORY;
    char *out = recv;
    if (pre != 1.0) kolo__scale(recv, send, count, dtype, pre);
    else if (send != recv) kolo__copy(recv, send, bytes);
    kolo__coll_halving_ran();
    if (hp.handover >= 0) {
        kolo__xfer x;
        if (hp.gives) {
            kolo__isend(m, kolo__g2w(g, hp.handover), recv, bytes, &x);
            st = kolo__wait1(m, &x);
        } else {
            kolo__irecv(m, kolo__g2w(g, hp.handover), tmp, bytes, &x);
            st = kolo__wait1(m, &x);
            if (st == KOLO_OK) kolo__reduce(recv, tmp, recv, count, dtype, op); /* lower member first */
        }
    }
    for (int k = 0; k < hp.rounds && st == KOLO_OK; k++) {
        const kolo__halving_round *r = &hp.r[k];
        size_t ka = r->keep_lo, kb = r->keep_hi;
        kolo__xfer xs[2];
        kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
        kolo__isend(m, kolo__g2w(g, r->partner), out + r->send_lo * es, (r->send_hi - r->send_lo) * es, &xs[0]);
        kolo__irecv(m, kolo__g2w(g, r->partner), tmp, (kb - ka) * es, &xs[1]);
        if ((st = kolo__wait(m, ptrs, 2)) != KOLO_OK) break;
        char *keep = out + ka * es;
        const char *x = r->low ? keep : tmp, *y = r->low ? tmp : keep;
        if (k == hp.rounds - 1) kolo__coll_reduce_finish(keep, x, y, kb - ka, dtype, op, post, g->size); /* and finished */
        else kolo__reduce(keep, x, y, kb - ka, dtype, op);
    }
    /* backwards: the part this member finished for the partner's */
    for (int k = hp.rounds - 1; k >= 0 && st == KOLO_OK; k--) {
        const kolo__halving_round *r = &hp.r[k];
        kolo__xfer xs[2];
        kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
        kolo__isend(m, kolo__g2w(g, r->partner), out + r->keep_lo * es, (r->keep_hi - r->keep_lo) * es, &xs[0]);
        kolo__irecv(m, kolo__g2w(g, r->partner), out + r->send_lo * es, (r->send_hi - r->send_lo) * es, &xs[1]);
        st = kolo__wait(m, ptrs, 2);
    }
    if (st == KOLO_OK && hp.handover >= 0) {
        kolo__xfer x;
        if (hp.gives) kolo__irecv(m, kolo__g2w(g, hp.handover), recv, bytes, &x);
        else kolo__isend(m, kolo__g2w(g, hp.handover), recv, bytes, &x);
        st = kolo__wait1(m, &x);
    }
    return st;
}

int kolo__coll_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                         kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    int n = g->size;
    size_t es = kolo_dtype_size(dtype);
    if (op == KOLO_ADASUM) return kolo__coll_adasum(m, g, send, recv, &count, 1, dtype, pre, post);
    if (n == 1) {
        if (pre != 1.0) kolo__scale(recv, send, count, dtype, pre);
        else if (send != recv && count) kolo__copy(recv, send, count * es);
        kolo__coll_finish_scale(recv, count, dtype, op, post, 1);
        return KOLO_OK;
    }
    /* small: the one-round exchange (at most 8 members: it posts 2(n-1) messages at once) or
     * recursive doubling; large: the ring */
    /* spread over hosts: recursive halving unless in three stages (below) */
    const int *order;
    if (count * es <= kolo__coll_small_max() || count < (size_t)n) {
        if ((order = kolo__coll_halving_order(g, count, es)))
            return allreduce_halving(m, g, order, send, recv, count, dtype, op, pre, post);
        if (n <= 3 || (n <= 8 && count * es < DOUBLING_MIN && !kolo__coll_doubling_world(m, n)))
            return allreduce_small(m, g, send, recv, count, dtype, op, pre, post, false);
        return allreduce_doubling(m, g, send, recv, count, dtype, op, pre, post);
    }

    /* spread over hosts: maybe in three stages (hier.c) */
    int h = kolo__coll_hier_allreduce(m, g, send, recv, count, dtype, op, pre, post);
    if (h != KOLO_HIER_DECLINED) return h;
    if ((order = kolo__coll_halving_order(g, count, es)))
        return allreduce_halving(m, g, order, send, recv, count, dtype, op, pre, post);

    /* every member on this host: maybe read the others' buffers directly */
    kolo__direct_ticket ticket = {.can_exchange = n == 2 && send != recv && count * es < pair_exchange_below()};
    if (pre == 1.0) {
        kolo__seg whole = {send, recv, count};
        int z = kolo__direct_allreduce(m, g, &whole, 1, dtype, op, post, &ticket);
        if (z != KOLO_DIRECT_DECLINED) return z;
    }
    /* member 0 chose (over shared memory), or no one could: the size says */
    if (ticket.start ? ticket.exchange : ticket.can_exchange) {
        __atomic_fetch_add(&pair_exchange_runs, 1, __ATOMIC_RELAXED);
        int st = allreduce_small(m, g, send, recv, count, dtype, op, pre, post, true);
        kolo__direct_ring_done(m, &ticket, st);
        return st;
    }

    size_t own[2 * KOLO_STACK_MEMBERS], *offs = kolo__coll_members(own, n, 2 * sizeof(size_t));
    if (!offs) return KOLO_ERR_NO_MEMORY;
    size_t *cnts = offs + n;
    kolo__coll_blocks(count, n, offs, cnts);
    const char *src = send;
    if (pre != 1.0) {
        kolo__scale(recv, send, count, dtype, pre);
        src = recv;
    }
    int st = kolo__ring_allreduce(m, g, src, recv, offs, cnts, dtype, op, post);
    kolo__coll_members_free(offs, own);
    kolo__direct_ring_done(m, &ticket, st);
    return st;
}

/* Reduce-scatters of at most this many bytes in all on 3 to EXCHANGE_MEMBERS members go by
 * one-round exchange; where every pair runs over shared memory on a host with more ranks than
 * cores, those of blocks of at most EXCHANGE_SHM_BLOCK on average (n of them in all), up to
 * EXCHANGE_SHM_MAX. Once the ring's last step wrote its block straight into the output (see
 * kolo__coll_reducescatter), the ring overtook the exchange from blocks of 512 KiB: Intel Xeon
 * VM, 2 vCPUs, launches alternated, 4 ranks 2 MiB 0.84-0.85x the exchange's time and 4 MiB
 * 0.84-0.87x (8 and 6 pairs), 1 MiB 1.10x; 8 ranks 4 MiB 0.85x, 2 MiB 1.09x (6 pairs). */
#define EXCHANGE_MAX ((size_t)64 << 10)
#define EXCHANGE_SHM_BLOCK ((size_t)256 << 10)
#define EXCHANGE_SHM_MAX ((size_t)4 << 20)
#define EXCHANGE_MEMBERS 64
#define SINGLE_RS_MAX ((size_t)256 << 10)

/* Every member sends block i of its buffer to member i and receives its own block from every
 * other, all at once, then combines the n copies of its block in member order 0..n-1. The same
 * bytes leave each member as in the ring (n-1 blocks), but in one round instead of n-1: with 4
 * ranks on 2 cores over TCP each ring step is a wake-up of the next rank. */
static int reducescatter_exchange(kolo__mesh *m, const kolo__group *g, const char *send, void *recv,
                                  const size_t *offs, const size_t *counts, size_t total, kolo_dtype_t dtype,
                                  kolo_op_t op, double pre, double post)
{
    int n = g->size, r = g->rank;
    /* reducescatter_moving takes the exchange for these only: xs[], ptrs[] and slots[] are sized
     * for EXCHANGE_MEMBERS, and combine_in_order needs 2 or more */
    assert(n >= 3 && n <= EXCHANGE_MEMBERS);
    size_t es = kolo_dtype_size(dtype), bytes = counts[r] * es;
    size_t stride = (bytes + 63) & ~(size_t)63;
    /* n slots for the copies of this member's block, then the pre-scaled buffer if any */
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, stride * (size_t)n + (pre != 1.0 ? total * es : 0));
    if (!tmp) return KOLO_ERR_NO_MEMORY;
    const char *src = send;
    if (pre != 1.0) {
        char *scaled = tmp + stride * (size_t)n;
        kolo__scale(scaled, send, total, dtype, pre);
        src = scaled;
    }
    kolo__xfer xs[2 * EXCHANGE_MEMBERS];
    kolo__xfer *ptrs[2 * EXCHANGE_MEMBERS];
    int k = 0;
    for (int step = 1; step < n; step++) { /* rotated, so that not every member starts with 0 */
        int to = (r + step) % n, from = (r - step + n) % n;
        kolo__irecv(m, kolo__g2w(g, from), tmp + stride * (size_t)from, bytes, &xs[k++]);
        kolo__isend(m, kolo__g2w(g, to), src + offs[to] * es, counts[to] * es, &xs[k]);
        /* the receiver combines its copy and forwards none; single-copy against ring copies, 4
         * ranks on 2 cores, 14 interleaved pairs, us: 1 MiB in all (256 KiB messages) 265
         * against 350, 2 MiB 885 against 863, 4 MiB 2730 against 2273 */
        xs[k++].single = counts[to] * es <= SINGLE_RS_MAX;
    }
    /* a private copy of this member's own block: recv may overlap send */
    if (bytes) kolo__copy(tmp + stride * (size_t)r, src + offs[r] * es, bytes);
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    int st = kolo__wait(m, ptrs, k);
    if (st != KOLO_OK) return st;
    const char *slots[EXCHANGE_MEMBERS];
    for (int i = 0; i < n; i++) slots[i] = tmp + stride * (size_t)i;
    combine_in_order(recv, slots, n, counts[r], dtype, op, post);
    return KOLO_OK;
}

/* Direct: member r reads block r of every other member's input itself, single-copy
 * (process_vm_readv), a chunk at a time into scratch that stays in the cache, and combines each
 * chunk of the n inputs in member order straight into its output (finished there too). Every
 * input byte is read once and every output byte written once, where the ring moves each block
 * through the pairs' rings or a full-size work buffer at every step. The members first exchange
 * where their inputs are (and whether they can take part: send and recv apart; if any cannot,
 * all take the ring), and at the end their status, which also tells each that
 * nobody reads its input any more: a failed read fails the call on every member, naming who
 * could not read whom. A prescale scales each chunk as it arrives, and this member's own into a
 * slot of its own, before they are combined: the values the ring combines, which scales the whole
 * input first. Prescaled, 2 ranks, 256 KiB / 1 / 4 / 16 MiB in all, 5 rounds of 200 calls
 * alternated with the ring (and its 2-member pair choice) that such calls took before: 18.3 / 77
 * / 408 / 1647 us against 28.5 / 151 / 690 / 2872.
 *
 * Where every pair of the group reads single-copy (of the world, or of the one host the group
 * lies on: kolo__coll_group_flags, as the allgather's push): 2 members from RS_DIRECT_MIN_2 in
 * all, more on a host with more ranks than cores from RS_DIRECT_MIN. Intel Xeon VM, 2 vCPUs,
 * alternated with the build before (the exchange, or the ring), 3 rounds, medians, us per call:
 * 2 ranks 256 KiB 10.8 against 13.9, 2 MiB 164 against 208, 16 MiB 1319 against 1707, 64 MiB
 * 10776 against 11047 (128 KiB alike); 4 ranks bound in blocks 128 KiB 26.6 against 34.5, 4 MiB
 * 847 against 1373, 16 MiB 3734 against 6209, 64 MiB 26228 against 33531 (64 KiB 0.91x, 16 KiB
 * alike); 8 ranks 128 KiB-64 MiB 0.60-0.91x. Chunks of 256 KiB: 64 KiB took 1.0-1.27x their time,
 * 1 MiB 1.0-1.3x. Storing the output around the cache from 16 MiB gained nothing (2 ranks 16-64
 * MiB 1.01-1.03x, 4 ranks 0.88-1.05x). */
#define RS_DIRECT_MIN_2 ((size_t)256 << 10)
#define RS_DIRECT_MIN ((size_t)128 << 10)
#define RS_DIRECT_CHUNK ((size_t)256 << 10)
#define RS_DIRECT_SCRATCH ((size_t)1 << 20) /* the chunks of the n - 1 others, at most */

/* Direct or the ring, chosen. Direct reads every input byte once, but by the kernel's copy, which
 * on the Zen 4 VM runs at a quarter of memcpy's rate between processes (docs/performance.md,
 * "Ring copies beat single-copy at 4 ranks"): there 2 ranks by the ring with ring copies
 * (KOLO_SHM_CMA=0) took 0.58-0.75x direct's time from 256 KiB to 256 MiB (the harness's bands,
 * in both machine states), 4 ranks on the 2 vCPUs 0.69-0.87x; on the Intel VM direct won (above).
 * So where member 0's pair with member 1 picks its ways from timings (KOLO_SHM_CMA=auto), member 0
 * times whole calls either way, per class of their bytes in all (x2 from RS_DIRECT_MIN), starting
 * direct, and its plan travels in its descriptor, which every member reads; the first call of a
 * class and the first after a change of way are not timed (direct.c, "choosing"). The ring's own
 * choices (a pair's chunks by ring copies or single-copy, coll_util.c, "pair") run inside the
 * ring's calls. 2 ranks, the harness's bands, 3 rounds rotating with the build before and ring
 * copies pinned, near state, time against the build before: 256 KiB-1 MiB 0.72-0.87x out of place
 * (in place 0.70-0.77x), 2 / 4 MiB 0.83 / 0.86x (0.68 / 0.65x), 8-16 MiB 0.89-1.03x (0.88x), 64
 * MiB 0.75x (0.56x), 256 MiB 0.62x (1.04x: launches of 3 calls). A host with more ranks than cores
 * keeps direct: there the choice ran 4 ranks' 4-16 MiB at 1.1-1.3x direct's time (4 rounds of the
 * harness's 20-call launches; member 0 timed the ring at 235 ps/B against direct's 330 after its
 * probes, but direct's calls in the build before took no longer than the ring's pinned). A likely
 * reading, not verified: member 0's clock stops at its own last ring step, with no closing
 * exchange, while the members that share its core still run theirs; direct ends with a status
 * exchange that waits for all. A choice there needs a clock that ends with the last member. */
enum { RS_RING = 0, RS_DIRECT = 1 };
static const char *const WAYS_RS[2] = {"the ring", "direct by CMA"};
static uint64_t rs_test_delay_ns[2];
void kolo__coll_reducescatter_test_delay(int way, uint64_t ns)
{
    if (way == RS_RING || way == RS_DIRECT) rs_test_delay_ns[way] = ns;
}

/* A call that could go direct, after the descriptors: how it runs (member 0's plan), and member
 * 0's start when it times the call (else 0). bytes 0: the call could not go direct. */
typedef struct rs_ticket {
    uint64_t start, bytes;
    int plan;
} rs_ticket;

static int rs_class(uint64_t bytes)
{
    int k = 0;
    for (uint64_t b = bytes / RS_DIRECT_MIN; b >= 2 && k < KOLO_DIRECT_CLASSES - 1; b /= 2) k++;
    return k;
}

static bool rs_choosing(const kolo__mesh *m, const kolo__group *g)
{
    return kolo__shm_cma_state(m->conns[kolo__g2w(g, 1)]) == 2;
}

/* After a call that could go direct: the test hook's delay, and member 0 learns the call's time. */
static void rs_done(kolo__mesh *m, const rs_ticket *t, int st)
{
    if (!t->bytes) return;
    kolo__sleep_ns(rs_test_delay_ns[t->plan]);
    if (t->start && st == KOLO_OK)
        kolo__choice_learn(&m->rs_direct[rs_class(t->bytes)], t->plan, t->start, t->bytes, "reducescatter", WAYS_RS);
}

static uint64_t rs_direct_runs;
static int rs_test_fail_read;
uint64_t kolo__coll_reducescatter_direct_runs(void) { return __atomic_load_n(&rs_direct_runs, __ATOMIC_RELAXED); }
void kolo__coll_reducescatter_test_fail_read(int nth) { rs_test_fail_read = nth; }

static bool rs_direct_here(const kolo__mesh *m, const kolo__group *g, size_t bytes)
{
    int n = g->size;
    return n <= EXCHANGE_MEMBERS && bytes >= (n == 2 ? RS_DIRECT_MIN_2 : RS_DIRECT_MIN) &&
           kolo__coll_single_copy_group(m, g);
}

typedef struct rs_desc {
    uint64_t addr;   /* the member's input */
    uint64_t total;  /* its bytes in all */
    uint64_t layout; /* its counts, hashed */
    int32_t pid;
    int32_t ok;   /* 1: it can take part */
    int32_t plan; /* member 0's: RS_DIRECT, or RS_RING (all take the ring) */
    int32_t pad;
} rs_desc;

typedef struct rs_status {
    int32_t err;  /* errno of the first failed read, or 0 */
    int32_t whom; /* the member it could not read */
} rs_status;

/* KOLO_OK, an error, or KOLO_DIRECT_DECLINED when some member cannot take part or member 0 chose
 * the ring (t says which, for rs_done after the ring). */
static int reducescatter_direct(kolo__mesh *m, const kolo__group *g, const char *send, char *recv,
                                const size_t *offs, const size_t *counts, size_t total, kolo_dtype_t dtype,
                                kolo_op_t op, double pre, double post, rs_ticket *t)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype), bytes = counts[r] * es, ones[EXCHANGE_MEMBERS];
    uint64_t start = kolo__now_ns();
    bool choose = r == 0 && rs_choosing(m, g);
    rs_desc all[EXCHANGE_MEMBERS], me = {.addr = (uint64_t)(uintptr_t)send,
                                         .total = total * es,
                                         .layout = kolo__fnv1a(counts, (size_t)n * sizeof(size_t)),
                                         .pid = (int32_t)getpid(),
                                         .ok = kolo__coll_apart(recv, bytes, send, total * es),
                                         .plan = RS_DIRECT};
    if (choose) me.plan = kolo__choice_pick(&m->rs_direct[rs_class(total * es)], start, RS_DIRECT, false);
    for (int i = 0; i < n; i++) ones[i] = 1;
    int st = kolo__coll_allgather(m, g, &me, all, ones, sizeof(rs_desc));
    bool ok = true;
    for (int i = 0; i < n && st == KOLO_OK; i++) {
        if (all[i].total != me.total || all[i].layout != me.layout)
            return kolo__err(KOLO_ERR_MISMATCH,
                             "reducescatter: rank %d passed %llu bytes %s rank %d (%zu): the ranks called "
                             "collectives with different counts, dtypes or orders",
                             kolo__g2w(g, i), (unsigned long long)all[i].total,
                             all[i].total != me.total ? "where" : "split into other blocks than", m->rank,
                             total * es);
        /* the pid is whose memory the others read as member i's: the handshake's, or a garbled
         * desc made them read any process this user may ptrace (found by tests/fuzz/fuzz_cma.c) */
        if (i != r && all[i].pid != m->peers[kolo__g2w(g, i)].pid)
            return kolo__err(KOLO_ERR_PROTOCOL,
                             "reducescatter: rank %d on %s described a buffer of process %d, not of its own (%d): a "
                             "garbled description",
                             kolo__g2w(g, i), kolo__peer_name(m, kolo__g2w(g, i)), (int)all[i].pid,
                             m->peers[kolo__g2w(g, i)].pid);
        ok = ok && all[i].ok;
    }
    if (st != KOLO_OK) return st;
    if (!ok) return KOLO_DIRECT_DECLINED;
    t->bytes = total * es;
    t->plan = all[0].plan == RS_RING ? RS_RING : RS_DIRECT;
    /* not the first call of a class, nor the first after a change of way */
    if (choose && kolo__choice_repeat(&m->rs_direct[rs_class(total * es)], t->plan)) t->start = start;
    if (t->plan == RS_RING) return KOLO_DIRECT_DECLINED;
    /* a prescale scales each chunk as it arrives, this member's own into a slot of its own */
    size_t slots_n = (size_t)(n - 1) + (pre != 1.0);
    size_t chunk = KOLO_MIN(RS_DIRECT_CHUNK, RS_DIRECT_SCRATCH / slots_n) & ~(size_t)63;
    chunk = KOLO_MAX(chunk, (size_t)4096);
    char *scratch = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, chunk * slots_n);
    rs_status mine = {0, -1}, sts[EXCHANGE_MEMBERS];
    if (!scratch) mine.err = ENOMEM;
    const char *slots[EXCHANGE_MEMBERS];
    size_t base = offs[r] * es;
    for (size_t at = 0; at < bytes && !mine.err; at += chunk) {
        size_t c = KOLO_MIN(chunk, bytes - at);
        for (int d = 1; d < n && !mine.err; d++) { /* read from the next member first: not all from 0 */
            int i = (r + d) % n;
            char *slot = scratch + chunk * (size_t)(d - 1);
            size_t done = 0;
            int e = rs_test_fail_read && --rs_test_fail_read == 0
                        ? EFAULT
                        : kolo__cma_read(all[i].pid, slot, all[i].addr + base + at, c, &done);
            if (e || kolo__shm_peer_aborted(m->conns[kolo__g2w(g, i)])) mine = (rs_status){e ? e : ECANCELED, i};
            else if (pre != 1.0) kolo__scale(slot, slot, c / es, dtype, pre);
            slots[i] = slot;
        }
        if (mine.err) break;
        slots[r] = send + base + at;
        if (pre != 1.0) {
            char *own = scratch + chunk * (size_t)(n - 1);
            kolo__scale(own, send + base + at, c / es, dtype, pre);
            slots[r] = own;
        }
        combine_in_order(recv + at, slots, n, c / es, dtype, op, post);
    }
    for (int i = 0; i < n; i++) ones[i] = 1;
    st = kolo__coll_allgather(m, g, &mine, sts, ones, sizeof(rs_status));
    if (st != KOLO_OK) return st;
    for (int i = 0; i < n; i++)
        if (sts[i].err) {
            /* a failed read names the member read, and only ENOMEM none (-1); a member index from
             * a garbled status was looked up in the group's ranks as it came, past their end
             * (found by tests/fuzz/fuzz_cma.c) */
            if (!(sts[i].whom >= 0 && sts[i].whom < n) && !(sts[i].whom == -1 && sts[i].err == ENOMEM))
                return kolo__err(KOLO_ERR_PROTOCOL,
                                 "reducescatter: rank %d on %s sent a garbled status: errno %d with member %d of %d",
                                 kolo__g2w(g, i), kolo__peer_name(m, kolo__g2w(g, i)), (int)sts[i].err,
                                 (int)sts[i].whom, n);
            int whom = sts[i].whom >= 0 ? kolo__g2w(g, sts[i].whom) : -1;
            char what[160];
            snprintf(what, sizeof(what), "reducescatter: rank %d could not read the buffer of rank %d: %s",
                     kolo__g2w(g, i), whom, strerror(sts[i].err));
            return kolo__coll_cma_failed(m, whom, sts[i].err, what);
        }
    __atomic_fetch_add(&rs_direct_runs, 1, __ATOMIC_RELAXED);
    rs_done(m, t, KOLO_OK);
    return KOLO_OK;
}

/* The exchange or the ring (reducescatter, after direct declined). */
static int reducescatter_moving(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *offs,
                                const size_t *counts, size_t total, kolo_dtype_t dtype, kolo_op_t op, double pre,
                                double post)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    /* the choice depends on the member count and the total only, the same on every member */
    size_t exchange_max = n >= 3 && kolo__coll_shm_crowded(m, g)
                              ? KOLO_MIN((size_t)n * EXCHANGE_SHM_BLOCK, EXCHANGE_SHM_MAX)
                              : EXCHANGE_MAX;
    if (n >= 3 && n <= EXCHANGE_MEMBERS && total * es <= exchange_max)
        return reducescatter_exchange(m, g, send, recv, offs, counts, total, dtype, op, pre, post);
    /* The ring accumulates the blocks it passes on in a full-size work buffer (so does a
     * prescaled contribution); the last step reduces this member's block straight into recv.
     * With 2 members that step is the only one, and no work buffer is needed. Perf of the block
     * reduced into the work buffer and copied out (2 ranks, 1 MiB, single-copy pinned): user-space
     * copies 21 % of the samples, the reduction 24 %. Launches alternated with that build on an
     * Intel Xeon VM, 2 ranks over shared memory (8 pairs): 64 KiB 0.79x the time, 1 MiB 0.69x, 16
     * MiB 0.58x, 64 MiB 0.65x; over TCP (5 pairs) 64 KiB 0.96x, 1 MiB 0.85x, 64 MiB 0.66x; 4 ranks
     * on 2 vCPUs (the ring from 4 MiB) 16 and 64 MiB 0.82x. A recv that overlaps send (the API
     * says "not in place" but refuses only recv == send) keeps the copy at the end, after the
     * peers have read what they read from send. */
    char *out = counts[r] && kolo__coll_apart(recv, counts[r] * es, send, total * es) ? recv : NULL;
    char *work = NULL;
    if (n > 2 || pre != 1.0 || !out) {
        work = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, total * es);
        if (!work) return KOLO_ERR_NO_MEMORY;
    }
    const char *src = send;
    if (pre != 1.0) {
        kolo__scale(work, send, total, dtype, pre);
        src = work;
    }
    kolo__pair_ticket pt; /* with 2 members, both directions go one way (coll_util.c, "pair") */
    kolo__pair_begin(m, g, KOLO_PAIR_RS, total * es, &pt);
    int st = kolo__ring_reduce_scatter(m, g, src, work, out, offs, counts, dtype, op, 0, true, post);
    kolo__pair_end(m, &pt, st, "reducescatter");
    if (st != KOLO_OK) return st;
    if (counts[r] && !out) kolo__copy(recv, work + offs[r] * es, counts[r] * es);
    return KOLO_OK;
}

/* kolo__coll_reducescatter with offs[] (n members) to fill */
static int reducescatter(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                         kolo_dtype_t dtype, kolo_op_t op, double pre, double post, size_t *offs)
{
    int n = g->size;
    size_t es = kolo_dtype_size(dtype);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = total;
        total += counts[i];
    }
    if (n == 1) return kolo__coll_allreduce(m, g, send, recv, counts[0], dtype, op, pre, post);
    /* spread over hosts: maybe within each host first, then across (hier.c) */
    int h = kolo__coll_hier_reducescatter(m, g, send, recv, counts, dtype, op, pre, post);
    if (h != KOLO_HIER_DECLINED) return h;
    rs_ticket t = {0, 0, RS_RING};
    if (rs_direct_here(m, g, total * es)) {
        int st = reducescatter_direct(m, g, send, recv, offs, counts, total, dtype, op, pre, post, &t);
        if (st != KOLO_DIRECT_DECLINED) return st;
    }
    int st = reducescatter_moving(m, g, send, recv, offs, counts, total, dtype, op, pre, post);
    rs_done(m, &t, st);
    return st;
}

int kolo__coll_reducescatter(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                             const size_t *counts, kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    size_t own[KOLO_STACK_MEMBERS], *offs = kolo__coll_members(own, g->size, sizeof(size_t));
    if (!offs) return KOLO_ERR_NO_MEMORY;
    int st = reducescatter(m, g, send, recv, counts, dtype, op, pre, post, offs);
    kolo__coll_members_free(offs, own);
    return st;
}
