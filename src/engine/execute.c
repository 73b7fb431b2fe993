/* execute.c - runs a cycle's response list on every member, in list order, and completes this
 * rank's requests.
 *
 * Fusion: an allreduce response starts a bucket; later allreduce responses of the same list with
 * the same dtype, op, scale factors and device join it (look-ahead past responses that do not
 * match, as Horovod does) while the bucket stays within KOLO_FUSION_THRESHOLD bytes. Every member
 * forms the same buckets, and picks the same way to run each, because both depend only on the
 * response list (sizes are negotiated), never on where this rank's buffers are:
 *   - one tensor: one collective straight on the caller's buffers;
 *   - several, at most IOV_MIN bytes in all: copied into the fusion buffer
 *     (MEMCPY_IN_FUSION_BUFFER), one collective in place, copied back (MEMCPY_OUT_FUSION_BUFFER);
 *   - several, more than IOV_MIN bytes: one ring allreduce over the list of buffers
 *     (ring_iov.c), the tensors of at least PACK_MIN bytes reduced where they are and only the
 *     smaller ones packed into the fusion buffer (across hosts, where coll/hier.c applies, in its
 *     three stages over the list, and where it does not, on 4 or more members, by recursive
 *     halving over the list, as coll/allreduce.c would: ring_iov.c); on one host the same list
 *     may instead be read (and written) by the other members directly (coll/direct.c), as a
 *     single tensor may: mapped when every member's tensors lie in one kolo_mem_alloc arena (the
 *     fusion buffer is kolo_mem_alloc memory too), else, from 256 KiB, by CMA when that times
 *     faster than the ring. On this memory-bound host the two copies of Horovod's fusion
 *     buffer cost as much as the allreduce itself: with everything copied a ResNet-50 step took
 *     1.2-1.6x one direct allreduce of the same bytes; running tensors above 256 KiB as separate
 *     collectives 0.95-1.65x (it depends on how the ranks get scheduled); the ring over the list
 *     1.04-1.23x, measured side by side under the same load.
 * Adasum fuses only tensors of at most FUSE_TENSOR_MAX bytes, always copied into the fusion buffer
 * (each tensor is combined as its own vector, so the collective needs the tensors' bounds:
 * coll/adasum.c); larger ones run alone on their own buffers. engine-bench -a 1 (ResNet-50, 2
 * ranks, 3 launches each): a step 60-67 ms, against 81-124 with every tensor copied through the
 * fusion buffer; one Adasum of the same bytes as one vector 63-65 ms.
 * Allgathers of at most FUSE_TENSOR_MAX bytes each are fused by copying (each rank packs its
 * blocks of every tensor, one allgather of bytes, every rank unpacks per rank and tensor), and so
 * are broadcasts from the same root.
 *
 * A joined member has no request for what it runs: it contributes zeros of the negotiated size
 * and throws the result away.
 *
 * Every step either succeeds on this rank or is a job error: an allocation that fails here (an
 * output buffer, the fusion buffer) fails the engine's mesh, so that the other members fail too
 * instead of waiting for a collective this rank will not run. */
#include "internal.h"

#include "../reduce/reduce.h"
#include "../trace/trace.h"
#include "ring_iov.h"

#include <stdio.h>

#define E kolo__E

/* Allgather and broadcast tensors above this many bytes are never copied into the fusion buffer. */
#define FUSE_TENSOR_MAX ((size_t)256 << 10)

static void *grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf) return *buf;
    size_t c = KOLO_MAX(need, (size_t)4096);
    void *p = kolo__malloc_aligned(c);
    if (!p) {
        kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %zu bytes of engine buffer", c);
        return NULL;
    }
    kolo__free(*buf);
    *buf = p;
    *cap = c;
    return p;
}

static void fusion_buffer_free(void)
{
    if (E.fbuf_shared) kolo_mem_free(E.fbuf);
    else kolo__free(E.fbuf);
    E.fbuf = NULL;
    E.fbuf_cap = 0;
    E.fbuf_shared = false;
}

/* The fusion buffer, at least `need` bytes. It comes from kolo_mem_alloc when it can: a bucket
 * whose tensors are in such memory too (one arena) is then read by the other members directly
 * (coll/direct.c maps up to two allocations per member), instead of through the ring. */
static char *fusion_buffer(size_t need)
{
    if (need <= E.fbuf_cap && E.fbuf) return E.fbuf;
    size_t c = KOLO_MAX(need, (size_t)4096);
    void *p = kolo_mem_alloc(c);
    bool shared = p != NULL;
    if (!p) p = kolo__malloc_aligned(c); /* no memfd here: the ring does as well */
    if (!p) {
        kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %zu bytes of fusion buffer", c);
        return NULL;
    }
    fusion_buffer_free();
    E.fbuf = p;
    E.fbuf_cap = c;
    E.fbuf_shared = shared;
    return p;
}

static int counts(int n)
{
    if (n <= E.cnt_cap) return KOLO_OK;
    size_t *a = kolo__malloc((size_t)n * sizeof(size_t)), *b = kolo__malloc((size_t)n * sizeof(size_t));
    if (!a || !b) {
        kolo__free(a);
        kolo__free(b);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for collective counts");
    }
    kolo__free(E.cnt_a);
    kolo__free(E.cnt_b);
    E.cnt_a = a;
    E.cnt_b = b;
    E.cnt_cap = n;
    return KOLO_OK;
}

void kolo__execute_free(void)
{
    fusion_buffer_free();
    kolo__free(E.zbuf);
    kolo__free(E.cnt_a);
    kolo__free(E.cnt_b);
    kolo__free(E.bidx);
    kolo__free(E.done_reqs);
    E.zbuf = NULL;
    E.cnt_a = E.cnt_b = NULL;
    E.bidx = NULL;
    E.done_reqs = NULL;
    E.zbuf_cap = E.bidx_cap = 0;
    E.cnt_cap = 0;
}

/* ---- timeline ---- */

static void trace_start(const kolo__resp *rp)
{
    char args[320], sh[256];
    snprintf(args, sizeof(args), "\"dtype\":\"%s\",\"shape\":\"%s\"", kolo_dtype_name((kolo_dtype_t)rp->d.dtype),
             kolo__shape_str(rp->d.dims, rp->d.ndim, sh, sizeof(sh)));
    kolo__trace_begin(rp->name, kolo__op_upper(rp->d.kind, rp->d.op), args);
}

static const char *transfer_name(int kind)
{
    static const char *const names[KOLO__KIND_COUNT] = {"KOLO_ALLREDUCE", "KOLO_ALLGATHER", "KOLO_BROADCAST",
                                                         "KOLO_ALLTOALL", "KOLO_REDUCESCATTER", "KOLO_JOIN",
                                                         "KOLO_BARRIER"};
    return names[kind];
}

/* ---- the collectives ---- */

/* Which tensors of a bucket an event is about: all, or those copied through the fusion buffer
 * (fewer than `below` bytes; on the way out only those with a result to copy). */
enum { TR_IN = 0, TR_OUT = 1 };

/* The begin or end of `phase` on every row of the bucket at one instant, as Horovod's timeline
 * marks a fused collective's phases; one sequence (trace.h), not one event per tensor. */
static void trace_some(const kolo__pset_state *s, const size_t *idx, size_t k, const char *phase, int begin,
                       size_t below, int way)
{
    kolo__trace_seq q;
    kolo__trace_seq_open(&q);
    for (size_t i = 0; i < k; i++) {
        const kolo__resp *rp = &s->resp[idx[i]];
        if (rp->bytes >= below || (way == TR_OUT && !(rp->req && rp->bytes))) continue;
        if (begin) kolo__trace_seq_begin(&q, rp->name, phase);
        else kolo__trace_seq_end(&q, rp->name, phase);
    }
    kolo__trace_seq_close(&q);
}

static void trace_all(const kolo__pset_state *s, const size_t *idx, size_t k, const char *phase, int begin)
{
    trace_some(s, idx, k, phase, begin, SIZE_MAX, TR_IN);
}

/* A bucket of several tensors of more than IOV_MIN bytes in all runs over the list of buffers (a
 * ring, the three stages or recursive halving, as its size and the hosts say): the tensors of at
 * least PACK_MIN bytes are reduced where they are, the smaller ones are packed together into the
 * fusion buffer first (one segment at the front instead of many tiny messages). A joined member
 * points its segments at zeros of the same lengths. */
#define IOV_MIN ((size_t)1 << 20)
#define PACK_MIN ((size_t)64 << 10)

static int run_allreduce_iov(kolo__pset_state *s, const size_t *idx, size_t k, bool tracing)
{
    kolo__resp *r0 = &s->resp[idx[0]];
    kolo_dtype_t dt = (kolo_dtype_t)r0->d.dtype;
    size_t packed = 0, zeros = 0;
    for (size_t i = 0; i < k; i++) {
        const kolo__resp *rp = &s->resp[idx[i]];
        if (rp->bytes < PACK_MIN) packed += rp->bytes;
        else if (!rp->req) zeros += rp->bytes;
    }
    size_t total = 0, es = kolo_dtype_size(dt);
    for (size_t i = 0; i < k; i++) total += s->resp[idx[i]].count;
    /* across hosts maybe in three stages (coll/hier.c, ring_iov.c), or by recursive halving */
    const kolo__group *lg = NULL, *xg = NULL;
    bool hier = kolo__coll_hier_groups(E.mesh, &s->g, total * es, &lg, &xg);
    /* or by recursive halving, as kolo__coll_allreduce would */
    const int *order = hier ? NULL : kolo__coll_halving_order(&s->g, total, es);
    bool halve = order != NULL;
    size_t chunk2 = hier ? kolo__iov_hier_scratch(E.mesh, lg->size, xg->size, total, es)
                         : kolo__iov_scratch(E.mesh, total, s->n, es);
    kolo__seg *segs = kolo__malloc((k + 1) * sizeof(kolo__seg));
    char *buf = segs ? fusion_buffer(packed + zeros) : NULL;
    char *scratch = buf ? grow(&E.zbuf, &E.zbuf_cap, chunk2) : NULL;
    if (!scratch) {
        kolo__free(segs);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused allreduce");
    }
    int nseg = 1;
    size_t poff = 0, zoff = packed;
    if (tracing) {
        trace_all(s, idx, k, "QUEUE", 0);
        trace_some(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 1, PACK_MIN, TR_IN);
    }
    for (size_t i = 0; i < k; i++) {
        kolo__resp *rp = &s->resp[idx[i]];
        if (rp->bytes < PACK_MIN) {
            if (rp->req && rp->bytes) kolo__copy(buf + poff, rp->req->send, rp->bytes);
            else if (rp->bytes) memset(buf + poff, 0, rp->bytes);
            poff += rp->bytes;
        } else if (rp->req) {
            segs[nseg++] = (kolo__seg){rp->req->send, rp->req->recv, rp->count};
        } else {
            memset(buf + zoff, 0, rp->bytes); /* joined: zeros, result thrown away */
            segs[nseg++] = (kolo__seg){buf + zoff, buf + zoff, rp->count};
            zoff += rp->bytes;
        }
    }
    segs[0] = (kolo__seg){buf, buf, packed / kolo_dtype_size(dt)};
    if (tracing) {
        trace_some(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 0, PACK_MIN, TR_IN);
        trace_all(s, idx, k, transfer_name(KOLO__ALLREDUCE), 1);
    }
    /* on one host the members may read each other's buffers instead (coll/direct.c) */
    kolo__direct_ticket ticket = {0};
    int st = r0->d.pre != 1.0 ? KOLO_DIRECT_DECLINED
                              : kolo__direct_allreduce(E.mesh, &s->g, segs, nseg, dt, (kolo_op_t)r0->d.op, r0->d.post,
                                                       &ticket);
    if (st == KOLO_DIRECT_DECLINED && hier) {
        st = kolo__iov_hier_allreduce(E.mesh, &s->g, lg, xg, segs, nseg, dt, (kolo_op_t)r0->d.op, r0->d.pre,
                                      r0->d.post, scratch, chunk2);
    } else if (st == KOLO_DIRECT_DECLINED && halve) {
        st = kolo__iov_halving_allreduce(E.mesh, &s->g, order, segs, nseg, dt, (kolo_op_t)r0->d.op, r0->d.pre,
                                         r0->d.post, scratch, chunk2);
    } else if (st == KOLO_DIRECT_DECLINED) {
        st = kolo__iov_allreduce(E.mesh, &s->g, segs, nseg, dt, (kolo_op_t)r0->d.op, r0->d.pre, r0->d.post, scratch,
                                 chunk2);
        kolo__direct_ring_done(E.mesh, &ticket, st);
    }
    if (tracing) trace_all(s, idx, k, transfer_name(KOLO__ALLREDUCE), 0);
    if (st == KOLO_OK && tracing) trace_some(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 1, PACK_MIN, TR_OUT);
    poff = 0;
    for (size_t i = 0; i < k && st == KOLO_OK; i++) {
        kolo__resp *rp = &s->resp[idx[i]];
        if (rp->bytes >= PACK_MIN) continue;
        if (rp->req && rp->bytes) kolo__copy(rp->req->recv, buf + poff, rp->bytes);
        poff += rp->bytes;
    }
    if (st == KOLO_OK && tracing) trace_some(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 0, PACK_MIN, TR_OUT);
    kolo__free(segs);
    return st;
}

static int run_allreduce(kolo__pset_state *s, const size_t *idx, size_t k, bool tracing)
{
    kolo__resp *r0 = &s->resp[idx[0]];
    kolo_dtype_t dt = (kolo_dtype_t)r0->d.dtype;
    size_t es = kolo_dtype_size(dt), total = 0;
    for (size_t i = 0; i < k; i++) total += s->resp[idx[i]].count;
    int st;
    bool adasum = r0->d.op == KOLO_ADASUM; /* fused only by copying: it needs the tensors' bounds */
    const char *xfer = adasum ? "KOLO_ADASUM" : transfer_name(KOLO__ALLREDUCE);
    if (k > 1 && total * es > IOV_MIN && !adasum) {
        st = run_allreduce_iov(s, idx, k, tracing);
    } else if (k == 1 && r0->req) {
        if (tracing) {
            kolo__trace_end(r0->name, "QUEUE");
            kolo__trace_begin(r0->name, xfer, NULL);
        }
        st = kolo__coll_allreduce(E.mesh, &s->g, r0->req->send, r0->req->recv, total, dt, (kolo_op_t)r0->d.op,
                                  r0->d.pre, r0->d.post);
        if (tracing) kolo__trace_end(r0->name, xfer);
    } else {
        bool copies = tracing && k > 1; /* a lone tensor is here only as zeros (joined): no copy to show */
        if (tracing) trace_all(s, idx, k, "QUEUE", 0);
        char *buf = fusion_buffer(total * es);
        if (!buf) return KOLO_ERR_NO_MEMORY;
        if (copies) trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 1);
        size_t off = 0;
        for (size_t i = 0; i < k; i++) {
            kolo__resp *rp = &s->resp[idx[i]];
            if (rp->req) {
                if (rp->bytes) kolo__copy(buf + off, rp->req->send, rp->bytes);
            } else {
                memset(buf + off, 0, rp->bytes); /* joined: zeros */
            }
            off += rp->bytes;
        }
        if (copies) trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 0);
        if (tracing) trace_all(s, idx, k, xfer, 1);
        if (adasum) {
            size_t *counts = kolo__malloc(k * sizeof(size_t));
            if (!counts) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a fused adasum");
            for (size_t i = 0; i < k; i++) counts[i] = s->resp[idx[i]].count;
            st = kolo__coll_adasum(E.mesh, &s->g, buf, buf, counts, k, dt, r0->d.pre, r0->d.post);
            kolo__free(counts);
        } else {
            st = kolo__coll_allreduce(E.mesh, &s->g, buf, buf, total, dt, (kolo_op_t)r0->d.op, r0->d.pre,
                                      r0->d.post);
        }
        if (tracing) trace_all(s, idx, k, xfer, 0);
        if (copies && st == KOLO_OK) trace_some(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 1, SIZE_MAX, TR_OUT);
        off = 0;
        for (size_t i = 0; i < k && st == KOLO_OK; i++) {
            kolo__resp *rp = &s->resp[idx[i]];
            if (rp->req && rp->bytes) kolo__copy(rp->req->recv, buf + off, rp->bytes);
            off += rp->bytes;
        }
        if (copies && st == KOLO_OK) trace_some(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 0, SIZE_MAX, TR_OUT);
    }
    atomic_fetch_add_explicit(&E.st.collectives, 1, memory_order_relaxed);
    if (k > 1) atomic_fetch_add_explicit(&E.st.fused_collectives, 1, memory_order_relaxed);
    return st;
}

static int alloc_out(kolo_request_t *r, size_t bytes)
{
    r->out_bytes = bytes;
    r->out = kolo__out_alloc(&r->out_bytes);
    if (!r->out) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the %zu-byte output of '%s'", bytes, r->name);
    return KOLO_OK;
}

static int run_other(kolo__pset_state *s, kolo__resp *rp, bool tracing)
{
    const kolo__desc *d = &rp->d;
    kolo_request_t *r = rp->req;
    int n = s->n, me = s->me, k = d->kind, st = KOLO_OK;
    kolo_dtype_t dt = (kolo_dtype_t)d->dtype;
    size_t es = kolo_dtype_size(dt), row = kolo__desc_row(d);
    if (k == KOLO__JOIN) return KOLO_OK;
    if (!r && k != KOLO__BARRIER)
        return kolo__err(KOLO_ERR_INTERNAL, "rank %d runs %s '%s' without a request", kolo__W.info.rank,
                         kolo__kind_lower[k], rp->name);
    if ((st = counts(n))) return st;
    size_t *a = E.cnt_a, *b = E.cnt_b;
    if (tracing) {
        kolo__trace_end(rp->name, "QUEUE");
        kolo__trace_begin(rp->name, transfer_name(k), NULL);
    }
    switch (k) {
    case KOLO__ALLGATHER: {
        size_t rows = 0;
        for (int i = 0; i < n; i++) {
            a[i] = (size_t)rp->per_rank[i] * row;
            rows += (size_t)rp->per_rank[i];
        }
        if ((st = alloc_out(r, rows * row * es))) break;
        r->out_shape.ndim = d->ndim;
        memcpy(r->out_shape.dims, d->dims, sizeof(d->dims));
        r->out_shape.dims[0] = (int64_t)rows;
        st = kolo__coll_allgather(E.mesh, &s->g, r->send, r->out, a, es);
        break;
    }
    case KOLO__BROADCAST:
        st = kolo__coll_broadcast(E.mesh, &s->g, r->recv, kolo__desc_count(d) * es, d->root);
        break;
    case KOLO__ALLTOALL: {
        size_t rows = 0;
        r->out_splits = kolo__malloc((size_t)n * sizeof(int64_t));
        if (!r->out_splits) {
            st = kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the splits of '%s'", r->name);
            break;
        }
        r->n_out_splits = n;
        for (int i = 0; i < n; i++) {
            int64_t from = rp->per_rank[(size_t)i * (size_t)n + (size_t)me];
            a[i] = (size_t)r->splits[i] * row;
            b[i] = (size_t)from * row;
            r->out_splits[i] = from;
            rows += (size_t)from;
        }
        if ((st = alloc_out(r, rows * row * es))) break;
        r->out_shape.ndim = d->ndim;
        memcpy(r->out_shape.dims, d->dims, sizeof(d->dims));
        r->out_shape.dims[0] = (int64_t)rows;
        st = kolo__coll_alltoall(E.mesh, &s->g, r->send, a, r->out, b, es);
        break;
    }
    case KOLO__REDUCESCATTER: {
        for (int i = 0; i < n; i++) a[i] = kolo_reducescatter_rows((size_t)d->dims[0], n, i) * row;
        if ((st = alloc_out(r, a[me] * es))) break;
        r->out_shape.ndim = d->ndim;
        memcpy(r->out_shape.dims, d->dims, sizeof(d->dims));
        r->out_shape.dims[0] = (int64_t)kolo_reducescatter_rows((size_t)d->dims[0], n, me);
        st = kolo__coll_reducescatter(E.mesh, &s->g, r->send, r->out, a, dt, (kolo_op_t)d->op, d->pre, d->post);
        break;
    }
    case KOLO__BARRIER:
        st = kolo__coll_barrier(E.mesh, &s->g);
        break;
    default:
        st = kolo__err(KOLO_ERR_INTERNAL, "unknown response kind %d", k);
    }
    if (tracing) kolo__trace_end(rp->name, transfer_name(k));
    atomic_fetch_add_explicit(&E.st.collectives, 1, memory_order_relaxed);
    return st;
}

/* ---- fused allgather and broadcast ---- */

/* Bytes rank r contributes to an allgather response. */
static size_t part(const kolo__resp *rp, int r)
{
    return (size_t)rp->per_rank[r] * kolo__desc_row(&rp->d) * kolo_dtype_size((kolo_dtype_t)rp->d.dtype);
}

/* Several allgathers as one: each rank packs its blocks of all tensors together, one allgather
 * of bytes moves them, every rank unpacks each tensor's blocks in rank order. */
static int run_allgather_fused(kolo__pset_state *s, const size_t *idx, size_t k, bool tracing)
{
    int n = s->n, me = s->me, st = counts(n);
    if (st) return st;
    size_t *a = E.cnt_a, total = 0;
    for (int r = 0; r < n; r++) {
        a[r] = 0;
        for (size_t i = 0; i < k; i++) a[r] += part(&s->resp[idx[i]], r);
        total += a[r];
    }
    char *send = grow(&E.zbuf, &E.zbuf_cap, a[me]);
    char *recv = send ? fusion_buffer(total) : NULL;
    if (!recv) return KOLO_ERR_NO_MEMORY;
    for (size_t i = 0; i < k; i++) { /* outputs first: a failure here happens before any transfer */
        kolo__resp *rp = &s->resp[idx[i]];
        kolo_request_t *r = rp->req;
        size_t rows = 0;
        for (int q = 0; q < n; q++) rows += (size_t)rp->per_rank[q];
        if ((st = alloc_out(r, rows * kolo__desc_row(&rp->d) * kolo_dtype_size((kolo_dtype_t)rp->d.dtype))))
            return st;
        r->out_shape.ndim = rp->d.ndim;
        memcpy(r->out_shape.dims, rp->d.dims, sizeof(rp->d.dims));
        r->out_shape.dims[0] = (int64_t)rows;
        rp->off = 0;
    }
    if (tracing) {
        trace_all(s, idx, k, "QUEUE", 0);
        trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 1);
    }
    size_t off = 0;
    for (size_t i = 0; i < k; i++) {
        size_t b = part(&s->resp[idx[i]], me);
        if (b) kolo__copy(send + off, s->resp[idx[i]].req->send, b);
        off += b;
    }
    if (tracing) {
        trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 0);
        trace_all(s, idx, k, "KOLO_ALLGATHER", 1);
    }
    st = kolo__coll_allgather(E.mesh, &s->g, send, recv, a, 1);
    if (tracing) trace_all(s, idx, k, "KOLO_ALLGATHER", 0);
    if (st) return st;
    if (tracing) trace_all(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 1);
    off = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < k; i++) {
            kolo__resp *rp = &s->resp[idx[i]];
            size_t b = part(rp, r);
            if (b) kolo__copy((char *)rp->req->out + rp->off, recv + off, b);
            rp->off += b;
            off += b;
        }
    if (tracing) trace_all(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 0);
    return KOLO_OK;
}

/* Several broadcasts from the same root as one: the root packs, everyone else unpacks. */
static int run_broadcast_fused(kolo__pset_state *s, const size_t *idx, size_t k, bool tracing)
{
    int root = s->resp[idx[0]].d.root;
    size_t total = 0;
    for (size_t i = 0; i < k; i++) total += s->resp[idx[i]].bytes;
    char *buf = fusion_buffer(total);
    if (!buf) return KOLO_ERR_NO_MEMORY;
    if (tracing) trace_all(s, idx, k, "QUEUE", 0);
    size_t off = 0;
    if (s->me == root) {
        if (tracing) trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 1);
        for (size_t i = 0; i < k; i++) {
            kolo__resp *rp = &s->resp[idx[i]];
            if (rp->bytes) kolo__copy(buf + off, rp->req->recv, rp->bytes);
            off += rp->bytes;
        }
        if (tracing) trace_all(s, idx, k, "MEMCPY_IN_FUSION_BUFFER", 0);
    }
    if (tracing) trace_all(s, idx, k, "KOLO_BROADCAST", 1);
    int st = kolo__coll_broadcast(E.mesh, &s->g, buf, total, root);
    if (tracing) trace_all(s, idx, k, "KOLO_BROADCAST", 0);
    if (st || s->me == root) return st;
    if (tracing) trace_all(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 1);
    for (size_t i = 0; i < k; i++) {
        kolo__resp *rp = &s->resp[idx[i]];
        if (rp->bytes) kolo__copy(rp->req->recv, buf + off, rp->bytes);
        off += rp->bytes;
    }
    if (tracing) trace_all(s, idx, k, "MEMCPY_OUT_FUSION_BUFFER", 0);
    return KOLO_OK;
}

/* Bytes a response moves, for fusion; SIZE_MAX when its kind is never fused. */
static size_t fuse_bytes(const kolo__pset_state *s, kolo__resp *rp)
{
    switch (rp->d.kind) {
    case KOLO__ALLREDUCE: return rp->bytes;
    case KOLO__BROADCAST:
        rp->bytes = kolo__desc_count(&rp->d) * kolo_dtype_size((kolo_dtype_t)rp->d.dtype);
        return rp->req ? rp->bytes : SIZE_MAX;
    case KOLO__ALLGATHER: {
        if (!rp->req) return SIZE_MAX;
        size_t b = 0;
        for (int r = 0; r < s->n; r++) b += part(rp, r);
        return b;
    }
    default: return SIZE_MAX;
    }
}

static bool fusable(const kolo__resp *a, const kolo__resp *b)
{
    if (b->d.kind != a->d.kind || b->done || b->status != KOLO_OK || strcmp(a->d.device, b->d.device) != 0)
        return false;
    switch (a->d.kind) {
    case KOLO__ALLREDUCE:
        return a->d.dtype == b->d.dtype && a->d.op == b->d.op && a->d.pre == b->d.pre && a->d.post == b->d.post;
    case KOLO__BROADCAST: return a->d.root == b->d.root;
    case KOLO__ALLGATHER: return true;
    default: return false;
    }
}

int kolo__execute(kolo__pset_state *s)
{
    bool tracing = kolo__trace_on();
    if (s->nresp > E.bidx_cap) {
        size_t *p = kolo__malloc(s->nresp * sizeof(size_t));
        kolo_request_t **d = kolo__malloc(s->nresp * sizeof(*d));
        if (!p || !d) {
            kolo__free(p);
            kolo__free(d);
            return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for fusion bookkeeping");
        }
        kolo__free(E.bidx);
        kolo__free(E.done_reqs);
        E.bidx = p;
        E.done_reqs = d;
        E.bidx_cap = s->nresp;
    }
    if (tracing) {
        for (size_t i = 0; i < s->nresp; i++) {
            kolo__resp *rp = &s->resp[i];
            rp->traced = rp->status == KOLO_OK && rp->d.kind != KOLO__JOIN;
            if (rp->traced) trace_start(rp);
        }
        kolo__trace_seq q; /* opened after the begins above, so that QUEUE starts inside them */
        kolo__trace_seq_open(&q);
        for (size_t i = 0; i < s->nresp; i++)
            if (s->resp[i].traced) kolo__trace_seq_begin(&q, s->resp[i].name, "QUEUE");
        kolo__trace_seq_close(&q);
    }
    for (size_t i = 0; i < s->nresp; i++) {
        kolo__resp *rp = &s->resp[i];
        if (rp->done) continue;
        if (rp->status != KOLO_OK) {
            rp->done = 1;
            if (rp->req) kolo__pset_complete(s, rp->req, rp->status, rp->err);
            continue;
        }
        size_t k = 1, total = fuse_bytes(s, rp);
        E.bidx[0] = i;
        /* allreduces fuse without copying large tensors (ring_iov.c); the others copy, and so does
         * Adasum, whose large tensors therefore run alone */
        size_t cap = rp->d.kind == KOLO__ALLREDUCE && rp->d.op != KOLO_ADASUM ? SIZE_MAX : FUSE_TENSOR_MAX;
        if (E.fusion && total <= cap)
            for (size_t j = i + 1; j < s->nresp && total < E.fusion; j++) {
                kolo__resp *q = &s->resp[j];
                if (!fusable(rp, q)) continue;
                size_t b = fuse_bytes(s, q);
                if (b > cap || total + b > E.fusion) continue;
                E.bidx[k++] = j;
                total += b;
            }
        kolo__engine_act_run(s->id, rp->name, k - 1);
        int st;
        if (rp->d.kind == KOLO__ALLREDUCE) {
            st = run_allreduce(s, E.bidx, k, tracing);
        } else if (k > 1) {
            st = rp->d.kind == KOLO__ALLGATHER ? run_allgather_fused(s, E.bidx, k, tracing)
                                               : run_broadcast_fused(s, E.bidx, k, tracing);
            atomic_fetch_add_explicit(&E.st.collectives, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&E.st.fused_collectives, 1, memory_order_relaxed);
        } else {
            st = run_other(s, rp, tracing);
        }
        if (tracing) { /* recorded before the requests complete: their owner may stop the timeline */
            kolo__trace_seq ends;
            kolo__trace_seq_open(&ends);
            for (size_t b = 0; b < k; b++) {
                kolo__resp *q = &s->resp[E.bidx[b]];
                if (q->traced) kolo__trace_seq_end(&ends, q->name, kolo__op_upper(q->d.kind, q->d.op));
                q->traced = 0;
            }
            kolo__trace_seq_close(&ends);
        }
        size_t nd = 0;
        for (size_t b = 0; b < k; b++) {
            kolo__resp *q = &s->resp[E.bidx[b]];
            q->done = 1;
            if (st != KOLO_OK) continue;
            if (q->d.kind == KOLO__JOIN && q->req) q->req->last_joined = s->last_joined;
            if (E.tune_state == KOLO_AUTOTUNE_TUNING && E.rank == 0 && q->req) kolo__tune_observe(s->id, q);
            if (q->req) E.done_reqs[nd++] = q->req;
        }
        if (st != KOLO_OK) return st; /* a job error: the caller fails everything that is left */
        kolo__pset_complete_ok(s, E.done_reqs, nd); /* one wake-up for the collective's waiters */
    }
    return KOLO_OK;
}
