/* allgather.c - allgather with a different count per member: direct exchange when small, on two
 * members or on a host with more ranks than cores whose pairs share memory, the ring otherwise.
 * Every received block lands directly at its final offset.
 *
 * Where some pair runs over TCP on a host with more ranks than cores, up to DOUBLING_MAX on a
 * power of two of members: recursive doubling (allgather_doubling, below).
 *
 * Where every pair shares memory on a host with more ranks than cores (kolo__mesh.world_shm and
 * .world_oversubscribed, agreed at init), the exchange runs at every size and its sends are
 * marked `single`: each receiver keeps its block and forwards none, so from 32 KiB a block is
 * read once out of its owner's buffer (shm.c, SINGLE_MIN) instead of copied into and out of a
 * ring at every step; the cores, not the links, are what such a host runs short of. 4 ranks on
 * 2 cores, us per call, 10 interleaved pairs against the ring: 2 MiB 456 against 578, 4 MiB 910
 * against 1398, 8 MiB 2505 against 3546 (Open MPI 396, 958, 3070 in the same launches); 8 ranks
 * 1 MiB 477 against 694, 8 MiB 5349 against 7228. Above 8 MiB the ring stayed until 2026-12-02,
 * as 16 MiB had taken 6368 against 5131; measured again then (Intel Xeon VM, ranks bound in
 * blocks as kolorun and the benchmarks bind such hosts, 3-4 rounds), the exchange won at every
 * size: 4 ranks 16 / 32 / 64 / 128 / 256 MiB 2811-2999 / 7510-8417 / 17393-20028 / 39202-40595 /
 * 83226-86592 against 4615-4676 / 11292-11898 / 20892-21711 / 44484-45147 / 88172-94096 (Open
 * MPI 16 MiB 3891-4881); unbound 16 MiB 2794-3020 against 4450-4695, 64 MiB 18377-20225 against
 * 21827-22845; 8 ranks 16 / 32 / 64 MiB 0.66-0.87x the ring's time, 16 ranks 0.65-0.84x. The
 * exchange with ring copies was no faster than the ring (4 ranks, 2 MiB 588 against 465), nor was
 * recursive doubling (4 MiB 1739 against 1605). Yet with KOLO_SHM_CMA=0, where every send goes by
 * ring copies, the exchange still ran 0.85-0.96x the ring's time at 256 KiB-4 MiB (Intel Xeon VM,
 * 4 ranks, 5 rounds; 8 MiB alike; bound, 16 MiB 1.07x, 32 and 64 MiB 0.81-0.83x), so it keys on
 * the pairs sharing memory, not on their reading single-copy as broadcast.c's spread does.
 *
 * The own block goes out from the caller's send buffer, not from its copy in the output: that
 * copy was just written, so on shared memory a peer reading it (single-copy) would have to pull
 * every line out of this core's cache, while the send buffer is usually clean and may already
 * sit in the peer's cache. The local copy is made while the transfers move (in slices, with a
 * progress pass before each). */
#include "coll.h"

#define DIRECT_MAX (256u << 10)

/* Recursive doubling, n a power of two: in the round of distance d, member r holds the d blocks
 * of its aligned range [r & ~(d-1), +d) and swaps them with member r ^ d, whose range is the
 * neighbouring one; the ranges are contiguous in the output, so each round is one message each
 * way: log2(n) rounds of one send instead of one round of n-1 sends, or the ring's n-1 rounds.
 * It runs where some pair is TCP on a host with more ranks than cores, as tiny allreduces do
 * (kolo__coll_doubling_world). 4 ranks on 2 cores over TCP, us per call, 10 interleaved
 * launches against the exchange: 16 B 45 against 53, 16 KiB 46 against 62, 64 KiB 57 against 71
 * (Open MPI 54, 62, 92); against the ring 512 KiB 280 against 332, but 1 MiB 690 against 529,
 * hence DOUBLING_MAX; 8 ranks 100-141 against 214-313 (Open MPI 168-235) from 32 B to 64 KiB.
 * Over shared memory the exchange stays (16 B 5.5 against 7.2). */
#define DOUBLING_MAX ((size_t)512 << 10)

static int allgather_doubling(kolo__mesh *m, const kolo__group *g, const void *send, char *out, const size_t *offs,
                              const size_t *counts, size_t es)
{
    int n = g->size, r = g->rank;
    kolo__coll_copy_own(out + offs[r] * es, send, counts[r] * es, false);
    for (int d = 1; d < n; d <<= 1) {
        int p = r ^ d, mine = r & ~(d - 1), theirs = p & ~(d - 1);
        size_t mo = offs[mine] * es, mlen = (offs[mine + d - 1] + counts[mine + d - 1]) * es - mo;
        size_t to = offs[theirs] * es, tlen = (offs[theirs + d - 1] + counts[theirs + d - 1]) * es - to;
        kolo__xfer xs[2];
        kolo__xfer *ptrs[2] = {&xs[0], &xs[1]};
        kolo__irecv(m, kolo__g2w(g, p), out + to, tlen, &xs[1]);
        kolo__isend(m, kolo__g2w(g, p), d == 1 ? (const char *)send : out + mo, mlen, &xs[0]);
        int st = kolo__wait(m, ptrs, 2);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

/* Bruck's allgather, for any n: in the round of distance d (1, 2, 4, ...) member r holds the
 * blocks r .. r+d-1 (mod n), sends the first min(d, n-d) of them to r-d and receives as many from
 * r+d, which continue its range: ceil(log2 n) rounds, where the ring takes n-1 and the one-round
 * exchange posts 2(n-1) messages at once. The blocks land in their places in out (member order),
 * so a range that wraps past the last member goes as two messages. It runs for small gathers on
 * more members than the exchange takes (EXCHANGE_MEMBERS_MAX), and wherever few peers are
 * wanted whatever the size (kolo__coll_allgather_few_peers: kolo_init's agreement, the engine's
 * start and its negotiation above 16 members). 72 ranks on the 2-vCPU Xeon VM (kolo-bench, 3
 * launches each way alternated, ms per call): 864 B 1.3-2.5 against the ring's 34-65, 16 KiB
 * 6.2-9.2 against 42-61, 256 KiB 11-14 against 87-110, 1 MiB 28 against 52-68 (2 launches);
 * 4 MiB 110-114 against 89-151 and 16 MiB 446-527 against 339-381, hence BRUCK_MAX. */
#define BRUCK_MAX ((size_t)1 << 20)
#define EXCHANGE_MEMBERS_MAX 64

/* The bytes of blocks [a, a+k) (mod n) in out, as one or two pieces; returns how many. */
static int bruck_pieces(int a, int k, int n, const size_t *offs, const size_t *counts, size_t es, size_t *at,
                        size_t *len)
{
    int np = 0;
    while (k > 0) {
        int run = KOLO_MIN(k, n - a); /* up to the last member */
        at[np] = offs[a] * es;
        len[np++] = (offs[a + run - 1] + counts[a + run - 1]) * es - offs[a] * es;
        k -= run;
        a = 0;
    }
    return np;
}

static int allgather_bruck(kolo__mesh *m, const kolo__group *g, const void *send, char *out, const size_t *offs,
                           const size_t *counts, size_t es)
{
    int n = g->size, r = g->rank;
    kolo__coll_copy_own(out + offs[r] * es, send, counts[r] * es, false);
    for (int d = 1; d < n; d <<= 1) {
        int k = KOLO_MIN(d, n - d), to = (r - d + n) % n, from = (r + d) % n;
        size_t sat[2], slen[2], rat[2], rlen[2];
        int ns = bruck_pieces(r, k, n, offs, counts, es, sat, slen);
        int nr = bruck_pieces(from, k, n, offs, counts, es, rat, rlen);
        kolo__xfer xs[4];
        kolo__xfer *ptrs[4];
        int q = 0;
        for (int i = 0; i < nr; i++, q++) {
            kolo__irecv(m, kolo__g2w(g, from), out + rat[i], rlen[i], &xs[q]);
            ptrs[q] = &xs[q];
        }
        for (int i = 0; i < ns; i++, q++) {
            kolo__isend(m, kolo__g2w(g, to), out + sat[i], slen[i], &xs[q]);
            ptrs[q] = &xs[q];
        }
        int st = kolo__wait(m, ptrs, q);
        if (st != KOLO_OK) return st;
    }
    return KOLO_OK;
}

/* Push: each member writes its own block into the other members' outputs itself
 * (process_vm_writev), a chunk at a time, and into its own output from the same chunk while it
 * still sits in its cache; so the block is read out of memory once, where by the exchange each
 * member that reads it single-copy reads it again (and the owner once more for its own copy).
 * Each member first sends every other where its block goes and how long it expects it; a member
 * writes only into a slot as long as its own block (else both fail with a mismatch naming the
 * other, nothing written), stops writing into a member that has aborted, and sends each whether
 * it wrote, and how long; a block it could not write (CMA refused) goes as a message instead.
 * A member returns once every other has said it is done writing into it.
 *
 * Where: n == 2 from PUSH_MIN_2 wherever the pair reads single-copy; more members only on a host
 * with more ranks than cores whose pairs all read single-copy (the exchange's home), from
 * PUSH_MIN, and below 8 members up to PUSH_MAX. Intel Xeon VM, 2 vCPUs, alternated with the
 * exchange, 3-4 rounds, medians, us per call: 2 ranks 1 / 2 / 4 / 16 / 64 MiB 37 / 139 / 301 /
 * 1262 / 7689 against 58 / 170 / 342 / 1419 / 8089 (Open MPI 57, 170, 365, 1427, 10461), 512 KiB
 * alike, 128 KiB 1.08x; 4 ranks bound in blocks 128 KiB-16 MiB 0.78-0.89x
 * (1 MiB 129 against 162, 16 MiB 2543 against 2841), 32 / 64 MiB 1.13 / 1.08x, 64 KiB 1.09x;
 * 8 ranks 128 KiB-64 MiB 0.73-0.95x, 64 KiB 1.6x. Chunks of 256 KiB: 64 KiB lost 1 MiB-64 MiB
 * by 4-20 %, 1 MiB lost at 4 ranks (4-16 MiB 1.05-1.12x). The CMA write first, then the own copy
 * from the cache: the other order 1.02-1.07x at 1-4 MiB. "The pairs" are the world's where all
 * ranks share one host, else those of the one host the group lies on (kolo__coll_group_flags):
 * the steps within a host of the hierarchical allreduce (hier.c), a process set of one host's
 * ranks.
 *
 * Push or exchange, 2 members: which wins depends on the machine. On a Zen 4 VM (AMD EPYC family
 * 25, vCPUs sharing a cache) the exchange, whose single-copy reads write into lines of the
 * reader's own output, beat the push that writes into lines the other core last held: launches
 * shaped like the harness's (20 calls a size, 12 rounds alternated, medians, us) 2 / 4 / 8 MiB
 * 104 / 224 / 620 by exchange against 112 / 251 / 748 by push, 16 MiB 1980 against 1831. So from
 * PUSH_MIN_2 up to PUSH_CHOICE_MAX_2, where the pair picks its ways from timings
 * (KOLO_SHM_CMA=auto), member 0 chooses push or exchange for both from its timings of whole calls,
 * per size class (KOLO_PAIR_AG, coll_util.c "pair"); a class starts by push, or as the nearest
 * smaller class decided. In the same launches the choice took 0.94x the push's time at 2 and 4
 * MiB (8 and 10 of 12 rounds faster), Open MPI's time there 1.00-1.01x its. Up to 16 MiB, tried:
 * at 8 MiB the output's stores are chosen by timings of the same calls too (kolo__coll_out_stream),
 * and traced, the two choices settled side by side (exchange with stores around the cache, 37-45
 * ps/B, where the push ran 63), but in the harness's launches of 25 calls a size 8 MiB took 1.01x
 * the push's time (6 of 12 rounds faster): its first pushes and probes ate the gain. So the
 * classes from KOLO_PAIR_AG_PATIENT_MIN are patient (coll.h, kolo__pair_ticket): after their
 * first two calls they take the nearest smaller class's verdict and probe first after 8 timed calls and
 * 0.1 s. In the harness's band (2-8 MiB, 25 calls a size), 15 rounds rotating the order, 8 MiB
 * took 603 us against the push's 670 (0.89x by the pairs, 13 of 15 faster), Open MPI 548. From
 * 16 MiB the push stays. This choice runs only in calls the one below makes single-copy (nested
 * in it; a call right after a change of that way is not timed).
 *
 * Ring or single-copy, 2 members (KOLO_PAIR_EX): below the push's sizes an exchange's two
 * messages went single-copy as their call's choice (shm.c, SINGLE_MIN: on an Intel Xeon VM with
 * its vCPUs apart, 0.77-0.79x the time of the transport's choice at 256-512 KiB), but on the Zen 4
 * VM ring copies ran 1.4-2x faster with the vCPUs together and no slower apart (their copies
 * there go around the cache: shm.c). So from KOLO_PAIR_EX_MIN (64 KiB of output) both members
 * send the way member 0 chooses from its timings of whole calls, as a reduce-scatter's steps do
 * (coll_util.c, "pair"), on hosts that are not crowded (there the sends stay single-copy); 2-member
 * alltoalls the same, by the bytes both move (alltoall.c). The harness's band (50 calls a size),
 * 10 rounds rotating the build before, this one and Open MPI, vCPUs together, us per call:
 * allgather 64 KiB-512 KiB 4.3 / 6.0 / 11.3 / 22.7 against 6.0 / 8.9 / 18.1 / 37.4 (Open MPI 6.7
 * / 10.0 / 20.7 / 45.7), 1 MiB (the push's) alike; alltoall 64 KiB-1 MiB 3.8 / 6.3 / 10.9 / 22.8 /
 * 43.7 against 5.0 / 9.0 / 20.9 / 41.8 / 57.4 (Open MPI 6.1 / 9.2 / 21.1 / 41.4 / 60.8), 2-16
 * MiB (20 calls a size, 6 rounds) 0.75-0.87x the time; with the vCPUs apart (4 rounds) allgather
 * 64-512 KiB 0.73-0.82x. From 1 MiB the same choice runs between ring copies and single-copy,
 * which is the push or the exchange above: pinned, ring copies beat both at every size from 1 to
 * 64 MiB on the Zen 4 VM (20 calls a size, 6 rounds, vCPUs together, us: 1 / 2 / 4 / 8 / 16 MiB
 * 38 / 74 / 158 / 531 / 1334 against the choice's 55 / 105 / 217 / 653 / 1663, Open MPI 60 / 106
 * / 217 / 550 / 1995; 32 / 64 MiB 3381 / 6841 against the push's 3850 / 8722). Those classes are
 * patient (KOLO_PAIR_EX_PATIENT_MIN): after their first two calls they take the nearest smaller
 * class's verdict and probe first after 8 timed calls and 0.1 s; probing after 4 calls, traced at
 * 8 MiB, a probe's five calls of single-copy and changing back cost 650-1100 us each against ring
 * copies' 470-550, and a benchmark's 20 calls a size ran 612 against ring copies pinned at 522.
 * The harness's band (2-16 MiB, 20 calls a size, 200 ms at 2 MiB first), 8 rounds rotating the
 * build before, this one and Open MPI, vCPUs apart, us: 2 / 4 / 8 / 16 MiB 101 / 213 / 519 /
 * 1073 against 134 / 276 / 582 / 1361 (0.78 / 0.79 / 0.91 / 0.79x by the pairs, 7-8 of 8 rounds
 * faster), Open MPI 116 / 225 / 559 / 1901. */
#define PUSH_MIN_2 ((size_t)1 << 20)
#define PUSH_CHOICE_MAX_2 ((size_t)16 << 20)
#define PUSH_MIN ((size_t)128 << 10)
#define PUSH_MAX ((size_t)16 << 20)
#define PUSH_CHUNK ((size_t)256 << 10)
#define PUSH_MAX_MEMBERS 64

static uint64_t push_runs;
static int test_refuse_write; /* test hook: the nth write from now is refused (EPERM) */

uint64_t kolo__coll_allgather_push_runs(void) { return __atomic_load_n(&push_runs, __ATOMIC_RELAXED); }
void kolo__coll_allgather_test_refuse_write(int nth) { test_refuse_write = nth; }

static bool push_here(const kolo__mesh *m, const kolo__group *g, size_t bytes)
{
    int n = g->size;
    if (n > PUSH_MAX_MEMBERS || bytes < (n == 2 ? PUSH_MIN_2 : PUSH_MIN)) return false;
    return (n == 2 || n >= 8 || bytes <= PUSH_MAX) && kolo__coll_single_copy_group(m, g);
}

static int allgather_push(kolo__mesh *m, const kolo__group *g, const char *own, char *out, const size_t *offs,
                          const size_t *counts, size_t es, bool stream)
{
    int n = g->size, r = g->rank, k = 0;
    size_t len = counts[r] * es;
    char *mine = out + offs[r] * es;
    /* per member: where its block goes here and how long; where ours goes there; what we did
     * there (error, length, whether the lengths agree); what it did here */
    uint64_t where[PUSH_MAX_MEMBERS][2], theirs[PUSH_MAX_MEMBERS][2], done[PUSH_MAX_MEMBERS][3],
        got[PUSH_MAX_MEMBERS][3];
    int e[PUSH_MAX_MEMBERS] = {0};
    kolo__xfer xs[2 * PUSH_MAX_MEMBERS];
    kolo__xfer *ptrs[2 * PUSH_MAX_MEMBERS];
    for (int i = 0; i < 2 * n; i++) ptrs[i] = &xs[i];
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        where[i][0] = (uint64_t)(uintptr_t)(out + offs[i] * es);
        where[i][1] = counts[i] * es;
        kolo__isend(m, kolo__g2w(g, i), where[i], sizeof(where[i]), &xs[k++]);
        kolo__irecv(m, kolo__g2w(g, i), theirs[i], sizeof(theirs[i]), &xs[k++]);
    }
    int st = kolo__wait(m, ptrs, k);
    if (st != KOLO_OK) return st;
    for (size_t at = 0; at < len; at += PUSH_CHUNK) {
        size_t c = KOLO_MIN(PUSH_CHUNK, len - at);
        for (int d = 1; d < n; d++) { /* each member's first write from another: not all at once */
            int i = (r + d) % n;
            if (theirs[i][1] == len && !e[i])
                e[i] = kolo__coll_write_peer(m, kolo__g2w(g, i), theirs[i][0] + at, own + at, c, &test_refuse_write,
                                             "allgather");
        }
        kolo__coll_copy_own(mine + at, own + at, c, stream);
    }
    k = 0;
    bool all = true;
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        done[i][0] = (uint64_t)e[i];
        done[i][1] = len;
        done[i][2] = theirs[i][1] == len;
        all = all && !e[i];
        kolo__isend(m, kolo__g2w(g, i), done[i], sizeof(done[i]), &xs[k++]);
        kolo__irecv(m, kolo__g2w(g, i), got[i], sizeof(got[i]), &xs[k++]);
    }
    st = kolo__wait(m, ptrs, k);
    if (st != KOLO_OK) return st;
    /* the blocks that could not be written go as messages, to and from every member whose
     * lengths agreed, before a mismatch with another is reported (or they would be left hanging) */
    k = 0;
    int bad = -1;
    for (int i = 0; i < n; i++) {
        if (i == r) continue;
        if ((!done[i][2] || !got[i][2]) && bad < 0) bad = i;
        if (e[i]) kolo__isend(m, kolo__g2w(g, i), own, len, &xs[k++]);
        if (got[i][0]) kolo__irecv(m, kolo__g2w(g, i), out + offs[i] * es, counts[i] * es, &xs[k++]);
    }
    st = k ? kolo__wait(m, ptrs, k) : KOLO_OK;
    if (st == KOLO_OK && bad >= 0)
        return kolo__err(KOLO_ERR_MISMATCH,
                         "allgather: rank %d gives %llu bytes where rank %d expects %llu: the ranks called "
                         "collectives with different counts, dtypes or orders",
                         done[bad][2] ? kolo__g2w(g, bad) : m->rank,
                         (unsigned long long)(done[bad][2] ? got[bad][1] : len), done[bad][2] ? m->rank : kolo__g2w(g, bad),
                         (unsigned long long)(done[bad][2] ? where[bad][1] : theirs[bad][1]));
    if (st == KOLO_OK && all) __atomic_fetch_add(&push_runs, 1, __ATOMIC_RELAXED);
    return st;
}

/* kolo__coll_allgather with offs[] (n members) to fill; few_peers: Bruck's algorithm whatever the
 * size (kolo__coll_allgather_few_peers) */
static int allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                     size_t es, size_t *offs, bool few_peers)
{
    int n = g->size, r = g->rank;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = total;
        total += counts[i];
    }
    if (r < 0 || r >= n) return kolo__err(KOLO_ERR_INTERNAL, "allgather on a group without this rank");
    if (few_peers) return allgather_bruck(m, g, send, recv, offs, counts, es);
    char *out = recv, *mine = out + offs[r] * es;
    const char *own = send;
    /* spread over hosts: maybe across them first, then within each (hier.c) */
    int h = n > 1 ? kolo__coll_hier_allgather(m, g, send, recv, counts, es) : KOLO_HIER_DECLINED;
    if (h != KOLO_HIER_DECLINED) return h;
    /* (a world of one rank has no mesh) */
    bool exchange = n <= EXCHANGE_MEMBERS_MAX && (n <= 2 || total * es <= DIRECT_MAX || kolo__coll_shm_crowded(m, g));
    if (n >= 4 && total * es <= DOUBLING_MAX && kolo__coll_doubling_world(m, n))
        return allgather_doubling(m, g, send, out, offs, counts, es);
    if (n > EXCHANGE_MEMBERS_MAX && total * es <= BRUCK_MAX)
        return allgather_bruck(m, g, send, out, offs, counts, es);
    if (n == 1 || !exchange) {
        kolo__coll_copy_own(mine, send, counts[r] * es, total * es >= kolo__coll_stream_min(m)); /* as the ring */
        return n == 1 ? KOLO_OK : kolo__ring_allgather(m, g, out, offs, counts, es, 0, own);
    }
    kolo__out_ticket ot;
    bool stream = kolo__coll_out_stream(m, total * es, &ot); /* written around the cache */
    /* 2 members: ring copies or single-copy, and single-copy from PUSH_MIN_2 to PUSH_CHOICE_MAX_2
     * push or exchange, as the pair's timings choose (above); a crowded host's world: ring copies
     * (the exchange) or single-copy (the push, or the exchange's sends single-copy) as member 0's
     * timings choose (coll_util.c, "Crowded") */
    kolo__pair_ticket ex = {.conn = NULL}, pt = {.conn = NULL};
    if (n != 2 || !kolo__coll_shm_crowded(m, g)) kolo__pair_begin(m, g, KOLO_PAIR_EX, total * es, &ex);
    bool push = ex.way != KOLO_WAY_RING && push_here(m, g, total * es);
    if (push && n == 2 && total * es < PUSH_CHOICE_MAX_2) {
        kolo__pair_begin(m, g, KOLO_PAIR_AG, total * es, &pt);
        pt.untimed = ex.changed;
        push = pt.way != KOLO_PAIR_EXCHANGE;
    }
    int st;
    if (push) {
        m->call_way = KOLO_WAY_AUTO; /* its few messages go as the transport picks */
        st = allgather_push(m, g, own, out, offs, counts, es, stream);
    } else {
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
        st = kolo__wait(m, ptrs, k);
    }
    if (pt.conn) kolo__pair_end(m, &pt, st, "allgather");
    if (ex.conn) kolo__pair_end(m, &ex, st, "allgather");
    kolo__coll_out_done(m, &ot, "allgather", st);
    return st;
}

static int allgather_call(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                          size_t es, bool few_peers)
{
    size_t own[KOLO_STACK_MEMBERS], *offs = kolo__coll_members(own, g->size, sizeof(size_t));
    if (!offs) return KOLO_ERR_NO_MEMORY;
    int st = allgather(m, g, send, recv, counts, es, offs, few_peers);
    kolo__coll_members_free(offs, own);
    return st;
}

int kolo__coll_allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                         const size_t *counts, size_t es)
{
    return allgather_call(m, g, send, recv, counts, es, false);
}

int kolo__coll_allgather_few_peers(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                                   const size_t *counts, size_t es)
{
    return allgather_call(m, g, send, recv, counts, es, true);
}
