/* alltoall.c - alltoall with per-destination counts: every pair exchanges its one message at once
 * (all sends and receives posted together), the local block is a copy. Up to KOLO_STACK_MEMBERS
 * members the bookkeeping lives on the stack: two allocations and frees per call were a third of
 * a small alltoall's time on 2 ranks (0.34 against allgather's 0.23 us for 8 bytes). Every send
 * is marked `single`: its bytes are read once and kept, so on a host with more ranks than cores,
 * where ring copies are otherwise kept, large ones go single-copy (one copy instead of two). On 2
 * members elsewhere, from KOLO_PAIR_EX_MIN, both send the way member 0's timings of whole calls
 * choose, ring copies or single-copy (allgather.c, "Ring or single-copy"), patiently from
 * KOLO_PAIR_EX_PATIENT_MIN as there: the harness's band (2-16 MiB, 20 calls a size), 6 rounds
 * rotating the build before (which probed after 4 calls), this one and Open MPI, vCPUs together:
 * 2 / 4 / 8 / 16 MiB 0.92 / 0.93 / 1.04 / 0.85x its time by the pairs (73 / 178 / 652 / 1353 us,
 * Open MPI 106 / 219 / 717 / 1963).
 *
 * Crowded: a world of 3 or more members on a host with more ranks than cores chooses between ring
 * copies and single-copy for its alltoalls as for its allgathers (coll_util.c, "Crowded"), member
 * 0 leading, in slots of their own (KOLO_PAIR_A2A): each member counts its calls per class of its
 * own bytes (sent and received), which differ between the members of an uneven alltoall, so
 * their counts drift apart and a member may send a call another way than member 0 chose. That
 * is harmless (each message says its way; the lead's timings get muddier), but sharing the
 * allgathers' slots would not be: their members must agree. Where the pairs' single-copy sends
 * ran at a quarter of memcpy's rate (the Zen 4 VM, docs/performance.md, "Ring copies beat
 * single-copy at 4 ranks"), 4 ranks, the harness's bands, 3 rounds rotating the build before,
 * this one and ring copies pinned: 128 KiB-1 MiB 0.50-0.73x the build before's time, 2-16 MiB
 * 0.57-0.93x, 64 / 256 MiB 0.58-0.78x (pinned ring copies 0.8-0.9x this one's at 16-64 MiB);
 * 8 ranks, where single-copy holds its own (4 launches each, 2 near): 64 MiB 0.75x, but 128
 * KiB-16 MiB 0.95-1.19x, mostly about 1.1x: the probes' cost in a launch of 20-50 calls a size. */
#include "coll.h"

/* kolo__coll_alltoall with its bookkeeping (n members) to fill */
static int alltoall(kolo__mesh *m, const kolo__group *g, const void *send, const size_t *sendcounts, void *recv,
                    const size_t *recvcounts, size_t es, kolo__xfer *xs, kolo__xfer **ptrs, size_t *soff,
                    size_t *roff)
{
    int n = g->size, r = g->rank;
    const char *s = send;
    char *d = recv;
    size_t so = 0, ro = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        soff[i] = so;
        roff[i] = ro;
        so += sendcounts[i];
        ro += recvcounts[i];
    }
    kolo__out_ticket ot;
    bool stream = kolo__coll_out_stream(m, ro * es, &ot); /* every block written around the cache */
    /* 2 members: ring copies or single-copy, by the bytes both move (alike on both: their own
     * blocks may differ) as an allgather's output of the same size (allgather.c) */
    kolo__pair_ticket ex = {.conn = NULL};
    if (n == 2 && !kolo__coll_shm_crowded(m, g))
        kolo__pair_begin(m, g, KOLO_PAIR_EX, (sendcounts[!r] + recvcounts[!r]) * es, &ex);
    else if (n > 2) /* a crowded host's world; elsewhere it takes no ticket */
        kolo__pair_begin(m, g, KOLO_PAIR_A2A, (so + ro) * es, &ex);
    /* post in a rotated order so that not every rank starts with rank 0 */
    for (int step = 1; step < n; step++) {
        int to = (r + step) % n, from = (r - step + n) % n;
        kolo__irecv(m, kolo__g2w(g, from), d + roff[from] * es, recvcounts[from] * es, &xs[k]);
        xs[k].stream = stream;
        ptrs[k] = &xs[k];
        k++;
        kolo__isend(m, kolo__g2w(g, to), s + soff[to] * es, sendcounts[to] * es, &xs[k]);
        xs[k].single = true;
        ptrs[k] = &xs[k];
        k++;
    }
    int st = KOLO_OK;
    if (sendcounts[r] != recvcounts[r])
        st = kolo__err(KOLO_ERR_INVALID_ARG, "alltoall: rank sends %zu elements to itself but expects %zu",
                       sendcounts[r], recvcounts[r]);
    else
        kolo__coll_copy_own_moving(m, d + roff[r] * es, s + soff[r] * es, sendcounts[r] * es, stream);
    int st2 = kolo__wait(m, ptrs, k);
    if (ex.conn) kolo__pair_end(m, &ex, st != KOLO_OK ? st : st2, "alltoall");
    kolo__coll_out_done(m, &ot, "alltoall", st != KOLO_OK ? st : st2);
    return st != KOLO_OK ? st : st2;
}

int kolo__coll_alltoall(kolo__mesh *m, const kolo__group *g, const void *send, const size_t *sendcounts,
                        void *recv, const size_t *recvcounts, size_t es)
{
    int n = g->size;
    /* per member: a receive and a send, pointers to them, and both offsets */
    kolo__xfer xs_own[2 * KOLO_STACK_MEMBERS], *ptrs_own[2 * KOLO_STACK_MEMBERS];
    size_t offs_own[2 * KOLO_STACK_MEMBERS];
    kolo__xfer *xs = kolo__coll_members(xs_own, n, 2 * sizeof(kolo__xfer));
    kolo__xfer **ptrs = kolo__coll_members(ptrs_own, n, 2 * sizeof(kolo__xfer *));
    size_t *soff = kolo__coll_members(offs_own, n, 2 * sizeof(size_t)), *roff = soff ? soff + n : NULL;
    int st = xs && ptrs && soff ? KOLO_OK : KOLO_ERR_NO_MEMORY;
    if (st == KOLO_OK) st = alltoall(m, g, send, sendcounts, recv, recvcounts, es, xs, ptrs, soff, roff);
    kolo__coll_members_free(xs, xs_own);
    kolo__coll_members_free(ptrs, ptrs_own);
    kolo__coll_members_free(soff, offs_own);
    return st;
}
