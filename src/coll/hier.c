/* hier.c - the hierarchical allreduce, allgather and reducescatter, for a group spread over
 * several hosts.
 *
 * A flat ring over ranks numbered host by host crosses each host's boundary once each way, and
 * that link carries 2(n-1)/n of the buffer (n ranks): nearly twice the buffer, whatever the
 * hosts. In three stages the network carries less:
 *   1. reduce-scatter within each host (shared memory): local member i holds block i of the
 *      host's sum, 1/L of the buffer (L members per host);
 *   2. allreduce of block i among the members of local index i on every host (h of them, one
 *      per host), all L such allreduces at once: each host sends 2(h-1)/h of a block per member,
 *      2(h-1)/h of the buffer in all;
 *   3. allgather within each host.
 * With 2 hosts that is the buffer once against 2(n-1)/n (1.5x with 2 ranks per host, 1.9x with
 * 8); with many hosts the two approach each other (2x against 2x). The stages run one after
 * another, so where the network is as fast as the host's memory the flat ring, which keeps every
 * link busy at once, can be the faster: see the measurements at HIER_AUTO_MIN.
 *
 * It needs the same number of members (2 or more) on each of 2 or more hosts; otherwise the flat
 * ring runs. Every member decides alike: from the group, the bytes, the hosts every rank
 * published at init (host keys: boot id and network namespace) and the mode all ranks agreed on
 * (KOLO_HIERARCHICAL_ALLREDUCE, the least of all ranks' settings: core/kolo.c).
 *
 * The stages reduce with SUM for AVERAGE and apply the scaling (1/n, the postscale) once, to the
 * block each member owns after stage 2, before the allgather; a prescale goes into stage 1. Every
 * member ends with the same bits: each block is finished by one cross allreduce, whose members
 * agree, and copied to the others of its host.
 *
 * Allgather: the flat ring's link between two hosts carries (n-1)/n of the output. Across the
 * hosts first, each member sends its own block to the members of its local index on the other
 * hosts (one message each, straight into their outputs), then within each host every member
 * sends the H blocks it has (its own and those just received) to the others there, marked
 * `single` as the flat exchange's sends (shm.c: each receiver reads them once, single-copy): each
 * block crosses the network once per other host, (h-1)/h of the output per host, half the flat
 * ring's with 2 hosts. No copy but the own block's. Measured as the allreduce below (4 ranks as 2
 * hosts of 2, launches alternated with KOLO_HIERARCHICAL_ALLGATHER=0, medians of the per-round
 * ratios of the time, out of place / in place; results checked):
 *   2 Gbit/s (2 rounds): 512 KiB-4 MiB 0.65-0.68x, 8-16 MiB 0.70-0.74x;
 *   10 Gbit/s (3 rounds): 512 KiB-16 MiB 0.53-0.64x, 32-64 MiB 0.66-0.79x;
 *   not shaped (3 rounds): 1-32 MiB 0.51-0.70x, 64 MiB 0.92x; 256-512 KiB 0.75-1.9x.
 * A first version gathered through a scratch buffer and copied every block to its place at the
 * end: not shaped, 64 MiB took 1.22-1.38x the flat ring's time.
 *
 * Reducescatter, the allreduce's first half (and governed by its mode): the blocks of the members
 * of each local index are packed one after another (one copy of the buffer), a reduce-scatter
 * within each host gives member i the host's sum of its local index's blocks, and a reduce-scatter
 * of those among the members of local index i across the hosts gives each its own block: (h-1)/h
 * of the buffer per host over the network, against the flat ring's (n-1)/n per link. Only where
 * KOLO_HIERARCHICAL_ALLREDUCE is 1: see kolo__coll_hier_reducescatter for why.
 *
 * The steps within a host run as they would among the ranks of a world on that one host: where
 * every pair of the host reads single-copy (kolo__coll_group_flags), 2 members' reduce-scatter
 * goes direct and their allgather is pushed (allreduce.c, allgather.c). Measured with
 * bench/hosts.sh, 2 hosts of 2 ranks, the stages with and without (5 rounds alternated, the
 * median of every call, 50-250 calls a size a round): not shaped, allreduce 256 KiB-64 MiB
 * 0.68-0.94x the time (2 MiB 920 us against 1348), reducescatter 0.69-0.98x; at 10 Gbit/s
 * (3-5 rounds) 0.73-0.93x up to 1 MiB, 2-8 MiB 0.99-1.06x and 16-64 MiB 0.96-1.07x, where the
 * link sets the pace. */
#include "coll.h"

#include "../reduce/reduce.h"

#include <stdlib.h>

static uint64_t hier_runs, hier_ag_runs, hier_rs_runs;

uint64_t kolo__coll_hier_runs(void) { return __atomic_load_n(&hier_runs, __ATOMIC_RELAXED); }
uint64_t kolo__coll_hier_ag_runs(void) { return __atomic_load_n(&hier_ag_runs, __ATOMIC_RELAXED); }
uint64_t kolo__coll_hier_rs_runs(void) { return __atomic_load_n(&hier_rs_runs, __ATOMIC_RELAXED); }
void kolo__coll_hier_ran(void) { __atomic_fetch_add(&hier_runs, 1, __ATOMIC_RELAXED); }

/* With the mode at auto, allreduces from this many bytes go hierarchical. Measured on this
 * project's 2-vCPU Intel Xeon VM: two network namespaces joined by a veth pair stand for two
 * hosts, 2 ranks in each (4 ranks on 2 vCPUs), started by hand (KOLO_RANK, KOLO_RENDEZVOUS),
 * kolo-bench float32 sum, 10 calls per size, launches alternated with KOLO_HIERARCHICAL_ALLREDUCE=0,
 * medians of the per-round ratios of the time, out of place / in place:
 *   the link shaped to 2 Gbit/s (tc tbf; 2 rounds): 256 KiB-2 MiB 0.67x (the flat ring at 0.16
 *     GB/s algbw, 1.5 buffers over the link, against 0.23-0.25: one), 4 MiB 0.70x, 8 MiB 0.74x,
 *     16 MiB 0.80x; 128 KiB 0.67x / 1.22x;
 *   shaped to 10 Gbit/s (3 rounds): 512 KiB-8 MiB 0.60-0.71x, 16-64 MiB 0.65-0.78x; 128-256 KiB
 *     0.66-0.92x out of place but 2.0-3.2x in place;
 *   not shaped (the kernel's TCP copies on the same 2 vCPUs, 3 rounds): 1-64 MiB 0.50-0.89x,
 *     512 KiB 1.03x, 128-256 KiB 0.47-0.83x with single calls of 1-1.4 ms among them.
 * Below 1 MiB the three stages' extra round trips and wake-ups (with more ranks than cores) cost
 * as much as the bytes they save unless the network is slow; 1 (KOLO_HIERARCHICAL_ALLREDUCE=1)
 * runs it from HIER_ON_MIN. That was KOLO_SMALL_ALLREDUCE_MAX (above 64 KiB) until the flat
 * allreduce across hosts became recursive halving (allreduce.c, HALVING_MIN), which carries the
 * same bytes over the network: against it, at 10 Gbit/s with ranks yielding (bench/hosts.sh),
 * 128 KiB took 1.9-2.9x its time in three stages (206-310 us against 105), 256 KiB 0.47-0.65x,
 * 512 KiB 0.81-0.97x; at 2 Gbit/s 1.00x at every size. */
#define HIER_AUTO_MIN ((size_t)1 << 20)
#define HIER_ON_MIN ((size_t)256 << 10)
/* The same for allgathers (bytes in all), and where 1 starts them: below, the exchange or the
 * ring. See "Allgather" at the top for the measurements. */
#define HIER_AG_AUTO_MIN ((size_t)1 << 20)
#define HIER_AG_MIN ((size_t)256 << 10)

/* How a group lies over its hosts, made once with the group (kolo__group_hosts_make) so that the
 * collectives across hosts only read it: the members host by host (hosts in the order of their
 * numbers, a host's members in member order), and where each of 2 or more hosts holds the same
 * number L (2 or more) of them, the groups the stages run on. cross[i * H + k]: the k-th member,
 * in member order, of those of local index i (one per host; the hosts need not come in the same
 * order for every i, as launchers may number ranks round robin, and a group's ranks ascend).
 * local: the members on this member's host; across: those of its local index on every host (its
 * own layout made with it: one member a host). The per-call sort of the members this replaced
 * kept them on the stack, and the algorithms across hosts declined above 1024 members. */
struct kolo__hosts {
    int H, L;     /* hosts; members on each where even, else 0 */
    int me_local, me_host; /* this member's local index and its host's place in order (even, a
                            * member), else -1 */
    int *order;   /* [n]: order[h * L + i] is the member of local index i on the h-th host */
    int *cross;   /* [n], even only */
    kolo__group local, across; /* this member's, even only (size 0 otherwise) */
};

void kolo__group_hosts_free(kolo__group *g)
{
    kolo__hosts *h = (kolo__hosts *)g->hosts;
    if (h) kolo__group_hosts_free(&h->across);
    kolo__free(h);
    g->hosts = NULL;
}

int kolo__group_hosts_make(kolo__group *g, const int *host_of)
{
    int n = g->size, top = 0, H = 0;
    g->hosts = NULL;
    if (!host_of || n < 2) return KOLO_OK;
    for (int i = 0; i < n; i++) top = KOLO_MAX(top, host_of[kolo__g2w(g, i)] + 1);
    /* counting sort by host, stable: members in member order within each host */
    int *first = kolo__calloc((size_t)top + 1, sizeof(int));
    if (!first) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the hosts of a group of %d members", n);
    for (int i = 0; i < n; i++) first[host_of[kolo__g2w(g, i)] + 1]++;
    int L = 0;
    for (int h = 0; h < top; h++) {
        int k = first[h + 1];
        if (k == 0) continue;
        L = H++ == 0 || k == L ? k : -1;
    }
    if (H < 2) {
        kolo__free(first);
        return KOLO_OK;
    }
    bool even = L >= 2;
    size_t ints = (size_t)n + (even ? (size_t)n + (size_t)n / (size_t)H + (size_t)H : 0);
    kolo__hosts *hs = kolo__calloc(1, sizeof(*hs) + ints * sizeof(int));
    if (!hs) {
        kolo__free(first);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the hosts of a group of %d members", n);
    }
    hs->order = (int *)(hs + 1);
    for (int h = 0; h < top; h++) first[h + 1] += first[h];
    for (int i = 0; i < n; i++) hs->order[first[host_of[kolo__g2w(g, i)]]++] = i;
    kolo__free(first);
    hs->H = H;
    hs->me_local = hs->me_host = -1;
    g->hosts = hs;
    if (!even) return KOLO_OK;
    hs->L = L;
    hs->cross = hs->order + n;
    hs->local.ranks = hs->cross + n;
    hs->across.ranks = hs->local.ranks + L;
    /* cross, in member order: member order[p] has local index p % L */
    int *pos = kolo__calloc((size_t)n + (size_t)L, sizeof(int)), *at = pos ? pos + n : NULL;
    if (!pos) {
        kolo__group_hosts_free(g);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the hosts of a group of %d members", n);
    }
    for (int p = 0; p < n; p++) pos[hs->order[p]] = p;
    for (int i = 0; i < n; i++) hs->cross[pos[i] % L * H + at[pos[i] % L]++] = i;
    int me = g->rank;
    if (me >= 0) {
        hs->me_local = pos[me] % L;
        hs->me_host = pos[me] / L;
        const int *here = hs->order + hs->me_host * L, *mine = hs->cross + hs->me_local * H;
        hs->local = (kolo__group){.size = L, .rank = hs->me_local, .ranks = hs->local.ranks};
        for (int i = 0; i < L; i++) hs->local.ranks[i] = kolo__g2w(g, here[i]);
        hs->across = (kolo__group){.size = H, .rank = -1, .ranks = hs->across.ranks};
        for (int k = 0; k < H; k++) {
            hs->across.ranks[k] = kolo__g2w(g, mine[k]);
            if (mine[k] == me) hs->across.rank = k;
        }
    }
    kolo__free(pos);
    int st = me >= 0 ? kolo__group_hosts_make(&hs->across, host_of) : KOLO_OK; /* one member a host */
    if (st != KOLO_OK) kolo__group_hosts_free(g);
    return st;
}

const int *kolo__coll_host_order(const kolo__group *g, int *hosts)
{
    *hosts = g->hosts ? g->hosts->H : 0;
    return g->hosts ? g->hosts->order : NULL;
}

/* g's layout where the stages can run on it: 4 or more members, as many on each of 2 or more
 * hosts, this process one of them; else NULL. */
static const kolo__hosts *even_hosts(const kolo__group *g)
{
    const kolo__hosts *hs = g->hosts;
    return g->size >= 4 && g->rank >= 0 && hs && hs->L >= 2 ? hs : NULL;
}

bool kolo__coll_hier_groups(const kolo__mesh *m, const kolo__group *g, size_t bytes, const kolo__group **lg,
                            const kolo__group **xg)
{
    if (m->hier == 0 || (m->hier == 1 && bytes < HIER_AUTO_MIN) || bytes < HIER_ON_MIN ||
        bytes <= kolo__coll_small_max())
        return false;
    const kolo__hosts *hs = even_hosts(g);
    if (!hs) return false;
    *lg = &hs->local;
    *xg = &hs->across;
    return true;
}

int kolo__coll_hier_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                              kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    const kolo__group *lg, *xg;
    size_t es = kolo_dtype_size(dtype);
    if (!kolo__coll_hier_groups(m, g, count * es, &lg, &xg)) return KOLO_HIER_DECLINED;
    int L = lg->size;
    size_t own[2 * KOLO_STACK_MEMBERS], *offs = kolo__coll_members(own, L, 2 * sizeof(size_t));
    if (!offs) return KOLO_ERR_NO_MEMORY; /* every member decided to run it: fail, not decline */
    size_t *counts = offs + L;
    kolo__coll_blocks(count, L, offs, counts);
    size_t off = offs[lg->rank];
    kolo_op_t sum = op == KOLO_AVERAGE ? KOLO_SUM : op;
    char *block = (char *)recv + off * es;
    size_t mine = counts[lg->rank];
    int st = kolo__coll_reducescatter(m, lg, send, block, counts, dtype, sum, pre, 1.0);
    if (st == KOLO_OK && mine) st = kolo__coll_allreduce(m, xg, block, block, mine, dtype, sum, 1.0, 1.0);
    if (st == KOLO_OK) {
        kolo__coll_finish_scale(block, mine, dtype, op, post, g->size);
        st = kolo__coll_allgather(m, lg, block, recv, counts, es);
    }
    kolo__coll_members_free(offs, own);
    if (st == KOLO_OK) kolo__coll_hier_ran();
    return st;
}

int kolo__coll_hier_allgather(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, const size_t *counts,
                              size_t es)
{
    int n = g->size, me = g->rank;
    const kolo__hosts *hs = m->hier_ag ? even_hosts(g) : NULL;
    if (!hs) return KOLO_HIER_DECLINED;
    size_t o = 0;
    for (int i = 0; i < n; i++) o += counts[i];
    if (o * es < (m->hier_ag == 1 ? HIER_AG_AUTO_MIN : HIER_AG_MIN)) return KOLO_HIER_DECLINED;
    int L = hs->L, H = hs->H;
    char *out = recv;
    /* phase 1 sends H - 1 and receives as many; phase 2 (L - 1) H each way */
    size_t nx = 2 * (size_t)(H - 1 > (L - 1) * H ? H - 1 : (L - 1) * H);
    kolo__xfer *xs = kolo__calloc(nx, sizeof(kolo__xfer));
    kolo__xfer **ptrs = kolo__calloc(nx, sizeof(kolo__xfer *));
    size_t own[KOLO_STACK_MEMBERS], *offs = xs && ptrs ? kolo__coll_members(own, n, sizeof(size_t)) : NULL;
    if (!offs) {
        kolo__free(xs);
        kolo__free(ptrs);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a hierarchical allgather's %zu transfers", nx);
    }
    o = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = o;
        o += counts[i];
    }
    /* phase 1, across the hosts: this member's block to the members of its local index on the
     * other hosts, theirs straight to their places in the output */
    const int *xm = hs->cross + hs->me_local * H;
    int k = 0;
    for (int j = 0; j < H; j++) {
        if (xm[j] == me) continue;
        kolo__isend(m, kolo__g2w(g, xm[j]), send, counts[me] * es, &xs[k++]);
        kolo__irecv(m, kolo__g2w(g, xm[j]), out + offs[xm[j]] * es, counts[xm[j]] * es, &xs[k++]);
    }
    kolo__coll_copy_own_moving(m, out + offs[me] * es, send, counts[me] * es, false);
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    int st = kolo__wait(m, ptrs, k);
    const int *local = hs->order + hs->me_host * L; /* the members here */
    /* phase 2, within the host: the H blocks of this member's local index (its own and those just
     * received) to every other member here, host by host in the same order on every member, and
     * theirs from them; each receiver keeps what it gets (`single`, as the flat exchange's) */
    k = 0;
    for (int p = 0; p < L && st == KOLO_OK; p++) {
        int peer = local[p];
        if (peer == me) continue;
        for (int h = 0; h < H; h++) {
            int mine = hs->order[h * L + hs->me_local], theirs = hs->order[h * L + p];
            const char *src = mine == me ? (const char *)send : out + offs[mine] * es;
            kolo__isend(m, kolo__g2w(g, peer), src, counts[mine] * es, &xs[k]);
            xs[k++].single = true;
            kolo__irecv(m, kolo__g2w(g, peer), out + offs[theirs] * es, counts[theirs] * es, &xs[k++]);
        }
    }
    for (int i = 0; i < k; i++) ptrs[i] = &xs[i];
    if (st == KOLO_OK) st = kolo__wait(m, ptrs, k);
    kolo__free(xs);
    kolo__free(ptrs);
    kolo__coll_members_free(offs, own);
    if (st == KOLO_OK) __atomic_fetch_add(&hier_ag_runs, 1, __ATOMIC_RELAXED);
    return st;
}

/* Reducescatter: only where the allreduce's mode is 1 (on), not at auto. Measured as the
 * allreduce (4 ranks as 2 hosts of 2, bench/hosts.sh --coll reducescatter, 3 rounds, medians of the
 * per-round ratios of the time, hierarchical over flat): 2 Gbit/s 0.59-0.71x at 256 KiB-4 MiB,
 * 0.75x at 8 MiB, 0.84x at 16 MiB; but 10 Gbit/s 0.76-1.04x at 512 KiB-16 MiB (1-2 MiB 0.95-1.04x),
 * and not shaped 0.68-0.84x at 1-4 MiB, 1.02x at 8 MiB, 1.21x at 16 MiB: packing the blocks (one
 * copy of the buffer) and two reduce-scatters one after the other cost the cores what the network
 * saves unless the network is slow, where the allreduce and allgather gained at every rate. */
int kolo__coll_hier_reducescatter(kolo__mesh *m, const kolo__group *g, const void *send, void *recv,
                                  const size_t *counts, kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    int n = g->size, me = g->rank;
    const kolo__hosts *hs = m->hier == 2 ? even_hosts(g) : NULL;
    if (!hs) return KOLO_HIER_DECLINED;
    size_t es = kolo_dtype_size(dtype), total = 0;
    for (int i = 0; i < n; i++) total += counts[i];
    if (total * es < HIER_AG_MIN) return KOLO_HIER_DECLINED;
    int L = hs->L, H = hs->H;
    const int *cross = hs->cross;
    /* offs[n], then bundle i (L of them): the blocks of the members of local index i, in their
     * cross order, packed one after another so that the host's reduce-scatter gives member i the
     * host's sum of them; then xc (H): the blocks of this member's local index */
    size_t own[3 * KOLO_STACK_MEMBERS], *offs = kolo__coll_members(own, n, 3 * sizeof(size_t));
    if (!offs) return KOLO_ERR_NO_MEMORY; /* every member decided to run it: fail, not decline */
    size_t *bundle = offs + n, *xc = bundle + L;
    total = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = total;
        total += counts[i];
    }
    for (int i = 0; i < L; i++) {
        bundle[i] = 0;
        for (int k = 0; k < H; k++) bundle[i] += counts[cross[i * H + k]];
    }
    for (int k = 0; k < H; k++) xc[k] = counts[cross[hs->me_local * H + k]];
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_HIER, (total + bundle[hs->me_local]) * es);
    if (!tmp) {
        kolo__coll_members_free(offs, own);
        return KOLO_ERR_NO_MEMORY;
    }
    char *p = tmp, *mine = tmp + total * es;
    for (int i = 0; i < L; i++)
        for (int k = 0; k < H; k++) {
            int j = cross[i * H + k];
            kolo__copy(p, (const char *)send + offs[j] * es, counts[j] * es);
            p += counts[j] * es;
        }
    kolo_op_t sum = op == KOLO_AVERAGE ? KOLO_SUM : op;
    /* within the host (shared memory), then across the hosts: only the second crosses the
     * network, (h-1)/h of the buffer per host */
    int st = kolo__coll_reducescatter(m, &hs->local, tmp, mine, bundle, dtype, sum, pre, 1.0);
    if (st == KOLO_OK) st = kolo__coll_reducescatter(m, &hs->across, mine, recv, xc, dtype, sum, 1.0, 1.0);
    kolo__coll_members_free(offs, own);
    if (st != KOLO_OK) return st;
    kolo__coll_finish_scale(recv, counts[me], dtype, op, post, n);
    __atomic_fetch_add(&hier_rs_runs, 1, __ATOMIC_RELAXED);
    return KOLO_OK;
}
