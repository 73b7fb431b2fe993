/* shm_tune.c - KOLO_SHM_CMA=auto (experimental, not the default): ring copies or single-copy
 * reads, whichever this host moves faster.
 *
 * Large shared-memory messages can go two ways (shm.c): copied through the pair's ring in
 * 128 KiB chunks, or read by the receiver straight out of the sender's buffer with
 * process_vm_readv. Which one wins depends on the machine, and on a VM even on where the
 * hypervisor put the vCPUs: on this project's 2-vCPU VM, 64 MiB allreduce ran 5.4 GB/s by ring
 * vs 3.8 by CMA with a 0.05 us shared-memory ping, and 2.1 vs 3.8 GB/s with a 0.24 us ping, on
 * the same day.
 *
 * So it is timed. Right after start-up the first two ranks of each host bounce a 1 MiB message
 * there and back, by ring and by CMA in turn (one warm-up and five timed round trips each), and
 * every rank of the host follows the first rank's verdict: CMA when its median round trip is at
 * least 20 % shorter. A host with more ranks than cores stays on the ring (timings taken while
 * ranks share cores say nothing about either path), and so does a pair that failed the CMA
 * probe. It costs one small allgather over the world, plus a few ms on hosts with two ranks.
 *
 * Why it is not the default: the probe does not predict the collectives. On the near-peer VM,
 * where ring copies run broadcast 2-3x faster than CMA at 1 MiB (35-43 vs 13 GB/s), these round
 * trips came out 200-270 us by ring and 165-200 us by CMA, and it chose CMA. A probe closer to
 * what collectives do (a one-way stream of several chunks, timed by the receiver) is the next
 * thing to try.
 */
#include "world.h"

#define TUNE_BYTES ((size_t)1 << 20)
#define TUNE_ROUNDS 5 /* timed round trips per path, after one to warm up */

static uint64_t median(const uint64_t v[TUNE_ROUNDS])
{
    uint64_t s[TUNE_ROUNDS];
    memcpy(s, v, sizeof(s));
    for (int i = 1; i < TUNE_ROUNDS; i++)
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            uint64_t x = s[j];
            s[j] = s[j - 1];
            s[j - 1] = x;
        }
    return s[TUNE_ROUNDS / 2];
}

/* One round trip of `bytes` between this rank and `peer`; `lead` sends first. Returns the
 * nanoseconds it took, or 0 with *st set. */
static uint64_t round_trip(kolo__mesh *m, int peer, bool lead, char *out, char *in, size_t bytes, int *st)
{
    kolo__xfer x;
    uint64_t t0 = kolo__now_ns();
    for (int leg = 0; leg < 2 && *st == KOLO_OK; leg++) {
        if ((leg == 0) == lead) kolo__isend(m, peer, out, bytes, &x);
        else kolo__irecv(m, peer, in, bytes, &x);
        *st = kolo__wait1(m, &x);
    }
    return *st == KOLO_OK ? kolo__now_ns() - t0 : 0;
}

/* The pair's verdict as the lead sees it: 1 CMA, 0 ring, -1 not timed. */
static int time_pair(kolo__mesh *m, int peer, bool lead, bool willing, int *st)
{
    kolo__conn *c = m->conns[peer];
    char *out = kolo__malloc_aligned(TUNE_BYTES), *in = kolo__malloc_aligned(TUNE_BYTES);
    int mine = willing && kolo__shm_cma_state(c) >= 0 && out && in, theirs = 0;
    kolo__xfer x;
    /* both sides must be able and willing, or neither times anything */
    for (int leg = 0; leg < 2 && *st == KOLO_OK; leg++) {
        if ((leg == 0) == lead) kolo__isend(m, peer, &mine, sizeof(mine), &x);
        else kolo__irecv(m, peer, &theirs, sizeof(theirs), &x);
        *st = kolo__wait1(m, &x);
    }
    uint64_t t[2][TUNE_ROUNDS];
    if (*st == KOLO_OK && mine && theirs) {
        memset(out, 1, TUNE_BYTES);
        /* alternate the two paths, so a drift in machine speed hits both alike */
        for (int r = 0; r <= TUNE_ROUNDS && *st == KOLO_OK; r++)
            for (int cma = 0; cma < 2 && *st == KOLO_OK; cma++) {
                kolo__shm_use_cma(c, cma);
                uint64_t ns = round_trip(m, peer, lead, out, in, TUNE_BYTES, st);
                if (r > 0) t[cma][r - 1] = ns; /* round 0 warms up */
            }
        kolo__shm_use_cma(c, false);
    }
    kolo__free(out);
    kolo__free(in);
    if (*st != KOLO_OK || !mine || !theirs) return -1;
    uint64_t ring = median(t[0]), cma = median(t[1]);
    int verdict = cma * 10 < ring * 8;
    if (lead)
        KOLO_INFO("shared memory, %zu MiB there and back (median of %d): ring copies %.0f us, single-copy CMA %.0f us: "
                  "using %s",
                  TUNE_BYTES >> 20, TUNE_ROUNDS, (double)ring * 1e-3, (double)cma * 1e-3,
                  verdict ? "CMA for messages of 128 KiB and more" : "ring copies");
    return verdict;
}

int kolo__shm_autotune(bool oversubscribed)
{
    kolo__world *W = &kolo__W;
    int n = W->info.size, me = W->info.rank;
    const char *mode = kolo__setting_str(KOLO_SET_SHM_CMA);
    if (n == 1 || strcmp(mode, "auto") != 0) return KOLO_OK;
    /* the same answer on every rank: does any host have two ranks? */
    bool any = false;
    for (int r = 1; r < n && !any; r++)
        for (int q = 0; q < r && !any; q++) any = strcmp(W->peers[q].hostkey, W->peers[r].hostkey) == 0;
    if (!any) return KOLO_OK;
    /* the first two ranks of this host */
    int first = -1, second = -1;
    for (int r = 0; r < n && second < 0; r++) {
        if (strcmp(W->peers[r].hostkey, W->peers[me].hostkey) != 0) continue;
        if (first < 0) first = r;
        else second = r;
    }
    kolo__mesh *m = W->mesh[KOLO_CHANNEL_DIRECT];
    int st = KOLO_OK, verdict = -1;
    if (second >= 0 && (me == first || me == second))
        verdict = time_pair(m, me == first ? second : first, me == first, !oversubscribed, &st);
    if (me != first) verdict = -1; /* the host follows its first rank */
    if (st != KOLO_OK) return st;
    int *all = kolo__calloc((size_t)n, sizeof(int));
    if (!all) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %d ranks", n);
    size_t *counts = kolo__calloc((size_t)n, sizeof(size_t));
    if (!counts) {
        kolo__free(all);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %d ranks", n);
    }
    for (int r = 0; r < n; r++) counts[r] = 1;
    st = kolo__coll_allgather(m, W->psets[0], &verdict, all, counts, sizeof(int));
    if (st == KOLO_OK && all[first] == 1)
        for (int ch = 0; ch < KOLO_NCHANNELS; ch++)
            for (int r = 0; r < n; r++) kolo__shm_use_cma(W->mesh[ch]->conns[r], true);
    kolo__free(counts);
    kolo__free(all);
    return st;
}
