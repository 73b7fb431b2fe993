/* request.c - the engine's public API: submissions (validated here, at the edge), request handles,
 * waiting, and completion of requests by the engine thread.
 *
 * A request has two references: the caller's (dropped by kolo_request_release) and the engine's
 * (dropped after completion and callback). Completion writes the result fields, removes the name
 * from the in-flight table (so that the same name may be submitted again as soon as a waiter
 * returns), makes the results readable, runs the callback, then publishes `done` under done_lock
 * and wakes every waiter. */
#include "internal.h"

#include "../reduce/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const kolo__kind_lower[KOLO__KIND_COUNT] = {"allreduce", "allgather", "broadcast", "alltoall",
                                                         "reducescatter", "join", "barrier"};
const char *const kolo__kind_upper[KOLO__KIND_COUNT] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                                                         "REDUCESCATTER", "JOIN", "BARRIER"};

const char *kolo__op_upper(int kind, int op)
{
    return kind == KOLO__ALLREDUCE && op == KOLO_ADASUM ? "ADASUM" : kolo__kind_upper[kind];
}

/* Waiters of every request share one condition variable: completions are published in batches
 * per collective (kolo__req_complete_ok) and waiters re-check their own request. */
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv;
static pthread_once_t done_once = PTHREAD_ONCE_INIT;

static void done_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&done_cv, &a);
    pthread_condattr_destroy(&a);
}

size_t kolo__desc_count(const kolo__desc *d)
{
    size_t c = 1;
    for (int i = 0; i < d->ndim; i++) c *= (size_t)d->dims[i];
    return c;
}

size_t kolo__desc_row(const kolo__desc *d)
{
    size_t c = 1;
    for (int i = 1; i < d->ndim; i++) c *= (size_t)d->dims[i];
    return c;
}

const char *kolo__shape_str(const int64_t *dims, int ndim, char *buf, size_t cap)
{
    size_t w = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (w < cap) snprintf(buf + w, cap - w, "]");
    return buf;
}

/* ---- outputs kept from call to call ----
 * An output the engine allocates is new memory at every call, and the allocator hands a large
 * block back to the kernel when it is freed, so every call paid a page fault per 4 KiB of it
 * again: from kolo.torch (2 ranks here), an allgather of 64 MB from each rank took 135 ms with
 * Python's copy of it kept (kolo._pool), 44-54 ms with this too, 18-26 ms with Python taking the
 * block itself as the output (no copy). A step asks for the same sizes every time: outputs of
 * 1 MiB and more come back here when their request goes, and the next output of that size takes
 * one. Outputs whose size changes a little from step to step share blocks (an allgather of
 * sparse gradients, whose rows vary with the batch, asks for a new size at nearly every step):
 * sizes are rounded up to eighths of their power of two (at most 12.5 % more), and an output
 * takes the smallest idle block of at least its size and at most a quarter more. Allgathers of
 * 29-32 MB from each of 2 ranks, sizes drawn at random: 50-57 ms a call with exact sizes, 49-53
 * with the rounding alone (a step's one idle block was of the other size half the time),
 * 12.5-14 ms with both (launches alternating, 3 each).
 *
 * Idle blocks are capped at the most output bytes out at once lately (what the job has shown it
 * needs: no memory beyond one step's outputs), and by count; over either, the block idle longest
 * is freed. "Lately" is this window of KEEP_WINDOW_NS and the one before: a job whose first steps
 * gathered far more than its later ones (a dataset's index gathered once, an evaluation pass)
 * gets those bytes back a window or two later, while a step that comes round within a window
 * keeps its blocks. The cap falls only at a call (alloc or free); a job that stops calling keeps
 * its idle blocks until the next call or kolo_shutdown. Blocks start on a 64-byte boundary, so
 * that kolo's Python packages can hand the block itself to the caller as the output's memory
 * (TensorFlow takes no less). */
#define KEPT_MIN ((size_t)1 << 20)
#define KEPT_MAX 16
#define KEEP_WINDOW_NS (60 * 1000000000ull)

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t bytes;
} kept[KEPT_MAX + 1]; /* idle blocks, the longest idle first */
static int nkept;
static size_t kept_bytes, out_bytes;
static size_t win_peak, prev_peak; /* the most out at once in this window and in the one before */
static uint64_t win_start, win_ns = KEEP_WINDOW_NS;

/* Starts a new window if this one is over (kept_lock held). A window that passed without a
 * call had out_bytes out all along, so that is its peak. */
static void roll(void)
{
    uint64_t now = kolo__now_ns();
    if (now - win_start >= win_ns) {
        prev_peak = now - win_start >= 2 * win_ns ? out_bytes : win_peak;
        win_peak = out_bytes;
        win_start = now;
    }
}

/* Moves the longest-idle blocks to drop[] until the idle ones fit the cap (kept_lock held). */
static int trim(size_t cap, void **drop)
{
    int ndrop = 0;
    while (nkept > KEPT_MAX || kept_bytes > cap) {
        drop[ndrop++] = kept[0].p;
        kept_bytes -= kept[0].bytes;
        memmove(&kept[0], &kept[1], (size_t)(--nkept) * sizeof(kept[0]));
    }
    return ndrop;
}

/* The size of the block for an output of `bytes` (KEPT_MIN or more): up to the next eighth of its
 * power of two. */
static size_t kept_size(size_t bytes)
{
    size_t p = (size_t)1 << (63 - __builtin_clzll((unsigned long long)bytes)), step = p / 8;
    return (bytes + step - 1) / step * step;
}

void *kolo__out_alloc(size_t *bytes_io)
{
    size_t bytes = *bytes_io;
    if (bytes >= KEPT_MIN) {
        bytes = kept_size(bytes);
        void *p = NULL;
        pthread_mutex_lock(&kept_lock);
        int best = -1; /* the smallest idle block that fits, up to a quarter larger */
        for (int i = nkept - 1; i >= 0; i--)
            if (kept[i].bytes >= bytes && kept[i].bytes <= bytes + bytes / 4 &&
                (best < 0 || kept[i].bytes < kept[best].bytes))
                best = i;
        if (best >= 0) {
            p = kept[best].p;
            bytes = kept[best].bytes;
            memmove(&kept[best], &kept[best + 1], (size_t)(nkept - best - 1) * sizeof(kept[0]));
            nkept--;
            kept_bytes -= bytes;
        }
        *bytes_io = bytes;
        roll();
        out_bytes += bytes;
        win_peak = KOLO_MAX(win_peak, out_bytes);
        void *drop[KEPT_MAX + 1];
        int ndrop = trim(KOLO_MAX(win_peak, prev_peak), drop);
        pthread_mutex_unlock(&kept_lock);
        for (int i = 0; i < ndrop; i++) kolo__free(drop[i]);
        if (p) return p;
        if ((p = kolo__malloc_aligned(bytes))) return p; /* 64: frameworks take it as tensors' memory */
        pthread_mutex_lock(&kept_lock);
        out_bytes -= bytes; /* never out: out_free sees NULL */
        pthread_mutex_unlock(&kept_lock);
        return NULL;
    }
    return kolo__malloc(bytes ? bytes : 1);
}

static void out_free(void *p, size_t bytes)
{
    if (!p || bytes < KEPT_MIN) { /* (a NULL output of KEPT_MIN or more was never counted out) */
        kolo__free(p);
        return;
    }
    void *drop[KEPT_MAX + 1];
    pthread_mutex_lock(&kept_lock);
    roll(); /* before out_bytes drops: a window that starts here saw this block out */
    out_bytes -= bytes;
    kept[nkept].p = p;
    kept[nkept++].bytes = bytes;
    kept_bytes += bytes;
    /* never this block: its bytes were out in this window, so the cap covers them */
    int ndrop = trim(KOLO_MAX(win_peak, prev_peak), drop);
    pthread_mutex_unlock(&kept_lock);
    for (int i = 0; i < ndrop; i++) kolo__free(drop[i]);
}

void kolo__engine_test_keep_window(double s)
{
    pthread_mutex_lock(&kept_lock);
    win_ns = s > 0 ? (uint64_t)(s * 1e9) : KEEP_WINDOW_NS;
    pthread_mutex_unlock(&kept_lock);
}

size_t kolo__engine_test_kept_bytes(void)
{
    pthread_mutex_lock(&kept_lock);
    size_t b = kept_bytes;
    pthread_mutex_unlock(&kept_lock);
    return b;
}

void kolo__out_clear(void)
{
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < nkept; i++) kolo__free(kept[i].p);
    nkept = 0;
    kept_bytes = 0;
    win_peak = out_bytes; /* (outputs may outlive the job) */
    prev_peak = 0;
    win_start = kolo__now_ns();
    pthread_mutex_unlock(&kept_lock);
}

/* ---- freeing ---- */

static void req_free(kolo_request_t *r)
{
    kolo__free(r->name);
    kolo__free(r->splits);
    out_free(r->out, r->out_bytes);
    kolo__free(r->out_splits);
    kolo__free(r->err);
    kolo__free(r);
}

void kolo__req_unref(kolo_request_t *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) req_free(r);
}

void kolo_request_release(kolo_request_t *req)
{
    if (req) kolo__req_unref(req);
}

/* ---- completion (engine thread) ---- */

/* Publishes n completed requests at once: their results become readable (`ready`), their
 * callbacks run, then waiters see them done, all members of a group together; then the
 * engine's references go. A waiter therefore returns after the callback has run. */
static void publish(kolo_request_t *const *rs, int n)
{
    pthread_once(&done_once, done_init);
    for (int i = 0; i < n; i++) atomic_store_explicit(&rs[i]->ready, 1, memory_order_release);
    for (int i = 0; i < n; i++)
        if (rs[i]->cb) rs[i]->cb(rs[i], rs[i]->user);
    atomic_fetch_add_explicit(&kolo__E.st.requests, (uint64_t)n, memory_order_relaxed);
    pthread_mutex_lock(&done_lock);
    int wake = 0;
    for (int i = 0; i < n; i++) {
        atomic_store_explicit(&rs[i]->done, 1, memory_order_release);
        wake |= rs[i]->waiters;
    }
    if (wake) pthread_cond_broadcast(&done_cv); /* a wake-up costs ~35 us here: only when awaited */
    pthread_mutex_unlock(&done_lock);
    for (int i = 0; i < n; i++) kolo__req_unref(rs[i]);
}

/* Completes the n requests in RS (this array is reordered): their names leave the in-flight
 * table, and those not in a group still waiting for its other members are published at once. */
static void complete(kolo_request_t **rs, size_t n)
{
    pthread_mutex_lock(&kolo__E.lock);
    for (size_t i = 0; i < n; i++) {
        if (rs[i]->dup.key) kolo__hmap_del(&kolo__E.inflight, &rs[i]->dup);
        rs[i]->dup.key = NULL;
    }
    pthread_mutex_unlock(&kolo__E.lock);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        kolo_request_t *r = rs[i];
        kolo__rgroup *g = r->group;
        if (!g) {
            rs[k++] = r;
            continue;
        }
        /* a group completes together: members wait here until the last one is done */
        r->stashed = 1;
        if (--g->remaining > 0) continue;
        for (int j = 0; j < g->n; j++) g->members[j]->group = NULL;
        publish(g->members, g->n);
        kolo__free(g);
    }
    if (k) publish(rs, (int)k);
}

/* A fused collective's requests were published one by one, each with its own wake-up: a thread
 * that waits for them in the order it submitted them (an optimizer's synchronize) woke at the
 * first, while the engine thread went on publishing the others on the same cores, and often
 * blocked again at the next. Steps of 8 allreduces of 256 floats, submitted, then waited for in
 * that order, took 59-76 us at 2 ranks (median 70; 19-35 waited for the other way round); 29-72
 * now (median 44; 6 launches each, Zen 3 VM). */
void kolo__req_complete_ok(kolo_request_t **rs, size_t n)
{
    for (size_t i = 0; i < n; i++) rs[i]->status = KOLO_OK;
    complete(rs, n);
}

void kolo__req_complete(kolo_request_t *r, int status, const char *msg)
{
    r->status = status;
    if (status != KOLO_OK) {
        kolo__free(r->err);
        r->err = kolo__strdup(msg && *msg ? msg : kolo_strerror(status)); /* NULL: kolo_strerror is shown */
    }
    complete(&r, 1);
}

/* ---- handles ---- */

static int result(const kolo_request_t *r)
{
    if (r->status == KOLO_OK) return KOLO_OK;
    return kolo__err(r->status, "%s", r->err ? r->err : kolo_strerror(r->status));
}

/* Whether req is done. publish() marks every member of a group done under done_lock, one after
 * the other, so a request seen done is followed through that lock: then every member of its
 * group reads done as well (a test of another member right after must not find it still
 * running; under TSan one did). */
static bool seen_done(kolo_request_t *req)
{
    if (!atomic_load_explicit(&req->done, memory_order_acquire)) return false;
    pthread_mutex_lock(&done_lock);
    pthread_mutex_unlock(&done_lock);
    return true;
}

int kolo_request_test(kolo_request_t *req, int *done)
{
    if (!req || !done) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_test: %s is NULL", req ? "done" : "req");
    *done = seen_done(req);
    return *done ? KOLO_OK : kolo__forked_refuse("kolo_request_test"); /* a child's would never end */
}

int kolo_request_wait(kolo_request_t *req, double timeout_s)
{
    if (!req) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_wait: req is NULL");
    if (seen_done(req)) return result(req);
    int forked = kolo__forked_refuse("kolo_request_wait");
    if (forked) return forked;
    pthread_once(&done_once, done_init);
    struct timespec dl = {0, 0};
    if (timeout_s >= 0) {
        if (timeout_s > 1e9) timeout_s = 1e9;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        double s = (double)dl.tv_sec + (double)dl.tv_nsec * 1e-9 + timeout_s;
        dl.tv_sec = (time_t)s;
        dl.tv_nsec = (long)((s - (double)dl.tv_sec) * 1e9);
    }
    int timed_out = 0;
    bool block = timeout_s != 0;
    if (block) kolo__engine_waiting(1); /* see "Waiters" in engine.c */
    pthread_mutex_lock(&done_lock);
    req->waiters++;
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        if (timeout_s < 0) {
            pthread_cond_wait(&done_cv, &done_lock);
        } else if (pthread_cond_timedwait(&done_cv, &done_lock, &dl) == ETIMEDOUT) {
            timed_out = !atomic_load_explicit(&req->done, memory_order_acquire);
            break;
        }
    }
    req->waiters--;
    pthread_mutex_unlock(&done_lock);
    if (block) kolo__engine_waiting(-1);
    if (timed_out)
        return kolo__err(KOLO_ERR_TIMEOUT, "request '%s' did not complete within %g s (it goes on)", req->name, timeout_s);
    return result(req);
}

int kolo_request_status(const kolo_request_t *req)
{
    if (!req) return KOLO_ERR_INVALID_ARG;
    if (!atomic_load_explicit(&req->ready, memory_order_acquire)) return 1;
    return req->status;
}

const char *kolo_request_error(const kolo_request_t *req)
{
    if (!req || !atomic_load_explicit(&req->ready, memory_order_acquire) || req->status == KOLO_OK) return "";
    return req->err ? req->err : kolo_strerror(req->status);
}

const char *kolo_request_name(const kolo_request_t *req) { return req ? req->name : ""; }

int kolo_request_output(const kolo_request_t *req, const void **data, kolo_shape_t *shape)
{
    if (!req) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_output: req is NULL");
    if (!atomic_load_explicit(&req->ready, memory_order_acquire))
        return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_output: request '%s' has not completed", req->name);
    if (req->status != KOLO_OK) return result(req);
    const void *p = NULL;
    kolo_shape_t sh;
    memset(&sh, 0, sizeof(sh));
    switch (req->d.kind) {
    case KOLO__ALLREDUCE:
    case KOLO__BROADCAST:
        p = req->recv;
        sh.ndim = req->d.ndim;
        memcpy(sh.dims, req->d.dims, sizeof(sh.dims));
        break;
    case KOLO__ALLGATHER:
    case KOLO__ALLTOALL:
    case KOLO__REDUCESCATTER:
        p = req->out;
        sh = req->out_shape;
        break;
    default:
        break;
    }
    if (data) *data = p;
    if (shape) *shape = sh;
    return KOLO_OK;
}

int kolo_request_splits(const kolo_request_t *req, int64_t *splits, int cap)
{
    if (!req || (!splits && cap > 0)) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_splits: NULL argument");
    if (!atomic_load_explicit(&req->ready, memory_order_acquire) || req->d.kind != KOLO__ALLTOALL)
        return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_request_splits: '%s' is not a completed alltoall", req->name);
    if (req->status != KOLO_OK) return result(req);
    for (int i = 0; i < cap && i < req->n_out_splits; i++) splits[i] = req->out_splits[i];
    return KOLO_OK;
}

int kolo_request_join_last_rank(const kolo_request_t *req)
{
    if (!req || req->d.kind != KOLO__JOIN || !atomic_load_explicit(&req->ready, memory_order_acquire) ||
        req->status != KOLO_OK)
        return -1;
    return req->last_joined;
}

/* ---- submission ---- */

typedef struct sub {
    const char *fn;
    int kind;
    const char *name;
    const void *send;
    void *recv;
    kolo_dtype_t dtype;
    const kolo_shape_t *shape;
    kolo_op_t op;
    double pre, post;
    int root;
    const int64_t *splits;
    const kolo_submit_opts_t *opts;
} sub;

/* The set's size and this rank's place in it; fails for unknown sets and non-members. */
static int set_info(const char *fn, int pset, int *size)
{
    pthread_mutex_lock(&kolo__W.pset_lock);
    const kolo__group *g = (pset >= 0 && pset < KOLO_MAX_PSETS) ? kolo__W.psets[pset] : NULL;
    int n = g ? g->size : 0, me = g ? g->rank : -1;
    pthread_mutex_unlock(&kolo__W.pset_lock);
    if (!g) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: process set %d does not exist (or was removed)", fn, pset);
    if (me < 0)
        return kolo__err(KOLO_ERR_NOT_MEMBER, "%s: rank %d is not a member of process set %d", fn, kolo__W.info.rank,
                         pset);
    *size = n;
    return KOLO_OK;
}

static int check_running(const char *fn)
{
    int forked = kolo__forked_refuse(fn);
    if (forked) return forked;
    pthread_mutex_lock(&kolo__E.lock);
    int running = kolo__E.running && !kolo__E.stop;
    pthread_mutex_unlock(&kolo__E.lock);
    if (!running) return kolo__err(KOLO_ERR_NOT_INITIALIZED, "%s: kolo is not initialized: call kolo_init() first", fn);
    return KOLO_OK;
}

/* What a description must be, checked at submission and again by every member of a set for every
 * other member's (negotiate.c): there, a description that fails was garbled on its way, and the
 * sizes a collective takes from it (an allgather's output, an alltoall's blocks) would be wrong.
 * SPLITS: an alltoall's n splits as bytes (unaligned in a message), or NULL for its default ones;
 * PSET: the set's id, for the message. Writes what is wrong into buf and returns it, or NULL. */
const char *kolo__desc_problem(const kolo__desc *d, const void *splits, int n, int pset, char *buf, size_t cap)
{
    int k = d->kind;
    if (k == KOLO__JOIN || k == KOLO__BARRIER) return NULL;
    bool reduces = k == KOLO__ALLREDUCE || k == KOLO__REDUCESCATTER;
    if (reduces && !kolo__op_valid((kolo_dtype_t)d->dtype, (kolo_op_t)d->op)) {
        snprintf(buf, cap, "op %s is not defined for dtype %s", kolo_op_name((kolo_op_t)d->op),
                 kolo_dtype_name((kolo_dtype_t)d->dtype));
        return buf;
    }
    if (reduces && d->op == KOLO_ADASUM && k != KOLO__ALLREDUCE) {
        snprintf(buf, cap, "op adasum is defined for allreduce only");
        return buf;
    }
    if (reduces && (!(d->pre - d->pre == 0) || !(d->post - d->post == 0))) {
        snprintf(buf, cap, "scale factors must be finite (prescale %g, postscale %g)", d->pre, d->post);
        return buf;
    }
    size_t count = 1, limit = ((size_t)1 << 48) / kolo_dtype_size((kolo_dtype_t)d->dtype);
    for (int i = 0; i < d->ndim; i++) {
        int64_t v = d->dims[i];
        if (v < 0) {
            snprintf(buf, cap, "dimension %d is negative (%lld)", i, (long long)v);
            return buf;
        }
        if (v && count > limit / (size_t)v) {
            char sh[200];
            snprintf(buf, cap, "the tensor is too large (shape %s: more than 2^48 bytes)",
                     kolo__shape_str(d->dims, d->ndim, sh, sizeof(sh)));
            return buf;
        }
        count *= (size_t)v;
    }
    if (k != KOLO__ALLREDUCE && k != KOLO__BROADCAST && d->ndim == 0) {
        snprintf(buf, cap, "a %s needs a tensor of at least one dimension", kolo__kind_lower[k]);
        return buf;
    }
    if (k == KOLO__BROADCAST && (d->root < 0 || d->root >= n)) {
        snprintf(buf, cap, "root %d is not a rank of process set %d (size %d)", d->root, pset, n);
        return buf;
    }
    if (k == KOLO__ALLTOALL && splits) {
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, (const unsigned char *)splits + (size_t)i * 8, 8);
            if (v < 0) {
                snprintf(buf, cap, "splits[%d] is negative (%lld)", i, (long long)v);
                return buf;
            }
            if (v > d->dims[0] - sum) { /* (not sum + v > dims[0]: that may overflow) */
                snprintf(buf, cap, "the splits add up to more than the first dimension %lld (%lld rows, then %lld)",
                         (long long)d->dims[0], (long long)sum, (long long)v);
                return buf;
            }
            sum += v;
        }
    }
    return NULL;
}

/* Validates one submission and makes its request (name still NULL when unnamed). */
static int build(const sub *s, kolo_request_t **out)
{
    const char *fn = s->fn;
    const kolo_submit_opts_t *o = s->opts;
    int pset = o ? o->process_set : KOLO_WORLD;
    const char *device = o && o->device ? o->device : "cpu";
    int k = s->kind;
    bool data = k != KOLO__JOIN && k != KOLO__BARRIER;
    bool reduces = k == KOLO__ALLREDUCE || k == KOLO__REDUCESCATTER;
    if (s->name && (!*s->name || strlen(s->name) > 1024))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: a name must have 1 to 1024 characters", fn);
    if (strlen(device) >= KOLO__DEVICE_MAX)
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: device name '%s' is too long", fn, device);
    kolo__desc d;
    memset(&d, 0, sizeof(d));
    d.kind = (uint8_t)k;
    d.pre = d.post = 1.0;
    snprintf(d.device, sizeof(d.device), "%s", device);
    if (data) {
        if ((unsigned)s->dtype >= KOLO_DTYPE_COUNT)
            return kolo__err(KOLO_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)s->dtype);
        if (reduces) {
            if ((unsigned)s->op >= KOLO_OP_COUNT)
                return kolo__err(KOLO_ERR_INVALID_ARG, "%s: unknown reduction op %d", fn, (int)s->op);
            d.op = (uint8_t)s->op;
            d.pre = s->pre;
            d.post = s->post;
        }
        if (!s->shape) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: shape is NULL", fn);
        if (s->shape->ndim < 0 || s->shape->ndim > KOLO_MAX_DIMS)
            return kolo__err(KOLO_ERR_INVALID_ARG, "%s: ndim %d is not in [0, %d]", fn, s->shape->ndim, KOLO_MAX_DIMS);
        d.dtype = (uint8_t)s->dtype;
        d.ndim = (uint8_t)s->shape->ndim;
        memcpy(d.dims, s->shape->dims, (size_t)d.ndim * sizeof(d.dims[0]));
    }
    int n = 0;
    int st = set_info(fn, pset, &n);
    if (st) return st;
    d.root = k == KOLO__BROADCAST ? s->root : 0;
    char why[256];
    /* what every member checks of every other's description too (negotiate.c) */
    if (kolo__desc_problem(&d, s->splits, n, pset, why, sizeof(why)))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s", fn, why);
    size_t count = data ? kolo__desc_count(&d) : 0;
    if (count && !s->send && k != KOLO__BROADCAST) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: sendbuf is NULL", fn);
    if (count && !s->recv && (k == KOLO__ALLREDUCE || k == KOLO__BROADCAST))
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: %s is NULL", fn, k == KOLO__BROADCAST ? "buf" : "recvbuf");
    if (k == KOLO__ALLTOALL && !s->splits && d.dims[0] % n)
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "%s: splits not given, but the first dimension (%lld) is not a multiple of the set's size %d",
                         fn, (long long)d.dims[0], n);
    kolo_request_t *r = kolo__calloc(1, sizeof(*r));
    if (!r) return kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory for a request", fn);
    if (k == KOLO__ALLTOALL) {
        r->splits = kolo__malloc((size_t)n * sizeof(int64_t));
        if (!r->splits) {
            kolo__free(r);
            return kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory for splits", fn);
        }
        r->nsplits = n;
        for (int i = 0; i < n; i++) r->splits[i] = s->splits ? s->splits[i] : d.dims[0] / n;
    }
    if (s->name && !(r->name = kolo__strdup(s->name))) {
        req_free(r);
        return kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory for the name", fn);
    }
    r->pset = pset;
    r->d = d;
    r->send = s->send;
    r->recv = s->recv;
    r->cb = o ? o->callback : NULL;
    r->user = o ? o->user : NULL;
    r->slot = -1;
    r->last_joined = -1;
    atomic_init(&r->done, 0);
    atomic_init(&r->ready, 0);
    atomic_init(&r->refs, 2);
    *out = r;
    return KOLO_OK;
}

/* Names the unnamed, checks names against the in-flight table and queues all of rs at once
 * (a group is atomic). On failure nothing is queued and the requests are freed. */
static int enqueue(const char *fn, kolo_request_t **rs, int n)
{
    int st = KOLO_OK, inserted = 0;
    uint64_t used[KOLO__KIND_COUNT] = {0};
    pthread_mutex_lock(&kolo__E.lock);
    if (!kolo__E.running || kolo__E.stop) {
        st = kolo__err(KOLO_ERR_NOT_INITIALIZED, "%s: kolo is not initialized (or is shutting down)", fn);
        goto out;
    }
    if (kolo__E.down) {
        st = kolo__err(KOLO_ERR_SHUT_DOWN,
                       "%s: kolo's engine has stopped because of an earlier error, and every later request fails: %s",
                       fn, kolo__E.down_msg);
        goto out;
    }
    for (int i = 0; i < n && !st; i++) {
        kolo_request_t *r = rs[i];
        if (!r->name) {
            char buf[64];
            int k = r->d.kind;
            if (k == KOLO__JOIN) snprintf(buf, sizeof(buf), "join.noname");
            else snprintf(buf, sizeof(buf), "%s.noname.%llu", kolo__kind_lower[k],
                          (unsigned long long)(kolo__E.noname[r->pset][k] + ++used[k]));
            r->name = kolo__strdup(buf);
            if (!r->name) {
                st = kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory for a name", fn);
                break;
            }
        }
        uint64_t h = kolo__hash(r->name, r->pset);
        if (kolo__hmap_get(&kolo__E.inflight, r->name, r->pset, h)) {
            st = kolo__err(KOLO_ERR_INVALID_ARG,
                           "%s: a request named '%s' is already in flight on process set %d; a name may be reused "
                           "once its request has completed",
                           fn, r->name, r->pset);
            break;
        }
        kolo__hmap_put(&kolo__E.inflight, &r->dup, r->name, r->pset, h);
        inserted++;
    }
    if (st) {
        for (int i = 0; i < inserted; i++) kolo__hmap_del(&kolo__E.inflight, &rs[i]->dup);
        goto out;
    }
    /* the requests of one call share one process set (a group is submitted with one opts) */
    for (int k = 0; k < KOLO__KIND_COUNT; k++) kolo__E.noname[rs[0]->pset][k] += used[k];
    /* The engine decides when to run its next cycle on whether the queue holds anything, so
     * only the request that makes it non-empty can change that decision. Waking it for every
     * later one costs a futex call here and a pointless wake-up there, per request: a
     * framework submits one per gradient (161 for ResNet-50) within a cycle. */
    bool wake = kolo__E.qhead == NULL;
    for (int i = 0; i < n; i++) {
        rs[i]->qnext = NULL;
        if (kolo__E.qtail) kolo__E.qtail->qnext = rs[i];
        else kolo__E.qhead = rs[i];
        kolo__E.qtail = rs[i];
    }
    if (wake) pthread_cond_signal(&kolo__E.wake);
out:
    pthread_mutex_unlock(&kolo__E.lock);
    if (st)
        for (int i = 0; i < n; i++) req_free(rs[i]);
    return st;
}

static int submit1(const sub *s, kolo_request_t **req)
{
    if (!req) return kolo__err(KOLO_ERR_INVALID_ARG, "%s: req is NULL", s->fn);
    /* a failed submission leaves NULL: a caller reusing one handle variable (release, submit
     * again, release) would otherwise release the previous request twice when the submission
     * fails, as a test of ours did once the engine had stopped before its submission */
    *req = NULL;
    int st = check_running(s->fn);
    if (st) return st;
    kolo_request_t *r;
    if ((st = build(s, &r))) return st;
    if ((st = enqueue(s->fn, &r, 1))) return st;
    *req = r;
    return KOLO_OK;
}

int kolo_iallreduce(const char *name, const void *sendbuf, void *recvbuf, kolo_dtype_t dtype, const kolo_shape_t *shape,
                    kolo_op_t op, double prescale, double postscale, const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_iallreduce", KOLO__ALLREDUCE, name, sendbuf, recvbuf, dtype, shape, op, prescale, postscale, 0,
             NULL, opts};
    return submit1(&s, req);
}

int kolo_igrouped_allreduce(int n, const char *const *names, const void *const *sendbufs, void *const *recvbufs,
                            kolo_dtype_t dtype, const kolo_shape_t *shapes, kolo_op_t op, double prescale,
                            double postscale, const kolo_submit_opts_t *opts, kolo_request_t **reqs)
{
    const char *fn = "kolo_igrouped_allreduce";
    if (n < 1 || !sendbufs || !recvbufs || !shapes || !reqs)
        return kolo__err(KOLO_ERR_INVALID_ARG, "%s: need n >= 1 and non-NULL sendbufs, recvbufs, shapes and reqs", fn);
    for (int i = 0; i < n; i++) reqs[i] = NULL; /* as submit1's */
    int st = check_running(fn);
    if (st) return st;
    kolo__rgroup *g = kolo__calloc(1, sizeof(*g) + (size_t)n * sizeof(kolo_request_t *));
    if (!g) return kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory", fn);
    int built = 0;
    for (; built < n; built++) {
        sub s = {fn, KOLO__ALLREDUCE, names ? names[built] : NULL, sendbufs[built], recvbufs[built], dtype,
                 &shapes[built], op, prescale, postscale, 0, NULL, opts};
        if ((st = build(&s, &g->members[built]))) break;
    }
    if (st) {
        for (int i = 0; i < built; i++) req_free(g->members[i]);
        kolo__free(g);
        return st;
    }
    g->n = g->remaining = n;
    for (int i = 0; i < n; i++) g->members[i]->group = g;
    kolo_request_t **tmp = kolo__malloc((size_t)n * sizeof(*tmp));
    if (!tmp) {
        for (int i = 0; i < n; i++) req_free(g->members[i]);
        kolo__free(g);
        return kolo__err(KOLO_ERR_NO_MEMORY, "%s: no memory", fn);
    }
    memcpy(tmp, g->members, (size_t)n * sizeof(*tmp));
    st = enqueue(fn, tmp, n); /* frees the requests on failure */
    if (st) {
        kolo__free(tmp);
        kolo__free(g);
        return st;
    }
    /* the engine may already be completing them: from here on the group is the engine's */
    for (int i = 0; i < n; i++) reqs[i] = tmp[i];
    kolo__free(tmp);
    return KOLO_OK;
}

int kolo_iallgather(const char *name, const void *sendbuf, kolo_dtype_t dtype, const kolo_shape_t *shape,
                    const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_iallgather", KOLO__ALLGATHER, name, sendbuf, NULL, dtype, shape, KOLO_SUM, 1, 1, 0, NULL, opts};
    return submit1(&s, req);
}

int kolo_ibroadcast(const char *name, void *buf, kolo_dtype_t dtype, const kolo_shape_t *shape, int root,
                    const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_ibroadcast", KOLO__BROADCAST, name, buf, buf, dtype, shape, KOLO_SUM, 1, 1, root, NULL, opts};
    return submit1(&s, req);
}

int kolo_ialltoall(const char *name, const void *sendbuf, kolo_dtype_t dtype, const kolo_shape_t *shape,
                   const int64_t *splits, const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_ialltoall", KOLO__ALLTOALL, name, sendbuf, NULL, dtype, shape, KOLO_SUM, 1, 1, 0, splits, opts};
    return submit1(&s, req);
}

int kolo_ireducescatter(const char *name, const void *sendbuf, kolo_dtype_t dtype, const kolo_shape_t *shape,
                        kolo_op_t op, double prescale, double postscale, const kolo_submit_opts_t *opts,
                        kolo_request_t **req)
{
    sub s = {"kolo_ireducescatter", KOLO__REDUCESCATTER, name, sendbuf, NULL, dtype, shape, op, prescale, postscale,
             0, NULL, opts};
    return submit1(&s, req);
}

int kolo_ijoin(const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_ijoin", KOLO__JOIN, NULL, NULL, NULL, KOLO_UINT8, NULL, KOLO_SUM, 1, 1, 0, NULL, opts};
    return submit1(&s, req);
}

int kolo_ibarrier(const kolo_submit_opts_t *opts, kolo_request_t **req)
{
    sub s = {"kolo_ibarrier", KOLO__BARRIER, NULL, NULL, NULL, KOLO_UINT8, NULL, KOLO_SUM, 1, 1, 0, NULL, opts};
    return submit1(&s, req);
}
