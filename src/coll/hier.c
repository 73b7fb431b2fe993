/* hier.c - the hierarchical allreduce, for a group spread over several hosts.
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
 * agree, and copied to the others of its host. */
#include "coll.h"

#include "../reduce/reduce.h"

/* hosts and members per host above which the groups are not built on the stack */
#define HIER_MAX 1024

static uint64_t hier_runs;

uint64_t kolo__coll_hier_runs(void) { return __atomic_load_n(&hier_runs, __ATOMIC_RELAXED); }

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
 * runs it from KOLO_SMALL_ALLREDUCE_MAX. */
#define HIER_AUTO_MIN ((size_t)1 << 20)

/* The layout of g over its hosts: local[] the members on this member's host (world ranks,
 * ascending), cross[] those with the same local index on every host (ascending); false when the
 * hosts do not hold equal numbers (2 or more) of members, or there is one host. */
static bool hier_layout(const kolo__mesh *m, const kolo__group *g, int *local, int *nlocal, int *cross, int *ncross)
{
    int n = g->size, me = g->rank;
    if (!m->host_of || me < 0 || n < 4 || n > HIER_MAX) return false;
    const int *h = m->host_of;
    int my_host = h[kolo__g2w(g, me)], my_index = -1, L = 0;
    for (int i = 0; i < n; i++) {
        if (h[kolo__g2w(g, i)] != my_host) continue;
        if (i == me) my_index = L;
        local[L++] = kolo__g2w(g, i);
    }
    if (L < 2 || n % L) return false;
    /* each host's members, in member order: the one at my_index joins cross[]; every host must
     * count exactly L. Hosts are found in order of their first member. */
    int H = 0;
    for (int i = 0; i < n; i++) {
        int hi = h[kolo__g2w(g, i)], seen = 0, count = 0, at = -1;
        for (int j = 0; j < i && !seen; j++) seen = h[kolo__g2w(g, j)] == hi;
        if (seen) continue;
        for (int j = i; j < n; j++) {
            if (h[kolo__g2w(g, j)] != hi) continue;
            if (count == my_index) at = kolo__g2w(g, j);
            count++;
        }
        if (count != L) return false;
        cross[H++] = at;
    }
    if (H < 2) return false;
    /* a group's ranks ascend; hosts found in member order need not give ascending ranks */
    for (int i = 1; i < H; i++)
        for (int j = i; j > 0 && cross[j - 1] > cross[j]; j--) {
            int t = cross[j];
            cross[j] = cross[j - 1];
            cross[j - 1] = t;
        }
    *nlocal = L;
    *ncross = H;
    return true;
}

bool kolo__coll_hier_applies(const kolo__mesh *m, const kolo__group *g, size_t bytes)
{
    if (m->hier == 0 || (m->hier == 1 && bytes < HIER_AUTO_MIN) || bytes <= kolo__coll_small_max()) return false;
    int local[HIER_MAX], cross[HIER_MAX], L, H;
    return hier_layout(m, g, local, &L, cross, &H);
}

int kolo__coll_hier_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                              kolo_dtype_t dtype, kolo_op_t op, double pre, double post)
{
    int local[HIER_MAX], cross[HIER_MAX], L, H;
    if (!hier_layout(m, g, local, &L, cross, &H))
        return kolo__err(KOLO_ERR_INTERNAL, "hierarchical allreduce on a group that is not spread evenly over hosts");
    kolo__group lg = {.size = L, .rank = -1, .ranks = local}, xg = {.size = H, .rank = -1, .ranks = cross};
    int me = kolo__g2w(g, g->rank);
    for (int i = 0; i < L; i++)
        if (local[i] == me) lg.rank = i;
    for (int i = 0; i < H; i++)
        if (cross[i] == me) xg.rank = i;
    size_t es = kolo_dtype_size(dtype), counts[HIER_MAX], base = count / (size_t)L, extra = count % (size_t)L, off = 0;
    for (int i = 0; i < L; i++) {
        counts[i] = base + ((size_t)i < extra);
        if (i < lg.rank) off += counts[i];
    }
    kolo_op_t sum = op == KOLO_AVERAGE ? KOLO_SUM : op;
    char *block = (char *)recv + off * es;
    size_t mine = counts[lg.rank];
    int st = kolo__coll_reducescatter(m, &lg, send, block, counts, dtype, sum, pre, 1.0);
    if (st == KOLO_OK && mine) st = kolo__coll_allreduce(m, &xg, block, block, mine, dtype, sum, 1.0, 1.0);
    if (st != KOLO_OK) return st;
    kolo__coll_finish_scale(block, mine, dtype, op, post, g->size);
    st = kolo__coll_allgather(m, &lg, block, recv, counts, es);
    if (st == KOLO_OK) __atomic_fetch_add(&hier_runs, 1, __ATOMIC_RELAXED);
    return st;
}
