/* barrier.c - the dissemination barrier: in round k each member signals member +2^k and waits
 * for member -2^k; after ceil(log2 n) rounds everyone has heard, indirectly, from everyone. */
#include "coll.h"

int kolo__coll_barrier(kolo__mesh *m, const kolo__group *g)
{
    int n = g->size, r = g->rank;
    for (int k = 1; k < n; k <<= 1) {
        kolo__xfer xs[2];
        kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
        kolo__isend(m, kolo__g2w(g, (r + k) % n), NULL, 0, &xs[0]);
        kolo__irecv(m, kolo__g2w(g, (r - k + n) % n), NULL, 0, &xs[1]);
        int st = kolo__wait(m, ptrs, 2);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}
