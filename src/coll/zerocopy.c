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
 *      in member order) and applies the final scaling to it;
 *   4. barrier; member r copies every other block from its owner's output;
 *   5. barrier, so that no member returns (and reuses its buffers) while another still reads.
 *
 * Each block is reduced once, by its owner, so every member ends with the same bits. In place is
 * safe: in step 3 a member writes only its own block of its own buffer, which the others read
 * only in step 4. Below 16 MiB, and whenever any member passes malloc'd memory, the usual
 * algorithms run (the decision is taken from the exchanged descriptors, the same on every
 * member). Measured on this project's VM, 2 ranks, busbw out of place / in place, GB/s:
 *
 *   vCPUs on one CCD:  16 MiB 5.4/3.7 (ring 3.4/2.4), 64 MiB 6.4/5.8 (ring 3.5/6.0),
 *                      256 MiB 8.2/8.6 (ring 5.7/7.0); but 1 MiB 4.5/2.4 against the ring's 12
 *                      in cache, hence the threshold
 *   vCPUs on two CCDs: 64 MiB 6.6/5.6 (ring 4.7/6.3), 256 MiB 7.6-7.9/8.3-9.1 (ring 4.7-4.9/6.2-6.9)
 */
#include "coll.h"

#include "../core/mem.h"
#include "../reduce/reduce.h"

#include <unistd.h>

#define ZC_MIN ((size_t)16 << 20)
#define ZC_MAX_MEMBERS 64

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
    me.ok = kolo__mem_find(send, bytes, &ref[0]) && kolo__mem_find(recv, bytes, &ref[1]);
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
                KOLO_WARN("allreduce: cannot map the shared buffer of rank %d (%s); using the ring",
                          kolo__g2w(g, i), kolo__errmsg());
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
        char *d = out[r] + off[r] * es;
        if (cnt[r]) {
            /* own input first: in place, d is that input, and must not be overwritten before
             * it is read */
            int first = r == 0 ? 1 : 0;
            kolo__reduce(d, in[r] + off[r] * es, in[first] + off[r] * es, cnt[r], dtype, op);
            for (int i = 0; i < n; i++)
                if (i != r && i != first) kolo__reduce(d, d, in[i] + off[r] * es, cnt[r], dtype, op);
            kolo__coll_finish_scale(d, cnt[r], dtype, op, post, n);
        }
        st = kolo__coll_barrier(m, g);
        if (st == KOLO_OK) {
            for (int i = 0; i < n; i++)
                if (i != r && cnt[i]) memcpy(out[r] + off[i] * es, out[i] + off[i] * es, cnt[i] * es);
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
