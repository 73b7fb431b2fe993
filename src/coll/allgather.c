/* allgather.c - allgather with a different count per member: direct exchange when small or two
 * members, the ring otherwise. Every received block lands directly at its final offset. */
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
    if ((const char *)send != mine && counts[r]) memmove(mine, send, counts[r] * es);
    if (n == 1) return KOLO_OK;
    if (n == 2 || total * es <= DIRECT_MAX) {
        kolo__xfer xs[128];
        kolo__xfer *ptrs[128];
        if (n > 64) return kolo__ring_allgather(m, g, out, offs, counts, es, 0);
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (i == r) continue;
            kolo__isend(m, kolo__g2w(g, i), mine, counts[r] * es, &xs[k++]);
            kolo__irecv(m, kolo__g2w(g, i), out + offs[i] * es, counts[i] * es, &xs[k++]);
        }
        for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
        return kolo__wait(m, ptrs, k);
    }
    return kolo__ring_allgather(m, g, out, offs, counts, es, 0);
}
