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
 * Messages: a block travels as pieces, each inside one segment and at most KOLO_RING_CHUNK
 * bytes. Sender and receiver cut a block into the same pieces, because the segments' lengths
 * are part of the negotiated response (the same on every member; a member without data for a
 * segment, e.g. a joined one, points it at zeros of the same length). At most WINDOW sends are
 * in flight; received reduce-scatter pieces land in two alternating slots and are combined as
 * the next one arrives; allgather pieces land in place. From KOLO_STREAM_MIN bytes the blocks are
 * written around the cache and the last reduce-scatter step is fused with the first allgather
 * step (fused_step), as in src/coll/ring.c. Measured call by call against the phases one after
 * the other (kolo__ring_test_unfused), 2 ranks, ring forced, a group of 40 tensors: one CCD
 * 16 MiB 1.09x, 24 MiB 1.10x, 32 MiB 1.03x, 64 MiB 1.03x (8-11 launches of 12 pairs); two CCDs
 * 1.17x, 1.19x, 1.05x, 1.04x (4-5 launches). Pieces of at most KOLO_RING_CHUNK in the fused step
 * (W = 4 slots where the ring's pieces are larger) measured the same within noise. */
#include "ring_iov.h"

#include "../reduce/reduce.h"

#define WINDOW 64

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* Walks the pieces of the element range [pos, end). */
typedef struct walker {
    const kolo__seg *segs;
    const size_t *start; /* start[i]: first element of segment i; start[nseg] = total */
    int nseg, seg;
    size_t pos, end, chunk;
} walker;

static void walk_init(walker *w, const kolo__seg *segs, const size_t *start, int nseg, size_t pos, size_t end,
                      size_t chunk)
{
    w->segs = segs;
    w->start = start;
    w->nseg = nseg;
    w->seg = 0;
    w->pos = pos;
    w->end = end;
    w->chunk = chunk;
}

/* The next piece: segment, offset inside it and length, in elements. */
static bool walk_next(walker *w, int *seg, size_t *off, size_t *len)
{
    if (w->pos >= w->end) return false;
    while (w->start[w->seg + 1] <= w->pos) w->seg++;
    size_t n = KOLO_MIN(w->chunk, w->end - w->pos);
    n = KOLO_MIN(n, w->start[w->seg + 1] - w->pos);
    *seg = w->seg;
    *off = w->pos - w->start[w->seg];
    *len = n;
    w->pos += n;
    return true;
}

/* Sends in flight, oldest first: reaps the finished ones, posts more from the walker. */
typedef struct sender {
    kolo__mesh *m;
    int to;
    kolo__xfer x[WINDOW];
    int posted, done;
    walker w;
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
    while (s->posted - s->done < WINDOW && walk_next(&s->w, &seg, &off, &len)) {
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

static size_t chunk_elems(size_t total, int n, size_t es)
{
    size_t block = (total + (size_t)n - 1) / (size_t)n;
    size_t chunk = KOLO_MAX(kolo__coll_chunk() / es, (block + WINDOW - 1) / WINDOW);
    return chunk ? chunk : 1;
}

size_t kolo__iov_scratch(size_t total, int n, size_t es)
{
    size_t chunk = chunk_elems(total, n, es) * es;
    /* from KOLO_STREAM_MIN the fused step takes W receive and W send slots */
    return 2 * chunk * (size_t)(total * es >= KOLO_STREAM_MIN ? kolo__fused_slots(chunk) : 1);
}

/* A piece of a block, as the walker cuts it, in bytes. */
typedef struct piece {
    const char *src;
    char *dst;
    size_t len;
} piece;

/* The pieces of elements [pos, end) into p (NULL: only counted); returns how many. */
static int cut(const kolo__seg *segs, const size_t *start, int nseg, size_t pos, size_t end, size_t chunk,
               size_t es, piece *p)
{
    walker w;
    int seg, k = 0;
    size_t o, len;
    walk_init(&w, segs, start, nseg, pos, end, chunk);
    while (walk_next(&w, &seg, &o, &len)) {
        if (p) p[k] = (piece){segs[seg].src + o * es, segs[seg].dst + o * es, len * es};
        k++;
    }
    return k;
}

/* The last reduce-scatter step and the first allgather step as one, as in src/coll/ring.c (its
 * fused_step has the schedule and why it cannot deadlock): each piece of this member's block is
 * reduced into a send slot, scaled, written out around the cache and sent on to the right from
 * the slot, instead of the block being written out and read back. On the link to the right:
 * reduce-scatter pieces 0..W-1, then for t = 0, 1, ...: allgather piece t, reduce-scatter piece
 * t + W; the receiving end posts in that order too. Pieces are cut the same on both ends (the
 * segments' lengths are the same everywhere), so the two lists match one to one. */
static int fused_step(kolo__mesh *m, const kolo__group *g, const kolo__seg *segs, const size_t *start, int nseg,
                      const size_t *off, const size_t *cnt, size_t chunk, kolo_dtype_t dtype, kolo_op_t op,
                      double post, char *slots)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    int sb = mod(r + 1, n), lb = mod(r - 1, n); /* the right's block (sent to be finished), the left's */
    bool from_src = n == 2;                      /* step n - 2 = 0 sends the members' own contributions */
    int nR = cut(segs, start, nseg, off[sb], off[sb] + cnt[sb], chunk, es, NULL);
    int nM = cut(segs, start, nseg, off[r], off[r] + cnt[r], chunk, es, NULL);
    int nL = cut(segs, start, nseg, off[lb], off[lb] + cnt[lb], chunk, es, NULL);
    size_t och = chunk * es;
    int W = kolo__fused_slots(och);
    /* the lists and transfers live in the mesh's scratch, not on the heap for this call alone:
     * a transfer still queued when a failed mesh returns early must not point at freed memory */
    size_t np = (size_t)nR + (size_t)nM + (size_t)nL, nx = np + (size_t)W;
    char *work = kolo__coll_scratch(m, KOLO_SCRATCH_WORK, np * sizeof(piece) + nx * sizeof(kolo__xfer) +
                                                              nx * sizeof(kolo__xfer *));
    if (!work) return KOLO_ERR_NO_MEMORY;
    kolo__xfer *rs_sx = (kolo__xfer *)work, *ag_sx = rs_sx + nR, *ag_rx = ag_sx + nM, *rs_rx = ag_rx + nL;
    kolo__xfer **ptrs = (kolo__xfer **)(rs_rx + W);
    piece *R = (piece *)(ptrs + nx), *M = R + nR, *L = M + nM;
    cut(segs, start, nseg, off[sb], off[sb] + cnt[sb], chunk, es, R);
    cut(segs, start, nseg, off[r], off[r] + cnt[r], chunk, es, M);
    cut(segs, start, nseg, off[lb], off[lb] + cnt[lb], chunk, es, L);
    for (int k = 0; k < W && k < nR; k++) kolo__isend(m, right, from_src ? R[k].src : R[k].dst, R[k].len, &rs_sx[k]);
    for (int k = 0; k < W && k < nM; k++) kolo__irecv(m, left, slots + (size_t)k * och, M[k].len, &rs_rx[k]);
    int T = KOLO_MAX(KOLO_MAX(nM, nL), nR - W);
    for (int t = 0; t < T; t++) {
        if (t < nM) {
            int st = kolo__wait1(m, &rs_rx[t % W]);
            if (st != KOLO_OK) return st;
            char *slot = slots + (size_t)(t % W) * och, *out = slots + (size_t)(W + t % W) * och;
            size_t cnt_t = M[t].len / es;
            /* reduced and scaled into a send slot, in cache, once its last send is done; written
             * out around the cache and sent on from the slot */
            if (t >= W && (st = kolo__wait1(m, &ag_sx[t - W])) != KOLO_OK) return st;
            kolo__reduce(out, M[t].src, slot, cnt_t, dtype, op);
            kolo__coll_finish_scale(out, cnt_t, dtype, op, post, n);
            kolo__stream_copy(M[t].dst, out, M[t].len);
            kolo__isend(m, right, out, M[t].len, &ag_sx[t]);
        }
        if (t + W < nR) {
            const piece *p = &R[t + W];
            kolo__isend(m, right, from_src ? p->src : p->dst, p->len, &rs_sx[t + W]);
        }
        if (t < nL) {
            kolo__irecv(m, left, L[t].dst, L[t].len, &ag_rx[t]);
            ag_rx[t].stream = true;
        }
        if (t + W < nM) kolo__irecv(m, left, slots + (size_t)(t % W) * och, M[t + W].len, &rs_rx[t % W]);
    }
    kolo__stream_fence();
    int k = 0;
    for (int i = 0; i < nR; i++) ptrs[k++] = &rs_sx[i];
    for (int i = 0; i < nM; i++) ptrs[k++] = &ag_sx[i];
    for (int i = 0; i < nL; i++) ptrs[k++] = &ag_rx[i];
    return k ? kolo__wait(m, ptrs, k) : KOLO_OK;
}

int kolo__iov_allreduce(kolo__mesh *m, const kolo__group *g, kolo__seg *segs, int nseg, kolo_dtype_t dtype,
                        kolo_op_t op, double pre, double post, void *scratch, size_t scratch_len)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    size_t *start = kolo__malloc(((size_t)nseg + 1) * sizeof(size_t) + 2 * (size_t)n * sizeof(size_t));
    if (!start) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    size_t *off = start + nseg + 1, *cnt = off + n, total = 0;
    for (int i = 0; i < nseg; i++) {
        start[i] = total;
        total += segs[i].count;
        if (pre != 1.0) { /* scaled contributions go to dst, which is then the source */
            kolo__scale(segs[i].dst, segs[i].src, segs[i].count, dtype, pre);
            segs[i].src = segs[i].dst;
        }
    }
    start[nseg] = total;
    int st = KOLO_OK;
    if (n == 1) {
        for (int i = 0; i < nseg; i++) {
            if (segs[i].src != segs[i].dst && segs[i].count) memcpy(segs[i].dst, segs[i].src, segs[i].count * es);
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
    /* as src/coll/ring.c: KOLO_RING_CHUNK, grown so that a block needs at most WINDOW pieces
     * (plus the segment boundaries inside it) */
    size_t chunk = chunk_elems(total, n, es);
    if (scratch_len < kolo__iov_scratch(total, n, es)) { /* slots for the steps and the fused step */
        st = kolo__err(KOLO_ERR_INTERNAL, "fused allreduce: %zu bytes of scratch, %zu needed", scratch_len,
                       kolo__iov_scratch(total, n, es));
        goto out;
    }
    char *slots = scratch;
    bool stream = total * es >= KOLO_STREAM_MIN; /* written around the cache, as src/coll/ring.c */
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    sender snd;
    snd.m = m;
    snd.to = right;
    snd.es = es;
    /* the last reduce-scatter step and the first allgather step as one (fused_step) when streaming,
     * as src/coll/ring.c does */
    int fuse = stream && kolo__ring_fusing();
    /* reduce-scatter */
    for (int s = 0; s < n - 1 - fuse && !st; s++) {
        int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
        snd.posted = snd.done = 0;
        snd.from_src = s == 0;
        walk_init(&snd.w, segs, start, nseg, off[sb], off[sb] + cnt[sb], chunk);
        if ((st = pump(&snd))) break;
        walker rw;
        walk_init(&rw, segs, start, nseg, off[rb], off[rb] + cnt[rb], chunk);
        kolo__xfer rx[2];
        int rseg[2];
        size_t roff[2], rlen[2];
        int posted = 0, done = 0;
        while (posted < 2 && walk_next(&rw, &rseg[posted], &roff[posted], &rlen[posted])) {
            kolo__irecv(m, left, slots + (size_t)posted * chunk * es, rlen[posted] * es, &rx[posted]);
            posted++;
        }
        while (done < posted && !st) {
            int k = done % 2;
            if ((st = kolo__wait1(m, &rx[k]))) break;
            const kolo__seg *gs = &segs[rseg[k]];
            char *slot = slots + (size_t)k * chunk * es;
            if (stream) { /* reduced in the slot, in cache, then written out around it */
                kolo__reduce(slot, gs->src + roff[k] * es, slot, rlen[k], dtype, op);
                kolo__stream_copy(gs->dst + roff[k] * es, slot, rlen[k] * es);
            } else {
                kolo__reduce(gs->dst + roff[k] * es, gs->src + roff[k] * es, slot, rlen[k], dtype, op);
            }
            done++;
            if (walk_next(&rw, &rseg[k], &roff[k], &rlen[k])) {
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
        st = fused_step(m, g, segs, start, nseg, off, cnt, chunk, dtype, op, post, slots);
    } else { /* the block this member owns is complete: apply the final scaling to it */
        walker w;
        walk_init(&w, segs, start, nseg, off[r], off[r] + cnt[r], (size_t)-1);
        int seg;
        size_t po, pl;
        while (walk_next(&w, &seg, &po, &pl))
            kolo__coll_finish_scale(segs[seg].dst + po * es, pl, dtype, op, post, n);
    }
    /* allgather: reduced blocks travel in place */
    for (int s = fuse; s < n - 1 && !st; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        snd.posted = snd.done = 0;
        snd.from_src = false;
        walk_init(&snd.w, segs, start, nseg, off[sb], off[sb] + cnt[sb], chunk);
        if ((st = pump(&snd))) break;
        walker rw;
        walk_init(&rw, segs, start, nseg, off[rb], off[rb] + cnt[rb], chunk);
        kolo__xfer rx[WINDOW];
        kolo__xfer *ptrs[2 * WINDOW];
        int posted = 0, done = 0, seg;
        size_t po, pl;
        bool more = true;
        while (!st) {
            while (more && posted - done < WINDOW) {
                if (!(more = walk_next(&rw, &seg, &po, &pl))) break;
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
