/* mem.h - buffers from kolo_mem_alloc, as the collectives see them (mem.c). */
#ifndef KOLO_MEM_H
#define KOLO_MEM_H

#include "../common/common.h"

/* Where a range of this process's kolo_mem_alloc memory lives: the allocation's memfd, its id
 * and length, and the range's offset in it. */
typedef struct kolo__mem_ref {
    int fd;
    uint64_t id, len, off;
} kolo__mem_ref;

/* How many peer buffers can be mapped (pinned) at once. */
#define KOLO_MEM_PEER_MAPS 64

/* Is [p, p + len) inside one allocation of this process? */
bool kolo__mem_find(const void *p, size_t len, kolo__mem_ref *out);
/* Maps (or finds mapped) the allocation `ref` of process `pid` and pins it until
 * kolo__mem_unpin(base); returns its base, or NULL with the error recorded. */
char *kolo__mem_map_peer(int pid, const kolo__mem_ref *ref);
void kolo__mem_unpin(const char *base);
/* Test hook: the nth kolo__mem_map_peer call from now on fails (0 disarms). */
void kolo__mem_test_fail_map(long nth);
/* Unmaps every peer buffer no collective is using (at shutdown). */
void kolo__mem_forget_peers(void);

#endif
