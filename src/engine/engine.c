/* engine.c - the engine thread: its cycle, the world step, process-set activation, start and stop.
 *
 * Ownership. One engine thread per process owns kolo__W.mesh[KOLO_CHANNEL_ENGINE] (no other
 * thread sends or receives on it), every process set's negotiation state (negotiate.c), the
 * fusion buffer and every request from the moment it leaves the submission queue until it
 * completes. User threads only validate a submission, add its name to the in-flight table,
 * append it to the queue and signal `wake` (request.c); they read a request's result fields
 * only after seeing `done` set (acquire), which the engine sets after writing them (release).
 *
 * Locks, in the order they may be taken (never the other way round):
 *   kolo__E.lock      queue, in-flight names, noname counters, running/stop/down state
 *   kolo__W.pset_lock the core's process-set table (the engine only reads it, to snapshot it)
 *   done_lock         (request.c) publication of completions to waiting threads
 * In practice the engine takes each of them alone: it never holds one while taking another,
 * and it never holds any while it runs a collective or a callback.
 *
 * The cycle. Every rank of the job runs the same sequence of steps on the engine mesh:
 *   1. the world step: the negotiation of process set 0 (see negotiate.c), whose fixed part
 *      also carries each rank's control flags: "leaving" (kolo_shutdown), "busy" (it holds
 *      requests); the bitmap of process sets it sees in the core's table; those of the sets
 *      it holds requests in and waits on (see "Cycle timing"); and its fusion threshold and
 *      cycle time, which with KOLO_AUTOTUNE every rank takes from rank 0's (autotune.c);
 *   2. from the gathered control flags, every rank decides the same things: if any rank is
 *      leaving, the engine stops everywhere (pending requests fail with KOLO_ERR_SHUT_DOWN
 *      naming the rank); a process set becomes active when every rank sees it and inactive
 *      when any rank no longer does (kolo_process_set_add/remove are collective, so every rank
 *      sees the change within a cycle or two, and all switch in the same cycle);
 *   3. the world's responses run, then each active set this rank belongs to runs its own
 *      negotiation and responses, in increasing id order, among its members only.
 *
 * Idle sets. A set none of whose members holds requests (the world headers' "holds" bitmaps)
 * has nothing to negotiate, and skips its step: every member reads the same bitmaps, and the
 * set's table of described names, which must be empty too, is the same on every member. With
 * two sets defined and unused, every world cycle ran two more exchanges, which a program that
 * waits for a step's requests in the order it submitted them and submits the next at once meets
 * on its path: engine-bench -p 1's short steps (8 allreduces of 256 floats) beside the two sets
 * took 150-174 us at 3 ranks and 264-363 at 4, where the same steps with no set took 76-122 and
 * 116-176; now 88-100 and 118-160 (3 launches each, Zen 3 VM). (Waited in the other order, or
 * behind 161 submissions, the exchanges ran while the program submitted, and cost nothing
 * measurable.) Horovod negotiates every set every cycle.
 *
 * Cycle timing. The cycle repeats every KOLO_CYCLE_TIME while this rank holds requests. A
 * rank that holds none backs off unless some rank holds requests of a process set that leaves
 * it out (below): after each cycle that ran none of its requests, the period doubles,
 * up to IDLE_MAX (4 ms; 50 ms until some rank has used the engine, so that programs of direct
 * collectives only are left alone). Such an engine sleeps on its condition variable and spends a
 * few microseconds per wake-up, and a submission wakes it at once (its first exchange then waits
 * at most IDLE_MAX for the other ranks). That is an idle world, and a world waiting for this
 * rank: a straggler, whose peers wait for world requests it has not submitted. Holding its
 * exchanges off delays nothing there, because such a request cannot run without this rank's
 * submission, and that starts a cycle at once. (The world was once counted busy as soon as any
 * rank held requests, and the straggler cycled every 1 ms.) The peers' engines, which start
 * cycles back to back while their threads wait (see "Waiters"), then wait in each exchange for
 * the straggler's next, asleep: a rank blocked 2 s on a straggler used 0.166 s of CPU and the
 * straggler 0.045 s; 0.027 and 0.020 s with the back-off, the dozing waits' liveness checks
 * every 10 ms instead of every 1 (net/xfer.c) and the short spin of "Dozing" (the back-off
 * alone: 0.058 s for the blocked rank); medians of 9 waits in 3 launches, 2 ranks on the 2-vCPU
 * Zen 4 VM. A process set's requests keep the ranks outside it at the cycle time: the members'
 * cycles begin with a world exchange, which must not wait out the back-off of a rank outside
 * the set. Its own members back off as the world's do, for the same reason (the set's requests
 * wait for their submissions). And while a thread of a member waits on them, a rank outside the
 * set starts its next cycle as soon as one ends, as though a thread of its own waited (see
 * "Waiters"): it is what the members' next exchange waits for, and it cannot see their threads.
 * Each rank's world header carries the sets it holds requests in and the sets of those a thread
 * of it waits on, for this. Not its members: the set's requests cannot run before its straggler
 * submits, and a straggler cycling back to back would only take the core from its own compute.
 * Measured on the 2-vCPU Zen 3 VM with engine-bench -p 1 (short steps of 8 allreduces of 256
 * floats on {1, ..., n-1}, submitted, then waited for, rank 0 idle; 3 launches each): 1084-1099
 * us a step at 3 ranks and 1094-1101 at 4 when every rank kept the cycle time for any set's
 * requests (it followed KOLO_CYCLE_TIME: a rank outside cycled at the period); now 92-115 and
 * 180-212, where the same steps on the world take 76-122 and 116-176. A member 2 s late to such
 * a set's request used 0.125 s of CPU then, its waiting peer 0.064 and the idle rank 0.083; now
 * 0.042-0.051, 0.033-0.037 and 0.020-0.024. A world of one sleeps until there is work.
 *
 * Waiters. The cycle time lets requests submitted close together meet in one cycle and fuse. A
 * thread blocked on a request (kolo_request_wait) submits nothing more before it returns, so
 * waiting out the period only delays it: while any thread waits and this rank still holds
 * requests, the engine starts its next cycle at once. (A waiter whose request has just
 * completed holds none: it is on its way out, and a cycle started for it would wait in its
 * exchange for the others' next period, taking turns on the core with the user thread's next
 * step.) That adds no exchanges for the other ranks: this rank's exchange waits for their next
 * cycle, by their period or their own waiters, which is where its request would have waited
 * anyway; meanwhile its engine thread waits inside the exchange (kolo__wait: spinning, then
 * yielding, then sleeping) instead of on `wake`, on a core whose user thread sleeps. A flush of
 * one cycle per wait is not enough: when that cycle meets a rank that has not submitted yet,
 * the next one comes only after a full period. Measured on the 2-vCPU Zen 4 VM, 2 ranks,
 * KOLO_CYCLE_TIME=1, launches of the build before and after interleaved: engine-bench's
 * latency-bound step (161 one-element tensors, submitted, then waited for) 95-207 us against
 * 1.12-1.13 ms (3 pairs); the demo's LeNet step (16 ms of compute, 8 gradients) spent a
 * median 1.1 ms in optimizer.step() against 1.9, and trained at 6589-7507 images/s against
 * 5919-7181 (medians 6878 and 6546, 6 pairs, 5 won).
 *
 * Dozing. While no thread is blocked on the engine, its user thread is computing (a backward
 * pass producing gradients) on the core the engine thread shares, and the engine's waits are
 * mostly for a peer whose engine has not reached the same cycle yet, often a millisecond or
 * more away: a wait that spins or yields takes the core from the compute. So such cycles mark
 * the engine mesh `doze`: its waits spin DOZE_SPIN_NS at most and then sleep until the peer
 * moves (net/xfer.c). A cycle started while a thread is blocked waits as before (spin, yield,
 * then sleep), for that thread's latency: with the doze there too (KOLO_SPIN_US of spin, then
 * sleep), engine-bench's latency-bound step of 161 one-element tensors took 72-346 us against
 * 69-108 (6 launches each, interleaved, on the 2-vCPU Zen 4 VM: a wake-up from a sleep costs
 * tens of microseconds there). But only for BLOCKED_YIELD_NS: a thread blocked for longer
 * waits for a straggler (a rank saving a checkpoint, say), and each of its cycles' exchanges
 * then waits up to the straggler's period (1 ms then, 4 ms with the back-off of "Cycle
 * timing"), never the 5 ms after which a wait stops yielding, so the engine yielded, on a core
 * with nothing else to run, for as long as the straggler took: a rank blocked 2 s in
 * kolo.allreduce used 2.0 s of CPU. After that time its cycles doze too, after the full spin
 * (KOLO_SPIN_US's default) in the responses' collectives: the last gradients of a training step
 * are reduced while a thread has waited that long for them, and a shorter spin would put the
 * exchange's every step to sleep. Only the world's exchange, which waits for a straggler's
 * next cycle, spins DOZE_SPIN_NS: with the full spin there, the rank blocked 2 s on a straggler
 * used 0.043-0.049 s of CPU, 0.021-0.032 s without. KOLO_SPIN_US, when set, turns dozing off. */
#include "internal.h"

#include "../trace/trace.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#define W kolo__W
#define E kolo__E

#define IDLE_MAX_NS 4000000ull         /* once any rank has used the engine */
#define IDLE_MAX_UNUSED_NS 50000000ull /* before: a program of direct collectives only */
#define LEAVE_GRACE_S 2
#define DOZE_SPIN_NS 10000ull       /* the spin before a doze (see "Dozing") */
#define BLOCKED_YIELD_NS 5000000ull /* a thread blocked this long: cycles doze too (see "Dozing") */
#define MAX_CACHE_CAPACITY 65536    /* KOLO_CACHE_CAPACITY is clamped to it */

kolo__engine kolo__E = {.lock = PTHREAD_MUTEX_INITIALIZER, .act_lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- going down ---- */

void kolo__engine_fail_mesh(int status)
{
    kolo__mesh *m = E.mesh;
    if (!m || m->failed) return;
    for (int p = 0; p < m->size; p++)
        if (m->conns[p]) {
            kolo__conn_fail(m->conns[p], status); /* fails the whole mesh: peers see us abort */
            return;
        }
}

static void fail_list(kolo_request_t *q, int status, const char *msg)
{
    while (q) {
        kolo_request_t *r = q;
        q = q->qnext;
        kolo__req_complete(r, status, msg);
    }
}

static void fail_everything(int status, const char *msg)
{
    for (int id = 0; id < KOLO_MAX_PSETS; id++) {
        if (E.sets[id]) kolo__pset_fail_all(E.sets[id], status, msg);
        kolo_request_t *q = E.waiting[id];
        E.waiting[id] = NULL;
        fail_list(q, status, msg);
    }
    pthread_mutex_lock(&E.lock);
    kolo_request_t *q = E.qhead;
    E.qhead = E.qtail = NULL;
    pthread_mutex_unlock(&E.lock);
    fail_list(q, status, msg);
    E.local_pending = 0;
}

/* The engine stops working for good: every pending request fails with (status, msg) and every
 * later submission fails at once with KOLO_ERR_SHUT_DOWN pointing at msg. */
static void go_down(int status, const char *msg)
{
    char copy[768];
    snprintf(copy, sizeof(copy), "%s", msg);
    pthread_mutex_lock(&E.lock);
    if (!E.down) {
        E.down = 1;
        E.down_status = status;
        snprintf(E.down_msg, sizeof(E.down_msg), "%s", copy);
    }
    pthread_mutex_unlock(&E.lock);
    fail_everything(status, copy);
}

/* When a peer is lost, the rank this engine heard from first may be one that aborted because
 * another died (a failed mesh aborts all its connections). For the ranks of this host, /proc
 * tells which process was killed by a signal (a zombie's exit code, while its parent has not
 * reaped it yet), so that the message can name the rank that died. Best effort only. */
static void explain_loss(char *msg, size_t cap)
{
    const kolo__peer_info *peers = W.peers;
    if (!peers) return;
    char killed[384] = "";
    size_t wk = 0;
    for (int p = 0; p < E.size; p++) {
        if (p == E.rank || strcmp(peers[p].hostkey, peers[E.rank].hostkey) != 0 || peers[p].pidns != peers[E.rank].pidns)
            continue; /* its pid names another process here */
        char path[64], buf[1024];
        snprintf(path, sizeof(path), "/proc/%d/stat", peers[p].pid);
        FILE *f = fopen(path, "re");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = '\0';
        const char *q = strrchr(buf, ')');
        if (!q || q[1] != ' ' || (q[2] != 'Z' && q[2] != 'X')) continue; /* alive, or reaped */
        /* field 52 (exit_code) counted from the state, field 3 */
        int field = 3;
        for (q += 2; *q && field < 52; q++)
            if (*q == ' ') field++;
        int code = field == 52 ? atoi(q) : 0;
        if ((code & 0x7f) && wk + 64 < sizeof(killed))
            wk += (size_t)snprintf(killed + wk, sizeof(killed) - wk, "rank %d was killed by signal %d (%s); ", p,
                                   code & 0x7f, strsignal(code & 0x7f));
    }
    if (!wk) return;
    char tmp[1400];
    snprintf(tmp, sizeof(tmp), "%s%s", killed, msg);
    size_t l = KOLO_MIN(strlen(tmp), cap - 1);
    memcpy(msg, tmp, l);
    msg[l] = '\0';
}

/* ---- process sets ---- */

/* Reads the core's table: which sets this rank sees, with a private copy of each new one. A set
 * whose group was replaced (removed and added again between two cycles) is reported absent
 * once, so that it is deactivated everywhere before the new one is activated. */
static void snapshot(void)
{
    memset(E.present, 0, sizeof(E.present));
    pthread_mutex_lock(&W.pset_lock);
    for (int id = 0; id < KOLO_MAX_PSETS; id++) {
        const kolo__group *g = W.psets[id];
        if (g != E.seen_ptr[id]) {
            bool was_active = E.sets[id] != NULL;
            kolo__free(E.seen[id].ranks);
            memset(&E.seen[id], 0, sizeof(E.seen[id]));
            E.seen_ptr[id] = NULL;
            if (g) {
                E.seen[id].ranks = kolo__malloc((size_t)g->size * sizeof(int));
                if (!E.seen[id].ranks) continue; /* absent this cycle; tried again next cycle */
                memcpy(E.seen[id].ranks, g->ranks, (size_t)g->size * sizeof(int));
                E.seen[id].size = g->size;
                E.seen[id].rank = g->rank;
                E.seen_ptr[id] = g;
            }
            if (was_active) continue;
        }
        if (E.seen_ptr[id]) E.present[id / 64] |= 1ull << (id % 64);
    }
    pthread_mutex_unlock(&W.pset_lock);
}

static void route(kolo_request_t *r)
{
    kolo__pset_state *s = E.sets[r->pset];
    if (s) {
        kolo__pset_add_local(s, r);
        return;
    }
    r->qnext = E.waiting[r->pset];
    E.waiting[r->pset] = r;
}

/* Applies the set changes every rank agreed on (AND of the presence bitmaps). */
static int update_sets(const uint64_t *agreed)
{
    for (int id = 1; id < KOLO_MAX_PSETS; id++) {
        bool on = (agreed[id / 64] >> (id % 64)) & 1;
        if (E.sets[id] && !on) {
            char msg[160];
            snprintf(msg, sizeof(msg), "process set %d was removed while this request was pending", id);
            kolo__pset_fail_all(E.sets[id], KOLO_ERR_SHUT_DOWN, msg);
            kolo__pset_free(E.sets[id]);
            E.sets[id] = NULL;
        } else if (!E.sets[id] && on && E.seen[id].rank >= 0 && E.seen[id].ranks) {
            E.sets[id] = kolo__pset_new(id, &E.seen[id], E.seen[id].rank, E.capacity);
            if (!E.sets[id]) return KOLO_ERR_NO_MEMORY;
        }
        if (E.waiting[id]) {
            kolo_request_t *q = E.waiting[id];
            if (E.sets[id]) {
                /* the waiting list is newest first: restore submission order */
                kolo_request_t *rev = NULL;
                while (q) {
                    kolo_request_t *r = q;
                    q = q->qnext;
                    r->qnext = rev;
                    rev = r;
                }
                E.waiting[id] = NULL;
                while (rev) {
                    kolo_request_t *r = rev;
                    rev = rev->qnext;
                    kolo__pset_add_local(E.sets[id], r);
                }
            } else if (!E.seen_ptr[id]) {
                char msg[160];
                snprintf(msg, sizeof(msg), "process set %d was removed before this request could run", id);
                E.waiting[id] = NULL;
                fail_list(q, KOLO_ERR_SHUT_DOWN, msg);
            }
        }
    }
    return KOLO_OK;
}

/* ---- the cycle ---- */

/* Returns the requests this rank holds. With NOTE, also fills E.holds, the process sets (not the
 * world) it holds requests in, and E.waits, the same while a thread of it waits (see "Cycle
 * timing"). */
static int count_pending(bool note)
{
    int n = 0;
    if (note) {
        memset(E.holds, 0, sizeof(E.holds));
        memset(E.waits, 0, sizeof(E.waits));
    }
    for (int id = 0; id < KOLO_MAX_PSETS; id++) {
        const kolo__pset_state *s = E.sets[id];
        int k = (s ? (int)s->nlocal + (s->join_req != NULL) : 0) + (E.waiting[id] != NULL);
        n += k;
        if (note && k && id > 0) {
            E.holds[id / 64] |= 1ull << (id % 64);
            if (E.cycle_blocked) E.waits[id / 64] |= 1ull << (id % 64);
        }
    }
    return n;
}

/* Some set of SETS (a bitmap) leaves this rank out, or is not active here yet */
static bool outside_any(const uint64_t *sets)
{
    for (int w = 0; w < KOLO_MAX_PSETS / 64; w++)
        for (uint64_t b = sets[w]; b; b &= b - 1) {
            int id = w * 64 + __builtin_ctzll(b);
            if (!E.seen_ptr[id] || E.seen[id].rank < 0) return true;
        }
    return false;
}

/* ---- Status ----
 * kolo_status_json asks the engine thread for the sets' pending tables (they are its alone):
 * the asking thread counts a request up under `lock` and wakes the thread, which writes the
 * tables between cycles (in its wait for the next one, below) and answers on status_cv. A
 * thread stuck in a cycle (an exchange with a rank that does not come, a long collective)
 * cannot answer; what it does is published as it goes (act_*): a few relaxed stores a cycle,
 * and a lock per collective run for its name. */
static pthread_cond_t status_cv = PTHREAD_COND_INITIALIZER; /* outlives the engine; waited on by CLOCK_MONOTONIC */

static void act(int phase, int set)
{
    atomic_store_explicit(&E.act_set, set, memory_order_relaxed);
    atomic_store_explicit(&E.act_since, kolo__now_ns(), memory_order_relaxed);
    atomic_store_explicit(&E.act_phase, phase, memory_order_relaxed);
}

void kolo__engine_act_run(int set, const char *name, size_t more)
{
    pthread_mutex_lock(&E.act_lock);
    snprintf(E.act_name, sizeof(E.act_name), "%s", name);
    E.act_more = more;
    pthread_mutex_unlock(&E.act_lock);
    act(KOLO__ACT_RUN, set);
}

/* With `lock` held, on the engine thread. */
static void serve_status(void)
{
    kolo__sbuf b = {0};
    kolo__sb_put(&b, "[", 1);
    for (int id = 0; id < KOLO_MAX_PSETS; id++) {
        const kolo__pset_state *s = E.sets[id];
        if (!s) continue;
        kolo__sb_printf(&b, "%s{\"id\":%d,\"ranks\":[", b.len > 1 ? "," : "", id);
        for (int r = 0; r < s->n; r++) kolo__sb_printf(&b, "%s%d", r ? "," : "", s->g.ranks[r]);
        kolo__sb_put(&b, "],", 2);
        kolo__negotiate_status(s, &b);
        kolo__sb_put(&b, "}", 1);
    }
    kolo__sb_put(&b, "]", 1);
    kolo__free(E.status_text);
    E.status_text = b.oom ? NULL : b.p;
    if (b.oom) kolo__sb_free(&b);
    E.status_served = E.status_asked;
    pthread_cond_broadcast(&status_cv);
}

static const char *const act_names[] = {"waiting for the next cycle", "negotiating", "running"};

/* A wait of the engine thread's has made no progress for KOLO_STALL_CHECK_TIME (xfer.c). Every
 * rank's engine joins every cycle's exchange, a straggler's too (every 4 ms at most: "Cycle
 * timing"), so such a wait is not a rank late with its tensors, which the stall inspector
 * reports, but a rank whose engine stopped: the process stopped (SIGSTOP, a debugger), swapping,
 * or its engine thread stuck in a request's callback. On the engine thread. */
static void engine_stalled(const kolo__mesh *m, uint64_t waited_ns, const char *ranks)
{
    int phase = atomic_load_explicit(&E.act_phase, memory_order_relaxed);
    int set = atomic_load_explicit(&E.act_set, memory_order_relaxed);
    char what[192];
    if (phase == KOLO__ACT_RUN)
        snprintf(what, sizeof(what), "running '%s'%s on process set %d", E.act_name, E.act_more ? " (fused)" : "",
                 set);
    else snprintf(what, sizeof(what), "negotiating on process set %d", set);
    char when[64];
    KOLO_WARN("the engine has waited %.3g s for rank(s) %s without progress, %s: every rank's engine joins each "
              "cycle, so theirs has stopped (the process stopped or swapping, or a request's callback stuck); %s",
              (double)waited_ns * 1e-9, ranks, what, kolo__op_timeout_text(m, when));
}

void kolo__engine_status(kolo__sbuf *b)
{
    pthread_mutex_lock(&E.lock);
    if (!E.running) {
        pthread_mutex_unlock(&E.lock);
        kolo__sb_printf(b, "null");
        return;
    }
    uint64_t want = ++E.status_asked;
    pthread_cond_signal(&E.wake);
    /* a cycle's worth and more: the engine answers between cycles (the values in use are the
     * published ones: the autotuner changes E's on the engine thread) */
    double cycle_ms = (double)atomic_load_explicit(&E.pub_cycle_ns, memory_order_relaxed) * 1e-6;
    size_t fusion = (size_t)atomic_load_explicit(&E.pub_fusion, memory_order_relaxed);
    double wait_s = KOLO_MAX(0.5, 4e-3 * cycle_ms);
    /* by the monotonic clock: a wall-clock step (NTP, a suspended VM) neither cuts the wait short
     * nor stretches it */
    uint64_t end = kolo__now_ns() + (uint64_t)(wait_s * 1e9);
    struct timespec dl = {(time_t)(end / 1000000000ull), (long)(end % 1000000000ull)};
    while (E.status_served < want && E.running)
        if (pthread_cond_clockwait(&status_cv, &E.lock, CLOCK_MONOTONIC, &dl) == ETIMEDOUT) break;
    bool answered = E.status_served >= want && E.status_text;
    kolo__sb_printf(b, "{\"down\":");
    if (E.down) kolo__sb_jstr(b, E.down_msg);
    else kolo__sb_printf(b, "null");
    kolo__sb_printf(b, ",\"cycle_ms\":%.3f,\"fusion_threshold\":%zu,\"process_sets\":%s", cycle_ms, fusion,
                    answered ? E.status_text : "null");
    pthread_mutex_unlock(&E.lock);
    int phase = atomic_load_explicit(&E.act_phase, memory_order_relaxed);
    uint64_t since = atomic_load_explicit(&E.act_since, memory_order_relaxed), now = kolo__now_ns();
    kolo__sb_printf(b, ",\"activity\":{\"doing\":\"%s\",\"process_set\":%d,\"seconds\":%.3f",
                    act_names[phase >= 0 && phase <= KOLO__ACT_RUN ? phase : 0],
                    atomic_load_explicit(&E.act_set, memory_order_relaxed),
                    since && now > since ? (double)(now - since) * 1e-9 : 0.0);
    if (phase == KOLO__ACT_RUN) {
        pthread_mutex_lock(&E.act_lock);
        kolo__sb_printf(b, ",\"tensor\":");
        kolo__sb_jstr(b, E.act_name);
        kolo__sb_printf(b, ",\"fused_with\":%zu", E.act_more);
        pthread_mutex_unlock(&E.act_lock);
    }
    kolo__sb_printf(b, ",\"answered\":%s}", answered ? "true" : "false");
    if (E.mesh) kolo__status_mesh(b, E.mesh);
    kolo__sb_put(b, "}", 1);
}

/* *worked: the set had responses to run (read before kolo__negotiate_finish clears them; read
 * after it, a cycle that ran only a set's requests counted as idle in kolo_engine_stats) */
static int set_step(kolo__pset_state *s, int *worked)
{
    atomic_fetch_add_explicit(&E.set_steps, 1, memory_order_relaxed);
    act(KOLO__ACT_EXCHANGE, s->id);
    int st = kolo__negotiate_build(s, 0, NULL);
    if (!st) st = kolo__negotiate_gather_fixed(s);
    if (!st) st = kolo__negotiate_decide(s);
    if (!st) *worked |= s->nresp > 0;
    if (!st) st = kolo__execute(s);
    if (!st) st = kolo__negotiate_finish(s);
    if (!st) kolo__negotiate_stall_check(s);
    return st;
}

static int cycle(kolo_request_t *q)
{
    if (kolo__trace_on() && kolo__trace_mark_cycles()) kolo__trace_cycle();
    while (q) {
        kolo_request_t *r = q;
        q = q->qnext;
        route(r);
    }
    snapshot();
    kolo__pset_state *s0 = E.sets[0];
    act(KOLO__ACT_EXCHANGE, 0);
    uint64_t t0 = kolo__now_ns();
    int st = kolo__negotiate_build(s0, count_pending(true) ? KOLO__F_BUSY : 0, E.present);
    uint64_t t1 = kolo__now_ns();
    if (!st) {
        /* a dozing mesh's world exchange waits for the others' next cycle, mostly: it spins no
         * longer than DOZE_SPIN_NS even while a thread is blocked (see "Dozing") */
        uint64_t spin = E.doze ? E.mesh->spin_ns : 0;
        if (E.doze && E.mesh->doze) E.mesh->spin_ns = KOLO_MIN(spin, DOZE_SPIN_NS);
        st = kolo__negotiate_gather_fixed(s0);
        if (E.doze) E.mesh->spin_ns = spin;
    }
    if (st) return st;
    uint64_t t2 = kolo__now_ns();
    /* Time the next cycle from here, a moment every rank shares within microseconds: timing it
     * from each rank's own start would keep the first rank to arrive waiting for the last one
     * at every exchange. */
    E.t_last = t2;
    atomic_fetch_add_explicit(&E.world_cycles, 1, memory_order_relaxed);
    if (E.autotune) {
        const kolo__fixed_hdr *h0 = kolo__fixed_of(s0, 0);
        if ((st = kolo__tune_apply(h0->tune_fusion, h0->tune_cycle_us, h0->tune_state))) return st;
    }
    /* the control fields every rank reads the same */
    uint64_t agreed[KOLO_MAX_PSETS / 64], held[KOLO_MAX_PSETS / 64] = {0}, waited[KOLO_MAX_PSETS / 64] = {0};
    memset(agreed, 0xff, sizeof(agreed));
    int leaving = -1, busy = 0, described = 0;
    for (int r = 0; r < s0->n; r++) {
        const kolo__fixed_hdr *h = kolo__fixed_of(s0, r);
        if ((h->flags & KOLO__F_LEAVING) && leaving < 0) leaving = r;
        busy |= (h->flags & KOLO__F_BUSY) != 0;
        described |= h->varlen != 0;
        for (int w = 0; w < KOLO_MAX_PSETS / 64; w++) {
            agreed[w] &= h->present[w];
            held[w] |= h->holds[w];
            waited[w] |= h->waits[w];
        }
    }
    /* see "Cycle timing": a set's requests wait for this rank's world exchanges */
    E.needed = outside_any(held);
    E.hurry = E.needed && outside_any(waited);
    if (E.needed) atomic_fetch_add_explicit(&E.needed_cycles, 1, memory_order_relaxed);
    if (leaving >= 0) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "rank %d left the job (kolo_shutdown) while this request was pending; its engine stops with it",
                 leaving);
        go_down(KOLO_ERR_SHUT_DOWN, msg);
        return KOLO_OK;
    }
    E.world_busy = busy;
    st = kolo__negotiate_decide(s0);
    if (st) return st;
    if (!described) {
        atomic_fetch_add_explicit(&E.st.negotiations, 1, memory_order_relaxed);
        uint64_t t3 = kolo__now_ns();
        atomic_fetch_add_explicit(&E.st.negotiation_ns, t3 - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&E.st.negotiation_local_ns, (t1 - t0) + (t3 - t2), memory_order_relaxed);
    }
    int worked = s0->nresp > 0;
    if ((st = kolo__execute(s0)) || (st = kolo__negotiate_finish(s0))) return st;
    kolo__negotiate_stall_check(s0);
    if ((st = update_sets(agreed))) return st;
    for (int id = 1; id < KOLO_MAX_PSETS; id++) {
        kolo__pset_state *s = E.sets[id];
        /* a set none of whose members holds requests has nothing to negotiate (every member
         * reads the same `held` and keeps the same table): see "Idle sets" */
        if (!s || (!((held[id / 64] >> (id % 64)) & 1) && !s->ehead)) continue;
        if ((st = set_step(s, &worked))) return st;
    }
    act(KOLO__ACT_IDLE, 0);
    if (worked) atomic_fetch_add_explicit(&E.st.cycles, 1, memory_order_relaxed);
    if (E.autotune) kolo__tune_after_cycle();
    E.local_pending = count_pending(false);
    int quiet = E.needed || worked || E.local_pending ? 0 : E.quiet_cycles + 1;
    atomic_store_explicit(&E.quiet_cycles, quiet, memory_order_relaxed); /* the tests read it */
    E.used |= busy;
    return KOLO_OK;
}

/* Tells the others this rank leaves, then fails what it still holds. */
static void leave(kolo_request_t *q)
{
    while (q) {
        kolo_request_t *r = q;
        q = q->qnext;
        route(r);
    }
    if (!E.down && E.size > 1) {
        kolo__pset_state *s0 = E.sets[0];
        int st = kolo__negotiate_build(s0, KOLO__F_LEAVING, E.present);
        if (!st) st = kolo__negotiate_gather_fixed(s0);
        if (st) KOLO_DEBUG("engine: the goodbye exchange failed: %s", kolo__errmsg());
    }
    fail_everything(KOLO_ERR_SHUT_DOWN, "kolo_shutdown was called while this request was pending");
}

/* MINE: this rank holds requests or has new ones (see "Cycle timing" above) */
static uint64_t period_ns(bool mine)
{
    uint64_t c = (uint64_t)(E.cycle_s * 1e9);
    if (mine) return c;
    uint64_t p = c ? c : 100000;
    uint64_t cap = E.used ? IDLE_MAX_NS : IDLE_MAX_UNUSED_NS;
    for (int i = atomic_load_explicit(&E.quiet_cycles, memory_order_relaxed); i > 0 && p < cap; i--) p *= 2;
    return KOLO_MIN(p, cap);
}

void kolo__engine_waiting(int delta)
{
    pthread_mutex_lock(&E.lock);
    if (delta > 0 && E.blocked == 0) E.blocked_since = kolo__now_ns();
    E.blocked += delta;
    if (delta > 0) pthread_cond_signal(&E.wake);
    pthread_mutex_unlock(&E.lock);
}

static void *engine_main(void *arg)
{
    (void)arg;
    E.t_last = kolo__now_ns();
    for (;;) {
        pthread_mutex_lock(&E.lock);
        for (;;) {
            if (E.status_asked != E.status_served) serve_status();
            if (E.stop) break;
            bool work = E.qhead != NULL;
            if (E.down && !work) {
                pthread_cond_wait(&E.wake, &E.lock);
                continue;
            }
            bool busy = work || E.local_pending || E.world_busy;
            if (!busy && E.size == 1) {
                pthread_cond_wait(&E.wake, &E.lock);
                continue;
            }
            /* a thread waits, and this rank still holds requests (one is its): see "Waiters" */
            if (E.blocked && (work || E.local_pending)) break;
            if (E.hurry) break; /* another rank's thread waits on a set this rank is not in */
            uint64_t now = kolo__now_ns(), dl = E.t_last + period_ns(work || E.local_pending);
            if (now >= dl) {
                if (E.needed) atomic_fetch_add_explicit(&E.needed_timed, 1, memory_order_relaxed);
                break;
            }
            struct timespec ts = {(time_t)(dl / 1000000000ull), (long)(dl % 1000000000ull)};
            pthread_cond_timedwait(&E.wake, &E.lock, &ts);
        }
        int stop = E.stop, down = E.down;
        E.cycle_blocked = E.blocked;
        if (E.doze) { /* see "Dozing" */
            E.mesh->doze = !E.blocked || kolo__now_ns() - E.blocked_since > BLOCKED_YIELD_NS;
            E.mesh->spin_ns = E.blocked ? E.spin_ns : KOLO_MIN(E.spin_ns, DOZE_SPIN_NS);
        }
        kolo_request_t *q = E.qhead;
        E.qhead = E.qtail = NULL;
        pthread_mutex_unlock(&E.lock);
        if (stop) {
            leave(q);
            break;
        }
        if (down) {
            fail_list(q, KOLO_ERR_SHUT_DOWN, E.down_msg);
            continue;
        }
        E.t_last = kolo__now_ns();
        int st = cycle(q);
        pthread_mutex_lock(&E.lock);
        stop = E.stop;
        pthread_mutex_unlock(&E.lock);
        if (st != KOLO_OK && stop) {
            /* kolo_shutdown cut the connections of a cycle the others did not finish */
            go_down(KOLO_ERR_SHUT_DOWN, "kolo_shutdown was called while this request was pending");
        } else if (st != KOLO_OK) {
            char msg[768];
            snprintf(msg, sizeof(msg), "%s", kolo__errmsg());
            if (st == KOLO_ERR_PEER_LOST) explain_loss(msg, sizeof(msg));
            if (st != KOLO_ERR_PEER_LOST && st != KOLO_ERR_TIMEOUT) KOLO_ERROR("engine: %s", msg);
            kolo__err(st, "%s", msg);
            kolo__engine_fail_mesh(st);
            kolo__elastic_ask(E.mesh); /* the round failed: ask kolorun for the next one now */
            go_down(st, msg);
        }
    }
    return NULL;
}

/* ---- start and stop ---- */

/* Rank 0 writes PATH, rank r PATH.r. An elastic job's rounds after the first write
 * PATH.roundG and PATH.roundG.r: ranks change hands between rounds, and a round's rank r
 * reopening PATH.r would truncate the timeline another worker wrote there. */
static void timeline_path(const char *path, int rank, char *out, size_t cap)
{
    char round[32] = "";
    if (W.elastic && W.elastic_round > 1) snprintf(round, sizeof(round), ".round%d", W.elastic_round);
    if (rank == 0) snprintf(out, cap, "%s%s", path, round);
    else snprintf(out, cap, "%s%s.%d", path, round, rank);
}

/* Every rank adopts rank 0's cache capacity and fusion threshold: the bits and the fusion
 * buckets must mean the same on every rank. And rank 0's KOLO_AUTOTUNE: with it, every rank
 * applies rank 0's values each cycle (autotune.c). */
static int agree_settings(void)
{
    uint64_t mine[3] = {(uint64_t)E.capacity, (uint64_t)E.fusion, (uint64_t)E.autotune};
    if (kolo__engine_garble_take(KOLO__GARBLE_SETTINGS)) mine[0] = (uint64_t)1 << 40;
    uint64_t *all = kolo__calloc((size_t)E.size * 3, sizeof(uint64_t));
    size_t *counts = kolo__calloc((size_t)E.size, sizeof(size_t));
    int st = (all && counts) ? KOLO_OK : kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the engine's start");
    for (int r = 0; r < E.size && !st; r++) counts[r] = sizeof(mine);
    if (!st) st = kolo__coll_allgather_few_peers(E.mesh, W.psets[0], mine, all, counts, 1); /* negotiate.c, gather() */
    /* The collectives read some settings into function-local statics on first use; do that
     * here, before the engine thread and user threads can race on the first use. */
    int32_t one = 1, sum = 0;
    if (!st) st = kolo__coll_allreduce(E.mesh, W.psets[0], &one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1);
    (void)kolo__coll_chunk();
    /* rank 0's values as kolo_init reads them (a garbled capacity cast to int could be negative) */
    if (!st && (all[0] > MAX_CACHE_CAPACITY || all[2] > KOLO_AUTOTUNE_DONE))
        st = kolo__err(KOLO_ERR_PROTOCOL, "rank 0 sent engine settings no kolo sends: KOLO_CACHE_CAPACITY=%llu (at "
                       "most %d), KOLO_AUTOTUNE state %llu (at most %d); the message was garbled on its way",
                       (unsigned long long)all[0], MAX_CACHE_CAPACITY, (unsigned long long)all[2], KOLO_AUTOTUNE_DONE);
    if (!st) {
        if (all[0] != mine[0] || all[1] != mine[1])
            KOLO_WARN("engine: rank 0 uses KOLO_CACHE_CAPACITY=%llu and KOLO_FUSION_THRESHOLD=%llu; this rank had "
                      "%llu and %llu and follows rank 0",
                      (unsigned long long)all[0], (unsigned long long)all[1], (unsigned long long)mine[0],
                      (unsigned long long)mine[1]);
        if (!all[2] != !mine[2])
            KOLO_WARN("engine: rank 0 %s KOLO_AUTOTUNE and this rank %s; every rank follows rank 0",
                      all[2] ? "has" : "does not have", mine[2] ? "has" : "does not");
        E.capacity = (int)all[0];
        E.fusion = (size_t)all[1];
        E.autotune = (int)all[2];
    }
    kolo__free(all);
    kolo__free(counts);
    return st;
}

static void reset_stats(void)
{
    kolo__stats_atomic *s = &E.st;
    _Atomic uint64_t *f[] = {&s->cycles, &s->requests, &s->cache_hits, &s->cache_misses, &s->cache_evictions,
                             &s->fused_collectives, &s->collectives, &s->stall_warnings, &s->negotiations,
                             &s->negotiation_ns, &s->negotiation_local_ns};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(f); i++) atomic_store(f[i], 0);
}

static void free_state(void)
{
    for (int id = 0; id < KOLO_MAX_PSETS; id++) {
        kolo__pset_free(E.sets[id]);
        E.sets[id] = NULL;
        kolo__free(E.seen[id].ranks);
        memset(&E.seen[id], 0, sizeof(E.seen[id]));
        E.seen_ptr[id] = NULL;
    }
    kolo__execute_free();
    kolo__out_clear(); /* the next job may ask for other sizes */
}

int kolo__engine_start(void)
{
    E.mesh = W.mesh[KOLO_CHANNEL_ENGINE];
    if (E.mesh) E.mesh->on_stall = engine_stalled;
    E.rank = W.info.rank;
    E.size = W.info.size;
    double ms = kolo__setting_double(KOLO_SET_CYCLE_TIME);
    E.cycle_s = ms > 0 && ms < 1e6 ? ms * 1e-3 : 0;
    long cap = kolo__setting_long(KOLO_SET_CACHE_CAPACITY);
    E.capacity = (int)(cap < 0 ? 0 : cap > MAX_CACHE_CAPACITY ? MAX_CACHE_CAPACITY : cap);
    E.fusion = kolo__setting_bytes(KOLO_SET_FUSION_THRESHOLD);
    E.stall_disable = kolo__setting_long(KOLO_SET_STALL_CHECK_DISABLE) > 0;
    /* as many times LEAVE_GRACE_S as ranks crowd each core: their cycles take turns on it */
    E.leave_grace_s = LEAVE_GRACE_S * (int)KOLO_MIN(kolo__core_crowd(W.peers, W.info.size, W.info.rank), (size_t)1000);
    E.doze = E.mesh && !kolo__setting_is_set(KOLO_SET_SPIN_US); /* see "Dozing" */
    if (E.doze) E.spin_ns = E.mesh->spin_ns;
    E.stall_check = kolo__setting_double(KOLO_SET_STALL_CHECK_TIME);
    E.stall_shutdown = kolo__setting_double(KOLO_SET_STALL_SHUTDOWN_TIME);
    /* with both knobs set there is nothing to tune: done from the start (autotune.c) */
    E.autotune = E.size < 2 || kolo__setting_long(KOLO_SET_AUTOTUNE) <= 0 ? KOLO_AUTOTUNE_OFF
                 : kolo__setting_is_set(KOLO_SET_FUSION_THRESHOLD) && kolo__setting_is_set(KOLO_SET_CYCLE_TIME)
                     ? KOLO_AUTOTUNE_DONE
                     : KOLO_AUTOTUNE_TUNING;
    E.world_busy = 0;
    E.hurry = E.needed = false;
    atomic_store_explicit(&E.quiet_cycles, 0, memory_order_relaxed);
    atomic_store_explicit(&E.world_cycles, 0, memory_order_relaxed);
    atomic_store_explicit(&E.needed_cycles, 0, memory_order_relaxed);
    atomic_store_explicit(&E.needed_timed, 0, memory_order_relaxed);
    atomic_store_explicit(&E.set_steps, 0, memory_order_relaxed);
    E.used = 0;
    E.local_pending = 0;
    memset(E.noname, 0, sizeof(E.noname));
    memset(E.present, 0, sizeof(E.present));
    reset_stats();
    int st = kolo__hmap_init(&E.inflight, 256);
    if (st) return st;
    if (E.size > 1 && (st = agree_settings())) goto err_map;
    kolo__tune_start();
    E.sets[0] = kolo__pset_new(0, W.psets[0], W.psets[0]->rank, E.capacity);
    if (!E.sets[0]) {
        st = KOLO_ERR_NO_MEMORY;
        goto err_map;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&E.wake, &ca);
    pthread_condattr_destroy(&ca);
    E.stop = E.down = 0;
    E.down_msg[0] = '\0';
    E.qhead = E.qtail = NULL;
    pthread_mutex_lock(&E.lock);
    E.running = 1;
    pthread_mutex_unlock(&E.lock);
    /* The engine thread takes no asynchronous signals: SIGINT, SIGTERM, SIGCHLD ... go to the
     * program's own threads (Python handles Ctrl-C on its main thread). It starts with them
     * blocked, so there is no window. */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&E.thread, NULL, engine_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        st = kolo__err_sys(err, "could not start the engine thread");
        pthread_mutex_lock(&E.lock);
        E.running = 0;
        pthread_mutex_unlock(&E.lock);
        goto err_cond;
    }
    const char *tl = kolo__setting_str(KOLO_SET_TIMELINE);
    if (*tl && strcmp(tl, "DYNAMIC") != 0) {
        char path[4096];
        timeline_path(tl, E.rank, path, sizeof(path));
        if (kolo__trace_start(path, E.rank, kolo__setting_long(KOLO_SET_TIMELINE_MARK_CYCLES) > 0) != KOLO_OK)
            KOLO_WARN("could not start the timeline (KOLO_TIMELINE): %s", kolo__errmsg());
    }
    return KOLO_OK;
err_cond:
    pthread_cond_destroy(&E.wake);
    free_state();
err_map:
    kolo__tune_stop();
    kolo__hmap_free(&E.inflight);
    return st;
}

void kolo__engine_stop(void)
{
    pthread_mutex_lock(&E.lock);
    if (!E.running) {
        pthread_mutex_unlock(&E.lock);
        return;
    }
    E.stop = 1;
    pthread_cond_signal(&E.wake);
    pthread_mutex_unlock(&E.lock);
    /* Normally the engine says goodbye within a cycle. A peer that does not answer (stopped,
     * or stuck in a long transfer) must not hold kolo_shutdown for KOLO_OP_TIMEOUT: after
     * LEAVE_GRACE_S, cut the engine's connections (shutdown(2) is safe beside the engine
     * thread's own use of the sockets); its wait then fails at once and it exits. */
    /* (pthread_timedjoin_np's deadline is by the wall clock; pthread_clockjoin_np would take the
     * monotonic one, but ThreadSanitizer does not see it join: a false race on every shutdown) */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += E.leave_grace_s;
    if (pthread_timedjoin_np(E.thread, NULL, &dl) != 0) {
        KOLO_WARN("engine: the other ranks did not answer within %d s; leaving without saying goodbye",
                  E.leave_grace_s);
        kolo__mesh *m = E.mesh;
        for (int p = 0; m && p < m->size; p++)
            if (m->conns[p] && m->conns[p]->fd >= 0) shutdown(m->conns[p]->fd, SHUT_RDWR);
        pthread_join(E.thread, NULL);
    }
    fail_everything(KOLO_ERR_SHUT_DOWN, "kolo_shutdown was called while this request was pending");
    kolo__trace_stop();
    kolo__tune_stop();
    free_state();
    pthread_mutex_lock(&E.lock);
    kolo__hmap_free(&E.inflight);
    E.running = 0;
    E.stop = 0;
    E.down = 0;
    kolo__free(E.status_text);
    E.status_text = NULL;
    E.status_served = E.status_asked;
    pthread_cond_broadcast(&status_cv);
    pthread_mutex_unlock(&E.lock);
    pthread_cond_destroy(&E.wake);
    E.mesh = NULL;
}

/* ---- public: timeline and statistics ---- */

int kolo_timeline_start(const char *path, int mark_cycles)
{
    if (!path || !*path) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_timeline_start: path is empty");
    int forked = kolo__forked_refuse("kolo_timeline_start");
    if (forked) return forked;
    pthread_mutex_lock(&E.lock);
    int running = E.running;
    pthread_mutex_unlock(&E.lock);
    if (!running) return kolo__err(KOLO_ERR_NOT_INITIALIZED, "kolo_timeline_start: kolo is not initialized");
    char p[4096];
    timeline_path(path, W.info.rank, p, sizeof(p));
    kolo__trace_stop();
    return kolo__trace_start(p, W.info.rank, mark_cycles);
}

int kolo_timeline_stop(void) { return kolo__trace_stop(); }

int kolo_engine_stats(kolo_engine_stats_t *out)
{
    if (!out) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_engine_stats: out is NULL");
    kolo__stats_atomic *s = &E.st;
    out->cycles = atomic_load(&s->cycles);
    out->requests = atomic_load(&s->requests);
    out->cache_hits = atomic_load(&s->cache_hits);
    out->cache_misses = atomic_load(&s->cache_misses);
    out->cache_evictions = atomic_load(&s->cache_evictions);
    out->fused_collectives = atomic_load(&s->fused_collectives);
    out->collectives = atomic_load(&s->collectives);
    out->stall_warnings = atomic_load(&s->stall_warnings);
    return KOLO_OK;
}

void kolo__engine_negotiation_cost(uint64_t *cycles, uint64_t *ns, uint64_t *local_ns)
{
    *cycles = atomic_load(&E.st.negotiations);
    *ns = atomic_load(&E.st.negotiation_ns);
    *local_ns = atomic_load(&E.st.negotiation_local_ns);
}

int kolo__engine_test_quiet_cycles(void) { return atomic_load_explicit(&E.quiet_cycles, memory_order_relaxed); }
uint64_t kolo__engine_test_cycles(void) { return atomic_load_explicit(&E.world_cycles, memory_order_relaxed); }
void kolo__engine_test_needed_cycles(uint64_t *needed, uint64_t *timed)
{
    *needed = atomic_load_explicit(&E.needed_cycles, memory_order_relaxed);
    *timed = atomic_load_explicit(&E.needed_timed, memory_order_relaxed);
}
uint64_t kolo__engine_test_set_steps(void) { return atomic_load_explicit(&E.set_steps, memory_order_relaxed); }
