/* mem.c - kolo_mem_alloc: buffers the other ranks of this host can map, and the peers' buffers
 * this rank has mapped.
 *
 * Each allocation is its own memfd (no name in /dev/shm, so nothing is left behind when a
 * process dies), mapped shared. A peer maps it by opening /proc/<pid>/fd/<fd> of the owner,
 * which the kernel allows under the same rule as process_vm_readv (ptrace access), so only pairs
 * that passed the CMA probe try. Every allocation has a random 64-bit id; a peer's mapping is
 * cached under (owner pid, id), so a freed and reused descriptor number is never confused with
 * the old buffer. The cache holds at most PEER_MAPS mappings: when it is full, the least
 * recently used one that no collective is using is unmapped (a mapping keeps the owner's pages
 * alive even after the owner freed them).
 *
 * The collectives use this through kolo__mem_find (is [p, p+len) inside one of my allocations?)
 * and kolo__mem_map_peer / kolo__mem_unpin (coll/direct.c).
 *
 * A child forked from the owner (a DataLoader's worker, os.fork(), a pool with the fork start
 * method) inherited these buffers as they are, shared: its writes landed in its parent's buffers
 * (kolo.torch keeps gradients in them, so a forked child's backward pass rewrote the parent's),
 * where malloc'd memory would have given the child a copy. The child now maps each buffer again
 * from its memfd, privately (fork_child): pages it writes become its own, copied at the first
 * write as the kernel copies private memory, at no cost for pages it does not write; pages it has
 * not written still show what its parent writes later. The peers' buffers this process had mapped
 * are unmapped in the child (it runs no collective, see kolo.c, and would keep their pages alive
 * for as long as it lives).
 */
#include "mem.h"

#include "../boot/auth.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define PEER_MAPS KOLO_MEM_PEER_MAPS

typedef struct mine_t {
    char *base;
    size_t len;
    int fd;
    uint64_t id;
} mine_t;

typedef struct peer_map {
    int pid;
    uint64_t id;
    char *base;
    size_t len;
    int pins;
    uint64_t used; /* clock of the last use, for eviction */
} peer_map;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mine_t *mine;
static int nmine, capmine;
static peer_map peers[PEER_MAPS];
static uint64_t clock_ticks;

static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_parent(void) { pthread_mutex_unlock(&lock); }

static void fork_child(void)
{
    /* MAP_FIXED replaces the shared mapping in place: the same addresses, the same contents */
    for (int i = 0; i < nmine; i++)
        (void)mmap(mine[i].base, mine[i].len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, mine[i].fd, 0);
    for (int i = 0; i < PEER_MAPS; i++)
        if (peers[i].base) {
            munmap(peers[i].base, peers[i].len);
            peers[i] = (peer_map){0};
        }
    pthread_mutex_unlock(&lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void watch_forks(void) { (void)pthread_atfork(fork_prepare, fork_parent, fork_child); }

void *kolo_mem_alloc(size_t bytes)
{
    pthread_once(&fork_once, watch_forks);
    if (bytes == 0) {
        kolo__err(KOLO_ERR_INVALID_ARG, "kolo_mem_alloc of 0 bytes");
        return NULL;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page;
    if (len < bytes) {
        kolo__err(KOLO_ERR_INVALID_ARG, "kolo_mem_alloc of %zu bytes: too large", bytes);
        return NULL;
    }
    int fd = memfd_create("kolo-mem", MFD_CLOEXEC);
    if (fd < 0) {
        kolo__err_sys(errno, "kolo_mem_alloc: memfd_create");
        return NULL;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        kolo__err_sys(errno, "kolo_mem_alloc: sizing %zu bytes", len);
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        kolo__err_sys(errno, "kolo_mem_alloc: mapping %zu bytes", len);
        close(fd);
        return NULL;
    }
    uint64_t id;
    if (kolo__random_bytes(&id, sizeof(id)) != KOLO_OK) id = kolo__now_ns() ^ (uint64_t)(uintptr_t)p;
    pthread_mutex_lock(&lock);
    if (nmine == capmine) {
        int cap = capmine ? 2 * capmine : 16;
        mine_t *m = kolo__realloc(mine, (size_t)cap * sizeof(*m));
        if (!m) {
            pthread_mutex_unlock(&lock);
            munmap(p, len);
            close(fd);
            kolo__err(KOLO_ERR_NO_MEMORY, "kolo_mem_alloc: no memory for its table");
            return NULL;
        }
        mine = m;
        capmine = cap;
    }
    mine[nmine++] = (mine_t){p, len, fd, id};
    pthread_mutex_unlock(&lock);
    return p;
}

int kolo_mem_free(void *p)
{
    if (!p) return KOLO_OK;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmine; i++)
        if (mine[i].base == p) {
            mine_t m = mine[i];
            mine[i] = mine[--nmine];
            pthread_mutex_unlock(&lock);
            munmap(m.base, m.len);
            close(m.fd);
            return KOLO_OK;
        }
    pthread_mutex_unlock(&lock);
    return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_mem_free(%p): not a pointer kolo_mem_alloc returned", p);
}

bool kolo__mem_find(const void *p, size_t len, kolo__mem_ref *out)
{
    bool found = false;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nmine && !found; i++) {
        uintptr_t b = (uintptr_t)mine[i].base;
        if (a >= b && a - b <= mine[i].len && len <= mine[i].len - (a - b)) {
            *out = (kolo__mem_ref){.fd = mine[i].fd, .id = mine[i].id, .len = mine[i].len, .off = a - b};
            found = true;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static _Atomic long map_countdown;

void kolo__mem_test_fail_map(long nth) { atomic_store(&map_countdown, nth); }

char *kolo__mem_map_peer(int pid, const kolo__mem_ref *ref)
{
    if (atomic_load_explicit(&map_countdown, memory_order_relaxed) > 0 && atomic_fetch_sub(&map_countdown, 1) == 1) {
        kolo__err(KOLO_ERR_SYSTEM, "mapping the buffer of process %d failed: injected failure (test hook)", pid);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    uint64_t now = ++clock_ticks;
    peer_map *free_slot = NULL, *lru = NULL;
    for (int i = 0; i < PEER_MAPS; i++) {
        peer_map *e = &peers[i];
        if (e->base && e->pid == pid && e->id == ref->id && e->len == ref->len) {
            e->pins++;
            e->used = now;
            pthread_mutex_unlock(&lock);
            return e->base;
        }
        if (!e->base && !free_slot) free_slot = e;
        if (e->base && !e->pins && (!lru || e->used < lru->used)) lru = e;
    }
    peer_map *slot = free_slot ? free_slot : lru;
    if (!slot) {
        pthread_mutex_unlock(&lock);
        kolo__err(KOLO_ERR_NO_MEMORY, "more than %d peer buffers in use at once", PEER_MAPS);
        return NULL;
    }
    if (slot->base) munmap(slot->base, slot->len);
    slot->base = NULL;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, ref->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    char *p = MAP_FAILED;
    if (fd >= 0) {
        p = mmap(NULL, ref->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (p == MAP_FAILED) {
        int e = errno;
        pthread_mutex_unlock(&lock);
        kolo__err_sys(e, "mapping the shared buffer of process %d (%s)", pid, path);
        return NULL;
    }
    *slot = (peer_map){pid, ref->id, p, ref->len, 1, now};
    pthread_mutex_unlock(&lock);
    return p;
}

void kolo__mem_unpin(const char *base)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < PEER_MAPS; i++)
        if (peers[i].base == base && peers[i].pins > 0) {
            peers[i].pins--;
            break;
        }
    pthread_mutex_unlock(&lock);
}

void kolo__mem_forget_peers(void)
{
    pthread_mutex_lock(&lock);
    for (int i = 0; i < PEER_MAPS; i++)
        if (peers[i].base && !peers[i].pins) {
            munmap(peers[i].base, peers[i].len);
            peers[i] = (peer_map){0};
        }
    pthread_mutex_unlock(&lock);
}
