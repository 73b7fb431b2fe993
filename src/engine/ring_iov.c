/* ring_iov.c - the ring allreduce over a list of buffers, so that fusion needs no copies.
 *
 * The buffers (segments) are the consecutive parts of one virtual buffer of `total` elements.
 * It is split into n blocks exactly as kolo__coll_allreduce splits a buffer of that size (n
 * near-equal blocks in member order), and the ring runs as in src/coll/ring.c: n-1
 * reduce-scatter steps, in which member i sends block i-s-1 and combines block i-s-2 into its
 * own copy, then member i scales the block it owns, then n-1 allgather steps passing reduced
 * blocks along. Every element is combined along the same chain of members as in the contiguous
 * ring, so the results are the same bits.
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

/* the phases iov_ring runs */
enum { RS = 1, AG = 2 };

static int iov_ring(kolo__mesh *m, const kolo__group *g, kolo__seg *segs, int nseg, kolo_dtype_t dtype, kolo_op_t op,
                    double pre, double post, void *scratch, size_t scratch_len, int phases)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    size_t *start = kolo__malloc(((size_t)nseg + 1) * sizeof(size_t) + 2 * (size_t)n * sizeof(size_t));
    if (!start) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    size_t *off = start + nseg + 1, *cnt = off + n, total = 0;
    for (int i = 0; i < nseg; i++) {
        start[i] = total;
        total += segs[i].count;
        if (pre != 1.0 && (phases & RS)) { /* scaled contributions go to dst, which is then the source */
            kolo__scale(segs[i].dst, segs[i].src, segs[i].count, dtype, pre);
            segs[i].src = segs[i].dst;
        }
    }
    start[nseg] = total;
    int st = KOLO_OK;
    if (n == 1) {
        for (int i = 0; i < nseg; i++) {
            if (segs[i].src != segs[i].dst && segs[i].count) kolo__copy(segs[i].dst, segs[i].src, segs[i].count * es);
            kolo__coll_finish_scale(segs[i].dst, segs[i].count, dtype, op, post, 1);
        }
        goto out;
    }
    size_t base = total / (size_t)n, extra = total % (size_t)n, o = 0;
    for (int i = 0; i < n; i++) {
        cnt[i] = base + ((size_t)i < extra);
        off[i] = o;
        o += cnt[i];
    }
    size_t chunk = kolo__ring_chunk_elems(total, n, es);
    if (scratch_len < kolo__iov_scratch(m, total, n, es)) { /* slots for the steps and the fused step */
        st = kolo__err(KOLO_ERR_INTERNAL, "fused allreduce: %zu bytes of scratch, %zu needed", scratch_len,
                       kolo__iov_scratch(m, total, n, es));
        goto out;
    }
    char *slots = scratch;
    bool stream = total * es >= kolo__coll_stream_min(m); /* written around the cache, as src/coll/ring.c */
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    sender snd;
    snd.m = m;
    snd.to = right;
    snd.es = es;
    /* the last reduce-scatter step and the first allgather step as one (kolo__ring_fused_step)
     * when streaming, as src/coll/ring.c does */
    int fuse = stream && kolo__ring_fusing() && phases == (RS | AG);
    /* reduce-scatter */
    for (int s = 0; s < n - 1 - fuse && (phases & RS) && !st; s++) {
        int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
        snd.posted = snd.done = 0;
        snd.from_src = s == 0;
        kolo__walk_init(&snd.w, segs, start, off[sb], off[sb] + cnt[sb], chunk);
        if ((st = pump(&snd))) break;
        kolo__walker rw;
        kolo__walk_init(&rw, segs, start, off[rb], off[rb] + cnt[rb], chunk);
        kolo__xfer rx[2];
        int rseg[2];
        size_t roff[2], rlen[2];
        int posted = 0, done = 0;
        while (posted < 2 && kolo__walk_next(&rw, &rseg[posted], &roff[posted], &rlen[posted])) {
            kolo__irecv(m, left, slots + (size_t)posted * chunk * es, rlen[posted] * es, &rx[posted]);
            posted++;
        }
        while (done < posted && !st) {
            int k = done % 2;
            if ((st = kolo__wait1(m, &rx[k]))) break;
            const kolo__seg *gs = &segs[rseg[k]];
            char *slot = slots + (size_t)k * chunk * es;
            if (stream) { /* reduced in the slot, in cache, then written out around it */
                kolo__coll_reduce_out(gs->dst + roff[k] * es, slot, gs->src + roff[k] * es, slot, rlen[k] * es, dtype,
                                      op, false, 1.0, 1);
            } else {
                kolo__reduce(gs->dst + roff[k] * es, gs->src + roff[k] * es, slot, rlen[k], dtype, op);
            }
            done++;
            if (kolo__walk_next(&rw, &rseg[k], &roff[k], &rlen[k])) {
                kolo__irecv(m, left, slots + (size_t)k * chunk * es, rlen[k] * es, &rx[k]);
                posted++;
            }
            st = pump(&snd);
        }
        if (stream) kolo__stream_fence(); /* the next step sends this block, perhaps single-copy */
        if (!st) st = drain(&snd);
    }
    if (st) goto out;
    if (fuse) {
        st = kolo__ring_fused_step(m, g, segs, start, off, cnt, chunk, dtype, op, post, slots);
    } else if (phases & RS) { /* the block this member owns is complete: apply the final scaling to it */
        kolo__walker w;
        kolo__walk_init(&w, segs, start, off[r], off[r] + cnt[r], (size_t)-1);
        int seg;
        size_t po, pl;
        while (kolo__walk_next(&w, &seg, &po, &pl))
            kolo__coll_finish_scale(segs[seg].dst + po * es, pl, dtype, op, post, n);
    }
    /* allgather: reduced blocks travel in place */
    for (int s = fuse; s < n - 1 && (phases & AG) && !st; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        snd.posted = snd.done = 0;
        snd.from_src = false;
        kolo__walk_init(&snd.w, segs, start, off[sb], off[sb] + cnt[sb], chunk);
        if ((st = pump(&snd))) break;
        kolo__walker rw;
        kolo__walk_init(&rw, segs, start, off[rb], off[rb] + cnt[rb], chunk);
        kolo__xfer rx[WINDOW];
        kolo__xfer *ptrs[2 * WINDOW];
        int posted = 0, done = 0, seg;
        size_t po, pl;
        bool more = true;
        while (!st) {
            while (more && posted - done < WINDOW) {
                if (!(more = kolo__walk_next(&rw, &seg, &po, &pl))) break;
                kolo__irecv(m, left, segs[seg].dst + po * es, pl * es, &rx[posted % WINDOW]);
                rx[posted % WINDOW].stream = stream;
                posted++;
            }
            if (done == posted) break;
            if (!more && snd.w.pos >= snd.w.end) {
                /* everything is posted: one wait for all of it, as src/coll/ring.c does */
                int k = 0;
                for (int i = done; i < posted; i++) ptrs[k++] = &rx[i % WINDOW];
                for (int i = snd.done; i < snd.posted; i++) ptrs[k++] = &snd.x[i % WINDOW];
                st = kolo__wait(m, ptrs, k);
                done = posted;
                snd.done = snd.posted;
                break;
            }
            if ((st = kolo__wait1(m, &rx[done % WINDOW]))) break;
            done++;
            st = pump(&snd);
        }
        if (!st) st = drain(&snd);
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
    size_t es = kolo_dtype_size(dtype), total = 0;
    size_t *start = kolo__malloc(((size_t)nseg + 1) * sizeof(size_t));
    kolo__seg *mine = kolo__malloc((size_t)nseg * sizeof(kolo__seg));
    if (!start || !mine) {
        kolo__free(start);
        kolo__free(mine);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    }
    for (int i = 0; i < nseg; i++) {
        start[i] = total;
        total += segs[i].count;
    }
    start[nseg] = total;
    int st = iov_ring(m, lg, segs, nseg, dtype, sum, pre, 1.0, scratch, scratch_len, RS);
    /* this member's block of the host's sum, as iov_ring split the list among the L members */
    size_t L = (size_t)lg->size, r = (size_t)lg->rank, base = total / L, extra = total % L;
    size_t from = r * base + KOLO_MIN(r, extra), to = from + base + (r < extra);
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
