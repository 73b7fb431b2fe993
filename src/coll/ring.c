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
 * When the whole buffer is far larger than the cache (KOLO_STREAM_MIN), every byte written to its
 * final place is written with non-temporal stores: the reduced chunk from its slot, a received
 * block by the transport (kolo__xfer.stream). A plain store to a line not in cache first reads
 * it, so this drops a read per byte written. Measured on this project's VM, 2 ranks, allreduce
 * busbw, streamed against plain in the same launches call by call (420+ launches per size with
 * the vCPUs on one CCD, 60+ on two): one CCD 16 MiB 1.10x, 64 MiB 1.23x, but 4 MiB 0.83x (input
 * and output, 8 MiB, fit the 32 MiB L3: the output was still cached, now it is not); two CCDs
 * 0.94x and 0.97x at 16 and 64 MiB (there allreduce reads the others' buffers directly
 * instead, direct.c).
 */
#include "coll.h"

#include "../reduce/reduce.h"

#define MAX_INFLIGHT 64

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* The chunk size for a block of `bytes`: KOLO_RING_CHUNK, grown so that a block never needs more
 * than MAX_INFLIGHT chunks, and a multiple of the element size. Sender and receiver of a block
 * compute it from the same numbers, so their messages match one to one. */
static size_t ring_chunk(size_t bytes, size_t es)
{
    size_t c = kolo__coll_chunk();
    size_t min = (bytes + MAX_INFLIGHT - 1) / MAX_INFLIGHT;
    if (c < min) c = min;
    c = (c + es - 1) / es * es;
    return c ? c : es;
}

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
static bool streams(const size_t *cnt, int n, size_t es)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += cnt[i];
    return total * es >= KOLO_STREAM_MIN;
}

static int wait_sends(kolo__mesh *m, kolo__xfer *xs, int n)
{
    kolo__xfer *ptrs[MAX_INFLIGHT];
    for (int i = 0; i < n; i++) ptrs[i] = &xs[i];
    return kolo__wait(m, ptrs, n);
}

int kolo__ring_reduce_scatter(kolo__mesh *m, const kolo__group *g, const char *src, char *dst,
                              const size_t *off, const size_t *cnt, kolo_dtype_t dtype, kolo_op_t op, int shift)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype);
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    kolo__xfer sx[MAX_INFLIGHT];
    bool stream = streams(cnt, n, es);
    for (int s = 0; s < n - 1; s++) {
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
            char *d = dst + off[rb] * es + o;
            const char *mine = src + off[rb] * es + o;
            char *slot = slots + (c % 2) * rch;
            if (stream) { /* reduced in the slot, in cache, then written out around it */
                kolo__reduce(slot, mine, slot, len / es, dtype, op);
                kolo__stream_copy(d, slot, len);
            } else {
                kolo__reduce(d, mine, slot, len / es, dtype, op);
            }
            if (posted < nrc) {
                size_t o2 = posted * rch;
                kolo__irecv(m, left, slots + (posted % 2) * rch, KOLO_MIN(rch, rbytes - o2), &rx[posted % 2]);
                posted++;
            }
        }
        if (stream) kolo__stream_fence(); /* the next step sends this block, perhaps single-copy */
        int st = wait_sends(m, sx, ns);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

int kolo__ring_allgather(kolo__mesh *m, const kolo__group *g, char *buf, const size_t *off, const size_t *cnt,
                         size_t es, int shift, const char *own)
{
    int n = g->size, r = g->rank;
    int right = kolo__g2w(g, mod(r + 1, n)), left = kolo__g2w(g, mod(r - 1, n));
    kolo__xfer sx[MAX_INFLIGHT], rx[MAX_INFLIGHT];
    kolo__xfer *ptrs[2 * MAX_INFLIGHT];
    bool stream = streams(cnt, n, es);
    for (int s = 0; s < n - 1; s++) {
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
        int st = kolo__wait(m, ptrs, k);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}
