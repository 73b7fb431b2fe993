/* ring.c - the bandwidth-optimal ring: reduce-scatter and allgather phases with pipelined chunks.
 *
 * n members stand in a ring; member i sends to i+1 and receives from i-1. The buffer is split
 * into n blocks (the caller gives each block's offset and count). Reduce-scatter takes n-1
 * steps: at step s member i sends block (i - s - 1 + shift) and receives block (i - s - 2 +
 * shift), which it combines with its own contribution; after the last step member i holds block
 * (i + shift) fully reduced. Every block is reduced along one path by one chain of members, so
 * the result is bit-identical wherever it ends up. Allgather then takes n-1 steps of passing
 * whole reduced blocks along. Each member sends and receives 2(n-1)/n of the buffer in all,
 * the optimum.
 *
 * Within a step the incoming block arrives as chunks of KOLO_RING_CHUNK bytes into two
 * alternating cache-sized slots: while chunk k is being combined, chunk k+1 is already in
 * flight, so the reduction overlaps the transfer and the slots stay in cache. The outgoing
 * block goes out as chunks too (on shared memory each one is a single-copy read by the peer).
 *
 * When the whole buffer is far larger than the cache (m->stream_min), every byte written to its
 * final place is written with non-temporal stores: the reduced chunk from its slot (a piece at a
 * time as it is reduced, kolo__coll_reduce_out), a received block by the transport
 * (kolo__xfer.stream). A plain store to a line not in cache first reads it, so this drops a read
 * per byte written. Measured on an AMD EPYC VM (32 MiB of L3 per CCD), 2 ranks, allreduce busbw,
 * streamed against plain in the same launches call by call (420+ launches per size with the
 * vCPUs on one CCD, 60+ on two): one CCD 16 MiB 1.10x, 64 MiB 1.23x, but 4 MiB 0.83x (input and
 * output, 8 MiB, fit the 32 MiB L3: the output was still cached, now it is not); two CCDs 0.94x
 * and 0.97x at 16 MiB and 64 MiB (there allreduce reads the others' buffers directly instead,
 * direct.c). Where the last-level cache is larger, the size is too (16 MiB, or an eighth of that
 * cache where that is more: coll_util.c, measured there).
 *
 * An allreduce from that size also fuses the last reduce-scatter step with the first allgather
 * step (kolo__ring_fused_step, below, which the engine's ring over a list of buffers runs too,
 * src/engine/ring_iov.c): each chunk of a member's own block goes on to the right as soon as it
 * is reduced, from a slot still in cache, instead of the block being written out and read back.
 * Measured call by call against the phases one after the other (kolo__ring_test_unfused), 2 ranks,
 * ring copies, 180+ launches of 12 pairs per size: one CCD 16 MiB 1.16x, 64 MiB 1.12x; two CCDs
 * (20+ launches) 1.22x and 1.20x.
 */
#include "coll.h"

#include "../reduce/reduce.h"

#include <stdatomic.h>

#define MAX_INFLIGHT KOLO_RING_PIECES

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* The chunk of a block of `elems` elements, in elements: KOLO_RING_CHUNK, grown so that the block
 * never needs more than KOLO_RING_PIECES (MAX_INFLIGHT) chunks. Sender and receiver of a block
 * compute it from the same numbers, so their messages match one to one. */
static size_t block_chunk(size_t elems, size_t es)
{
    size_t c = KOLO_MAX(kolo__coll_chunk() / es, (elems + KOLO_RING_PIECES - 1) / KOLO_RING_PIECES);
    return c ? c : 1;
}

/* The same for a block of `bytes`, in bytes. */
static size_t ring_chunk(size_t bytes, size_t es) { return block_chunk(bytes / es, es) * es; }

static size_t nchunks(size_t bytes, size_t chunk) { return bytes ? (bytes + chunk - 1) / chunk : 1; }

/* Posts the sends of one block as chunks into xs; returns how many. */
static int post_block_sends(kolo__mesh *m, int to, const char *p, size_t bytes, size_t chunk, kolo__xfer *xs)
{
    int k = 0;
    size_t nc = nchunks(bytes, chunk);
    for (size_t c = 0; c < nc; c++) {
        size_t o = c * chunk;
        kolo__isend(m, to, p + o, KOLO_MIN(chunk, bytes - o), &xs[k++]);
    }
    return k;
}

/* Whether the blocks of a ring over these counts are written around the cache (above). */
static bool streams(const kolo__mesh *m, const size_t *cnt, int n, size_t es)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += cnt[i];
    return total * es >= kolo__coll_stream_min(m);
}

static int wait_sends(kolo__mesh *m, kolo__xfer *xs, int n)
{
    kolo__xfer *ptrs[MAX_INFLIGHT];
    for (int i = 0; i < n; i++) ptrs[i] = &xs[i];
    return kolo__wait(m, ptrs, n);
}

/* Reduce-scatter step s (see the top). The last step's block, this member's own, goes to `out`
 * when that is given, finished when `finish`. */
static int rs_step(kolo__mesh *m, const kolo__group *g, const char *src, char *dst, char *out, const size_t *off,
                   const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, int shift, int s, bool stream, bool finish,
                   double post)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    kolo__xfer sx[MAX_INFLIGHT];
    int sb = mod(r - s - 1 + shift, n), rb = mod(r - s - 2 + shift, n);
    /* step 0 sends this member's own contribution; later steps the block reduced just before */
    const char *sp = (s == 0 ? src : dst) + off[sb] * es;
    size_t sbytes = cnt[sb] * es, rbytes = cnt[rb] * es;
    int ns = post_block_sends(m, right, sp, sbytes, ring_chunk(sbytes, es), sx);
    size_t rch = ring_chunk(rbytes, es);
    /* two receive slots of one chunk each, reused across steps */
    char *slots = kolo__coll_scratch(m, KOLO_SCRATCH_RING, 2 * rch);
    if (!slots) return KOLO_ERR_NO_MEMORY;
    size_t nrc = nchunks(rbytes, rch);
    kolo__xfer rx[2];
    size_t posted = 0;
    for (; posted < nrc && posted < 2; posted++) {
        size_t o = posted * rch;
        kolo__irecv(m, left, slots + (posted % 2) * rch, KOLO_MIN(rch, rbytes - o), &rx[posted % 2]);
    }
    for (size_t c = 0; c < nrc; c++) {
        int st = kolo__wait1(m, &rx[c % 2]);
        if (st != KOLO_OK) return st;
        size_t o = c * rch, len = KOLO_MIN(rch, rbytes - o);
        char *d = (out && s == n - 2 ? out : dst + off[rb] * es) + o;
        const char *mine = src + off[rb] * es + o;
        char *slot = slots + (c % 2) * rch;
        bool fin = finish && s == n - 2;
        if (stream) /* reduced in the slot, in cache, then written out around it */
            kolo__coll_reduce_out(d, slot, mine, slot, len, dtype, op, fin, post, n);
        else if (fin)
            kolo__coll_reduce_finish(d, mine, slot, len / es, dtype, op, post, n);
        else
            kolo__reduce(d, mine, slot, len / es, dtype, op);
        if (posted < nrc) {
            size_t o2 = posted * rch;
            kolo__irecv(m, left, slots + (posted % 2) * rch, KOLO_MIN(rch, rbytes - o2), &rx[posted % 2]);
            posted++;
        }
    }
    if (stream) kolo__stream_fence(); /* the next step sends this block, perhaps single-copy */
    return wait_sends(m, sx, ns);
}

int kolo__ring_reduce_scatter(kolo__mesh *m, const kolo__group *g, const char *src, char *dst, char *out,
                              const size_t *off, const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, int shift,
                              bool finish, double post)
{
    bool stream = streams(m, cnt, g->size, kolo_dtype_size(dtype));
    for (int s = 0; s < g->size - 1; s++) {
        int st = rs_step(m, g, src, dst, out, off, cnt, dtype, op, shift, s, stream, finish, post);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

/* Allgather step s: pass block (rank - s + shift) on, receive block (rank - s - 1 + shift). */
static int ag_step(kolo__mesh *m, const kolo__group *g, char *buf, const size_t *off, const size_t *cnt, size_t es,
                   int shift, const char *own, int s, bool stream)
{
    int n = g->size, r = g->rank;
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    kolo__xfer sx[MAX_INFLIGHT], rx[MAX_INFLIGHT];
    kolo__xfer *ptrs[2 * MAX_INFLIGHT];
    int sb = mod(r - s + shift, n), rb = mod(r - s - 1 + shift, n);
    size_t sbytes = cnt[sb] * es, rbytes = cnt[rb] * es;
    const char *sp = s == 0 && own ? own : buf + off[sb] * es;
    int ns = post_block_sends(m, right, sp, sbytes, ring_chunk(sbytes, es), sx);
    /* received chunks go straight to their final place; the block is forwarded next step */
    size_t rch = ring_chunk(rbytes, es);
    int nr = 0;
    size_t nrc = nchunks(rbytes, rch);
    for (size_t c = 0; c < nrc; c++) {
        size_t o = c * rch;
        kolo__irecv(m, left, buf + off[rb] * es + o, KOLO_MIN(rch, rbytes - o), &rx[nr]);
        rx[nr++].stream = stream;
    }
    int k = 0;
    for (int i = 0; i < ns; i++) ptrs[k++] = &sx[i];
    for (int i = 0; i < nr; i++) ptrs[k++] = &rx[i];
    return kolo__wait(m, ptrs, k);
}

int kolo__ring_allgather(kolo__mesh *m, const kolo__group *g, char *buf, const size_t *off, const size_t *cnt,
                         size_t es, int shift, const char *own)
{
    bool stream = streams(m, cnt, g->size, es);
    for (int s = 0; s < g->size - 1; s++) {
        int st = ag_step(m, g, buf, off, cnt, es, shift, own, s, stream);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

size_t kolo__ring_chunk_elems(size_t total, int n, size_t es)
{
    return block_chunk((total + (size_t)n - 1) / (size_t)n, es); /* the largest block */
}

/* A piece of a block, as the walker cuts it, in bytes. */
typedef struct piece {
    const char *src;
    char *dst;
    size_t len;
} piece;

/* The pieces of elements [pos, end) of the nseg segments into p (NULL: only counted); returns how
 * many. */
static int cut(const kolo__seg *segs, const size_t *start, int nseg, size_t pos, size_t end, size_t chunk,
               size_t es, piece *p)
{
    kolo__walker w;
    int seg, k = 0;
    size_t o, len;
    kolo__walk_init(&w, segs, start, pos, end, chunk);
    w.nseg = nseg;
    while (kolo__walk_next(&w, &seg, &o, &len)) {
        if (p) p[k] = (piece){segs[seg].src + o * es, segs[seg].dst + o * es, len * es};
        k++;
    }
    return k;
}

/* The last reduce-scatter step and the first allgather step as one: each piece of this member's
 * block is reduced into a send slot, scaled, written out around the cache and sent on to the
 * right from the slot as soon as it is complete, instead of the whole block being written out
 * and read back for the allgather. That saves reading the block back from memory (a fifth of a
 * member's memory traffic at two members: 2.5 S down to 2 S) and lets the two phases overlap.
 *
 * Messages on a connection match in the order they were posted, so both ends of each link
 * follow one schedule. On the link to the right: this step's reduce-scatter pieces 0..W-1 first,
 * then for t = 0, 1, ...: allgather piece t (while t < the pieces of this member's block), then
 * reduce-scatter piece t + W (while there are). The receiving end posts its receives in the same
 * order: its reduce-scatter pieces of that block, and the allgather pieces of its left's block.
 * Pieces are cut the same on both ends (the segments' lengths are the same everywhere), so the
 * two lists match one to one. A received reduce-scatter piece lands in one of W receive slots;
 * it is reduced into one of W send slots, in cache, and sent from there; a send slot is written
 * again W pieces later, once its send is done. That wait needs the right neighbour to have
 * reached t - W, which needs only messages posted before: no cycle, so no deadlock. */
int kolo__ring_fused_step(kolo__mesh *m, const kolo__group *g, const kolo__seg *segs, const size_t *start, int nseg,
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
    /* as many slots as stay in a core's cache: measured on this project's VM, 2 ranks, 64 MiB
     * (chunks of 512 KiB): 8 slots of each kind 0.79x the unfused ring, 2 about 1.04x, 1 1.11x;
     * 16 MiB (128 KiB chunks): 4 slots 1.15x, 1 0.97x */
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
            if (t >= W && (st = kolo__wait1(m, &ag_sx[t - W])) != KOLO_OK) return st;
            kolo__coll_reduce_out(M[t].dst, out, M[t].src, slot, M[t].len, dtype, op, true, post, n);
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

static _Atomic bool test_unfused;

void kolo__ring_test_unfused(bool on) { atomic_store(&test_unfused, on); }
bool kolo__ring_fusing(void) { return !atomic_load(&test_unfused); }

int kolo__ring_allreduce(kolo__mesh *m, const kolo__group *g, const char *src, char *dst, const size_t *off,
                         const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, double post)
{
    int n = g->size;
    size_t es = kolo_dtype_size(dtype);
    bool stream = streams(m, cnt, n, es);
    /* Fused only when streaming: below the stream size the block is read back from the cache,
     * and fusing measured 0.93-0.99x at 4 MiB. */
    if (!stream || !kolo__ring_fusing()) { /* the phases one after the other */
        int st = kolo__ring_reduce_scatter(m, g, src, dst, NULL, off, cnt, dtype, op, 0, true, post);
        if (st != KOLO_OK) return st;
        return kolo__ring_allgather(m, g, dst, off, cnt, es, 0, NULL);
    }
    for (int s = 0; s < n - 2; s++) {
        int st = rs_step(m, g, src, dst, NULL, off, cnt, dtype, op, 0, s, stream, false, 1.0);
        if (st != KOLO_OK) return st;
    }
    size_t total = off[n - 1] + cnt[n - 1], chunk = kolo__ring_chunk_elems(total, n, es);
    char *slots = kolo__coll_scratch(m, KOLO_SCRATCH_RING, 2 * (size_t)kolo__fused_slots(chunk * es) * chunk * es);
    if (!slots) return KOLO_ERR_NO_MEMORY;
    kolo__seg whole = {src, dst, total};
    size_t start[2] = {0, total};
    int st = kolo__ring_fused_step(m, g, &whole, start, 1, off, cnt, chunk, dtype, op, post, slots);
    for (int s = 1; s < n - 1 && st == KOLO_OK; s++) st = ag_step(m, g, dst, off, cnt, es, 0, NULL, s, stream);
    return st;
}
