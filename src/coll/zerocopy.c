/* zerocopy.c - allreduce on buffers from kolo_mem_alloc when every member is on this host: each
 * member reads the others' buffers directly.
 *
 * The ring moves every byte through a shared ring (or a kernel copy) before it is reduced, so
 * a member of a 2-rank allreduce reads and writes about 4.5 times the buffer; the memory-traffic
 * bound of bench/compare.py assumes 2.5. With every member's send and receive buffers mappable
 * by the others (kolo_mem_alloc, core/mem.c), the algorithm is that bound's:
 *
 *   1. the members exchange where their buffers are (one small allgather, which also tells each
 *      that the others' inputs are ready) and map each other's (cached);
 *   2. a second small allgather agrees that every mapping worked; otherwise all fall back;
 *   3. member r reduces block r of the output from all n inputs (its own first, then the others
 *      in member order) and applies the final scaling to it, 64 KiB at a time into a scratch
 *      step that stays in cache, streamed out to the output with non-temporal stores;
 *   4. barrier; member r copies every other block from its owner's output, again with
 *      non-temporal stores;
 *   5. barrier, so that no member returns (and reuses its buffers) while another still reads.
 *
 * The non-temporal stores matter: a plain store to a line that is not in cache first reads it
 * from memory, so plain stores made the traffic 3.5x the buffer instead of 2.5x, and 64 MiB ran
 * at 6.2-6.6 GB/s instead of 10.2-10.6. They are fenced before each barrier.
 *
 * Each block is reduced once, by its owner, so every member ends with the same bits. In place is
 * safe: in step 3 a member writes only its own block of its own buffer (each step after reading
 * it), which the others read only in step 4. Below 16 MiB, and whenever any member passes
 * malloc'd memory, the usual algorithms run (the decision is taken from the exchanged
 * descriptors, the same on every member). Measured on this project's VM, 2 ranks, busbw out of
 * place / in place, GB/s, against malloc'd buffers (the ring) in the same minutes:
 *
 *   vCPUs on one CCD:  16 MiB 8.2-11.0 / 9.4-9.7, 64 MiB 7.4-10.6 / 7.6-9.2, 256 MiB 7.3-9.6 /
 *                      7.7-9.9 (ring 5.1-6.0 / 4.4-7.1); at 1 MiB the ring in cache is faster
 *                      (12 against 4.5 before streaming stores), hence the threshold
 *   vCPUs on two CCDs: 16 MiB 11.2 / 9.7, 64 MiB 10.2 / 9.1, 256 MiB 10.2 / 9.8
 *                      (ring 4.1-5.8 / 2.8-7.3)
 */
#include "coll.h"

#include "../core/mem.h"
#include "../reduce/reduce.h"

#include <unistd.h>

#define ZC_MIN ((size_t)16 << 20)
#define ZC_STEP ((size_t)64 << 10) /* a block is reduced this many bytes at a time, in cache */
/* Each collective pins two buffers of every other member, and the direct channel and the
 * engine's may run at once: 4 (n - 1) pins must fit the peer map cache, or a full cache would
 * look like a peer that cannot be mapped. Larger one-host sets take the ring. */
#define ZC_MAX_MEMBERS 16
_Static_assert(4 * (ZC_MAX_MEMBERS - 1) <= KOLO_MEM_PEER_MAPS, "peer map cache too small for the members");

typedef struct zc_desc {
    int32_t ok, pid;
    int32_t fd[2]; /* send, receive */
    uint64_t id[2], len[2], off[2];
} zc_desc;

static uint64_t zc_runs;

uint64_t kolo__zc_runs(void) { return __atomic_load_n(&zc_runs, __ATOMIC_RELAXED); }

/* Every other member is on this host, over shared memory, and passed the CMA probe (the same
 * permission lets us open its memfds). The transport of a pair is the same on both sides, so
 * every member comes to the same answer. */
static bool all_near(kolo__mesh *m, const kolo__group *g)
{
    if (g->size > ZC_MAX_MEMBERS) return false;
    for (int i = 0; i < g->size; i++)
        if (i != g->rank && kolo__shm_cma_state(m->conns[kolo__g2w(g, i)]) < 0) return false;
    return true;
}

int kolo__zc_allreduce(kolo__mesh *m, const kolo__group *g, const void *send, void *recv, size_t count,
                       kolo_dtype_t dtype, kolo_op_t op, double post)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype), bytes = count * es;
    if (bytes < ZC_MIN || n < 2 || !all_near(m, g)) return KOLO_ZC_DECLINED;

    zc_desc me = {.pid = (int32_t)getpid()}, all[ZC_MAX_MEMBERS];
    kolo__mem_ref ref[2];
    me.ok = !m->zc_unmappable && kolo__mem_find(send, bytes, &ref[0]) && kolo__mem_find(recv, bytes, &ref[1]);
    for (int k = 0; me.ok && k < 2; k++) {
        me.fd[k] = ref[k].fd;
        me.id[k] = ref[k].id;
        me.len[k] = ref[k].len;
        me.off[k] = ref[k].off;
    }
    size_t ones[ZC_MAX_MEMBERS];
    for (int i = 0; i < n; i++) ones[i] = 1;
    int st = kolo__coll_allgather(m, g, &me, all, ones, sizeof(zc_desc));
    if (st != KOLO_OK) return st;
    for (int i = 0; i < n; i++)
        if (!all[i].ok) return KOLO_ZC_DECLINED;

    /* map the others' buffers */
    const char *in[ZC_MAX_MEMBERS];
    char *out[ZC_MAX_MEMBERS], *bases[ZC_MAX_MEMBERS][2] = {{NULL}};
    int32_t mapped = 1, oks[ZC_MAX_MEMBERS];
    for (int i = 0; i < n; i++) {
        if (i == r) {
            in[i] = send;
            out[i] = recv;
            continue;
        }
        for (int k = 0; k < 2 && mapped; k++) {
            kolo__mem_ref pr = {.fd = all[i].fd[k], .id = all[i].id[k], .len = all[i].len[k], .off = all[i].off[k]};
            bases[i][k] = kolo__mem_map_peer(all[i].pid, &pr);
            if (!bases[i][k]) {
                /* once: every later allreduce of this rank declines up front, so all members
                 * take the ring without retrying (and warning) on every call */
                KOLO_WARN("allreduce: cannot map the shared buffer of rank %d (%s); allreduces of this "
                          "process set use the ring from now on",
                          kolo__g2w(g, i), kolo__errmsg());
                m->zc_unmappable = true;
                mapped = 0;
            }
        }
        if (mapped) {
            in[i] = bases[i][0] + all[i].off[0];
            out[i] = bases[i][1] + all[i].off[1];
        }
    }
    st = kolo__coll_allgather(m, g, &mapped, oks, ones, sizeof(int32_t));
    bool go = st == KOLO_OK;
    for (int i = 0; i < n && go; i++) go = oks[i] != 0;

    if (go) {
        size_t base = count / (size_t)n, extra = count % (size_t)n;
        size_t off[ZC_MAX_MEMBERS], cnt[ZC_MAX_MEMBERS], o = 0;
        for (int i = 0; i < n; i++) {
            cnt[i] = base + ((size_t)i < extra);
            off[i] = o;
            o += cnt[i];
        }
        /* block r, a step at a time: reduced into a scratch step that stays in cache, then
         * streamed out, so the output's lines are written without being read */
        char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_RING, ZC_STEP);
        st = tmp ? KOLO_OK : KOLO_ERR_NO_MEMORY;
        size_t step = ZC_STEP / es;
        int first = r == 0 ? 1 : 0;
        for (size_t done = 0; st == KOLO_OK && done < cnt[r]; done += step) {
            size_t c = KOLO_MIN(step, cnt[r] - done), at = (off[r] + done) * es;
            kolo__reduce(tmp, in[r] + at, in[first] + at, c, dtype, op);
            for (int i = 0; i < n; i++)
                if (i != r && i != first) kolo__reduce(tmp, tmp, in[i] + at, c, dtype, op);
            kolo__coll_finish_scale(tmp, c, dtype, op, post, n);
            kolo__stream_copy(out[r] + at, tmp, c * es);
        }
        kolo__stream_fence();
        if (st == KOLO_OK) st = kolo__coll_barrier(m, g);
        if (st == KOLO_OK) {
            for (int i = 0; i < n; i++)
                if (i != r && cnt[i]) kolo__stream_copy(out[r] + off[i] * es, out[i] + off[i] * es, cnt[i] * es);
            kolo__stream_fence();
            st = kolo__coll_barrier(m, g);
        }
        if (st == KOLO_OK) {
            __atomic_fetch_add(&zc_runs, 1, __ATOMIC_RELAXED);
            KOLO_DEBUG("allreduce of %zu bytes read the other %d ranks' shared buffers directly", bytes, n - 1);
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (bases[i][k]) kolo__mem_unpin(bases[i][k]);
    if (st != KOLO_OK) return st;
    return go ? KOLO_OK : KOLO_ZC_DECLINED;
}
