/* coll_util.c - scratch memory, chunk size and final scaling shared by the collective algorithms. */
#include "coll.h"

#include "../reduce/reduce.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *kolo__coll_scratch(kolo__mesh *m, int area, size_t n)
{
    if (n == 0) n = 64; /* a valid pointer even for empty buffers */
    if (n <= m->scratch_cap[area]) return m->scratch[area];
    void *p = kolo__malloc_aligned(n);
    if (!p) {
        kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %zu bytes of collective scratch space", n);
        return NULL;
    }
    kolo__free(m->scratch[area]);
    m->scratch[area] = p;
    m->scratch_cap[area] = n;
    return p;
}

/* read once (threads racing on the first call store the same value), or rank 0's */
static _Atomic size_t chunk;

void kolo__coll_follow(size_t small_max, bool small_set, size_t c)
{
    kolo__coll_follow_small(small_max, small_set);
    atomic_store_explicit(&chunk, c, memory_order_relaxed);
}

size_t kolo__coll_chunk(void)
{
    size_t c = atomic_load_explicit(&chunk, memory_order_relaxed);
    if (!c) {
        c = kolo__setting_bytes(KOLO_SET_RING_CHUNK);
        if (c < 4096) c = 4096;
        c &= ~(size_t)63;
        atomic_store_explicit(&chunk, c, memory_order_relaxed);
    }
    return c;
}

/* The first line of a small sysfs file into buf, without its newline; false if there is none. */
static bool read_line(const char *path, char *buf, int cap)
{
    FILE *f = fopen(path, "re");
    if (!f) return false;
    bool ok = fgets(buf, cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* The size of the last-level cache of cpu 0 (sysfs: the highest level that holds data), or 0. */
static size_t llc_bytes(void)
{
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char dir[64], path[80], type[32], level[16], size[32];
        snprintf(dir, sizeof(dir), "/sys/devices/system/cpu/cpu0/cache/index%d", i);
        snprintf(path, sizeof(path), "%s/type", dir);
        if (!read_line(path, type, sizeof(type))) break;
        snprintf(path, sizeof(path), "%s/level", dir);
        bool have_level = read_line(path, level, sizeof(level));
        snprintf(path, sizeof(path), "%s/size", dir);
        size_t bytes;
        if (strcmp(type, "Instruction") == 0 || !have_level || !read_line(path, size, sizeof(size)) ||
            !kolo__parse_bytes(size, &bytes))
            continue;
        int lv = atoi(level);
        if (lv > best_level) {
            best_level = lv;
            best = bytes;
        }
    }
    return best;
}

/* Where rings start writing around the cache (ring.c): from 16 MiB, or an eighth of the last-level
 * cache where that is more. Writing around the cache pays once the data no longer fits it, and
 * caches differ tenfold: the 16 MiB rule was measured on AMD EPYC VMs with 32 MiB of L3 per CCD
 * (allreduce 16 MiB 1.10x, 64 MiB 1.23x; ring.c), where it stays. On an Intel Xeon guest whose L3
 * is 300 MiB, 2 ranks, launches of 50 calls alternated (8 sets of 4-12 rounds, medians), allreduce
 * in place (the ring first, then as direct.c chooses) with its rings around the cache against
 * through it: 16 MiB 0.92-1.36x the time (median of the sets 1.15), 32 MiB 0.81-1.11x (0.99), 64
 * MiB 0.94-1.00x, 128 MiB 1.00x, 256 MiB 0.89x; out of place, which mostly reads directly there
 * (direct.c), alike. Call by call in one launch the two ways time alike at 16-32 MiB (0.94-1.10x):
 * there each call's output is as cached as the call before left it, where through the cache a
 * result stays cached for the next call, or the optimizer, to read. An eighth (37.5 MiB there)
 * leaves 16 and 32 MiB in cache. */
#define STREAM_LLC_DIV 8

size_t kolo__stream_min_local(void)
{
    if (kolo__setting_is_set(KOLO_SET_STREAM_MIN)) {
        const char *v = kolo__setting_str(KOLO_SET_STREAM_MIN);
        size_t r;
        if (kolo__parse_bytes(v, &r)) return r;
        KOLO_WARN("KOLO_STREAM_MIN='%s' is not a byte size (e.g. 16M, 256M); using this host's default", v);
    }
    return KOLO_MAX(KOLO_STREAM_MIN_FLOOR, llc_bytes() / STREAM_LLC_DIV);
}

static bool floating(kolo_dtype_t dtype)
{
    return dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16 || dtype == KOLO_FLOAT32 || dtype == KOLO_FLOAT64;
}

/* what a floating result is multiplied by when finished */
static double finish_factor(kolo_op_t op, double post, int n) { return post * (op == KOLO_AVERAGE ? 1.0 / n : 1.0); }

void kolo__coll_finish_scale(void *buf, size_t count, kolo_dtype_t dtype, kolo_op_t op, double post, int n)
{
    if (!floating(dtype)) {
        if (post != 1.0) kolo__scale(buf, buf, count, dtype, post);
        if (op == KOLO_AVERAGE && n > 1) kolo__divide(buf, count, dtype, n);
        return;
    }
    double f = finish_factor(op, post, n);
    if (f != 1.0) kolo__scale(buf, buf, count, dtype, f);
}

void kolo__coll_reduce_finish(void *dst, const void *a, const void *b, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                              double post, int n)
{
    if (floating(dtype)) {
        kolo__reduce_scale(dst, a, b, count, dtype, op, finish_factor(op, post, n));
        return;
    }
    kolo__reduce(dst, a, b, count, dtype, op);
    kolo__coll_finish_scale(dst, count, dtype, op, post, n);
}

/* out = a OP b (finished, when `finish`), and the same bytes written to d around the cache, a
 * piece at a time (kolo__out_piece). Measured on a Zen 4 VM (AMD EPYC family 25), 2 ranks, ring
 * copies (KOLO_SHM_CMA=0), malloc'd buffers, launches interleaved and sorted by the machine's
 * state (see shm.c), medians of algbw out of place: with the vCPUs sharing a cache, float32 64
 * MiB 7.3-7.35 GB/s against 6.4-6.6 with whole chunks, 256 MiB 5.6 against 4.0-5.1, 16 MiB alike;
 * across CCDs 64 MiB 2.9 against 2.5, 16 MiB 2.6 against 2.0; float16 64 MiB 7.2 (1 KiB pieces)
 * against 5.7. */
void kolo__coll_reduce_out(char *d, char *out, const char *a, const char *b, size_t bytes, kolo_dtype_t dtype,
                           kolo_op_t op, bool finish, double post, int n)
{
    size_t es = kolo_dtype_size(dtype), piece = kolo__out_piece(es, false);
    for (size_t o = 0; o < bytes; o += piece) {
        size_t len = KOLO_MIN(piece, bytes - o);
        if (finish) kolo__coll_reduce_finish(out + o, a + o, b + o, len / es, dtype, op, post, n);
        else kolo__reduce(out + o, a + o, b + o, len / es, dtype, op);
        kolo__stream_copy(d + o, out + o, len);
    }
}

/* Out of place, a 2-rank allgather of 256 MiB copies 128 MiB of its own and reads 128 MiB from
 * the other rank. With memmove the own copy took as long as the read (libc's copy reads every
 * destination line before writing it). Streamed, 4 and 3 launches interleaved with the build
 * before, both machine states: allgather 256 MiB 30-47 ms against 40-67, 64 MiB 8-13.5 against
 * 9.6-15.2; alltoall 256 MiB 29-35 against 42-49, 64 MiB 8.1-8.8 against 10.2-11.5 (Open MPI
 * in the same minutes: allgather 36-46 ms, alltoall 44-49 at 256 MiB). */
void kolo__coll_copy_own(void *dst, const void *src, size_t n, bool stream)
{
    if (!n || dst == src) return;
    const char *d = dst, *s = src;
    bool apart = kolo__coll_apart(d, n, s, n);
    if (stream && apart) {
        kolo__stream_copy(dst, src, n);
        kolo__stream_fence();
    } else if (apart) {
        kolo__copy(dst, src, n);
    } else {
        memmove(dst, src, n);
    }
}

#define OWN_SLICE ((size_t)256 << 10)

void kolo__coll_copy_own_moving(kolo__mesh *m, void *dst, const void *src, size_t n, bool stream)
{
    char *d = dst;
    const char *s = src;
    /* overlapping halves cannot be copied slice by slice in this order: one piece then */
    size_t slice = kolo__coll_apart(d, n, s, n) ? OWN_SLICE : KOLO_MAX(n, (size_t)1);
    size_t at = 0;
    do {
        size_t k = KOLO_MIN(slice, n - at);
        kolo__poke(m);
        kolo__coll_copy_own(d + at, s + at, k, stream);
        at += k;
    } while (at < n);
}

int kolo__coll_write_peer(kolo__mesh *m, int peer, uint64_t addr, const void *src, size_t n, int *refuse,
                          const char *what)
{
    if (kolo__shm_peer_aborted(m->conns[peer])) return ECANCELED;
    size_t wrote = 0;
    int e = *refuse && --*refuse == 0 ? EPERM : kolo__cma_write(m->peers[peer].pid, addr, src, n, &wrote);
    static _Atomic int warned;
    if (e && !atomic_exchange(&warned, 1))
        KOLO_WARN("%s: cannot write into the buffer of rank %d (%s): it gets those bytes as a message instead "
                  "(said once)",
                  what, peer, strerror(e));
    return e;
}

int kolo__coll_cma_failed(kolo__mesh *m, int peer, int e, const char *what)
{
    if (peer >= 0 && peer < m->size && (e == ESRCH || e == ECANCELED)) {
        kolo__conn *c = m->conns[peer]; /* NULL on the peer itself, which a test hook told it is gone */
        char why[KOLO_ABORT_REASON_MAX + 64];
        if (c && c->tp && c->tp->abort_reason(c, why, sizeof(why))) return kolo__err_aborted(c, why);
        return kolo__err(KOLO_ERR_PEER_LOST, "lost rank %d on %s: the process is gone (%s)", peer,
                         kolo__peer_name(m, peer), what);
    }
    return kolo__err(KOLO_ERR_SYSTEM, "%s", what);
}

/* ---- choosing between two ways from the calls' own timings ----
 *
 * The caller times each call it makes by the way kolo__choice_pick gave, from entry to return, in
 * ps per byte, and passes it to kolo__choice_learn; one kolo__choice per size class. Each way's
 * figure is the median of its last KOLO_WINDOW samples (common.h); samples older than PROBE_MAX_NS
 * are dropped. It starts with way 0, or with a hinted way. Unhinted (or hinted without `wait`),
 * after FIRST_PROBE_CALLS calls (or the class's first_after) it runs PROBE_CALLS by the other way
 * (a probe, whose samples replace that way's old ones), then PROBE_CALLS by the way in use, whose
 * samples replace its old ones too, and keeps the cheaper, switching only for a 10 % gain; hinted
 * with `wait`, the first probe waits as the later ones do. Later probes come at least
 * PROBE_GAP_CALLS calls and an interval apart that doubles while the answer stays (0.1 s up to 2.56
 * s) and shrinks back when a probe (not the first: FIRST_ANSWER) or the way in use getting dearer
 * than the other's figure changes it (from SETTLE_MIN a 2-member class probes then:
 * DEARER_PROBES). The same scheme as the shared-memory transport's per-message choice (shm.c), one
 * level up, except for the second half of a probe: the machine warms up over its first busy tens
 * of milliseconds (this VM's copies run 1.5-2.5x faster then), so the way in use, timed in a
 * launch's first calls, looked dearer than a probe timed later, and kept losing to it. Measured
 * before that half (2 ranks, 3 launches each): engine-bench's ResNet-50 step from malloc'd
 * gradients 31.8-32.2 ms choosing, 28.7-29.3 with the ring pinned; member 0's log had the ring at
 * 371-454 ps/B in the first calls, CMA at 330-346 in the probe, the ring at 296-323 in later
 * probes. */
#define FIRST_PROBE_CALLS 4
/* FIRST_ANSWER: a probe that changes the way starts the intervals over at 0.1 s, as the machine
 * may be changing state; the class's first probe is no such change, only its first measurement of
 * the way it did not start by, so the interval doubles after it as after a probe that kept the
 * way. Before 2026-12-06 it started over there too, so the first probe's switch brought a second
 * probe 0.1 s later: on an Intel Xeon VM (2 vCPUs), where a 2-rank allgather's or alltoall's ring
 * copies ran 1.25-1.6x single-copy's time, 2 MiB (the first size of the harness's band: 200 ms of
 * calls at 2 MiB, then 20 timed) probed ring copies again in its timed calls, five calls at 190-270
 * us among 115: 5 interleaved rounds, us per call, allgather 145-152 (median 147) against 115-129
 * (118) after, alltoall 175-185 (182) against 158-164 (160); Open MPI 141-149 and 160-168. 4-16
 * MiB alike. */
#define PROBE_CALLS 2
#define PROBE_GAP_CALLS 8
#define PROBE_MIN_NS (100ull * 1000 * 1000)
#define PROBE_MAX_NS (2560ull * 1000 * 1000)

static void win_clear(kolo__choice *c, int way) { kolo__window_clear(&c->win[way]); }

static void win_add(kolo__choice *c, int way, uint64_t ps) { c->cost[way] = kolo__window_add(&c->win[way], ps); }

static bool cheaper(const kolo__choice *c, int a, int b)
{
    return c->cost[a] && c->cost[b] && c->cost[a] * 10 < c->cost[b] * 9;
}

/* `hint`: the way to start with, or -1 (way 0); `wait`: its first probe waits as later ones do. */
int kolo__choice_pick(kolo__choice *c, uint64_t now, int hint, bool wait)
{
    if (!c->every) { /* the first call of this size class */
        c->every = PROBE_MIN_NS;
        if (hint >= 0) {
            c->want = hint;
            c->hinted = wait;
            c->at[!hint] = now;
        }
    }
    if (c->probing) return !c->want;
    if (c->recheck) return c->want;
    int other = !c->want;
    bool due = c->due ||
               (c->cost[other] || c->hinted ? c->calls >= PROBE_GAP_CALLS && now - c->at[other] >= c->every
                                            : c->calls >= (c->first_after ? c->first_after : FIRST_PROBE_CALLS));
    if (!due) return c->want;
    c->due = false;
    c->probing = PROBE_CALLS;
    win_clear(c, other);
    return other;
}

bool kolo__choice_late_hint(kolo__choice *c, uint64_t now, int way)
{
    if (!c->every || !c->hinted || c->decided || c->probing || c->recheck || c->cost[!c->want] || way == c->want)
        return false;
    c->want = way; /* as if the class started now with this hint: the old way's figure, from the class's
                    * first calls (a launch's warm-up, other buffers), is no measure to go back by */
    c->at[!way] = now;
    c->calls = 0;
    c->dearer = 0;
    c->due = false;
    for (int w = 0; w < 2; w++) {
        win_clear(c, w);
        c->cost[w] = 0;
    }
    return true;
}

bool kolo__choice_repeat(kolo__choice *c, int way) { return kolo__choice_run(c, way) > 1; }

unsigned kolo__choice_run(kolo__choice *c, int way)
{
    c->run = c->last == way + 1 ? (unsigned char)KOLO_MIN(c->run + 1, 255) : 1;
    c->last = (unsigned char)(way + 1);
    return c->run;
}

/* During a later probe (and the recheck after it) the way in use still stands: only the probe's
 * end may change it. Until 2026-12 a probing class gave no verdict, so a class that probed in its
 * last calls left the next size to start direct: kolo-bench in the harness's band (64 MiB, then
 * 256 MiB, 4 calls each; Zen 4 VM, vCPUs together, where the ring runs 64 MiB in 120-165 ps/B and
 * direct by CMA in 220-270), 64 MiB out of place settled on the ring, probed direct in its last
 * call, and 256 MiB then ran direct: 70.0 ms a call against 44.7 in a launch where the probe had
 * not come. */
int kolo__choice_verdict(const kolo__choice *c, uint64_t now)
{
    if (!c->every || !c->cost[0] || !c->cost[1]) return -1;
    return now - c->at[c->want] <= PROBE_MAX_NS ? c->want : -1;
}

void kolo__choice_learn(kolo__choice *c, int way, uint64_t start, uint64_t bytes, const char *what,
                        const char *const ways[2])
{
    uint64_t now = kolo__now_ns();
    if (now <= start || !bytes) return;
    uint64_t ps = KOLO_MAX((now - start) * 1000 / bytes, 1);
    kolo__choice_take(c, way, ps, now);
    int next = c->probing ? !c->want : c->want;
    KOLO_TRACE("%s of %llu B by %s: %llu ps/B; %s %llu, %s %llu ps/B; next %s%s", what, (unsigned long long)bytes,
               ways[way], (unsigned long long)ps, ways[0], (unsigned long long)c->cost[0], ways[1],
               (unsigned long long)c->cost[1], ways[next], c->probing ? " (probe)" : "");
}

void kolo__choice_take(kolo__choice *c, int way, uint64_t ps, uint64_t now)
{
    if (c->probing && way != c->want) {
        win_add(c, way, ps);
        c->at[way] = now;
        if (--c->probing == 0) { /* the way in use is timed afresh before the verdict */
            win_clear(c, c->want);
            c->recheck = PROBE_CALLS;
        }
    } else if (way == c->want) {
        if (now - c->at[way] > PROBE_MAX_NS) win_clear(c, way);
        win_add(c, way, ps);
        c->at[way] = now;
        c->calls++;
        if (c->recheck) {
            if (--c->recheck == 0) {
                c->calls = 0;
                c->hinted = false;
                bool change = cheaper(c, !way, way);
                if (change) c->want = !way;
                /* a change of answer probes again soon; the first answer is not one (FIRST_ANSWER) */
                c->every = change && c->decided ? PROBE_MIN_NS : KOLO_MIN(2 * c->every, PROBE_MAX_NS);
                c->decided = true;
            }
        } else if (now - c->at[!way] <= PROBE_MAX_NS && cheaper(c, !way, way)) {
            if (++c->dearer >= KOLO_MAX(c->switch_after, 1u)) {
                /* the way in use got dearer than the other's last figure: move to the other way, or
                 * (dearer_probes) time both afresh (kolo__pair_end, DEARER_PROBES) */
                if (c->dearer_probes) {
                    c->due = true;
                } else {
                    c->want = !way;
                    c->every = PROBE_MIN_NS;
                    c->calls = 0;
                }
                c->dearer = 0;
            }
        } else {
            c->dearer = 0;
        }
    }
}

/* ---- the ring steps of a 2-member group: both directions one way, chosen per call ----
 *
 * On a pair that picks its ways from timings (KOLO_SHM_CMA=auto), the receiver of each direction
 * times each large message and asks the sender for the cheaper way (shm.c). A reduce-scatter of
 * 2 members is one ring step: both send their half in chunks (128 KiB by default) while they
 * receive and reduce the other's. There the per-message figure misses what the ring costs the
 * sender: its copies into the ring run on the core that also reduces, while a single-copy chunk
 * costs its sender nothing. Measured on an Intel Xeon guest with the vCPUs apart (pings
 * 0.13-0.19 us), 2 ranks, 4 launches: reduce-scatters of 512 KiB-4 MiB kept the ring for 1784 of
 * 1788 chunks and took 1.5-2.9x the time of single-copy pinned (512 KiB 55-75 us against 33-38).
 *
 * So such a call (from KOLO_PAIR_MIN bytes in all) sends its chunks the way the member of lower
 * rank (the lead) chooses with kolo__choice_pick and kolo__choice_learn from its timings
 * of whole calls, per class of its bytes (x2 from KOLO_PAIR_MIN; a slot), and
 * the transport neither times nor asks for those messages. The engine's fused allreduces of
 * several tensors run their own ring (engine/ring_iov.c) and keep the transport's choice. Both
 * members must send the same way in the same call, or a probe would run the step half one way,
 * half the other. The lead publishes, after its call n,
 * the way of call n + 2 in the pair's shared memory, with the way of call n + 1
 * (kolo__shm_publish_call_way); the other member reads it at the start of each call
 * (kolo__shm_call_way), after it has received the lead's chunks of the call before, which the
 * lead sent after it published at the end of the call before that: the word is at worst a call
 * ahead, and then holds the way of this call as the one before. Both count the calls of each
 * class alike, as every member makes the same calls; the first two of a class go as the
 * transport picks. A probe therefore starts two calls after the lead decides on it; the call
 * between still goes the way in use and is not timed, nor is the probe's last call, which ends
 * after the verdict, nor the first call after any change of way: traced while the choice was
 * tried on allgathers (below), 2 MiB by single-copy took 144-159 ps/B in the first call after
 * ring ones and 93-121 in the next, by ring 132-154 after single-copy ones and 103-116 next, and
 * a probe counting its first call kept the ring where single-copy, once chosen, ran at 90-95
 * against the ring's 110-120.
 *
 * Against the build before, launches alternated (10 pairs, vCPUs apart, pings 0.13-0.24 us,
 * kolo-bench -n 30 -w 5): reduce-scatter 256 KiB-2 MiB 0.66-0.88x the time, 64-128 KiB and 4-8
 * MiB 0.94-1.02x. The same choice ran for 2-member allreduces by ring below 4 MiB (their
 * reduce-scatter step, then their allgather step) until 2026-11-30: at first 0.89-1.01x the
 * time of the build before, but later on the same VM it did not settle (256 KiB-2 MiB, 5 rounds,
 * each phase's way forced: 1.12-1.16x the time of single-copy for both phases, both by ring
 * 1.06-1.29x, ending with about half its messages each way), and from 256 KiB such allreduces now
 * read and write each other's buffers by CMA where that times faster (direct.c). The same
 * choice for 2-member allgathers and alltoalls, whose exchanges the transport's nudge (shm.c)
 * already kept in step, gained nothing there at first (allgather 0.94-1.03x, alltoall
 * 1.01-1.09x, the probes' cost in short launches), so they kept the transport's; since their
 * sends went single-copy as the call's choice (shm.c, SINGLE_MIN), it runs for them again
 * (KOLO_PAIR_EX, from 64 KiB: allgather.c, "Ring or single-copy"), where ring copies won 1.4-2x
 * on the Zen 4 VM. The choice itself serves another pair of ways for 2-member allgathers of 1-16
 * MiB, push or exchange (KOLO_PAIR_AG, allgather.c, "Push or exchange"), nested in the first: it
 * runs in the calls that go single-copy, and the caller leaves a call untimed (t->untimed) when
 * the outer way changed with it (the first such call runs slow, as above).
 *
 * From 256 KiB (KOLO_PAIR_MIN) since 2026-12-02, when it was 64 KiB: 2 members' reduce-scatters of
 * 256 KiB and more read each other's inputs directly (allreduce.c, "Direct"), so this choice runs
 * only where that one declines (recv overlapping send; a prescale too until the direct reads took
 * one the same day). Below, the transport's own choice took 0.91-1.0x this one's time (Intel Xeon
 * VM, 2 ranks, kolo-bench, 6 rounds of 1000 calls alternated: 64 / 128 KiB 4.3 / 6.0 us against
 * 4.5 / 6.6; 6 of 300: 4.3 / 5.5 against 5.0 / 5.5). */
/* Crowded: on a host with more ranks than cores the pairs keep ring copies without timing their
 * messages (a rank that shares a core times the scheduler), and the sends a collective marks
 * `single` went single-copy by rule, the allgather pushed by CMA writes: rules measured on the
 * Intel Xeon VM, where single-copy won. On the Zen 4 VM, whose kernel copies between processes
 * at a quarter of memcpy's rate (docs/performance.md, "Ring copies beat single-copy at 4 ranks"),
 * ring copies took 0.63-0.72x the time of 4-rank allgathers at every size from 128 KiB to 256
 * MiB, but at 8 ranks 1.14-1.31x at 1-4 MiB. So a world of 3 or more members there chooses for
 * its allgathers (KOLO_PAIR_EX) as a pair does: member 0 leads, times whole calls (every member's
 * call waits for the others, so the lead's time is the call's) and publishes the way of call n +
 * 2 on its connection to every other member, which each reads on its connection to member 0,
 * after receiving member 0's block of the call before, as above. All members must agree: the
 * way decides between the push and the exchange, whose messages differ. The world only, where
 * every member makes every call, so the calls are counted alike. 4 ranks on the Zen 4 VM, the
 * harness's bands, 3 rounds rotating with the build before and ring copies pinned
 * (KOLO_SHM_CMA=0): 128 KiB-1 MiB 0.56-0.60x the build before's time, 2-16 MiB 0.71-0.84x, 64 /
 * 256 MiB 0.79 / 0.86x (pinned 0.79 / 0.73x); 8 ranks (2 rounds) 128-512 KiB 0.68-0.96x, 1-16
 * MiB 0.98-1.01x (pinned ring copies 1.15-1.25x), 64 / 256 MiB 1.13 / 1.07x: a class of 3-4 calls
 * starts with ring copies and has no time to probe. The world's alltoalls there choose the same
 * way in slots of their own (KOLO_PAIR_A2A; alltoall.c, "Crowded"), where members need not agree. */
static const char *const WAYS_PAIR[KOLO_PAIR_KINDS][2] = {{"ring copies", "single-copy"},
                                                            {"push", "exchange"},
                                                            {"ring copies", "single-copy"},
                                                            {"ring copies", "single-copy"}};
static uint64_t test_pair_delay_ns[KOLO_PAIR_KINDS][3];
static uint64_t test_pair_settle_ns[KOLO_PAIR_KINDS][3][2]; /* the lead's 2nd and 3rd call after a change */
static _Atomic uint64_t pair_calls[KOLO_PAIR_KINDS][3];

void kolo__pair_test_delay(int kind, int way, uint64_t ns)
{
    if (kind >= 0 && kind < KOLO_PAIR_KINDS && (way == KOLO_WAY_RING || way == KOLO_WAY_SINGLE))
        test_pair_delay_ns[kind][way] = ns;
}
void kolo__pair_test_settle_delay(int kind, int way, uint64_t second_ns, uint64_t third_ns)
{
    if (kind >= 0 && kind < KOLO_PAIR_KINDS && (way == KOLO_WAY_RING || way == KOLO_WAY_SINGLE)) {
        test_pair_settle_ns[kind][way][0] = second_ns;
        test_pair_settle_ns[kind][way][1] = third_ns;
    }
}
void kolo__pair_test_calls(int kind, uint64_t got[3])
{
    for (int i = 0; i < 3; i++)
        got[i] = kind >= 0 && kind < KOLO_PAIR_KINDS ? atomic_load_explicit(&pair_calls[kind][i], memory_order_relaxed) : 0;
}

/* A call that took more than OUTLIER_X times its way's figure is left out, up to OUTLIER_RUN in a
 * row (the next counts: the machine changed): traced, 2 ranks, alltoall 128 KiB, single-copy
 * calls at 52-66 ps/B, then three at 16249, 4361 and 619 (the process preempted), whose median
 * put single-copy above the ring's last figure and moved the class to the ring, at 93-110, for
 * the rest of the launch. */
#define OUTLIER_X 4
#define OUTLIER_RUN 3
/* Outside a probe the way in use is left after this many calls in a row found it dearer than the
 * other's last figure (in the same launch, three single-copy calls of 109-122 ps/B among 50-66
 * moved a 64 KiB class to the ring for good). */
#define SWITCH_AFTER_CALLS 3
/* SETTLE_MIN: from this many bytes the first two calls after a change of way go untimed, not only
 * the first. On the Intel Xeon VM (2 vCPUs), 2 ranks, an alltoall of 16 MiB by single-copy ran its
 * calls after a switch from ring copies at 124-131, 94-99 and 92 ps/B, then 85-90, where ring
 * copies ran 104-115 from their first timed call on. A probe timed the second and third calls, read
 * single-copy at 97 against ring copies' 104 (a switch needs 10 %) and kept ring copies; three
 * calls later the dearer rule moved the class all the same, with the intervals started over, so
 * the next probe of ring copies came 0.1 s on: in a launch of that size alone (200 ms of calls, 5
 * warm-up, 20 timed, the harness's recheck), in the timed calls. 8 such launches each, alternating
 * with the build before and Open MPI, us per call: 1423-2094 (median 1668) -> 1491-2134 (1542), Open
 * MPI 1418-1870 (1524); 8 MiB alone 756 -> 763 (Open MPI 753), allgather 16 MiB alone 1301 -> 1310,
 * the harness's 2-16 MiB band (3 rounds) and 4 ranks (2 rounds) within the noise. From 4 MiB: a
 * probe there costs one more call of the other way, against calls of 0.3 ms and more. */
#define SETTLE_MIN ((uint64_t)4 << 20)
/* DEARER_PROBES: from SETTLE_MIN, a way in use found dearer than the other's last figure (for
 * SWITCH_AFTER_CALLS calls) brings a probe, both ways timed afresh, where other choices move to the
 * other way at once. Traced (the same VM, 16 MiB alone): three slow single-copy calls in a row (183,
 * 177, 157 ps/B among 85-108) lifted its window's median to 157 and moved the class to ring copies,
 * which then never looked dearer than that frozen figure: ring copies at 115-134 for about 60 calls,
 * until the next probe (a launch at 2139 us a call). 8 launches of 16 MiB alone each, alternating
 * with the build before (SETTLE_MIN only) and Open MPI: 1502-1930 us (median 1520, 3 launches above
 * 1740) -> 1500-1564 (1514), Open MPI 1516-1628 (1544); 8 MiB alone (6) 747-873 (782) -> 751-778
 * (765), Open MPI 757; the 2-16 MiB band (3 rounds) alltoall 8 / 16 MiB 780 / 1558 -> 754 / 1504
 * (Open MPI 765 / 1523), allgather and 4 ranks within the noise. Below SETTLE_MIN, tried on every
 * choice: allgather 1 MiB 41.6 -> 45.1 us in 3 of 3 launches, a probe costing more there than the
 * moves it replaced; so only these classes. */
/* A smaller class's verdict this clear makes a new class patient (kolo__pair_end, "clear") */
#define CLEAR_X 2
/* PAIR_FIRST_PROBE_CALLS: a 2-member class with nothing to start from (the first of its kind, or
 * the first of a benchmark's sweep) probes after one timed call, not FIRST_PROBE_CALLS (as the
 * output stores do, OUT_FIRST_PROBE_CALLS below): its probe and the recheck then end by its 12th
 * call instead of its 15th. The recheck still times the way in use after the probe, so the slow
 * first calls bias no verdict; if anything the probe, timed earlier, looks dearer. Intel Xeon VM
 * (2 vCPUs), 2 ranks, kolo-bench as nccl-tests runs (64 KiB-1 MiB, 20 calls after 5, no warm-up
 * at the first size), 10 rounds alternating with the build before and Open MPI, us at 64 KiB, the
 * sweep's first class: allgather 5.0 -> 4.4, alltoall 4.7 -> 4.2 (Open MPI 4.2, 4.3; single-copy
 * pinned 3.4); 128 KiB-1 MiB, hinted by it, alike; the harness's shape (128 KiB-1 MiB, 50 calls
 * after 10, 200 ms first), 6 rounds, 128 KiB allgather 8.8 -> 6.4, alltoall 7.0 -> 6.2 (Open MPI
 * 6.3, 6.6). Not on a crowded host: there 4 ranks' alltoalls of 128-512 KiB read 0.86-0.94x the
 * build before's speed in 5 rounds (within their spread, but no gain to set against it). */
#define PAIR_FIRST_PROBE_CALLS 1

static bool pair_exchanges(int kind) { return kind == KOLO_PAIR_EX || kind == KOLO_PAIR_A2A; }

static uint64_t pair_min(int kind) { return pair_exchanges(kind) ? KOLO_PAIR_EX_MIN : KOLO_PAIR_MIN; }

static uint64_t pair_patient_min(int kind)
{
    if (pair_exchanges(kind)) return KOLO_PAIR_EX_PATIENT_MIN;
    return kind == KOLO_PAIR_AG ? KOLO_PAIR_AG_PATIENT_MIN : UINT64_MAX;
}

static int pair_class(int kind, uint64_t bytes)
{
    int k = 0;
    for (uint64_t b = bytes / pair_min(kind); b >= 2 && k < KOLO_PAIR_CLASSES - 1; b /= 2) k++;
    return k;
}

/* Whether a world of 3 or more members on a host with more ranks than cores chooses its exchanges'
 * way from the lead's timings (above, "crowded"): every pair shares memory and can send
 * single-copy, as the ranks agreed at init. Each member once read its own pairs with the lead
 * (the lead all of its pairs): where pairs differ (ranks in containers with pids of their own
 * read single-copy only within one), a member could follow a lead that was not choosing. */
static bool crowded_choice_here(const kolo__mesh *m, const kolo__group *g)
{
    unsigned want = KOLO_HOST_SHM | KOLO_HOST_CROWDED | KOLO_HOST_SINGLE;
    return g->size >= 3 && g->size == m->size && (kolo__coll_group_flags(m, g) & want) == want;
}

/* The verdict of the nearest smaller class of the same kind that has timed both ways, or -1; *clear:
 * whether the other way cost it at least CLEAR_X times as much. */
static int pair_hint(const kolo__pair_ways *p, int slot, bool *clear)
{
    for (int j = slot - 1; j >= slot - slot % KOLO_PAIR_CLASSES; j--) {
        const kolo__choice *s = &p->choice[j];
        if (s->cost[0] && s->cost[1]) {
            *clear = s->cost[!s->want] >= CLEAR_X * s->cost[s->want];
            return s->want;
        }
    }
    *clear = false;
    return -1;
}

void kolo__pair_begin(kolo__mesh *m, const kolo__group *g, int kind, uint64_t bytes, kolo__pair_ticket *t)
{
    t->conn = NULL;
    t->way = KOLO_WAY_AUTO;
    t->patient = t->changed = t->untimed = t->crowd = false;
    if (bytes < pair_min(kind)) return;
    int peer; /* whose slot of pair_ways holds this member's counts: the other member, the lead, or the
               * lead's own */
    kolo__conn *c;
    if (g->size == 2) {
        peer = kolo__g2w(g, !g->rank);
        c = m->conns[peer];
        if (!c || kolo__shm_cma_state(c) != 2) return;
    } else if (pair_exchanges(kind) && crowded_choice_here(m, g)) {
        t->crowd = true;
        peer = kolo__g2w(g, 0);
        c = m->conns[g->rank == 0 ? kolo__g2w(g, 1) : peer];
    } else {
        return;
    }
    if (!m->pair_ways && !(m->pair_ways = kolo__calloc((size_t)m->size, sizeof(*m->pair_ways))))
        return; /* the transport picks, as it would anyway */
    if (!m->pair_ways[peer] && !(m->pair_ways[peer] = kolo__calloc(1, sizeof(kolo__pair_ways)))) return;
    kolo__pair_ways *p = m->pair_ways[peer];
    int k = kind * KOLO_PAIR_CLASSES + pair_class(kind, bytes);
    t->conn = c;
    t->peer = peer;
    t->slot = k;
    t->call = p->seq[k]++;
    t->lead = t->crowd ? g->rank == 0 : m->rank < peer;
    t->bytes = bytes;
    t->patient = bytes >= pair_patient_min(kind); /* all of a class or none: the minima start classes */
    t->way = t->lead ? p->plan[k][t->call & 1] : kolo__shm_call_way(c, k, t->call);
    t->changed = t->lead && kolo__choice_run(&p->choice[k], t->way - 1) <= (bytes >= SETTLE_MIN ? 2u : 1u);
    if (kind != KOLO_PAIR_AG) m->call_way = (unsigned char)t->way;
    t->start = kolo__now_ns();
}

void kolo__pair_end(kolo__mesh *m, const kolo__pair_ticket *t, int st, const char *what)
{
    m->call_way = KOLO_WAY_AUTO;
    if (!t->conn) return;
    int kind = t->slot / KOLO_PAIR_CLASSES;
    atomic_fetch_add_explicit(&pair_calls[kind][t->way], 1, memory_order_relaxed);
    if (st == KOLO_OK) kolo__sleep_ns(test_pair_delay_ns[kind][t->way]);
    if (!t->lead) return;
    kolo__pair_ways *p = m->pair_ways[t->peer];
    kolo__choice *c = &p->choice[t->slot];
    if (st == KOLO_OK && (c->run == 2 || c->run == 3)) kolo__sleep_ns(test_pair_settle_ns[kind][t->way][c->run - 2]);
    int way = t->way - 1; /* the choice's way: 0 ring, 1 single-copy */
    uint64_t now = kolo__now_ns(), ps = (now - t->start) * 1000 / KOLO_MAX(t->bytes, 1);
    bool outlier = way >= 0 && !c->probing && !c->recheck && c->cost[way] && ps > OUTLIER_X * c->cost[way] &&
                   p->outliers[t->slot] < OUTLIER_RUN;
    p->outliers[t->slot] = outlier ? p->outliers[t->slot] + 1 : 0;
    if (st == KOLO_OK && t->way != KOLO_WAY_AUTO && !t->changed && !t->untimed && !outlier &&
        !(c->probing && way == c->want))
        kolo__choice_learn(c, way, t->start, t->bytes, what, WAYS_PAIR[kind]);
    /* the way of the call after next, which takes the slot of this one. A class starts as the
     * nearest smaller class that has timed both ways decided (else way 0: the ring, the push), and probes the other
     * way after its first calls all the same: as a hint it would wait 0.1 s, longer than a
     * benchmark's sweep spends at one size (traced: a 64 KiB class that had just moved to the
     * ring, by noise, seeded 128-512 KiB, which ran their whole launch by ring at twice the time).
     * A patient class (of its kind's sizes from pair_patient_min) takes that verdict, else way 0,
     * as such a hint: its first probe waits (allgather.c, "Push or exchange": at 8 MiB a benchmark's 25 calls lost
     * what the other way gained to the probes). So does any class whose smaller class's verdict is
     * clear, the other way at least CLEAR_X times its cost (the moves by noise traced above, at
     * SWITCH_AFTER_CALLS and OUTLIER_X, were within 1.3x):
     * on the Intel Xeon VM (2 vCPUs) ring copies ran 3-5x single-copy's time at 64 KiB-1 MiB
     * (allgather 98-107 against 20-35 ps/B, alltoall 90-233 against 27-43), and each class's probe of
     * them cost its fourth to eighth calls (128 KiB: five calls of 9-13 us among 5); a kolo-bench
     * sweep of 64 KiB-1 MiB, 20 calls a size after 5, 5 launches each alternating, us per call:
     * allgather 128 / 256 / 512 KiB 6.6-7.1 / 11.3-12.0 / 21.4-24.5 -> 4.9-5.2 / 7.8-8.7 /
     * 14.7-15.8, alltoall 6.2-6.8 / 11.3-13.6 / 22.2-23.4 -> 4.6-6.1 / 7.7-10.0 / 14.2-15.4 (Open
     * MPI 5 / 8 / 15); the harness's 50 calls after 10, 256 / 512 KiB 0.91-0.99x -> 1.05-1.10x Open
     * MPI's speed; 2-16 MiB and 4 ranks within the noise. A clear verdict that does not hold at the
     * larger size costs that class 0.1 s the slower way before its first probe.
     * LATE_HINT: a class first called before any smaller class decided (kolo-bench, like
     * nccl-tests, warms up at 1 MiB before its sweep; a program's first collective of a size)
     * starts patient by way 0 and kept it until its first probe, 0.1 s on; a smaller class's clear
     * verdict that comes before that probe now moves it, as if it started then with that hint
     * (kolo__choice_late_hint). Intel Xeon VM, 2 ranks, kolo-bench 64 KiB-1 MiB, 20 calls after 5,
     * 4 launches each alternating with the build before and Open MPI, median us at 1 MiB: alltoall
     * 104 -> 42, allgather 70 -> 44 (Open MPI 42, 42), the class having run ring copies at 3x
     * single-copy's time throughout; with 200 ms of calls at the first size (the harness's shape),
     * where the probe came in the size's first timed calls, 56 -> 41 and 62 -> 42 (Open MPI 46, 45). */
    bool clear = false;
    int hint = -1;
    if (!c->every) {
        c->switch_after = SWITCH_AFTER_CALLS;
        c->dearer_probes = t->bytes >= SETTLE_MIN; /* DEARER_PROBES */
        hint = pair_hint(p, t->slot, &clear);
        if (hint < 0 && t->patient) hint = 0;
        if (hint < 0 && !t->crowd) c->first_after = PAIR_FIRST_PROBE_CALLS;
    } else if (c->hinted && !c->decided) { /* LATE_HINT */
        bool late_clear;
        int late = pair_hint(p, t->slot, &late_clear);
        if (late >= 0 && late_clear && kolo__choice_late_hint(c, now, late))
            KOLO_TRACE("%s of %llu B: moved to %s, a smaller class's clear verdict", what,
                       (unsigned long long)t->bytes, WAYS_PAIR[kind][late]);
    }
    int next = kolo__choice_pick(c, now, hint, t->patient || clear) + 1;
    int was = p->plan[t->slot][(t->call + 1) & 1];
    p->plan[t->slot][t->call & 1] = (unsigned char)next;
    if (!t->crowd) {
        kolo__shm_publish_call_way(t->conn, t->slot, t->call + 2, next, was);
        return;
    }
    for (int i = 0; i < m->size; i++) /* the world's members, the lead's followers */
        if (i != m->rank) kolo__shm_publish_call_way(m->conns[i], t->slot, t->call + 2, next, was);
}

/* ---- allgather and alltoall: their output written through the cache or around it ----
 *
 * Both write their output once and never read it back, so from some size on it is written around
 * the cache (non-temporal stores), which saves reading each line before it is overwritten and
 * leaves the cache to the data still to come. Where that starts depends on the machine's caches:
 * on a 2-vCPU AMD EPYC VM (vCPUs on one or two CCDs) allgather and alltoall of 8 MiB ran 10-35 %
 * faster around the cache (KOLO_STREAM_OUT_MIN); on a 2-vCPU AMD EPYC (Zen 5) VM with a 32 MiB
 * last-level cache, out of place, 2 ranks, launches interleaved: allgather 8 MiB 250-290 us
 * through the cache against 383-425 around it, 16 MiB 590-640 against 704-740, 32 MiB 1675-1757
 * against 1520-1555; alltoall 8 MiB 280 against 376, 16 MiB 698-720 against 734, 32 MiB 1846-1938
 * against 1737-1750. So from OUT_CHOOSE_MIN each rank chooses for its own output, from its own
 * calls' timings, per size class x2 wide: way 0 is the rule above (around the cache from
 * KOLO_STREAM_OUT_MIN), way 1 the other. The ranks need not agree: each writes only its own
 * output. From OUT_CHOOSE_MAX, twice the last-level cache of the machines measured, the output
 * always goes around the cache: there a probe through it only costs. Below OUT_CHOOSE_MIN it
 * always goes through: around the cache won at no size under 8 MiB on any machine measured, and
 * choosing there cost. On a 2-vCPU AMD EPYC (Zen 4) VM, 2 ranks, 4 MiB, launches of 300 calls,
 * medians of 8 interleaved: allgather 221 us through, 350 around, 233 choosing; alltoall 277,
 * 339, 295 (the choice's probes, and noise that made it take the slower way for hundreds of
 * calls; in 10 more pairs choosing against through 387 against 307, and 312 against 251). The
 * same VM at 8 and 16 MiB (100-call launches, 8 pairs): allgather 916 / 2714 us through, 795 /
 * 1873 around, 766 / 2207 choosing; alltoall 966 / 2467, 796 / 1703, 783 / 1741. */
#define OUT_CHOOSE_MIN ((size_t)8 << 20)
/* The first probe of an output size comes after one call, not FIRST_PROBE_CALLS, so that it and
 * the recheck after it (calls 2-5) fall where a size's first calls are slow anyway: a program's
 * first steps, a benchmark's warm-up calls (5 in kolo-bench and the harness). Their slowness
 * biases no verdict: the probe is judged against the way in use timed afresh right after it, and
 * the size's first call (page faults and all) is the rule's and counted in none. After 4 calls,
 * the probe fell in a 20-call launch's first timed calls: on an Intel Xeon VM (2 vCPUs, AVX-512),
 * 2 ranks, where the two ways run within a few per cent of each other at 8-16 MiB, the band's 2-16
 * MiB, us per call, 8 rounds rotating the build before, this one, around the cache pinned and Open
 * MPI: alltoall 8 / 16 MiB 810 / 1641 -> 787 / 1611 (pinned 781 / 1590; Open MPI 776 / 1641),
 * allgather 685 / 1389 -> 657 / 1333 (pinned 663 / 1336; Open MPI 788 / 1563); 2-4 MiB, which do
 * not choose, alike. */
#define OUT_FIRST_PROBE_CALLS 1
#define OUT_CHOOSE_MAX ((size_t)64 << 20)

static int test_out = -1;
static uint64_t test_out_delay_ns[2];
static _Atomic uint64_t out_calls[2];

void kolo__coll_test_force_out(int stream) { test_out = stream; }
void kolo__coll_test_delay_out(int stream, uint64_t ns) { test_out_delay_ns[stream != 0] = ns; }
void kolo__coll_test_out_calls(uint64_t got[2])
{
    for (int i = 0; i < 2; i++) got[i] = atomic_load_explicit(&out_calls[i], memory_order_relaxed);
}

static kolo__choice *out_choice(kolo__mesh *m, size_t bytes)
{
    int k = 0;
    for (size_t b = bytes / OUT_CHOOSE_MIN; b >= 2 && k < KOLO_OUT_CLASSES - 1; b /= 2) k++;
    return &m->stream_out[k];
}

bool kolo__coll_out_stream(kolo__mesh *m, size_t bytes, kolo__out_ticket *t)
{
    bool rule = bytes >= KOLO_STREAM_OUT_MIN;
    t->start = 0;
    t->bytes = bytes;
    t->way = 0;
    t->stream = rule;
    if (bytes >= OUT_CHOOSE_MIN && bytes < OUT_CHOOSE_MAX) {
        if (test_out >= 0) {
            t->stream = test_out;
        } else {
            kolo__choice *c = out_choice(m, bytes);
            c->first_after = OUT_FIRST_PROBE_CALLS;
            t->way = kolo__choice_pick(c, kolo__now_ns(), -1, false);
            t->stream = rule != (t->way == 1);
            t->start = kolo__now_ns();
        }
    }
    return t->stream;
}

void kolo__coll_out_done(kolo__mesh *m, const kolo__out_ticket *t, const char *what, int st)
{
    if (t->bytes < OUT_CHOOSE_MIN || t->bytes >= OUT_CHOOSE_MAX || st != KOLO_OK) return;
    atomic_fetch_add_explicit(&out_calls[t->stream], 1, memory_order_relaxed);
    kolo__sleep_ns(test_out_delay_ns[t->stream]);
    if (!t->start) return;
    static const char *const rule_stream[2] = {"stores around the cache", "stores through the cache"};
    static const char *const rule_cached[2] = {"stores through the cache", "stores around the cache"};
    kolo__choice_learn(out_choice(m, t->bytes), t->way, t->start, t->bytes, what,
                       t->bytes >= KOLO_STREAM_OUT_MIN ? rule_stream : rule_cached);
}
