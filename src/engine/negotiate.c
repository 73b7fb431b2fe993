/* negotiate.c - one process set's negotiation: which names are ready on every member, do the
 * members agree on them, and in which order do they run.
 *
 * Protocol of one cycle, run by every member of the set in lock step (even with nothing new):
 *
 *   1. Each member builds a blob. Its fixed part (the same size on every member) holds flags
 *      (joined; for the world set also "leaving" and "busy"), the length of its variable part,
 *      the process sets it sees and its fusion threshold and cycle time (world set only; with
 *      KOLO_AUTOTUNE every rank applies rank 0's), and one bit per response-cache slot: set when
 *      this member has a pending request that matches the cached response of that slot. Its
 *      variable part holds a full description (kind, dtype, shape, op, root, scale factors,
 *      device, name; alltoall: splits) of each request that is not cached, and, from the
 *      coordinator (set rank 0) only, the names it declares stalled past KOLO_STALL_SHUTDOWN_TIME.
 *   2. One allgather of the fixed parts. In steady state (everything cached) that is the whole
 *      exchange: a name is ready when every member that has not joined set its bit (a bitwise
 *      AND computed locally from the gathered bits).
 *   3. When any member has a variable part, a second allgather (of variable sizes) carries the
 *      descriptions to every member. Every member adds them to its copy of the message table;
 *      a description of a name that is in the cache erases that slot everywhere (a member whose
 *      request differs from the cached response reports it in full, and every member then falls
 *      back to descriptions for that name).
 *   4. Every member computes the same ordered response list from the same gathered bytes:
 *      ready cached slots in slot order, then ready table entries in the order they were first
 *      reported, then JOIN when every member has joined. A table entry whose descriptions
 *      disagree becomes an error response naming the tensor, the field, both values and both
 *      ranks. Then every member runs the list (execute.c) and updates the cache in list order
 *      (insertions take the lowest free slot, or evict the least recently used slot), so the
 *      caches stay identical without further messages.
 *
 * Decisions that depend on a clock (stall errors) are made by the coordinator alone and reach
 * the others through its next blob, so that every member applies them in the same cycle. */
#include "internal.h"

#include "../trace/trace.h"

#include <stdio.h>

#define W kolo__W
#define E kolo__E

enum { REC_DESC = 1, REC_STALL = 2 };

static bool cacheable(int kind) { return kind <= KOLO__REDUCESCATTER; }

/* A name the engine gave an unnamed request ("allreduce.noname.17", request.c): never submitted
 * again, as the count only grows, so its response is not cached. Cached, a job that averages a
 * metric unnamed every step (or a model with SyncBatchNorm) filled the cache with names of the
 * past, evicted one each step and was told to raise KOLO_CACHE_CAPACITY, which could not help.
 * By name only, so every member decides alike. Names a framework gives parameters it found no
 * name for ("allreduce.noname.<group>.<index>", reused every step) are cached. */
static bool auto_named(const char *name)
{
    const char *p = strstr(name, ".noname.");
    if (!p || !p[8]) return false;
    for (p += 8; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

static int wrank(const kolo__pset_state *s, int r) { return s->g.ranks[r]; }

/* Said under a stall of an auto-named request: why such names stop matching, and what shows it. */
#define NONAME_HINT                                                                                    \
    "unnamed requests are numbered in the order each rank submits them ('allreduce.noname.<n>'), so a " \
    "rank that submitted one more or one fewer (an error caught on some ranks only, a branch not every " \
    "rank takes) shifts every later number and none match again: name the tensors to see which"

/* ---- set state ---- */

kolo__pset_state *kolo__pset_new(int id, const kolo__group *g, int me, int capacity)
{
    kolo__pset_state *s = kolo__calloc(1, sizeof(*s));
    if (!s) goto nomem;
    s->id = id;
    s->n = g->size;
    s->me = me;
    s->g.size = g->size;
    s->g.rank = me;
    s->cap = capacity;
    s->words = (capacity + 63) / 64;
    s->fixed_len = sizeof(kolo__fixed_hdr) + (size_t)s->words * 8;
    size_t n = (size_t)s->n, wb = (size_t)(s->words ? s->words : 1) * 8;
    s->g.ranks = kolo__malloc(n * sizeof(int));
    s->slots = kolo__calloc((size_t)(capacity ? capacity : 1), sizeof(kolo__slot));
    s->slot_req = kolo__calloc((size_t)(capacity ? capacity : 1), sizeof(kolo_request_t *));
    s->erased = kolo__calloc(4, wb);
    s->joined = kolo__calloc(n, 3);
    s->fix_mine = kolo__calloc(1, s->fixed_len);
    s->fix_all = kolo__calloc(n, s->fixed_len);
    s->counts = kolo__calloc(n, sizeof(size_t));
    if (!s->g.ranks || !s->slots || !s->slot_req || !s->erased || !s->joined || !s->fix_mine || !s->fix_all ||
        !s->counts)
        goto nomem_free;
    s->partial_prev = s->erased + (size_t)(s->words ? s->words : 1);
    s->and_bits = s->partial_prev + (size_t)(s->words ? s->words : 1);
    s->any_bits = s->and_bits + (size_t)(s->words ? s->words : 1);
    s->has = s->joined + n;
    s->miss = s->has + n;
    memcpy(s->g.ranks, g->ranks, n * sizeof(int));
    if (kolo__group_hosts_make(&s->g, W.host_of) != KOLO_OK) goto nomem_free;
    if (kolo__hmap_init(&s->lmap, 64) || kolo__hmap_init(&s->cmap, 64) || kolo__hmap_init(&s->emap, 64))
        goto nomem_free;
    s->last_joined = -1;
    s->last_stall_check = kolo__now_s();
    return s;
nomem_free:
    kolo__pset_free(s);
nomem:
    kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the negotiation state of process set %d", id);
    return NULL;
}

static void entry_free(kolo__entry *e)
{
    if (!e) return;
    kolo__free(e->name);
    kolo__free(e->rep);
    kolo__free(e->descs);
    kolo__free(e->splits);
    kolo__free(e->per_rank);
    kolo__free(e);
}

static void entry_remove(kolo__pset_state *s, kolo__entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else s->ehead = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->etail = e->prev;
    kolo__hmap_del(&s->emap, &e->node);
    s->nentries--;
    entry_free(e);
}

void kolo__pset_free(kolo__pset_state *s)
{
    if (!s) return;
    while (s->ehead) entry_remove(s, s->ehead);
    if (s->slots)
        for (int i = 0; i < s->cap; i++) {
            kolo__free(s->slots[i].name);
            kolo__free(s->slots[i].per_rank);
        }
    for (size_t i = 0; i < s->nresp; i++) kolo__free(s->resp[i].err);
    kolo__hmap_free(&s->lmap);
    kolo__hmap_free(&s->cmap);
    kolo__hmap_free(&s->emap);
    kolo__group_hosts_free(&s->g);
    kolo__free(s->g.ranks);
    kolo__free(s->slots);
    kolo__free(s->slot_req);
    kolo__free(s->erased);
    kolo__free(s->joined);
    kolo__free(s->fix_mine);
    kolo__free(s->fix_all);
    kolo__free(s->var_mine);
    kolo__free(s->var_all);
    kolo__free(s->counts);
    kolo__free(s->sent);
    kolo__free(s->resp);
    kolo__free(s);
}

/* ---- local requests ---- */

void kolo__pset_add_local(kolo__pset_state *s, kolo_request_t *r)
{
    if (r->d.kind == KOLO__JOIN) {
        s->join_req = r;
        return;
    }
    r->lstate = KOLO__L_NEW;
    r->slot = -1;
    r->lnext = NULL;
    r->lprev = s->ltail;
    if (s->ltail) s->ltail->lnext = r;
    else s->lhead = r;
    s->ltail = r;
    s->nlocal++;
    kolo__hmap_put(&s->lmap, &r->loc, r->name, 0, kolo__hash(r->name, 0));
}

static void local_remove(kolo__pset_state *s, kolo_request_t *r)
{
    if (r == s->join_req) {
        s->join_req = NULL;
        return;
    }
    if (r->lprev) r->lprev->lnext = r->lnext;
    else s->lhead = r->lnext;
    if (r->lnext) r->lnext->lprev = r->lprev;
    else s->ltail = r->lprev;
    r->lnext = r->lprev = NULL;
    s->nlocal--;
    kolo__hmap_del(&s->lmap, &r->loc);
}

static kolo_request_t *local_find(const kolo__pset_state *s, const char *name)
{
    kolo__hnode *h = kolo__hmap_get(&s->lmap, name, 0, kolo__hash(name, 0));
    return h ? KOLO__CONTAINER(h, kolo_request_t, loc) : NULL;
}

void kolo__pset_fail_all(kolo__pset_state *s, int status, const char *msg)
{
    while (s->lhead) {
        kolo_request_t *r = s->lhead;
        local_remove(s, r);
        kolo__req_complete(r, status, msg);
    }
    if (s->join_req) {
        kolo_request_t *r = s->join_req;
        s->join_req = NULL;
        kolo__req_complete(r, status, msg);
    }
}

void kolo__pset_complete(kolo__pset_state *s, kolo_request_t *r, int status, const char *msg)
{
    local_remove(s, r);
    kolo__req_complete(r, status, msg);
}

void kolo__pset_complete_ok(kolo__pset_state *s, kolo_request_t **rs, size_t n)
{
    for (size_t i = 0; i < n; i++) local_remove(s, rs[i]);
    kolo__req_complete_ok(rs, n);
}

/* ---- the response cache ---- */

static int cache_find(const kolo__pset_state *s, const char *name)
{
    if (!s->cap) return -1;
    kolo__hnode *h = kolo__hmap_get(&s->cmap, name, 0, kolo__hash(name, 0));
    return h ? (int)(KOLO__CONTAINER(h, kolo__slot, node) - s->slots) : -1;
}

/* Does this rank's request match the cached response exactly (its own per-rank part included)? */
static bool cache_matches(const kolo__pset_state *s, const kolo__slot *sl, const kolo_request_t *r)
{
    const kolo__desc *a = &sl->d, *b = &r->d;
    if (a->kind != b->kind || a->dtype != b->dtype || a->op != b->op || a->ndim != b->ndim || a->root != b->root ||
        a->pre != b->pre || a->post != b->post || strcmp(a->device, b->device) != 0)
        return false;
    int first = (a->kind == KOLO__ALLGATHER || a->kind == KOLO__ALLTOALL) ? 1 : 0;
    for (int i = first; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return false;
    if (a->kind == KOLO__ALLGATHER) return sl->per_rank[s->me] == b->dims[0];
    if (a->kind == KOLO__ALLTOALL)
        return memcmp(sl->per_rank + (size_t)s->me * (size_t)s->n, r->splits, (size_t)s->n * sizeof(int64_t)) == 0;
    return true;
}

/* The timeline's name for negotiating an operation (a kind of collective, and its op). */
static const char *negotiate_phase(int kind, int op)
{
    static const char *const names[KOLO__KIND_COUNT] = {
        "NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER", "NEGOTIATE_BROADCAST", "NEGOTIATE_ALLTOALL",
        "NEGOTIATE_REDUCESCATTER", "NEGOTIATE_JOIN", "NEGOTIATE_BARRIER"};
    return kind == KOLO__ALLREDUCE && op == KOLO_ADASUM ? "NEGOTIATE_ADASUM" : names[kind];
}

/* Removes a slot on every member (called from deterministic points only). Local requests that
 * were waiting on its bit fall back to a full description in the next cycle. */
static void cache_erase(kolo__pset_state *s, int i)
{
    kolo__slot *sl = &s->slots[i];
    if (!sl->valid) return;
    for (kolo_request_t *r = s->lhead; r; r = r->lnext)
        if (r->lstate == KOLO__L_CACHED && r->slot == i) {
            r->lstate = KOLO__L_NEEDDESC;
            r->slot = -1;
        }
    if (sl->negotiating && kolo__trace_on())
        kolo__trace_end(sl->name, negotiate_phase(sl->d.kind, sl->d.op)); /* closed without a response */
    kolo__hmap_del(&s->cmap, &sl->node);
    kolo__free(sl->name);
    kolo__free(sl->per_rank);
    memset(sl, 0, sizeof(*sl));
    s->erased[i / 64] |= 1ull << (i % 64);
}

static int cache_insert(kolo__pset_state *s, const kolo__resp *rp)
{
    int victim = -1;
    for (int i = 0; i < s->cap; i++)
        if (!s->slots[i].valid) {
            victim = i;
            break;
        }
    if (victim < 0) { /* the least recently used; cap >= 1 here */
        uint64_t best = s->slots[0].lru;
        victim = 0;
        for (int i = 1; i < s->cap; i++)
            if (s->slots[i].lru < best) {
                best = s->slots[i].lru;
                victim = i;
            }
        /* Named tensors whose names change every step ("loss_%d") fill it too; they cannot be
         * cached and cost nothing more for it (2 ranks, 20,000 small allreduces from Python:
         * 49 us a step, against 51 under one name and 42 with no cache), so the warning names
         * both tensors rather than only asking for a larger cache. */
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            KOLO_WARN("the response cache of process set %d is full (KOLO_CACHE_CAPACITY %d): '%s' made room for "
                      "'%s'. If the job has more distinct tensors than that, raise it; names that change every "
                      "call (a step number in the name) cannot be cached, and only cost a full negotiation each",
                      s->id, s->cap, s->slots[victim].name ? s->slots[victim].name : "?", rp->name);
        atomic_fetch_add_explicit(&E.st.cache_evictions, 1, memory_order_relaxed);
        cache_erase(s, victim);
        s->erased[victim / 64] &= ~(1ull << (victim % 64));
    }
    kolo__slot *sl = &s->slots[victim];
    size_t npr = rp->d.kind == KOLO__ALLGATHER ? (size_t)s->n
                 : rp->d.kind == KOLO__ALLTOALL ? (size_t)s->n * (size_t)s->n : 0;
    sl->name = kolo__strdup(rp->name);
    sl->per_rank = npr ? kolo__malloc(npr * sizeof(int64_t)) : NULL;
    if (!sl->name || (npr && !sl->per_rank)) {
        kolo__free(sl->name);
        kolo__free(sl->per_rank);
        memset(sl, 0, sizeof(*sl));
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the response cache of process set %d", s->id);
    }
    if (npr) memcpy(sl->per_rank, rp->per_rank, npr * sizeof(int64_t));
    sl->d = rp->d;
    sl->valid = 1;
    sl->lru = ++s->clock;
    kolo__hmap_put(&s->cmap, &sl->node, sl->name, 0, kolo__hash(sl->name, 0));
    return KOLO_OK;
}

/* ---- blobs ---- */

static int var_reserve(kolo__pset_state *s, size_t more)
{
    if (s->var_len + more <= s->var_cap) return KOLO_OK;
    size_t cap = KOLO_MAX(s->var_cap * 2, s->var_len + more + 4096);
    unsigned char *p = kolo__realloc(s->var_mine, cap);
    if (!p) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for negotiation messages");
    s->var_mine = p;
    s->var_cap = cap;
    return KOLO_OK;
}

static void put(kolo__pset_state *s, const void *p, size_t n)
{
    memcpy(s->var_mine + s->var_len, p, n);
    s->var_len += n;
}

static _Atomic int garble_next; /* tests: see kolo__engine_test_garble */

void kolo__engine_test_garble(int how) { atomic_store(&garble_next, how); }

bool kolo__engine_garble_take(int how)
{
    int want = how;
    return atomic_load_explicit(&garble_next, memory_order_relaxed) == how &&
           atomic_compare_exchange_strong(&garble_next, &want, 0);
}

/* The tests' garbled descriptions (kolo__engine_test_garble): what this rank writes in place of
 * d's record, bytes a submission's checks (request.c) would never let through. */
static void garble(int how, kolo__desc *d, uint8_t hdr[5], int64_t *splits, int n)
{
    switch (how) {
    case KOLO__GARBLE_NEGATIVE_DIM: d->dims[0] = -3; break;
    case KOLO__GARBLE_HUGE: d->dims[0] = (int64_t)1 << 46; break;
    case KOLO__GARBLE_ROOT: d->root = n + 5; break;
    case KOLO__GARBLE_NEGATIVE_SPLIT: splits[0] = -1; break;
    case KOLO__GARBLE_SPLITS_OVER: splits[n - 1] += d->dims[0] + 1; break;
    case KOLO__GARBLE_OP: hdr[3] = KOLO_ADASUM; break;
    case KOLO__GARBLE_RECORD: hdr[0] = 9; break;
    default: break;
    }
}

static int put_desc(kolo__pset_state *s, const kolo_request_t *r)
{
    const kolo__desc *d = &r->d;
    int how = atomic_load_explicit(&garble_next, memory_order_relaxed);
    how = how && how < KOLO__GARBLE_COUNT && kolo__engine_garble_take(how) ? how : 0; /* not the engine values' */
    if (s->n > KOLO__GARBLE_SPLITS_MAX) how = 0;
    kolo__desc g;
    int64_t gsplits[KOLO__GARBLE_SPLITS_MAX];
    if (how) {
        g = *d;
        d = &g;
        if (r->splits) memcpy(gsplits, r->splits, (size_t)KOLO_MIN(s->n, KOLO__GARBLE_SPLITS_MAX) * 8);
    }
    size_t devlen = strlen(d->device), namelen = strlen(r->name) + 1;
    size_t len = 1 + 4 + 4 + 16 + (size_t)d->ndim * 8 + 1 + devlen + 2 + namelen +
                 (d->kind == KOLO__ALLTOALL ? (size_t)s->n * 8 : 0);
    int st = var_reserve(s, len);
    if (st) return st;
    uint8_t hdr[5] = {REC_DESC, d->kind, d->dtype, d->op, d->ndim};
    if (how) garble(how, &g, hdr, gsplits, s->n);
    put(s, hdr, 5);
    put(s, &d->root, 4);
    put(s, &d->pre, 8);
    put(s, &d->post, 8);
    put(s, d->dims, (size_t)d->ndim * 8);
    uint8_t dl = (uint8_t)devlen;
    put(s, &dl, 1);
    put(s, d->device, devlen);
    uint16_t nl = (uint16_t)(how == KOLO__GARBLE_NAME_LENGTH ? 60000 : namelen);
    put(s, &nl, 2);
    put(s, r->name, namelen);
    if (d->kind == KOLO__ALLTOALL) put(s, how ? gsplits : r->splits, (size_t)s->n * 8);
    return KOLO_OK;
}

static int put_stall(kolo__pset_state *s, const char *name)
{
    size_t namelen = strlen(name) + 1;
    int st = var_reserve(s, 3 + namelen);
    if (st) return st;
    uint8_t t = REC_STALL;
    uint16_t nl = (uint16_t)namelen;
    put(s, &t, 1);
    put(s, &nl, 2);
    put(s, name, namelen);
    return KOLO_OK;
}

int kolo__negotiate_build(kolo__pset_state *s, uint32_t flags, const uint64_t *present)
{
    s->var_len = 0;
    s->nsent = 0;
    uint64_t *bits = (uint64_t *)(void *)(s->fix_mine + sizeof(kolo__fixed_hdr));
    for (int w = 0; w < s->words; w++) /* forget last cycle's slot -> request links */
        for (uint64_t b = bits[w]; b; b &= b - 1) s->slot_req[w * 64 + __builtin_ctzll(b)] = NULL;
    memset(s->fix_mine, 0, s->fixed_len);
    if (s->sent_cap < s->nlocal) {
        size_t cap = KOLO_MAX(s->nlocal, 2 * s->sent_cap);
        kolo_request_t **p = kolo__realloc(s->sent, cap * sizeof(*p));
        if (!p) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for negotiation");
        s->sent = p;
        s->sent_cap = cap;
    }
    for (kolo_request_t *r = s->lhead; r; r = r->lnext) {
        if (r->lstate == KOLO__L_NEW) {
            r->lstate = KOLO__L_NEEDDESC;
            int i = cacheable(r->d.kind) ? cache_find(s, r->name) : -1;
            if (i >= 0 && cache_matches(s, &s->slots[i], r)) {
                r->lstate = KOLO__L_CACHED;
                r->slot = i;
            }
        }
        if (r->lstate == KOLO__L_CACHED) {
            bits[r->slot / 64] |= 1ull << (r->slot % 64);
            s->slot_req[r->slot] = r;
        } else if (r->lstate == KOLO__L_NEEDDESC) {
            int st = put_desc(s, r);
            if (st) return st;
            r->lstate = KOLO__L_SENT;
            s->sent[s->nsent++] = r;
        }
    }
    if (s->me == 0) {
        /* the coordinator's stall decisions (see kolo__negotiate_stall_check) */
        for (kolo__entry *e = s->ehead; e; e = e->next)
            if (e->stall_fail == KOLO__STALL_DECIDED) {
                int st = put_stall(s, e->name);
                if (st) return st;
                e->stall_fail = KOLO__STALL_SENT;
            }
        for (int i = 0; i < s->cap && s->had_stall; i++)
            if (s->slots[i].valid && s->slots[i].stall_fail == KOLO__STALL_DECIDED) {
                int st = put_stall(s, s->slots[i].name);
                if (st) return st;
                s->slots[i].stall_fail = KOLO__STALL_SENT;
            }
    }
    kolo__fixed_hdr h;
    memset(&h, 0, sizeof(h));
    h.flags = flags | (s->join_req ? KOLO__F_JOINED : 0u);
    h.varlen = (uint32_t)s->var_len;
    if (present) {
        memcpy(h.present, present, sizeof(h.present));
        memcpy(h.holds, E.holds, sizeof(h.holds));
        memcpy(h.waits, E.waits, sizeof(h.waits));
        h.tune_fusion = E.fusion;
        h.tune_cycle_us = (uint32_t)(E.cycle_s * 1e6 + 0.5);
        h.tune_state = kolo__tune_word();
        if (kolo__engine_garble_take(KOLO__GARBLE_TUNE_CYCLE)) h.tune_cycle_us = UINT32_MAX;
    }
    memcpy(s->fix_mine, &h, sizeof(h));
    return KOLO_OK;
}

/* The cycle's allgathers. Up to NEGOTIATE_EXCHANGE_MAX members a one-round exchange (each member
 * posts its blob to every other at once); above, Bruck's algorithm: ceil(log2 n) rounds of one
 * send each. The exchange costs each member 2(n - 1) messages every cycle, and where ranks share
 * memory it fills in every pair's engine rings on a host whose ranks outnumber its cores (rings
 * are filled at first use there), which nothing else of a framework's job touches (its tensors go
 * by recursive doubling or the ring). engine-bench on the 2-vCPU Xeon VM, exchange against Bruck
 * (-n 1 -s 300, launches alternated, 3 each; 2 each at 64): 8 and 16 ranks tie within the noise
 * (negotiation 130-253 us a cycle both ways at 8; 392-423 against 457-481 at 16, the tiny step
 * 1.07-1.20 ms against 1.06-1.09); 32 ranks 748-922 against 787-884 us a cycle, the job's shared
 * memory 1,289 MB against 537, its system time 8.8-11.8 s against 5.6-5.8; 64 ranks 9.5-9.7 ms
 * against 2.3 ms a cycle, the tiny step 29 ms against 8.5, shared memory 2,395 MB against 668. */
#define NEGOTIATE_EXCHANGE_MAX 16

static int gather(kolo__pset_state *s, const void *mine, void *all)
{
    if (s->n > NEGOTIATE_EXCHANGE_MAX) return kolo__coll_allgather_few_peers(E.mesh, &s->g, mine, all, s->counts, 1);
    return kolo__coll_allgather(E.mesh, &s->g, mine, all, s->counts, 1);
}

int kolo__negotiate_gather_fixed(kolo__pset_state *s)
{
    for (int r = 0; r < s->n; r++) s->counts[r] = s->fixed_len;
    return gather(s, s->fix_mine, s->fix_all);
}

/* ---- deciding ---- */

typedef struct reader {
    const unsigned char *p, *end;
    int bad;
} reader;

static void get(reader *rd, void *out, size_t n)
{
    if (rd->bad || (size_t)(rd->end - rd->p) < n) {
        rd->bad = 1;
        memset(out, 0, n);
        return;
    }
    memcpy(out, rd->p, n);
    rd->p += n;
}

static const char *get_name(reader *rd)
{
    uint16_t nl;
    get(rd, &nl, 2);
    if (rd->bad || nl == 0 || (size_t)(rd->end - rd->p) < nl || rd->p[nl - 1] != '\0') {
        rd->bad = 1;
        return NULL;
    }
    const char *name = (const char *)rd->p;
    rd->p += nl;
    return name;
}

static int resp_reserve(kolo__pset_state *s)
{
    if (s->nresp < s->resp_cap) return KOLO_OK;
    size_t cap = KOLO_MAX(16, s->resp_cap * 2);
    kolo__resp *p = kolo__realloc(s->resp, cap * sizeof(*p));
    if (!p) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the response list");
    s->resp = p;
    s->resp_cap = cap;
    return KOLO_OK;
}

static kolo__resp *resp_add(kolo__pset_state *s, const char *name, const kolo__desc *d)
{
    if (resp_reserve(s)) return NULL;
    kolo__resp *rp = &s->resp[s->nresp++];
    memset(rp, 0, sizeof(*rp));
    rp->name = name;
    rp->d = *d;
    rp->slot = -1;
    if (d->kind == KOLO__ALLREDUCE) {
        rp->count = kolo__desc_count(d);
        rp->bytes = rp->count * kolo_dtype_size((kolo_dtype_t)d->dtype);
    }
    return rp;
}

static void resp_error(kolo__resp *rp, int status, const char *msg)
{
    rp->status = status;
    rp->err = kolo__strdup(msg); /* NULL: the status's name is shown */
}

/* The world ranks of the members whose mark is (non-zero) == want (kolo__ranks_add). */
static const char *ranks_list(const kolo__pset_state *s, const uint8_t *mark, int want, char *buf, size_t cap)
{
    kolo__ranks_text t;
    kolo__ranks_begin(&t, buf, cap);
    for (int r = 0; r < s->n; r++)
        if ((mark[r] != 0) == (want != 0)) kolo__ranks_add(&t, wrank(s, r));
    return kolo__ranks_end(&t);
}

/* A joined member has no data for collectives other than allreduce and barrier. */
static bool join_blocks(int kind) { return kind == KOLO__ALLGATHER || kind == KOLO__BROADCAST || kind == KOLO__ALLTOALL || kind == KOLO__REDUCESCATTER; }

static void join_error(kolo__pset_state *s, kolo__resp *rp, const uint8_t *has)
{
    char who[256], msg[768];
    for (int r = 0; r < s->n; r++) s->miss[r] = (uint8_t)(s->joined[r] && !has[r]);
    ranks_list(s, s->miss, 1, who, sizeof(who));
    snprintf(msg, sizeof(msg),
             "%s '%s' cannot run while rank(s) %s of process set %d have joined (kolo_ijoin): joined ranks take part "
             "in allreduces (with zeros) and barriers only",
             kolo__kind_lower[rp->d.kind], rp->name, who, s->id);
    resp_error(rp, KOLO_ERR_MISMATCH, msg);
}

/* Checks that every reporter agrees with the first; on disagreement an error response. */
static int construct(kolo__pset_state *s, kolo__entry *e)
{
    int first = -1;
    for (int r = 0; r < s->n; r++)
        if (e->rep[r]) {
            first = r;
            break;
        }
    const kolo__desc *a = &e->descs[first];
    kolo__resp *rp = resp_add(s, e->name, a);
    if (!rp) return KOLO_ERR_NO_MEMORY;
    rp->e = e;
    char msg[1024] = "", va[256], vb[256];
    const char *kl = kolo__kind_lower[a->kind];
    int bad = -1;
    for (int r = first + 1; r < s->n && !msg[0]; r++) {
        if (!e->rep[r]) continue;
        const kolo__desc *b = &e->descs[r];
        bad = r;
        int wa = wrank(s, first), wb = wrank(s, r);
        if (a->kind != b->kind) {
            snprintf(msg, sizeof(msg), "Mismatched operations for '%s': rank %d did an %s, rank %d did an %s", e->name,
                     wa, kolo__kind_lower[a->kind], wb, kolo__kind_lower[b->kind]);
            break;
        }
        if (a->kind == KOLO__BARRIER) continue;
        if (a->dtype != b->dtype) {
            snprintf(msg, sizeof(msg), "Mismatched %s data types for '%s': rank %d sent %s, rank %d sent %s", kl,
                     e->name, wa, kolo_dtype_name((kolo_dtype_t)a->dtype), wb, kolo_dtype_name((kolo_dtype_t)b->dtype));
            break;
        }
        if (strcmp(a->device, b->device) != 0) {
            snprintf(msg, sizeof(msg), "Mismatched %s devices for '%s': rank %d sent %s, rank %d sent %s", kl, e->name,
                     wa, a->device, wb, b->device);
            break;
        }
        bool row_only = a->kind == KOLO__ALLGATHER || a->kind == KOLO__ALLTOALL;
        bool shape_ok = a->ndim == b->ndim;
        for (int i = row_only ? 1 : 0; shape_ok && i < a->ndim; i++) shape_ok = a->dims[i] == b->dims[i];
        if (!shape_ok) {
            snprintf(msg, sizeof(msg), "Mismatched %s tensor shapes for '%s': rank %d sent %s, rank %d sent %s%s", kl,
                     e->name, wa, kolo__shape_str(a->dims, a->ndim, va, sizeof(va)), wb,
                     kolo__shape_str(b->dims, b->ndim, vb, sizeof(vb)),
                     row_only ? " (only the first dimension may differ)" : "");
            break;
        }
        if ((a->kind == KOLO__ALLREDUCE || a->kind == KOLO__REDUCESCATTER) && a->op != b->op) {
            snprintf(msg, sizeof(msg), "Mismatched %s reduction ops for '%s': rank %d sent %s, rank %d sent %s", kl,
                     e->name, wa, kolo_op_name((kolo_op_t)a->op), wb, kolo_op_name((kolo_op_t)b->op));
            break;
        }
        if (a->pre != b->pre || a->post != b->post) {
            snprintf(msg, sizeof(msg),
                     "Mismatched %s prescale/postscale factors for '%s': rank %d sent (%.17g, %.17g), rank %d sent "
                     "(%.17g, %.17g)",
                     kl, e->name, wa, a->pre, a->post, wb, b->pre, b->post);
            break;
        }
        if (a->kind == KOLO__BROADCAST && a->root != b->root) {
            snprintf(msg, sizeof(msg), "Mismatched broadcast root ranks for '%s': rank %d sent %d, rank %d sent %d",
                     e->name, wa, a->root, wb, b->root);
            break;
        }
    }
    if (msg[0]) {
        (void)bad;
        resp_error(rp, KOLO_ERR_MISMATCH, msg);
        return KOLO_OK;
    }
    if (s->njoined && join_blocks(a->kind)) {
        bool missing = false;
        for (int r = 0; r < s->n; r++) missing |= s->joined[r] && !e->rep[r];
        if (missing) {
            join_error(s, rp, e->rep);
            return KOLO_OK;
        }
    }
    if (a->kind == KOLO__ALLGATHER) {
        e->per_rank = kolo__malloc((size_t)s->n * sizeof(int64_t));
        if (!e->per_rank) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for negotiation");
        for (int r = 0; r < s->n; r++) e->per_rank[r] = e->descs[r].dims[0];
        rp->per_rank = e->per_rank;
    } else if (a->kind == KOLO__ALLTOALL) {
        rp->per_rank = e->splits;
    }
    return KOLO_OK;
}

static kolo__entry *entry_get(kolo__pset_state *s, const char *name, int *created)
{
    uint64_t h = kolo__hash(name, 0);
    kolo__hnode *hn = kolo__hmap_get(&s->emap, name, 0, h);
    *created = 0;
    if (hn) return KOLO__CONTAINER(hn, kolo__entry, node);
    kolo__entry *e = kolo__calloc(1, sizeof(*e));
    if (!e) return NULL;
    e->name = kolo__strdup(name);
    e->rep = kolo__calloc((size_t)s->n, 1);
    e->descs = kolo__calloc((size_t)s->n, sizeof(kolo__desc));
    if (!e->name || !e->rep || !e->descs) {
        entry_free(e);
        return NULL;
    }
    e->first_seen = kolo__now_s();
    e->prev = s->etail;
    if (s->etail) s->etail->next = e;
    else s->ehead = e;
    s->etail = e;
    s->nentries++;
    kolo__hmap_put(&s->emap, &e->node, e->name, 0, h);
    *created = 1;
    return e;
}

/* Timeline: member r reported name (an instant named by its world rank). */
static void tick(const kolo__pset_state *s, kolo__trace_seq *q, const char *name, int r)
{
    kolo__trace_seq_mark(q, name, wrank(s, r));
}

static int parse_var(kolo__pset_state *s, int r, const unsigned char *p, size_t len, kolo__trace_seq *q)
{
    reader rd = {p, p + len, 0};
    while (!rd.bad && rd.p < rd.end) {
        uint8_t t;
        get(&rd, &t, 1);
        if (t == REC_DESC) {
            kolo__desc d;
            memset(&d, 0, sizeof(d));
            uint8_t h4[4], dl;
            get(&rd, h4, 4);
            d.kind = h4[0];
            d.dtype = h4[1];
            d.op = h4[2];
            d.ndim = h4[3];
            if (d.kind >= KOLO__KIND_COUNT || d.ndim > KOLO_MAX_DIMS || d.dtype >= KOLO_DTYPE_COUNT ||
                d.op >= KOLO_OP_COUNT) {
                rd.bad = 1;
                break;
            }
            get(&rd, &d.root, 4);
            get(&rd, &d.pre, 8);
            get(&rd, &d.post, 8);
            get(&rd, d.dims, (size_t)d.ndim * 8);
            get(&rd, &dl, 1);
            if (dl >= KOLO__DEVICE_MAX) {
                rd.bad = 1;
                break;
            }
            get(&rd, d.device, dl);
            const char *name = get_name(&rd);
            const unsigned char *splits = rd.p;
            if (d.kind == KOLO__ALLTOALL) {
                int64_t skip[1];
                for (int i = 0; i < s->n; i++) get(&rd, skip, 8);
            }
            if (rd.bad) break;
            char buf[256]; /* a description no submission could have made: garbled on its way */
            const char *why = kolo__desc_problem(&d, splits, s->n, s->id, buf, sizeof(buf));
            if (why)
                return kolo__err(KOLO_ERR_PROTOCOL,
                                 "rank %d sent a malformed negotiation message for process set %d: '%s': %s",
                                 wrank(s, r), s->id, name, why);
            int slot = cache_find(s, name);
            if (slot >= 0 && q && s->slots[slot].negotiating) { /* in order with this cycle's events */
                kolo__trace_seq_end(q, name, negotiate_phase(s->slots[slot].d.kind, s->slots[slot].d.op));
                s->slots[slot].negotiating = 0;
            }
            if (slot >= 0) cache_erase(s, slot);
            int created;
            kolo__entry *e = entry_get(s, name, &created);
            if (!e) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the message table");
            if (e->rep[r]) {
                rd.bad = 1;
                break;
            }
            if (d.kind == KOLO__ALLTOALL) {
                if (!e->splits) e->splits = kolo__calloc((size_t)s->n * (size_t)s->n, sizeof(int64_t));
                if (!e->splits) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the message table");
                memcpy(e->splits + (size_t)r * (size_t)s->n, splits, (size_t)s->n * 8);
            }
            e->rep[r] = 1;
            e->descs[r] = d;
            e->nrep++;
            if (created) {
                e->kind = d.kind;
                e->op = d.op;
            }
            if (q) {
                if (created) {
                    kolo__trace_seq_begin(q, e->name, negotiate_phase(d.kind, d.op));
                    e->negotiating = 1;
                }
                if (e->negotiating) tick(s, q, e->name, r);
            }
            atomic_fetch_add_explicit(&E.st.cache_misses, r == s->me ? 1 : 0, memory_order_relaxed);
        } else if (t == REC_STALL) {
            const char *name = get_name(&rd);
            if (rd.bad || r != 0) {
                rd.bad = 1;
                break;
            }
            kolo__hnode *hn = kolo__hmap_get(&s->emap, name, 0, kolo__hash(name, 0));
            if (hn) KOLO__CONTAINER(hn, kolo__entry, node)->stall_fail = KOLO__STALL_APPLY;
            int slot = cache_find(s, name);
            if (slot >= 0) {
                s->slots[slot].stall_fail = KOLO__STALL_APPLY;
                s->had_stall = 1;
            }
        } else {
            rd.bad = 1;
        }
    }
    if (rd.bad)
        return kolo__err(KOLO_ERR_PROTOCOL, "rank %d sent a malformed negotiation message for process set %d",
                         wrank(s, r), s->id);
    return KOLO_OK;
}

static void stall_error(kolo__pset_state *s, kolo__resp *rp, const uint8_t *has)
{
    char a[256], b[256], msg[1024];
    uint8_t *miss = s->miss;
    for (int r = 0; r < s->n; r++) miss[r] = (uint8_t)(!has[r] && !s->joined[r]);
    bool noname = auto_named(rp->name);
    snprintf(msg, sizeof(msg),
             "%s '%s' stalled: submitted by rank(s) %s but not by rank(s) %s for more than %g s "
             "(KOLO_STALL_SHUTDOWN_TIME)%s%s",
             kolo__kind_lower[rp->d.kind], rp->name, ranks_list(s, has, 1, a, sizeof(a)),
             ranks_list(s, miss, 1, b, sizeof(b)), E.stall_shutdown, noname ? "; " : "", noname ? NONAME_HINT : "");
    resp_error(rp, KOLO_ERR_TIMEOUT, msg);
}

/* What the members' messages say: which names every member holds, each one's response (or
 * error), the joins. q: the timeline's events, or NULL when no timeline is running. */
static int decide(kolo__pset_state *s, kolo__trace_seq *q)
{
    int n = s->n, st;
    /* joins: the last member to join in rank order of the cycle it joined in */
    for (int r = 0; r < n; r++)
        if ((kolo__fixed_of(s, r)->flags & KOLO__F_JOINED) && !s->joined[r]) {
            s->joined[r] = 1;
            s->njoined++;
            s->last_joined = r;
        }
    /* cache bits past the capacity name no slot: only a garbled message sets them (and reading
     * the slots they would name reads past the table) */
    if (s->cap % 64) {
        uint64_t past = ~0ull << (s->cap % 64);
        for (int r = 0; r < n; r++) {
            const uint64_t *bits = kolo__cache_bits_of(s, r);
            uint64_t bad = bits[s->words - 1] & past;
            if (bad)
                return kolo__err(KOLO_ERR_PROTOCOL,
                                 "rank %d sent a malformed negotiation message for process set %d: it marks "
                                 "response-cache slot %d, of %d",
                                 wrank(s, r), s->id, (s->words - 1) * 64 + __builtin_ctzll(bad), s->cap);
        }
    }
    /* descriptions */
    for (int w = 0; w < s->words; w++) s->erased[w] = 0;
    size_t off = 0;
    for (int r = 0; r < n; r++) {
        if (s->counts[r] && (st = parse_var(s, r, s->var_all + off, s->counts[r], q))) return st;
        off += s->counts[r];
    }
    s->nresp = 0;
    /* cached names: AND over the members that have not joined, OR over all */
    double now = kolo__now_s();
    uint8_t *has = s->has;
    for (int w = 0; w < s->words; w++) {
        uint64_t a = ~0ull, o = 0;
        for (int r = 0; r < n; r++) {
            const uint64_t *bits = kolo__cache_bits_of(s, r);
            o |= bits[w];
            if (!s->joined[r]) a &= bits[w];
        }
        a &= o & ~s->erased[w];
        o &= ~s->erased[w];
        s->and_bits[w] = a;
        s->any_bits[w] = o;
        uint64_t partial = o & ~a, gone = s->partial_prev[w] & ~partial;
        s->partial_prev[w] = partial;
        while (gone) {
            int i = w * 64 + __builtin_ctzll(gone);
            gone &= gone - 1;
            s->slots[i].partial_since = 0;
            if (s->slots[i].stall_fail != KOLO__STALL_APPLY) s->slots[i].stall_fail = KOLO__STALL_NONE;
        }
        uint64_t seen = o;
        while (seen) {
            int i = w * 64 + __builtin_ctzll(seen);
            seen &= seen - 1;
            kolo__slot *sl = &s->slots[i];
            if (!sl->valid) continue;
            bool ready = (a >> (i % 64)) & 1;
            if (!ready && sl->partial_since == 0) sl->partial_since = now;
            if (q) {
                if (!sl->negotiating) {
                    kolo__trace_seq_begin(q, sl->name, negotiate_phase(sl->d.kind, sl->d.op));
                    sl->negotiating = 1;
                    sl->seen_mask = 0;
                }
                for (int r = 0; r < n && r < 64; r++) {
                    const uint64_t *bits = kolo__cache_bits_of(s, r);
                    if (((bits[w] >> (i % 64)) & 1) && !((sl->seen_mask >> r) & 1)) {
                        sl->seen_mask |= 1ull << r;
                        tick(s, q, sl->name, r);
                    }
                }
            }
            bool fail = sl->stall_fail == KOLO__STALL_APPLY;
            if (!ready && !fail) continue;
            kolo__resp *rp = resp_add(s, sl->name, &sl->d);
            if (!rp) return KOLO_ERR_NO_MEMORY;
            rp->slot = i;
            rp->per_rank = sl->per_rank;
            rp->req = s->slot_req[i];
            for (int r = 0; r < n; r++) {
                const uint64_t *bits = kolo__cache_bits_of(s, r);
                has[r] = (uint8_t)((bits[w] >> (i % 64)) & 1);
            }
            if (sl->negotiating) {
                if (q) kolo__trace_seq_end(q, sl->name, negotiate_phase(sl->d.kind, sl->d.op));
                sl->negotiating = 0;
            }
            if (fail) {
                stall_error(s, rp, has);
                sl->stall_fail = KOLO__STALL_NONE;
                sl->partial_since = 0;
            } else if (s->njoined && join_blocks(sl->d.kind)) {
                bool missing = false;
                for (int r = 0; r < n; r++) missing |= s->joined[r] && !has[r];
                if (missing) join_error(s, rp, has);
            }
            if (rp->req && rp->status == KOLO_OK) atomic_fetch_add_explicit(&E.st.cache_hits, 1, memory_order_relaxed);
        }
    }
    /* described names, in the order they were first reported */
    for (kolo__entry *e = s->ehead; e; e = e->next) {
        bool ready = true;
        for (int r = 0; r < n && ready; r++) ready = e->rep[r] || s->joined[r];
        if (!ready && e->stall_fail != KOLO__STALL_APPLY) continue;
        if (e->negotiating) {
            if (q) kolo__trace_seq_end(q, e->name, negotiate_phase(e->kind, e->op));
            e->negotiating = 0;
        }
        size_t before = s->nresp;
        if (!ready) {
            int first = 0;
            while (!e->rep[first]) first++;
            kolo__resp *rp = resp_add(s, e->name, &e->descs[first]);
            if (!rp) return KOLO_ERR_NO_MEMORY;
            rp->e = e;
            stall_error(s, rp, e->rep);
        } else if ((st = construct(s, e))) {
            return st;
        }
        kolo__resp *rp = &s->resp[before];
        kolo_request_t *r = local_find(s, e->name);
        if (r && r->lstate == KOLO__L_SENT && e->rep[s->me]) rp->req = r;
    }
    /* stall errors for cached names nobody holds any more are void */
    if (s->had_stall) {
        for (int i = 0; i < s->cap; i++)
            if (s->slots[i].stall_fail == KOLO__STALL_APPLY) s->slots[i].stall_fail = KOLO__STALL_NONE;
        s->had_stall = 0;
    }
    /* every member has joined: the join completes, everyone learns the last to join */
    if (s->njoined == n) {
        kolo__desc d;
        memset(&d, 0, sizeof(d));
        d.kind = KOLO__JOIN;
        kolo__resp *rp = resp_add(s, "join.noname", &d);
        if (!rp) return KOLO_ERR_NO_MEMORY;
        rp->req = s->join_req;
    }
    return KOLO_OK;
}

int kolo__negotiate_decide(kolo__pset_state *s)
{
    int n = s->n, st;
    size_t total = 0;
    for (int r = 0; r < n; r++) {
        s->counts[r] = kolo__fixed_of(s, r)->varlen;
        total += s->counts[r];
    }
    if (total) {
        if (total > s->var_all_cap) {
            unsigned char *p = kolo__malloc(total + 4096);
            if (!p) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for negotiation messages");
            kolo__free(s->var_all);
            s->var_all = p;
            s->var_all_cap = total + 4096;
        }
        st = gather(s, s->var_mine, s->var_all);
        if (st) return st;
    }
    if (!kolo__trace_on()) return decide(s, NULL);
    kolo__trace_seq q; /* the cycle's negotiation events, in one go */
    kolo__trace_seq_open(&q);
    st = decide(s, &q);
    kolo__trace_seq_close(&q);
    return st;
}

int kolo__negotiate_finish(kolo__pset_state *s)
{
    int st = KOLO_OK;
    for (size_t i = 0; i < s->nresp; i++) {
        kolo__resp *rp = &s->resp[i];
        if (rp->d.kind == KOLO__JOIN) {
            memset(s->joined, 0, (size_t)s->n);
            s->njoined = 0;
            s->last_joined = -1;
        } else if (rp->slot >= 0) {
            if (rp->status == KOLO_OK) s->slots[rp->slot].lru = ++s->clock;
        } else if (rp->e) {
            if (rp->status == KOLO_OK && s->cap && cacheable(rp->d.kind) && !auto_named(rp->name) && !st)
                st = cache_insert(s, rp);
            entry_remove(s, rp->e);
        }
        kolo__free(rp->err);
        rp->err = NULL;
    }
    s->nresp = 0;
    return st;
}

/* ---- the stall inspector ----
 * Every member scans its copy of the table a few times per KOLO_STALL_CHECK_TIME and, once per
 * period, logs the names that some members reported more than that long ago, listed under each
 * member that has not (Horovod's format). Only the coordinator turns a stall older than
 * KOLO_STALL_SHUTDOWN_TIME into an error, through its next blob. */

typedef struct stalled {
    const char *name;
    const uint8_t *rep;  /* entries */
    int slot;            /* cached: bits in fix_all */
} stalled;

static bool has_it(const kolo__pset_state *s, const stalled *t, int r)
{
    if (t->rep) return t->rep[r] != 0;
    const uint64_t *bits = kolo__cache_bits_of(s, r);
    return (bits[t->slot / 64] >> (t->slot % 64)) & 1;
}

void kolo__negotiate_stall_check(kolo__pset_state *s)
{
    if (E.stall_disable || E.stall_check <= 0) return;
    double now = kolo__now_s();
    if (now - s->last_stall_check < KOLO_MIN(0.1, E.stall_check / 4)) return;
    s->last_stall_check = now;
    bool partial = false;
    for (int w = 0; w < s->words; w++) partial |= s->partial_prev[w] != 0;
    if (!s->ehead && !partial) return;
    bool coordinator = s->me == 0 && E.stall_shutdown > 0;
    bool warn = now - s->last_stall_warn >= E.stall_check;
    if (!coordinator && !warn) return;
    enum { MAXLIST = 256 };
    stalled list[MAXLIST];
    int nl = 0;
    for (kolo__entry *e = s->ehead; e; e = e->next) {
        double age = now - e->first_seen;
        if (age <= E.stall_check && !(coordinator && age > E.stall_shutdown)) continue;
        if (coordinator && age > E.stall_shutdown && e->stall_fail == KOLO__STALL_NONE) e->stall_fail = KOLO__STALL_DECIDED;
        if (age > E.stall_check && nl < MAXLIST) list[nl++] = (stalled){e->name, e->rep, -1};
    }
    for (int w = 0; w < s->words; w++) {
        uint64_t p = s->partial_prev[w];
        while (p) {
            int i = w * 64 + __builtin_ctzll(p);
            p &= p - 1;
            kolo__slot *sl = &s->slots[i];
            if (!sl->valid || sl->partial_since == 0) continue;
            double age = now - sl->partial_since;
            if (coordinator && age > E.stall_shutdown && sl->stall_fail == KOLO__STALL_NONE) {
                sl->stall_fail = KOLO__STALL_DECIDED;
                s->had_stall = 1;
            }
            if (age > E.stall_check && nl < MAXLIST) list[nl++] = (stalled){sl->name, NULL, i};
        }
    }
    if (!warn || nl == 0) return;
    s->last_stall_warn = now;
    static const char note[] = "\nNote: " NONAME_HINT ".";
    bool noname = false;
    for (int k = 0; k < nl && !noname; k++) noname = auto_named(list[k].name);
    char msg[1900], tag[48] = ""; /* kolo__log prints at most 2 KiB */
    const size_t room = noname ? sizeof(msg) - sizeof(note) : sizeof(msg); /* the note always fits */
    if (s->id) snprintf(tag, sizeof(tag), " (process set %d)", s->id);
    size_t w = (size_t)snprintf(
        msg, sizeof(msg),
        "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
        "waiting for remainder of ranks for more than %g seconds. This may indicate that different ranks are trying "
        "to submit different tensors or that only subset of ranks is submitting tensors, which will cause "
        "deadlock.%s\nMissing ranks:",
        E.stall_check, tag);
    for (int r = 0; r < s->n && w + 64 < room; r++) {
        if (s->joined[r]) continue;
        int shown = 0, more = 0;
        for (int k = 0; k < nl; k++) {
            if (has_it(s, &list[k], r)) continue;
            if (shown == 6 || w + strlen(list[k].name) + 32 >= room) {
                more = 1;
                break;
            }
            if (!shown) w += (size_t)snprintf(msg + w, sizeof(msg) - w, "\n%d: [", wrank(s, r));
            w += (size_t)snprintf(msg + w, sizeof(msg) - w, "%s%s", shown ? ", " : "", list[k].name);
            shown++;
        }
        if (shown) w += (size_t)snprintf(msg + w, sizeof(msg) - w, "%s]", more ? ", ..." : "");
    }
    if (noname && w < room) snprintf(msg + w, sizeof(msg) - w, "%s", note);
    KOLO_WARN("%s", msg);
    atomic_fetch_add_explicit(&E.st.stall_warnings, 1, memory_order_relaxed);
}

/* ---- status (kolo_status_json) ----
 * The names of the set's message table and its cached names that some members have set the bit
 * of (in the last exchange), each with how long ago some member first submitted it, the members
 * (as world ranks) that have and those that have not; the first STATUS_NAMES of them ("more"
 * counts the rest), as the stall inspector finds them. */
enum { STATUS_NAMES = 64 };

static void status_ranks(const kolo__pset_state *s, const stalled *t, bool has, kolo__sbuf *b)
{
    kolo__sb_put(b, "[", 1);
    bool first = true;
    for (int r = 0; r < s->n; r++) {
        if (has_it(s, t, r) != has || (!has && s->joined[r])) continue;
        kolo__sb_printf(b, "%s%d", first ? "" : ",", wrank(s, r));
        first = false;
    }
    kolo__sb_put(b, "]", 1);
}

static void status_name(const kolo__pset_state *s, const stalled *t, int kind, double age, size_t *k,
                        kolo__sbuf *b)
{
    if ((*k)++ >= STATUS_NAMES) return;
    kolo__sb_printf(b, "%s{\"name\":", *k > 1 ? "," : "");
    kolo__sb_jstr(b, t->name);
    kolo__sb_printf(b, ",\"kind\":\"%s\",\"seconds\":%.3f,\"submitted_by\":",
                    kind >= 0 && kind < KOLO__KIND_COUNT ? kolo__kind_lower[kind] : "unknown", age);
    status_ranks(s, t, true, b);
    kolo__sb_printf(b, ",\"missing\":");
    status_ranks(s, t, false, b);
    kolo__sb_put(b, "}", 1);
}

void kolo__negotiate_status(const kolo__pset_state *s, kolo__sbuf *b)
{
    double now = kolo__now_s();
    size_t k = 0;
    kolo__sb_printf(b, "\"pending\":[");
    for (const kolo__entry *e = s->ehead; e; e = e->next) {
        stalled t = {e->name, e->rep, -1};
        status_name(s, &t, e->kind, now - e->first_seen, &k, b);
    }
    for (int w = 0; w < s->words && s->fix_all; w++) {
        uint64_t p = s->partial_prev[w];
        while (p) {
            int i = w * 64 + __builtin_ctzll(p);
            p &= p - 1;
            const kolo__slot *sl = &s->slots[i];
            if (!sl->valid || sl->partial_since == 0) continue;
            stalled t = {sl->name, NULL, i};
            status_name(s, &t, sl->d.kind, now - sl->partial_since, &k, b);
        }
    }
    kolo__sb_printf(b, "],\"more\":%zu,\"held_here\":%zu,\"joined\":[", k > STATUS_NAMES ? k - STATUS_NAMES : 0,
                    s->nlocal);
    bool first = true;
    for (int r = 0; r < s->n; r++)
        if (s->joined[r]) {
            kolo__sb_printf(b, "%s%d", first ? "" : ",", wrank(s, r));
            first = false;
        }
    kolo__sb_put(b, "]", 1);
}
