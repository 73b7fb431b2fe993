/* allgather.c - allgather with a different count per member: direct exchange when small or two
 * members, the ring otherwise. Every received block lands directly at its final offset.
 *
 * The own block goes out from the caller's send buffer, not from its copy in the output: that
 * copy was just written, so on shared memory a peer reading it (single-copy) would have to pull
 * every line out of this core's cache, while the send buffer is usually clean and may already
 * sit in the peer's cache. The local copy is made while the transfers move (in slices, with a
 * progress pass before each). */
#include "coll.h"

#define DIRECT_MAX (256u << 10)

int kolo__coll_allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                         const size_t *counts, size_t es)
{
    int n = g->size, r = g->rank;
    size_t offs[1024], total = 0;
    if (n > 1024) return kolo__err(KOLO_ERR_INVALID_ARG, "process sets above 1024 ranks are not supported yet");
    for (int i = 0; i < n; i++) {
        offs[i] = total;
        total += counts[i];
    }
    if (r < 0 || r >= n) return kolo__err(KOLO_ERR_INTERNAL, "allgather on a group without this rank");
    char *out = recv, *mine = out + offs[r] * es;
    const char *own = send;
    if (n == 1 || (n > 2 && total * es > DIRECT_MAX) || n > 64) {
        kolo__coll_copy_own(mine, send, counts[r] * es, total * es >= KOLO_STREAM_MIN); /* as the ring */
        return n == 1 ? KOLO_OK : kolo__ring_allgather(m, g, out, offs, counts, es, 0, own);
    }
    kolo__out_ticket ot;
    bool stream = kolo__coll_out_stream(m, total * es, &ot); /* written around the cache */
    kolo__xfer xs[128];
    kolo__xfer *ptrs[128];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        kolo__isend(m, kolo__g2w(g, i), own, counts[r] * es, &xs[k++]);
        kolo__irecv(m, kolo__g2w(g, i), out + offs[i] * es, counts[i] * es, &xs[k]);
        xs[k++].stream = stream;
    }
    /* send may lie inside out only as the own block (in place), so this copy touches no block
     * that is in flight */
    kolo__coll_copy_own_moving(m, mine, send, counts[r] * es, stream);
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    int st = kolo__wait(m, ptrs, k);
    kolo__coll_out_done(m, &ot, "allgather", st);
    return st;
}
