/* fuzz_cma.c - single-copy (CMA) descriptors from a garbled peer holding the job secret: the
 * shared-memory transport's single-copy frames (shm.c) both ways, the 2-member broadcast's split
 * (broadcast.c), where the receiver names the address the root writes its second half to, the
 * direct allreduce (direct.c) and the direct reduce-scatter (allreduce.c), where each member
 * names its buffers to the other.
 *
 * Each input is a job of 2 ranks of which rank 0, R, is real: it starts with kolo__mesh_build
 * against a real store (store.c, a fresh server on 127.0.0.1, port 0), and the harness, as rank 1
 * of R's own host (fuzz_rank.h), takes the segment R offers on both channels and passes the CMA
 * probe both ways: it reads R's probe value with process_vm_readv, and offers its own (a value
 * drawn once, at its address), which R reads. Rank 1's pid is the harness's own (getpid()): R's
 * single-copy reads and writes of "rank 1's" memory reach this process, so the harness names real
 * memory of its own. KOLO_SHM_CMA is auto (set before the first input): R then sends large
 * messages (from the pair's threshold, 32 KiB) single-copy when ring 0's want_cma word, which the
 * harness writes, asks for their size class, and the 2-member broadcast splits. Rings are 64 KiB
 * (KOLO_SHM_RING_SIZE), KOLO_OP_TIMEOUT 0.3 s. After the start-up the meshes' world flags are set
 * as kolo_init agrees them where every pair shares memory and reads single-copy (world_shm,
 * world_single, world_cma: core/kolo.c).
 *
 * Rank 1's memory, as descriptors name it: an arena of 512 KiB between two inaccessible pages
 * (PROT_NONE), a hole of 64 KiB (reserved PROT_NONE, not unmapped: a region given back could be
 * handed to the next mmap of any thread, ASan's or malloc's, and R would read or write live memory
 * through it; process_vm_readv and _writev refuse both alike, EFAULT), and addresses no process
 * has: 0, 4096, 2^47 - 4096 (the end of x86-64 user space) and 2^47, 2^48, 2^48 + 4096, 2^56, 2^63,
 * 2^64 - 4096, 2^64 - 1. The arena is refilled with a pattern at each operation; the harness keeps
 * a copy and requires that R wrote nothing of it but where the protocol lets it write. Never a
 * process not the harness's own: R writes where a descriptor says (a desc's pid may name a child
 * the harness forked, which sleeps).
 *
 * The single-copy frame (the top of shm.c, "framing", and progress_send): at a line t, the mark
 * (t + 1), the 16-byte header of every transport with flag bit 0 (single-copy; bit 1: the
 * sender's call chose the way) and the length with the call tag, then the descriptor {address,
 * length, stamp} (24 bytes, at t + 24); the frame ends at t + 64. The receiver reads the header's
 * length (which must be its own: the checks of every frame, fuzz_frames.c) from the address into
 * its own buffer with process_vm_readv, publishes its tail, then bumps the ring's acks; the sender's
 * send completes when acks reaches its descriptor's number. So, as the harness predicts it:
 *
 *   - the header as fuzz_shm.c has it: a length not R's, or a tag neither 0 nor R's: MISMATCH;
 *   - ring 1 marked aborted (closed = ABORTED, with a reason) before R reads a descriptor:
 *     PEER_LOST ("rank 1 ... aborted the job because: <reason>"), whatever the read found: a
 *     sender marks its rings aborted before its buffers go back to its user;
 *   - else, all of [address, address + L) readable in rank 1 (inside the arena; nothing at all
 *     for L = 0): R holds exactly those bytes, its tail at t + 64, ring 1's acks one more;
 *     anything else (a buffer shorter than L before the guard page, the hole, the guard before
 *     the arena, an address no process has, one that wraps past 2^64): KOLO_ERR_PROTOCOL naming
 *     rank 1. The descriptor's own length and stamp are the sender's notes: R reads what its
 *     header says (never more than R's buffer holds), and the stamp only times the way;
 *
 * and R's own single-copy frames, read by the harness as the consumer: the mark, the header
 * (flags 1, or 3 where its call chose the way), the descriptor naming R's very buffer and its
 * length; the harness reads it with process_vm_readv, moves ring 0's tail and bumps ring 0's acks
 * (or never: R waits; or by 2^32: R's sends complete from then on without their reads, which is
 * rank 1's own loss). Which way R sends (auto, shm.c progress_send): a message of L >= 32 KiB
 * whose call chose no way goes single-copy exactly when want_cma's bit of its size class (x2
 * from 32 KiB) is set; a send marked `single` (the split's first half) single-copy, flags 3; one
 * in a call that chose ring copies by ring, flags 2 (from 32 KiB); everything else by ring,
 * flags 0.
 *
 * The split (broadcast.c, split_recv and pair_root; 2 members, L >= 64 KiB, h = (L / 2) rounded
 * down to 4 KiB): the receiver sends `where` {the address of its buffer + h, L} (16 bytes), then
 * takes the first half (h bytes) as a message and `done` {e, L}. The root writes L - h bytes at
 * where's address with process_vm_writev, only where where's length is its own L (else
 * KOLO_ERR_MISMATCH at the root, after it sent done {0, L} and nothing more), and sends done with
 * the write's errno (0: written; ECANCELED where it chose ring copies, by timings, and did not
 * try), then, unless 0, the second half as a message. The receiver fails with KOLO_ERR_MISMATCH
 * where done's length is not its L, succeeds where e is 0 (trusting the root wrote), and else
 * takes the second half. These two are call-level mismatches: the pair's streams stay in step, and
 * the next operation runs on.
 *
 * The direct allreduce (direct.c; 2 members, malloc'd buffers, L from 256 KiB, member 0's choice
 * pinned direct with its test hook, as timings pick it first): each member sends the other its
 * desc and its segment's addresses (128 bytes: pid, mapped, plan, store, segments, bytes, a hash
 * of the segments' counts, regions; input and output), as a message under the allreduce's tag.
 * R's names R's own pid and buffers (checked). R then refuses, a call-level failure: bytes or
 * segments not its own, KOLO_ERR_MISMATCH; another layout, MISMATCH; a pid not rank 1's (the
 * handshake's), KOLO_ERR_PROTOCOL. Else R reads block 0 (the first L / 2 rounded up) of rank 1's
 * input with process_vm_readv, adds its own, stores the sums into its output and writes them into
 * rank 1's output with process_vm_writev; then both send their status {errno, member, wrote}
 * (12 bytes) and every member takes the first failure in member order. R's own: errno 0, or
 * EFAULT with member 1 and whether it was the write (rank 1's input not all in the arena: wrote
 * 0, nothing written; its output not: 1, a prefix may be). Rank 1 reads block 1 of R's input,
 * adds its own and writes the sums into R's output, or says so without doing it (R then holds
 * what its output held), or sends any status. R's verdict, a call-level one: its own failure,
 * KOLO_ERR_SYSTEM naming both ranks (direct.c's choice, which tests/test_coll.c holds it to); a
 * status of rank 1 naming a member not of the group (only ENOMEM may name none, -1):
 * KOLO_ERR_PROTOCOL; ENOMEM with none, KOLO_ERR_NO_MEMORY; ESRCH or ECANCELED, KOLO_ERR_PEER_LOST;
 * any other errno, KOLO_ERR_SYSTEM; none, success with the sums of block 0 and what rank 1 wrote.
 *
 * The direct reduce-scatter (allreduce.c, reducescatter_direct; 2 members, malloc'd buffers,
 * L = 256 KiB + u16 in all, block 0, L - L / 2, R's): each member sends its rs_desc {input, bytes
 * in all, a hash of the counts, pid, ok, plan} (40 bytes); R's names its own (checked), its plan
 * member 0's by timings, which may probe the ring: there rank 1 hangs up (KOLO_ERR_PEER_LOST).
 * R refuses bytes or counts not its own (MISMATCH) and a pid not rank 1's (PROTOCOL), reads block
 * 0 of rank 1's input a chunk at a time, adds its own, and both send {errno, member read} (8
 * bytes): R's own EFAULT (rank 1's input not all in the arena), KOLO_ERR_SYSTEM as the test suite
 * has it; rank 1's naming no member of the group (only ENOMEM may name none, -1), PROTOCOL; ESRCH
 * or ECANCELED naming one, PEER_LOST; else SYSTEM; none, success with the sums. R writes nothing
 * of its output past its block.
 *
 * Then R runs up to 8 operations, one at a time, each on a thread of its own (as fuzz_shm.c):
 *
 *   0 RECV   kolo__irecv and kolo__wait1 on the engine's channel: R receives one message of L;
 *   1 BCAST  kolo__coll_broadcast rooted at rank 1 on the direct channel: below 64 KiB one message,
 *            from it the split: the harness reads R's where (its address and L checked), sends the
 *            first half, then done as the input says (written rightly, or e = 0 without writing:
 *            R then holds its own bytes there; e != 0 and the second half as a message; a length
 *            not L), all by the ways the input draws; R's view of done (what the descriptor
 *            named) decides what follows;
 *   2 ROOT   kolo__coll_broadcast rooted at R: below 64 KiB R sends one message; from it the split,
 *            the harness sending where (an address in the arena, at its end so that only k bytes
 *            fit, in the hole, before the arena, or none's; L or a length off by up to 128), then
 *            reading R's first half, done and second half. Predicted: done's e 0 exactly where R's
 *            first half went single-copy (the split) and all L - h bytes at where's address are
 *            the arena's, those bytes then R's; EFAULT where part is not (the bytes before the
 *            fault may be R's: a prefix); ECANCELED by ring copies (nothing written);
 *   3 SEND   kolo__isend and kolo__wait1 on the engine's channel: R sends one message of L;
 *   4 ALLREDUCE  kolo__coll_allreduce of L uint8 by sum, out of place, L = 256 KiB + u16: the
 *            direct allreduce as above, rank 1's desc as the input says;
 *   5 RSCATTER   kolo__coll_reducescatter of L uint8 by sum (blocks L - L / 2 and L / 2), L = 256
 *            KiB + u16: the direct reduce-scatter as above.
 *
 * Where R waits (a descriptor never acked), the input's end byte: a close (FIN) or a reset of the
 * TCP sentinel, KOLO_ERR_PEER_LOST; silence, KOLO_ERR_TIMEOUT; the input ends there. A failure of
 * R's connection must name rank 1 ("rank 1 on fake1 (127.0.0.1)", or "rank(s) 1" for a timeout),
 * mark ring 0 aborted with R's message as the reason, shut R's end of the sentinel, and fail the
 * next call on the mesh at once alike. Whatever happened: R's guard bytes either side of each of
 * its buffers intact, what it sent unchanged, ring 1's head as the harness published it and its
 * acks the number of descriptors R read, the arena as the harness's copy says. After the input
 * the meshes are destroyed, no /kolo-<pid>-* segment is left in /dev/shm, and the process holds
 * exactly the descriptors it held before.
 *
 * The input: operations until it ends or R fails its connection, each:
 *   u8 op        (op & 63) % 6 the operation; L = u16 size, plus 65536 with bit 7;
 *   u16 size
 *   RECV:        a message (below);
 *   BCAST:       below 64 KiB a message; else a message (the first half), u8 done (% 4: 0 written
 *                and e = 0; 1 e = 0 unwritten; 2 e = 1 + u16, then a message, the second half;
 *                3 e = u16, the length L + i8, not 0), u16 (that u16), i8, then done as a message;
 *   ROOT, SEND:  u8 want (ring 0's want_cma), u8 ack (% 4: 0, 1 each descriptor acked; 2 never;
 *                3 acks moved by 2^32: R waits only while acks are below its descriptors); ROOT
 *                from 64 KiB: u8 where (% 5: 0 the arena at u16 % (what fits); 1 the arena's last
 *                u16 % (L - h + 1) bytes; 2 the hole + u16; 3 u16 % 4096 + 1 bytes before the
 *                arena; 4 a far address, u16 % 10), u16, u8 len (% 4: 3 L + i8, not 0, else L),
 *                i8, then where as a message;
 *   ALLREDUCE:   u8 pid (% 8: 5 the child's, 6 2^31 - 1, 7 0, else rank 1's), u8 desc (% 8: 5
 *                bytes L + 1, 6 two segments, 7 the layout's hash off by one, else right), u8
 *                input (a where kind, as ROOT's), u16, u8 output (likewise), u16, then the desc as
 *                a message; where R goes on: u8 block (% 4: 0 done rightly; 1 said done, not done;
 *                2 EFAULT reading member 0, wrote u8 & 1; 3 errno u16 with member i8, wrote u8 &
 *                1), u16, i8, u8, then the status as a message;
 *   RSCATTER:    u8 pid and u8 desc (as ALLREDUCE's, desc 6 right), u8 input (a where kind), u16,
 *                then the desc as a message; where R goes on: u8 block (% 4: 0 read rightly; 1
 *                EFAULT naming member 0; else errno u16 naming member i8), u16, i8, then the
 *                status as a message;
 *   u8 end       only where R waits (% 3): 0 a close, 1 a reset, 2 silence.
 *   A message of n bytes: u8 way (% 8): 0-1 ring copies (inline to 4096 bytes, else streamed
 *   behind the head while R reads); 2-5 single-copy, 6 single-copy with the header's length n +
 *   i8 (or, with bit 4 of misc, 2^48 + n: a tag on the engine's channel, where any tag goes), 7
 *   single-copy after ring 1 is marked aborted with a reason (a span <= 383); for single-copy:
 *   u8 where (% 6: 0 the arena at u16 % (what fits), the message there; 1 the same, the address
 *   moved by i8; 2 the message at the arena's very end, its last u16 % (n + 1) bytes readable; 3
 *   the hole + u16; 4 u16 % 4096 + 1 bytes before the arena; 5 a far address, u16 % 10), u16, i8,
 *   u8 dlen (% 4: n, n + 1, 2^48 + n, 2^64 - 1), u8 misc (& 3 the stamp: 0, now, 2^64 - 1, a second
 *   on; & 4 the call-chose flag; >> 5 into flag bits 2-4, the transport's, meaningless here);
 *   6 and 7 then their i8 and span. Past the input's end every draw is 0.
 *
 * Not reached: the direct allreduce of kolo_mem_alloc buffers (mapped: a desc claiming regions,
 * memfds R would map), of more members or several segments, and the ring or exchange its member
 * 0 takes when timings pick them (pinned direct here); the reduce-scatter's ring when member 0
 * probes it, and its prescaled or multi-chunk reads' later chunks failing; the allgather's push
 * (allgather.c: from 1 MiB, writes where the transport's address says); the probe's failure paths
 * (fuzz_mesh.c); ring copies garbled (fuzz_shm.c); the way choices' timings beyond what a
 * message's stamp and want_cma steer.
 *
 * Set KOLO_LOG_LEVEL to see R's errors, KOLO_FUZZ_VERBOSE for how each operation ended. */
#include "../../src/net/shm.c"

#include "../../src/boot/auth.h"
#include "../../src/boot/store.h"
#include "../../src/coll/coll.h"
#include "fuzz.h"

#include <pthread.h>
#include <stdarg.h>
#include <sys/prctl.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char SECRET[] = "fuzz-cma-secret";
static const char JOB[] = "fuzz-cma-job";
#define NCH KOLO_NCHANNELS
#define MAX_OPS 8
#define GUARD 64
#define ANSWER_S 5.0
#define OP_TIMEOUT "0.3"
#define RING 65536
#define THRESHOLD ((size_t)32 << 10) /* the pair's single-copy threshold under auto (mesh.c) */
#define SPLIT_MIN ((size_t)64 << 10) /* a 2-member broadcast splits from here (broadcast.c) */
#define ARENA ((size_t)512 << 10)
#define HOLE ((size_t)64 << 10)
static const char PEER[] = "rank 1 on fake1 (127.0.0.1)";

KOLO_PRINTF(1, 2) static _Noreturn void fail(const char *fmt, ...);
#define FZ_PEER "R"
#define FZ_SHM_RING
#include "fuzz_net.h"
#include "fuzz_rank.h"

enum { OP_RECV, OP_BCAST, OP_ROOT, OP_SEND, OP_ALLREDUCE, OP_RSCATTER, OP_KINDS };
static const char *const op_names[] = {"receive", "broadcast from rank 1", "broadcast from R", "send", "allreduce",
                                       "reduce-scatter"};

/* direct.c's exchange, the wire's: a member's desc and its one segment's addresses (seg_addr) */
typedef struct fz_desc {
    int32_t pid, mapped, plan, store, nseg;
    uint64_t bytes, layout;
    int32_t nreg, fd[2];
    uint64_t id[2], len[2], base[2];
    uint64_t src, dst;
    int32_t reg[2];
} fz_desc;
_Static_assert(sizeof(fz_desc) == 128, "direct.c's desc and seg_addr, as the compiler lays them out");
typedef struct fz_status {
    int32_t err, peer, wrote;
} fz_status;
/* allreduce.c's direct reduce-scatter: a member's rs_desc and rs_status */
typedef struct fz_rs_desc {
    uint64_t addr, total, layout;
    int32_t pid, ok, plan, pad;
} fz_rs_desc;
_Static_assert(sizeof(fz_rs_desc) == 40, "allreduce.c's rs_desc");
typedef struct fz_rs_status {
    int32_t err, whom;
} fz_rs_status;
#define PLAN_DIRECT_ 1
#define DIRECT_MIN ((size_t)256 << 10) /* direct by CMA from here (direct.c, CMA_MIN) */

/* addresses no process has (see the top) */
static const uint64_t FAR[] = {0,
                               4096,
                               ((uint64_t)1 << 47) - 4096,
                               (uint64_t)1 << 47,
                               (uint64_t)1 << 48,
                               ((uint64_t)1 << 48) + 4096,
                               (uint64_t)1 << 56,
                               (uint64_t)1 << 63,
                               UINT64_MAX - 4095,
                               UINT64_MAX};
#define NFAR (sizeof(FAR) / sizeof(FAR[0]))

/* ---------------------------------------------------------------- the real rank */

typedef struct rop {
    int kind, ch;
    size_t len;
    uint16_t tag;  /* R's call tag on the direct mesh; 0 on the engine's */
    uint8_t *buf;  /* GUARD + len + GUARD: what R receives into or sends */
    uint8_t *sbuf; /* ALLREDUCE: GUARD + len + GUARD, what R sends */
    uint8_t *copy; /* what R sends, to compare with afterwards */
    uint8_t *want; /* what R should hold after a receive */
    pthread_t thread;
    bool started;
    atomic_int done;
    int st;
    char msg[1024];
} rop;

/* One channel's pair as the harness holds it. */
typedef struct chan {
    int fd; /* the sentinel socket, -1 once reset */
    fz_seg s;
    uint64_t hp;    /* ring 1: where the harness's next frame starts (a line) */
    uint64_t ct;    /* ring 0: where R's next frame starts */
    uint64_t taken; /* ring 1's acks as R should have bumped them: the descriptors it read */
    uint64_t descs; /* R's descriptors on ring 0 */
    uint64_t acks;  /* ring 0's acks as the harness wrote them */
    bool aborted;   /* ring 1 marked aborted */
} chan;

static int lfd_keep, lport_keep;
static char hostkey[96];
static chan chs[NCH];
static bool verbose;
static rop *cur;
static int op_no;
static uint8_t *arena, *arena_want, *hole;
static volatile uint64_t my_probe; /* the value R reads from rank 1 in the CMA probe */
static pid_t other; /* a process of the harness's (a child that sleeps), not rank 1 */

static _Noreturn void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_cma: ");
    if (cur) fprintf(stderr, "operation %d (%s of %zu bytes): ", op_no, op_names[cur->kind], cur->len);
    vfprintf(stderr, fmt, ap);
    if (cur && atomic_load(&cur->done)) fprintf(stderr, " (R ended with %s: '%s')", kolo_strerror(cur->st), cur->msg);
    else if (cur && cur->started) fprintf(stderr, " (R is still in it)");
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void *run_op(void *arg)
{
    rop *o = arg;
    kolo__mesh *m = rr.meshes[o->ch];
    int ranks[2] = {0, 1};
    kolo__group g = {.size = 2, .rank = 0, .ranks = ranks};
    uint8_t *b = o->buf + GUARD;
    int st;
    kolo__xfer x;
    m->call_tag = o->tag;
    switch (o->kind) {
    case OP_BCAST: st = kolo__coll_broadcast(m, &g, b, o->len, 1); break;
    case OP_ROOT: st = kolo__coll_broadcast(m, &g, b, o->len, 0); break;
    case OP_ALLREDUCE:
        st = kolo__coll_allreduce(m, &g, o->sbuf + GUARD, b, o->len, KOLO_UINT8, KOLO_SUM, 1.0, 1.0);
        break;
    case OP_RSCATTER: {
        size_t counts[2] = {o->len - o->len / 2, o->len / 2};
        st = kolo__coll_reducescatter(m, &g, o->sbuf + GUARD, b, counts, KOLO_UINT8, KOLO_SUM, 1.0, 1.0);
        break;
    }
    case OP_RECV:
        kolo__irecv(m, 1, b, o->len, &x);
        st = kolo__wait1(m, &x);
        break;
    default:
        kolo__isend(m, 1, b, o->len, &x);
        st = kolo__wait1(m, &x);
        break;
    }
    m->call_tag = 0;
    o->st = st;
    snprintf(o->msg, sizeof(o->msg), "%s", st == KOLO_OK ? "" : kolo__errmsg());
    atomic_store(&o->done, 1);
    return NULL;
}

static bool r_done(void) { return cur && atomic_load(&cur->done); }

/* ---------------------------------------------------------------- the handshake */

/* Rank 1 connects to R on channel ch rightly, takes the shared memory and passes the CMA probe
 * both ways. */
static void handshake(int rport, uint32_t ch)
{
    chan *c = &chs[ch];
    uint8_t ack[W_ACK], res[W_RESULT], fin[W_FINAL];
    int fd = connect_as_rank_1(rport, ch, 0x3d, ack);
    if (r32(ack + KOLO_MAC_LEN) != 1)
        fail("channel %u: R offers no shared memory to a rank of its host (is /dev/shm full?)", ch);
    fz_take_segment(&c->s, ack + KOLO_MAC_LEN + 4, ch, RING);
    const uint8_t *probe = ack + KOLO_MAC_LEN + 4 + W_NAME;
    if (r32(probe) != (uint32_t)getpid()) fail("channel %u: R's acceptance gives pid %u", ch, r32(probe));
    uint64_t v = 0;
    struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)r64(probe + 4), sizeof(v)};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(v) || v != r64(probe + 12))
        fail("channel %u: R's probe value is not at the address it gave", ch);
    memset(res, 0, sizeof(res));
    w32(res, 1);     /* taken */
    w32(res + 4, 1); /* R's probe read */
    w64(res + 8, (uint64_t)(uintptr_t)&my_probe);
    w64(res + 16, my_probe);
    send_bytes(fd, res, sizeof(res));
    if (read_full(fd, fin, sizeof(fin), ANSWER_S) != RD_OK || r32(fin) != 1)
        fail("channel %u: R did not read rank 1's probe value", ch);
    c->fd = fd;
}

/* R started, rank 1 on its host by shared memory on both channels, single-copy both ways; the
 * world's flags as kolo_init agrees them for such a job. */
static void start(void)
{
    start_as_rank_1(lport_keep, hostkey, handshake);
    for (int ch = 0; ch < NCH; ch++) {
        kolo__conn *c = rr.meshes[ch]->conns[1];
        if (!c || c->tp != &kolo__shm_transport)
            fail("channel %d: R's connection to rank 1 is not by shared memory", ch);
        if (kolo__shm_cma_state(c) != 2 || kolo__shm_cma_threshold(c) != THRESHOLD || !kolo__shm_sends_single(c))
            fail("channel %d: R's pair with rank 1 is not single-copy by timings from %zu bytes (state %d, from %zu)",
                 ch, THRESHOLD, kolo__shm_cma_state(c), kolo__shm_cma_threshold(c));
        rr.meshes[ch]->world_shm = rr.meshes[ch]->world_single = rr.meshes[ch]->world_cma = true;
    }
}

/* ---------------------------------------------------------------- rank 1's memory */

static uint8_t pay(uint8_t seed, size_t i) { return (uint8_t)(seed * 29u + i * 131u + (i >> 8) * 7u + 1u); }

/* Whether [a, a + n) lies in the arena, the only memory of rank 1 readable and writable. */
static bool in_arena(uint64_t a, size_t n)
{
    uint64_t lo = (uint64_t)(uintptr_t)arena;
    return a >= lo && a - lo <= ARENA && n <= ARENA - (a - lo);
}

static void arena_put(size_t off, const uint8_t *p, size_t n)
{
    memcpy(arena + off, p, n);
    memcpy(arena_want + off, p, n);
}

static uint64_t arena_at(size_t off) { return (uint64_t)(uintptr_t)(arena + off); }

/* An address of rank 1 for n bytes, drawn as `kind` says (see the top: a message's where, ROOT's
 * where); the bytes p (if any) placed in the arena where the address names them. */
static uint64_t draw_addr(fz *f, int kind, const uint8_t *p, size_t n)
{
    uint16_t a = fz_u16(f);
    size_t o, k;
    switch (kind) {
    case 0:
        o = a % (ARENA - n + 1);
        if (p) arena_put(o, p, n);
        return arena_at(o);
    case 1:
        k = a % (n + 1);
        if (p) arena_put(ARENA - k, p, k);
        return arena_at(ARENA - k);
    case 2: return (uint64_t)(uintptr_t)hole + a;
    case 3: return (uint64_t)(uintptr_t)arena - (a % 4096) - 1;
    default: return FAR[a % NFAR];
    }
}

/* ---------------------------------------------------------------- writing ring 1 */

static uint64_t r_tail(const chan *c) { return atomic_load_explicit(&c->s.rxc->tail, memory_order_acquire); }

static void bell(chan *c) { fz_bell(c->s.rxc); }

/* Waits until ring 1 has room for [.., end) and the next mark's slot beside what R has not read.
 * R ending meanwhile is a finding: the harness writes only what R waits for. */
static void room(const chan *c, uint64_t end)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    for (bool ended = r_done(); end + R_MARK > r_tail(c) + c->s.size; ended = r_done()) { /* (read_r) */
        if (ended) fail("R ended before rank 1's frame, which it waits for, was written");
        if (kolo__now_ns() > deadline) fail("R read nothing of ring 1 for %g s", ANSWER_S);
        usleep(10);
    }
}

static void put_word(chan *c, uint64_t pos, uint64_t v, memory_order mo)
{
    atomic_store_explicit((_Atomic uint64_t *)(void *)(c->s.rx + (pos & (c->s.size - 1))), v, mo);
}

static void put_bytes(chan *c, uint64_t pos, const void *p, size_t n)
{
    ring_copy(c->s.rx, c->s.size, pos, (void *)(uintptr_t)p, n, true);
}

static void publish(chan *c, uint64_t head)
{
    atomic_store_explicit(&c->s.rxc->head, head, memory_order_release);
    bell(c);
}

/* A frame as shm.c's producer writes one: payload (or descriptor) and header, the next mark
 * zeroed, the mark, the head. A streamed payload (over 4096 bytes) goes behind the head as R
 * makes room, a step at a time, the next mark zeroed before the last step is published. */
static void put_ring(chan *c, const uint8_t h[F_HDR], const uint8_t *p, size_t n)
{
    uint64_t t = c->hp;
    if (n <= R_INLINE) {
        uint64_t end = pad(t + R_MARK + F_HDR + n);
        room(c, end);
        put_bytes(c, t + R_MARK + F_HDR, p, n);
        put_bytes(c, t + R_MARK, h, F_HDR);
        put_word(c, end, 0, memory_order_relaxed);
        put_word(c, t, t + 1, memory_order_release);
        publish(c, end);
        c->hp = end;
        return;
    }
    uint64_t at = t + R_LINE, end = pad(at + n), zero = 0;
    room(c, at);
    put_bytes(c, t + R_MARK, h, F_HDR);
    put_bytes(c, t + R_MARK + F_HDR, &zero, sizeof(zero)); /* no stamp */
    put_word(c, t, t + 1, memory_order_release);
    publish(c, at);
    for (size_t k = 0; k < n;) {
        uint64_t pos = at + k;
        room(c, pos + 2 * R_LINE + 1); /* a byte, the frame's end and the next mark beside it */
        uint64_t free_to = r_tail(c) + c->s.size - 2 * R_LINE - R_MARK; /* once: KOLO_MIN reads twice */
        size_t m = (size_t)KOLO_MIN((uint64_t)(n - k), free_to - pos);
        put_bytes(c, pos, p + k, m);
        k += m;
        if (k == n) put_word(c, end, 0, memory_order_relaxed);
        publish(c, k == n ? end : at + k);
    }
    c->hp = end;
}

static void put_desc(chan *c, const uint8_t h[F_HDR], uint64_t addr, uint64_t dlen, uint64_t stamp)
{
    uint64_t t = c->hp, end = t + R_LINE;
    uint8_t d[R_DESC];
    w64(d, addr);
    w64(d + 8, dlen);
    w64(d + 16, stamp);
    room(c, end);
    put_bytes(c, t + R_MARK, h, F_HDR);
    put_bytes(c, t + R_MARK + F_HDR, d, R_DESC);
    put_word(c, end, 0, memory_order_relaxed);
    put_word(c, t, t + 1, memory_order_release);
    publish(c, end);
    c->hp = end;
}

/* Waits until R has read all the harness wrote, or ended: the arena is not changed under a
 * descriptor R has yet to read. */
static void taken(const chan *c)
{
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    while (r_tail(c) < c->hp && !r_done())
        if (kolo__now_ns() > deadline) fail("R did not read rank 1's frame within %g s", ANSWER_S);
        else usleep(10);
}

/* How a receive of n bytes under call tag mine judges a header's length field (fuzz_frames.c):
 * KOLO_OK or KOLO_ERR_MISMATCH. */
static int hdr_verdict(uint64_t field, uint16_t mine, size_t n)
{
    uint16_t theirs = (uint16_t)(field >> F_LEN_BITS);
    if (theirs && mine && theirs != mine) return KOLO_ERR_MISMATCH;
    return (field & (((uint64_t)1 << F_LEN_BITS) - 1)) == n ? KOLO_OK : KOLO_ERR_MISMATCH;
}

/* Sends R the n bytes p as one message, the way the input draws (see the top), and predicts what
 * R makes of it: KOLO_OK, R then holding got[0..n) (p, or the arena's bytes where a moved address
 * points), or the status R fails its connection with. Returns once R has read it (or ended). */
static int send_msg(fz *f, chan *c, uint16_t tag, const uint8_t *p, size_t n, uint8_t *got)
{
    uint8_t way = fz_u8(f) % 8, h[F_HDR];
    uint64_t field = n | (uint64_t)tag << F_LEN_BITS;
    w32(h, F_MAGIC);
    w32(h + 4, 0);
    w64(h + 8, field);
    if (way < 2) {
        put_ring(c, h, p, n);
        memcpy(got, p, n);
        taken(c);
        return KOLO_OK;
    }
    int kind = fz_u8(f) % 6;
    uint64_t addr = draw_addr(f, kind == 1 ? 0 : kind > 1 ? kind - 1 : 0, p, n);
    int8_t d = (int8_t)fz_u8(f);
    if (kind == 1) addr += (uint64_t)(int64_t)d;
    uint8_t dl = fz_u8(f) % 4, misc = fz_u8(f);
    uint64_t dlen = dl == 0 ? n : dl == 1 ? n + 1 : dl == 2 ? ((uint64_t)1 << 48) + n : UINT64_MAX;
    uint64_t now = kolo__now_ns();
    uint64_t stamp = (misc & 3) == 0 ? 0 : (misc & 3) == 1 ? now : (misc & 3) == 2 ? UINT64_MAX : now + 1000000000u;
    w32(h + 4, R_CMA | (misc & 4 ? R_CALL : 0u) | (uint32_t)(misc >> 5) << 2);
    if (way == 6) {
        int8_t e = (int8_t)fz_u8(f);
        field = misc & 16 ? ((uint64_t)1 << F_LEN_BITS) + n : n + (uint64_t)(int64_t)(e ? e : 1);
        if (misc & 16) field |= (uint64_t)tag << F_LEN_BITS;
        w64(h + 8, field);
    }
    if (way == 7) {
        size_t k;
        const uint8_t *x = fz_span(f, F_REASON_MAX - 1, &k);
        memcpy(c->s.rxc->reason, x, k);
        memset(c->s.rxc->reason + k, 0, F_REASON_MAX - k);
        atomic_store(&c->s.rxc->closed, R_ABORTED);
        c->aborted = true;
    }
    int st = hdr_verdict(field, tag, n);
    if (st == KOLO_OK && c->aborted) st = KOLO_ERR_PEER_LOST;
    else if (st == KOLO_OK && n && !in_arena(addr, n)) st = KOLO_ERR_PROTOCOL;
    if (st == KOLO_OK) {
        if (n) memcpy(got, arena_want + (addr - (uint64_t)(uintptr_t)arena), n);
        c->taken++;
    }
    put_desc(c, h, addr, dlen, stamp);
    taken(c);
    return st;
}

/* ---------------------------------------------------------------- reading ring 0 */

static uint64_t tx_word(const chan *c, uint64_t pos)
{
    return atomic_load_explicit((_Atomic uint64_t *)(void *)(c->s.tx + (pos & (c->s.size - 1))),
                                memory_order_acquire);
}

static void set_tx_tail(chan *c, uint64_t v)
{
    atomic_store_explicit(&c->s.txc->tail, v, memory_order_release);
    bell(c); /* R sleeps on ring 1's doorbell for room too (shm.c, "Sleeping") */
}

enum { ACK_RIGHT, ACK_RIGHT2, ACK_NEVER, ACK_FAR };
#define FLAGS_SPLIT (-1) /* the split's first half: single-copy (3) or, by ring copies chosen, 2 */

/* R's next frame on ring 0: n bytes under its call tag, with flags `flags` (FLAGS_SPLIT: 3 or 2,
 * which *got_flags tells), carrying `mine` (R's buffer: a descriptor must name it), read into
 * out, single-copy where it is a descriptor (acked as `ack` says). False where R now waits for an
 * ack that never comes: ring 0's acks are below the number of R's descriptors. */
static bool read_r(chan *c, uint16_t tag, size_t n, int flags, const uint8_t *mine, uint8_t *out, int ack,
                   uint32_t *got_flags)
{
    uint64_t t = c->ct, deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9), m;
    /* R may end right after it published its frame (a send complete once written): whether it had
     * ended is read before the mark, so that an end found has its frame in sight */
    bool ended = r_done();
    while ((m = tx_word(c, t)) != t + 1) {
        if (m != 0) fail("R's frame at %llu has the mark %#llx", (unsigned long long)t, (unsigned long long)m);
        if (ended) fail("R ended without its frame of %zu bytes", n);
        ended = r_done();
        if (kolo__now_ns() > deadline) fail("no frame of %zu bytes from R within %g s", n, ANSWER_S);
        usleep(10);
    }
    uint8_t h[F_HDR];
    ring_copy(c->s.tx, c->s.size, t + R_MARK, h, F_HDR, false);
    uint32_t fl = r32(h + 4);
    uint64_t want = n | (uint64_t)tag << F_LEN_BITS;
    bool ok_flags = flags == FLAGS_SPLIT ? fl == (R_CMA | R_CALL) || fl == R_CALL : fl == (uint32_t)flags;
    if (r32(h) != F_MAGIC || !ok_flags || r64(h + 8) != want)
        fail("R's frame begins 0x%08x, flags 0x%x, length field 0x%016llx; the protocol says 0x%08x, %s0x%x, 0x%016llx",
             r32(h), fl, (unsigned long long)r64(h + 8), F_MAGIC, flags == FLAGS_SPLIT ? "3 or " : "",
             flags == FLAGS_SPLIT ? R_CALL : (uint32_t)flags, (unsigned long long)want);
    *got_flags = fl;
    if (fl & R_CMA) {
        uint8_t d[R_DESC];
        ring_copy(c->s.tx, c->s.size, t + R_MARK + F_HDR, d, R_DESC, false);
        if (r64(d) != (uint64_t)(uintptr_t)mine || r64(d + 8) != n)
            fail("R's descriptor names %zu bytes at %#llx (length %llu), not its buffer of %zu at %p", n,
                 (unsigned long long)r64(d), (unsigned long long)r64(d + 8), n, (const void *)mine);
        if (n) {
            struct iovec l = {out, n}, r = {(void *)(uintptr_t)r64(d), n};
            if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)n)
                fail("R's buffer cannot be read single-copy: %s", strerror(errno));
        }
        c->ct = t + R_LINE;
        set_tx_tail(c, c->ct);
        c->descs++;
        if (ack != ACK_NEVER) {
            c->acks += ack == ACK_FAR ? (uint64_t)1 << 32 : 1;
            atomic_store_explicit(&c->s.txc->acks, c->acks, memory_order_release);
            bell(c);
        }
        if (c->acks < c->descs) return false; /* (acks moved far ahead complete it all the same) */
    } else if (n <= R_INLINE) {
        ring_copy(c->s.tx, c->s.size, t + R_MARK + F_HDR, out, n, false);
        c->ct = pad(t + R_MARK + F_HDR + n);
        set_tx_tail(c, c->ct);
    } else {
        uint64_t at = t + R_LINE;
        size_t got = 0;
        while (got < n) {
            ended = r_done(); /* before the head, as for the mark */
            uint64_t hd = atomic_load_explicit(&c->s.txc->head, memory_order_acquire);
            if (hd > at + got && hd - (at + got) <= c->s.size) {
                size_t k = (size_t)KOLO_MIN(hd - (at + got), (uint64_t)(n - got));
                ring_copy(c->s.tx, c->s.size, at + got, out + got, k, false);
                got += k;
                set_tx_tail(c, at + got);
                continue;
            }
            if (ended) fail("R ended with %zu of its %zu bytes streamed", got, n);
            if (kolo__now_ns() > deadline) fail("R streamed %zu of its %zu bytes in %g s", got, n, ANSWER_S);
            usleep(10);
        }
        c->ct = pad(at + n);
        set_tx_tail(c, c->ct);
    }
    if (mine && memcmp(out, mine, n) != 0) fail("R's frame does not carry its %zu bytes", n);
    return true;
}

/* The flags of R's message of n bytes whose call chose no way (see the top). */
static int plain_flags(const chan *c, size_t n)
{
    if (n < THRESHOLD) return 0;
    int k = 0;
    for (size_t b = n / THRESHOLD; b >= 2 && k < SHM_CLASSES - 1; b /= 2) k++;
    return (int)((atomic_load(&c->s.txc->want_cma) >> k) & 1u);
}

/* ---------------------------------------------------------------- one operation */

static size_t split_at(size_t n) { return (n / 2) & ~(size_t)4095; }

static rop *op_new(int kind, size_t len)
{
    rop *o = calloc(1, sizeof(*o));
    if (!o) fail("no memory");
    o->kind = kind;
    o->ch = kind == OP_RECV || kind == OP_SEND ? KOLO_CHANNEL_ENGINE : KOLO_CHANNEL_DIRECT;
    o->len = len;
    o->buf = malloc(len + 2 * GUARD);
    o->sbuf = malloc(len + 2 * GUARD);
    o->copy = malloc(len + 1);
    o->want = malloc(len + 1);
    if (!o->buf || !o->sbuf || !o->copy || !o->want) fail("no memory");
    bool sends = kind == OP_ROOT || kind == OP_SEND;
    uint8_t *sent = kind == OP_ALLREDUCE || kind == OP_RSCATTER ? o->sbuf : o->buf;
    memset(o->buf, 0xa5, len + 2 * GUARD);
    memset(o->sbuf, 0xa5, len + 2 * GUARD);
    for (size_t i = 0; i < len; i++) {
        o->buf[GUARD + i] = sends ? pay((uint8_t)(op_no + 100), i) : 0x5a;
        o->sbuf[GUARD + i] = pay((uint8_t)(op_no + 200), i);
    }
    memcpy(o->copy, sent + GUARD, len);
    memcpy(o->want, o->buf + GUARD, len);
    o->tag = kind == OP_BCAST       ? kolo__call_tag(KOLO_CALL_BROADCAST, KOLO_UINT8, -1, 1)
             : kind == OP_ROOT      ? kolo__call_tag(KOLO_CALL_BROADCAST, KOLO_UINT8, -1, 0)
             : kind == OP_ALLREDUCE ? kolo__call_tag(KOLO_CALL_ALLREDUCE, KOLO_UINT8, KOLO_SUM, 0)
             : kind == OP_RSCATTER  ? kolo__call_tag(KOLO_CALL_REDUCESCATTER, KOLO_UINT8, KOLO_SUM, 0)
                                    : 0;
    return o;
}

static void op_free(rop *o)
{
    free(o->buf);
    free(o->sbuf);
    free(o->copy);
    free(o->want);
    free(o);
}

static void join_op(rop *o, double within_s) { fz_join_op(&o->done, o->thread, within_s); }

/* The prediction: R's status, and whether R failed its connection (told rank 1) or the call. */
typedef struct pred {
    int st;
    bool call; /* a call-level mismatch: the connection goes on */
    bool wait; /* R waits for rank 1: the end byte decides */
} pred;

/* BCAST: R receives L from rank 1 (see the top). */
static pred op_bcast(fz *f, chan *c, rop *o)
{
    size_t n = o->len, h = split_at(n);
    uint8_t *p = malloc(n + 1);
    if (!p) fail("no memory");
    for (size_t i = 0; i < n; i++) p[i] = pay((uint8_t)op_no, i);
    pred pr = {KOLO_OK, false, false};
    if (n < SPLIT_MIN) {
        pr.st = send_msg(f, c, o->tag, p, n, o->want);
        free(p);
        return pr;
    }
    uint8_t where[16], got[16];
    uint32_t fl;
    read_r(c, o->tag, sizeof(where), 0, NULL, where, ACK_RIGHT, &fl);
    if (r64(where) != (uint64_t)(uintptr_t)(o->buf + GUARD + h) || r64(where + 8) != n)
        fail("R's where reads %#llx, %llu; the protocol says its buffer + %zu, %zu", (unsigned long long)r64(where),
             (unsigned long long)r64(where + 8), h, n);
    if ((pr.st = send_msg(f, c, o->tag, p, h, o->want)) != KOLO_OK) goto out;
    int how = fz_u8(f) % 4;
    uint16_t e = fz_u16(f);
    int8_t d = (int8_t)fz_u8(f);
    uint64_t done[2] = {how < 2 ? 0 : how == 2 ? 1u + e : e, how == 3 ? n + (uint64_t)(int64_t)(d ? d : 1) : n};
    if (how == 0) {
        struct iovec l = {p + h, n - h}, r = {(void *)(uintptr_t)r64(where), n - h};
        if (process_vm_writev(getpid(), &l, 1, &r, 1, 0) != (ssize_t)(n - h))
            fail("R's buffer cannot be written single-copy: %s", strerror(errno));
        memcpy(o->want + h, p + h, n - h);
    }
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)done, sizeof(done), got)) != KOLO_OK) goto out;
    /* what R read decides (a moved address shows it other bytes than the harness meant) */
    if (r64(got + 8) != n) {
        pr.st = KOLO_ERR_MISMATCH;
        pr.call = true;
    } else if (r64(got) != 0) {
        pr.st = send_msg(f, c, o->tag, p + h, n - h, o->want + h);
    }
out:
    free(p);
    return pr;
}

/* Where R, the root of a split, may write into rank 1's memory: n bytes src at `at` (n 0: none). */
static struct {
    uint64_t at;
    size_t n;
    const uint8_t *src;
} may;

/* What R wrote of the arena at may.at: all of its second half (`whole`), or what it wrote before
 * a fault (a prefix; or nothing, where R still waits for an ack and its write may not have run). */
static void written(bool whole)
{
    if (!may.n || !in_arena(may.at, 0)) {
        may.n = 0;
        return;
    }
    size_t off = (size_t)(may.at - arena_at(0)), k = KOLO_MIN(may.n, ARENA - off);
    for (size_t i = 0; i < k; i++) {
        if (arena[off + i] == may.src[i]) continue;
        if (whole || arena[off + i] != arena_want[off + i])
            fail("the arena's byte %zu at where + %zu is %u, neither R's nor what it held", off + i, i, arena[off + i]);
    }
    memcpy(arena_want + off, arena + off, k);
    may.n = 0;
}

/* ROOT and SEND: R sends L (see the top). */
static pred op_sends(fz *f, chan *c, rop *o, int ack)
{
    size_t n = o->len, h = split_at(n), w = n - h;
    const uint8_t *mine = o->buf + GUARD;
    uint8_t *out = malloc(n + 1);
    if (!out) fail("no memory");
    pred pr = {KOLO_OK, false, false};
    uint32_t fl;
    if (o->kind == OP_SEND || n < SPLIT_MIN) {
        pr.wait = !read_r(c, o->tag, n, plain_flags(c, n), mine, out, ack, &fl);
        goto out;
    }
    int wk = fz_u8(f) % 5;
    uint64_t where[2], wv[2];
    where[0] = draw_addr(f, wk, NULL, w);
    uint8_t wl = fz_u8(f) % 4;
    int8_t d = (int8_t)fz_u8(f);
    where[1] = wl == 3 ? n + (uint64_t)(int64_t)(d ? d : 1) : n;
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)where, sizeof(where), (uint8_t *)wv)) != KOLO_OK) goto out;
    /* R's first half went out before it read where: single-copy (the split) or by ring copies */
    bool acked = read_r(c, o->tag, h, FLAGS_SPLIT, mine, out, ack, &fl), split = fl & R_CMA;
    if (split) { /* R may write its second half there once it has read where */
        may.at = wv[0];
        may.n = wv[1] == n ? w : 0;
        may.src = mine + h;
    }
    if (!acked) {
        pr.wait = true;
        goto out;
    }
    uint8_t done[16];
    read_r(c, o->tag, sizeof(done), 0, NULL, done, ack, &fl);
    uint64_t e = r64(done);
    if (r64(done + 8) != n) fail("R's done gives the length %llu, not its %zu", (unsigned long long)r64(done + 8), n);
    if (wv[1] != n) {
        if (e != 0) fail("R, refusing where's length %llu, says it wrote with errno %llu", (unsigned long long)wv[1],
                         (unsigned long long)e);
        pr.st = KOLO_ERR_MISMATCH;
        pr.call = true;
        goto out;
    }
    bool writable = in_arena(wv[0], w);
    if (!split && e != ECANCELED) fail("R chose ring copies but its done says errno %llu", (unsigned long long)e);
    if (split && (e == 0) != writable)
        fail("R's write of %zu bytes at %#llx ended with errno %llu, where the arena %s them", w,
             (unsigned long long)wv[0], (unsigned long long)e, writable ? "holds" : "does not hold");
    if (split) written(e == 0);
    if (e != 0 && !read_r(c, o->tag, w, split ? plain_flags(c, w) : (int)R_CALL, mine + h, out, ack, &fl))
        pr.wait = true;
out:
    free(out);
    return pr;
}

/* ALLREDUCE: R runs the direct allreduce with rank 1 (see the top). */
static pred op_allreduce(fz *f, chan *c, rop *o)
{
    size_t n = o->len, c0 = n / 2 + n % 2, c1 = n / 2; /* block 0 is R's, block 1 rank 1's */
    size_t count = n;
    uint64_t layout = kolo__fnv1a(&count, sizeof(count));
    pred pr = {KOLO_OK, true, false};
    uint8_t raw[sizeof(fz_desc)];
    uint32_t fl;
    read_r(c, o->tag, sizeof(raw), 0, NULL, raw, ACK_RIGHT, &fl);
    fz_desc r, me, v;
    memcpy(&r, raw, sizeof(r));
    if (r.pid != (int32_t)getpid() || r.mapped || r.plan != PLAN_DIRECT_ || r.nseg != 1 || r.bytes != n ||
        r.layout != layout || r.nreg != 0 || r.src != (uint64_t)(uintptr_t)(o->sbuf + GUARD) ||
        r.dst != (uint64_t)(uintptr_t)(o->buf + GUARD) || r.reg[0] != -1 || r.reg[1] != -1)
        fail("R's desc reads pid %d, mapped %d, plan %d, %d segments, %llu bytes, src %#llx, dst %#llx: not its own",
             r.pid, r.mapped, r.plan, r.nseg, (unsigned long long)r.bytes, (unsigned long long)r.src,
             (unsigned long long)r.dst);
    uint8_t *p = malloc(n), *sums = malloc(c0 + 1);
    if (!p || !sums) fail("no memory");
    for (size_t i = 0; i < n; i++) p[i] = pay((uint8_t)op_no, i);
    memset(&me, 0, sizeof(me));
    me.nseg = 1;
    me.bytes = n;
    me.layout = layout;
    me.reg[0] = me.reg[1] = -1;
    int pk = fz_u8(f) % 8, mk = fz_u8(f) % 8;
    me.pid = pk == 5 ? (int32_t)other : pk == 6 ? INT32_MAX : pk == 7 ? 0 : (int32_t)getpid();
    if (mk == 5) me.bytes = n + 1;
    if (mk == 6) me.nseg = 2;
    if (mk == 7) me.layout ^= 1;
    int sk = fz_u8(f) % 5;
    me.src = draw_addr(f, sk, p, c0);
    int dk = fz_u8(f) % 5;
    me.dst = draw_addr(f, dk, NULL, c0);
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)&me, sizeof(me), (uint8_t *)&v)) != KOLO_OK) {
        pr.call = false;
        goto out;
    }
    /* what R read decides */
    if (v.bytes != n || v.nseg != 1 || v.layout != layout) {
        pr.st = KOLO_ERR_MISMATCH;
        goto out;
    }
    if (v.pid != (int32_t)getpid()) { /* a desc of another process's buffers */
        pr.st = KOLO_ERR_PROTOCOL;
        goto out;
    }
    /* R reads block 0 of rank 1's input, and writes the sums into rank 1's output */
    bool rd = in_arena(v.src, c0), wr = in_arena(v.dst, c0);
    if (rd)
        for (size_t i = 0; i < c0; i++)
            sums[i] = (uint8_t)(o->sbuf[GUARD + i] + arena_want[v.src - arena_at(0) + i]);
    fz_status rs, hs, sv;
    read_r(c, o->tag, sizeof(rs), 0, NULL, (uint8_t *)&rs, ACK_RIGHT, &fl);
    fz_status want_rs = {rd && wr ? 0 : EFAULT, rd && wr ? -1 : 1, rd && !wr};
    if (memcmp(&rs, &want_rs, sizeof(rs)) != 0)
        fail("R's status reads errno %d, member %d, wrote %d; the protocol says %d, %d, %d", rs.err, rs.peer, rs.wrote,
             want_rs.err, want_rs.peer, want_rs.wrote);
    if (rd) {
        may.at = v.dst;
        may.n = c0;
        may.src = sums;
        written(wr);
        memcpy(o->want, sums, c0);
    }
    /* rank 1's block, as the input says */
    int hb = fz_u8(f) % 4;
    uint16_t e = fz_u16(f);
    int8_t who = (int8_t)fz_u8(f);
    uint8_t wrote = fz_u8(f) & 1;
    hs = (fz_status){0, -1, 0};
    if (hb == 0) {
        uint8_t *in1 = malloc(c1 + 1);
        if (!in1) fail("no memory");
        struct iovec l = {in1, c1}, rr1 = {(void *)(uintptr_t)(r.src + c0), c1};
        if (c1 && process_vm_readv(getpid(), &l, 1, &rr1, 1, 0) != (ssize_t)c1)
            fail("R's input cannot be read single-copy: %s", strerror(errno));
        for (size_t i = 0; i < c1; i++) in1[i] = (uint8_t)(in1[i] + p[c0 + i]);
        struct iovec w1 = {(void *)(uintptr_t)(r.dst + c0), c1};
        if (c1 && process_vm_writev(getpid(), &l, 1, &w1, 1, 0) != (ssize_t)c1)
            fail("R's output cannot be written single-copy: %s", strerror(errno));
        memcpy(o->want + c0, in1, c1);
        free(in1);
    } else if (hb == 2) {
        hs = (fz_status){EFAULT, 0, wrote};
    } else if (hb == 3) {
        hs = (fz_status){(int32_t)e, who, wrote};
    }
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)&hs, sizeof(hs), (uint8_t *)&sv)) != KOLO_OK) {
        pr.call = false;
        goto out;
    }
    /* the first failure in member order, R's own first (see the top) */
    if (rs.err) pr.st = KOLO_ERR_SYSTEM;
    else if (!sv.err) pr.st = KOLO_OK;
    else if (!((sv.peer >= 0 && sv.peer < 2) || (sv.peer == -1 && sv.err == ENOMEM))) pr.st = KOLO_ERR_PROTOCOL;
    else if (sv.err == ENOMEM && sv.peer < 0) pr.st = KOLO_ERR_NO_MEMORY;
    else if (sv.err == ESRCH || sv.err == ECANCELED) pr.st = KOLO_ERR_PEER_LOST;
    else pr.st = KOLO_ERR_SYSTEM;
out:
    free(p);
    free(sums);
    return pr;
}

/* RSCATTER: R runs the direct reduce-scatter with rank 1 (see the top). */
static pred op_rscatter(fz *f, chan *c, rop *o)
{
    size_t n = o->len, c0 = n - n / 2, c1 = n / 2, counts[2] = {c0, c1};
    uint64_t layout = kolo__fnv1a(counts, sizeof(counts));
    pred pr = {KOLO_OK, true, false};
    fz_rs_desc r, me, v;
    fz_rs_status rs, hs, sv;
    uint32_t fl;
    read_r(c, o->tag, sizeof(r), 0, NULL, (uint8_t *)&r, ACK_RIGHT, &fl);
    if (r.addr != (uint64_t)(uintptr_t)(o->sbuf + GUARD) || r.total != n || r.layout != layout ||
        r.pid != (int32_t)getpid() || r.ok != 1 || (r.plan != 0 && r.plan != 1))
        fail("R's desc reads input %#llx, %llu bytes, pid %d, ok %d, plan %d: not its own", (unsigned long long)r.addr,
             (unsigned long long)r.total, r.pid, r.ok, r.plan);
    if (r.plan == 0) { /* member 0 probes the ring, by timings: rank 1 hangs up instead */
        shutdown(c->fd, SHUT_WR);
        pr = (pred){KOLO_ERR_PEER_LOST, false, false};
        return pr;
    }
    uint8_t *p = malloc(n);
    if (!p) fail("no memory");
    for (size_t i = 0; i < n; i++) p[i] = pay((uint8_t)op_no, i);
    int pk = fz_u8(f) % 8, mk = fz_u8(f) % 8;
    me = (fz_rs_desc){.total = n, .layout = layout, .ok = 1, .plan = 1};
    me.pid = pk == 5 ? (int32_t)other : pk == 6 ? INT32_MAX : pk == 7 ? 0 : (int32_t)getpid();
    if (mk == 5) me.total = n + 1;
    if (mk == 7) me.layout ^= 1;
    me.addr = draw_addr(f, fz_u8(f) % 5, p, c0);
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)&me, sizeof(me), (uint8_t *)&v)) != KOLO_OK) {
        pr.call = false;
        goto out;
    }
    if (v.total != n || v.layout != layout) {
        pr.st = KOLO_ERR_MISMATCH;
        goto out;
    }
    if (!v.ok) fail("a moved desc declines the direct reduce-scatter: unpredicted");
    if (v.pid != (int32_t)getpid()) {
        pr.st = KOLO_ERR_PROTOCOL;
        goto out;
    }
    /* R reads its block of rank 1's input (block 0), a chunk at a time, and adds its own */
    bool rd = in_arena(v.addr, c0);
    for (size_t i = 0; rd && i < c0; i++)
        o->want[i] = (uint8_t)(o->sbuf[GUARD + i] + arena_want[v.addr - arena_at(0) + i]);
    read_r(c, o->tag, sizeof(rs), 0, NULL, (uint8_t *)&rs, ACK_RIGHT, &fl);
    if (rs.err != (rd ? 0 : EFAULT) || rs.whom != (rd ? -1 : 1))
        fail("R's status reads errno %d, member %d; the protocol says %d, %d", rs.err, rs.whom, rd ? 0 : EFAULT,
             rd ? -1 : 1);
    int hb = fz_u8(f) % 4;
    uint16_t e = fz_u16(f);
    int8_t whom = (int8_t)fz_u8(f);
    hs = hb == 0 ? (fz_rs_status){0, -1} : hb == 1 ? (fz_rs_status){EFAULT, 0} : (fz_rs_status){(int32_t)e, whom};
    if (hb == 0) { /* rank 1's block of R's input, read as the protocol has it (its sums are its own) */
        uint8_t *in1 = malloc(c1 + 1);
        if (!in1) fail("no memory");
        struct iovec l = {in1, c1}, rr1 = {(void *)(uintptr_t)(r.addr + c0), c1};
        if (c1 && process_vm_readv(getpid(), &l, 1, &rr1, 1, 0) != (ssize_t)c1)
            fail("R's input cannot be read single-copy: %s", strerror(errno));
        free(in1);
    }
    if ((pr.st = send_msg(f, c, o->tag, (const uint8_t *)&hs, sizeof(hs), (uint8_t *)&sv)) != KOLO_OK) {
        pr.call = false;
        goto out;
    }
    /* the first failure in member order, R's own first */
    if (rs.err) pr.st = KOLO_ERR_SYSTEM;
    else if (!sv.err) pr.st = KOLO_OK;
    else if (!((sv.whom >= 0 && sv.whom < 2) || (sv.whom == -1 && sv.err == ENOMEM))) pr.st = KOLO_ERR_PROTOCOL;
    else if ((sv.err == ESRCH || sv.err == ECANCELED) && sv.whom >= 0) pr.st = KOLO_ERR_PEER_LOST;
    else pr.st = KOLO_ERR_SYSTEM;
out:
    free(p);
    return pr;
}

/* R wrote nothing but its own: its guards, what it sends, ring 1's head and acks, the arena. */
static void check_bounds(const rop *o, const chan *c)
{
    for (size_t i = 0; i < GUARD; i++)
        if (o->buf[i] != 0xa5 || o->buf[GUARD + o->len + i] != 0xa5)
            fail("R wrote %s its buffer (guard byte %zu)", o->buf[i] != 0xa5 ? "before" : "past", i);
    for (size_t i = 0; i < GUARD; i++)
        if (o->sbuf[i] != 0xa5 || o->sbuf[GUARD + o->len + i] != 0xa5)
            fail("R wrote around its input (guard byte %zu)", i);
    bool two = o->kind == OP_ALLREDUCE || o->kind == OP_RSCATTER; /* an input and an output */
    if ((o->kind == OP_ROOT || o->kind == OP_SEND || two) && memcmp((two ? o->sbuf : o->buf) + GUARD, o->copy, o->len))
        fail("R changed what it sent");
    for (size_t i = o->len - o->len / 2; o->kind == OP_RSCATTER && i < o->len; i++)
        if (o->buf[GUARD + i] != 0x5a) fail("R wrote byte %zu of its output, past its block", i);
    if (atomic_load(&c->s.rxc->head) != c->hp) fail("ring 1's head is not what the harness wrote: R wrote there");
    if (atomic_load(&c->s.rxc->acks) != c->taken)
        fail("ring 1's acks read %llu, the descriptors R read %llu", (unsigned long long)atomic_load(&c->s.rxc->acks),
             (unsigned long long)c->taken);
    if (memcmp(arena, arena_want, ARENA) != 0) fail("R wrote into rank 1's memory where no descriptor let it");
}

static void check_told(const rop *o, chan *c) { fz_check_told(c->s.txc, c->fd, rr.meshes[o->ch], o->st, o->msg); }

/* Whether msg holds `who` not followed by a digit (rank 1, not rank 10). */
static bool names(const char *msg, const char *who)
{
    for (const char *p = msg; (p = strstr(p, who)) != NULL; p++)
        if (p[strlen(who)] < '0' || p[strlen(who)] > '9') return true;
    return false;
}

static bool one_op(fz *f)
{
    uint8_t sel = fz_u8(f);
    int kind = (sel & 0x3f) % OP_KINDS;
    size_t len = fz_u16(f) + (sel & 0x80 ? 65536u : 0u);
    if (kind == OP_ALLREDUCE || kind == OP_RSCATTER) len = DIRECT_MIN + len % 65536;
    rop *o = op_new(kind, len);
    cur = o;
    chan *c = &chs[o->ch];
    /* rank 1's memory afresh: a pattern of this operation's */
    for (size_t i = 0; i < ARENA; i++) arena[i] = (uint8_t)(i * 7u + (i >> 9) + (unsigned)op_no * 13u + 5u);
    memcpy(arena_want, arena, ARENA);
    may.n = 0;
    int ack = 0;
    if (kind == OP_ROOT || kind == OP_SEND) { /* before R looks at them */
        atomic_store(&c->s.txc->want_cma, fz_u8(f));
        ack = fz_u8(f) % 4;
    }
    o->started = true;
    if (pthread_create(&o->thread, NULL, run_op, o) != 0) fail("pthread_create failed");
    pred pr = {KOLO_OK, false, false};
    if (kind == OP_RECV) {
        uint8_t *p = malloc(len + 1);
        if (!p) fail("no memory");
        for (size_t i = 0; i < len; i++) p[i] = pay((uint8_t)op_no, i);
        pr.st = send_msg(f, c, 0, p, len, o->want);
        free(p);
    } else if (kind == OP_BCAST) {
        pr = op_bcast(f, c, o);
    } else if (kind == OP_ALLREDUCE) {
        pr = op_allreduce(f, c, o);
    } else if (kind == OP_RSCATTER) {
        pr = op_rscatter(f, c, o);
    } else {
        pr = op_sends(f, c, o, ack);
    }
    bool silent = false;
    if (pr.wait) {
        int end = fz_u8(f) % 3;
        silent = end == 2;
        if (end == 1) {
            close_reset(c->fd);
            c->fd = -1;
        } else if (end == 0) {
            shutdown(c->fd, SHUT_WR);
        }
        pr.st = silent ? KOLO_ERR_TIMEOUT : KOLO_ERR_PEER_LOST;
    }
    join_op(o, silent ? 0.3 * 2 + ANSWER_S : ANSWER_S);
    if (verbose)
        fprintf(stderr, "fuzz_cma: %d %s of %zu: R %s '%s', the protocol %s\n", op_no, op_names[o->kind], o->len,
                kolo_strerror(o->st), o->msg, kolo_strerror(pr.st));
    written(false); /* a split's write whose done R never sent */
    check_bounds(o, c);
    if (pr.st == KOLO_OK) {
        if (o->st != KOLO_OK) fail("R failed where the protocol has it succeed");
        bool receives = kind == OP_RECV || kind == OP_BCAST || kind == OP_ALLREDUCE || kind == OP_RSCATTER;
        if (receives && memcmp(o->buf + GUARD, o->want, len) != 0) {
            size_t i = 0;
            while (o->buf[GUARD + i] == o->want[i]) i++;
            fail("R holds other bytes than rank 1 sent: byte %zu is %u, not %u", i, o->buf[GUARD + i], o->want[i]);
        }
        if (atomic_load(&c->s.txc->closed) != 0) fail("R succeeded but marked ring 0 closed");
    } else {
        if (o->st == KOLO_OK) fail("R succeeded where the protocol has it fail with %s", kolo_strerror(pr.st));
        if (o->st != pr.st) fail("R failed with %s, the protocol says %s", kolo_strerror(o->st), kolo_strerror(pr.st));
        const char *who = pr.call ? "rank 1" : pr.st == KOLO_ERR_TIMEOUT ? "rank(s) 1" : PEER;
        if (!names(o->msg, who)) fail("R's message does not name rank 1 ('%s')", who);
        if (pr.call) {
            if (atomic_load(&c->s.txc->closed) != 0) fail("R's call failed, yet it marked ring 0 closed");
        } else {
            check_told(o, c);
        }
    }
    cur = NULL;
    op_free(o);
    return pr.st == KOLO_OK || pr.call;
}

/* ---------------------------------------------------------------- one input */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (getenv("KOLO_LOG_LEVEL")) kolo__log_init();
    else kolo__log_level = KOLO_LOG_NONE;
    signal(SIGPIPE, SIG_IGN);
    setenv("KOLO_OP_TIMEOUT", OP_TIMEOUT, 0);
    setenv("KOLO_SHM_RING_SIZE", "65536", 0);
    setenv("KOLO_SHM_CMA", "auto", 1);
    verbose = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    kolo__host_key(hostkey, sizeof(hostkey));
    lfd_keep = listen_loopback(&lport_keep);
    /* [inaccessible page][arena][inaccessible page][hole], kept for the process's life */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, page + ARENA + page + HOLE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("mmap: %s", strerror(errno));
    arena = map + page;
    hole = arena + ARENA + page;
    if (mprotect(map, page, PROT_NONE) != 0 || mprotect(arena + ARENA, page + HOLE, PROT_NONE) != 0)
        fail("mprotect: %s", strerror(errno));
    arena_want = malloc(ARENA);
    if (!arena_want) fail("no memory");
    uint64_t v = kolo__now_ns();
    my_probe = v * 0x9e3779b97f4a7c15ull | 1;
    /* direct.c's member 0 picks by timings from 256 KiB, starting direct; pinned direct here */
    kolo__direct_test_force(PLAN_DIRECT_);
    /* another process of ours, which a desc may name (never a process not ours: R writes there) */
    pid_t parent = getpid();
    other = fork();
    if (other < 0) fail("fork: %s", strerror(errno));
    if (other == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
        for (;;) pause();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    int fds = count_fds();
    memset(chs, 0, sizeof(chs));
    start();
    if (own_segments() != 0) fail("R left its segment's name in /dev/shm after the handshake");
    for (op_no = 0; op_no < MAX_OPS && f.n && one_op(&f); op_no++) {}
    for (int ch = 0; ch < NCH; ch++) {
        kolo__mesh_destroy(rr.meshes[ch]);
        if (chs[ch].fd >= 0) close(chs[ch].fd);
        munmap(chs[ch].s.base, chs[ch].s.maplen);
    }
    kolo__free(rr.peers);
    kolo__store_server_stop(srv);
    srv = NULL;
    if (own_segments() != 0) fail("a segment of this process is left in /dev/shm");
    if (count_fds() != fds) fail("the process holds %d descriptors after the input, %d before", count_fds(), fds);
    return 0;
}
