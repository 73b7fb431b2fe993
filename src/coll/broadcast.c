/* broadcast.c - broadcast: on up to 3 members the root sends to everyone directly; small
 * buffers on more go down a binomial tree; large ones down a pipelined chain (root -> next ->
 * next ...) in chunks, so every link carries the buffer once and all links work at the same
 * time, except on a host with more ranks than cores: there, where the ranks are bound in blocks,
 * buffers up to 16 MiB go down the binomial tree too, read single-copy ("tree", below), and
 * otherwise up to 1 MiB (512 KiB on 4 members) the root sends to everyone directly again
 * (spread, below); the world's broadcasts there take the chain instead where its members' timings
 * agree it is cheaper ("Agreed", below). Chunks are received in place, no copies. On 2 members, and on the tree's edge
 * that crosses between CPUs, the sender writes half of the buffer into the receiver while the
 * receiver reads the other half ("split", below); on 2 members the root may send both halves by
 * ring copies instead, as its timings choose ("Split or ring copies").
 *
 * The tree, not the root sending to all: a send's cost lands on the sender (over loopback TCP the
 * kernel runs the receiving side in the sender's system call too), and in a loop of broadcasts the
 * root's sends set the pace. With the tree the root makes log2(n) of them instead of n-1. Measured
 * (kolo-bench, 8 launches interleaved, us per call), 4 ranks on 2 cores over TCP: 8 B 7.4 against
 * 10.2, 4 KiB 10.5 against 14.1, 32 KiB 21.5 against 28.2; 8 ranks (3 launches) 8 B 15 against
 * 36; over shared memory 4 KiB 1.36 against 1.71, 32 KiB 9.5 against 10.4 (8 ranks 15 against
 * 25), 8-512 B 0.23-0.33 against 0.18-0.24.
 *
 * Spread: where every pair shares memory and sends `single` messages single-copy, on a host with
 * more ranks than cores (the world's flags, agreed at init, so every member decides alike: not
 * with KOLO_SHM_CMA=0, nor where a pair failed the CMA probe, as by ring copies the spread made
 * the root copy the buffer once per member: 4 ranks, 128-512 KiB 1.15-1.30x the chain's time, 5
 * rounds), buffers above DIRECT_MAX up to SPREAD_MAX (SPREAD_MAX_4 on 4 members) go from the
 * root to every member directly, each send marked `single` (read once and kept), so each
 * member reads the root's buffer single-copy (shm.c, SINGLE_MIN): one copy per member instead of
 * the chain's two per link, and no member waits for another to be scheduled to forward. Intel Xeon
 * VM, 2 vCPUs, the harness's band (50 calls a size), launches alternated with the chain's build
 * and Open MPI's, medians, us per call: 4 ranks (6 rounds) 128 KiB 17.6 against 23.2, 256 KiB
 * 31.6 against 53.3, 512 KiB 76.4 against 105.3 (Open MPI 26.8 / 52.5 / 114.1); 8 ranks (5 and 3
 * rounds) 128 KiB 42 against 51, 256 KiB 60-78 against 93-116, 512 KiB 168 against 217; 16 ranks
 * (2 rounds) 0.8-1.5x, no clear change. At 1 MiB 4 ranks 0.88x the chain's time (10 rounds:
 * 167-296 us against 192-340; Open MPI 181-304), 8 ranks 0.90x (5 rounds: 405-512 against
 * 483-750); two shorter sets before had read 0.96x and 1.02x. Those ranks were unbound; bound in
 * blocks, one CPU each, as kolorun and the benchmarks now bind such hosts (2026-12-02), the
 * chain took 0.78x the spread's time at 1 MiB on 4 members (8 rounds, 231-261 us against
 * 294-320; 512 KiB 0.94x, within the launches' spread; unbound in the same rounds 1.04x and
 * 1.00x), so 4 members spread up to SPREAD_MAX_4; 8 members kept the spread at 1 MiB (5 rounds,
 * the chain 1.04x bound, 1.10x unbound). From 2 MiB it lost (4 ranks 570-615 us against
 * 460-500): several members reading one large buffer at once; sent in 512 KiB pieces it did no
 * better than the chain. On 3 members the root sends to both anyway, and marking those
 * sends single was no faster. Nor was the chain faster with its sends marked single (4 ranks, 4
 * rounds, 1-16 MiB 1.0-1.35x the time by ring copies), with one descriptor in flight per pair or
 * sixteen.
 *
 * Tree: where, besides, every rank is bound to one CPU and each CPU's ranks are neighbours in rank
 * order (kolo__mesh.world_blocks, agreed at init: kolorun's and the benchmarks' binding of such a
 * host), on a power of two of members, buffers above DIRECT_MAX (above SPREAD_MAX_BLOCKS_4 on 4
 * members) up to TREE_MAX go down the binomial tree with every send marked `single`. Each member's
 * position in the tree is its rank XOR the root's, so every subtree is an aligned block of ranks,
 * which sits on one CPU: there a member reads the buffer single-copy from a parent that has just
 * written it into that CPU's cache, and the buffer crosses between CPUs once per block instead of
 * once per member (the spread) or at every link the chain's order happens to cross (root 1 on 4
 * ranks: 1 -> 2 -> 3 -> 0 crosses twice). Intel Xeon VM, 2 vCPUs, ranks bound in blocks, launches
 * alternated, medians, us per call: 4 ranks, root 0 (5 rounds), tree against the chain and the
 * spread, 512 KiB 70.9 against 81.3 and 84.6, 768 KiB 129 against 143 and 179, 1 MiB 203 against
 * 215 and 250; root 1 (4 rounds) 512 KiB 53.5 against 104 and 65.4, 1 MiB 182 against 275 and 213,
 * 2 / 4 MiB 429 / 826 against 552 / 1113 (the chain); 2-8 MiB 0.90-0.94x the chain's time from
 * root 0, 16 MiB alike, 32 and 64 MiB 1.25-1.29x (hence TREE_MAX); 128 and 256 KiB 1.00-1.16x the
 * spread's time (hence SPREAD_MAX_BLOCKS_4); 8 ranks (3 rounds) 128 KiB-1 MiB 0.62-0.98x the
 * spread's time, 2-16 MiB 0.69-0.82x the chain's, 32 MiB alike; 16 ranks (2 rounds) 2 and 8 MiB
 * 0.62 and 0.81x the chain's. Bound otherwise the tree loses: ranks dealt round the CPUs (kolorun
 * --bind-to core), 4 ranks, 128-512 KiB 1.9-2.8x the spread's time and 2-4 MiB 1.16-1.19x the
 * chain's; unbound 128-512 KiB 1.05-2.6x. The small buffers' tree takes the same positions on a
 * power of two of members (64 KiB from root 1, 4 ranks bound: 7.2 us against 10.9 with positions
 * relative to the root; from root 0 the two are the same tree). So does the chain where the ranks
 * are bound in blocks (on a power of two of members, beside the tree or not): 4 ranks, 3 rounds,
 * root 1 32 / 64 MiB 8146 / 19960 us against 9792 / 25201 with positions relative to the root (1
 * -> 2 -> 3 -> 0), root 2 0.95-0.96x, root 0 alike. */
#include "coll.h"

#define DIRECT_MAX (64u << 10)
#define MAX_CHUNKS 4096
#define SPREAD_MAX (1u << 20)
#define SPREAD_MAX_4 (512u << 10) /* on 4 members (above) */
#define SPREAD_MAX_BLOCKS_4 (256u << 10) /* on 4 members bound in blocks, where the tree takes over (above) */
#define SPREAD_MEMBERS 64
#define TREE_MAX ((size_t)16 << 20)
#define SPLIT_MIN_2 ((size_t)64 << 10)  /* split (below), 2 members */
#define SPLIT_MIN_TREE ((size_t)1 << 20) /* split, the tree's edge to position n/2 */
#define CHOICE_MAX_2 (SPLIT_MIN_2 << KOLO_BCAST_CLASSES) /* 2 MiB: split or ring copies below (below) */

static uint64_t spread_runs, tree_runs, split_runs;

uint64_t kolo__coll_broadcast_spread_runs(void) { return __atomic_load_n(&spread_runs, __ATOMIC_RELAXED); }
uint64_t kolo__coll_broadcast_tree_runs(void) { return __atomic_load_n(&tree_runs, __ATOMIC_RELAXED); }
uint64_t kolo__coll_broadcast_split_runs(void) { return __atomic_load_n(&split_runs, __ATOMIC_RELAXED); }

/* Split: where a receiver reads the buffer single-copy, its CPU makes the whole copy while the
 * sender's waits. On a split edge the receiver reads the first half single-copy as usual and
 * the sender writes the second half into the receiver's buffer itself (process_vm_writev), so
 * the two CPUs copy at once. The receiver sends where that half goes, and how long its buffer
 * is; the sender writes only into a buffer as long as its own (or fails the call with a
 * mismatch, as a message of the wrong length does), then sends whether it wrote, and its
 * length; if it could not write (CMA refused), it sends the half as a message instead.
 *
 * Split edges: on 2 members every broadcast from SPLIT_MIN_2 where the pair reads single-copy
 * (kolo__coll_group_flags: the world's pairs, or its host's; so not with KOLO_SHM_CMA=0, nor over
 * TCP), and the tree's edge from the root to position n/2 from SPLIT_MIN_TREE, which with the
 * ranks in two blocks is the edge that crosses to the other CPU: there one CPU's members made the
 * copies of n/2 of them, the root's CPU of n/2 - 1. Intel Xeon VM, 2 vCPUs, launches alternated
 * with the build before, 3 rounds, medians, us per call: 2 ranks 32 KiB 2.1 against 2.4 (split from 64
 * KiB: at 4-32 KiB the two more messages cost more, 16 KiB 1.8 against 0.9), 128 KiB 3.7 against
 * 5.2, 512 KiB 10.6 against 19.8, 2 MiB 62 against 153, 8 MiB 369 against 627, 32 MiB 1592
 * against 2433 (Open MPI 5.9, 18.0, 181, 777, 3284); 4 ranks bound in blocks, roots 0 and 1, 512
 * KiB 1.04-1.09x (hence SPLIT_MIN_TREE), 1 MiB 0.84-0.92x, 2-16 MiB 0.74-0.84x; 8 ranks 1-16 MiB
 * alike (0.98-1.02x). */
static size_t split_at(size_t bytes) { return (bytes / 2) & ~(size_t)4095; }

static int test_refuse_write; /* test hook: the nth write from now is refused (EPERM) */

void kolo__coll_broadcast_test_refuse_write(int nth) { test_refuse_write = nth; }

static int split_recv(kolo__mesh *m, int from, char *p, size_t bytes)
{
    size_t h = split_at(bytes);
    uint64_t where[2] = {(uint64_t)(uintptr_t)(p + h), bytes}, done[2] = {0, 0};
    kolo__xfer xw, xh, xd;
    kolo__xfer *ptrs[3] = {&xw, &xh, &xd};
    kolo__isend(m, from, where, sizeof(where), &xw);
    kolo__irecv(m, from, p, h, &xh);
    kolo__irecv(m, from, done, sizeof(done), &xd);
    int st = kolo__wait(m, ptrs, 3);
    if (st != KOLO_OK) return st;
    if (done[1] != bytes)
        return kolo__err(KOLO_ERR_MISMATCH,
                         "broadcast: rank %d sends %llu bytes where rank %d expects %zu: the ranks called "
                         "collectives with different counts, dtypes or orders",
                         from, (unsigned long long)done[1], m->rank, bytes);
    if (done[0] == 0) return KOLO_OK;
    kolo__irecv(m, from, p + h, bytes - h, &xh); /* the sender could not write it */
    return kolo__wait1(m, &xh);
}

typedef struct split_send {
    int to;
    uint64_t where[2], done[2];
    kolo__xfer xw;
} split_send;

/* The sender's side, first part: the first half goes out as a message, read once and kept
 * (`single`) where the sender writes the second half. */
static void split_post(kolo__mesh *m, split_send *sp, int to, char *p, size_t bytes, kolo__xfer *half, bool single)
{
    sp->to = to;
    kolo__irecv(m, to, sp->where, sizeof(sp->where), &sp->xw);
    kolo__isend(m, to, p, split_at(bytes), half);
    half->single = single;
}

/* Second part, once the other sends are posted: writes the second half (if `write`) and posts
 * what it did (and the half itself, if it did not write) into xs[*k...], at most 2. */
static int split_push(kolo__mesh *m, split_send *sp, char *p, size_t bytes, kolo__xfer *xs, kolo__xfer **ptrs, int *k,
                      bool write)
{
    int st = kolo__wait1(m, &sp->xw);
    if (st != KOLO_OK) return st;
    size_t h = split_at(bytes);
    bool same = sp->where[1] == bytes;
    int e = !same ? 0
            : write ? kolo__coll_write_peer(m, sp->to, sp->where[0], p + h, bytes - h, &test_refuse_write, "broadcast")
                    : ECANCELED; /* the receiver sees "not written" and takes the half as a message */
    sp->done[0] = (uint64_t)e;
    sp->done[1] = bytes;
    kolo__isend(m, sp->to, sp->done, sizeof(sp->done), &xs[*k]);
    ptrs[*k] = &xs[*k];
    (*k)++;
    if (same && sp->done[0]) {
        kolo__isend(m, sp->to, p + h, bytes - h, &xs[*k]);
        ptrs[*k] = &xs[*k];
        (*k)++;
    } else if (same) {
        __atomic_fetch_add(&split_runs, 1, __ATOMIC_RELAXED);
    }
    if (same) return KOLO_OK;
    return kolo__err(KOLO_ERR_MISMATCH,
                     "broadcast: rank %d expects %llu bytes where rank %d sends %zu: the ranks called "
                     "collectives with different counts, dtypes or orders",
                     sp->to, (unsigned long long)sp->where[1], m->rank, bytes);
}

/* A member's position relative to the root (0 the root): its rank XOR the root's (`xor`, on a
 * power of two of members), otherwise its distance past the root; and the world rank of the
 * member at position v. */
static int position(int r, int root, int n, bool xor) { return xor ? r ^ root : (r - root + n) % n; }
static int member_at(const kolo__group *g, int v, int root, bool xor)
{
    return kolo__g2w(g, xor ? v ^ root : (v + root) % g->size);
}

/* The binomial tree over positions: on a power of two of members a member's rank XOR the
 * root's (so that each subtree is an aligned block of ranks; tree, above), otherwise its
 * distance from the root. `single` marks the sends as read once and kept; with `split` (on a
 * power of two of members) the edge from the root to position n/2 is split (above). */
static int binomial(kolo__mesh *m, const kolo__group *g, char *p, size_t bytes, int root, bool single, bool split)
{
    int n = g->size, r = g->rank;
    bool x = (n & (n - 1)) == 0;
    int v = position(r, root, n, x), mask = 1, st = KOLO_OK;
    split = split && x;
    while (mask < n && !(v & mask)) mask <<= 1;
    if (v != 0) {
        int fw = member_at(g, v - mask, root, x);
        if (split && v == n / 2) {
            st = split_recv(m, fw, p, bytes);
        } else {
            kolo__xfer xr;
            kolo__irecv(m, fw, p, bytes, &xr);
            st = kolo__wait1(m, &xr);
        }
    }
    kolo__xfer xs[34]; /* log2(n) sends at most, n an int, and a split's two */
    kolo__xfer *ptrs[34];
    int k = 0;
    split_send sp;
    bool splitting = false;
    for (mask >>= 1; mask > 0 && st == KOLO_OK; mask >>= 1) {
        int to = v + mask;
        if (to >= n) continue;
        int tw = member_at(g, to, root, x);
        if (split && v == 0 && to == n / 2) {
            split_post(m, &sp, tw, p, bytes, &xs[k], true);
            splitting = true;
        } else {
            kolo__isend(m, tw, p, bytes, &xs[k]);
            xs[k].single = single;
        }
        ptrs[k] = &xs[k];
        k++;
    }
    int sst = splitting ? split_push(m, &sp, p, bytes, xs, ptrs, &k, true) : KOLO_OK;
    if (st != KOLO_OK || k == 0) return st;
    st = kolo__wait(m, ptrs, k); /* (a split whose descriptor never came still waits its sends out) */
    return st != KOLO_OK ? st : sst;
}

/* Split or ring copies: on 2 members whose pair chooses its ways from timings (KOLO_SHM_CMA=auto),
 * the root times its broadcasts below CHOICE_MAX_2 per class of their bytes (x2 from
 * SPLIT_MIN_2) and sends each the way its timings favour (kolo__choice_pick and
 * kolo__choice_learn, coll_util.c): split, or both halves as messages by ring copies, which the
 * receiver takes as it takes a split whose write the kernel refused (split_recv), so it needs
 * no word of the way and nothing new goes on the wire. The root's clock ends when its last bytes
 * are in the shared ring, up to a ring's worth before the receiver's; in a loop of broadcasts the
 * next call waits for that room, so a class's calls in a row still time the pair's pace. A class
 * starts as the nearest smaller one that timed both ways settled (else the split).
 *
 * Zen 3 VM (AMD EPYC family 25 model 1, 2 vCPUs), kolo-bench in the harness's bands, 4 rounds
 * rotating with the build before (which always split) and ring copies pinned (KOLO_SHM_CMA=0),
 * medians of two such sets: ring copies pinned ran 64 KiB-1 MiB at 0.51-1.16x the split's time,
 * 2-16 MiB at 0.92-1.61x, 64-256 MiB at 1.21-1.58x, single rounds 0.45-3.43x (the VM's two
 * states; the transport's own choice of how to write the ring probes too). Choosing at every
 * size, 64 KiB-1 MiB ran 0.64-0.90x the time, but the probes of the slower way cost 2-16 MiB
 * 1.04-1.31x and 64 MiB 1.61x (a band of 3 calls a size), hence CHOICE_MAX_2; with it, 64 KiB-1
 * MiB 0.52-0.85x (4 more rounds; Open MPI 1.22-1.85x the build before's time there). */
static const char *const WAYS_BC[2] = {"split", "ring copies"};
enum { BC_SPLIT = 0, BC_COPIES = 1 };
static uint64_t copies_runs, test_delay_ns[2];

uint64_t kolo__coll_broadcast_copies_runs(void) { return __atomic_load_n(&copies_runs, __ATOMIC_RELAXED); }
void kolo__coll_broadcast_test_delay(int way, uint64_t ns)
{
    if (way == BC_SPLIT || way == BC_COPIES) test_delay_ns[way] = ns;
}

static int bcast_class(size_t bytes)
{
    int k = 0;
    while (k < KOLO_BCAST_CLASSES - 1 && bytes >= (SPLIT_MIN_2 << (k + 1))) k++;
    return k;
}

/* The root of a 2-member broadcast from SPLIT_MIN_2 that reads single-copy, sending to `to`. */
static int pair_root(kolo__mesh *m, char *p, size_t bytes, int to)
{
    uint64_t start = kolo__now_ns();
    kolo__choice *c = NULL;
    int way = BC_SPLIT;
    if (bytes < CHOICE_MAX_2 && kolo__shm_cma_state(m->conns[to]) == 2) {
        int k = bcast_class(bytes), hint = -1;
        c = &m->bcast[k];
        for (int j = k - 1; j >= 0 && !c->every && hint < 0; j--) hint = kolo__choice_verdict(&m->bcast[j], start);
        way = kolo__choice_pick(c, start, hint, false);
    }
    if (way == BC_COPIES) m->call_way = KOLO_WAY_RING;
    split_send sp;
    kolo__xfer xs[3];
    kolo__xfer *ptrs[3] = {&xs[0]};
    int k = 1;
    split_post(m, &sp, to, p, bytes, &xs[0], way == BC_SPLIT);
    int sst = split_push(m, &sp, p, bytes, xs, ptrs, &k, way == BC_SPLIT);
    int st = kolo__wait(m, ptrs, k);
    m->call_way = KOLO_WAY_AUTO;
    if (st == KOLO_OK) st = sst;
    if (st != KOLO_OK) return st;
    if (way == BC_COPIES) __atomic_fetch_add(&copies_runs, 1, __ATOMIC_RELAXED);
    kolo__sleep_ns(test_delay_ns[way]);
    if (c && kolo__choice_repeat(c, way)) kolo__choice_learn(c, way, start, bytes, "broadcast", WAYS_BC);
    return KOLO_OK;
}

/* The root sends to every other member itself; `single` marks its sends as read once and kept
 * (spread, above). */
static int from_root(kolo__mesh *m, const kolo__group *g, void *p, size_t bytes, int root, bool single)
{
    int n = g->size;
    if (g->rank != root) {
        kolo__xfer x;
        kolo__irecv(m, kolo__g2w(g, root), p, bytes, &x);
        return kolo__wait1(m, &x);
    }
    kolo__xfer xs[SPREAD_MEMBERS - 1];
    kolo__xfer *ptrs[SPREAD_MEMBERS - 1];
    int k = 0;
    for (int i = 0; i < n && k < SPREAD_MEMBERS - 1; i++) {
        if (i == root) continue;
        kolo__isend(m, kolo__g2w(g, i), p, bytes, &xs[k]);
        xs[k].single = single;
        ptrs[k] = &xs[k];
        k++;
    }
    return kolo__wait(m, ptrs, k);
}

/* The chain: positions bound in blocks are rank XOR root as in the tree, so that the chain
 * crosses between CPUs once per block whichever the root; received in place, chunk by chunk,
 * each chunk passed on as it arrives. */
static int chain(kolo__mesh *m, const kolo__group *g, char *p, size_t bytes, int root)
{
    int n = g->size, r = g->rank;
    bool x = m->world_blocks && (n & (n - 1)) == 0;
    int v = position(r, root, n, x);
    int prev = member_at(g, (v - 1 + n) % n, root, x), next = member_at(g, (v + 1) % n, root, x);
    size_t chunk = kolo__coll_chunk();
    if (bytes / chunk >= MAX_CHUNKS) chunk = bytes / (MAX_CHUNKS - 1);
    size_t nc = (bytes + chunk - 1) / chunk;
    kolo__xfer *rx = kolo__calloc(2 * nc, sizeof(kolo__xfer));
    kolo__xfer **ptrs = kolo__calloc(nc, sizeof(kolo__xfer *));
    if (!rx || !ptrs) {
        kolo__free(rx);
        kolo__free(ptrs);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for broadcast bookkeeping");
    }
    kolo__xfer *sx = rx + nc;
    int st = KOLO_OK;
    bool last = v == n - 1;
    if (v != 0)
        for (size_t c = 0; c < nc; c++)
            kolo__irecv(m, prev, p + c * chunk, KOLO_MIN(chunk, bytes - c * chunk), &rx[c]);
    for (size_t c = 0; c < nc && st == KOLO_OK; c++) {
        if (v != 0) st = kolo__wait1(m, &rx[c]);
        if (st == KOLO_OK && !last) kolo__isend(m, next, p + c * chunk, KOLO_MIN(chunk, bytes - c * chunk), &sx[c]);
    }
    if (st == KOLO_OK && !last) {
        for (size_t c = 0; c < nc; c++) ptrs[c] = &sx[c];
        st = kolo__wait(m, ptrs, (int)nc);
    }
    kolo__free(rx);
    kolo__free(ptrs);
    return st;
}

/* Agreed: on a crowded host (above) the spread and the tree read the root's (or a parent's)
 * buffer single-copy, by the kernel's process_vm_readv; the chain passes chunks on, here by ring
 * copies. The rules above for the spread and the tree were measured on an Intel Xeon VM. On a Zen
 * 3 VM (AMD EPYC family 25 model 1, 2 vCPUs), kolo-bench bound in blocks, 50 and 20 calls a size,
 * 2-3 launches each, us per call, the spread or tree against the chain (by the pairs' own ways):
 * 4 ranks 128 KiB 37-46 against 27-31, 512 KiB 111-119 against 74-114, 1 MiB 275-338 against
 * 144-240, 4 MiB 1001-1052 against 564-955; 8 ranks 128 KiB 88-106 against 34-36, 1 MiB 418-501
 * against 280-287. So the members of the world choose between the two from their timings, per
 * class of the broadcast's bytes (x2 from DIRECT_MAX to TREE_MAX), and must agree, as they talk
 * along different edges in each. The schedule is the same on every member (each sees the same
 * calls of each class, whoever roots them): CROWD_RUN calls the rule's way, then CROWD_RUN down
 * the chain; each member times each run from the end of its first call to the end of its last
 * (its pace, the time between its calls included); one allreduce of integers sums the members'
 * runs, so every member reads the same sums, and the cheaper way is kept for CROWD_KEEP_FIRST
 * calls of the class, twice as many after each verdict up to 256, then probed again (a verdict
 * taken among a launch's first calls, or in another pattern of calls, does not last). In the
 * probe and after, the chain goes by ring copies: by the pairs' own choice its first calls
 * probe ring copies against CMA inside the run. What chose wrong: alternate calls (a call after
 * one the other way starts skewed: the chain's root is done first, the spread's last; the tree
 * at 1 MiB in 3 of 4 launches where the chain took 0.5-0.7x its time), each member's fastest
 * call (one that comes late to a spread finds its data ready: the spread at 256 KiB every
 * time), means of single calls (a launch's first calls take up to 5x longer). The world only:
 * its calls on a mesh come in one order on every member; a process set's interleave with others'
 * (docs/performance.md, "Changes, one at a time", has the figures as landed). */
#define CROWD_RUN 4
#define CROWD_PROBE (2 * CROWD_RUN)
#define CROWD_KEEP_FIRST 16u    /* calls a class keeps its first verdict, twice as many after each, */
#define CROWD_KEEP_DOUBLINGS 4u /* up to 256 */
enum { CR_RULE = 0, CR_CHAIN = 1 };
static const char *const WAYS_CR[2] = {"spread or tree", "chain"};
static uint64_t crowd_chain_runs, crowd_delay_ns[2];

uint64_t kolo__coll_broadcast_crowd_chain_runs(void) { return __atomic_load_n(&crowd_chain_runs, __ATOMIC_RELAXED); }
void kolo__coll_broadcast_test_crowd_delay(int way, uint64_t ns)
{
    if (way == CR_RULE || way == CR_CHAIN) crowd_delay_ns[way] = ns;
}

static int crowd_class(size_t bytes)
{
    int k = 0;
    while (k < KOLO_BCAST_CROWD_CLASSES - 1 && bytes > ((size_t)DIRECT_MAX << (k + 1))) k++;
    return k;
}

/* The probe runs CROWD_RUN calls the rule's way, then as many by the chain; between probes, the
 * verdict. */
static int crowd_way(const kolo__bcast_crowd *c)
{
    return c->calls < CROWD_PROBE ? c->calls >= CROWD_RUN : c->way - 1;
}

/* After a call of class c that ran `way`: the probe's runs' times, and at the probe's end the
 * verdict, agreed by one allreduce. */
static int crowd_learn(kolo__mesh *m, const kolo__group *g, kolo__bcast_crowd *c, int way, size_t bytes)
{
    uint32_t i = c->calls++;
    if (i >= CROWD_PROBE) {
        if (c->calls >= CROWD_PROBE + (CROWD_KEEP_FIRST << KOLO_MIN(c->verdicts, CROWD_KEEP_DOUBLINGS)))
            c->calls = 0; /* probe again */
        return KOLO_OK;
    }
    uint64_t now = kolo__now_ns();
    if (i % CROWD_RUN == 0) { /* a run's pace: from the end of its first call to the end of its last */
        c->mark = now;
    } else if (i % CROWD_RUN == CROWD_RUN - 1) {
        c->t[way] = KOLO_MAX(now - c->mark, 1); /* (0: not run) */
    }
    if (i != CROWD_PROBE - 1) return KOLO_OK;
    int64_t mine[4] = {(int64_t)c->t[0], (int64_t)c->t[1], c->t[0] > 0, c->t[1] > 0}, sum[4];
    c->t[0] = c->t[1] = 0;
    int st = kolo__coll_allreduce(m, g, mine, sum, 4, KOLO_INT64, KOLO_SUM, 1.0, 1.0);
    if (st != KOLO_OK) return st;
    /* every member ran each way (the counts), and the chain's runs took less in all */
    int v = sum[2] == (int64_t)g->size && sum[3] == sum[2] && sum[1] < sum[0];
    if (c->way != v + 1 && m->rank == 0)
        KOLO_TRACE("broadcast of %zu bytes on a crowded host: %s (%.1f us against %.1f a call, the members' runs "
                   "each way summed)", bytes, WAYS_CR[v], (double)sum[v] * 1e-3 / (CROWD_RUN - 1),
                   (double)sum[1 - v] * 1e-3 / (CROWD_RUN - 1));
    c->way = (uint8_t)(v + 1);
    if (c->verdicts < 255) c->verdicts++;
    c->calls = CROWD_PROBE;
    return KOLO_OK;
}

int kolo__coll_broadcast(kolo__mesh *m, const kolo__group *g, void *buf, size_t bytes, int root)
{
    int n = g->size;
    if (n == 1) return KOLO_OK;
    char *p = buf;
    /* a host with more ranks than cores, every pair reading single-copy; bound in blocks */
    bool crowded = n > 3 && kolo__coll_single_copy_group(m, g);
    bool blocks = crowded && m->world_blocks && (n & (n - 1)) == 0;
    bool tree = blocks && bytes > (n == 4 ? SPREAD_MAX_BLOCKS_4 : DIRECT_MAX) && bytes <= TREE_MAX;
    bool spread = crowded && !tree && bytes > DIRECT_MAX && n <= SPREAD_MEMBERS &&
                  bytes <= (n == 4 ? SPREAD_MAX_4 : SPREAD_MAX);
    if (n == 2 && bytes >= SPLIT_MIN_2 && kolo__coll_single_copy_group(m, g))
        return g->rank == root ? pair_root(m, p, bytes, kolo__g2w(g, !g->rank))
                               : split_recv(m, kolo__g2w(g, root), p, bytes);
    if (n > 3 && bytes <= DIRECT_MAX) return binomial(m, g, p, bytes, root, false, false);
    kolo__bcast_crowd *c = (tree || spread) && g->size == m->size ? &m->bcast_crowd[crowd_class(bytes)] : NULL;
    int way = c ? crowd_way(c) : CR_RULE, st;
    if (way == CR_CHAIN) {
        __atomic_fetch_add(&crowd_chain_runs, 1, __ATOMIC_RELAXED);
        m->call_way = KOLO_WAY_RING;
        st = chain(m, g, p, bytes, root);
        m->call_way = KOLO_WAY_AUTO;
    } else if (tree) {
        __atomic_fetch_add(&tree_runs, 1, __ATOMIC_RELAXED);
        st = binomial(m, g, p, bytes, root, true, bytes >= SPLIT_MIN_TREE);
    } else if (n <= 3 || spread) {
        if (spread) __atomic_fetch_add(&spread_runs, 1, __ATOMIC_RELAXED);
        st = from_root(m, g, p, bytes, root, spread);
    } else {
        st = chain(m, g, p, bytes, root);
    }
    if (st != KOLO_OK || !c) return st;
    kolo__sleep_ns(crowd_delay_ns[way]);
    return crowd_learn(m, g, c, way, bytes);
}
