/* shm.c - the shared-memory transport between two ranks of one host.
 *
 * The pair shares one segment (POSIX shm, unlinked as soon as both sides have mapped it, so
 * nothing is left behind if a process dies) holding two rings, one per direction. A ring is a
 * power-of-two byte array with a producer counter `head` and a consumer counter `tail` on
 * their own cache lines. Each message in it is a frame: a mark the reader polls (see "framing"
 * below), then the same 16-byte header as on TCP, so the same matching and mismatch checks
 * apply, then the payload.
 *
 * Small messages are copied into the ring and out of it (two copies, but in cache). A message
 * of at least `cma_threshold` bytes can instead go single-copy, when the pair passed the CMA
 * probe: the sender writes only a descriptor {address, length} of its buffer, the receiver
 * reads the payload straight into its own buffer with process_vm_readv (one copy, done by the
 * kernel) and then bumps the ring's `acks` counter; the sender's xfer completes when it sees
 * the ack. Until then the sender's buffer must stay untouched, which the xfer contract already
 * demands.
 *
 * Which way is faster depends on where the two cores sit. Ring copies move every line twice,
 * but while the cores share a cache both copies run at cache speed: on this project's VM, with
 * its two vCPUs on one CCD (shared-memory ping 0.05 us), allgather 1 MiB ran 13 GB/s by ring
 * and 9.4 by CMA. Across CCDs (ping 0.24 us) each ring line the reader pulls is dirty in the
 * other CCD's cache, and the same allgather fell to 2 GB/s by ring while CMA stayed at 9.4; the
 * VM moves between the two placements every few minutes. So with KOLO_SHM_CMA=auto (the
 * default) the receiver of each direction times both ways on the messages themselves and
 * tells the sender which to use (adapt_*() below); 1 and 0 pin one way. Across CCDs the sender
 * also writes its ring copies around the cache, which makes them 3-5x cheaper there ("far").
 *
 * Memory order: the producer writes bytes, then publishes head with release; the consumer
 * acquires head, reads, then publishes tail with release. acks likewise. Bytes written with
 * non-temporal stores ("far") are fenced (sfence) before head or a mark is published: a release
 * store does not order them.
 *
 * Sleeping. A waiter that has polled for a while without news (xfer.c, kolo__wait) can sleep
 * instead of polling on: it sets `asleep` in the control block of the ring it reads to what it
 * waits for (WANT_BYTES when it has receives pending, WANT_ROOM when it has sends: a send is
 * pending only while it waits for ring space or an ack), reads the doorbell `bell` beside it,
 * polls once more and sleeps (futex) while `bell` still reads the same. The peer, each time it
 * publishes its head (bytes) or its tail or acks (room; within a pass too, as it streams a long
 * message, so that a sender asleep on a full ring goes on at once), and after it closed or
 * aborted, bumps `bell` and wakes the sleeper if `asleep` asks for that. (Waking a sleeper for
 * the room its completed sends left, when it waits for bytes, woke the rank waiting on a
 * straggler's engine twice per exchange.) Both sides fence between their store and their load
 * of the other's word (asleep, then the counters; the counters, then asleep), so one of them
 * sees the other: a sleeper never misses a move made after it set `asleep`. The layout of the
 * control blocks, and the meaning of `asleep`, are the wire's (mesh.c, KOLOMSH6).
 */
#include "transport.h"

#include "../boot/auth.h"
#include "../reduce/reduce.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#define MADV_POPULATE_WRITE 23
#endif

#define SHM_FLAG_CMA 1u
#define SHM_FLAG_CALL 2u /* a large message whose way the sender's call chose (kolo__xfer.way) */
#define SHM_CLOSED 1u
#define SHM_ABORTED 2u
#define CMA_DESC_LEN 24 /* {address, length, stamp} */
#define STAMP_LEN 8
#define PROBE_MSGS 3 /* samples in a probe of the way not in use (auto, below) */
#define SHM_CLASSES 11 /* auto: size classes of large messages, x2 from the threshold (the last open-ended) */

/* auto, receiving, per size class: the cost per byte of each way (0 ring, 1 CMA) and when it
 * was last measured; what we ask the sender for, whether that is a probe of the other way (and
 * its samples), and when the next probe is */
typedef struct way_choice {
    uint64_t cost_ps[2], cost_at[2];
    kolo__window win[2]; /* each way's last samples, of which cost_ps is the median */
    int want, probing, warming[2];
    int dearer; /* messages in a row by the way in use that found it dearer than the other */
    bool seeded; /* its way came from a smaller class's close decision, not yet checked by a probe */
    bool probed; /* it has had a probe */
    bool confirm; /* its first probe changed its way: the next probe comes after a few messages */
    uint64_t seed_other_ps; /* seeded: the deciding class's figure for the way not taken, until a probe */
    uint64_t probe_every, since_probe, since_bytes, probe_bytes;
    uint64_t got[2]; /* messages of this class received each way */
    bool test_switch; /* test hook: leave the way in use at the next message, as after SWITCH_AFTER_MSGS */
    bool early; /* probing by ring, its last message begun: the sender is asked for the way in use */
} way_choice;

typedef struct ring_ctl {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint64_t acks;
    _Atomic uint32_t want_cma; /* consumer, with auto: bit k set: send large messages of size class k single-copy */
    _Alignas(64) uint64_t token;
    _Atomic uint32_t closed; /* SHM_CLOSED: the producer shut down cleanly; SHM_ABORTED: it gave up */
    /* producer, with auto: bit k set: the producer's own receiving side changed class k's way or
     * started probing it; try that way too. Here, not beside head: it is read at each large
     * message, and head's line changes hands at every frame. */
    _Atomic uint32_t nudge;
    char reason[KOLO_ABORT_REASON_MAX]; /* why it gave up; written before `closed` */
    /* consumer, the member of lower rank of a pair: the way of its 2-member calls per slot, once
     * per call (kolo__shm_publish_call_way) */
    _Alignas(64) _Atomic uint64_t call_way[KOLO_PAIR_SLOTS];
    /* the consumer sleeps on `bell` with `asleep` set; the producer bumps it (see "Sleeping") */
    _Alignas(64) _Atomic uint32_t bell;
    _Atomic uint32_t asleep;
} ring_ctl;

typedef struct shm_priv {
    void *base;
    size_t maplen;
    ring_ctl *tx_ctl, *rx_ctl;
    char *tx, *rx;
    uint64_t mask;
    int peer_pid, peer_rank;
    int cma_ok; /* the pair passed the CMA probe: descriptors from the peer can be read */
    int cma;    /* send messages of cma_threshold bytes and more as descriptors */
    int adapt;  /* auto: the receiver of each direction picks, from timings (cma is unused) */
    size_t cma_threshold;
    uint64_t cma_sent;
    uint64_t called[2]; /* large messages received by ring [0] and single-copy [1] as the sender's
                         * call chose */
    int single_ok; /* sends marked single go single-copy from SINGLE_MIN (oversubscribed host) */
    /* auto, receiving: when the large message being read by ring started, and when the last
     * one ended; each size class's choice */
    uint64_t rx_start, last_end;
    way_choice cls[SHM_CLASSES];
    uint64_t vclock; /* the way choice's clock under kolo__shm_test_virtual */
    /* auto, an exchange: a large message that came in while this side's own large message to
     * the peer was still going out, timed to when that one is out too (adapt_done) */
    bool deferred;
    int deferred_way;
    uint64_t deferred_start, deferred_bytes;
    /* bytes from the start of each ring known to be mapped in: all of it when the segment was
     * populated at start-up or the ring has been used, else 0 (first_pass) */
    uint64_t tx_ready, rx_ready;
    uint64_t tx_tail; /* sending: the reader's tail as last loaded */
    /* this side's own counters, as it last published them: head sending, tail receiving. Never
     * read back from the segment, whose words the peer can write (a peer that did moved where
     * this side wrote and read, by any amount and unaligned: found by tests/fuzz/fuzz_shm.c) */
    uint64_t tx_head, rx_tail;
    /* sending: ring copies around the cache when the cores sit far apart (see "far" below) */
    kolo__window wwin;   /* the last timed copies through the cache, ps/B */
    int crawls;          /* timed copies in a row whose window's median crawled */
    unsigned far_tick;   /* short copies, one in FAR_TIME_EVERY of which is timed */
    bool far;            /* payload steps written around the cache */
    bool far_check;      /* back through the cache to see whether the crawl is over */
    uint64_t far_until, far_every;
    uint64_t far_bytes;  /* payload bytes written around the cache so far */
} shm_priv;

static size_t seg_len(size_t ring)
{
    return 2 * (sizeof(ring_ctl) + ring);
}

static void ring_write(char *ring, uint64_t mask, uint64_t pos, const void *src, size_t n)
{
    size_t off = (size_t)(pos & mask), first = KOLO_MIN(n, (size_t)(mask + 1 - off));
    kolo__copy(ring + off, src, first);
    if (n > first) kolo__copy(ring, (const char *)src + first, n - first);
}

/* ring_write with non-temporal stores; the caller fences before publishing */
static void ring_write_around(char *ring, uint64_t mask, uint64_t pos, const void *src, size_t n)
{
    size_t off = (size_t)(pos & mask), first = KOLO_MIN(n, (size_t)(mask + 1 - off));
    kolo__stream_copy(ring + off, src, first);
    if (n > first) kolo__stream_copy(ring, (const char *)src + first, n - first);
}

static void copy_out(void *dst, const void *src, size_t n, bool stream)
{
    if (stream) kolo__stream_copy(dst, src, n);
    else kolo__copy(dst, src, n);
}

/* stream: with non-temporal stores (kolo__xfer.stream; the caller fences) */
static void ring_read(const char *ring, uint64_t mask, uint64_t pos, void *dst, size_t n, bool stream)
{
    size_t off = (size_t)(pos & mask), first = KOLO_MIN(n, (size_t)(mask + 1 - off));
    copy_out(dst, ring + off, first, stream);
    if (n > first) copy_out((char *)dst + first, ring, n - first, stream);
}

/* At a ring's first use, maps all its pages in, with one madvise instead of one page fault per
 * 4 KiB on each side (rings not faulted in at start-up because there were too many: mesh.c).
 * `end` is the ring offset about to be reached; the ring counters start at 0, so the first pass
 * is exactly the offsets below the ring size.
 *
 * All of it at once, not 256 KiB at a time as until 2026-12-02: ranks that move in step cross a
 * step together, and with more ranks than cores their madvises, each allocating and clearing
 * 64 pages per ring, stalled whole calls. 8 ranks on 2 vCPUs, alltoall of 512 B, 3,000 calls:
 * 3-16 calls over 300 us (clusters of 3-4 calls of 0.4-4.7 ms, traced to shmem faults under
 * these madvises on every rank) and a mean of 13.3-16.3 us per call; with the whole ring at first
 * use 0-2 and 11.5-12.0. Harness-shaped launches (50 calls a size), 8 ranks, 32 KiB: allgather
 * 38 us against 71, reducescatter 42 against 117, alltoall 34 against 105 (Open MPI 56, 74, 50);
 * 4 ranks alike but reducescatter 512 KiB 101 against 157. The first calls pay instead: a
 * 16-rank launch of 11 alltoalls of 64 KiB took 0.21-0.24 s against 0.09-0.10. */
static void first_pass(char *ring, uint64_t size, uint64_t *ready, uint64_t end, int advice)
{
    if (end <= *ready || *ready >= size) return;
    uint64_t to = size;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)(ring + *ready) & ~(page - 1), b = ((uintptr_t)(ring + to) + page - 1) & ~(page - 1);
    (void)madvise((void *)a, b - a, advice); /* before Linux 5.14: EINVAL, and pages fault in as before */
    *ready = to;
}

static void tx_write(shm_priv *s, uint64_t pos, const void *src, size_t n)
{
    first_pass(s->tx, s->mask + 1, &s->tx_ready, pos + n, MADV_POPULATE_WRITE);
    ring_write(s->tx, s->mask, pos, src, n);
}

static void rx_read(shm_priv *s, uint64_t pos, void *dst, size_t n, bool stream)
{
    first_pass(s->rx, s->mask + 1, &s->rx_ready, pos + n, MADV_POPULATE_READ);
    ring_read(s->rx, s->mask, pos, dst, n, stream);
}

/* ---- auto: ring copies or CMA, per direction, chosen from the messages' own timings ----
 *
 * The receiver times each large message in elapsed time, from when it could start to when its
 * last byte is in place. The start is the latest of: the time the sender offered it (stamped in
 * the frame; CLOCK_MONOTONIC is one clock for every core), the time a progress pass of the
 * receiver first had the receive in hand (before that pass's own sends), and the end of the
 * previous large message. So the figure covers what the receiver waits for, the sender's copies
 * into the ring included, but not a peer arriving late, nor the receiver's own work between
 * passes (reducing the previous block): the ring lets the sender copy in meanwhile, CMA does not,
 * and the ring rightly gets the credit. In an exchange (this side sending the peer a large
 * message of its own at the same time) the end is when that one is out too (adapt_done).
 *
 * Elapsed time, not CPU time, because the two ways spread their work differently over the two
 * cores: a ring message is two copies that overlap in steps (STREAM_STEP), one on each side,
 * and a CMA read is one copy on the receiver's side while the sender waits. Measured on this
 * project's VM, 2 ranks, busbw in GB/s, 128 KiB-16 MiB:
 *
 *   vCPUs on one CCD (shared-memory ping 0.05 us): allgather 1 MiB 13 by ring, 9.4 by CMA.
 *   vCPUs on two CCDs (ping 0.24 us): allgather 2.0-2.6 by ring, 11-13 by CMA; broadcast 19-24
 *     by ring, 10.5-11.5 by CMA.
 *
 * Across CCDs every ring line the sender writes is still held by the reader's cache and must be
 * taken from it: the sender's copies crawl (360 ps/B against 23 on one CCD). Where both sides
 * send at once (allgather, alltoall, allreduce) that copy is on the path of every message and
 * CMA wins 5x; in a broadcast the root only copies in and the receiver only copies out, so the
 * two copies run side by side and the ring still wins 2x. CPU time per byte (the figure used
 * before) adds the two copies up, and so favoured CMA in both.
 *
 * The VM moves between the two placements every few minutes, so the choice is made
 * continuously. Each way's figure is the median of its last 5 samples (in the far state single
 * messages of an engine step took 10-200x their neighbours' time; an average they entered moved
 * by 25 % and flipped the choice back and forth). The receiver asks the sender (want_cma) for
 * the cheaper way, switching only for a 10 % gain so that noise does not flip it. To keep the
 * figure of the way not in use current, it asks for a few messages that way now and then (a
 * probe: 3 messages, or 2 when they make 4 MiB, or one of 16 MiB; a short first one warms the
 * way up and is not counted), whose samples replace that way's old ones. The first probe comes
 * after 8 messages or 32 MiB by ring (32 messages until the per-class choice below: a ring's
 * first passes run on cold lines, so an early probe can pick single-copy wrongly, which the
 * next probe, 0.1 s on, undoes; a sweep of 13 calls per size never reached 32); then at
 * intervals that double while a clear answer stays the same (0.1 s up to 2.56 s, and at least 8
 * messages or 256 MiB apart) and shrink back to 0.1 s when a probe changes it. A probe of the
 * slower way costs those few messages at the slower speed.
 *
 * A probe that keeps the way in use with samples spread NOISY_SPREAD times or more (its largest
 * against its smallest) says little, and the next comes after 0.1 s instead of twice the
 * interval. Traced on the Zen 4 VM with two busy loops beside a test's two ranks (as when the
 * suites share the cores, or ranks share theirs with a framework's compute threads), messages of
 * 64 KiB, ring copies slowed by 2 ms each: two of a single-copy probe's three samples waited for a
 * CPU, their median 87,833 ps/B against the ring's 45,725 where single-copy ran near 400, and the
 * pair kept the slow way until a probe at a doubled interval (up to 2.56 s). A wait for a CPU
 * costs a few ms whatever the message, so it spreads the samples of short messages, whose probe
 * is a few messages in the hundreds that 0.1 s holds; a message long enough (some 10 ms) that a
 * probe each 0.1 s would cost much spreads 10x only when a rank waits 90 ms.
 *
 * All of this is kept per size class of the message (x2 from the threshold: 32-64 KiB,
 * 64-128 KiB, ..., 32 MiB and up), and the sender looks up each message's class in the
 * receiver's bit mask. Per byte a short message carries more fixed cost, and which way wins
 * depends on size: on a 2-vCPU Intel Xeon the two tie at 64 KiB messages and single-copy wins
 * 2x from 256 KiB; with one choice per pair, a sweep upwards kept the ring, its single-copy
 * figure a short message's, and an allgather of 512 KiB took 33 us against 17. Classes x4 wide
 * still mixed sizes that choose differently: a broadcast's 1 MiB messages tie, its 512 KiB ones
 * run 19 us by CMA against 24 by ring, and the class of both kept the ring (512 KiB in a sweep
 * 21.7-22.4 us; 16.4-18.8 with classes x2 wide, the other collectives unchanged). A class's first
 * probe comes after PROBE_CLASS_FIRST_MSGS messages once the pair has moved more than
 * PROBE_FIRST_MSGS large messages (the ring is warm by then). A class's decision also sets the
 * choice of the larger classes that have seen no message yet: a sweep upwards starts each size
 * the way the last one ended, instead of spending its first messages on the way that lost. When
 * the decision was close (the losing way's figure under SEED_CLOSE times the winner's), a seeded
 * class probes the other way after its own first PROBE_CLASS_FIRST_MSGS messages instead of
 * waiting the usual interval (0.1 s), because larger messages can reverse a close answer: on a
 * 2-vCPU AMD EPYC (Zen 4) VM with its vCPUs sharing a cache, ring copies cost 90-125 ps/B at 128
 * KiB and single-copy 80, but ring copies fall to about 25 ps/B at 1 MiB while single-copy stays
 * near 80; a broadcast sweep 128 KiB-1 MiB whose 128 KiB class chose single-copy ran 256 and 512
 * KiB at 12 GB/s, seeded, and 1 MiB by ring at 35-40 GB/s. Where one way crawls (the same VM with
 * its vCPUs on two CCDs: ring copies 5x dearer at every size) an early probe only costs, a
 * warm-up message and three by the crawling way per class: broadcast 256 KiB in a sweep took
 * 37-38 us against 20 when every seeded class probed early. A seeded class probes early too when
 * its way costs it more than SEED_CLOSE times what the other way cost the deciding class: on the
 * Zen 4 VM the vCPUs moved to two CCDs during an allgather sweep, whose 8 MiB size then took 2.0
 * ms per call, as with ring copies pinned, against 0.62 with single-copy pinned; a seeded way
 * that no probe questions for a whole size is one way to get there.
 *
 * A class's first probe, when it changes the class's way by less than SEED_CLOSE times, is
 * checked by a second probe after PROBE_CLASS_FIRST_MSGS more messages instead of the usual
 * interval (confirm): the way it left was timed on the class's first messages, and a size's first
 * copies run slower than its later ones (a way that crawls, as ring copies across CCDs, loses by
 * more and is not asked for again so soon: each message of it costs several of the other; the
 * choices one level up re-time the way in use after each probe for the same reason: coll_util.c).
 * That slow start is the machine's, not the transport's: on the Zen 4 VM, after 400 allgathers of
 * 256 KiB per rank with ring copies pinned, the first of 512 KiB took 113-148 us against 45
 * steady and the next four 50-60, without a page fault; one process copying 512 KiB back and
 * forth alone shows it too (2-4x for its first 10-20 copies). In an allgather sweep 128 KiB-1 MiB
 * of 50 calls per size, the 1 MiB size's 512 KiB messages took 100-230 ps/B by ring for their
 * first seven and single-copy won the early probe at 77-90; on five of eight receiving sides the
 * class then kept single-copy at 80-130 ps/B for the whole size (the ring's old figure not 10 %
 * below single-copy's new one), where the ring settled at 40-55 on the sides that kept it. With
 * the check, 60 launches interleaved with the build before it, vCPUs mostly sharing a cache:
 * 1 MiB 51 us per call against 63 (medians; paired ratio 0.86), 128-512 KiB within 2 %;
 * broadcast and alltoall in the same band, allgather 2-16 MiB (28 pairs: 0.92-1.01) and the
 * engine's ResNet-50 step (12 pairs: 0.99) no worse.
 *
 * Single-copy has a slow start of its own, per page: on the Zen 4 VM, one process reading
 * another's 2 MiB buffer with process_vm_readv, the other rewriting it before each read (so the
 * lines are as hot each time), took 297-330 us for each of the first two reads and 155-200 from
 * the third or fifth on; 4 MiB 620-656, then 370. A pair already read twice is fast at once, so
 * it is the kernel's state of the pages, not the cache. And warm, the kernel's read ran at a
 * quarter to a third of the speed of a user-space copy of the same bytes (memcpy from a shared
 * mapping: 45 us for 2 MiB, 86 for 4 MiB): it pins, copies and unpins page by page. So a class's
 * first probe of single-copy times it on pages never read that way, at up to twice its later
 * cost; the first probe of 2 MiB messages in an alltoall sweep (25 calls per size) read 231-252
 * ps/B against the ring's 51-62.
 * With the cores close that was left as it is: warm, the two ways ran within 10 % of each other
 * at 1-4 MiB exchanges (allgather 4 MiB, launches of 500 calls: ring pinned 243 us, single-copy
 * pinned 233, the choice 228-237 where it took single-copy and 254-263 where it kept the ring),
 * and a warmer probe costs more messages of the way that usually loses. With them apart it cost
 * more: on the Zen 4 VM a 128 KiB class's first probe read single-copy at 135 ps/B against the
 * ring's 128 and kept the ring, where single-copy ran 92-95 once chosen, and allgathers of 256 KiB
 * took 22-23 us per call instead of 15-16 (the harness's 128 KiB-1 MiB band: 64-256 KiB classes
 * kept the ring in most launches). So a class's first probe of single-copy that keeps the ring by
 * less than COLD_CLOSE (5/4) is checked by a second one after PROBE_CLASS_FIRST_MSGS messages
 * (confirm, as above), on pages read that way four times already. Not for a wider loss: a
 * broadcast's single-copy loses to the ring apart by 1.3-1.5x warm, its first probes read
 * 1.25-1.84x, and checking those at 2x cost 4-10 % at 2-16 MiB in 20-call sweeps.
 *
 * Outside a probe, the way in use is left for the other only after SWITCH_AFTER_MSGS messages
 * in a row found it dearer (its median 10 % above the other's last figure). On a 2-vCPU AMD
 * EPYC (Zen 5) VM, ring copies carried an engine step's messages at a median 26-63 ps/B and
 * single-copy at 100-230, yet bursts of three ring messages at 200-290 ps/B came every 15-30
 * messages; three slow samples are a median of five, so the pair switched to single-copy at each
 * burst, and back when the ring messages still in flight arrived fast: a fifth of the 256-512 KiB
 * messages went single-copy, and the ResNet-50 step (engine-bench, malloc'd gradients) took
 * 20.6-21.1 ms against 17.1-17.3 with the ring pinned. A burst leaves the median high for at most
 * five messages; a change of the cores' placement, which makes one way several times slower for
 * minutes, is followed eight messages later instead of three.
 *
 * Each direction of a pair is chosen by its own receiver, but where both send at once (an
 * exchange: allgather, alltoall, the ring's steps) each direction's timings hold the other's: a
 * rank copying its outgoing message into a crawling ring is late to read the incoming one
 * single-copy. So a pair whose directions go different ways times both ways slow, and stays so.
 * On the Zen 4 VM with its vCPUs on two CCDs, an allgather of 1 MiB (512 KiB messages), traced:
 * the two directions switched at different messages (the rule above), and for the rest of the
 * launch one went single-copy at 180-480 ps/B while the other crawled by ring at 200-330, never
 * both single-copy, where with single-copy pinned on both a call took 55-65 us (about 100 ps/B)
 * against 150-280; four of six such launches ended there. Hence the nudge: a receiver that changes
 * a class's way, or starts a probe of its own, sets the class's bit in the ring it sends on
 * (ring_ctl.nudge), and the peer's receiving side, at its next message of that class, probes the
 * same way at once when its own way is the other one, so that the two directions time it
 * together. A probe that a nudge started nudges nothing back, and a nudge is sent only on a
 * change or a probe of one's own: a change that follows one ends there, as the two then agree.
 */
#define PROBE_MIN_NS (100ull * 1000 * 1000)
#define PROBE_MAX_NS (2560ull * 1000 * 1000)
#define PROBE_MIN_MSGS 8
#define PROBE_MIN_BYTES (256ull << 20)
#define PROBE_FIRST_MSGS 8
#define PROBE_FIRST_BYTES (32ull << 20)
#define PROBE_CLASS_FIRST_MSGS 4
#define SWITCH_AFTER_MSGS 8
#define SEED_CLOSE 2
#define COLD_CLOSE_NUM 5 /* a first probe's single-copy figure within 5/4 of the ring's is checked */
#define COLD_CLOSE_DEN 4
#define NOISY_SPREAD 10 /* a probe whose samples spread this much or more is repeated soon */
#define PROBE_BYTES (4ull << 20)
#define WARM_BYTES (1ull << 20)
#define LONG_BYTES (16ull << 20) /* a message this long is a probe on its own */

/* test hook: time added to each large message of [lo, hi) bytes by ring (on the sender, between
 * offering it and publishing it, as a slow copy into the ring would) or by CMA (on the receiver,
 * after the read) */
static uint64_t test_delay_ns[2], test_delay_lo[2], test_delay_hi[2];

void kolo__shm_test_delay_sizes(int way, uint64_t ns, uint64_t lo, uint64_t hi)
{
    way = way != 0;
    test_delay_ns[way] = ns;
    test_delay_lo[way] = lo;
    test_delay_hi[way] = hi;
}

void kolo__shm_test_delay(int way, uint64_t ns) { kolo__shm_test_delay_sizes(way, ns, 0, UINT64_MAX); }

/* test hook: the way choice's clock and costs made up instead of read. A large message costs
 * VIRTUAL_PS per byte either way, plus the delay set for its way and length, and the receiver's
 * clock (shm_priv.vclock) moves on by that much when it has the message; nothing sleeps. The
 * decisions then follow from the delays alone, not from how busy the machine is (tests of the
 * choice's rules; the tests of the timing itself run on the real clock). */
#define VIRTUAL_PS 100
static bool test_virtual;

void kolo__shm_test_virtual(bool on) { test_virtual = on; }

/* test hook, on the made-up clock: of the next messages received `way`, after `skip` of them,
 * `count` take `ns` longer each (a rank that waited for a CPU) */
static uint64_t test_stall_ns;
static int test_stall_way, test_stall_skip, test_stall_count;

void kolo__shm_test_stall(int way, int skip, int count, uint64_t ns)
{
    test_stall_way = way != 0;
    test_stall_skip = skip;
    test_stall_count = count;
    test_stall_ns = ns;
}

static uint64_t test_stall(int way)
{
    if (way != test_stall_way || test_stall_count <= 0) return 0;
    if (test_stall_skip > 0) {
        test_stall_skip--;
        return 0;
    }
    test_stall_count--;
    return test_stall_ns;
}

static bool delayed(int way, uint64_t len) { return len >= test_delay_lo[way] && len < test_delay_hi[way]; }

static void test_delay(int way, uint64_t len)
{
    if (!test_virtual && delayed(way, len)) kolo__sleep_ns(test_delay_ns[way]);
}

static bool enough(const way_choice *w, uint64_t msgs, uint64_t bytes)
{
    return w->since_probe >= msgs || w->since_bytes >= bytes;
}

static void win_clear(way_choice *w, int way) { kolo__window_clear(&w->win[way]); }

static void win_add(way_choice *w, int way, uint64_t ps) { w->cost_ps[way] = kolo__window_add(&w->win[way], ps); }

static bool cheaper(const way_choice *w, int a, int b)
{
    return w->cost_ps[a] && w->cost_ps[b] && w->cost_ps[a] * 10 < w->cost_ps[b] * 9;
}

/* A seeded class's way wants checking by a probe after the class's own first messages: the
 * decision that seeded it was close, or the way costs this class far more than the other way
 * cost the deciding class (the cores' placement changed between the sizes, say). */
static bool seed_in_doubt(const way_choice *w, int want)
{
    return w->seeded || (w->seed_other_ps && w->cost_ps[want] > SEED_CLOSE * w->seed_other_ps);
}

/* The size class of a large message of `bytes` (see above). */
static int shm_class(const shm_priv *s, uint64_t bytes)
{
    int k = 0;
    for (uint64_t b = bytes / KOLO_MAX(s->cma_threshold, 1); b >= 2 && k < SHM_CLASSES - 1; b /= 2) k++;
    return k;
}

/* A progress pass has receive x in hand: if it is large, the first such time is its start on
 * this side (see large_start). */
static void note_look(const shm_priv *s, kolo__xfer *x)
{
    if (s->adapt && !x->looked_ns && x->len >= s->cma_threshold) x->looked_ns = kolo__now_ns();
}

/* When a large message could start at the earliest: see above. `stamp` is the sender's (0 if it
 * did not stamp it). */
static uint64_t large_start(const shm_priv *s, const kolo__xfer *x, uint64_t stamp)
{
    return KOLO_MAX(KOLO_MAX(stamp, x->looked_ns), s->last_end);
}

/* want_cma's value: bit k set when class k wants single-copy. */
static uint32_t want_mask(const shm_priv *s)
{
    uint32_t m = 0;
    for (int k = 0; k < SHM_CLASSES; k++) m |= (uint32_t)((s->cls[k].want != 0) != s->cls[k].early) << k;
    return m;
}

/* Tells the sender what we ask for now (want_mask). */
static void publish_want(shm_priv *s)
{
    atomic_store_explicit(&s->rx_ctl->want_cma, want_mask(s), memory_order_relaxed);
}

/* A message of `bytes` coming `way` is the last its class's probe needs (adapt_learn: 3 samples,
 * 2 that make PROBE_BYTES, or one long message; a short first one only warms the way up). Known
 * from its length alone, so also when it starts (adapt_begin). */
static bool probe_ends_with(const way_choice *w, int way, uint64_t bytes)
{
    if (!w->probing || way != w->want || (w->warming[way] && bytes < WARM_BYTES)) return false;
    int n = w->win[way].n + 1;
    return n >= PROBE_MSGS || (w->probe_bytes + bytes >= PROBE_BYTES && n >= 2) || bytes >= LONG_BYTES;
}

/* Large messages received each way, over all classes. */
static uint64_t pair_got(const shm_priv *s, int way)
{
    uint64_t n = 0;
    for (int k = 0; k < SHM_CLASSES; k++) n += s->cls[k].got[way];
    return n;
}

/* No message of this class has come in yet. */
static bool unseen(const way_choice *w) { return !w->cost_ps[0] && !w->cost_ps[1] && !w->probing && !w->since_probe; }

/* A large message of `bytes` came in `way` (0 ring, 1 CMA); it could start at `start`. */
static void adapt_learn(shm_priv *s, int way, uint64_t start, uint64_t bytes)
{
    uint64_t now = kolo__now_ns();
    if (test_virtual) {
        start = s->vclock ? s->vclock : 1000000000; /* not 0: a cost_at of 0 means never */
        now = s->vclock =
            start + bytes * VIRTUAL_PS / 1000 + (delayed(way, bytes) ? test_delay_ns[way] : 0) + test_stall(way);
    }
    s->last_end = now;
    if (now <= start || !bytes) return;
    uint64_t ps = KOLO_MAX((now - start) * 1000 / bytes, 1);
    int k = shm_class(s, bytes);
    way_choice *w = &s->cls[k];
    w->got[way]++;
    w->since_probe++;
    w->since_bytes += bytes;
    /* the first message of a way, at the start or in a probe, warms it up (ring pages, the
     * kernel's page walks) and says little, unless it is long: it is not counted */
    if (w->warming[way]) {
        w->warming[way] = 0;
        if (bytes < WARM_BYTES) return;
    }
    int want = w->want, was_probing = w->probing;
    int settled = was_probing ? !want : want; /* the way in use outside a probe */
    /* the other direction's receiver changed this class's way or is probing it: when its way
     * is not ours, time ours against it now, both directions the same way (see "nudge" above) */
    uint32_t bit = 1u << k;
    bool nudged = false;
    if (atomic_load_explicit(&s->rx_ctl->nudge, memory_order_acquire) & bit) {
        atomic_fetch_and_explicit(&s->rx_ctl->nudge, ~bit, memory_order_relaxed);
        nudged = !w->probing &&
                 (int)((atomic_load_explicit(&s->tx_ctl->want_cma, memory_order_relaxed) >> k) & 1u) != want;
    }
    if (w->probing) {
        if (way != want) { /* sent before the sender saw the request */
            if (w->early) { /* or after adapt_begin asked for it, yet the probe did not end (a
                               message not timed): end it, keep the way in use */
                w->early = false;
                w->probing = 0;
                w->want = !want;
                publish_want(s);
            }
            return;
        }
        bool ends = probe_ends_with(w, way, bytes);
        win_add(w, way, ps);
        w->probe_bytes += bytes;
        if (!ends) return; /* more to come */
        w->probing = 0;
        w->cost_at[way] = now;
        bool first = !w->probed;
        w->probed = true;
        w->confirm = false;
        if (cheaper(w, want, !want)) {
            w->probe_every = PROBE_MIN_NS; /* the probe changed the answer: look again soon */
            if (first && w->cost_ps[!want] < SEED_CLOSE * w->cost_ps[want]) { /* confirm, above */
                w->confirm = true;
                w->since_probe = w->since_bytes = 0;
            }
        } else {
            want = !want;
            if (first && want == 0 && w->cost_ps[1] * COLD_CLOSE_DEN < w->cost_ps[0] * COLD_CLOSE_NUM) {
                w->confirm = true; /* single-copy timed cold lost by little: check it (above) */
                w->since_probe = w->since_bytes = 0;
            } else if (kolo__window_spread(&w->win[way], NOISY_SPREAD)) {
                w->probe_every = PROBE_MIN_NS; /* a noisy probe says little: look again soon (above) */
            } else {
                w->probe_every = KOLO_MIN(2 * w->probe_every, PROBE_MAX_NS);
            }
        }
    } else {
        /* samples older than the longest probe interval are dropped */
        if (now - w->cost_at[way] > PROBE_MAX_NS) win_clear(w, way);
        win_add(w, way, ps);
        w->cost_at[way] = now;
        if (way == want) w->dearer = cheaper(w, !want, want) ? w->dearer + 1 : 0;
        if (way == want && (w->dearer >= SWITCH_AFTER_MSGS || w->test_switch)) {
            w->test_switch = false;
            want = !want; /* the way in use stayed dearer than the other's last figure */
            w->probe_every = PROBE_MIN_NS;
        } else if (way == want && (nudged || (w->cost_at[!want] && !seed_in_doubt(w, want) && !w->confirm /* the other way measured, then */
                                                  ? enough(w, PROBE_MIN_MSGS, PROBE_MIN_BYTES) &&
                                                        now - w->cost_at[!want] >= w->probe_every
                                                  : enough(w, pair_got(s, 0) + pair_got(s, 1) > PROBE_FIRST_MSGS ? PROBE_CLASS_FIRST_MSGS
                                                                                                       : PROBE_FIRST_MSGS,
                                                           PROBE_FIRST_BYTES)))) {
            want = !want;
            w->probing = 1;
            w->seeded = false;
            w->seed_other_ps = 0;
            win_clear(w, want); /* the probe's samples replace the old ones */
            w->probe_bytes = 0;
            w->warming[want] = 1;
            w->since_probe = w->since_bytes = 0;
        }
    }
    KOLO_TRACE("shm from rank %d: %llu B (class %d) by %s, %llu ps/B; ring %llu, CMA %llu ps/B; asking for %s%s",
               s->peer_rank, (unsigned long long)bytes, k, way ? "CMA" : "ring", (unsigned long long)ps,
               (unsigned long long)w->cost_ps[0], (unsigned long long)w->cost_ps[1], want ? "CMA" : "ring",
               w->probing ? (nudged ? " (probe, as the peer's side)" : " (probe)") : "");
    uint32_t mask = want_mask(s);
    /* a decision (a probe's end, or a switch outside one) also seeds the larger classes that
     * have seen nothing yet */
    bool decided = !w->probing && (was_probing || want != w->want);
    if (want != w->want) w->dearer = 0;
    w->want = want;
    for (int j = k + 1; decided && j < SHM_CLASSES && unseen(&s->cls[j]); j++) {
        s->cls[j].want = want;
        s->cls[j].cost_at[!want] = now;
        /* a close decision is checked by the class's own first probe; one where the other way
         * crawled waits the usual interval */
        s->cls[j].seeded = w->cost_ps[want] && w->cost_ps[!want] < SEED_CLOSE * w->cost_ps[want];
        s->cls[j].seed_other_ps = w->cost_ps[!want];
    }
    w->early = false; /* the probe is over: the bit is the class's way again */
    if (want_mask(s) != mask) publish_want(s);
    /* a change of way, or a probe not itself asked for, asks the other direction to try it */
    if ((!w->probing && want != settled) || (w->probing && !was_probing && !nudged))
        atomic_fetch_or_explicit(&s->tx_ctl->nudge, bit, memory_order_release);
}

/* A large message by ring begins. If it ends a probe of the ring, the sender is asked for the way
 * in use from now on, not when it has been read: the sender offers its next message as soon as
 * this one's last bytes are in the ring, up to a ring's length (2 MiB) before they are read, so a
 * request made at the end came a message late, and every probe of a long message cost two by
 * ring (traced, broadcasts of 64 MiB with the vCPUs on two CCDs: "asking for CMA", then one more
 * message by ring at 216-453 ps/B, where single-copy took 130-180). Should the probe find the
 * ring cheaper, adapt_learn asks for it again at the end, a message late as every change of way
 * is. A probe of single-copy needs no such thing: the sender waits for the ack of each
 * single-copy message, which comes after adapt_learn. */
static void adapt_begin(shm_priv *s, uint64_t bytes)
{
    way_choice *w = &s->cls[shm_class(s, bytes)];
    if (w->early || !probe_ends_with(w, 0, bytes)) return;
    w->early = true;
    publish_want(s);
}

/* A large message of `bytes` came in `way`, from `start`. In an exchange, where this side is
 * sending the peer a large message of its own at the same time, its figure is taken when that
 * one is out too (adapt_flush, from progress_send). The receiver's own outgoing copies are part
 * of what an exchange costs by ring, but a side that came to the exchange later than its peer
 * finds the peer's message partly copied into the ring already (while the peer waited for it)
 * and ends its receive before its own send: its figure left out the half of the exchange still
 * to go. Traced on an Intel Xeon (Sapphire Rapids) guest, 2 ranks, allgather of 16 MiB (8 MiB
 * messages): by ring the later side read 86-105 ps/B and the earlier 160-220, by single-copy
 * both about 100-130; the later side kept the ring for its direction, the nudge took the other
 * along, and the calls ran 2.0-2.2 ms against 1.5-1.6 with single-copy pinned. */
static void adapt_flush(shm_priv *s);

static void adapt_done(kolo__conn *c, shm_priv *s, int way, uint64_t start, uint64_t bytes)
{
    adapt_flush(s); /* an earlier one still waiting (another message came in meanwhile) */
    const kolo__xfer *out = c->sendq;
    if (out && out->hdr_done && out->len >= s->cma_threshold) {
        /* a probe that ends with this message asks the sender for the way in use now, as
         * adapt_begin does for the ring: single-copy's ack, which follows, no longer comes after
         * the decision, and the peer's next message would come the probed way once more (seen in
         * shm_auto_seeded_class_probes_when_in_doubt: 5 of 16 messages where 4 belong) */
        way_choice *w = &s->cls[shm_class(s, bytes)];
        if (!w->early && probe_ends_with(w, way, bytes)) {
            w->early = true;
            publish_want(s);
        }
        s->deferred = true;
        s->deferred_way = way;
        s->deferred_start = start;
        s->deferred_bytes = bytes;
        s->last_end = kolo__now_ns(); /* the next message's earliest start, as adapt_learn sets it */
        return;
    }
    adapt_learn(s, way, start, bytes);
}

static void adapt_flush(shm_priv *s)
{
    if (!s->deferred) return;
    s->deferred = false;
    adapt_learn(s, s->deferred_way, s->deferred_start, s->deferred_bytes);
}

/* ---- ring copies around the cache when the cores sit far apart ----
 *
 * A ring copy's sender writes lines the reader read on the last lap, so each store first takes
 * the line back from the reader's cache. With the two cores sharing a cache that costs little;
 * across CCDs (or sockets) it is a round trip to the other cache per line, and the sender's copy
 * crawls. Non-temporal stores take no line back: they write whole lines to memory, and the reader
 * reads them from there. Measured on this project's Zen 4 VM, 2 ranks, ring copies pinned
 * (KOLO_SHM_CMA=0), through the cache against around it, launches alternated:
 *
 *   the sender's copy, ps/B:  vCPUs on one CCD (shared-memory ping 0.05 us) 26-33 through the
 *     cache (42-65 at 16-64 MiB, whose source is out of cache), 33-78 around it; on two CCDs
 *     (ping 0.26 us) 146-368 through it, 35-66 around it.
 *   allreduce 1 MiB, us per call:  one CCD 75-89 through, 151-186 around; two CCDs 414-481
 *     through, 151-154 around. allgather on two CCDs: 1 MiB 223 against 61, 64 MiB 22.8 ms
 *     against 5.4; allreduce 64 MiB 31.2 against 13.9. On one CCD around the cache lost at every
 *     size (allreduce 64 MiB 9.3-10.5 ms against 14.4-16.5, broadcast 4.6 against 7.5).
 *
 * With the rule below, against the build before it, the default way choice (KOLO_SHM_CMA=auto),
 * 256 KiB-64 MiB, busbw by medians of launches alternated for 15 minutes and sorted by the ping
 * before and after each: two CCDs (7-10 launches per size) allreduce 1.57-3.94x, broadcast 1 MiB
 * and up 1.67-2.57x, allgather and alltoall 16-64 MiB 1.15-1.80x; allgather 256 KiB-4 MiB (27-29
 * launches) 0.86-1.00x, where single-copy carried them before and the two ways now run close.
 * One CCD (50 launches) unchanged: allreduce 256 KiB-4 MiB 0.96-1.02x in 10 rounds of its own.
 *
 * So the sender times its own copies through the cache (payload steps of FAR_TIME_ALL bytes or
 * more, and one in FAR_TIME_EVERY of the shorter ones down to FAR_MIN, after the ring's first lap,
 * whose lines no reader holds; two readings of the clock are 10-15 % of a copy of 4-8 KiB, and
 * broadcasts of 8 KiB with every short copy timed ran 0.47x with the cores together, one in 8
 * 0.96x; one in 32 runs broadcasts of 8-16 KiB 1.02-1.04x one in 8 there, 12 launches each
 * alternated, allreduce alike, and on two CCDs switches as fast: 32 timed copies are some 400
 * short ones, 0.3 ms) and writes every step of FAR_MIN bytes or more around the cache once the
 * median of its last 5 has stayed above CRAWL_PS for CRAWL_AFTER copies in a row: 200 ps/B is 3x
 * the slowest copy seen with the cores close, and a few slow copies in a burst (a preempted
 * rank) do not move it. For messages of up to 64 KiB (CRAWL_SMALL_LEN) the bar is 100 ps/B
 * (CRAWL_PS_SMALL), below. Around the cache its copies say nothing about the other way, so after
 * 0.1 s it goes back through the cache for one window of copies (a check: the placement may have
 * changed), and stays there if they no longer crawl; if they still do, the next check waits twice
 * as long, up to 2.56 s (a check costs 5 crawling copies, some 0.4 ms). Each direction's sender
 * decides alone: it is its writes that crawl, and the receiver's way choice above (ring or
 * single-copy) then times the ring as it now runs.
 *
 * 200 ps/B tells the placements apart for long messages only. Recorded on the Zen 4 VM (every
 * timed copy of 2 ranks' sweeps of all five collectives, 8 KiB-64 MiB, 30 launches): with the
 * vCPUs together, copies of messages up to 64 KiB cost a median 35 ps/B (90th percentile 85, 99th
 * 123), of longer ones, whose sources are out of cache, 70 (90th 110, 99th 203); apart, copies of
 * 16-32 KiB messages cost 107-290 ps/B, and in some launches their median stayed between 127 and
 * 237, never above 200 for 8 copies in a row, so they crawled all launch long (alltoall 64 KiB
 * 17 us per call, against 9-10 in launches that switched and Open MPI's 8). Around the cache is
 * the wrong way with the vCPUs together, for every size (every copy sent around it, 30 launches
 * alternated with the rule: 1.3-1.8x the time at 16-64 KiB, 1.4-3x at 128 KiB-1 MiB), and apart
 * it gains most on short messages (0.25-0.9x at 16-64 KiB, 0.9-1.1x from 128 KiB). So messages up
 * to 64 KiB switch from 100 ps/B. Against 200 for all sizes, launches alternated in the harness's
 * bands of 8 KiB-1 MiB, medians of paired ratios (time with the lower bar over time without),
 * pairs of launches whose pings put both in one state: apart (7-10 pairs per size) allreduce 32 /
 * 64 KiB 0.82 / 0.70, allgather 32 / 64 KiB 0.88 / 0.82, the rest 0.89-1.09; together (109-112
 * pairs) 0.97-1.04. An earlier form with the bar at 100 up to 256 KiB, 150 rounds: apart (14-25
 * pairs) allreduce 32 / 64 KiB 0.59 / 0.62, alltoall 64 KiB 0.91, broadcast 32 KiB 0.91, the
 * rest 0.93-1.07; together 0.98-1.03. Where the world is oversubscribed (a host with more ranks
 * than cores, agreed at init) the bar stays 200 for every message, as it was not measured there.
 *
 * With more ranks than cores the rule is the same. A copy cut in two by the scheduler is one slow
 * sample, which the median of 5 and 8 in a row ride out (none switched in 20 traced launches of 4
 * ranks on the Zen 4 VM's 2 vCPUs with the vCPUs on one CCD), while on two CCDs every copy to a
 * rank on the other one crawls. Such hosts had kept their copies in cache until 2026-11-29;
 * against that, 4 ranks, launches alternated, us per call: on two CCDs allreduce 32 KiB / 256 KiB
 * / 1 MiB / 4 MiB 31 / 127 / 405 / 1757 against 47 / 259 / 968 / 4233, broadcast 3.7 / 36 / 131 /
 * 602 against 15 / 124 / 496 / 2184, reducescatter, allgather and alltoall 32-256 KiB 1.7-2.6x
 * (their larger exchanges go single-copy: allgather 1-4 MiB 0.87-0.96x), 8 ranks allreduce 1.5-2.2x,
 * 16 ranks 0.96-1.56x; on one CCD allreduce 8 / 32 / 128 KiB 9.3 / 19.2 / 65 against 7.8 / 18.4 / 60
 * (medians of 30 launches each, both builds bimodal by launch, 8 KiB at 7-11 or 16-19 in about the
 * same shares), the other collectives and 8 and 16 ranks within the noise of 4-10 launches each.
 *
 * Short messages gain most (against steps from 32 KiB only, 8 minutes of launches alternated and
 * sorted by the ping; busbw, 28-47 launches per size far, 277-283 near): on two CCDs broadcast
 * 8-16 KiB 5.8x, 32 KiB 2.5x, 64-128 KiB 1.4-1.7x; allreduce 8-16 KiB 1.6x, 32 KiB 3.8x, 64-128 KiB
 * 1.15-1.2x; allgather 16-32 KiB 1.4-2.4x. On one CCD 0.96-1.00x, but broadcast 8-16 KiB 0.90-0.96x
 * in 10 more rounds of its own (what the timing of one copy in 8 cost there; one in 32 since).
 */
#define FAR_MIN ((size_t)4 << 10)
#define FAR_TIME_ALL ((size_t)32 << 10) /* shorter steps are timed one in FAR_TIME_EVERY */
#define FAR_TIME_EVERY 32
#define CRAWL_PS 200
#define CRAWL_AFTER 8
#define CRAWL_PS_SMALL 100
#define CRAWL_SMALL_LEN ((uint64_t)64 << 10)
#if defined(__x86_64__)
#define FAR_STORES 1
#else
#define FAR_STORES 0 /* kolo__stream_copy is a plain copy there: nothing to switch to */
#endif

/* test hook: -1 the rule above, 0 always through the cache, 1 always around it; a `ps` not 0 is
 * every timed copy's cost per byte instead of what the clock says */
static int test_far = -1;
static uint64_t test_far_ps;

void kolo__shm_test_far(int mode, uint64_t ps)
{
    test_far = mode;
    test_far_ps = ps;
}

static void go_far(shm_priv *s, uint64_t now, uint64_t every, uint64_t ps)
{
    s->far = true;
    s->far_every = every;
    s->far_until = now + every;
    KOLO_TRACE("shm to rank %d: copies into the ring crawl (%llu ps/B): writing around the cache for %llu ms",
               s->peer_rank, (unsigned long long)ps, (unsigned long long)(every / 1000000));
}

/* Whether the sender writes around the cache now; at a timed copy (`now` not 0) ends a spell
 * around it when it is due. */
static bool far_now(shm_priv *s, uint64_t now)
{
    if (test_far >= 0) return test_far == 1;
    if (s->far && now && now >= s->far_until) {
        s->far = false;
        s->far_check = true;
        kolo__window_clear(&s->wwin);
        s->crawls = 0;
    }
    return s->far;
}

/* A copy of n bytes through the cache took ns; above `bar` ps/B it crawls. */
static void far_learn(shm_priv *s, uint64_t now, uint64_t ns, size_t n, uint64_t bar)
{
    uint64_t ps = test_far_ps ? test_far_ps : ns * 1000 / n;
    uint64_t median = kolo__window_add(&s->wwin, ps);
    if (s->wwin.n < KOLO_WINDOW) return;
    bool crawl = median > bar;
    s->crawls = crawl ? s->crawls + 1 : 0;
    if (s->far_check) {
        s->far_check = false;
        if (crawl) {
            go_far(s, now, KOLO_MIN(2 * s->far_every, PROBE_MAX_NS), median);
        } else {
            KOLO_TRACE("shm to rank %d: copies into the ring no longer crawl (%llu ps/B): through the cache",
                       s->peer_rank, (unsigned long long)median);
        }
    } else if (s->crawls >= CRAWL_AFTER) {
        go_far(s, now, PROBE_MIN_NS, median);
    }
}

/* Writes a payload step of n bytes at ring position pos (see above); `bar` is CRAWL_PS or
 * CRAWL_PS_SMALL, by the message's length. */
static void tx_payload(shm_priv *s, uint64_t pos, const void *src, size_t n, uint64_t bar)
{
    if (n < FAR_MIN || !FAR_STORES) {
        tx_write(s, pos, src, n);
        return;
    }
    bool timed = n >= FAR_TIME_ALL || ++s->far_tick % FAR_TIME_EVERY == 0;
    uint64_t now = timed ? kolo__now_ns() : 0;
    if (far_now(s, now)) {
        first_pass(s->tx, s->mask + 1, &s->tx_ready, pos + n, MADV_POPULATE_WRITE);
        ring_write_around(s->tx, s->mask, pos, src, n);
        kolo__stream_fence(); /* before head or the next mark is published */
        s->far_bytes += n;
        return;
    }
    tx_write(s, pos, src, n);
    if (timed && pos > s->mask && test_far < 0) {
        uint64_t end = kolo__now_ns();
        far_learn(s, end, end - now, n, bar);
    }
}

/* ---- framing: marks ----
 *
 * A frame in the ring starts on a cache line: [mark, 8 B][header, 16 B][payload or CMA
 * descriptor], padded to 64 bytes; a streamed payload starts on the next line, so that the
 * copies of large messages run on aligned lines. The mark of the frame starting at stream
 * position p reads p + 1 once the frame may be read: the reader polls the mark at its tail, so
 * a small message costs it the one cache line holding mark, header and payload, and not also
 * the line of the writer's head counter. Frames
 * of at most INLINE_MAX payload bytes (and descriptors) are written whole before their mark;
 * longer ones publish the mark after the header and stream the payload behind head as before.
 *
 * Stale bytes from an earlier lap must never look like a mark: before a frame is published the
 * writer zeroes the mark slot of the frame after it (end_frame), so the reader finds 0 there
 * until that frame is published. Anything else is a garbled stream. The writer keeps
 * TERM_RESERVE bytes free behind every payload for that padding and zero.
 */
#define MARK_LEN 8
#define INLINE_MAX 4096
/* With more ranks than cores the pairs keep ring copies (timings there measure the scheduler),
 * but the sends a collective marks `single` (alltoall's, and allgather's and reducescatter's
 * exchanges: the receiver keeps the bytes, nobody forwards them) go single-copy from this size:
 * when the cores are the bottleneck, one copy beats two. 4 ranks on 2 cores, alltoall, us per
 * call, ring against single-copy (8 launches interleaved): 512 KiB 129 / 123, 1 MiB 244 / 176, 2
 * MiB 540 / 352, 4 MiB 1109 / 885; the ring collectives (allgather, broadcast, reducescatter,
 * allreduce) lost 5-70 % single-copy. From 128 KiB until 2026-12-01; on the Intel Xeon VM (vCPUs
 * in one state) messages of 32-64 KiB by ring then cost such calls up to 2.7x: 4 ranks, the
 * harness's band (50 calls a size), 4 rounds alternated with the build before, Open MPI in the
 * same rounds, us: alltoall 128 / 256 / 512 KiB 19.4 / 27.6 / 68.4 against 27.5 / 74.5 / 142.2
 * (Open MPI 23.1 / 36.1 / 110.0), allgather 256 / 512 KiB 39.7 / 85.2 against 58.7 / 89.3, the
 * reducescatter exchange 64-256 KiB 0.53-0.84x the time, 1 MiB and up alike (6 rounds); 8 ranks
 * (3 rounds) alltoall 128-512 KiB 0.38-0.57x, allgather 0.51-0.65x. perf of a slow launch before:
 * two thirds of the samples in the ring's memcpy. On a Zen 3 VM (2026-11-27) the same change had
 * read the same or slower (alltoall 256 KiB 88 us against 80, allgather 86 against 69, 10 rounds),
 * so this is the machine's as much as the rule's; single-copy is one copy instead of two on a
 * host whose cores are what it lacks, and the pair's threshold is its floor.
 *
 * With KOLO_SHM_CMA=1 too, on any host, where other messages go single-copy only from 128 KiB
 * (mesh.c): until 2026-12-01 such sends of 32-128 KiB went by ring there. 2 ranks, the
 * harness's band, 4-5 rounds alternated with the build before, us: alltoall 64 / 128 KiB (32 /
 * 64 KiB messages) 2.8 / 4.4 against 4.3 / 9.2, allgather 2.9 / 4.7 against 4.3 / 8.2 (Open MPI
 * 3.7-4.2 / 5.5-5.6); 4 ranks alltoall 128 / 256 KiB 21 / 42 against 27 / 65 (6 rounds).
 *
 * With auto, such sends from the pair's threshold (32 KiB) go single-copy, as their call's choice
 * (SHM_FLAG_CALL: the receiver does not time them), unless the call chose otherwise: a 2-member
 * exchange's call picks ring copies or single-copy from whole calls' timings (allgather.c, "Ring
 * or single-copy"). The receiver's timing of a message sees its
 * own copy, not the sender's copy into the ring, and in an exchange both sides do both: per
 * message the ring looked close to single-copy, and short launches often settled on it. Intel
 * Xeon guest, vCPUs apart, 2 ranks, 5 rounds of 20-call launches: allgather and alltoall 256-512
 * KiB 0.77-0.79x the time left to the transport, 128 KiB and 1-16 MiB 0.95-1.03x; against Open
 * MPI's 0.82-0.99x at every size from 128 KiB to 16 MiB (before: 256-512 KiB 1.16-1.27x). Capped
 * at 1 MiB messages for a run (2026-11-30_2137), the larger ones lost more than they had: the
 * transport no longer decided the small classes, whose decisions seeded the larger ones, and
 * those started on the ring (alltoall 4-16 MiB 0.75-0.79x Open MPI's busbw); uncapped against
 * capped, 5 rounds: 2-16 MiB 0.82-1.00x the time, at or below Open MPI's at every size. Once, on
 * another day and build, with the vCPUs together, single-copy from 2 MiB lost to the timings'
 * choice (allgather of 8 MiB 890 us against 777, docs/performance.md): not seen since. */
#define SINGLE_MIN ((size_t)32 << 10)
#define LINE 64
#define TERM_RESERVE (2 * LINE) /* padding to the next line, and the next mark's zero */
/* A streamed payload is copied in and out in steps of at most this, each published at once, so
 * that writer and reader copy at the same time. Copying as much as the ring held (then 4 MiB) per
 * step made them take turns: broadcast of 64 MiB ran at 3.7 GB/s by ring against 9 by CMA. */
#define STREAM_STEP (256u << 10)

static uint64_t pad_line(uint64_t v) { return (v + LINE - 1) & ~(uint64_t)(LINE - 1); }

static _Atomic uint64_t *mark_at(char *ring, uint64_t mask, uint64_t pos)
{
    return (_Atomic uint64_t *)(void *)(ring + (pos & mask));
}

/* Ends the frame whose bytes end at *head: pads to a line and zeroes the next frame's mark. */
static void end_frame(shm_priv *s, uint64_t *head)
{
    *head = pad_line(*head);
    first_pass(s->tx, s->mask + 1, &s->tx_ready, *head + MARK_LEN, MADV_POPULATE_WRITE);
    atomic_store_explicit(mark_at(s->tx, s->mask, *head), 0, memory_order_relaxed);
}

/* What a sleeper waits for, in its `asleep` (see "Sleeping") */
#define WANT_BYTES 1u /* the writer's head */
#define WANT_ROOM 2u  /* the reader's tail and acks */

/* Wakes the peer if it sleeps on this pair waiting for WHAT (see "Sleeping"). The fence orders
 * what this side just published before its load of `asleep`. */
static void ring_bell(shm_priv *s, uint32_t what)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (!(atomic_load_explicit(&s->tx_ctl->asleep, memory_order_relaxed) & what)) return;
    atomic_fetch_add_explicit(&s->tx_ctl->bell, 1, memory_order_relaxed);
    syscall(SYS_futex, &s->tx_ctl->bell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* The peer's counter is more than a ring away from ours: the reader's tail ahead of our head
 * or a ring behind it, the writer's head more than a ring past our tail. Believed, the space or
 * the bytes it announced wrapped around, and a copy ran past the ring's end: over the other
 * ring and out of the segment (found by tests/fuzz/fuzz_shm.c). */
static int counter_garbled(kolo__conn *c, bool sending, uint64_t theirs, uint64_t ours)
{
    return kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                        "the shared-memory stream %s rank %d on %s is garbled: its %s %#llx is not "
                                        "within a ring of %llu bytes %s this rank's %s %#llx",
                                        sending ? "to" : "from", c->peer, kolo__peer_name(c->mesh, c->peer),
                                        sending ? "reader's tail" : "head", (unsigned long long)theirs,
                                        (unsigned long long)(((shm_priv *)c->priv)->mask + 1),
                                        sending ? "behind" : "past", sending ? "head" : "tail",
                                        (unsigned long long)ours));
}

/* The reader's tail, loaded anew (acquire: the bytes before it are free), into *tail; a protocol
 * error where it is more than a ring from our head. */
static int reader_tail(kolo__conn *c, shm_priv *s, uint64_t head, uint64_t *tail)
{
    *tail = atomic_load_explicit(&s->tx_ctl->tail, memory_order_acquire);
    return head - *tail > s->mask + 1 ? counter_garbled(c, true, *tail, head) : KOLO_OK;
}

static int progress_send(kolo__conn *c, shm_priv *s)
{
    ring_ctl *ctl = s->tx_ctl;
    uint64_t size = s->mask + 1;
    uint64_t head = s->tx_head;
    /* the reader's tail as last seen: reloaded only when the ring looks too full, so that a
     * stream of small messages does not pull the reader's tail line over for each one */
    uint64_t tail = s->tx_tail;
    uint64_t start = head;
    int st;
    while (c->sendq) {
        kolo__xfer *x = c->sendq;
        if (x->cma_seq) { /* descriptor written: wait for the reader's ack */
            if (atomic_load_explicit(&ctl->acks, memory_order_acquire) < x->cma_seq) break;
            kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
            adapt_flush(s);
            continue;
        }
        uint64_t space = size - (head - tail);
        if (x->hdr_done == 0) {
            bool large = x->len >= s->cma_threshold;
            /* the call chose its way, or (auto) marked the send `single`: single-copy (SINGLE_MIN) */
            int way = x->way == KOLO_WAY_AUTO && x->single ? KOLO_WAY_SINGLE : x->way;
            bool called = large && s->adapt && way != KOLO_WAY_AUTO;
            bool cma = large && (called   ? way == KOLO_WAY_SINGLE
                                 : s->adapt ? ((atomic_load_explicit(&ctl->want_cma, memory_order_relaxed) >>
                                                shm_class(s, x->len)) & 1u) != 0
                                            : s->cma != 0);
            /* (a call that chose ring copies sends its `single` ones so too) */
            cma = cma || (x->single && x->way != KOLO_WAY_RING && (s->single_ok || s->cma) && x->len >= SINGLE_MIN);
            bool whole = cma || x->len <= INLINE_MAX;
            /* a streamed payload starts on the line after the header's */
            uint64_t body = whole ? KOLO_HDR_LEN + (cma ? CMA_DESC_LEN : x->len) : LINE - MARK_LEN;
            if (space < MARK_LEN + body + TERM_RESERVE) {
                if ((st = reader_tail(c, s, head, &tail))) return st;
                space = size - (head - tail);
                if (space < MARK_LEN + body + TERM_RESERVE) break;
            }
            uint64_t at = head;
            /* auto: when the message was offered, for the receiver's timing */
            uint64_t stamp = large && s->adapt && !called ? kolo__now_ns() : 0;
            if (cma) {
                unsigned char msg[KOLO_HDR_LEN + CMA_DESC_LEN];
                uint64_t addr = (uint64_t)(uintptr_t)x->buf, len = x->len;
                memcpy(msg, x->hdr, KOLO_HDR_LEN); /* the length with the call's tag */
                kolo__hdr_set_flags(msg, SHM_FLAG_CMA | (called ? SHM_FLAG_CALL : 0));
                memcpy(msg + KOLO_HDR_LEN, &addr, 8);
                memcpy(msg + KOLO_HDR_LEN + 8, &len, 8);
                memcpy(msg + KOLO_HDR_LEN + 16, &stamp, STAMP_LEN);
                tx_write(s, at + MARK_LEN, msg, sizeof(msg));
                x->cma_seq = ++s->cma_sent;
            } else {
                if (called) kolo__hdr_set_flags(x->hdr, SHM_FLAG_CALL);
                tx_write(s, at + MARK_LEN, x->hdr, KOLO_HDR_LEN);
                if (whole && x->len) tx_write(s, at + MARK_LEN + KOLO_HDR_LEN, x->buf, x->len);
                else if (!whole) tx_write(s, at + MARK_LEN + KOLO_HDR_LEN, &stamp, STAMP_LEN);
                if (large) test_delay(0, x->len);
            }
            x->hdr_done = KOLO_HDR_LEN;
            head = at + MARK_LEN + body;
            if (whole) {
                x->done = x->len;
                end_frame(s, &head);
            }
            atomic_store_explicit(mark_at(s->tx, s->mask, at), at + 1, memory_order_release);
            if (cma) continue;
            if (whole) {
                kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
                continue;
            }
            space = size - (head - tail);
        }
        if (x->done < x->len) {
            if (space <= TERM_RESERVE) {
                if ((st = reader_tail(c, s, head, &tail))) return st;
                space = size - (head - tail);
                if (space <= TERM_RESERVE) break;
            }
            size_t n = (size_t)KOLO_MIN(KOLO_MIN((uint64_t)(x->len - x->done), space - TERM_RESERVE), STREAM_STEP);
            bool small = x->len <= CRAWL_SMALL_LEN && !c->mesh->world_oversubscribed;
            tx_payload(s, head, x->buf + x->done, n, small ? CRAWL_PS_SMALL : CRAWL_PS);
            head += n;
            x->done += n;
            if (x->done < x->len) {
                /* publish what fits now so the reader can start draining */
                atomic_store_explicit(&ctl->head, head, memory_order_release);
                s->tx_head = head;
                ring_bell(s, WANT_BYTES);
                start = head;
                if ((st = reader_tail(c, s, head, &tail))) return st;
                if (size - (head - tail) <= TERM_RESERVE) break;
                continue;
            }
            end_frame(s, &head);
        }
        bool large = x->len >= s->cma_threshold;
        kolo__xfer_complete(&c->sendq, &c->sendq_tail, 0);
        if (large) adapt_flush(s);
    }
    if (head != start) {
        atomic_store_explicit(&ctl->head, head, memory_order_release);
        ring_bell(s, WANT_BYTES);
    }
    s->tx_head = head;
    s->tx_tail = tail;
    return KOLO_OK;
}

/* The sender gave up while we were reading its memory: what we read cannot be trusted. */
static int aborted_peer(kolo__conn *c, shm_priv *s)
{
    char why[KOLO_ABORT_REASON_MAX + 1];
    snprintf(why, sizeof(why), "%.*s", (int)sizeof(s->rx_ctl->reason), s->rx_ctl->reason);
    return kolo__conn_fail(c, kolo__err_aborted(c, why));
}

/* [addr, addr + n) of process pid to or from `mine`, from *done on */
static int cma_copy(int pid, char *mine, uint64_t addr, size_t n, size_t *done, bool write)
{
    while (*done < n) {
        struct iovec local = {mine + *done, n - *done};
        struct iovec remote = {(void *)(uintptr_t)(addr + *done), n - *done};
        ssize_t k = write ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                          : process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno;
        if (k == 0) return ENODATA;
        *done += (size_t)k;
    }
    return 0;
}

int kolo__cma_read(int pid, void *dst, uint64_t addr, size_t n, size_t *done)
{
    return cma_copy(pid, dst, addr, n, done, false);
}

int kolo__cma_write(int pid, uint64_t addr, const void *src, size_t n, size_t *done)
{
    return cma_copy(pid, (char *)(uintptr_t)src, addr, n, done, true);
}

static int cma_read(kolo__conn *c, shm_priv *s, kolo__xfer *x, uint64_t addr)
{
    int e = kolo__cma_read(s->peer_pid, x->buf, addr, x->len, &x->done);
    /* A sender marks its rings aborted before its buffers go back to its user: a buffer gone
     * (EFAULT) without the mark is no abort, and "aborted the job because: (no reason given)" on
     * both ranks named no cause */
    if (e && atomic_load(&s->rx_ctl->closed) == SHM_ABORTED) return aborted_peer(c, s);
    /* EFAULT: the descriptor names memory the peer does not have (unmapped, inaccessible, past
     * its address space, or shorter than the header's length), our own buffer being the caller's
     * and valid by the xfer contract. That is the peer's garbled stream, a protocol error naming
     * it, not a failure of this system: until found by tests/fuzz/fuzz_cma.c it was
     * KOLO_ERR_SYSTEM ("single-copy read ... failed: Bad address"). */
    if (e == ENODATA || e == EFAULT)
        return kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                            "rank %d on %s described a buffer that cannot be read: %zu bytes at "
                                            "0x%" PRIx64 " (%s)",
                                            c->peer, kolo__peer_name(c->mesh, c->peer), x->len, addr,
                                            e == EFAULT ? "not all mapped in its process" : "none read"));
    if (e == ESRCH) {
        kolo__err(KOLO_ERR_PEER_LOST, "lost rank %d on %s: the process is gone", c->peer,
                  kolo__peer_name(c->mesh, c->peer));
        return kolo__conn_fail(c, KOLO_ERR_PEER_LOST);
    }
    if (e) {
        kolo__err_sys(e, "single-copy read of %zu bytes at 0x%" PRIx64 " from rank %d on %s (pid %d) failed", x->len,
                      addr, c->peer, kolo__peer_name(c->mesh, c->peer), s->peer_pid);
        return kolo__conn_fail(c, KOLO_ERR_SYSTEM);
    }
    /* The sender marks its rings aborted before its buffers go back to its user; data read
     * before the mark was still its own. After it, the bytes may be anything. */
    if (atomic_load(&s->rx_ctl->closed) == SHM_ABORTED) return aborted_peer(c, s);
    return KOLO_OK;
}

static int progress_recv(kolo__conn *c, shm_priv *s)
{
    ring_ctl *ctl = s->rx_ctl;
    uint64_t size = s->mask + 1;
    uint64_t tail = s->rx_tail;
    uint64_t head = 0; /* loaded when a streamed payload needs it */
    uint64_t start = tail;
    int st = KOLO_OK;
    while (c->recvq) {
        kolo__xfer *x = c->recvq;
        if (x->hdr_done == 0) {
            note_look(s, x); /* one that came to the head during this pass */
            first_pass(s->rx, s->mask + 1, &s->rx_ready, tail + MARK_LEN, MADV_POPULATE_READ);
            uint64_t mark = atomic_load_explicit(mark_at(s->rx, s->mask, tail), memory_order_acquire);
            if (mark != tail + 1) {
                if (mark != 0)
                    st = kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                                      "the shared-memory stream from rank %d on %s is garbled: "
                                                      "mark %#llx where %#llx or 0 belongs",
                                                      c->peer, kolo__peer_name(c->mesh, c->peer),
                                                      (unsigned long long)mark, (unsigned long long)(tail + 1)));
                break;
            }
            rx_read(s, tail + MARK_LEN, x->hdr, KOLO_HDR_LEN, false);
            uint32_t flags;
            st = kolo__hdr_check(c, x, &flags);
            if (st != KOLO_OK) {
                kolo__conn_fail(c, st);
                break;
            }
            if (flags & SHM_FLAG_CALL) { /* timed by the call that chose it, not here */
                x->way = flags & SHM_FLAG_CMA ? KOLO_WAY_SINGLE : KOLO_WAY_RING;
                s->called[(flags & SHM_FLAG_CMA) != 0]++;
            }
            if (flags & SHM_FLAG_CMA) {
                if (!s->cma_ok) {
                    st = kolo__conn_fail(c, kolo__err(KOLO_ERR_PROTOCOL,
                                                      "rank %d on %s sent a single-copy descriptor, but this "
                                                      "pair never passed the single-copy probe",
                                                      c->peer, kolo__peer_name(c->mesh, c->peer)));
                    break;
                }
                unsigned char d[CMA_DESC_LEN];
                uint64_t addr, stamp;
                rx_read(s, tail + MARK_LEN + KOLO_HDR_LEN, d, CMA_DESC_LEN, false);
                memcpy(&addr, d, 8);
                memcpy(&stamp, d + 16, STAMP_LEN);
                x->hdr_done = KOLO_HDR_LEN;
                st = cma_read(c, s, x, addr);
                if (st != KOLO_OK) break;
                test_delay(1, x->len);
                if (s->adapt && !x->way) adapt_done(c, s, 1, large_start(s, x, stamp), x->len);
                tail = pad_line(tail + MARK_LEN + KOLO_HDR_LEN + CMA_DESC_LEN);
                atomic_store_explicit(&ctl->tail, tail, memory_order_release);
                start = tail;
                atomic_fetch_add_explicit(&ctl->acks, 1, memory_order_release);
                ring_bell(s, WANT_ROOM);
                kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
                continue;
            }
            x->hdr_done = KOLO_HDR_LEN;
            if (x->len <= INLINE_MAX) { /* written whole before the mark */
                if (x->len) rx_read(s, tail + MARK_LEN + KOLO_HDR_LEN, x->buf, x->len, false);
                x->done = x->len;
                tail = pad_line(tail + MARK_LEN + KOLO_HDR_LEN + x->len);
                kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
                continue;
            }
            if (s->adapt && x->len >= s->cma_threshold && !x->way) {
                uint64_t stamp;
                rx_read(s, tail + MARK_LEN + KOLO_HDR_LEN, &stamp, STAMP_LEN, false);
                s->rx_start = large_start(s, x, stamp);
                adapt_begin(s, x->len);
            }
            tail += LINE;
        }
        if (x->done < x->len) {
            if (head <= tail) {
                head = atomic_load_explicit(&ctl->head, memory_order_acquire);
                if (head <= tail) break;
            }
            if (head - tail > size) {
                st = counter_garbled(c, false, head, tail);
                break;
            }
            size_t n = (size_t)KOLO_MIN(KOLO_MIN((uint64_t)(x->len - x->done), head - tail), STREAM_STEP);
            rx_read(s, tail, x->buf + x->done, n, x->stream);
            tail += n;
            x->done += n;
            if (x->done < x->len) {
                atomic_store_explicit(&ctl->tail, tail, memory_order_release);
                ring_bell(s, WANT_ROOM);
                start = tail;
                head = atomic_load_explicit(&ctl->head, memory_order_acquire);
                continue;
            }
            tail = pad_line(tail);
            if (x->stream) kolo__stream_fence(); /* before anyone learns the receive is done */
            if (s->adapt && x->len >= s->cma_threshold && !x->way) adapt_done(c, s, 0, s->rx_start, x->len);
        }
        kolo__xfer_complete(&c->recvq, &c->recvq_tail, 0);
    }
    if (tail != start) {
        atomic_store_explicit(&ctl->tail, tail, memory_order_release);
        ring_bell(s, WANT_ROOM);
    }
    s->rx_tail = tail;
    return st;
}

static int shm_progress(kolo__conn *c)
{
    if (c->error) return c->error;
    shm_priv *s = c->priv;
    int st = KOLO_OK;
    if (c->recvq) note_look(s, c->recvq); /* before this pass's own sends */
    if (c->sendq) st = progress_send(c, s);
    if (st == KOLO_OK && c->recvq) st = progress_recv(c, s);
    return st;
}

static _Atomic uint32_t *shm_doze(kolo__conn *c, uint32_t *seen)
{
    shm_priv *s = c->priv;
    if (!s) return NULL;
    uint32_t want = (c->recvq ? WANT_BYTES : 0u) | (c->sendq ? WANT_ROOM : 0u);
    atomic_store(&s->rx_ctl->asleep, want); /* seq_cst: before the caller's last poll */
    *seen = atomic_load(&s->rx_ctl->bell);
    return &s->rx_ctl->bell;
}

static void shm_awake(kolo__conn *c)
{
    shm_priv *s = c->priv;
    if (s) atomic_store_explicit(&s->rx_ctl->asleep, 0u, memory_order_relaxed);
}

/* With the way chosen per message (auto), how each size class of large messages came in, for
 * KOLO_LOG_LEVEL=debug: which way a run's messages took, without the trace level's line per
 * message (whose writing slows the messages it describes). */
static void log_ways(const shm_priv *s)
{
    char buf[512];
    size_t n = 0;
    for (int k = 0; k < SHM_CLASSES && n < sizeof buf; k++) {
        const way_choice *w = &s->cls[k];
        if (!w->got[0] && !w->got[1]) continue;
        uint64_t lo = (uint64_t)s->cma_threshold << k; /* the class's smallest message */
        int shift = lo % (1u << 20) == 0 ? 20 : lo % 1024 == 0 ? 10 : 0;
        int r = snprintf(buf + n, sizeof buf - n, "%s %llu %s%s %llu/%llu", n ? "," : "",
                         (unsigned long long)(lo >> shift), shift == 20 ? "MiB" : shift ? "KiB" : "B",
                         k == SHM_CLASSES - 1 ? " and up" : "", (unsigned long long)w->got[0],
                         (unsigned long long)w->got[1]);
        if (r < 0) break;
        n += (size_t)r;
    }
    if (n) KOLO_DEBUG("shm from rank %d, large messages by ring/single-copy per size class:%s", s->peer_rank, buf);
    if (s->called[0] || s->called[1])
        KOLO_DEBUG("shm from rank %d, large messages by ring/single-copy as 2-member calls chose: %llu/%llu",
                   s->peer_rank, (unsigned long long)s->called[0], (unsigned long long)s->called[1]);
}

static void shm_close(kolo__conn *c)
{
    shm_priv *s = c->priv;
    if (!s) return;
    if (s->adapt) log_ways(s);
    if (s->base) munmap(s->base, s->maplen);
    kolo__free(s);
    c->priv = NULL;
}

static void shm_goodbye(kolo__conn *c)
{
    shm_priv *s = c->priv;
    if (!s) return;
    atomic_store_explicit(&s->tx_ctl->closed, SHM_CLOSED, memory_order_release);
    ring_bell(s, WANT_BYTES | WANT_ROOM);
}

static bool shm_left_cleanly(kolo__conn *c)
{
    shm_priv *s = c->priv;
    return s && atomic_load_explicit(&s->rx_ctl->closed, memory_order_acquire) == SHM_CLOSED;
}

static void shm_abort(kolo__conn *c, const char *reason, uint64_t until_ns)
{
    (void)until_ns; /* the reason is in shared memory at once */
    shm_priv *s = c->priv;
    if (!s) return;
    snprintf(s->tx_ctl->reason, sizeof(s->tx_ctl->reason), "%s", reason);
    atomic_store(&s->tx_ctl->closed, SHM_ABORTED); /* seq_cst: before our user reuses buffers */
    ring_bell(s, WANT_BYTES | WANT_ROOM);
}

static bool shm_abort_reason(kolo__conn *c, char *buf, size_t cap)
{
    shm_priv *s = c->priv;
    if (!s || atomic_load(&s->rx_ctl->closed) != SHM_ABORTED) return false;
    snprintf(buf, cap, "%.*s", (int)sizeof(s->rx_ctl->reason), s->rx_ctl->reason);
    return buf[0] != '\0';
}

const kolo__transport kolo__shm_transport = {"shm",     shm_progress,     shm_close, shm_goodbye, shm_left_cleanly,
                                             shm_abort, shm_abort_reason, shm_doze,  shm_awake};

static int map_segment(kolo__conn *c, int fd, size_t ring, int creator, int populate)
{
    shm_priv *s = kolo__calloc(1, sizeof(*s));
    if (!s) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a shared-memory connection");
    s->maplen = seg_len(ring);
    s->base = mmap(NULL, s->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->base == MAP_FAILED) {
        int e = errno;
        kolo__free(s);
        return kolo__err_sys(e, "mapping %zu bytes of shared memory for rank %d", seg_len(ring), c->peer);
    }
    /* Populated as if written: MAP_POPULATE faults a shared mapping's pages in clean (no page
     * fault follows, but /proc/self/smaps shows them clean), and the first write to each clean
     * page then cost the writer about 0.5 us on this VM (the processor setting the dirty bits,
     * most likely): the first pass of a 4 MiB ring ran at half speed (4 KiB broadcasts 1.1-1.3 us
     * each until the ring first wrapped, 0.6-1.0 with this; 8 KiB 2.0-2.1 against 1.2; after the
     * wrap both 0.6). Before Linux 5.14 (no MADV_POPULATE_WRITE) every page of our own ring gets
     * one write of the zero it already holds (nobody else writes that ring, and we have not yet)
     * and the peer's ring one read. */
    if (populate && madvise(s->base, s->maplen, MADV_POPULATE_WRITE) != 0) {
        /* EINVAL: a kernel without MADV_POPULATE_WRITE, so the pages are touched below. Anything
         * else (EFAULT: a page would raise SIGBUS, /dev/shm being full) would kill this process
         * there: the pair goes by TCP instead (mesh.c) */
        int e = errno;
        if (e != EINVAL) {
            munmap(s->base, s->maplen);
            kolo__free(s);
            return kolo__err_sys(e, "faulting in %zu bytes of shared memory for rank %d (is /dev/shm full?)",
                                 seg_len(ring), c->peer);
        }
        populate = 2;
    }
    char *p = s->base;
    ring_ctl *c0 = (ring_ctl *)p, *c1 = (ring_ctl *)(p + sizeof(ring_ctl) + ring);
    char *d0 = p + sizeof(ring_ctl), *d1 = (char *)c1 + sizeof(ring_ctl);
    /* ring 0 carries creator -> opener */
    s->tx_ctl = creator ? c0 : c1;
    s->tx = creator ? d0 : d1;
    s->rx_ctl = creator ? c1 : c0;
    s->rx = creator ? d1 : d0;
    s->mask = ring - 1;
    if (populate == 2) { /* no MADV_POPULATE_WRITE: our ring written once per page, the peer's read */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (size_t off = 0; off < ring; off += page) {
            ((volatile char *)s->tx)[off] = 0;
            (void)((volatile char *)s->rx)[off];
        }
    }
    s->tx_ready = s->rx_ready = populate ? ring : 0;
    c->priv = s;
    c->tp = &kolo__shm_transport;
    return KOLO_OK;
}

static size_t ring_pow2(size_t ring)
{
    size_t r = 65536;
    while (r < ring && r < ((size_t)1 << 30)) r <<= 1;
    return r;
}

/* A segment is named in /dev/shm only from its creation to the peer's answer in the handshake
 * (mesh.c). A creator killed in between (SIGKILL from a launcher's timeout, the OOM killer)
 * leaves it behind, 8 MiB each by default: enough of them fill a container's 64 MiB /dev/shm,
 * after which every pair falls back to TCP. Two ways remove them, both only names of our form
 * ("/kolo-<pid>-<channel>-<peer>-<16 hex digits>") owned by us:
 * - the first segment a process creates first removes those whose pid no longer exists and
 *   that were untouched for STALE_S seconds (a pid of another pid namespace sharing /dev/shm
 *   looks dead from here; its handshake would have ended long before);
 * - a launcher that has just reaped a local worker removes that pid's at once
 *   (kolo__shm_remove_of(), kolorun). */
#define SHM_DIR "/dev/shm"
#define STALE_S 60

static atomic_flag swept = ATOMIC_FLAG_INIT;

/* Removes the segments of `only` (any age), or with only == 0 those of dead pids older than
 * STALE_S. Returns how many; adds their sizes to *bytes. */
static int sweep(pid_t only, long long *bytes)
{
    DIR *d = opendir(SHM_DIR);
    if (!d) return 0;
    time_t now = time(NULL);
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid, chan, peer, end = 0;
        unsigned long long nonce;
        if (sscanf(e->d_name, "kolo-%d-%d-%d-%16llx%n", &pid, &chan, &peer, &nonce, &end) != 4 ||
            e->d_name[end] != '\0' || pid <= 0)
            continue;
        if (only ? pid != only : kill(pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to ask */
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid() || (!only && now - sb.st_mtime < STALE_S))
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) != 0) continue;
        removed++;
        *bytes += (long long)sb.st_size;
        if (!only)
            KOLO_INFO("removed %s%s, left in the handshake by process %d, which died (%lld bytes)", SHM_DIR, name,
                      pid, (long long)sb.st_size);
    }
    closedir(d);
    return removed;
}

int kolo__shm_remove_of(pid_t pid, long long *bytes)
{
    long long b = 0;
    int n = pid > 0 ? sweep(pid, &b) : 0;
    if (bytes) *bytes = b;
    return n;
}

size_t kolo__shm_segment_bytes(size_t ring) { return seg_len(ring_pow2(ring)); }

static void fmt_bytes(char *out, size_t cap, unsigned long long b)
{
    if (b >= (1ull << 20)) snprintf(out, cap, "%.1f MiB", (double)b / (double)(1ull << 20));
    else snprintf(out, cap, "%llu KiB", b >> 10);
}

/* The error of a segment /dev/shm has no room for, with what it holds and how to give it more. */
static int no_room(int e, const char *name, size_t len, int peer)
{
    struct statvfs sv;
    char need[32], avail[32] = "?", size[32] = "?";
    fmt_bytes(need, sizeof(need), len);
    if (statvfs("/dev/shm", &sv) == 0) {
        fmt_bytes(avail, sizeof(avail), (unsigned long long)sv.f_bavail * sv.f_frsize);
        fmt_bytes(size, sizeof(size), (unsigned long long)sv.f_blocks * sv.f_frsize);
    }
    if (e != ENOSPC) return kolo__err_sys(e, "reserving %s of shared memory %s for rank %d", need, name, peer);
    return kolo__err(KOLO_ERR_NO_MEMORY,
                     "/dev/shm has no room for the %s of rings with rank %d (%s free of %s): give it more (docker run "
                     "--shm-size=1g; in Kubernetes an emptyDir volume of medium Memory at /dev/shm), or set "
                     "KOLO_SHM_RING_SIZE lower", need, peer, avail, size);
}

int kolo__shm_create(kolo__conn *c, char *name, size_t cap, size_t ring, int populate, int reserve)
{
    if (!atomic_flag_test_and_set(&swept)) {
        long long b = 0;
        (void)sweep(0, &b);
    }
    ring = ring_pow2(ring);
    uint64_t nonce;
    if (kolo__random_bytes(&nonce, sizeof(nonce)) != KOLO_OK) nonce = kolo__now_ns();
    snprintf(name, cap, "/kolo-%d-%d-%d-%016llx", (int)getpid(), c->mesh->channel, c->peer,
             (unsigned long long)nonce);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kolo__err_sys(errno, "shm_open(%s)", name);
    if (ftruncate(fd, (off_t)seg_len(ring)) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return kolo__err_sys(e, "sizing shared memory %s to %zu bytes (is /dev/shm full?)", name, seg_len(ring));
    }
    /* ftruncate leaves a tmpfs file's pages to its first writes, which raise SIGBUS where
     * /dev/shm has run out of room (64 MiB in a Docker container or a Kubernetes pod unless made
     * larger: 8 ranks with 2 MiB rings died at start-up there, their peers told only that they
     * hung up). Reserved now, a full /dev/shm is an error this pair survives by TCP (mesh.c). */
    int e = reserve ? posix_fallocate(fd, 0, (off_t)seg_len(ring)) : 0;
    if (e != 0) {
        close(fd);
        shm_unlink(name);
        return no_room(e, name, seg_len(ring), c->peer);
    }
    int st = map_segment(c, fd, ring, 1, populate);
    close(fd);
    if (st != KOLO_OK) {
        shm_unlink(name);
        return st;
    }
    shm_priv *s = c->priv;
    s->tx_ctl->token = nonce; /* the opener checks it to prove it mapped the same memory */
    return KOLO_OK;
}

int kolo__shm_open(kolo__conn *c, const char *name, int populate)
{
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return kolo__err_sys(errno, "shm_open(%s)", name);
    /* the creator's size, whatever this rank would have chosen: the two ranks of a pair may
     * count a host's cores differently (mesh.c takes smaller rings where ranks outnumber cores) */
    struct stat sb;
    size_t len = fstat(fd, &sb) == 0 ? (size_t)sb.st_size : 0;
    size_t ring = len > 2 * sizeof(ring_ctl) ? len / 2 - sizeof(ring_ctl) : 0;
    if (ring != ring_pow2(ring) || seg_len(ring) != len) {
        close(fd);
        return kolo__err(KOLO_ERR_PROTOCOL, "shared memory %s from rank %d has the wrong size (%zu bytes)", name,
                         c->peer, len);
    }
    int st = map_segment(c, fd, ring, 0, populate);
    close(fd);
    if (st != KOLO_OK) return st;
    /* the name embeds the creator's token: it must match what we mapped */
    shm_priv *s = c->priv;
    const char *dash = strrchr(name, '-');
    unsigned long long tok = dash ? strtoull(dash + 1, NULL, 16) : 0;
    if (s->rx_ctl->token != tok) {
        shm_close(c);
        c->tp = NULL;
        return kolo__err(KOLO_ERR_PROTOCOL, "shared memory %s does not hold rank %d's token: not the same host", name,
                         c->peer);
    }
    return KOLO_OK;
}

void kolo__shm_unlink(const char *name) { shm_unlink(name); }

void kolo__shm_enable_cma(kolo__conn *c, int peer_pid, size_t threshold, int mode)
{
    shm_priv *s = c->priv;
    s->cma_ok = 1;
    s->cma = mode == 1;
    s->adapt = mode == 2;
    s->peer_pid = peer_pid;
    s->peer_rank = c->peer;
    s->cma_threshold = threshold;
    for (int k = 0; k < SHM_CLASSES; k++) {
        s->cls[k].probe_every = PROBE_MIN_NS;
        s->cls[k].warming[0] = s->cls[k].warming[1] = 1;
    }
}

bool kolo__shm_use_cma(kolo__conn *c, bool on)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return false;
    shm_priv *s = c->priv;
    if (!s->cma_ok) return false;
    s->cma = on;
    s->adapt = 0;
    return true;
}

bool kolo__shm_pin_oversubscribed(kolo__conn *c)
{
    if (!kolo__shm_use_cma(c, false)) return false;
    ((shm_priv *)c->priv)->single_ok = 1;
    return true;
}

bool kolo__shm_pinned_oversubscribed(const kolo__conn *c)
{
    return kolo__shm_cma_state(c) == 0 && ((const shm_priv *)c->priv)->single_ok;
}

bool kolo__shm_peer_aborted(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return false;
    const shm_priv *s = c->priv;
    return atomic_load(&s->rx_ctl->closed) == SHM_ABORTED;
}

bool kolo__shm_sends_single(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return false;
    const shm_priv *s = c->priv;
    return s->cma_ok && (s->adapt || s->cma || s->single_ok);
}

uint64_t kolo__shm_far_bytes(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return 0;
    return ((const shm_priv *)c->priv)->far_bytes;
}

uint64_t kolo__shm_cma_sent(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return 0;
    return ((const shm_priv *)c->priv)->cma_sent;
}

int kolo__shm_cma_state(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return -1;
    const shm_priv *s = c->priv;
    return !s->cma_ok ? -1 : s->adapt ? 2 : s->cma;
}

/* The word: `from` << 4 | way << 2 | was. The reader of call n takes `way` from call `from` on,
 * else `was`: the publisher writes after each call, for the call after next, so the reader,
 * which reads at the start of a call and is at most one call ahead of or behind the publisher,
 * sees the word for its call or the one before it (coll_util.c, "pair"). */
void kolo__shm_publish_call_way(kolo__conn *c, int slot, uint64_t from, int way, int was)
{
    shm_priv *s = c->priv;
    if (slot < 0 || slot >= KOLO_PAIR_SLOTS) return;
    atomic_store_explicit(&s->rx_ctl->call_way[slot], from << 4 | (uint64_t)(way & 3) << 2 | (uint64_t)(was & 3),
                          memory_order_relaxed);
}

int kolo__shm_call_way(const kolo__conn *c, int slot, uint64_t call)
{
    const shm_priv *s = c->priv;
    if (slot < 0 || slot >= KOLO_PAIR_SLOTS) return KOLO_WAY_AUTO;
    uint64_t w = atomic_load_explicit(&s->tx_ctl->call_way[slot], memory_order_relaxed);
    int way = (int)(call >= w >> 4 ? w >> 2 & 3 : w & 3);
    return way <= KOLO_WAY_SINGLE ? way : KOLO_WAY_AUTO; /* a garbled word: the transport picks */
}

void kolo__shm_call_received(const kolo__conn *c, uint64_t got[2])
{
    const shm_priv *s = c->priv;
    got[0] = s ? s->called[0] : 0;
    got[1] = s ? s->called[1] : 0;
}

size_t kolo__shm_tx_filled(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return 0;
    return (size_t)((const shm_priv *)c->priv)->tx_ready;
}

size_t kolo__shm_ring_bytes(const kolo__conn *c)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return 0;
    return (size_t)((const shm_priv *)c->priv)->mask + 1;
}

size_t kolo__shm_cma_threshold(const kolo__conn *c)
{
    if (kolo__shm_cma_state(c) < 0) return 0;
    return ((const shm_priv *)c->priv)->cma_threshold;
}

void kolo__shm_large_received(const kolo__conn *c, uint64_t got[2])
{
    got[0] = got[1] = 0;
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return;
    const shm_priv *s = c->priv;
    got[0] = pair_got(s, 0);
    got[1] = pair_got(s, 1);
    if (s->deferred) got[s->deferred_way]++;
}

void kolo__shm_class_received(const kolo__conn *c, uint64_t bytes, uint64_t got[2])
{
    got[0] = got[1] = 0;
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return;
    const shm_priv *s = c->priv;
    int k = shm_class(s, bytes);
    got[0] = s->cls[k].got[0];
    got[1] = s->cls[k].got[1];
    if (s->deferred && shm_class(s, s->deferred_bytes) == k) got[s->deferred_way]++;
}

void kolo__shm_test_switch(kolo__conn *c, uint64_t bytes)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return;
    shm_priv *s = c->priv;
    s->cls[shm_class(s, bytes)].test_switch = true;
}

void kolo__shm_garble(kolo__conn *c, bool whole_frame)
{
    if (!c || c->tp != &kolo__shm_transport || !c->priv) return;
    shm_priv *s = c->priv;
    uint64_t head = s->tx_head;
    if (!whole_frame) { /* scribble on the mark the reader polls next */
        atomic_store_explicit(mark_at(s->tx, s->mask, head), 0x6761726261676521ull, memory_order_release);
        return;
    }
    /* a frame with a valid mark and a header that is not kolo's */
    unsigned char junk[KOLO_HDR_LEN];
    memset(junk, 0x5a, sizeof(junk));
    uint64_t at = head;
    tx_write(s, at + MARK_LEN, junk, sizeof(junk));
    head = at + MARK_LEN + KOLO_HDR_LEN;
    end_frame(s, &head);
    atomic_store_explicit(mark_at(s->tx, s->mask, at), at + 1, memory_order_release);
    atomic_store_explicit(&s->tx_ctl->head, head, memory_order_release);
    s->tx_head = head;
    ring_bell(s, WANT_BYTES);
}
