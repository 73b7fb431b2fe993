/* kolo.c - the public API: init and shutdown, who-am-I, process sets, and the direct collectives
 * with their argument checks (every input is validated here, before anything is sent). */
#include "world.h"
#include "mem.h"

#include "../boot/auth.h"
#include "../engine/engine.h"
#include "../reduce/reduce.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

kolo__world kolo__W = {.direct_lock = PTHREAD_MUTEX_INITIALIZER, .pset_lock = PTHREAD_MUTEX_INITIALIZER};
#define W kolo__W

/* ---- names and version ---- */

static const char *const dtype_names[KOLO_DTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"};
static const size_t dtype_sizes[KOLO_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
static const char *const op_names[KOLO_OP_COUNT] = {"sum", "average", "min", "max", "product", "adasum"};

size_t kolo_dtype_size(kolo_dtype_t d) { return (unsigned)d < KOLO_DTYPE_COUNT ? dtype_sizes[d] : 0; }
const char *kolo_dtype_name(kolo_dtype_t d) { return (unsigned)d < KOLO_DTYPE_COUNT ? dtype_names[d] : "unknown"; }
const char *kolo_op_name(kolo_op_t o) { return (unsigned)o < KOLO_OP_COUNT ? op_names[o] : "unknown"; }
int kolo_version(void) { return KOLO_VERSION_NUMBER; }

const char *kolo_build_info(void)
{
    static char buf[256];
    if (!buf[0])
        snprintf(buf, sizeof(buf), "kolo %s; transports: shm (ring copies or single-copy CMA, KOLO_SHM_CMA), tcp; kernels: %s", KOLO_VERSION_STRING,
                 kolo__reduce_isa());
    return buf;
}

/* ---- init / shutdown ---- */

static void free_group(kolo__group *g)
{
    kolo__group_hosts_free(g);
    kolo__free(g->ranks);
    kolo__free(g);
}

static int make_world_group(void)
{
    kolo__group *g = kolo__calloc(1, sizeof(*g));
    if (g) g->ranks = kolo__calloc((size_t)W.info.size, sizeof(int));
    if (!g || !g->ranks) {
        kolo__free(g);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the world group");
    }
    g->size = W.info.size;
    g->rank = W.info.rank;
    for (int i = 0; i < g->size; i++) g->ranks[i] = i;
    if (kolo__group_hosts_make(g, W.host_of) != KOLO_OK) {
        free_group(g);
        return KOLO_ERR_NO_MEMORY;
    }
    W.psets[0] = g;
    W.next_pset = 1;
    return KOLO_OK;
}

/* Local and cross ranks from the host keys every rank published (Horovod's definitions:
 * cross_size = hosts that have a rank with this local rank; cross_rank = this host's index
 * among them). */
static int compute_topology(void)
{
    int n = W.info.size, me = W.info.rank;
    if (!W.peers) {
        W.local_rank = 0;
        W.local_size = 1;
        W.cross_rank = 0;
        W.cross_size = 1;
        return KOLO_OK;
    }
    /* each rank's host, numbered in order of each host's lowest rank (the same numbers on every
     * rank, as all read the same keys), and its local rank */
    int *host = kolo__calloc((size_t)n * 3, sizeof(int)); /* host, local rank, ranks seen per host */
    if (!host) /* every rank must have them, or their algorithms would differ */
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the hosts of %d ranks", n);
    int *lrank = host + n, *seen = host + 2 * n, hosts = 0;
    for (int r = 0; r < n; r++) {
        int q = 0;
        while (q < r && strcmp(W.peers[q].hostkey, W.peers[r].hostkey) != 0) q++;
        host[r] = q < r ? host[q] : hosts++;
        lrank[r] = seen[host[r]]++;
    }
    int lr = lrank[me], cr = 0, cs = 0;
    for (int r = 0; r < n; r++) /* the ranks with this local rank, one per host that has one */
        if (lrank[r] == lr) {
            cr += r < me;
            cs++;
        }
    W.local_rank = lr;
    W.local_size = seen[host[me]];
    W.cross_rank = cr;
    W.cross_size = cs;
    /* the hosts stay for the hierarchical collectives (coll/hier.c) and the halving
     * (coll/allreduce.c); none on one host, where they never run, so that a large collective
     * there does not look at its group's hosts at every call (counted by distinct hosts, not
     * cross_size: that counts the hosts with this rank's local rank) */
    if (hosts < 2) {
        kolo__free(host);
        host = NULL;
    }
    W.host_of = host;
    return KOLO_OK;
}

/* With more ranks than cores, the shared-memory pairs that pick ring copies or single-copy
 * reads from timings (KOLO_SHM_CMA=auto) stay on ring copies: a message timed while its rank
 * shares a core measures the scheduler, not the way. The large sends that a collective marks
 * `single` (alltoall's, the exchanges of allgather and reducescatter) still go single-copy (shm.c,
 * SINGLE_MIN). The senders still move their copies around the cache when those crawl (shm.c,
 * "far": its rule rides out a copy the scheduler cut in two). */
static void pin_ring_copies(void)
{
    for (int ch = 0; ch < KOLO_NCHANNELS; ch++)
        for (int r = 0; r < W.info.size; r++)
            if (W.mesh[ch]) {
                kolo__conn *c = W.mesh[ch]->conns[r];
                if (kolo__shm_cma_state(c) == 2) kolo__shm_pin_oversubscribed(c);
            }
}

/* Busy-polling pays only while every rank of this host has a core to itself: with more local
 * ranks than cores, a waiter that spins holds the core its peer needs to produce what it waits
 * for, and every step of a collective costs a whole spin period. So, unless KOLO_SPIN_US is set,
 * an oversubscribed host yields at once (Open MPI's yield_when_idle does the same). */
static void choose_spin(size_t sharers, long cpus)
{
    if (kolo__setting_is_set(KOLO_SET_SPIN_US)) return;
    KOLO_INFO("%zu ranks on this machine share %ld cores: waiting ranks yield at once instead of spinning", sharers,
              cpus);
    for (int c = 0; c < KOLO_NCHANNELS; c++)
        if (W.mesh[c]) W.mesh[c]->spin_ns = 0;
}

/* What the ranks must know alike to choose the same algorithms (kolo__mesh): each knows only
 * its own pairs (one whose shared memory could not be opened runs over TCP), its own host and
 * its own cache, so every rank contributes flags (bit 0: this host is oversubscribed; bit 1 + c:
 * every pair of this rank runs over shared memory on channel c; bit 3 + c: and sends the messages
 * marked `single` single-copy; bits 5 + c and 7 + c: the same of its pairs with the ranks of its
 * own host, for the groups that lie on one host of a job on several: host_flags) and the size from which it would
 * have rings write around the cache (kolo__stream_min_local: hosts and KOLO_STREAM_MIN may
 * differ, and a ring that fuses its middle steps sends other messages than one that does not)
 * and the one CPU it is bound to, if it is, and all combine them: the flags by and and or, the
 * sizes by their minimum, the CPUs into whether the ranks are bound in blocks. Once this allgather
 * has ended on a rank, every rank has entered it. The allgather itself runs while the flags are
 * still false and the size unset on every rank, so it takes the same path everywhere. */
typedef struct agreement {
    uint64_t stream_min;
    uint16_t flags;
    uint8_t hier[2]; /* KOLO_HIERARCHICAL_ALLREDUCE, _ALLGATHER: 0 off, 1 auto, 2 on; all take the least */
    int32_t cpu;  /* the one CPU this rank is bound to, or -1 (blocks_of, below) */
    int32_t plan; /* the CPU KOLO_BIND=auto would bind it to, or -1 (bind_host, below) */
    int32_t pad2;
    uint64_t small_max; /* KOLO_SMALL_ALLREDUCE_MAX in effect, SMALL_SET added where set (follow_rank0) */
    uint64_t chunk;     /* KOLO_RING_CHUNK in effect */
} agreement;

#define SMALL_SET ((uint64_t)1 << 63)

/* The settings that cut the ranks' messages (the allreduce's algorithms by size, the ring's
 * chunks) must be alike on every rank, or the first collective they touch fails as a mismatch of
 * counts that no rank made. Every rank follows rank 0's, as the engine's settings do
 * (engine/engine.c), and one that had others says so. */
static void follow_rank0(const agreement *all, const agreement *mine)
{
    const agreement *z = &all[0];
    if (z->small_max != mine->small_max) {
        char v0[48], v[48];
        snprintf(v0, sizeof(v0), z->small_max & SMALL_SET ? "%llu" : "unset (%llu)",
                 (unsigned long long)(z->small_max & ~SMALL_SET));
        snprintf(v, sizeof(v), mine->small_max & SMALL_SET ? "%llu" : "unset (%llu)",
                 (unsigned long long)(mine->small_max & ~SMALL_SET));
        KOLO_WARN("KOLO_SMALL_ALLREDUCE_MAX is %s on rank 0 and %s here: every rank follows rank 0 (set it alike "
                  "everywhere, or nowhere)", v0, v);
    }
    if (z->chunk != mine->chunk)
        KOLO_WARN("KOLO_RING_CHUNK is %llu on rank 0 and %llu here: every rank follows rank 0 (set it alike "
                  "everywhere, or nowhere)", (unsigned long long)z->chunk, (unsigned long long)mine->chunk);
    kolo__coll_follow((size_t)(z->small_max & ~SMALL_SET), (z->small_max & SMALL_SET) != 0, (size_t)z->chunk);
}

/* The one CPU this process may run on, or -1 if it may run on several. */
static int32_t bound_cpu(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) != 1) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) return c;
    return -1;
}

/* Whether every rank is bound to one CPU and each CPU's ranks are neighbours in rank order
 * (kolo__mesh.world_blocks): walking the ranks, a CPU once left never comes back. On one host
 * only: CPU numbers of different machines say nothing about each other. */
static bool blocks_of(const agreement *all, int n, bool one_host)
{
    if (!one_host) return false;
    cpu_set_t left;
    CPU_ZERO(&left);
    for (int r = 0; r < n; r++) {
        int c = all[r].cpu;
        if (c < 0 || c >= CPU_SETSIZE || CPU_ISSET(c, &left)) return false;
        if (r + 1 < n && all[r + 1].cpu != c) CPU_SET(c, &left);
    }
    return true;
}

/* KOLO_BIND: none, or auto (*wish). Read before the rendezvous, so that a bad value fails every
 * rank that has it at once. */
static int bind_setting(bool *wish)
{
    const char *v = kolo__setting_str(KOLO_SET_BIND);
    *wish = strcmp(v, "auto") == 0;
    if (!*wish && *v && strcmp(v, "none") != 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_BIND='%s' is not one of none, auto", v);
    return KOLO_OK;
}

/* The CPU KOLO_BIND=auto would bind this rank to, or -1: where it asks, is not bound to one CPU
 * already and its host has more ranks than the CPUs it may use, the CPU at local rank * CPUs /
 * local ranks of those CPUs in core order (kolorun --bind-to auto's blocks, tools/kolorun/bind.c). */
static int32_t bind_plan(bool wish)
{
    cpu_set_t set;
    if (!wish || W.local_size < 2 || sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < 2 ||
        W.local_size <= CPU_COUNT(&set))
        return -1;
    int *order = kolo__calloc(CPU_SETSIZE, sizeof(int));
    if (!order) return -1;
    int k = kolo__cpus_in_core_order(&set, order);
    int32_t cpu = k > 0 ? order[(long)W.local_rank * k / W.local_size] : -1;
    kolo__free(order);
    return cpu;
}

/* Binds every thread of this process (the calling one last, whatever else fails) to one CPU;
 * threads it starts later inherit it. 0 or the errno of the first failure. */
static int bind_threads(int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    int err = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d));) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid > 0 && sched_setaffinity(tid, sizeof(one), &one) != 0 && errno != ESRCH && !err) err = errno;
    }
    if (d) closedir(d);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) err = errno;
    return err;
}

/* KOLO_BIND=auto, for ranks a launcher started unbound on a crowded host (kolorun binds its own):
 * where every rank of this host planned a CPU (bind_plan) and all may use the same CPUs (their
 * peer records' `cores`), each takes its planned CPU; all ranks write their host's into all[].cpu
 * from the exchanged plans alone, so the blocks agreement is the same everywhere whatever a
 * binding's outcome. Otherwise nobody on the host binds, and a rank that asked says why. */
static void bind_host(agreement *all, int n)
{
    int me = W.info.rank, here = 0, planned = 0, bound = 0;
    bool same = true;
    for (int r = 0; r < n; r++) {
        if (W.host_of && W.host_of[r] != W.host_of[me]) continue;
        here++;
        planned += all[r].plan >= 0;
        bound += all[r].cpu >= 0;
        same = same && W.peers[r].cores == W.peers[me].cores;
    }
    if (all[me].plan < 0) return;
    if (planned < here || !same) {
        KOLO_WARN("KOLO_BIND=auto leaves rank %d unbound: %s", me,
                  bound ? "a rank of this host is bound to one CPU already"
                  : !same ? "the ranks of this host may use different CPUs"
                          : "not every rank of this host sets KOLO_BIND=auto");
        return;
    }
    for (int r = 0; r < n; r++)
        if (!W.host_of || W.host_of[r] == W.host_of[me]) all[r].cpu = all[r].plan;
    int err = bind_threads(all[me].plan);
    if (err) KOLO_WARN("KOLO_BIND=auto: rank %d could not bind itself to CPU %d: %s", me, all[me].plan, strerror(err));
    else KOLO_INFO("KOLO_BIND=auto: bound to CPU %d (local rank %d of %d)", all[me].plan, W.local_rank, W.local_size);
}

/* Each host's flags from its ranks' (a job on several hosts): KOLO_HOST_CROWDED where one says its
 * host has more ranks than cores, KOLO_HOST_SHM and KOLO_HOST_SINGLE of channel c where every one
 * says so of its pairs on the host. Per channel, W.hosts bytes each. */
static int agree_hosts(const agreement *all, int n)
{
    int hosts = 0;
    for (int r = 0; r < n; r++) hosts = KOLO_MAX(hosts, W.host_of[r] + 1);
    uint8_t *f = kolo__calloc((size_t)hosts * KOLO_NCHANNELS, 1);
    if (!f) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the flags of %d hosts at init", hosts);
    for (int c = 0; c < KOLO_NCHANNELS; c++) {
        uint8_t *fc = f + (size_t)c * (size_t)hosts;
        memset(fc, KOLO_HOST_SHM | KOLO_HOST_SINGLE | KOLO_HOST_CMA, (size_t)hosts);
        for (int r = 0; r < n; r++) {
            uint8_t *h = &fc[W.host_of[r]];
            if (all[r].flags & 1u) *h |= KOLO_HOST_CROWDED;
            if (!(all[r].flags & (32u << c))) *h &= (uint8_t)~(KOLO_HOST_SHM | KOLO_HOST_SINGLE | KOLO_HOST_CMA);
            if (!(all[r].flags & (128u << c))) *h &= (uint8_t)~KOLO_HOST_SINGLE;
            if (!(all[r].flags & (2048u << c))) *h &= (uint8_t)~KOLO_HOST_CMA;
        }
    }
    W.host_flags = f;
    W.hosts = hosts;
    return KOLO_OK;
}

static int agree_world(bool oversubscribed, bool bind_wish)
{
    int n = W.info.size, me = W.info.rank;
    agreement mine = {.stream_min = kolo__stream_min_local(),
                      .flags = oversubscribed ? 1u : 0u,
                      .cpu = bound_cpu(),
                      .plan = bind_plan(bind_wish),
                      .small_max = kolo__coll_small_max() | (kolo__coll_small_max_set() ? SMALL_SET : 0),
                      .chunk = kolo__coll_chunk()};
    static const kolo_setting_t hier_set[2] = {KOLO_SET_HIERARCHICAL_ALLREDUCE, KOLO_SET_HIERARCHICAL_ALLGATHER};
    uint8_t hier[2];
    for (int k = 0; k < 2; k++) {
        int v, st = kolo__setting_auto01(hier_set[k], &v);
        if (st != KOLO_OK) return st;
        /* ordered so that the least of all ranks' wins: 0 off, 1 auto, 2 on */
        hier[k] = v == KOLO_SETTING_OFF ? 0 : v == KOLO_SETTING_AUTO ? 1 : 2;
        mine.hier[k] = hier[k];
    }
    for (int c = 0; c < KOLO_NCHANNELS; c++) {
        bool shm = true, single = true, cma = true, host_shm = true, host_single = true, host_cma = true;
        for (int r = 0; r < n; r++) {
            if (r == me) continue;
            const kolo__conn *cr = W.mesh[c]->conns[r];
            bool s = cr->tp == &kolo__shm_transport, one = kolo__shm_sends_single(cr);
            bool reads = kolo__shm_cma_state(cr) >= 0;
            shm &= s;
            single &= one;
            cma &= reads;
            if (W.host_of && W.host_of[r] == W.host_of[me]) {
                host_shm &= s;
                host_single &= one;
                host_cma &= reads;
            }
        }
        if (shm) mine.flags |= (uint16_t)(2u << c);
        if (shm && single) mine.flags |= (uint16_t)(8u << c);
        if (host_shm) mine.flags |= (uint16_t)(32u << c);
        if (host_shm && host_single) mine.flags |= (uint16_t)(128u << c);
        if (shm && cma) mine.flags |= (uint16_t)(512u << c);
        if (host_shm && host_cma) mine.flags |= (uint16_t)(2048u << c);
    }
    agreement *all = kolo__calloc((size_t)n, sizeof(agreement));
    size_t *counts = kolo__calloc((size_t)n, sizeof(size_t));
    if (!all || !counts) {
        kolo__free(all);
        kolo__free(counts);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the ranks' agreement at init");
    }
    for (int r = 0; r < n; r++) counts[r] = 1;
    /* with ceil(log2 n) peers: every pair's direct rings would fill at once (coll.h) */
    int st = kolo__coll_allgather_few_peers(W.mesh[KOLO_CHANNEL_DIRECT], W.psets[0], &mine, all, counts,
                                            sizeof(agreement));
    if (st == KOLO_OK) follow_rank0(all, &mine);
    if (st == KOLO_OK && W.host_of) st = agree_hosts(all, n);
    if (st == KOLO_OK) {
        uint16_t and_all = 0xffff, or_all = 0;
        uint64_t stream_min = UINT64_MAX;
        for (int r = 0; r < n; r++) {
            and_all &= all[r].flags;
            or_all |= all[r].flags;
            stream_min = KOLO_MIN(stream_min, all[r].stream_min);
            for (int k = 0; k < 2; k++) hier[k] = KOLO_MIN(hier[k], all[r].hier[k]);
        }
        if (stream_min > SIZE_MAX) stream_min = SIZE_MAX;
        bind_host(all, n);
        bool blocks = blocks_of(all, n, !W.host_of);
        for (int c = 0; c < KOLO_NCHANNELS; c++) {
            W.mesh[c]->world_blocks = blocks;
            W.mesh[c]->world_shm = (and_all & (2u << c)) != 0;
            W.mesh[c]->world_single = (and_all & (8u << c)) != 0;
            W.mesh[c]->world_cma = (and_all & (512u << c)) != 0;
            W.mesh[c]->world_oversubscribed = (or_all & 1u) != 0;
            W.mesh[c]->stream_min = KOLO_MAX((size_t)stream_min, 1); /* 0 means not agreed */
            W.mesh[c]->host_of = W.host_of;
            W.mesh[c]->host_flags = W.host_flags ? W.host_flags + (size_t)c * (size_t)W.hosts : NULL;
            W.mesh[c]->hier = hier[0];
            W.mesh[c]->hier_ag = hier[1];
        }
        KOLO_DEBUG("rings of %zu bytes or more write around the cache (this rank would from %llu)",
                   W.mesh[0]->stream_min, (unsigned long long)mine.stream_min);
    }
    kolo__free(all);
    kolo__free(counts);
    return st;
}

static void teardown(void)
{
    kolo__mem_forget_peers();
    for (int c = 0; c < KOLO_NCHANNELS; c++) {
        kolo__mesh_destroy(W.mesh[c]);
        W.mesh[c] = NULL;
    }
    kolo__free(W.peers);
    W.peers = NULL;
    kolo__free(W.host_of);
    W.host_of = NULL;
    kolo__free(W.host_flags);
    W.host_flags = NULL;
    W.hosts = 0;
    kolo__store_server_stop(W.server);
    W.server = NULL;
    for (int i = 0; i < KOLO_MAX_PSETS; i++) {
        if (W.psets[i]) {
            free_group(W.psets[i]);
            W.psets[i] = NULL;
        }
    }
}

/* A direct collective's wait has made no progress for KOLO_STALL_CHECK_TIME (xfer.c): the
 * engine's stall warning names the tensors and the ranks that did not submit them; this names
 * the call and the ranks it waits for, so that a job of direct collectives that hangs says
 * whom it hangs on in its log, under any launcher, before KOLO_OP_TIMEOUT ends it. */
static void direct_stalled(const kolo__mesh *m, uint64_t waited_ns, const char *ranks)
{
    kolo__direct_now d;
    char what[192];
    /* outside a direct collective: kolo_init's agreement, kolo_elastic_check, a process set's change */
    if (!kolo__direct_call(&d))
        snprintf(what, sizeof(what), "an exchange of kolo's own (kolo_init, an elastic check, a process set)");
    else if (!d.number) snprintf(what, sizeof(what), "%s on process set %d", d.fn, d.pset);
    else
        snprintf(what, sizeof(what), "%s of %zu element%s, call %llu on process set %d,", d.what, d.count,
                 d.count == 1 ? "" : "s", (unsigned long long)d.number, d.pset);
    char when[64];
    KOLO_WARN("%s has waited %.3g s for rank(s) %s without progress: they have not reached it, or are stopped or "
              "stuck (%s; KOLO_STALL_CHECK_TIME sets when this warning comes)",
              what, (double)waited_ns * 1e-9, ranks, kolo__op_timeout_text(m, when));
}

/* One attempt at joining: the job the environment describes, or in an elastic job the newest
 * round kolorun formed. */
static int init_once(void)
{
    int st = kolo__env_detect(&W.info);
    if (st != KOLO_OK) return st;
    bool bind_wish;
    if ((st = bind_setting(&bind_wish)) != KOLO_OK) return st;
    W.elastic = kolo_elastic_enabled();
    if (W.elastic && (st = kolo__elastic_join()) != KOLO_OK) return st;
    kolo__log_set_rank(W.info.size > 1 ? W.info.rank : -1);
    /* let same-host peers read our buffers with process_vm_readv under Yama's ptrace scope 1 */
#ifdef PR_SET_PTRACER
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    if (W.info.size > 1) {
        /* a connection per channel to every other rank, and rank 0 serving the rendezvous one
         * per rank while the job assembles (fds.c), and the handshakes of strangers it may hold */
        bool serve = W.info.rdv_serve && W.info.rank == 0;
        size_t others = (size_t)W.info.size - 1;
        char who[224];
        snprintf(who, sizeof(who), "rank %d of a job of %d ranks (%d connections to each other rank%s)", W.info.rank,
                 W.info.size, KOLO_NCHANNELS,
                 serve ? ", and one from each to the rendezvous store it serves, with room for strangers' handshakes"
                       : "");
        size_t serving = serve ? others + 1 + KOLO_STORE_PENDING_MAX : 0;
        if ((st = kolo__fd_room(others * KOLO_NCHANNELS + serving + 2, who)) != KOLO_OK) goto fail;
        if (serve) {
            /* a loopback rendezvous (one host) is served on loopback only */
            const char *bind_host = strncmp(W.info.rdv_host, "127.", 4) == 0 || strcmp(W.info.rdv_host, "localhost") == 0
                                        ? "127.0.0.1"
                                        : "";
            st = kolo__store_server_start(&W.server, bind_host, W.info.rdv_port, W.info.secret, W.info.secret_len);
            if (st != KOLO_OK) {
                kolo__err(st, "rank 0 could not serve the rendezvous store: %s (set KOLO_RENDEZVOUS=host:port to "
                          "choose another address)", kolo__errmsg());
                goto fail;
            }
        }
        kolo__store *store = W.estore; /* an elastic worker is connected already */
        if (!store) {
            st = kolo__store_connect(&store, W.info.rdv_host, W.info.rdv_port, W.info.secret, W.info.secret_len,
                                     W.info.start_timeout);
            if (st != KOLO_OK) {
                kolo__err(st, "rank %d could not reach the rendezvous store at %s:%d: %s", W.info.rank, W.info.rdv_host,
                          W.info.rdv_port, kolo__errmsg());
                goto fail;
            }
        }
        st = kolo__mesh_build(W.mesh, &W.peers, &W.info, store);
        if (store != W.estore) kolo__store_close(store);
        if (st != KOLO_OK) goto fail;
        W.mesh[KOLO_CHANNEL_DIRECT]->on_stall = direct_stalled;
    }
    st = compute_topology();
    if (st != KOLO_OK) goto fail;
    /* A rank that spins holds a core any rank on this machine's cores may need, in whichever
     * network namespace (kolo__core_sharers). The transports' and algorithms' rules for an
     * oversubscribed host (ring copies kept, smaller rings, the ways chosen) were measured with
     * every rank on one host and take the host's ranks: applied to 4 ranks as 2 namespaces of 2
     * on 2 cores, ring copies kept made their 256 KiB allreduce 210 us (median of 10 launches)
     * against 146 with the shm pairs choosing. */
    size_t sharers = W.peers ? kolo__core_sharers(W.peers, W.info.size, W.info.rank) : 1;
    bool oversubscribed = kolo__host_oversubscribed((size_t)W.local_size);
    if (kolo__host_oversubscribed(sharers)) choose_spin(sharers, kolo__host_cpus());
    st = make_world_group();
    if (st != KOLO_OK) goto fail;
    if (oversubscribed) pin_ring_copies();
    if (W.info.size > 1) {
        st = agree_world(oversubscribed, bind_wish);
        if (st != KOLO_OK) goto fail;
    }
    if (W.info.rdv_serve && W.info.size > 1) {
        /* rank 0 serves the store: every rank has read it, being past the agreement */
        kolo__store_server_stop(W.server);
        W.server = NULL;
    }
    st = kolo__engine_start();
    if (st != KOLO_OK) goto fail;
    st = kolo__status_start();
    if (st != KOLO_OK) {
        kolo__engine_stop();
        goto fail;
    }
    return KOLO_OK;
fail:
    /* the ranks connected to this one fail at once with the reason (a setting refused here, no
     * memory), not "it shut down while this rank still had messages to exchange with it" */
    for (int c = 0; c < KOLO_NCHANNELS; c++) kolo__mesh_fail(W.mesh[c], st);
    teardown();
    return st;
}

/* ---- a child forked after kolo_init ----
 * fork() in a process that runs kolo (os.fork(), a worker pool with the fork start method, a
 * data loader's worker) gives the child a copy of the job's state, its sockets and shared rings,
 * and none of its threads. A collective or a wait there hung for ever (no engine thread), and
 * the child's kolo_shutdown (Python's atexit, when the child ends with sys.exit) waited for an
 * engine thread that was not its own, its parent stuck in waitpid. The child may still ask who
 * it is (kolo_rank(), a DataLoader worker seeding its generator); what would talk to the peers
 * fails at once, and its kolo_shutdown leaves what it shares with its parent untouched. */
bool kolo__forked;
static pid_t forked_from;

static void on_fork_child(void)
{
    if (W.initialized && !kolo__forked) {
        kolo__forked = true;
        forked_from = getppid();
    }
}

static void watch_forks(void) { (void)pthread_atfork(NULL, NULL, on_fork_child); }

int kolo__forked_refuse(const char *fn)
{
    if (!kolo__forked) return KOLO_OK;
    return kolo__err(KOLO_ERR_NOT_INITIALIZED,
                     "%s: this process (pid %d) was forked from pid %d after kolo_init, and only that process is "
                     "rank %d of the job: a forked child runs no collective and waits for no request (run them in "
                     "the parent, or exec a new program in the child); kolo_rank() and the like still answer",
                     fn, (int)getpid(), (int)forked_from, W.info.rank);
}

int kolo_init(void)
{
    if (W.initialized) return KOLO_OK; /* a forked child's copy too: code that calls init defensively */
    int forked = kolo__forked_refuse("kolo_init"); /* after its kolo_shutdown: not a second copy of the rank */
    if (forked) return forked;
    static pthread_once_t forks_once = PTHREAD_ONCE_INIT;
    pthread_once(&forks_once, watch_forks);
    kolo__err_clear();
    kolo__log_init();
    int st;
    while ((st = init_once()) != KOLO_OK && kolo__elastic_retry(st))
        KOLO_WARN("worker %d: round %d of the elastic job did not start (%s); waiting for the next round", W.elastic_id,
                  W.elastic_round, kolo__errmsg());
    if (st != KOLO_OK) {
        KOLO_ERROR("%s", kolo__errmsg());
        kolo__elastic_close();
        return st;
    }
    if (W.elastic) kolo__elastic_started();
    W.initialized = 1;
    KOLO_INFO("rank %d of %d (local %d of %d, cross %d of %d) started via %s%s", W.info.rank, W.info.size, W.local_rank,
              W.local_size, W.cross_rank, W.cross_size, W.info.source, W.elastic ? " (elastic)" : "");
    return KOLO_OK;
}

/* A rank that leaves after its job failed on one channel (a peer lost, a garbled stream) says why
 * on the others too, as an abort with the first failure's message, instead of a goodbye or a
 * bare close. Before, a peer still inside a collective on the other channel blamed this rank:
 * rank 1 killed, rank 2's engine failed on it and its program left, and rank 0's direct allreduce
 * with rank 2 failed with "lost rank 2: receiving from it failed (connection closed)", naming a
 * rank that had only been told; now it reads "rank 2 ... aborted the job because: lost rank 1 ...".
 * Found by the engine's random mix with a rank killed (tests/test_engine.c). The engine has
 * stopped: no thread uses the meshes. */
static void pass_on_failure(void)
{
    const kolo__mesh *first = NULL;
    for (int c = 0; c < KOLO_NCHANNELS && !first; c++)
        if (W.mesh[c] && W.mesh[c]->failed) first = W.mesh[c];
    if (!first) return;
    char msg[sizeof(first->failmsg)];
    snprintf(msg, sizeof(msg), "%s", first->failmsg);
    for (int c = 0; c < KOLO_NCHANNELS; c++)
        if (W.mesh[c] && !W.mesh[c]->failed) kolo__mesh_fail(W.mesh[c], kolo__err(first->failed, "%s", msg));
}

int kolo_shutdown(void)
{
    if (!W.initialized) return KOLO_OK;
    if (kolo__forked) { /* the parent's connections, rings and threads are the parent's to end */
        W.initialized = 0;
        return KOLO_OK;
    }
    kolo__status_stop();
    kolo__status_lock_out(true);
    kolo__engine_stop(); /* before the meshes go: it says goodbye on its own */
    pthread_mutex_lock(&W.direct_lock);
    pthread_mutex_lock(&W.pset_lock);
    pass_on_failure();
    teardown();
    kolo__elastic_close();
    W.initialized = 0;
    pthread_mutex_unlock(&W.pset_lock);
    pthread_mutex_unlock(&W.direct_lock);
    kolo__status_lock_out(false);
    return KOLO_OK;
}

int kolo_is_initialized(void) { return W.initialized; }
int kolo_rank(void) { return W.initialized ? W.info.rank : -1; }
int kolo_size(void) { return W.initialized ? W.info.size : -1; }
int kolo_local_rank(void) { return W.initialized ? W.local_rank : -1; }
int kolo_local_size(void) { return W.initialized ? W.local_size : -1; }
int kolo_cross_rank(void) { return W.initialized ? W.cross_rank : -1; }
int kolo_cross_size(void) { return W.initialized ? W.cross_size : -1; }

const char *kolo_peer_transport(int peer)
{
    if (!W.initialized || peer < 0 || peer >= W.info.size) return NULL;
    if (peer == W.info.rank) return "self";
    /* Each channel (direct collectives, the engine's) sets up its own connection to the peer, and
     * where /dev/shm runs out of room one may get rings and the other not: "shm" only when all
     * did. Reading the direct channel's alone said "shm" for pairs whose engine collectives, all
     * a Python program calls, went by TCP (a 1 MiB /dev/shm in CI, the channels' hellos in the
     * other order). */
    const char *name = NULL;
    for (int ch = 0; ch < KOLO_NCHANNELS; ch++) {
        kolo__conn *c = W.mesh[ch] ? W.mesh[ch]->conns[peer] : NULL;
        if (!c || !c->tp) continue;
        if (!name || strcmp(c->tp->name, "shm") != 0) name = c->tp->name;
    }
    return name;
}

/* ---- process sets ---- */

kolo__group *kolo__pset_get(int id)
{
    if (id < 0 || id >= KOLO_MAX_PSETS || !W.psets[id]) {
        kolo__err(KOLO_ERR_INVALID_ARG, "unknown process set %d", id);
        return NULL;
    }
    return W.psets[id];
}

static int check_init(void)
{
    if (!W.initialized) return kolo__err(KOLO_ERR_NOT_INITIALIZED, "kolo is not initialized: call kolo_init() first");
    return KOLO_OK;
}

/* check_init for what talks to the peers */
static int check_live(const char *fn)
{
    int st = kolo__forked_refuse(fn);
    return st ? st : check_init();
}

int kolo_process_set_add(const int *ranks, int nranks, int *id)
{
    int st = check_live("kolo_process_set_add");
    if (st) return st;
    if (!id) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_process_set_add: id is NULL");
    if (!ranks || nranks < 1 || nranks > W.info.size)
        return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_process_set_add: need 1 to %d ranks, got %d%s", W.info.size, nranks,
                         ranks ? "" : " (ranks is NULL)");
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= W.info.size)
            return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_process_set_add: rank %d is not in [0, %d)", ranks[i], W.info.size);
        if (i && ranks[i] <= ranks[i - 1])
            return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_process_set_add: ranks must be strictly increasing (%d after %d)",
                             ranks[i], ranks[i - 1]);
    }
    /* every rank must pass the same list: gather a fingerprint of each rank's list */
    uint64_t fp = 1469598103934665603ull;
    for (int i = 0; i < nranks; i++) fp = (fp ^ (uint64_t)ranks[i]) * 1099511628211ull;
    fp = (fp ^ (uint64_t)nranks) * 1099511628211ull;
    uint64_t *all = kolo__calloc((size_t)W.info.size, sizeof(uint64_t));
    size_t *counts = kolo__calloc((size_t)W.info.size, sizeof(size_t));
    if (!all || !counts) {
        kolo__free(all);
        kolo__free(counts);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for process set agreement");
    }
    for (int i = 0; i < W.info.size; i++) counts[i] = 1;
    pthread_mutex_lock(&W.direct_lock);
    st = kolo__coll_allgather(W.mesh[KOLO_CHANNEL_DIRECT], W.psets[0], &fp, all, counts, sizeof(uint64_t));
    pthread_mutex_unlock(&W.direct_lock);
    if (st == KOLO_OK) {
        for (int i = 1; i < W.info.size; i++)
            if (all[i] != all[0]) {
                st = kolo__err(KOLO_ERR_MISMATCH, "kolo_process_set_add: rank %d passed a different list of ranks than rank 0", i);
                break;
            }
    }
    kolo__free(all);
    kolo__free(counts);
    if (st != KOLO_OK) return st;
    kolo__group *g = kolo__calloc(1, sizeof(*g));
    if (g) g->ranks = kolo__malloc((size_t)nranks * sizeof(int));
    if (!g || !g->ranks) {
        kolo__free(g);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a process set");
    }
    g->size = nranks;
    g->rank = -1;
    for (int i = 0; i < nranks; i++) {
        g->ranks[i] = ranks[i];
        if (ranks[i] == W.info.rank) g->rank = i;
    }
    if (kolo__group_hosts_make(g, W.host_of) != KOLO_OK) {
        free_group(g);
        return KOLO_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&W.pset_lock);
    /* ids are assigned in call order, identical on every rank because the calls are collective */
    int nid = -1;
    for (int k = 0; k < KOLO_MAX_PSETS - 1; k++) {
        int cand = (W.next_pset + k - 1) % (KOLO_MAX_PSETS - 1) + 1;
        if (!W.psets[cand]) {
            nid = cand;
            break;
        }
    }
    if (nid > 0) {
        W.psets[nid] = g;
        W.next_pset = nid + 1;
    }
    pthread_mutex_unlock(&W.pset_lock);
    if (nid < 0) {
        free_group(g);
        return kolo__err(KOLO_ERR_INVALID_ARG, "too many process sets (at most %d)", KOLO_MAX_PSETS - 1);
    }
    *id = nid;
    return KOLO_OK;
}

int kolo_process_set_remove(int id)
{
    int st = check_live("kolo_process_set_remove");
    if (st) return st;
    if (id == KOLO_WORLD) return kolo__err(KOLO_ERR_INVALID_ARG, "the world process set (0) cannot be removed");
    pthread_mutex_lock(&W.pset_lock);
    kolo__group *g = kolo__pset_get(id);
    pthread_mutex_unlock(&W.pset_lock);
    if (!g) return KOLO_ERR_INVALID_ARG;
    /* collective, so that no rank removes a set another is still using */
    pthread_mutex_lock(&W.direct_lock);
    st = kolo__coll_barrier(W.mesh[KOLO_CHANNEL_DIRECT], W.psets[0]);
    pthread_mutex_unlock(&W.direct_lock);
    if (st != KOLO_OK) return st;
    pthread_mutex_lock(&W.pset_lock);
    W.psets[id] = NULL;
    pthread_mutex_unlock(&W.pset_lock);
    free_group(g);
    return KOLO_OK;
}

int kolo_process_set_rank(int id, int *rank)
{
    int st = check_init();
    if (st) return st;
    pthread_mutex_lock(&W.pset_lock);
    kolo__group *g = kolo__pset_get(id);
    if (g && rank) *rank = g->rank;
    pthread_mutex_unlock(&W.pset_lock);
    if (!rank) return kolo__err(KOLO_ERR_INVALID_ARG, "rank is NULL");
    return g ? KOLO_OK : KOLO_ERR_INVALID_ARG;
}

int kolo_process_set_size(int id, int *size)
{
    int st = check_init();
    if (st) return st;
    pthread_mutex_lock(&W.pset_lock);
    kolo__group *g = kolo__pset_get(id);
    if (g && size) *size = g->size;
    pthread_mutex_unlock(&W.pset_lock);
    if (!size) return kolo__err(KOLO_ERR_INVALID_ARG, "size is NULL");
    return g ? KOLO_OK : KOLO_ERR_INVALID_ARG;
}

int kolo_process_set_ranks(int id, int *ranks, int cap)
{
    int st = check_init();
    if (st) return st;
    if (!ranks && cap > 0) return kolo__err(KOLO_ERR_INVALID_ARG, "ranks is NULL");
    pthread_mutex_lock(&W.pset_lock);
    kolo__group *g = kolo__pset_get(id);
    if (g)
        for (int i = 0; i < g->size && i < cap; i++) ranks[i] = g->ranks[i];
    pthread_mutex_unlock(&W.pset_lock);
    return g ? KOLO_OK : KOLO_ERR_INVALID_ARG;
}

/* ---- direct collectives ---- */

/* Common checks; on success *g is the member group and the direct lock is held. */
static int enter(const char *fn, int pset, kolo__group **g)
{
    int st = check_live(fn);
    if (st) return st;
    pthread_mutex_lock(&W.direct_lock);
    if (!W.initialized) {
        pthread_mutex_unlock(&W.direct_lock);
        return kolo__err(KOLO_ERR_NOT_INITIALIZED, "%s: kolo was shut down", fn);
    }
    pthread_mutex_lock(&W.pset_lock);
    *g = kolo__pset_get(pset);
    pthread_mutex_unlock(&W.pset_lock);
    if (!*g) {
        pthread_mutex_unlock(&W.direct_lock);
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: unknown process set %d", fn, pset);
    }
    if ((*g)->rank < 0) {
        pthread_mutex_unlock(&W.direct_lock);
        return kolo__err(KOLO_ERR_NOT_MEMBER, "%s: rank %d is not a member of process set %d", fn, W.info.rank, pset);
    }
    atomic_store_explicit(&W.direct_fn, fn, memory_order_relaxed);
    atomic_store_explicit(&W.direct_pset, pset, memory_order_relaxed);
    atomic_store_explicit(&W.direct_since, kolo__now_ns(), memory_order_release);
    return KOLO_OK;
}

/* The call has passed its checks and starts: what it sends with its messages and checks the
 * peers' against (net/xfer.c, "Call tags"; a world of one has no mesh), and, for the stall
 * warning and the status, its number on the set and what it is. */
static void begin(kolo__group *g, uint16_t tag, int root, size_t count)
{
    if (W.mesh[KOLO_CHANNEL_DIRECT]) W.mesh[KOLO_CHANNEL_DIRECT]->call_tag = tag;
    atomic_thread_fence(memory_order_release); /* leave's 0 before these, for kolo__direct_call */
    atomic_store_explicit(&W.direct_tag, tag, memory_order_relaxed);
    atomic_store_explicit(&W.direct_root, root, memory_order_relaxed);
    atomic_store_explicit(&W.direct_count, count, memory_order_relaxed);
    atomic_store_explicit(&W.direct_number, ++g->direct_calls, memory_order_release);
}

static int leave(int st)
{
    atomic_store_explicit(&W.direct_since, 0, memory_order_relaxed);
    atomic_store_explicit(&W.direct_number, 0, memory_order_relaxed);
    if (W.mesh[KOLO_CHANNEL_DIRECT]) W.mesh[KOLO_CHANNEL_DIRECT]->call_tag = 0;
    if (st != KOLO_OK) kolo__elastic_ask(W.mesh[0]); /* a failed round: ask for the next one at once */
    pthread_mutex_unlock(&W.direct_lock);
    return st;
}

/* Read on another thread while the call runs, or ends: the number read again after the rest
 * tells a call that ended (or was followed by the next) in between, which then reads as none. */
const char *kolo__direct_call(kolo__direct_now *d)
{
    memset(d, 0, sizeof(*d));
    d->since = atomic_load_explicit(&W.direct_since, memory_order_acquire);
    d->pset = atomic_load_explicit(&W.direct_pset, memory_order_relaxed);
    if (!d->since || !(d->fn = atomic_load_explicit(&W.direct_fn, memory_order_relaxed))) return d->fn = NULL;
    uint64_t n = atomic_load_explicit(&W.direct_number, memory_order_acquire);
    if (!n) return d->fn;
    unsigned tag = atomic_load_explicit(&W.direct_tag, memory_order_relaxed);
    int root = atomic_load_explicit(&W.direct_root, memory_order_relaxed);
    size_t c = atomic_load_explicit(&W.direct_count, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&W.direct_number, memory_order_relaxed) != n) return d->fn;
    kolo__call_text((uint16_t)tag, root, W.info.size, d->what, sizeof(d->what));
    d->number = n;
    d->count = c;
    return d->fn;
}

static int check_dtype_op(const char *fn, kolo_dtype_t dtype, int op)
{
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)dtype);
    if (op < 0) return KOLO_OK;
    if ((unsigned)op >= KOLO_OP_COUNT) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: unknown reduction op %d", fn, op);
    if (!kolo__op_valid(dtype, (kolo_op_t)op))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: op %s is not defined for dtype %s", fn, kolo_op_name((kolo_op_t)op),
                         kolo_dtype_name(dtype));
    return KOLO_OK;
}

static int check_scale(const char *fn, double pre, double post)
{
    if (!(pre == pre) || !(post == post) || pre - pre != 0 || post - post != 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: scale factors must be finite (prescale %g, postscale %g)", fn, pre, post);
    return KOLO_OK;
}

static int check_count(const char *fn, const char *what, size_t count, kolo_dtype_t dtype)
{
    if (count > ((size_t)1 << 48) / kolo_dtype_size(dtype))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s %zu is too large (negative value cast to size_t?)", fn, what, count);
    return KOLO_OK;
}

int kolo_allreduce(const void *sendbuf, void *recvbuf, size_t count, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                   double postscale, int pset)
{
    const char *fn = "kolo_allreduce";
    int st = check_dtype_op(fn, dtype, (int)op);
    if (!st) st = check_scale(fn, prescale, postscale);
    if (!st) st = check_count(fn, "count", count, dtype);
    if (st) return st;
    if (count && (!sendbuf || !recvbuf))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", fn, sendbuf ? "recvbuf" : "sendbuf", count);
    kolo__group *g;
    if ((st = enter(fn, pset, &g))) return st;
    begin(g, kolo__call_tag(KOLO_CALL_ALLREDUCE, dtype, op, kolo__call_scales(prescale, postscale)), -1, count);
    return leave(kolo__coll_allreduce(W.mesh[0], g, sendbuf, recvbuf, count, dtype, op, prescale, postscale));
}

int kolo_allgather(const void *sendbuf, size_t sendcount, void *recvbuf, const size_t *recvcounts, kolo_dtype_t dtype,
                   int pset)
{
    const char *fn = "kolo_allgather";
    int st = check_dtype_op(fn, dtype, -1);
    if (!st) st = check_count(fn, "sendcount", sendcount, dtype);
    if (st) return st;
    kolo__group *g;
    if ((st = enter(fn, pset, &g))) return st;
    size_t *counts = kolo__malloc((size_t)g->size * sizeof(size_t));
    if (!counts) return leave(kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory", fn));
    size_t total = 0;
    for (int i = 0; i < g->size; i++) {
        counts[i] = recvcounts ? recvcounts[i] : sendcount;
        total += counts[i];
    }
    if (recvcounts && recvcounts[g->rank] != sendcount)
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: recvcounts[%d] is %zu but this rank sends %zu", fn, g->rank,
                       recvcounts[g->rank], sendcount);
    else if ((sendcount && !sendbuf) || (total && !recvbuf))
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s is NULL", fn, !recvbuf ? "recvbuf" : "sendbuf");
    else if (total > ((size_t)1 << 48) / kolo_dtype_size(dtype))
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: recvcounts add up to %zu elements: too large", fn, total);
    if (!st) {
        begin(g, kolo__call_tag(KOLO_CALL_ALLGATHER, dtype, -1, -1), -1, sendcount);
        st = kolo__coll_allgather(W.mesh[0], g, sendbuf, recvbuf, counts, kolo_dtype_size(dtype));
    }
    kolo__free(counts);
    return leave(st);
}

int kolo_broadcast(void *buf, size_t count, kolo_dtype_t dtype, int root, int pset)
{
    const char *fn = "kolo_broadcast";
    int st = check_dtype_op(fn, dtype, -1);
    if (!st) st = check_count(fn, "count", count, dtype);
    if (st) return st;
    if (count && !buf) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: buf is NULL with count %zu", fn, count);
    kolo__group *g;
    if ((st = enter(fn, pset, &g))) return st;
    if (root < 0 || root >= g->size)
        return leave(kolo__err(KOLO_ERR_INVALID_ARG, "%s: root %d is not a rank of process set %d (size %d)", fn, root,
                               pset, g->size));
    begin(g, kolo__call_tag(KOLO_CALL_BROADCAST, dtype, -1, root), root, count);
    return leave(kolo__coll_broadcast(W.mesh[0], g, buf, count * kolo_dtype_size(dtype), root));
}

int kolo_alltoall(const void *sendbuf, const size_t *sendcounts, void *recvbuf, const size_t *recvcounts,
                  kolo_dtype_t dtype, int pset)
{
    const char *fn = "kolo_alltoall";
    int st = check_dtype_op(fn, dtype, -1);
    if (st) return st;
    if (!sendcounts || !recvcounts)
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s is NULL", fn, sendcounts ? "recvcounts" : "sendcounts");
    kolo__group *g;
    if ((st = enter(fn, pset, &g))) return st;
    size_t stot = 0, rtot = 0;
    for (int i = 0; i < g->size && !st; i++) {
        if ((st = check_count(fn, "sendcounts[i]", sendcounts[i], dtype))) break;
        if ((st = check_count(fn, "recvcounts[i]", recvcounts[i], dtype))) break;
        stot += sendcounts[i];
        rtot += recvcounts[i];
    }
    if (!st && ((stot && !sendbuf) || (rtot && !recvbuf)))
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s is NULL", fn, stot && !sendbuf ? "sendbuf" : "recvbuf");
    if (!st && sendcounts[g->rank] != recvcounts[g->rank])
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: this rank sends itself %zu elements but expects %zu", fn,
                       sendcounts[g->rank], recvcounts[g->rank]);
    if (!st && sendbuf && recvbuf && sendbuf == recvbuf && stot)
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: cannot run in place (sendbuf == recvbuf)", fn);
    if (!st) begin(g, kolo__call_tag(KOLO_CALL_ALLTOALL, dtype, -1, -1), -1, stot);
    if (!st) st = kolo__coll_alltoall(W.mesh[0], g, sendbuf, sendcounts, recvbuf, recvcounts, kolo_dtype_size(dtype));
    return leave(st);
}

size_t kolo_reducescatter_rows(size_t rows, int n, int r)
{
    if (n <= 0 || r < 0 || r >= n) return 0;
    return kolo__coll_block(rows, n, r, NULL);
}

int kolo_reducescatter(const void *sendbuf, void *recvbuf, size_t rows, size_t row_count, kolo_dtype_t dtype,
                       kolo_op_t op, double prescale, double postscale, int pset)
{
    const char *fn = "kolo_reducescatter";
    int st = check_dtype_op(fn, dtype, (int)op);
    if (!st && op == KOLO_ADASUM)
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: op adasum is defined for allreduce only", fn);
    if (!st) st = check_scale(fn, prescale, postscale);
    if (!st && row_count && rows > ((size_t)1 << 48) / row_count)
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: %zu rows of %zu elements is too large", fn, rows, row_count);
    if (!st) st = check_count(fn, "rows * row_count", rows * row_count, dtype);
    if (st) return st;
    if (rows != 0 && row_count != 0 && !sendbuf) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: sendbuf is NULL", fn);
    kolo__group *g;
    if ((st = enter(fn, pset, &g))) return st;
    size_t *counts = kolo__malloc((size_t)g->size * sizeof(size_t));
    if (!counts) return leave(kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory", fn));
    for (int i = 0; i < g->size; i++) counts[i] = kolo_reducescatter_rows(rows, g->size, i) * row_count;
    if (counts[g->rank] && !recvbuf) st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: recvbuf is NULL", fn);
    else if (sendbuf && sendbuf == recvbuf && counts[g->rank])
        st = kolo__err(KOLO_ERR_INVALID_ARG, "%s: cannot run in place (sendbuf == recvbuf)", fn);
    if (!st)
        begin(g, kolo__call_tag(KOLO_CALL_REDUCESCATTER, dtype, op, kolo__call_scales(prescale, postscale)), -1,
              rows * row_count);
    if (!st) st = kolo__coll_reducescatter(W.mesh[0], g, sendbuf, recvbuf, counts, dtype, op, prescale, postscale);
    kolo__free(counts);
    return leave(st);
}

int kolo_barrier(int pset)
{
    kolo__group *g;
    int st = enter("kolo_barrier", pset, &g);
    if (st) return st;
    begin(g, kolo__call_tag(KOLO_CALL_BARRIER, -1, -1, -1), -1, 0);
    return leave(kolo__coll_barrier(W.mesh[0], g));
}
