/* direct.c - allreduce where every member reads and writes the others' buffers directly, when
 * every member is on this host: mapped, if they come from kolo_mem_alloc, or else with
 * process_vm_readv and process_vm_writev (CMA).
 * The buffer may be a list of segments (the engine's fused buckets); a member's segments are
 * mapped when they lie in at most MAX_REGIONS allocations (the engine's fusion buffer, which
 * comes from kolo_mem_alloc, and one arena holding the bucket's tensors).
 *
 * The ring moves every byte through a shared ring (or a kernel copy) before it is reduced, so
 * a member of a 2-rank allreduce reads and writes about 4.5 times the buffer. Reading (and
 * writing) the others' buffers directly needs 2: every input byte read once, every output byte
 * written once, the least any allreduce can move (the memory-traffic bound of bench/compare.py):
 *
 *   1. the members exchange where their buffers are (one small allgather, which also tells each
 *      that the others' inputs are ready); each maps the others' kolo_mem_alloc buffers (cached)
 *      and reads and writes the rest by CMA;
 *   2. member r reduces block r from all n inputs, in member order, applies the final scaling,
 *      and stores the results into every member's output. When it maps every other member, a
 *      piece at a time through a buffer in the first-level cache ("pushed"); otherwise a step at
 *      a time through a scratch step that stays in cache (an input read by CMA is first copied
 *      into a second scratch step), stored into its own output and each mapped one, and written
 *      into the others' by CMA (process_vm_writev) straight out of the scratch step. Stores
 *      through the cache or around it ("Storing", below);
 *   3. the members exchange their status (a failed read or write anywhere fails the call
 *      everywhere, naming who could not read or write whom). After it nobody reads or writes
 *      another's buffers, so every member may return.
 *
 * Until 2026-11-30 a member that did not map everyone stored its block into its own output
 * only, and after the status exchange each member read the other blocks from their owners'
 * outputs by CMA, with a second status exchange before returning. Writing them out of the
 * scratch step spares every member a read of the others' blocks from memory (where their
 * owners had just stored them around the cache) and the second exchange. Intel Xeon VM, 2
 * vCPUs apart, 2 ranks, direct by CMA pinned, launches alternated (10 pairs): 4 MiB 0.78x the
 * time, 16 MiB 0.86x, 64 MiB 0.93x; perf at 64 MiB: the kernel's copies 27 % of the samples
 * (reads 15.5, writes 11.5) against 32 % of reads.
 *
 * Each block is reduced once, by its owner, so every member ends with the same bits. In place is
 * safe: block r of every member's buffer is read and written only by member r, in step 2 (each
 * piece read before it is written).
 * Pushing, measured on this project's VM (Sapphire Rapids), 2 ranks, 64 MiB in kolo_mem_alloc
 * buffers, out of place: 10.5-11.2 ms per call when each member wrote only its own output and read
 * the other blocks back after an exchange (step 2 6.3-6.8 ms, step 3 3.9); pushed, pieces of 1 KiB
 * 6.0-6.7 ms, 512 B 6.1-6.3, 2 KiB 6.7-7.0, 4 KiB 7.5-8.0, 16 KiB 7.0-7.4 (interleaved launches;
 * float16 and bfloat16 alike, 1 KiB 12-15 % faster than 4 KiB). The bound, both cores moving 2 x
 * 64 MiB at the measured 44 GB/s, is 6.1 ms. On a Zen 4 VM (AMD EPYC family 25, B 47 GB/s), stored
 * around the cache, 1 KiB pieces were the slowest: two threads standing in for the members, the
 * same kernels, interleaved call by call, 64 MiB out of place 6.8-6.9 ms per call against 512 B
 * 5.7-5.9, 256 B 5.4-5.6, 128 B 5.6-5.7 (a plain non-temporal copy of the same bytes: 5.8); in
 * kolo-bench, 8 launches interleaved, float32 64 MiB 11.2 GB/s algbw against 8.0, 16 MiB 12.4
 * against 11.6, smaller sizes alike. So elements of 4 and 8 bytes stored around the cache take 256
 * B pieces (kolo__out_piece, coll.h). Through the cache 256 B lost below 16 MiB (in place 1 MiB
 * 31.5 GB/s against 34.4, 4 MiB 29.8 against 35.6), and float16 and bfloat16, whose kernels go
 * through float32 a piece at a time, gained nothing (64 MiB bfloat16 8.0 GB/s against 9.9 in one
 * set of 5 launches, 9.8 against 10.1 in another): those keep 1 KiB. The engine's ResNet-50 step
 * in one kolo_mem_alloc arena (engine-bench -m 1): 12.3-12.7 ms instead of 18.6-19.5. The decision
 * (direct or ring) is taken from the exchanged descriptors, the same on every member; whether a
 * member pushes is its own (it maps everyone), and step 3 follows what each said.
 *
 * Mapped buffers (all members) run from ZC_MIN, which with the default KOLO_SMALL_ALLREDUCE_MAX
 * (64 KiB) is every allreduce above the small ones (a larger setting moves the start up; a
 * smaller one leaves sizes below ZC_MIN to the ring). Measured on this project's VM (Sapphire Rapids), 2 ranks, out of
 * place / in place, us, against malloc'd buffers (the ring) in the same minutes: 128 KiB 4.3-4.5 /
 * 3.7 (ring 17-20 / 17-18), 256 KiB 7.6-7.9 / 6.2-6.3 (33-37 / 31-35), 1 MiB 45-48 / 21-22 (175-179
 * / 138-148), 4 MiB 319-320 / 146-166 (706-717 / 626-644). Before members pushed and stored
 * through the cache, on VMs whose vCPUs sat on AMD CCDs, the ring in cache beat mapping below
 * 4 MiB on one CCD (1 MiB 10-12 GB/s against 9-10) and mapping started there; on two CCDs mapped
 * was 3-4x the ring at every size. A member whose buffers are not all mapped pays for the
 * descriptor exchange below CMA_MIN too (a round trip of a hundred bytes, ~1 us), and then takes
 * the ring.
 *
 * Storing, mapped: through the cache (plain stores) or around it (non-temporal stores, which
 * skip reading the output's lines first), into every output this member writes. Which is faster
 * depends on the size, on in place or not, and on the machine. Measured on this project's VM
 * (Sapphire Rapids), 2 ranks, us per call, 3 launches each way, cached against streaming: out of
 * place 1 MiB 47-59 against 51-62, 2 MiB 153-171 against 125-142, 4-16 MiB alike, 32 MiB 5262-5433
 * against 2618-2801, 64 MiB 12.7-13.0 ms against 6.7-7.0; in place (its output lines were just read
 * as input and sit in the cache) 1 MiB 19-26 against 119-125, 4 MiB 146-166 against 478-488,
 * 64 MiB 5.0-5.4 ms against 7.8-8.7. Earlier, on a VM whose vCPUs sat on two AMD CCDs, cached
 * stores in place crawled (4 MiB 2414 against 528: a line the other rank read is taken back from
 * its cache). So member 0 chooses by timing, per size class and in place or not, as below for CMA
 * (the ways: streaming, cached), starting with cached stores in place and below
 * STORE_CACHED_FIRST, and its choice travels in its descriptor.
 *
 * Not mapped (by CMA), a member stores its block into its own output through the cache in place
 * (those lines were just read as its input and sit in the cache) and around it out of place; the
 * kernel's copies into the others' outputs go through the cache. Until 2026-12 it streamed in
 * place too, and paid for it: Intel Xeon VM (260 MiB of L3), 2 ranks, direct by CMA pinned,
 * launches of 20 calls alternated (4 rounds, medians), in place 2 MiB 0.63x the time, 4 MiB 0.66x,
 * 8 MiB 0.64x, 16 MiB 0.70x: from 1.17-1.22x Open MPI's in-place time to 0.72-0.79x (pairs of
 * launches). Out of place, stores through the cache below the streaming size (ring.c) gained 0-10 %
 * at 256 KiB-8 MiB in such launches and lost 9-24 % at 16-32 MiB: left streaming.
 *
 * By CMA it depends on where the VM's vCPUs sit (see shm.c): the kernel's copy is slower than
 * the ring's copies through a shared cache, but the ring's copies crawl across CCDs. Measured
 * call by call in the same launches, 2 ranks, direct by CMA against the ring (which writes
 * around the cache from 16 MiB, ring.c), 420+ launches per size on one CCD, 60+ on two:
 *
 *   vCPUs on one CCD:  4 MiB 0.87x, 16 MiB 0.75x, 64 MiB 0.67x
 *   vCPUs on two CCDs: 4 MiB 2.15x, 16 MiB 1.72x, 64 MiB 1.45x
 *
 * So with KOLO_SHM_CMA=auto member 0 of the group chooses, from the calls' own timings, and its
 * choice travels in its descriptor (see "choosing" below); KOLO_SHM_CMA=1 always reads by CMA,
 * 0 never does. The choice against either way pinned, call by call in launches of 14 calls
 * (whose start has 4 calls by ring and a probe of 2 by CMA), 270+ launches on one CCD, 28+ on
 * two: one CCD 0.92-0.96x the ring; two CCDs 1.43x (64 MiB) to 2.18x (4 MiB) the ring, 1.00x
 * direct. (Those figures are from before the members wrote each other's outputs, step 2.)
 *
 * The choice ran from 4 MiB until writing the outputs made CMA the cheaper way below that too.
 * Intel Xeon VM, vCPUs apart, 2 ranks, direct by CMA pinned against the ring with single-copy
 * messages pinned (KOLO_SHM_CMA=1 before), launches of 200 calls alternated (6 pairs): 128 KiB
 * 0.81x the time, 256 KiB 0.82x, 512 KiB 0.79x, 1 MiB 0.83x, 2 MiB 0.92x; traced at 256 KiB, 195-210
 * ps/B against the ring's 290-300. At 64 KiB neither way won (launches of 600 calls: 15-28 us
 * against 15-27, bimodal by launch), nor with 4 ranks (1.08x), so CMA_MIN is 256 KiB. Below it a
 * 2-member ring used to choose its messages' way per call (coll_util.c, "pair"); that choice did
 * not settle (see there), and the ring's messages now go as the transport picks. Against the
 * build before (the ring below 4 MiB, its 2-member calls choosing), launches alternated: 8 rounds
 * of 50 calls (the harness's length) 64 KiB 1.11x the time, 256 KiB 0.99x, 1 MiB 0.71x, 4 MiB 0.81x,
 * 16 / 64 MiB 0.99 / 0.98x; 4 rounds of 600 calls 1 MiB 0.73x, 4 MiB 0.75x (64 KiB alike in 8
 * rounds of 200: 1.02-1.04x, within the launches' spread). Each class's first call, and the first
 * after a change of way, is not timed: traced, the first call of a launch took 28705 ps/B where
 * the next took 463 and the third 286, and a probe's first CMA call 818 where the next took 212.
 *
 * On a host with more ranks than cores, where the pairs keep ring copies, malloc'd buffers go
 * direct from ZC_MIN, not CMA_MIN, and choose from CMA_MIN (plan_for): the ring's 2(n-1) steps are
 * as many hand-offs between ranks that share a core, direct's two exchanges are two. Intel Xeon
 * VM, 2 vCPUs, ranks bound in blocks, 3 rounds, us per call, 128 KiB: 4 ranks 45 against 65 by
 * the ring, 8 ranks 120 against 211, 16 ranks (2 rounds) 429 against 780; 64 and 256 KiB and
 * above alike (64 KiB itself is a small allreduce, KOLO_SMALL_ALLREDUCE_MAX).
 */
#include "coll.h"

#include "../core/mem.h"
#include "../reduce/reduce.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ZC_MIN ((size_t)64 << 10)   /* mapped: from this size on, always (above) */
#define CMA_MIN ((size_t)256 << 10) /* by CMA: from this size on, if chosen */
/* mapped and out of place, results are first stored through the cache below this size, around
 * it from it (in place always through it first), until the calls' timings say otherwise (see
 * "Storing" at the top) */
#define STORE_CACHED_FIRST ((size_t)2 << 20)
#define STEP ((size_t)256 << 10)      /* a block is reduced this many bytes at a time, in cache */
/* A member's segments are mapped only if they lie in at most this many kolo_mem_alloc
 * allocations (inputs and outputs together): an in-place tensor, or the engine's fusion buffer and
 * one arena holding the tensors of a bucket. */
#define MAX_REGIONS 2
/* Each collective pins MAX_REGIONS allocations of every other member, and the direct channel and
 * the engine's may run at once: 2 MAX_REGIONS (n - 1) pins must fit the peer map cache, or a full
 * cache would look like a peer that cannot be mapped. Larger one-host sets take the ring. */
#define MAX_MEMBERS 16
_Static_assert(2 * MAX_REGIONS * (MAX_MEMBERS - 1) <= KOLO_MEM_PEER_MAPS, "peer map cache too small for the members");

enum { PLAN_RING = 0, PLAN_DIRECT = 1, PLAN_EXCHANGE = 2 };
enum { STORE_STREAM = 0, STORE_CACHED = 1 };

typedef struct desc {
    int32_t pid;
    int32_t mapped; /* every segment's input and output in kolo_mem_alloc memory, in the nreg
                     * allocations described below */
    int32_t plan;   /* member 0's: how this call runs (PLAN_*) */
    int32_t store;  /* member 0's: how a mapped call in place stores its results (STORE_*) */
    int32_t nseg;
    uint64_t bytes;
    uint64_t layout; /* a hash of the segments' counts: every member reads and writes the others'
                      * segments as its own are cut, so they must be cut alike */
    int32_t nreg;
    int32_t fd[MAX_REGIONS];
    uint64_t id[MAX_REGIONS], len[MAX_REGIONS];
    uint64_t base[MAX_REGIONS]; /* where the allocation starts in its owner's address space */
} desc;

/* Where one segment's input and output are in its member's address space, and in which of its
 * allocations when mapped (-1: an empty segment, or not mapped). After each member's desc in the
 * exchange come nseg of these. */
typedef struct seg_addr {
    uint64_t src, dst;
    int32_t reg[2];
} seg_addr;

typedef struct status {
    int32_t err;    /* an errno, or 0 */
    int32_t peer;  /* the member it could not read or write */
    int32_t wrote; /* the failure was a write into that member's output */
} status;

static uint64_t zc_runs, cma_runs, zc_cached_runs, zc_push_runs;

uint64_t kolo__zc_runs(void) { return __atomic_load_n(&zc_runs, __ATOMIC_RELAXED); }
uint64_t kolo__direct_cma_runs(void) { return __atomic_load_n(&cma_runs, __ATOMIC_RELAXED); }
uint64_t kolo__zc_cached_runs(void) { return __atomic_load_n(&zc_cached_runs, __ATOMIC_RELAXED); }
uint64_t kolo__zc_push_runs(void) { return __atomic_load_n(&zc_push_runs, __ATOMIC_RELAXED); }

/* test hooks */
static int test_force = -1, test_fail_read, test_fail_write, test_store = -1, test_exchange = -1;
static int test_fail_errno = EFAULT;
static uint64_t test_delay_ns[3], test_store_delay_ns[2]; /* per plan */

void kolo__direct_test_force(int plan) { test_force = plan; }
void kolo__direct_test_fail_read(int nth) { kolo__direct_test_fail_read_with(nth, EFAULT); }
void kolo__direct_test_fail_read_with(int nth, int err)
{
    test_fail_read = nth;
    test_fail_errno = err;
}
void kolo__direct_test_fail_write(int nth) { test_fail_write = nth; }
void kolo__direct_test_delay(int plan, uint64_t ns) { test_delay_ns[plan != 0] = ns; }
void kolo__direct_test_force_store(int mode) { test_store = mode; }
void kolo__direct_test_delay_store(int mode, uint64_t ns) { test_store_delay_ns[mode != 0] = ns; }
void kolo__direct_test_force_exchange(int way) { test_exchange = way; }
void kolo__direct_test_delay_exchange(int way, uint64_t ns) { test_delay_ns[way ? PLAN_EXCHANGE : PLAN_RING] = ns; }

static void test_delay(int plan) { kolo__sleep_ns(test_delay_ns[plan]); }

/* ---- choosing from the calls' own timings: ring or CMA, and mapped in place the stores ----
 *
 * Member 0 of the group times each large allreduce it takes part in, from entry to return, and
 * chooses with kolo__choice_pick and kolo__choice_learn (coll_util.c, where the scheme is
 * described), per size class and separately in place and out of place (choice_for). Both start
 * direct, or the way a neighbouring class settled on (neighbour_verdict, below), and the first
 * probe of the other way comes after a few calls (as an unhinted choice's does).
 *
 * Why these, and why in place apart: on an Intel Xeon guest (2 ranks, each way pinned, 4-6
 * launches of 20-50 calls alternated), direct took 0.59-0.94x the ring's time out of place at
 * every size from 256 KiB to 16 MiB, but in place (while it streamed its own block, see
 * "Storing") 1.1-1.2x at 256-512 KiB, about the same at 1-8 MiB and 0.7x at 16 MiB, so in place
 * started with the ring until 2026-12. Storing in place through the cache made direct the faster
 * way in place too: traced, 4 MiB in place by the ring 300-430 ps/B, direct 160-200 (streaming)
 * and ~120 (through the cache). Starting in place direct, against starting it with the ring (both
 * storing through the cache), launches of 20 calls alternated (4 rounds, medians): 256 KiB-64 MiB
 * 0.78-0.98x the time; 256 KiB-16 MiB 0.44-0.87x Open MPI's in-place time by pairs of launches,
 * where the build before both changes read 0.72-1.18x. They choose apart because in place the
 * peers write a rank's own buffer, and the calls that follow pay for it: the ring timed right
 * after direct calls ran 200-220 ps/B against 160 warm, so each way's timings in a probe hold
 * debts of the other, and the way in use keeps a lead of its own (a switch needs a 10 % gain).
 * Until 2026-12 both kinds shared one class, which started with the way the transport's figures
 * for single messages favoured and then probed only after 0.1 s: that left short launches out
 * of place on the ring (256-512 KiB 1.3-1.6x direct's time) although the transport's messages
 * say nothing of what direct costs (it writes each block from cache into the others' outputs
 * once; the ring copies it through the pair's rings). Where the ring wins (on the AMD VM with
 * its vCPUs on one CCD, direct by reads took 1.2-1.5x its time before 2026-11-30; not measured
 * since), the first probe moves a class there within a dozen calls. */

/* what the two ways of each choice are called in the trace log */
static const char *const WAYS_CMA[2] = {"the ring", "direct by CMA"};
static const char *const WAYS_EXCHANGE[2] = {"the ring", "the exchange"};
static const char *const WAYS_STORE[2] = {"streaming stores", "cached stores"};

/* The choice for allreduces of about this size: a ring of 4-16 MiB runs largely in cache, one of
 * 64 MiB does not, so each size class (x2 from CMA_MIN) keeps its own figures. Classes x4 wide
 * (until 2026-12) compared one way's figures from calls of one size with the other's from
 * another: in a sweep, the ring timed at 4 MiB (224 ps/B) against the first, cold calls of 8 MiB
 * direct (356) moved the class to the ring for the rest of 8 MiB, where direct ran at 180-210. */
static int size_class(uint64_t bytes)
{
    int k = 0;
    for (uint64_t b = bytes / CMA_MIN; b >= 2 && k < KOLO_DIRECT_CLASSES - 1; b /= 2) k++;
    return k;
}

static kolo__choice *choice_for(kolo__mesh *m, uint64_t bytes, bool ip) { return &m->direct[ip][size_class(bytes)]; }
/* what a call of that choice is called in the trace log */
static const char *choice_what(bool ip) { return ip ? "allreduce in place" : "allreduce"; }

/* ---- the exchange: 2 members, out of place, below CMA_MIN ----
 *
 * On 2 members the one-round exchange (allreduce.c: each sends the other its whole buffer and
 * combines both) moves the ring's bytes, the whole buffer once each way where the ring sends half
 * of it twice, in one round instead of two, and sends straight from the caller's buffer, which the
 * transport may then send single-copy; but it combines the whole buffer where the ring combines
 * half, and copies it all through the receiver's scratch. Which is faster depends on the machine's
 * state: on an Intel Xeon guest, 2 ranks, vCPUs apart (shared-memory ping 0.13-0.16 us), 8
 * launches alternated, out of place 128 KiB 12-19 us against the ring's 26-30, in place 19-31
 * against 27-33, 256 KiB alike (direct by CMA or the ring); minutes later, the ping at 0.20 us,
 * out of place 20-31 against 20-22 and in place 27-30 against 19-22, 256 KiB in place 58 against
 * 32-38. So where the caller can run it (the ticket's can_exchange: 2 members, out of place, below
 * 256 KiB, KOLO_SMALL_ALLREDUCE_MAX left at its default) and the buffers are not all mapped,
 * member 0 chooses between the ring and the exchange from the calls' timings as for CMA above,
 * per class (x2 from ZC_MIN), starting with the exchange; its choice travels in its descriptor,
 * which these calls exchanged before anyway. The exchange's sends go single-copy under auto
 * (allreduce.c, `single`). Not in place: there a choice timed both ways alike
 * (260-330 ps/B at 128 KiB) and took the exchange while the launches ran 1.2x the ring's time. */
static int exchange_class(uint64_t bytes) { return bytes > 2 * ZC_MIN; }

static bool exchange_range(const kolo__direct_ticket *t, int n, uint64_t bytes, bool ip)
{
    return t->can_exchange && n == 2 && bytes < CMA_MIN && !ip;
}

static int exchange_plan_for(kolo__mesh *m, uint64_t bytes)
{
    int way = test_exchange >= 0 ? test_exchange
                                 : kolo__choice_pick(&m->exchange[exchange_class(bytes)], kolo__now_ns(), 1, false);
    return way ? PLAN_EXCHANGE : PLAN_RING;
}

/* The store choice for mapped allreduces of about this size, in place or not: classes x4 from
 * ZC_MIN, as much of a call may still be in cache up to a few MiB. */
static kolo__choice *store_choice_for(kolo__mesh *m, uint64_t bytes, bool ip)
{
    int k = 0;
    for (uint64_t b = bytes / ZC_MIN; b >= 4 && k < KOLO_STORE_CLASSES - 1; b /= 4) k++;
    return &m->direct_store[ip][k];
}

/* Every segment reduced in place (its output is its input). */
static bool in_place(const kolo__seg *segs, int nseg)
{
    for (int k = 0; k < nseg; k++)
        if (segs[k].dst != segs[k].src && segs[k].count) return false;
    return true;
}

/* ---- the algorithm ---- */

/* Every pair of g shares memory and passed the CMA probe (the same permission lets a member open
 * the others' memfds), by the flags the ranks agreed at init, so that every member decides alike.
 * Each member's own pairs are not enough, though a pair's transport is the same on both sides:
 * where one pair of 4 ranks went by TCP (a /dev/shm without room for its rings), the members of
 * that pair took the ring and the others the descriptors' exchange, and every 1 MiB allreduce
 * failed as a mismatch. */
static bool all_near(kolo__mesh *m, const kolo__group *g)
{
    return g->size <= MAX_MEMBERS && (kolo__coll_group_flags(m, g) & KOLO_HOST_CMA);
}

/* A class's first call starts the way the nearest class of the same kind (in place or not) at
 * most NEIGHBOUR_CLASSES away (x4 in size) settled on, if one has timed both ways lately; else
 * direct. Either way its first probe comes after the first few calls (FIRST_PROBE_CALLS,
 * coll_util.c), so a neighbour that misleads costs no more than a start from scratch. A sweep
 * upwards, or a job whose fused buffers come in a new size, then starts each size the way the
 * sizes next to it run, where each class used to start direct: on a Zen 4 VM with both vCPUs on
 * one CCD, where the ring beat direct by CMA at 64 MiB (164-274 ps/B against 215-333), the bench
 * harness's band of 64 and 256 MiB (1 warm-up call, 3 timed) ran every call of 256 MiB direct;
 * now 256 MiB takes 64 MiB's way, 1.47x the busbw out of place (docs/performance.md). Evidence
 * from further off is weaker (a 1 MiB ring runs in cache, a 64 MiB one does not), hence the
 * limit. */
#define NEIGHBOUR_CLASSES 2

static int neighbour_verdict(kolo__mesh *m, uint64_t bytes, bool ip, uint64_t now)
{
    int k = size_class(bytes);
    for (int d = 1; d <= NEIGHBOUR_CLASSES; d++)
        for (int side = -1; side <= 1; side += 2) {
            int j = k + side * d;
            if (j < 0 || j >= KOLO_DIRECT_CLASSES) continue;
            int v = kolo__choice_verdict(&m->direct[ip][j], now);
            if (v >= 0) return v;
        }
    return -1;
}

/* Whether member 0 chooses between the ring and direct by CMA from the calls' timings: where its
 * pair with member 1 picks its ways from timings (KOLO_SHM_CMA=auto), and on a host with more
 * ranks than cores, where the pairs keep ring copies without timing (below). */
static bool choosing(kolo__mesh *m, const kolo__group *g)
{
    kolo__conn *c1 = m->conns[kolo__g2w(g, 1)];
    return kolo__shm_cma_state(c1) == 2 || kolo__shm_pinned_oversubscribed(c1);
}

/* How member 0 runs this call by CMA: KOLO_SHM_CMA=1 pins direct, auto chooses from CMA_MIN, and
 * a pair pinned to ring copies (KOLO_SHM_CMA=0) keeps the ring.
 *
 * On a host with more ranks than cores the pairs stop timing their messages (core/kolo.c: a rank
 * that shares a core times the scheduler), but member 0's timings of whole calls hold (every
 * member's call waits for the others: the crowded allgathers choose by them, coll_util.c,
 * "Crowded"). There direct needs none of the others to run while it copies, where every step of
 * the ring waits for its peer to be scheduled: Intel Xeon VM, 2 vCPUs, 4 ranks, launches
 * alternated (5 pairs), direct against the ring: 128 KiB 0.57x the time, 512 KiB 0.65x, 2 MiB
 * 0.73x, 8 MiB 0.93x. But on the Zen 4 VM, whose kernel copies between processes at a quarter of
 * memcpy's rate, the ring by ring copies took 0.70-0.87x direct's time at 4 ranks from 128 KiB to
 * 256 MiB (docs/performance.md, "Ring copies beat single-copy at 4 ranks"). So such a host runs
 * direct below CMA_MIN (from ZC_MIN, where the ring's hand-offs cost most) and chooses from it,
 * starting direct. Zen 4 VM, kolo-bench in the harness's bands, 3 rounds rotating with the build
 * before (always direct) and ring copies pinned: 4 ranks 1-16 MiB 0.64-0.89x the time, 256-512
 * KiB 0.73-1.01x, 64 / 256 MiB 0.93-1.03x (launches of 3 calls end before the first probe; ring
 * copies pinned took 0.71-0.82x there); 8 ranks (2 rounds) 1-64 MiB 0.66-0.97x, 256-512 KiB
 * 1.0-1.14x, as 128 KiB, which runs direct in both builds, spread (1.17x). */
static int plan_for(kolo__mesh *m, const kolo__group *g, uint64_t bytes, bool ip)
{
    if (test_force >= 0) return test_force;
    kolo__conn *c1 = m->conns[kolo__g2w(g, 1)];
    if (bytes >= CMA_MIN && choosing(m, g)) {
        kolo__choice *c = choice_for(m, bytes, ip);
        uint64_t now = kolo__now_ns();
        int hint = c->every ? -1 : neighbour_verdict(m, bytes, ip, now);
        return kolo__choice_pick(c, now, hint >= 0 ? hint : PLAN_DIRECT, false);
    }
    return kolo__shm_cma_state(c1) == 1 || kolo__shm_pinned_oversubscribed(c1) ? PLAN_DIRECT : PLAN_RING;
}

/* Reads n bytes at `addr` in process pid into buf; 0 or an errno. */
static int cma_read(int pid, uint64_t addr, char *buf, size_t n)
{
    if (test_fail_read && --test_fail_read == 0) return test_fail_errno;
    size_t done = 0;
    return kolo__cma_read(pid, buf, addr, n, &done);
}

/* Writes n bytes of buf to `addr` in process pid; 0 or an errno. */
static int cma_write(int pid, uint64_t addr, const char *buf, size_t n)
{
    if (test_fail_write && --test_fail_write == 0) return EFAULT;
    size_t done = 0;
    return kolo__cma_write(pid, addr, buf, n, &done);
}

/* Every member's status, the first failure (or none) in *bad: the same on every member. */
static int exchange_status(kolo__mesh *m, const kolo__group *g, status me, status *bad, int *who, status *all)
{
    size_t ones[MAX_MEMBERS];
    for (int i = 0; i < g->size; i++) ones[i] = 1;
    int st = kolo__coll_allgather(m, g, &me, all, ones, sizeof(status));
    for (int i = 0; st == KOLO_OK && i < g->size && !bad->err; i++)
        if (all[i].err) *bad = all[i], *who = i;
    return st;
}

/* This member's segments as allocations of kolo_mem_alloc memory (me->nreg of them, at most
 * MAX_REGIONS) and each segment's input and output as one of them (sa[k].reg); false if some
 * segment is not in such memory or they take more allocations. */
static bool describe_regions(const kolo__seg *segs, int nseg, size_t es, desc *me, seg_addr *sa)
{
    me->nreg = 0;
    for (int k = 0; k < nseg; k++) {
        for (int side = 0; side < 2; side++) {
            const char *p = side ? segs[k].dst : segs[k].src;
            uint64_t a = (uint64_t)(uintptr_t)p, len = segs[k].count * es;
            sa[k].reg[side] = -1;
            if (!len) continue;
            int j = 0; /* an allocation already found holds most segments: no lookup */
            while (j < me->nreg && !(a >= me->base[j] && a + len <= me->base[j] + me->len[j])) j++;
            if (j == me->nreg) {
                kolo__mem_ref ref;
                if (j == MAX_REGIONS || !kolo__mem_find(p, len, &ref)) return false;
                me->fd[j] = ref.fd;
                me->id[j] = ref.id;
                me->len[j] = ref.len;
                me->base[j] = a - ref.off;
                me->nreg++;
            }
            sa[k].reg[side] = j;
        }
    }
    return true;
}

/* Whether member i's mapped segments lie inside the allocations it described: a garbled
 * description must not make us read outside a mapping. */
static bool regions_hold(const desc *d, const seg_addr *sa, const size_t *start, int nseg, size_t es)
{
    if (d->nreg < 0 || d->nreg > MAX_REGIONS) return false;
    for (int k = 0; k < nseg; k++) {
        uint64_t len = (start[k + 1] - start[k]) * es, a[2] = {sa[k].src, sa[k].dst};
        for (int side = 0; side < 2 && len; side++) {
            int j = sa[k].reg[side];
            if (j < 0 || j >= d->nreg || a[side] < d->base[j] || a[side] - d->base[j] > d->len[j] ||
                len > d->len[j] - (a[side] - d->base[j]))
                return false;
        }
    }
    return true;
}

/* n bytes of results stored through the cache (plain stores) or around it (see "Storing" at the
 * top); the caller fences before the others look. */
static void put_out(void *dst, const void *src, size_t n, bool cached)
{
    if (cached) kolo__copy(dst, src, n);
    else kolo__stream_copy(dst, src, n);
}

/* c elements of block r reduced from every member's input in[0..n-1], in member order, finished,
 * and stored into every member's output out[0..n-1]: a piece at a time through a buffer that
 * stays in the first-level cache, around the cache or through it (`cached`). */
static void reduce_push(char *const *out, const char *const *in, int n, size_t c, kolo_dtype_t dtype, kolo_op_t op,
                        double post, bool cached)
{
    _Alignas(64) char buf[KOLO_OUT_PIECE_MAX];
    size_t es = kolo_dtype_size(dtype), per = kolo__out_piece(es, cached) / es;
    for (size_t i = 0; i < c; i += per) {
        size_t e = KOLO_MIN(per, c - i), o = i * es;
        if (n == 2) {
            kolo__coll_reduce_finish(buf, in[0] + o, in[1] + o, e, dtype, op, post, n);
        } else {
            kolo__reduce(buf, in[0] + o, in[1] + o, e, dtype, op);
            for (int q = 2; q < n - 1; q++) kolo__reduce(buf, buf, in[q] + o, e, dtype, op);
            kolo__coll_reduce_finish(buf, buf, in[n - 1] + o, e, dtype, op, post, n);
        }
        for (int q = 0; q < n; q++) put_out(out[q] + o, buf, e * es, cached);
    }
}

int kolo__direct_allreduce(kolo__mesh *m, const kolo__group *g, const kolo__seg *segs, int nseg, kolo_dtype_t dtype,
                           kolo_op_t op, double post, kolo__direct_ticket *t)
{
    int n = g->size, r = g->rank;
    size_t es = kolo_dtype_size(dtype), count = 0;
    for (int k = 0; k < nseg; k++) count += segs[k].count;
    size_t bytes = count * es;
    t->learn = t->in_place = t->exchange = false;
    t->start = 0;
    t->plan = PLAN_RING;
    if (bytes < ZC_MIN || n < 2 || nseg < 1 || !all_near(m, g)) return KOLO_DIRECT_DECLINED;
    t->start = kolo__now_ns();
    t->bytes = bytes;

    /* the exchange: every member's desc and segment addresses, then segment starts (elements) */
    size_t per = sizeof(desc) + (size_t)nseg * sizeof(seg_addr);
    char *ex = kolo__malloc(per * (size_t)(n + 1) + ((size_t)nseg + 1) * sizeof(size_t));
    if (!ex) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the addresses of %d buffers", nseg);
    desc me = {.pid = (int32_t)getpid(), .bytes = bytes, .plan = PLAN_RING, .nseg = nseg};
    char *mine_ex = ex + per * (size_t)n;
    size_t *start = (size_t *)(void *)(mine_ex + per);
    seg_addr *sa = (seg_addr *)(void *)(mine_ex + sizeof(desc));
    start[0] = 0;
    for (int k = 0; k < nseg; k++) {
        sa[k] = (seg_addr){(uint64_t)(uintptr_t)segs[k].src, (uint64_t)(uintptr_t)segs[k].dst, {-1, -1}};
        start[k + 1] = start[k] + segs[k].count;
    }
    me.layout = kolo__fnv1a(start + 1, (size_t)nseg * sizeof(size_t)); /* the segments' ends */
    me.mapped = !m->zc_unmappable && describe_regions(segs, nseg, es, &me, sa);
    if (!me.mapped) {
        me.nreg = 0;
        for (int k = 0; k < nseg; k++) sa[k].reg[0] = sa[k].reg[1] = -1;
    }
    bool ip = t->in_place = in_place(segs, nseg);
    if (r == 0 && (bytes >= CMA_MIN || kolo__shm_pinned_oversubscribed(m->conns[kolo__g2w(g, 1)])))
        me.plan = plan_for(m, g, bytes, ip);
    else if (r == 0 && exchange_range(t, n, bytes, ip)) me.plan = exchange_plan_for(m, bytes);
    me.store = STORE_STREAM;
    if (r == 0 && me.mapped)
        me.store = test_store >= 0 ? test_store
                                   : kolo__choice_pick(store_choice_for(m, bytes, ip), kolo__now_ns(),
                                            ip || bytes < STORE_CACHED_FIRST ? STORE_CACHED : STORE_STREAM, true);
    memcpy(mine_ex, &me, sizeof(desc));
    size_t ones[MAX_MEMBERS];
    for (int i = 0; i < n; i++) ones[i] = 1;
    int st = kolo__coll_allgather(m, g, mine_ex, ex, ones, per);
    desc all[MAX_MEMBERS];
    bool mapped = bytes >= ZC_MIN;
    for (int i = 0; i < n && st == KOLO_OK; i++) {
        memcpy(&all[i], ex + per * (size_t)i, sizeof(desc));
        if (all[i].bytes != bytes || all[i].nseg != nseg)
            st = kolo__err(KOLO_ERR_MISMATCH,
                           "allreduce: rank %d passed %llu bytes in %d buffers where rank %d passed %zu in %d: the "
                           "ranks called collectives with different counts, dtypes or orders",
                           kolo__g2w(g, i), (unsigned long long)all[i].bytes, all[i].nseg, kolo__g2w(g, r), bytes,
                           nseg);
        else if (all[i].layout != me.layout)
            st = kolo__err(KOLO_ERR_MISMATCH,
                           "allreduce: rank %d cut its %zu bytes into %d buffers of other sizes than rank %d did: "
                           "the ranks fused tensors of different shapes",
                           kolo__g2w(g, i), bytes, nseg, kolo__g2w(g, r));
        /* The pid is where the others read, write and map member i's buffers. Taken as it came,
         * a garbled or forged desc made this rank read and write the memory of whatever process it
         * named (any this user may ptrace) as member i's, and report a pid of no process as member
         * i gone (found by tests/fuzz/fuzz_cma.c). It must be the pid member i's handshake gave. */
        else if (i != r && all[i].pid != m->peers[kolo__g2w(g, i)].pid)
            st = kolo__err(KOLO_ERR_PROTOCOL,
                           "allreduce: rank %d on %s described buffers of process %d, not of its own (%d): a "
                           "garbled description",
                           kolo__g2w(g, i), kolo__peer_name(m, kolo__g2w(g, i)), (int)all[i].pid,
                           m->peers[kolo__g2w(g, i)].pid);
        mapped = mapped && all[i].mapped;
    }
    if (st == KOLO_OK && !mapped) {
        /* member 0 times this call either way; by the ring or the exchange,
         * kolo__direct_ring_done does */
        bool exch = exchange_range(t, n, bytes, ip);
        t->learn = r == 0 && (exch ? test_exchange < 0
                                 : bytes >= CMA_MIN && test_force < 0 && choosing(m, g));
        t->plan = all[0].plan;
        t->exchange = n == 2 && all[0].plan == PLAN_EXCHANGE;
        if (t->learn) /* not the first call of a class, nor the first after a change of way */
            t->learn = exch ? kolo__choice_repeat(&m->exchange[exchange_class(bytes)], t->exchange)
                            : kolo__choice_repeat(choice_for(m, bytes, ip), t->plan);
        if (all[0].plan != PLAN_DIRECT) st = KOLO_DIRECT_DECLINED;
    }
    if (st != KOLO_OK) {
        kolo__free(ex);
        return st;
    }
#define ADDR(i, k) (((const seg_addr *)(const void *)(ex + per * (size_t)(i) + sizeof(desc)))[k])
/* segment k's input (side 0) or output (side 1) of mapped member i, in our address space */
#define PEER(i, k, side) \
    ((char *)(uintptr_t)((side ? ADDR(i, k).dst : ADDR(i, k).src) + delta[i][ADDR(i, k).reg[side]]))

    /* the members whose allocations we map: maps[i], an address of theirs in allocation j plus
     * delta[i][j] is ours; the others are read by CMA */
    bool maps[MAX_MEMBERS];
    uintptr_t delta[MAX_MEMBERS][MAX_REGIONS];
    char *bases[MAX_MEMBERS][MAX_REGIONS] = {{NULL}};
    for (int i = 0; i < n; i++) {
        maps[i] = false;
        if (i == r || !all[i].mapped || m->zc_unmappable) continue;
        if (!regions_hold(&all[i], &ADDR(i, 0), start, nseg, es)) {
            KOLO_WARN("allreduce: rank %d described its shared buffers inconsistently; reading them with "
                      "process_vm_readv instead",
                      kolo__g2w(g, i));
            continue;
        }
        bool ok = true;
        for (int j = 0; j < all[i].nreg && ok; j++) {
            kolo__mem_ref pr = {.fd = all[i].fd[j], .id = all[i].id[j], .len = all[i].len[j], .off = 0};
            bases[i][j] = kolo__mem_map_peer(all[i].pid, &pr);
            ok = bases[i][j] != NULL;
            if (ok) delta[i][j] = (uintptr_t)bases[i][j] - (uintptr_t)all[i].base[j];
        }
        if (ok) {
            maps[i] = true;
        } else {
            /* once: later allreduces of this rank offer no mapping, and it reads by CMA */
            KOLO_WARN("allreduce: cannot map the shared buffer of rank %d (%s); reading it with "
                      "process_vm_readv instead, from now on",
                      kolo__g2w(g, i), kolo__errmsg());
            m->zc_unmappable = true;
        }
    }

    size_t off[MAX_MEMBERS], cnt[MAX_MEMBERS];
    kolo__coll_blocks(count, n, off, cnt);
    status mine = {0, -1, 0}, bad = {0, -1, 0};
    int who = -1;
    /* mapped, member 0 may have chosen cached stores (see "Storing" at the top) */
    bool cached = mapped && all[0].store == STORE_CACHED;
    /* its own block: as chosen when mapped, else through the cache in place only ("Storing") */
    bool own_cached = mapped ? cached : ip;
    /* every other member mapped: this member reduces from their inputs and stores into their
     * outputs through the mappings, a piece at a time (step 2) */
    bool push = mapped;
    for (int i = 0; i < n; i++) push = push && (i == r || maps[i]);
    /* block r, a step at a time: reduced in a scratch step that stays in cache, then streamed
     * out, so the output's lines are written without being read (or stored through the cache) */
    char *tmp = kolo__coll_scratch(m, KOLO_SCRATCH_RING, 2 * STEP), *got = tmp ? tmp + STEP : NULL;
    if (!tmp) mine.err = ENOMEM;
    int first = r == 0 ? 1 : 0, last = r == n - 1 ? n - 2 : n - 1, k;
    size_t at, c;
    kolo__walker w;
    kolo__walk_init(&w, segs, start, off[r], off[r] + cnt[r], STEP / es);
    while (!mine.err && kolo__walk_next(&w, &k, &at, &c)) {
        size_t b0 = at * es; /* in the segment */
        if (push) {
            const char *in[MAX_MEMBERS];
            char *out[MAX_MEMBERS];
            for (int i = 0; i < n; i++) {
                in[i] = (i == r ? segs[k].src : PEER(i, k, 0)) + b0;
                out[i] = (i == r ? segs[k].dst : PEER(i, k, 1)) + b0;
            }
            reduce_push(out, in, n, c, dtype, op, post, cached);
            continue;
        }
        for (int i = first; i < n && !mine.err; i++) {
            if (i == r) continue;
            const char *p = maps[i] ? PEER(i, k, 0) + b0 : got, *x = i == first ? segs[k].src + b0 : tmp;
            if (!maps[i] && (mine.err = cma_read(all[i].pid, ADDR(i, k).src + b0, got, c * es)) != 0) mine.peer = i;
            else if (i == last) kolo__coll_reduce_finish(tmp, x, p, c, dtype, op, post, n); /* and finished */
            else kolo__reduce(tmp, x, p, c, dtype, op);
        }
        if (mine.err) break;
        put_out(segs[k].dst + b0, tmp, c * es, own_cached);
        for (int i = 0; i < n && !mine.err; i++) {
            if (i == r) continue;
            if (maps[i]) put_out(PEER(i, k, 1) + b0, tmp, c * es, cached);
            else if ((mine.err = cma_write(all[i].pid, ADDR(i, k).dst + b0, tmp, c * es)) != 0) mine.peer = i, mine.wrote = 1;
        }
    }
    kolo__stream_fence();
    /* once every member has said its block is in every output, nobody reads or writes another's
     * buffers any more (step 3) */
    status all_st[MAX_MEMBERS];
    st = exchange_status(m, g, mine, &bad, &who, all_st);
    if (st == KOLO_OK && !bad.err) {
        test_delay(PLAN_DIRECT);
        if (mapped) kolo__sleep_ns(test_store_delay_ns[cached]);
    }
#undef PEER
#undef ADDR
    kolo__free(ex);
    for (int i = 0; i < n; i++)
        for (int q = 0; q < MAX_REGIONS; q++)
            if (bases[i][q]) kolo__mem_unpin(bases[i][q]);
    if (st != KOLO_OK) return st;
    /* A failure names the member it could not read or write, or -1 for no memory of its own; a
     * member index from a garbled status was looked up in the group's ranks as it came, past
     * their end (found by tests/fuzz/fuzz_cma.c). */
    if (bad.err && !(bad.peer >= 0 && bad.peer < n) && !(bad.peer == -1 && bad.err == ENOMEM))
        return kolo__err(KOLO_ERR_PROTOCOL,
                         "allreduce: rank %d on %s sent a garbled status: errno %d with member %d of %d",
                         kolo__g2w(g, who), kolo__peer_name(m, kolo__g2w(g, who)), (int)bad.err, (int)bad.peer, n);
    if (bad.err == ENOMEM && bad.peer < 0)
        return kolo__err(KOLO_ERR_NO_MEMORY, "allreduce: rank %d had no memory for %zu bytes of scratch space",
                         kolo__g2w(g, who), 2 * STEP);
    if (bad.err) {
        char what[256];
        snprintf(what, sizeof(what),
                 "allreduce of %zu bytes: rank %d could not %s the buffer of rank %d with process_vm_%s (%s); "
                 "the output buffers hold partial results",
                 bytes, kolo__g2w(g, who), bad.wrote ? "write" : "read", kolo__g2w(g, bad.peer),
                 bad.wrote ? "writev" : "readv", strerror(bad.err));
        return kolo__coll_cma_failed(m, kolo__g2w(g, bad.peer), bad.err, what);
    }
    if (mapped) {
        __atomic_fetch_add(&zc_runs, 1, __ATOMIC_RELAXED);
        if (cached) __atomic_fetch_add(&zc_cached_runs, 1, __ATOMIC_RELAXED);
        if (push) __atomic_fetch_add(&zc_push_runs, 1, __ATOMIC_RELAXED);
        if (r == 0 && test_store < 0) kolo__choice_learn(store_choice_for(m, bytes, ip), all[0].store, t->start, bytes, "allreduce", WAYS_STORE);
        KOLO_DEBUG("allreduce of %zu bytes read the other %d ranks' shared buffers directly", bytes, n - 1);
    } else {
        __atomic_fetch_add(&cma_runs, 1, __ATOMIC_RELAXED);
        if (t->learn) kolo__choice_learn(choice_for(m, bytes, ip), PLAN_DIRECT, t->start, bytes, choice_what(ip), WAYS_CMA);
    }
    return KOLO_OK;
}

void kolo__direct_ring_done(kolo__mesh *m, const kolo__direct_ticket *t, int st)
{
    if (!t->start || t->plan == PLAN_DIRECT) return; /* not a candidate */
    test_delay(t->exchange ? PLAN_EXCHANGE : PLAN_RING);
    if (!t->learn || st != KOLO_OK) return;
    if (t->bytes < CMA_MIN)
        kolo__choice_learn(&m->exchange[exchange_class(t->bytes)], t->exchange, t->start, t->bytes, "allreduce",
                           WAYS_EXCHANGE);
    else
        kolo__choice_learn(choice_for(m, t->bytes, t->in_place), PLAN_RING, t->start, t->bytes, choice_what(t->in_place), WAYS_CMA);
}
