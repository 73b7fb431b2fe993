/* ring_iov.h - allreduces over a list of buffers: the ring, three stages, recursive halving (ring_iov.c). */
#ifndef KOLO_RING_IOV_H
#define KOLO_RING_IOV_H

#include "../coll/coll.h"

/* The segments (kolo__seg) are declared in coll.h: the direct allreduce takes them too. */

/* dst = post * OP over members (pre * src), over the concatenation of segs, with the same
 * blocks, chains and bits as kolo__coll_allreduce's ring on one buffer of that size. Every
 * member must pass segments of the same lengths. segs[].src is changed when pre != 1 (the
 * scaled values go to dst first). scratch: at least kolo__iov_scratch(total elements) bytes. */
int kolo__iov_allreduce(kolo__mesh *m, const kolo__group *g, kolo__seg *segs, int nseg, kolo_dtype_t dtype,
                        kolo_op_t op, double pre, double post, void *scratch, size_t scratch_len);

/* Scratch bytes kolo__iov_allreduce needs for a virtual buffer of `total` elements on m. */
size_t kolo__iov_scratch(const kolo__mesh *m, size_t total, int n, size_t es);

/* The same allreduce across hosts in three stages (coll/hier.c), on the groups
 * kolo__coll_hier_groups gave; its scratch, for `local` members per host on `hosts` hosts. */
int kolo__iov_hier_allreduce(kolo__mesh *m, const kolo__group *g, const kolo__group *lg, const kolo__group *xg,
                             kolo__seg *segs, int nseg, kolo_dtype_t dtype, kolo_op_t op, double pre, double post,
                             void *scratch, size_t scratch_len);
size_t kolo__iov_hier_scratch(const kolo__mesh *m, int local, int hosts, size_t total, size_t es);

/* The same allreduce across hosts by recursive halving and doubling over the members in `order`
 * (kolo__coll_halving_order), with kolo__coll_allreduce's results on the concatenation; scratch
 * as kolo__iov_allreduce's. */
int kolo__iov_halving_allreduce(kolo__mesh *m, const kolo__group *g, const int *order, kolo__seg *segs, int nseg,
                                kolo_dtype_t dtype, kolo_op_t op, double pre, double post, void *scratch,
                                size_t scratch_len);

#endif
