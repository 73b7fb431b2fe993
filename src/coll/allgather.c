/* allgather.c - allgather with a different count per member: direct exchange when small or two
 * members, the ring otherwise. Every received block lands directly at its final offset.
 *
 * Where every pair shares memory on a host with more ranks than cores (kolo__mesh.world_shm and
 * .world_oversubscribed, agreed at init), the exchange runs up to SINGLE_EXCHANGE_MAX and its
 * sends are marked `single`: each receiver keeps its block and forwards none, so from 128 KiB
 * a block is read once out of its owner's buffer (shm.c, SINGLE_MIN) instead of copied into and
 * out of a ring at every step; the cores, not the links, are what such a host runs short of. 4
 * ranks on 2 cores, us per call, 10 interleaved pairs against the ring: 2 MiB 456 against 578, 4
 * MiB 910 against 1398, 8 MiB 2505 against 3546 (Open MPI 396, 958, 3070 in the same launches),
 * but 16 MiB 6368 against 5131; 8 ranks 1 MiB 477 against 694, 8 MiB 5349 against 7228. The
 * exchange with ring copies was no faster than the ring (4 ranks, 2 MiB 588 against 465), nor was
 * recursive doubling (4 MiB 1739 against 1605).
 *
 * The own block goes out from the caller's send buffer, not from its copy in the output: that
 * copy was just written, so on shared memory a peer reading it (single-copy) would have to pull
 * every line out of this core's cache, while the send buffer is usually clean and may already
 * sit in the peer's cache. The local copy is made while the transfers move (in slices, with a
 * progress pass before each). */
#include "coll.h"

#define DIRECT_MAX (256u << 10)
#define SINGLE_EXCHANGE_MAX ((size_t)8 << 20) /* see the top */

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
    /* (a world of one rank has no mesh) */
    size_t exchange_max = n > 2 && m->world_shm && m->world_oversubscribed ? SINGLE_EXCHANGE_MAX : DIRECT_MAX;
    bool exchange = n <= 64 && (n <= 2 || total * es <= exchange_max);
    if (n == 1 || !exchange) {
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
        kolo__isend(m, kolo__g2w(g, i), own, counts[r] * es, &xs[k]);
        xs[k++].single = true; /* each receiver keeps its copy and forwards none */
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
