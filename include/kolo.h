/* kolo.h - the whole public C API of libkolo, a data-parallel training runtime.
 *
 * A program runs as N copies ("ranks"). Each copy calls kolo_init(), which
 * learns who it is from the environment (kolorun, horovodrun, torchrun, mpirun,
 * srun, or nothing: a world of one), meets the others through a rendezvous
 * store, and connects to every one of them (shared memory on the same host,
 * TCP between hosts). The collectives below then move data between ranks.
 *
 * Conventions that hold for every function unless its comment says otherwise:
 *   - Functions return a kolo_status_t: KOLO_OK (0) or a negative error.
 *     After an error, kolo_last_error() on the same thread returns a message
 *     naming the cause (and the peer rank and host, or the tensor, if any).
 *   - Counts are in elements of the given dtype, never bytes.
 *   - Buffers stay owned by the caller. A blocking call reads and writes them
 *     only until it returns.
 *   - The direct collectives (kolo_allreduce ... kolo_barrier) block the
 *     calling thread until the result is complete. Every rank of the process
 *     set must call the same collectives in the same order (as with MPI).
 *     They may be called from any thread, but calls are serialized
 *     internally: issue them from one thread per process to keep the
 *     cross-rank order well defined.
 *   - Nothing here calls abort() or exit(), or prints to stdout; diagnostics
 *     go to stderr through the log (KOLO_LOG_LEVEL).
 */
#ifndef KOLO_H
#define KOLO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KOLO_BUILDING) && defined(__GNUC__)
#define KOLO_EXTERN __attribute__((visibility("default")))
#else
#define KOLO_EXTERN
#endif

#define KOLO_VERSION_MAJOR 0
#define KOLO_VERSION_MINOR 1
#define KOLO_VERSION_PATCH 0
#define KOLO_VERSION_STRING "0.1.0"
/* major * 10000 + minor * 100 + patch */
#define KOLO_VERSION_NUMBER 100

/* ---- Status codes --------------------------------------------------------
 * Grouped by what they damage. Errors of this call leave the job usable;
 * errors of the job mean the job cannot go on (every later collective fails
 * the same way); errors of the system carry errno's text in the message. */
typedef enum kolo_status {
    KOLO_OK = 0,
    /* this call */
    KOLO_ERR_INVALID_ARG = -1,     /* a bad argument; nothing was sent */
    KOLO_ERR_NO_MEMORY = -2,       /* an allocation failed */
    KOLO_ERR_NOT_INITIALIZED = -3, /* kolo_init() has not succeeded */
    KOLO_ERR_NOT_MEMBER = -4,      /* this rank is not in the process set */
    /* the job */
    KOLO_ERR_PEER_LOST = -10,      /* a peer process died or closed its connection */
    KOLO_ERR_TIMEOUT = -11,        /* a peer did not answer in time */
    KOLO_ERR_MISMATCH = -12,       /* ranks disagree on a collective's arguments */
    KOLO_ERR_SHUT_DOWN = -13,      /* kolo was shut down, or an earlier job error ended it */
    KOLO_ERR_PROTOCOL = -14,       /* a peer sent bytes that are not kolo's protocol */
    KOLO_ERR_AUTH = -15,           /* a peer could not prove it holds the job secret */
    KOLO_ERR_STARTUP = -16,        /* the job could not be assembled (rendezvous, missing ranks) */
    KOLO_ERR_REMOVED = -17,        /* elastic: kolorun removed this worker from the job */
    /* the system */
    KOLO_ERR_SYSTEM = -20,         /* a system call failed; the message has errno's text */
    KOLO_ERR_INTERNAL = -21        /* a bug in kolo; please report the message */
} kolo_status_t;

/* A static string naming the status ("invalid argument", "peer lost", ...). */
KOLO_EXTERN const char *kolo_strerror(int status);

/* The message of the last error on the calling thread: what failed, and why,
 * with rank, host and tensor where known. Never NULL; "" when there was none.
 * Valid until the next kolo call on this thread. */
KOLO_EXTERN const char *kolo_last_error(void);

/* ---- Data types and reduction operations --------------------------------- */
typedef enum kolo_dtype {
    KOLO_UINT8 = 0,
    KOLO_INT8,
    KOLO_UINT16,
    KOLO_INT16,
    KOLO_INT32,
    KOLO_INT64,
    KOLO_FLOAT16,  /* IEEE 754 binary16; reduced in float32 arithmetic */
    KOLO_BFLOAT16, /* bfloat16; reduced in float32 arithmetic */
    KOLO_FLOAT32,
    KOLO_FLOAT64,
    KOLO_BOOL,     /* one byte, 0 or 1; sum/max act as OR, min/product as AND */
    KOLO_DTYPE_COUNT
} kolo_dtype_t;

typedef enum kolo_op {
    KOLO_SUM = 0,
    KOLO_AVERAGE, /* sum, then divide by the process set's size; integers truncate toward zero */
    KOLO_MIN,
    KOLO_MAX,
    KOLO_PRODUCT,
    /* Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", 2021): combines
     * two vectors a, b as (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b, i.e. their sum when
     * orthogonal and their average when parallel, over the members pairwise as a binary tree
     * (member i with i ^ 1, then the pairs' results, ...). Allreduce only; floating dtypes only.
     * Every tensor is its own vector, also when the engine fuses several. Any number of members:
     * beyond the largest power of two, members 2i and 2i+1 combine first (Horovod wants a power
     * of two). Prescale applies to every input, postscale to the result. */
    KOLO_ADASUM,
    KOLO_OP_COUNT
} kolo_op_t;

/* Size in bytes of one element, or 0 for an unknown dtype. */
KOLO_EXTERN size_t kolo_dtype_size(kolo_dtype_t dtype);
/* "float32", "bfloat16", ...; "unknown" for an unknown dtype. */
KOLO_EXTERN const char *kolo_dtype_name(kolo_dtype_t dtype);
/* "sum", "average", ...; "unknown" for an unknown op. */
KOLO_EXTERN const char *kolo_op_name(kolo_op_t op);

/* ---- Version and build ---------------------------------------------------- */
/* KOLO_VERSION_NUMBER of the library actually loaded (bindings check it). */
KOLO_EXTERN int kolo_version(void);
/* A static, human-readable line: version, transports, vector units. */
KOLO_EXTERN const char *kolo_build_info(void);

/* ---- Start and stop -------------------------------------------------------- */

/* Joins the job. Reads rank, size and the rendezvous address from the
 * environment (KOLO_*, then HOROVOD_*, torchrun's RANK/WORLD_SIZE/MASTER_*,
 * OMPI_COMM_WORLD_*, PMI_* and PMIX_*, SLURM_*; nothing set: a world of one),
 * meets every other rank and connects to it. Blocks until the whole job is
 * connected or KOLO_START_TIMEOUT seconds (default 30) have passed; then
 * fails with KOLO_ERR_STARTUP and a message naming the ranks that never came.
 * Calling it again while initialized returns KOLO_OK and does nothing.
 * After kolo_shutdown() it may be called again to join a new job.
 * Call it from one thread; not concurrently with any other kolo call.
 * A child forked after kolo_init() (a data loader's worker) is not a rank:
 * kolo_rank() and the other queries answer as in its parent (kolo_init()
 * too returns KOLO_OK there), while collectives and waits on requests fail
 * at once with KOLO_ERR_NOT_INITIALIZED, saying so; its kolo_shutdown()
 * leaves the parent's job alone, and kolo_init() after it fails. */
KOLO_EXTERN int kolo_init(void);

/* Leaves the job: stops the engine (its pending requests complete with
 * KOLO_ERR_SHUT_DOWN), closes every connection, frees everything.
 * Not collective: it does not wait for other ranks. Returns KOLO_OK, also
 * when not initialized. Not concurrently with other kolo calls. In a child
 * forked after kolo_init() it only marks kolo not initialized there. */
KOLO_EXTERN int kolo_shutdown(void);

/* 1 between a successful kolo_init() and kolo_shutdown(), else 0. */
KOLO_EXTERN int kolo_is_initialized(void);

/* This rank's place in the job; -1 when not initialized.
 * local: among the ranks on this host; cross: among the hosts, i.e. the
 * index of this host (cross_size = number of hosts when every host runs the
 * same number of ranks, as in Horovod). */
KOLO_EXTERN int kolo_rank(void);
KOLO_EXTERN int kolo_size(void);
KOLO_EXTERN int kolo_local_rank(void);
KOLO_EXTERN int kolo_local_size(void);
KOLO_EXTERN int kolo_cross_rank(void);
KOLO_EXTERN int kolo_cross_size(void);

/* The transport used to reach world rank `peer` ("self", "shm", "tcp"), or
 * NULL when not initialized or peer is out of range. Static string. "shm" only
 * when every connection to the peer (direct collectives', the engine's) has
 * shared memory: where /dev/shm is short of room, one may go by TCP alone. */
KOLO_EXTERN const char *kolo_peer_transport(int peer);

/* ---- Process sets ------------------------------------------------------------
 * A process set is a subset of the world's ranks on which collectives run.
 * KOLO_WORLD (0) is every rank. Ids are small non-negative integers. */
#define KOLO_WORLD 0

/* Creates a process set of the given world ranks (strictly increasing, each in
 * [0, size)). Collective over the WORLD: every rank must call it with the same
 * list, in the same order relative to other collectives; a rank whose list
 * differs gets KOLO_ERR_MISMATCH on every rank. On success *id is set (the
 * same on every rank); ranks outside the set get the id too, but their
 * collectives on it fail with KOLO_ERR_NOT_MEMBER. Blocks. */
KOLO_EXTERN int kolo_process_set_add(const int *ranks, int nranks, int *id);

/* Removes a process set. Collective over the WORLD, like add. KOLO_WORLD
 * cannot be removed (KOLO_ERR_INVALID_ARG). Blocks. */
KOLO_EXTERN int kolo_process_set_remove(int id);

/* This rank's rank within the set (-1 if not a member) and the set's size.
 * Return KOLO_ERR_INVALID_ARG for an unknown id. */
KOLO_EXTERN int kolo_process_set_rank(int id, int *rank);
KOLO_EXTERN int kolo_process_set_size(int id, int *size);
/* Copies the set's world ranks into ranks[0 .. min(cap, size)). */
KOLO_EXTERN int kolo_process_set_ranks(int id, int *ranks, int cap);

/* ---- Direct collectives (blocking) ------------------------------------------
 * Every member of the process set `pset` must call the same function with
 * matching arguments. Results are bit-identical on every rank. sendbuf may
 * equal recvbuf (in place) where the comment says so. A peer's death makes
 * the call fail with KOLO_ERR_PEER_LOST within a few seconds; a peer that
 * stops answering makes it fail with KOLO_ERR_TIMEOUT after KOLO_OP_TIMEOUT
 * seconds. After a job error, every later collective fails the same way. */

/* recvbuf[i] = postscale * OP over ranks of (prescale * sendbuf[i]), i < count.
 * In place allowed. Scale factors of 1.0 cost nothing; for integer dtypes
 * scaling is done in double and truncated toward zero. KOLO_AVERAGE divides
 * the sum by the set's size (after postscale). */
KOLO_EXTERN int kolo_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                               kolo_dtype_t dtype, kolo_op_t op, double prescale,
                               double postscale, int pset);

/* Concatenates every rank's sendbuf, in rank order, into recvbuf.
 * recvcounts[r] is the number of elements rank r sends (a different first
 * dimension per rank is allowed); NULL means every rank sends sendcount.
 * recvbuf holds the sum of the counts. sendbuf may point into recvbuf at this
 * rank's offset (in place). */
KOLO_EXTERN int kolo_allgather(const void *sendbuf, size_t sendcount, void *recvbuf,
                               const size_t *recvcounts, kolo_dtype_t dtype, int pset);

/* Copies root's buf[0 .. count) into every rank's buf. root is a rank of
 * the set (not a world rank). */
KOLO_EXTERN int kolo_broadcast(void *buf, size_t count, kolo_dtype_t dtype, int root, int pset);

/* Sends sendcounts[r] elements to each rank r of the set, taken from
 * sendbuf in rank order, and receives recvcounts[r] elements from each rank r
 * into recvbuf in rank order. recvcounts[r] must equal what rank r sends here;
 * if it does not, the call fails with KOLO_ERR_MISMATCH naming both ranks.
 * Not in place. */
KOLO_EXTERN int kolo_alltoall(const void *sendbuf, const size_t *sendcounts, void *recvbuf,
                              const size_t *recvcounts, kolo_dtype_t dtype, int pset);

/* Reduces every rank's sendbuf of rows * row_count elements (OP as in
 * kolo_allreduce, with the scale factors) and leaves rank r with its share of
 * the rows: rows / n each, and one more for the first rows % n ranks, in rank
 * order. recvbuf holds kolo_reducescatter_rows(rows, n, r) * row_count
 * elements. Not in place. */
KOLO_EXTERN int kolo_reducescatter(const void *sendbuf, void *recvbuf, size_t rows,
                                   size_t row_count, kolo_dtype_t dtype, kolo_op_t op,
                                   double prescale, double postscale, int pset);

/* Number of rows rank `r` of `n` receives from kolo_reducescatter. */
KOLO_EXTERN size_t kolo_reducescatter_rows(size_t rows, int n, int r);

/* Returns once every rank of the set has entered it. */
KOLO_EXTERN int kolo_barrier(int pset);

/* ---- Elastic jobs -------------------------------------------------------------
 * Under `kolorun --min-np/--max-np/--host-discovery-script` (docs/kolorun.md, "Elastic jobs")
 * the job goes on when workers fail or hosts come and go: kolorun re-forms it in rounds. A
 * worker learns of a lost peer from a failing collective (KOLO_ERR_PEER_LOST and the like),
 * calls kolo_shutdown() and kolo_init() again, and kolo_init joins the newest round with the
 * rank kolorun gave it there (rank 0 is the oldest worker still alive, so it holds the state
 * to share). A worker whose host left the job gets KOLO_ERR_REMOVED from kolo_init and should
 * exit. Outside elastic jobs these calls change nothing. */

/* 1 when kolorun started this process as a worker of an elastic job, else 0. */
KOLO_EXTERN int kolo_elastic_enabled(void);

/* The round of the elastic job this rank joined (1 for the first), 0 outside elastic jobs. */
KOLO_EXTERN int kolo_elastic_round(void);

#define KOLO_ELASTIC_NONE 0    /* no newer round */
#define KOLO_ELASTIC_ADDED 1   /* a newer round has new workers: they need the state */
#define KOLO_ELASTIC_REMOVED 2 /* newer rounds only lost workers or hosts */

/* Whether kolorun has formed a newer round than the one this rank is in; collective over
 * the world (rank 0 asks kolorun, every rank gets its answer), so every rank decides alike.
 * Horovod's check_host_updates(): on a non-zero *update every rank calls kolo_shutdown() and
 * kolo_init() to join the newer round. Outside elastic jobs: *update = 0, not collective. */
KOLO_EXTERN int kolo_elastic_check(int *update);

/* ---- Shared buffers ---------------------------------------------------------
 * kolo_mem_alloc returns `bytes` of zeroed memory that the other ranks of this host can map
 * (a memfd; nothing is left behind if the process dies). When every rank of a process set on
 * one host passes buffers from it, kolo_allreduce of more than 64 KiB (and above
 * KOLO_SMALL_ALLREDUCE_MAX, which defaults to that) reads and writes the peers' buffers
 * directly (so do the engine's fused allreduces when each rank's tensors lie in one such
 * buffer): each rank reduces its share straight from the others' inputs
 * and stores the results into every rank's output, with no copy through a ring or the kernel,
 * through the cache or around it, whichever times faster. Every input byte is read once and
 * every output byte written once (2 ranks, out of place: 64 MiB 6.5-6.7 ms against 16-17 from
 * malloc'd buffers, 128 KiB 4.1-4.5 us against 17-20). Otherwise
 * (any rank's buffer from malloc, ranks on several hosts, more than 16 ranks, a prescale factor
 * other than 1) the usual algorithms run: on one host from 4 MiB, the ring or the same direct
 * algorithm reading the peers' malloc'd buffers with process_vm_readv, whichever times faster
 * (KOLO_SHM_CMA). Works before kolo_init. A child forked from this process keeps the buffers
 * at the same addresses as private memory, as it would malloc'd memory: what it writes stays its
 * own (pages it has not written still show its parent's later writes). NULL with
 * kolo_last_error() set on failure; kolo_mem_free(NULL) does nothing. */
KOLO_EXTERN void *kolo_mem_alloc(size_t bytes);
KOLO_EXTERN int kolo_mem_free(void *p);

/* ---- The engine: named asynchronous requests ----------------------------------
 * A background thread (started by kolo_init, one per process) owns its own connections to
 * every peer (separate from the ones of the direct collectives above, so both kinds can be
 * used in one program: neither sees the other's bytes). Every request has a name. Ranks may
 * submit requests in any order; the engine negotiates which names are ready on every rank of
 * the process set, checks that they agree (op, dtype, shape, root, scale factors), runs them
 * in one order that every rank follows, fusing small compatible tensors into one collective
 * (KOLO_FUSION_THRESHOLD), and completes each request: its handle becomes ready and its
 * callback (if any) runs on the engine thread.
 *
 * Buffers: from submission until the request completes, the engine may read sendbuf and
 * write recvbuf at any time; the caller must keep them alive and not touch recvbuf (nor
 * write sendbuf). Outputs whose size is known only after negotiation (allgather, alltoall,
 * reducescatter) are owned by the request until kolo_request_release; those of 1 MiB and more
 * start on a 64-byte boundary and, released, serve the engine's next output of their size or a
 * little smaller, their pages already in memory (idle ones are kept up to the most output bytes
 * out at once in the last minute or two; kolo_shutdown frees them).
 *
 * Names: a non-NULL name is copied. NULL gets "<op>.noname.<n>" from a per-process counter
 * (so unnamed requests must be issued in the same order on every rank). Submitting a name
 * that is still in flight on this rank in the same process set fails at once with
 * KOLO_ERR_INVALID_ARG.
 *
 * Errors found in negotiation fail that request on every rank that submitted it, with a message
 * naming the tensor, what differs and the ranks: KOLO_ERR_MISMATCH when ranks disagree or a
 * collective other than allreduce and barrier meets a joined rank, KOLO_ERR_TIMEOUT for a stall
 * past KOLO_STALL_SHUTDOWN_TIME. The job goes on after them. A lost peer fails every pending
 * request (KOLO_ERR_PEER_LOST, naming the rank); a rank that calls kolo_shutdown fails the other
 * ranks' pending requests with KOLO_ERR_SHUT_DOWN naming it; afterwards every submission fails
 * at once with KOLO_ERR_SHUT_DOWN and a message that names the original cause. A submission
 * that fails sets its handles (*req, or reqs[0 .. n) of a grouped one) to NULL, which
 * kolo_request_release takes as a no-op.
 *
 * Thread safety: every function below may be called from any thread. */

typedef struct kolo_request kolo_request_t;

#define KOLO_MAX_DIMS 8
typedef struct kolo_shape {
    int ndim;                      /* 0 for a scalar */
    int64_t dims[KOLO_MAX_DIMS];
} kolo_shape_t;

/* Runs on the engine thread when the request completes (success or error). It must not
 * block; it may call kolo_request_status/error/output but not wait or release. */
typedef void (*kolo_callback_t)(kolo_request_t *req, void *user);

/* Common optional arguments of a submission; NULL means all defaults. */
typedef struct kolo_submit_opts {
    int process_set;          /* default KOLO_WORLD */
    kolo_callback_t callback; /* default none */
    void *user;               /* passed to the callback */
    const char *device;       /* "cpu" (default); the seam for device buffers, checked in negotiation */
} kolo_submit_opts_t;

/* recvbuf (shape of sendbuf) = postscale * OP over ranks (prescale * sendbuf). In place allowed. */
KOLO_EXTERN int kolo_iallreduce(const char *name, const void *sendbuf, void *recvbuf, kolo_dtype_t dtype,
                                const kolo_shape_t *shape, kolo_op_t op, double prescale, double postscale,
                                const kolo_submit_opts_t *opts, kolo_request_t **req);

/* Several allreduces submitted atomically as one group: the engine runs them together (in one
 * fused collective when they fit). names may be NULL (all unnamed) or hold NULLs. */
KOLO_EXTERN int kolo_igrouped_allreduce(int n, const char *const *names, const void *const *sendbufs,
                                        void *const *recvbufs, kolo_dtype_t dtype, const kolo_shape_t *shapes,
                                        kolo_op_t op, double prescale, double postscale,
                                        const kolo_submit_opts_t *opts, kolo_request_t **reqs);

/* Concatenates every rank's tensor along the first dimension (which may differ per rank; the
 * other dimensions must agree). The output is owned by the request: kolo_request_output. */
KOLO_EXTERN int kolo_iallgather(const char *name, const void *sendbuf, kolo_dtype_t dtype,
                                const kolo_shape_t *shape, const kolo_submit_opts_t *opts,
                                kolo_request_t **req);

/* Root's buf is copied into every rank's buf (same shape everywhere). root is a rank of the set. */
KOLO_EXTERN int kolo_ibroadcast(const char *name, void *buf, kolo_dtype_t dtype, const kolo_shape_t *shape,
                                int root, const kolo_submit_opts_t *opts, kolo_request_t **req);

/* Sends splits[r] first-dimension rows to each rank r of the set (splits NULL: the rows divided
 * evenly; the first dimension must then be divisible by the set's size). The received rows,
 * concatenated in rank order, are the request's output; kolo_request_splits gives how many
 * came from each rank. */
KOLO_EXTERN int kolo_ialltoall(const char *name, const void *sendbuf, kolo_dtype_t dtype,
                               const kolo_shape_t *shape, const int64_t *splits,
                               const kolo_submit_opts_t *opts, kolo_request_t **req);

/* Reduces every rank's tensor and leaves rank r its share of the first dimension (as
 * kolo_reducescatter). The output is owned by the request. */
KOLO_EXTERN int kolo_ireducescatter(const char *name, const void *sendbuf, kolo_dtype_t dtype,
                                    const kolo_shape_t *shape, kolo_op_t op, double prescale, double postscale,
                                    const kolo_submit_opts_t *opts, kolo_request_t **req);

/* This rank has no more data. Until every rank of the set has joined, allreduces of the others
 * proceed with this rank contributing zeros (it receives nothing; AVERAGE still divides by the
 * set's size) and barriers complete with it; allgather, broadcast, alltoall and reducescatter
 * fail on every rank with an error naming the joined ranks. Completes when all have joined;
 * kolo_request_join_last_rank then gives the last rank to join (a rank of the set). */
KOLO_EXTERN int kolo_ijoin(const kolo_submit_opts_t *opts, kolo_request_t **req);

/* Completes once every rank of the set has submitted it. */
KOLO_EXTERN int kolo_ibarrier(const kolo_submit_opts_t *opts, kolo_request_t **req);

/* Non-blocking: *done = 1 when the request has completed. Returns KOLO_OK or INVALID_ARG. */
KOLO_EXTERN int kolo_request_test(kolo_request_t *req, int *done);
/* Blocks until the request completes or timeout_s passes (timeout_s < 0: forever). Returns the
 * request's status, or KOLO_ERR_TIMEOUT if it has not completed (it goes on). A request counts
 * as completed (here and in kolo_request_test) once its callback, if any, has returned; the
 * members of a grouped allreduce complete together. */
KOLO_EXTERN int kolo_request_wait(kolo_request_t *req, double timeout_s);
/* The status of a completed request (1 while still pending) and its error message ("" if none). */
KOLO_EXTERN int kolo_request_status(const kolo_request_t *req);
KOLO_EXTERN const char *kolo_request_error(const kolo_request_t *req);
/* The request's name (static for the request's life). */
KOLO_EXTERN const char *kolo_request_name(const kolo_request_t *req);
/* Output of allgather, alltoall and reducescatter after completion: data owned by the request
 * (valid until release), its dtype and shape. For allreduce/broadcast: recvbuf/buf. */
KOLO_EXTERN int kolo_request_output(const kolo_request_t *req, const void **data, kolo_shape_t *shape);
/* Rows received from each rank by an alltoall: splits[0 .. min(cap, set size)). */
KOLO_EXTERN int kolo_request_splits(const kolo_request_t *req, int64_t *splits, int cap);
/* The last rank to join (a rank of the set), for a completed join request; -1 otherwise. */
KOLO_EXTERN int kolo_request_join_last_rank(const kolo_request_t *req);
/* Frees the handle. A request still pending is released when it completes (its buffers must
 * still stay valid until then). NULL is a no-op. */
KOLO_EXTERN void kolo_request_release(kolo_request_t *req);

/* Timeline: start writing a Chrome-trace JSON of this rank's engine activity (each rank its own
 * file: rank 0 writes path, rank r writes path.r), or stop and close it. KOLO_TIMELINE=path
 * starts one at init. Start while one is running closes it first. */
KOLO_EXTERN int kolo_timeline_start(const char *path, int mark_cycles);
KOLO_EXTERN int kolo_timeline_stop(void);

/* Counters of the engine, for tests and tuning. */
typedef struct kolo_engine_stats {
    uint64_t cycles;          /* engine cycles that did work */
    uint64_t requests;        /* requests completed */
    uint64_t cache_hits;      /* names negotiated through the response cache's bits */
    uint64_t cache_misses;    /* names negotiated through full descriptions */
    uint64_t cache_evictions;
    uint64_t fused_collectives; /* collectives that carried more than one tensor */
    uint64_t collectives;     /* collectives run by the engine */
    uint64_t stall_warnings;
} kolo_engine_stats_t;
KOLO_EXTERN int kolo_engine_stats(kolo_engine_stats_t *out);

/* The engine's fusion threshold and cycle time in use, and the autotuner's progress
 * (KOLO_AUTOTUNE=1: rank 0 tries values while the job runs and keeps the best; every rank applies
 * rank 0's values in the same cycle, so every rank reports the same). */
enum { KOLO_AUTOTUNE_OFF = 0, KOLO_AUTOTUNE_TUNING = 1, KOLO_AUTOTUNE_DONE = 2 };
typedef struct kolo_engine_params {
    double cycle_time_ms;
    size_t fusion_threshold;  /* bytes; 0: no fusion */
    int autotune;             /* KOLO_AUTOTUNE_* */
    int samples;              /* configurations the autotuner has scored */
} kolo_engine_params_t;
KOLO_EXTERN int kolo_engine_params(kolo_engine_params_t *out);

/* This rank's status as one JSON object: what it is doing and whom it waits for, for health
 * checks and for finding the rank a stuck job waits on. Callable from any thread while kolo is
 * initialized, also while other threads of the program are blocked in kolo (that is when it
 * is most useful); it waits half a second at most, for the engine thread. Writes at most cap
 * bytes, NUL-terminated, into buf and returns the length of the whole object (like snprintf:
 * call again with a larger buffer if it is >= cap), or a negative status. The members:
 *   rank, size, local_rank, host, pid, time (Unix seconds);
 *   failed: the first job error this rank has seen (a lost peer, a timeout), or null;
 *   direct: the direct collective a thread runs now, or null: {call ("kolo_allreduce", ...),
 *     process_set, seconds, and once it has passed its argument checks number (which of this
 *     rank's direct collectives on the set it is, from 1: the same call has the same number on
 *     every member), count (elements), what ("kolo_broadcast (float32, root 1)"); waiting_for};
 *   engine: null when the engine does not run, else {down (why it stopped, or null), cycle_ms,
 *     fusion_threshold, process_sets, activity, waiting_for}. process_sets: for each set this
 *     rank holds, {id, ranks (world ranks), pending: the tensors some members have submitted
 *     and others not yet, each {name, kind, seconds since some member submitted it,
 *     submitted_by, missing (world ranks)}, more (pending tensors not listed past 64),
 *     held_here (this rank's requests in the set), joined}; null if the engine thread did not
 *     answer in time (it is inside a cycle: see activity). activity: {doing ("waiting for the
 *     next cycle", "negotiating", "running"), process_set, seconds, and while running: tensor,
 *     fused_with (other requests in the same collective), answered};
 *   waiting_for (direct and engine): null, or, for a wait that has gone a liveness check (1-10
 *     ms) without progress, {ranks (the first 8), ranks_in_all, seconds_without_progress}.
 * With KOLO_STATUS_SIGNAL=USR1 (or USR2) set, every rank writes it to stderr on that signal. */
KOLO_EXTERN int kolo_status_json(char *buf, size_t cap);

/* ---- Testing hooks ------------------------------------------------------------
 * For tests that prove failure paths: make the Nth allocation (counting from
 * 1 at this call) or the Nth transport send made BY THE CALLING THREAD fail
 * (so the engine thread's own work neither consumes nor suffers it). 0
 * disables. Not for production use. */
KOLO_EXTERN void kolo_test_fail_alloc(long nth);
KOLO_EXTERN void kolo_test_fail_send(long nth);

#ifdef __cplusplus
}
#endif
#endif /* KOLO_H */
