/* transport.h - point-to-point connections behind one vtable of non-blocking calls, and the
 * mesh of connections from this rank to every other rank of the job.
 *
 * A connection (kolo__conn) is an ordered, reliable stream of framed messages to one peer on
 * one channel. Sends and receives are queued as kolo__xfer records and complete in the order
 * they were posted, per direction. Matching is by order: both sides of a pair must post their
 * messages in the same order (the collectives guarantee it), and every message carries a
 * 16-byte header with a magic number and its length, so a receiver that expected another
 * size reports a mismatch naming the peer instead of reading garbage.
 *
 * Channels: the job has KOLO_NCHANNELS independent meshes over the same peers. Channel 0
 * carries the direct (blocking) collectives of user threads, channel 1 belongs to the engine
 * thread; messages of the two never share a stream, so neither can see the other's bytes.
 *
 * Transports fill a kolo__transport table:
 *   tcp.c  non-blocking sockets (writev/readv straight from and to user buffers)
 *   shm.c  a ring per direction in a shared segment; large messages optionally read
 *          single-copy from the sender's memory with process_vm_readv (CMA)
 * Every connection, whatever its transport, keeps the TCP socket it was authenticated on:
 * for shm it is the liveness sentinel (the kernel closes it when the peer dies).
 */
#ifndef KOLO_TRANSPORT_H
#define KOLO_TRANSPORT_H

#include "../boot/env.h"
#include "../common/common.h"

#include <sched.h>
#include <stdatomic.h>

#define KOLO_NCHANNELS 2
#define KOLO_CHANNEL_DIRECT 0
#define KOLO_CHANNEL_ENGINE 1

#define KOLO_MSG_MAGIC 0x4b4f4c4du /* "KOLM" */
#define KOLO_HDR_LEN 16 /* magic (4 bytes), flags (4), payload length (8), in host order */
/* The flags' low 28 bits are the transport's own (shm: a single-copy descriptor; tcp: filler). */
/* header flag of the last frame a rank sends on a stream when it shuts down cleanly */
#define KOLO_HDR_GOODBYE 0x80000000u
/* header flag of the last frame a rank sends when it gives up on the job; payload: the reason */
#define KOLO_HDR_ABORT 0x40000000u
#define KOLO_ABORT_REASON_MAX 384
/* The length field's top 16 bits carry the sender's call tag (payloads are below 2^48 bytes:
 * every entry point refuses more): the direct collective it was in, its dtype, op and root,
 * so that ranks that called different collectives are told what each called (xfer.c). */
#define KOLO_HDR_LEN_BITS 48
enum { KOLO_CALL_NONE = 0, KOLO_CALL_ALLREDUCE, KOLO_CALL_ALLGATHER, KOLO_CALL_BROADCAST, KOLO_CALL_ALLTOALL,
       KOLO_CALL_REDUCESCATTER, KOLO_CALL_BARRIER };

typedef struct kolo__conn kolo__conn;
typedef struct kolo__xfer kolo__xfer;
typedef struct kolo__mesh kolo__mesh;
#define KOLO__STUCK_MAX 8

enum { KOLO_XFER_SEND = 1, KOLO_XFER_RECV = 2 };
/* how a large message goes over a pair that picks from timings (shm.c, KOLO_SHM_CMA=auto) */
enum { KOLO_WAY_AUTO = 0, KOLO_WAY_RING = 1, KOLO_WAY_SINGLE = 2 };

/* One queued send or receive. Owned by the caller (usually on its stack) until it completes;
 * the caller must not touch buf meanwhile. */
struct kolo__xfer {
    kolo__xfer *next;
    kolo__conn *conn;
    char *buf;
    size_t len;       /* payload bytes */
    size_t done;      /* payload bytes moved */
    unsigned hdr_done;
    unsigned pad, pad_done;   /* tcp: filler bytes between header and payload, and how many moved (tcp.c) */
    unsigned tail, tail_done; /* tcp: filler bytes after the payload, and how many moved */
    int kind;
    int status;       /* 1 pending, 0 done, < 0 failed */
    uint64_t cma_seq; /* shm: sequence of a single-copy send awaiting the peer's ack */
    uint64_t looked_ns; /* shm, a large receive: when a progress pass first had it in hand, else 0 */
    bool stream;        /* a receive whose bytes are not read again soon: where the transport copies
                         * them (shm ring copies), it writes around the cache. Set after posting. */
    bool single;        /* a send whose bytes the receiver keeps and no rank forwards (alltoall,
                         * the exchanges of allgather and reducescatter): a pair that picks from
                         * timings, or keeps ring copies because its host has more ranks than
                         * cores, sends it single-copy when large (shm.c). Set after posting. */
    unsigned char way;  /* a send: how a pair that picks from timings sends it when large, chosen by
                         * the call (KOLO_WAY_*, coll_util.c "pair"); KOLO_WAY_AUTO leaves it to the
                         * transport. A receive: how it came, when the sender's call chose. Set by
                         * post() from kolo__mesh.call_way. */
    unsigned char hdr[KOLO_HDR_LEN];
};

typedef struct kolo__transport {
    const char *name;
    /* Moves as many queued bytes as possible without blocking; completes xfers. Returns
     * KOLO_OK, or an error that has already been recorded with kolo__err and that fails the
     * whole connection. */
    int (*progress)(kolo__conn *c);
    /* Frees the transport's private state (not the socket, not the conn). */
    void (*close)(kolo__conn *c);
    /* Clean shutdown: tell the peer this side leaves on purpose (all its sends are done). */
    void (*goodbye)(kolo__conn *c);
    /* After the peer hung up and everything it sent before was drained: did it say goodbye? */
    bool (*left_cleanly)(kolo__conn *c);
    /* This rank gives up on the job because of `reason`: after this returns, the peer must not
     * trust any data it still reads from our memory (our buffers go back to the user), and it
     * can learn the reason (best effort: the transport may spend until `until_ns`, on
     * kolo__now_ns's clock, getting it to a peer that reads). */
    void (*abort)(kolo__conn *c, const char *reason, uint64_t until_ns);
    /* After the peer hung up without a goodbye: the reason it gave when it aborted, if any. */
    bool (*abort_reason)(kolo__conn *c, char *buf, size_t cap);
    /* Sleeping until the peer moves (kolo__wait): marks this side asleep on the connection and
     * returns the 32-bit word the peer bumps (and wakes by futex) when it next moves anything
     * this side may wait for, with *seen its value now; the caller polls once more, then sleeps
     * on the word while it still reads *seen. NULL where the transport has no such word (tcp,
     * whose socket is waited on instead). awake() ends it. */
    _Atomic uint32_t *(*doze)(kolo__conn *c, uint32_t *seen);
    void (*awake)(kolo__conn *c);
} kolo__transport;

struct kolo__conn {
    const kolo__transport *tp;
    kolo__mesh *mesh;
    int peer;              /* world rank */
    int fd;                /* TCP socket: data (tcp) or liveness sentinel (shm) */
    kolo__xfer *sendq, *recvq;
    kolo__xfer **sendq_tail, **recvq_tail;
    int error;             /* 0, or the status that broke this connection */
    int gone;              /* the peer shut down cleanly (said goodbye) */
    int lost;              /* 0, or the status of a loss that nothing pending needed (below) */
    char *lost_msg;        /* its message, for the next exchange with the peer to fail with */
    int midframe;          /* tcp: a frame is partly sent (nothing else may follow it) */
    void *priv;            /* transport state */
};

/* What every rank publishes about itself at rendezvous. */
typedef struct kolo__peer_info {
    char addr[64];        /* numeric IP it listens on */
    int port;
    int pid;
    char hostkey[96];     /* boot id + network namespace: equal means "maybe the same host" */
    uint64_t cores;       /* the cores it may run on (kolo__host_cpus's set), hashed */
    uint64_t pidns;       /* its pid namespace's inode (0: unknown); pid names it only where equal */
    char hostname[128];
} kolo__peer_info;

/* A choice between two ways of running a collective of about one size, made from the calls' own
 * timings (kolo__choice_pick and kolo__choice_learn, coll/coll_util.c): how allreduces of this
 * mesh choose between the ring and reading the others' buffers by CMA, how mapped ones store
 * their results, whether 2-member ones run the one-round exchange (coll/direct.c), how
 * allgathers and alltoalls write their output (coll_util.c), how a 2-member broadcast's root
 * sends (coll/broadcast.c). */
#define KOLO_DIRECT_CLASSES 10 /* 256-512 KiB, 512 KiB-1 MiB, 1-2, ..., 64-128 MiB, larger */
#define KOLO_STORE_CLASSES 6  /* 64-256 KiB, 256 KiB-1 MiB, 1-4, 4-16, 16-64, larger */
#define KOLO_OUT_CLASSES 3    /* 8-16 MiB, 16-32, 32-64 */
#define KOLO_EXCHANGE_CLASSES 2 /* 64-128 KiB, 128-256 KiB */
#define KOLO_BCAST_CLASSES 5    /* 64-128 KiB, 128-256 KiB, ..., 1-2 MiB */
#define KOLO_PAIR_CLASSES 12  /* 256-512 KiB, ..., 256-512 MiB, larger (a 2-member call's bytes; exchanges from 64 KiB) */
#define KOLO_PAIR_KINDS 4     /* reduce-scatters, allgathers, exchanges, crowded alltoalls (KOLO_PAIR_*, coll.h) */
#define KOLO_PAIR_SLOTS (KOLO_PAIR_KINDS * KOLO_PAIR_CLASSES)
typedef struct kolo__choice {
    kolo__window win[2];     /* per way (e.g. 0 ring, 1 direct): the last samples in ps/B, */
    uint64_t cost[2], at[2]; /* their median, and when the last came */
    int want, probing;       /* the way in use; calls of the other way still to run in a probe */
    int recheck;             /* calls of the way in use still to run after a probe, before its verdict */
    bool hinted;             /* started from a hint that waits for the first probe (wait) */
    bool decided;            /* a probe has given a verdict (the first is not a change of answer) */
    bool due;                /* probe at the next pick (dearer_probes) */
    bool dearer_probes;      /* a way in use found dearer brings a probe, not a move (coll_util.c) */
    uint64_t every, calls;   /* the interval between probes; calls since the last */
    /* outside a probe, the way in use is left after this many calls in a row (0 counts as 1)
     * found it dearer than the other's last figure; dearer counts them */
    unsigned switch_after, dearer;
    unsigned first_after;    /* calls before the first probe (0: FIRST_PROBE_CALLS, coll_util.c) */
    unsigned char last;      /* the way of the class's last call, + 1 (kolo__choice_repeat) */
    unsigned char run;       /* calls in a row by that way, this one included (saturates) */
} kolo__choice;

/* How the reduce-scatters of a 2-member group over a pair that picks from timings send their
 * chunks, and whether its allgathers push (coll_util.c, "pair"): per kind of call and class of its bytes (a
 * slot), the calls so far (the same count on both members), and on the member of lower rank,
 * which chooses for both, its choice (with the way of its last call), the ways of its next two
 * calls, and how many outliers it left out in a row. */
typedef struct kolo__pair_ways {
    uint64_t seq[KOLO_PAIR_SLOTS];
    kolo__choice choice[KOLO_PAIR_SLOTS];
    unsigned char plan[KOLO_PAIR_SLOTS][2]; /* KOLO_WAY_*, by call number mod 2 */
    unsigned char outliers[KOLO_PAIR_SLOTS];
} kolo__pair_ways;

/* A crowded host's agreed choice for the world's broadcasts of one size class (coll/broadcast.c,
 * "Agreed"): every member keeps the same calls and verdict; its own timings only until they are
 * summed over the members. */
#define KOLO_BCAST_CROWD_CLASSES 8
typedef struct kolo__bcast_crowd {
    uint32_t calls; /* of this class since its last verdict, or since the start */
    uint8_t way;    /* the verdict plus one; 0 before the first */
    uint8_t verdicts; /* how many (up to 255) */
    uint64_t mark;  /* when the probe's run this way began (the end of its first call) */
    uint64_t t[2];  /* this member's run each way in the probe, nanoseconds; 0 not run */
} kolo__bcast_crowd;

struct kolo__mesh {
    int rank, size, channel;
    kolo__conn **conns;             /* [size]; conns[rank] is NULL */
    const kolo__peer_info *peers;   /* shared by all channels; owned by the world */
    uint64_t op_timeout_ns; /* UINT64_MAX: never (KOLO_OP_TIMEOUT 0); kolo__op_timeout_text says which */
    /* KOLO_TCP_KEEPALIVE (0: off): a TCP peer whose machine has acknowledged nothing for this long
     * while this rank waits with bytes unacknowledged is lost (kolo__tcp_unanswered) */
    uint64_t keepalive_ns;
    /* a wait without progress this long (KOLO_STALL_CHECK_TIME; 0 never) calls on_stall once,
     * with how long it has waited and the ranks it waits on ("1, 3-5"), if the channel's owner
     * set it: the warning of a wait that names no tensor (core/kolo.c, engine/engine.c) */
    uint64_t stall_ns;
    void (*on_stall)(const kolo__mesh *m, uint64_t waited_ns, const char *ranks);
    uint64_t spin_ns;
    /* waits on this mesh sleep after their spin, without yielding first (the engine's: xfer.c) */
    bool doze;
    int failed;                     /* first job error seen on this mesh, or 0 */
    char failmsg[512];
    _Atomic bool failmsg_set;       /* failmsg written, for readers on other threads (kolo_status_json) */
    /* scratch memory of the collectives running on this mesh (one thread at a time) */
    void *scratch[3];
    size_t scratch_cap[3];
    /* this rank could not map another rank's shared buffer once: its allreduces no longer offer
     * their kolo_mem_alloc buffers to be mapped, and read the others' by CMA (coll/direct.c) */
    bool zc_unmappable;
    /* allreduces out of place [0] and in place [1]: ring or direct by CMA, per size class */
    kolo__choice direct[2][KOLO_DIRECT_CLASSES];
    /* and, for mapped allreduces out of place [0] and in place [1], how the results are stored */
    kolo__choice direct_store[2][KOLO_STORE_CLASSES];
    /* reduce-scatters that could read the others' inputs directly: the ring (or the exchange) or
     * direct, per size class of their bytes in all (coll/allreduce.c, "Direct") */
    kolo__choice rs_direct[KOLO_DIRECT_CLASSES];
    /* 2-member allreduces out of place below 256 KiB: ring or one-round exchange, per size class */
    kolo__choice exchange[KOLO_EXCHANGE_CLASSES];
    /* 2-member broadcasts rooted here: split or ring copies, per size class (coll/broadcast.c) */
    kolo__choice bcast[KOLO_BCAST_CLASSES];
    /* the world's broadcasts on a crowded host: the spread or tree, or the chain, per size class,
     * as the members agree from their timings (coll/broadcast.c, "Agreed") */
    kolo__bcast_crowd bcast_crowd[KOLO_BCAST_CROWD_CLASSES];
    /* whether this rank's allgathers and alltoalls write their output around the cache */
    kolo__choice stream_out[KOLO_OUT_CLASSES];
    /* per peer, each allocated at its first call that chooses (4 KiB or so: not for every peer
     * of a large world at once), and the way the call running now chose for its sends
     * (KOLO_WAY_*), which post() gives each send it queues */
    kolo__pair_ways **pair_ways;
    unsigned char call_way;
    /* the direct collective running on this mesh (kolo__call_tag), set by the thread that runs it
     * (core/kolo.c): what its sends carry and its receives are checked against; 0 outside one
     * (kolo_init's agreement, the engine's mesh), where nothing is checked */
    uint16_t call_tag;
    /* Agreed by every rank at init (core/kolo.c), so alike on every member of any group, for
     * algorithm choices that must match: every pair of the world runs over shared memory on this
     * channel; some host has more ranks than cores; every pair of the world shares memory on this
     * channel and sends the messages marked `single` single-copy (kolo__shm_sends_single); the
     * size from which rings write around the cache and fuse their middle steps (0 until agreed:
     * coll.h, kolo__coll_stream_min). world_blocks: all ranks on one host, each bound to one CPU,
     * and the ranks of each CPU neighbours in rank order (as kolorun and the benchmarks bind a
     * crowded host), so that an aligned block of ranks shares CPUs (coll/broadcast.c, "tree"). */
    bool world_shm, world_oversubscribed, world_single, world_blocks;
    /* every pair of the world shares memory and may read the other's buffers (CMA): where the
     * allreduce may go direct (coll/direct.c); agreed, as a pair over TCP or without CMA on one
     * member's side must keep every member off it */
    bool world_cma;
    size_t stream_min;
    /* each world rank's host (owned by the world; NULL when all ranks are on one host) and the modes of the
     * hierarchical allreduce and allgather, agreed: 0 off, 1 auto, 2 on (coll/hier.c) */
    const int *host_of;
    int hier, hier_ag;
    /* each host's KOLO_HOST_* flags on this channel, indexed as host_of (owned by the world; NULL
     * when host_of is): what world_shm, world_single and world_oversubscribed say of the world,
     * said of the pairs within each host, so that a group lying on one host of a job on several
     * (a step of the hierarchical collectives, a process set) chooses as a world on one host
     * would (coll.h, kolo__coll_group_flags). Agreed at init as those. */
    const uint8_t *host_flags;
    /* What a wait on this mesh waits for, for kolo_status_json on other threads (xfer.c): since
     * when nothing has moved (kolo__now_ns; 0 while no wait has gone a liveness check without
     * progress), and the first KOLO__STUCK_MAX ranks it waits on of stuck_n. */
    _Atomic uint64_t stuck_since;
    _Atomic int stuck_n;
    _Atomic int stuck_peer[KOLO__STUCK_MAX];
};

/* Bits of kolo__mesh.host_flags. */
#define KOLO_HOST_SHM 1u     /* every pair of the host's ranks runs over shared memory */
#define KOLO_HOST_SINGLE 2u  /* and sends the messages marked `single` single-copy */
#define KOLO_HOST_CROWDED 4u /* the host has more ranks than cores */
#define KOLO_HOST_CMA 8u     /* every pair of the host's ranks shares memory and may read by CMA */

/* The transports (tcp.c, shm.c). */
extern const kolo__transport kolo__tcp_transport;
extern const kolo__transport kolo__shm_transport;

/* ---- Posting and waiting (xfer.c) ---- */

/* Queue a send or receive of len bytes on the connection to world rank `peer`. Never blocks.
 * On a broken mesh or connection the xfer fails at once (x->status < 0). */
void kolo__isend(kolo__mesh *m, int peer, const void *buf, size_t len, kolo__xfer *x);
void kolo__irecv(kolo__mesh *m, int peer, void *buf, size_t len, kolo__xfer *x);

/* Drives every connection of the mesh until all n xfers are complete. Busy-polls for
 * KOLO_SPIN_US, then yields the core between polls, then sleeps until a peer moves (so idle
 * waiters on an oversubscribed host let the others run); a mesh marked `doze` sleeps right
 * after its spin. Watches every peer's liveness: a peer that dies (or aborts the job) while
 * this rank still has bytes to exchange with it fails the wait within a few milliseconds (10 or
 * so while the mesh dozes) with KOLO_ERR_PEER_LOST naming it, after taking in what it sent
 * before it went. One with nothing pending had finished its part (it may have returned from the
 * collective this rank is still in): the loss is kept, and fails the next xfer posted to that
 * peer, or this wait once it has made no progress for half a second. No progress for
 * KOLO_OP_TIMEOUT seconds fails with
 * KOLO_ERR_TIMEOUT naming the peers still owed bytes. Any failure also marks the mesh failed:
 * later calls fail at once with the same message. */
int kolo__wait(kolo__mesh *m, kolo__xfer *const *xs, int n);
/* kolo__wait for one xfer */
int kolo__wait1(kolo__mesh *m, kolo__xfer *x);
/* What a wait on m has been waiting for, read from any thread (kolo_status_json): the time
 * nothing has moved since (kolo__now_ns) and the ranks it waits on (up to cap of them, in
 * peers; *n all of them), or 0 when no wait on m has gone a liveness check without progress. */
uint64_t kolo__mesh_stuck(const kolo__mesh *m, int *peers, int cap, int *n);
/* Test hook: the calling thread's idle passes [0], yields [1], sleeps on doorbells [2], those
 * of them a doorbell ended [3] and liveness checks [4] in kolo__wait so far. */
void kolo__wait_test_counts(uint64_t out[5]);
/* Test hook: the calling thread's naps in waits on tcp and shared-memory conns at once that a
 * socket ended early (xfer.c, sleep_on_sockets). */
uint64_t kolo__wait_test_socket_naps(void);
/* Test hook: the calling thread's waits check every peer's liveness before their first progress
 * pass (as when a peer sends and hangs up between two passes). */
void kolo__wait_test_liveness_first(bool on);
/* One progress pass over every connection with queued xfers, without waiting, so that xfers
 * posted just now start moving before the caller does local work. A failure stays in the xfers
 * (and the mesh) for kolo__wait to report. */
void kolo__poke(kolo__mesh *m);

/* Helpers for transports: frame header and queue bookkeeping. */
void kolo__hdr_pack(unsigned char hdr[KOLO_HDR_LEN], uint32_t flags, uint64_t len);
/* Rewrites only the flags of a packed header (its length and call tag stay). */
void kolo__hdr_set_flags(unsigned char hdr[KOLO_HDR_LEN], uint32_t flags);
/* A direct collective's call tag: KIND (KOLO_CALL_*), dtype, op (or -1) and root (or -1, kept mod
 * 64; a reduction's: kolo__call_scales) */
uint16_t kolo__call_tag(int kind, int dtype, int op, int root);
/* A reduction's scale factors in 6 bits: 0 for 1 and 1, else 1-63 */
int kolo__call_scales(double prescale, double postscale);
/* A call tag as text, "kolo_broadcast (float32, root 3)": a broadcast's root is ROOT where the
 * caller knows it, else the tag's (mod 64 where the mesh has more ranks: SIZE) */
void kolo__call_text(uint16_t tag, int root, int size, char *buf, size_t cap);
/* When a wait without progress fails, for the stall warnings: "it fails after KOLO_OP_TIMEOUT,
 * 300 s", or "it waits on: KOLO_OP_TIMEOUT is 0". */
const char *kolo__op_timeout_text(const kolo__mesh *m, char buf[64]);
/* Validates a received header against the xfer's expected length; returns status (with a
 * message naming the peer). *flags receives the header's flags (0 where its magic is not kolo's). */
int kolo__hdr_check(kolo__conn *c, const kolo__xfer *x, uint32_t *flags);
/* Marks the head xfer of a queue complete and pops it. */
void kolo__xfer_complete(kolo__xfer **q, kolo__xfer ***tail, int status);
/* The message for a peer that aborted the job because of `reason`: names the peer and the
 * root cause (the innermost "because" of a chain of aborts). Returns KOLO_ERR_PEER_LOST. */
int kolo__err_aborted(kolo__conn *c, const char *reason);

/* Breaks the connection: records status/message, fails every queued xfer, and fails the mesh:
 * a job error aborts every connection of the mesh (shutdown of its sockets), so that every
 * peer sees this rank hang up without a goodbye and fails too, within milliseconds. */
int kolo__conn_fail(kolo__conn *c, int status);

/* ---- Mesh (mesh.c) ---- */

/* Builds KOLO_NCHANNELS meshes: listens, publishes this rank through the store (already
 * connected), learns every peer, connects to all of them with the job secret's
 * challenge-response, and picks shm or tcp per peer. On success meshes[c] are set and
 * *peers (array of size) and per-rank host info are filled in. */
struct kolo__store;
/* This process's host key (kolo__peer_info.hostkey): boot id and network namespace. */
void kolo__host_key(char *out, size_t cap);
/* The cores this host's ranks share: the ones this process may run on, or all online ones when
 * it was bound to a single core (a launcher that binds ranks has already given each its own). */
long kolo__host_cpus(void);
/* The CPUs of `set` core by core: cores in order of their package and core ids (/sys), each
 * core's hyperthreads together in CPU order. Fills order[] (CPU_SETSIZE entries at most) and
 * returns how many. kolorun --bind-to auto and KOLO_BIND=auto deal a crowded host's ranks out
 * over them in blocks of neighbours. */
int kolo__cpus_in_core_order(const cpu_set_t *set, int *order);
/* A CPU's package and core ids from /sys (package 0 and a core of its own where they are missing). */
void kolo__cpu_place(int cpu, int *package, int *core);
/* Whether this host has more ranks (local_ranks, this one included) than those cores. */
bool kolo__host_oversubscribed(size_t local_ranks);
/* The ranks of peers[0..n) that take turns on rank me's cores, me included: those on the same
 * kernel (boot id) with the same set of cores, whatever their network namespace. Ranks in
 * containers or network namespaces of one machine are hosts of their own to the transports and
 * the hierarchical collectives (TCP between them), but they share its cores: more of them than
 * cores, and waiting ranks yield at once (core/kolo.c). */
size_t kolo__core_sharers(const kolo__peer_info *peers, int n, int me);
/* How many of those take turns on each core, rounded up, at least 1: what the waits that
 * depend on a peer's next turn are multiplied by (the greeting at start-up, mesh.c; the engine's
 * goodbye, engine.c). */
size_t kolo__core_crowd(const kolo__peer_info *peers, int n, int me);

int kolo__mesh_build(kolo__mesh *meshes[KOLO_NCHANNELS], kolo__peer_info **peers,
                     const kolo__world_info *wi, struct kolo__store *store);
/* How the last build ended when it failed: superseded (an elastic round replaced while it
 * started, wi->abort_key), past its deadline (ranks that never came or never connected), or 0. */
#define KOLO__MESH_SUPERSEDED 1
#define KOLO__MESH_DEADLINE 2
int kolo__mesh_last_end(void);

/* This host's IPv4 address towards host (the one a connection there would come from; a UDP
 * connect, nothing sent), into addr. KOLO_ERR_STARTUP naming the host when it does not resolve
 * or has no route. */
int kolo__route_address(const char *host, int port, char *addr, size_t cap);

/* The first up IPv4 address of an interface that a KOLO_IFACE spec allows ("eth0", "eth,ib" by
 * prefix, "=eth0" exact, "^docker" excluded; empty: any but lo* and docker*), into addr.
 * KOLO_ERR_STARTUP naming the spec when none does. */
int kolo__iface_address(const char *spec, char *addr, size_t cap);
void kolo__mesh_destroy(kolo__mesh *m);
/* This rank gives up on the job (status, with kolo__errmsg() as the reason): every connection
 * of m aborts, so that each peer fails at once naming this rank and the reason, where a goodbye
 * would have told it this rank left on purpose. Later calls on m fail. */
void kolo__mesh_fail(kolo__mesh *m, int status);
/* Test hook: the next builds here decline shared memory offered by `peer` as if its segment
 * could not be opened (-1: off), to stand for a pair whose shared memory fails alone. */
void kolo__mesh_test_fail_shm_from(int peer);
/* Test hook: the next builds here pause `ms` after each handshake they finish (0: off), to stand
 * for a start-up slower in all than KOLO_START_TIMEOUT. */
void kolo__mesh_test_slow_handshakes(unsigned ms);
/* Test hook: the last build's walks of its handshake table [0] (for retries and overdue
 * greetings) and the socket events it handled [1]. */
void kolo__mesh_test_counts(uint64_t out[2]);
/* Test hook: ranks given different names (before kolo_init) look like ranks of different hosts. */
void kolo__mesh_test_host(const char *name);

/* Host of a world rank for messages: "hostname (addr)". */
const char *kolo__peer_name(const kolo__mesh *m, int peer);

/* ---- Transport set-up hooks used by mesh.c ---- */
/* same_machine: the peer runs on this machine's kernel (another network namespace or container,
 * the same boot id), which tcp.c treats as it treats loopback. */
int kolo__tcp_attach(kolo__conn *c, bool same_machine);
/* Fails c, as lost, when its peer's machine has answered nothing for ms milliseconds while bytes
 * sent to it go unacknowledged (retransmitted) or its zero window goes unprobed; KOLO_OK
 * otherwise. For a wait that has made no progress for at least that long (xfer.c). */
int kolo__tcp_unanswered(kolo__conn *c, unsigned ms);
/* Sets KOLO_TCP_CONGESTION's algorithm on a socket before its connection is established: a
 * connecting socket (local: its peer runs on this machine) or a listening one (local: true; the
 * connections it accepts from other machines return to the system's choice in kolo__tcp_attach). */
void kolo__tcp_congestion_early(int fd, bool local);
/* test hooks: connections on this machine whose algorithm was set after they were established;
 * the calling thread's kolo__tcp_attach treats loopback connections as other machines' */
uint64_t kolo__tcp_congestion_late(void);
void kolo__tcp_test_remote(bool on);
/* The congestion control a TCP conn runs ("cubic"), for messages; "?" when unknown. */
const char *kolo__tcp_congestion(const kolo__conn *c);
/* Lower rank creates the segment; returns the name to send to the peer. `populate` maps it with
 * its pages faulted in and dirty (MADV_POPULATE_WRITE), so the first messages pay neither a page
 * fault nor a first write to a clean page each. `reserve` allocates its pages in /dev/shm now
 * (posix_fallocate), so that a full /dev/shm fails here, naming it, instead of raising SIGBUS
 * at a first write. */
int kolo__shm_create(kolo__conn *c, char *name, size_t cap, size_t ring_size, int populate, int reserve);
/* What a pair's segment of rings of ring_size bytes takes in /dev/shm. */
size_t kolo__shm_segment_bytes(size_t ring_size);
/* Maps the peer's segment at the size its creator gave it. */
int kolo__shm_open(kolo__conn *c, const char *name, int populate);
/* Once both sides have mapped it, the creator unlinks the name (nothing is left in /dev/shm
 * if a process dies later; one killed before that is removed by kolorun when it reaps it, or
 * swept by a later job, shm.c). */
void kolo__shm_unlink(const char *name);
/* Removes the /dev/shm segments process `pid` created and did not unlink: for a launcher that
 * has just reaped it (the pid is then free and no handshake of its can be under way). Returns
 * how many, their total size in *bytes (may be NULL). */
int kolo__shm_remove_of(pid_t pid, long long *bytes);
/* The pair passed the CMA probe: the peer's descriptors can be read from now on. Messages of
 * `threshold` bytes and more go by ring (mode 0), single-copy (1), or either, as the receiver
 * of each direction finds faster from timings (2, auto). */
void kolo__shm_enable_cma(kolo__conn *c, int peer_pid, size_t threshold, int mode);
/* Pins sending by descriptor on or off (no send may be in flight); false if c cannot. */
bool kolo__shm_use_cma(kolo__conn *c, bool on);
/* On a host with more ranks than cores: c keeps ring copies, but sends the large messages marked
 * `single` single-copy (shm.c); false if c cannot. */
bool kolo__shm_pin_oversubscribed(kolo__conn *c);
/* Whether c was pinned so (not by KOLO_SHM_CMA=0). */
bool kolo__shm_pinned_oversubscribed(const kolo__conn *c);
/* Whether c, a shared-memory pair, sends large messages marked `single` single-copy (it passed
 * the CMA probe, and KOLO_SHM_CMA is 1, auto, or auto pinned to ring copies on an oversubscribed
 * host); false for any other connection. */
bool kolo__shm_sends_single(const kolo__conn *c);
/* Whether the peer of this shared-memory pair has marked its side aborted (it gave up on the
 * job, and its buffers may be back with its user): a rank about to write into the peer's
 * memory (process_vm_writev) checks it first. */
bool kolo__shm_peer_aborted(const kolo__conn *c);
/* How many payload bytes c has written into its ring around the cache (shm.c, "far"). */
uint64_t kolo__shm_far_bytes(const kolo__conn *c);
/* How many messages c has sent single-copy. */
uint64_t kolo__shm_cma_sent(const kolo__conn *c);
/* 2: c picks from timings; 1: sends large messages single-copy; 0: by ring but could; -1: cannot. */
int kolo__shm_cma_state(const kolo__conn *c);
/* Reads [addr, addr + n) of process pid into dst with process_vm_readv, from *done on (advanced
 * as bytes arrive): 0, or the errno of the failed call (ENODATA: it read nothing). */
int kolo__cma_read(int pid, void *dst, uint64_t addr, size_t n, size_t *done);
/* Writes src into [addr, addr + n) of process pid with process_vm_writev, likewise. */
int kolo__cma_write(int pid, uint64_t addr, const void *src, size_t n, size_t *done);
/* The size from which messages may go single-copy; 0 when c cannot. */
size_t kolo__shm_cma_threshold(const kolo__conn *c);
/* The calls of a 2-member group choosing for both directions (coll_util.c, "pair"): the member
 * of lower rank publishes, in its receiving ring's control block, the way of the calls of slot
 * `slot` from call `from` on (way) and before it (was); the other reads that word. */
void kolo__shm_publish_call_way(kolo__conn *c, int slot, uint64_t from, int way, int was);
int kolo__shm_call_way(const kolo__conn *c, int slot, uint64_t call);
/* How many large messages c received single-copy [1] and by ring [0] the way the sender's call
 * chose (not the transport's own choice). */
void kolo__shm_call_received(const kolo__conn *c, uint64_t got[2]);
/* The bytes of c's sending ring filled in (at start-up, or at its first use: first_pass); 0
 * when c is not a shared-memory conn or has not sent. */
size_t kolo__shm_tx_filled(const kolo__conn *c);
/* The bytes of each of c's rings; 0 when c is not a shared-memory conn. */
size_t kolo__shm_ring_bytes(const kolo__conn *c);
/* How many large messages c received by ring (got[0]) and single-copy (got[1]) while picking
 * from timings, counting one whose timing waits for this side's own send (shm.c, adapt_done). */
void kolo__shm_large_received(const kolo__conn *c, uint64_t got[2]);
/* The same for messages of the size class of `bytes` (the choice is kept per class, shm.c). */
void kolo__shm_class_received(const kolo__conn *c, uint64_t bytes, uint64_t got[2]);
/* test hook, auto: the class of messages of `bytes` leaves its way at its next message, as when
 * the way stayed dearer for SWITCH_AFTER_MSGS messages */
void kolo__shm_test_switch(kolo__conn *c, uint64_t bytes);
/* Tests: corrupts what c's peer reads next from us, either the mark it polls or, with
 * whole_frame, a whole frame whose header is not kolo's. Nothing may be in flight on c. */
void kolo__shm_garble(kolo__conn *c, bool whole_frame);
/* test hook: filler bytes this process has sent around TCP payloads (tcp.c, "filler") */
uint64_t kolo__tcp_filler_sent(void);
/* Test hook: with `bytes` > 0, each progress pass over a TCP conn makes one system call each
 * way, moving at most `bytes` of payload, so that tests can leave a frame half sent and half
 * received; 0 restores the normal passes. */
void kolo__tcp_test_step(size_t bytes);
/* Test hook, before kolo_init: each large message by ring copies (way 0) or single-copy (1) takes
 * `ns` longer, so that tests can make either way the slow one. */
void kolo__shm_test_delay(int way, uint64_t ns);
/* The same for messages of lo <= length < hi bytes only. */
void kolo__shm_test_delay_sizes(int way, uint64_t ns, uint64_t lo, uint64_t hi);
/* Test hook, before kolo_init: the way choice runs on a made-up clock, each large message
 * costing a fixed rate plus the delays above, and nothing sleeps (shm.c). */
void kolo__shm_test_virtual(bool on);
/* Test hook, on the made-up clock: of the next messages this process receives by `way`, after
 * `skip` of them, `count` take `ns` longer each, as when a rank waits for a CPU (shm.c). */
void kolo__shm_test_stall(int way, int skip, int count, uint64_t ns);
/* Test hook: copies into the ring go -1 by the rule (shm.c, "far"), 0 always through the cache,
 * 1 always around it; a `ps` not 0 is every timed copy's cost per byte instead of the clock's. */
void kolo__shm_test_far(int mode, uint64_t ps);


#endif
