/* ring_iov.c - the ring allreduce over a list of buffers, so that fusion needs no copies (and,
 * at the end, the same list in the hierarchical allreduce's three stages or by recursive halving).
 *
 * The buffers (segments) are the consecutive parts of one virtual buffer of `total` elements.
 * It is split into n blocks exactly as kolo__coll_allreduce splits a buffer of that size (n
 * near-equal blocks in member order), and the ring runs as in src/coll/ring.c: n-1
 * reduce-scatter steps, in which member i sends block i-s-1 and combines block i-s-2 into its
 * own copy (the last step, combining the block it owns, scales it too), then n-1 allgather steps
 * passing reduced blocks along. Every element is combined along the same chain of members as in
 * the contiguous ring, so the results are the same bits.
 *
 * Messages: a block travels as pieces (kolo__walker, coll.h), each inside one segment and at most
 * KOLO_RING_CHUNK bytes. Sender and receiver cut a block into the same pieces, because the
 * segments' lengths are part of the negotiated response (the same on every member; a member
 * without data for a segment, e.g. a joined one, points it at zeros of the same length). At most
 * WINDOW sends are in flight; received reduce-scatter pieces land in two alternating slots and are
 * combined as the next one arrives; allgather pieces land in place. From m->stream_min bytes the
 * blocks are written around the cache and the last reduce-scatter step is fused with the first
 * allgather step by the contiguous ring's own kolo__ring_fused_step (src/coll/ring.c), which cuts
 * pieces the same way (a plain buffer is one segment to it). Measured call by call against the
 * phases one after the other (kolo__ring_test_unfused), 2 ranks, ring forced, a group of 40
 * tensors: one CCD 16 MiB 1.09x, 24 MiB 1.10x, 32 MiB 1.03x, 64 MiB 1.03x (8-11 launches of 12
 * pairs); two CCDs 1.17x, 1.19x, 1.05x, 1.04x (4-5 launches). Pieces of at most KOLO_RING_CHUNK in
 * the fused step (W = 4 slots where the ring's pieces are larger) measured the same within noise. */
#include "ring_iov.h"

#include "../reduce/reduce.h"

#define WINDOW KOLO_RING_PIECES

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* Sends in flight, oldest first: reaps the finished ones, posts more from the walker. */
typedef struct sender {
    kolo__mesh *m;
    int to;
    kolo__xfer x[WINDOW];
    int posted, done;
    kolo__walker w;
    bool from_src; /* reduce-scatter step 0 sends the members' own contributions */
    size_t es;
} sender;

static int pump(sender *s)
{
    while (s->done < s->posted && s->x[s->done % WINDOW].status <= 0) {
        if (s->x[s->done % WINDOW].status < 0) return s->x[s->done % WINDOW].status;
        s->done++;
    }
    int seg;
    size_t off, len;
    while (s->posted - s->done < WINDOW && kolo__walk_next(&s->w, &seg, &off, &len)) {
        const kolo__seg *g = &s->w.segs[seg];
        const char *p = (s->from_src ? g->src : g->dst) + off * s->es;
        kolo__isend(s->m, s->to, p, len * s->es, &s->x[s->posted % WINDOW]);
        s->posted++;
    }
    return KOLO_OK;
}

/* Waits until every send of the step has gone. */
static int drain(sender *s)
{
    for (;;) {
        int st = pump(s);
        if (st) return st;
        if (s->done == s->posted) return KOLO_OK;
        kolo__xfer *ptrs[WINDOW];
        int k = 0;
        for (int i = s->done; i < s->posted; i++) ptrs[k++] = &s->x[i % WINDOW];
        if ((st = kolo__wait(s->m, ptrs, k))) return st;
        s->done = s->posted;
    }
}

size_t kolo__iov_scratch(const kolo__mesh *m, size_t total, int n, size_t es)
{
    size_t chunk = kolo__ring_chunk_elems(total, n, es) * es;
    /* from the stream size the fused step takes W receive and W send slots */
    return 2 * chunk * (size_t)(total * es >= kolo__coll_stream_min(m) ? kolo__fused_slots(chunk) : 1);
}

/* What one exchange over the list needs besides its ranges: the list, the piece size, the
 * reduction and two receive slots of `chunk` elements. */
typedef struct iov_ctx {
    kolo__mesh *m;
    const kolo__seg *segs;
    const size_t *start;
    size_t chunk, es;
    kolo_dtype_t dtype;
    kolo_op_t op;
    bool stream; /* reduced pieces written around the cache, received ones too (src/coll/ring.c) */
    char *slots;
} iov_ctx;

/* The sends of [sa, sb) to `to` begin (from the segments' src when from_src, else their dst). */
static int send_range(const iov_ctx *c, sender *snd, int to, size_t sa, size_t sb, bool from_src)
{
    snd->m = c->m; /* the transfers' slots are left as they are: pump posts into them */
    snd->to = to;
    snd->posted = snd->done = 0;
    snd->from_src = from_src;
    snd->es = c->es;
    kolo__walk_init(&snd->w, c->segs, c->start, sa, sb, c->chunk);
    return pump(snd);
}

/* The final scaling of a range: post, and AVERAGE's 1/n. */
typedef struct finish {
    double post;
    int n;
} finish;

/* While snd's sends go, [ra, rb) arrives from `from` piece by piece into the two slots, each
 * combined as the next arrives into dst with this member's part of it (in src when own_src,
 * else already in dst): theirs OP mine when theirs_first, else mine OP theirs; finished as it is
 * combined when `fin` is given (the range's last combination). */
static int recv_reduce(const iov_ctx *c, sender *snd, int from, size_t ra, size_t rb, bool own_src, bool theirs_first,
                       const finish *fin)
{
    size_t es = c->es;
    kolo__walker rw;
    kolo__walk_init(&rw, c->segs, c->start, ra, rb, c->chunk);
    kolo__xfer rx[2];
    int rseg[2], st = KOLO_OK;
    size_t roff[2], rlen[2];
    int posted = 0, done = 0;
    while (posted < 2 && kolo__walk_next(&rw, &rseg[posted], &roff[posted], &rlen[posted])) {
        kolo__irecv(c->m, from, c->slots + (size_t)posted * c->chunk * es, rlen[posted] * es, &rx[posted]);
        posted++;
    }
    while (done < posted && !st) {
        int k = done % 2;
        if ((st = kolo__wait1(c->m, &rx[k]))) break;
        const kolo__seg *gs = &c->segs[rseg[k]];
        char *slot = c->slots + (size_t)k * c->chunk * es, *dst = gs->dst + roff[k] * es;
        const char *mine = (own_src ? gs->src : gs->dst) + roff[k] * es;
        const char *a = theirs_first ? slot : mine, *b = theirs_first ? mine : slot;
        if (c->stream) /* reduced in the slot, in cache, then written out around it */
            kolo__coll_reduce_out(dst, slot, a, b, rlen[k] * es, c->dtype, c->op, fin, fin ? fin->post : 1.0,
                                  fin ? fin->n : 1);
        else if (fin)
            kolo__coll_reduce_finish(dst, a, b, rlen[k], c->dtype, c->op, fin->post, fin->n);
        else
            kolo__reduce(dst, a, b, rlen[k], c->dtype, c->op);
        done++;
        if (kolo__walk_next(&rw, &rseg[k], &roff[k], &rlen[k])) {
            kolo__irecv(c->m, from, slot, rlen[k] * es, &rx[k]);
            posted++;
        }
        st = pump(snd);
    }
    if (c->stream) kolo__stream_fence(); /* the next step may send these pieces, perhaps single-copy */
    if (!st) st = drain(snd);
    return st;
}

/* While snd's sends go, [ra, rb) arrives from `from` in place, in dst. */
static int recv_place(const iov_ctx *c, sender *snd, int from, size_t ra, size_t rb)
{
    kolo__walker rw;
    kolo__walk_init(&rw, c->segs, c->start, ra, rb, c->chunk);
    kolo__xfer rx[WINDOW];
    kolo__xfer *ptrs[2 * WINDOW];
    int posted = 0, done = 0, seg, st = KOLO_OK;
    size_t po, pl;
    bool more = true;
    while (!st) {
        while (more && posted - done < WINDOW) {
            if (!(more = kolo__walk_next(&rw, &seg, &po, &pl))) break;
            kolo__irecv(c->m, from, c->segs[seg].dst + po * c->es, pl * c->es, &rx[posted % WINDOW]);
            rx[posted % WINDOW].stream = c->stream;
            posted++;
        }
        if (done == posted) break;
        if (!more && snd->w.pos >= snd->w.end) {
            /* everything is posted: one wait for all of it, as src/coll/ring.c does */
            int k = 0;
            for (int i = done; i < posted; i++) ptrs[k++] = &rx[i % WINDOW];
            for (int i = snd->done; i < snd->posted; i++) ptrs[k++] = &snd->x[i % WINDOW];
            st = kolo__wait(c->m, ptrs, k);
            snd->done = snd->posted;
            break;
        }
        if ((st = kolo__wait1(c->m, &rx[done % WINDOW]))) break;
        done++;
        st = pump(snd);
    }
    if (!st) st = drain(snd);
    return st;
}

/* start[i]: the first element of segment i, start[nseg] the total (kolo__walker); segs[].src
 * set to dst after scaling the contributions there when pre != 1. NULL without memory. */
static size_t *list_start(kolo__seg *segs, int nseg, kolo_dtype_t dtype, double pre, size_t extra_words)
{
    size_t *start = kolo__malloc(((size_t)nseg + 1 + extra_words) * sizeof(size_t)), total = 0;
    if (!start) return NULL;
    for (int i = 0; i < nseg; i++) {
        start[i] = total;
        total += segs[i].count;
        if (pre != 1.0) {
            kolo__scale(segs[i].dst, segs[i].src, segs[i].count, dtype, pre);
            segs[i].src = segs[i].dst;
        }
    }
    start[nseg] = total;
    return start;
}

/* the phases iov_ring runs */
enum { RS = 1, AG = 2 };

static int iov_ring(kolo__mesh *m, const kolo__group *g, kolo__seg *segs, int nseg, kolo_dtype_t dtype, kolo_op_t op,
                    double pre, double post, void *scratch, size_t scratch_len, int phases)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    size_t *start = list_start(segs, nseg, dtype, (phases & RS) ? pre : 1.0, 2 * (size_t)n);
    if (!start) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    size_t *off = start + nseg + 1, *cnt = off + n, total = start[nseg];
    int st = KOLO_OK;
    if (n == 1) {
        for (int i = 0; i < nseg; i++) {
            if (segs[i].src != segs[i].dst && segs[i].count) kolo__copy(segs[i].dst, segs[i].src, segs[i].count * es);
            kolo__coll_finish_scale(segs[i].dst, segs[i].count, dtype, op, post, 1);
        }
        goto out;
    }
    kolo__coll_blocks(total, n, off, cnt);
    size_t chunk = kolo__ring_chunk_elems(total, n, es);
    if (scratch_len < kolo__iov_scratch(m, total, n, es)) { /* slots for the steps and the fused step */
        st = kolo__err(KOLO_ERR_INTERNAL, "fused allreduce: %zu bytes of scratch, %zu needed", scratch_len,
                       kolo__iov_scratch(m, total, n, es));
        goto out;
    }
    iov_ctx c = {m, segs, start, chunk, es, dtype, op, total * es >= kolo__coll_stream_min(m), scratch};
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    sender snd;
    /* the last reduce-scatter step and the first allgather step as one (kolo__ring_fused_step)
     * when streaming, as src/coll/ring.c does */
    int fuse = c.stream && kolo__ring_fusing() && phases == (RS | AG);
    /* reduce-scatter: step s sends block r-s-1 (the own contributions at step 0) and combines
     * block r-s-2, never touched before, with the own contribution to it */
    const finish fin = {post, n}; /* for the block this member owns, with its last combination */
    for (int s = 0; s < n - 1 - fuse && (phases & RS) && !st; s++) {
        int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
        if (!(st = send_range(&c, &snd, right, off[sb], off[sb] + cnt[sb], s == 0)))
            st = recv_reduce(&c, &snd, left, off[rb], off[rb] + cnt[rb], true, false, s == n - 2 ? &fin : NULL);
    }
    if (st) goto out;
    if (fuse) st = kolo__ring_fused_step(m, g, segs, start, nseg, off, cnt, chunk, dtype, op, post, scratch);
    /* allgather: reduced blocks travel in place */
    for (int s = fuse; s < n - 1 && (phases & AG) && !st; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        if (!(st = send_range(&c, &snd, right, off[sb], off[sb] + cnt[sb], false)))
            st = recv_place(&c, &snd, left, off[rb], off[rb] + cnt[rb]);
    }
out:
    kolo__free(start);
    return st;
}

int kolo__iov_allreduce(kolo__mesh *m, const kolo__group *g, kolo__seg *segs, int nseg, kolo_dtype_t dtype,
                        kolo_op_t op, double pre, double post, void *scratch, size_t scratch_len)
{
    return iov_ring(m, g, segs, nseg, dtype, op, pre, post, scratch, scratch_len, RS | AG);
}

/* ---- across hosts in three stages (coll/hier.c), over the list ----
 *
 * The reduce-scatter of the list within each host (the ring's first half, on the host's members'
 * blocks), the allreduce of this member's block, as a list of its own pieces of the segments,
 * among the members of its local index on every host, then the allgather within each host (the
 * ring's second half): coll/hier.c's stages without copying the list into the fusion buffer,
 * whose two copies of every tensor took back what the network saved: engine-bench's ResNet-50
 * step (102 MB of gradients), 4 ranks as 2 hosts of 2 in network namespaces over a veth shaped
 * to 10 Gbit/s, 3 launches each way: through the fusion buffer 240-248 ms a step against the
 * flat ring's 248-257, where one allreduce of the same bytes took 195-202 against 221-235; over
 * the list 170-179 ms against the flat ring's 231-239 (0.74-0.77x); the veth not shaped,
 * 149-155 against 163-193. */
size_t kolo__iov_hier_scratch(const kolo__mesh *m, int local, int hosts, size_t total, size_t es)
{
    size_t a = kolo__iov_scratch(m, total, local, es), b = kolo__iov_scratch(m, total / (size_t)local + 1, hosts, es);
    return KOLO_MAX(a, b);
}

int kolo__iov_hier_allreduce(kolo__mesh *m, const kolo__group *g, const kolo__group *lg, const kolo__group *xg,
                             kolo__seg *segs, int nseg, kolo_dtype_t dtype, kolo_op_t op, double pre, double post,
                             void *scratch, size_t scratch_len)
{
    kolo_op_t sum = op == KOLO_AVERAGE ? KOLO_SUM : op;
    size_t es = kolo_dtype_size(dtype);
    size_t *start = list_start(segs, nseg, dtype, 1.0, 0), total = start ? start[nseg] : 0;
    kolo__seg *mine = kolo__malloc((size_t)nseg * sizeof(kolo__seg));
    if (!start || !mine) {
        kolo__free(start);
        kolo__free(mine);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    }
    int st = iov_ring(m, lg, segs, nseg, dtype, sum, pre, 1.0, scratch, scratch_len, RS);
    /* this member's block of the host's sum, as iov_ring split the list among the host's members */
    size_t from, len = kolo__coll_block(total, lg->size, lg->rank, &from);
    size_t to = from + len;
    kolo__walker w;
    kolo__walk_init(&w, segs, start, from, to, (size_t)-1);
    int nmine = 0, seg;
    size_t po, pl;
    while (kolo__walk_next(&w, &seg, &po, &pl)) {
        char *p = segs[seg].dst + po * es;
        mine[nmine++] = (kolo__seg){p, p, pl};
    }
    if (st == KOLO_OK && nmine)
        st = iov_ring(m, xg, mine, nmine, dtype, sum, 1.0, 1.0, scratch, scratch_len, RS | AG);
    for (int i = 0; i < nmine && st == KOLO_OK; i++)
        kolo__coll_finish_scale(mine[i].dst, mine[i].count, dtype, op, post, g->size);
    if (st == KOLO_OK) st = iov_ring(m, lg, segs, nseg, dtype, sum, 1.0, 1.0, scratch, scratch_len, AG);
    if (st == KOLO_OK) kolo__coll_hier_ran();
    kolo__free(start);
    kolo__free(mine);
    return st;
}

/* ---- across hosts by recursive halving and doubling (src/coll/allreduce.c), over the list ----
 *
 * The rounds of kolo__coll_allreduce's allreduce_halving, each an exchange of element ranges of
 * the list with the partner (the halves split at the same elements, the lower member's part
 * first in every combination, each part finished by one member): the same results, to the bit,
 * as the contiguous algorithm on the list's concatenation. It runs where that would: buckets
 * across hosts that the three stages do not take (hosts holding different numbers of members,
 * KOLO_HIERARCHICAL_ALLREDUCE=0). engine-bench's ResNet-50 step (102 MB in 161 tensors), network
 * namespaces joined by a veth shaped to 10 Gbit/s, 3 launches alternated with the ring over the
 * list, each step's time its slowest rank's: 2 hosts of 2 with the stages off 168-176 ms against
 * 198-202 (one allreduce of the same bytes 162-170), 3 ranks on one host and 1 on the other
 * 215-222 against 247-261 (205-206); at 2 Gbit/s 2 hosts of 2 504 against 660. */
int kolo__iov_halving_allreduce(kolo__mesh *m, const kolo__group *g, const int *order, kolo__seg *segs, int nseg,
                                kolo_dtype_t dtype, kolo_op_t op, double pre, double post, void *scratch,
                                size_t scratch_len)
{
    int n = g->size;
    size_t es = kolo_dtype_size(dtype);
    size_t *start = list_start(segs, nseg, dtype, pre, 0);
    if (!start) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    size_t total = start[nseg];
    int st = KOLO_OK;
    if (scratch_len < kolo__iov_scratch(m, total, n, es)) {
        st = kolo__err(KOLO_ERR_INTERNAL, "fused allreduce: %zu bytes of scratch, %zu needed", scratch_len,
                       kolo__iov_scratch(m, total, n, es));
        goto out;
    }
    kolo__coll_halving_ran();
    iov_ctx c = {m,  segs, start, kolo__ring_chunk_elems(total, n, es), es, dtype, op,
                 total * es >= kolo__coll_stream_min(m), scratch};
    kolo__halving_plan hp;
    kolo__coll_halving_plan(g, order, total, &hp);
    sender snd;
    int ho = hp.handover >= 0 ? kolo__g2w(g, hp.handover) : -1;
    if (ho >= 0 && hp.gives) {
        if (!(st = send_range(&c, &snd, ho, 0, total, true))) st = drain(&snd);
    } else if (ho >= 0 && !(st = send_range(&c, &snd, ho, 0, 0, false))) {
        st = recv_reduce(&c, &snd, ho, 0, total, true, true, NULL); /* lower member first */
    }
    bool own_src = ho < 0; /* this member's contributions are still where the caller put them */
    const finish fin = {post, n}; /* the part this member keeps, with the last round */
    for (int k = 0; k < hp.rounds && !st; k++, own_src = false) {
        const kolo__halving_round *r = &hp.r[k];
        int partner = kolo__g2w(g, r->partner);
        if (!(st = send_range(&c, &snd, partner, r->send_lo, r->send_hi, own_src)))
            st = recv_reduce(&c, &snd, partner, r->keep_lo, r->keep_hi, own_src, !r->low,
                             k == hp.rounds - 1 ? &fin : NULL);
    }
    /* backwards: the part this member finished for the partner's */
    for (int k = hp.rounds - 1; k >= 0 && !st; k--) {
        const kolo__halving_round *r = &hp.r[k];
        int partner = kolo__g2w(g, r->partner);
        if (!(st = send_range(&c, &snd, partner, r->keep_lo, r->keep_hi, false)))
            st = recv_place(&c, &snd, partner, r->send_lo, r->send_hi);
    }
    if (ho >= 0 && hp.gives && !st && !(st = send_range(&c, &snd, ho, 0, 0, false))) {
        st = recv_place(&c, &snd, ho, 0, total);
    } else if (ho >= 0 && !hp.gives && !st && !(st = send_range(&c, &snd, ho, 0, total, false))) {
        st = drain(&snd);
    }
out:
    kolo__free(start);
    return st;
}
