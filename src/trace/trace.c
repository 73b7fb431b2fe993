/* trace.c - the timeline: a lock-free event ring, drained by a writer thread to Chrome JSON.
 *
 * Events are written as a Chrome trace that is a valid JSON document after every flush.
 *
 * Recording (any thread, kolo__trace_begin/end/instant/cycle) never blocks, never allocates
 * and never touches the file: it takes a timestamp and copies the strings into one fixed-size
 * slot of a bounded multi-producer, single-consumer ring (Vyukov's bounded queue). The tensor
 * name is interned first (the name table, below), so that the slot holds its id instead: the
 * ring's slots are written by one core and read by the other, and each cache line an event
 * touches crosses between them twice.
 *
 *   - `enq` counts the positions reserved so far; bit 63 (CLOSED) is set while no timeline is
 *     running. Producers reserve position p with a compare-and-swap of enq from p to p + 1,
 *     which they attempt only when enq is not CLOSED and the slot's `seq` equals p (the slot
 *     is free for lap p / SLOTS). If seq is behind p, the ring is full: the event is dropped
 *     and `dropped` is incremented. The CAS is relaxed; the data travels through `seq`.
 *   - The producer that won p fills the slot, then publishes it by storing seq = p + 1 with
 *     release order.
 *   - The writer thread alone owns `deq` (a plain variable). It consumes slot p when an
 *     acquire load of seq reads p + 1, formats it, then frees the slot for the next lap by
 *     storing seq = p + SLOTS with release order (the producer's acquire load of seq pairs
 *     with it before the slot is overwritten).
 *   - Stop sets CLOSED with a fetch-or, which makes every later reservation fail and yields
 *     the final position F; every position below F was reserved and will be published, so
 *     the writer drains exactly up to F (yielding while a producer finishes its copy). Start
 *     clears CLOSED with release order after setting up, so positions continue from F and a
 *     slot's seq always matches its lap. The ring is allocated at the first start and never
 *     freed: a thread that was inside a call when the timeline stopped may still read a
 *     slot's seq, and must never read freed memory. (Such a call may also win the first
 *     position of the next timeline; its event then belongs to that one, which is harmless,
 *     and the writer skips a cycle mark if the new timeline has them off.)
 *   - Producers wake the writer (a semaphore, also never destroyed) every SLOTS/2 positions,
 *     so a burst is drained once the ring is half full; otherwise the writer wakes every
 *     FLUSH_MS. Each wake on a machine whose cores all run ranks takes a core from a rank that
 *     its peers then wait for, so the writer wakes rarely: the same formatting done in a tenth
 *     of the wakes cost measurably less of an engine step (docs/timeline.md, "What recording
 *     costs"), and 50 ms is still far below what a person reading the file would notice. The
 *     ring's 16 384 slots hold about 80 ResNet-50 steps (some 200 slots each), so a period
 *     holds a few hundred; heavier bursts wake the writer at half full.
 *
 * A sequence (K_SEQ, kolo__trace_seq in trace.h) is one slot carrying up to KOLO__TRACE_SEQ_MAX
 * events of one instant: a phase, then (name id, code) pairs, where the code says begin or end
 * of the phase or names an instant by a number. The engine records a bucket's phases and a
 * cycle's negotiation that way: a ResNet-50 step is 2 046 events, of which all but the 161 with
 * args travel in a few dozen slots instead of one each. The writer expands a sequence into one line
 * per event, so the file is the same as if they had been recorded one by one.
 *
 * The file is a JSON array with one event per line: "[", the first event, then each further
 * event on a line that starts with ",", then "]". Each flush is a single pwrite at the end of
 * the events written so far that carries the new event lines followed by "\n]\n"; the next
 * flush overwrites that closing bracket with its first event. So once a flush returns the file
 * on disk is a complete JSON document. A process killed inside a flush can leave a torn last
 * line instead; no raw newline ever occurs inside an event (names are escaped, newlines in
 * args are turned into spaces), so the file is recovered by keeping everything up to the last
 * "}" that is followed by a newline and appending "\n]\n" (docs/timeline.md). */
#include "trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

enum {
    SLOTS = 16384,            /* ring capacity in events (power of two); 512 bytes each */
    WAKE_EVERY = SLOTS / 2,   /* producers wake the writer every this many positions */
    TENSOR_MAX = 128,         /* bytes of a tensor name kept (longer: head...tail) */
    PHASE_MAX = 64,           /* bytes of a phase or mark name kept */
    ARGS_MAX = 296,           /* bytes of args kept (longer: written as a string) */
    FLUSH_MS = 50,            /* the writer's period when nothing wakes it (above) */
    OUT_CAP = 1 << 20,        /* the writer's output buffer (kept from one timeline to the next) */
    OUT_SLACK = 8192,         /* more than one formatted event with its row's metadata */
    ROW_CYCLES = 0,           /* tid of the CYCLE_START row */
    ROW_TIMELINE = 1,         /* tid of the row for the timeline's own marks (drops) */
    ROW_FIRST_TENSOR = 2,
    NAMES = 4096,             /* tensor names interned (power of two); later ones travel in the slot */
    NAME_PROBES = 8,          /* entries a name may be looked for in past its home */
};

#define CLOSED (1ull << 63)
#define TAIL "\n]\n"

enum { K_BEGIN = 1, K_END, K_INSTANT, K_CYCLE, K_SEQ };
enum { F_ARGS_CUT = 1 };

/* One event, 512 bytes. The strings follow one another in data, not NUL-terminated: the phase
 * (nlen bytes), the tensor name unless it is interned (tlen), the args (alen). A typical event
 * (interned name, a phase of up to 40 bytes, no args) fits the slot's first cache line, the
 * only one the producer then writes and the writer reads. */
typedef struct slot {
    _Atomic uint64_t seq;
    uint64_t ns;
    uint8_t kind, flags, tlen, nlen;
    uint16_t alen;
    uint16_t name_id; /* 1 + the tensor name's entry in the name table, or 0: the name is in data */
    char data[PHASE_MAX + TENSOR_MAX + ARGS_MAX];
} slot;
_Static_assert(sizeof(slot) == 512, "a slot is 512 bytes");

/* The name table: tensor names shorter than TENSOR_MAX, interned by the producers so that an
 * event carries a 2-byte id instead of its name. Open addressing; an entry goes from FREE to BUSY
 * (claimed by one producer with a CAS, which then writes it) to READY (published with release
 * order) and never back, so the table needs no lock and readers never see an entry change. A
 * name that finds its entries BUSY or taken travels in the slot instead; the writer maps both
 * forms to the same row by name. Allocated with the ring, never freed. */
enum { NAME_FREE = 0, NAME_BUSY, NAME_READY };
typedef struct name_ent {
    _Atomic uint32_t state;
    uint32_t len;
    uint64_t hash;
    char s[TENSOR_MAX];
} name_ent;

/* Shared with producers. Each hot word on its own cache line. */
static struct {
    _Alignas(64) _Atomic uint64_t enq;
    _Alignas(64) atomic_ullong dropped;
    _Alignas(64) atomic_bool on;
    atomic_bool cycles;
    slot *slots;  /* set once, before the ring first opens (release on enq); never freed */
    name_ent *names; /* likewise */
    sem_t wake;   /* initialised once with the ring; never destroyed */
} ring = {.enq = CLOSED};

/* A tensor row: name -> tid (open addressing; the writer's alone). */
typedef struct row {
    char *name; /* NULL: empty entry */
    size_t len;
    int tid;
} row;

/* The writer's state. Set up by start before the thread exists, read back by stop after it
 * has been joined; in between only the writer thread touches it (stop_at excepted, written
 * before `stopping` is released). */
static struct {
    pthread_t thread;
    atomic_bool stopping;
    uint64_t stop_at;
    uint64_t deq;
    int fd;
    char *path;
    int rank;
    uint64_t t0;
    char *out;
    size_t out_len;
    off_t file_end; /* where the closing bracket starts */
    int err;        /* first write errno */
    bool cycles;    /* this timeline marks cycles */
    bool have_cycles_row, have_timeline_row;
    row *rows;
    size_t rows_cap, rows_n;
    int next_tid;
    int *name_tid; /* NAMES entries: the row of each interned name in this timeline, or 0 */
    char pid_key[40]; /* what every event has between its ph and its tid */
    size_t pid_key_len;
} w;

/* Start and stop, and whether a timeline is running. ring_stale: this is a forked child whose
 * ring may hold slots reserved by threads that did not come along. */
static pthread_mutex_t ctl = PTHREAD_MUTEX_INITIALIZER;
static bool running, ring_ready, ring_stale;

/* ---- Recording (any thread) ---- */

/* Copies s (NULL as "") into dst[cap]; a longer string keeps its head and tail around "...",
 * since tensor names that share a long prefix differ at the end. Returns the length kept. */
static size_t copy_name(char *dst, size_t cap, const char *s)
{
    if (!s) return 0;
    size_t n = strnlen(s, cap);
    if (KOLO_LIKELY(n < cap)) {
        memcpy(dst, s, n);
        return n;
    }
    size_t full = n + strlen(s + n), head = cap / 4, tail = cap - head - 3;
    memcpy(dst, s, head);
    memcpy(dst + head, "...", 3);
    memcpy(dst + head + 3, s + full - tail, tail);
    return cap;
}

/* Eight bytes at a time (names are read by the producer that just passed them, and by the
 * writer's row table). */
static uint64_t hash(const char *s, size_t n)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = n * k, v;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, s + i, 8);
        h = (h ^ v) * k;
        h ^= h >> 29;
    }
    if (i < n) {
        v = 0;
        memcpy(&v, s + i, n - i);
        h = (h ^ v) * k;
    }
    return h ^ (h >> 32);
}

/* The id (1 + entry) of tensor name s[0..n), interning it if there is room; 0 if it must travel
 * in the slot. */
static uint16_t intern(const char *s, size_t n)
{
    uint64_t h = hash(s, n);
    for (unsigned p = 0; p < NAME_PROBES; p++) {
        size_t i = (h + p) & (NAMES - 1);
        name_ent *e = &ring.names[i];
        uint32_t st = atomic_load_explicit(&e->state, memory_order_acquire);
        if (st == NAME_READY) {
            if (e->hash == h && e->len == n && memcmp(e->s, s, n) == 0) return (uint16_t)(i + 1);
            continue;
        }
        if (st == NAME_BUSY) return 0; /* perhaps this very name, being added by another thread */
        uint32_t expect = NAME_FREE;
        if (!atomic_compare_exchange_strong_explicit(&e->state, &expect, NAME_BUSY, memory_order_acquire,
                                                     memory_order_relaxed))
            return 0;
        e->len = (uint32_t)n;
        e->hash = h;
        memcpy(e->s, s, n);
        atomic_store_explicit(&e->state, NAME_READY, memory_order_release);
        return (uint16_t)(i + 1);
    }
    return 0;
}

/* Takes the next position, or returns NULL: no timeline is running, or the ring is full (the
 * event is then counted as dropped). */
static slot *reserve(uint64_t *posp)
{
    uint64_t pos = atomic_load_explicit(&ring.enq, memory_order_acquire);
    for (;;) {
        if (pos & CLOSED) return NULL;
        slot *s = &ring.slots[pos & (SLOTS - 1)];
        uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ring.enq, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *posp = pos;
                return s;
            }
        } else if (dif < 0) {
            atomic_fetch_add_explicit(&ring.dropped, 1, memory_order_relaxed);
            return NULL;
        } else {
            pos = atomic_load_explicit(&ring.enq, memory_order_acquire);
        }
    }
}

static void publish(slot *s, uint64_t pos)
{
    atomic_store_explicit(&s->seq, pos + 1, memory_order_release);
    if (KOLO_UNLIKELY(((pos + 1) & (WAKE_EVERY - 1)) == 0)) sem_post(&ring.wake);
}

/* One event; ns 0 stamps it when its position is taken. */
static void push(int kind, uint64_t ns, const char *tensor, const char *name, const char *args)
{
    if (atomic_load_explicit(&ring.enq, memory_order_acquire) & CLOSED) return; /* acquire: the ring and names */
    /* looked up before a position is taken, so that the writer never waits on it */
    size_t tlen = tensor ? strnlen(tensor, TENSOR_MAX) : 0;
    uint16_t id = tlen && tlen < TENSOR_MAX ? intern(tensor, tlen) : 0;
    uint64_t pos;
    slot *s = reserve(&pos);
    if (!s) return;
    s->ns = ns ? ns : kolo__now_ns();
    s->kind = (uint8_t)kind;
    s->flags = 0;
    s->name_id = id;
    char *d = s->data;
    size_t nlen = copy_name(d, PHASE_MAX, name);
    s->nlen = (uint8_t)nlen;
    d += nlen;
    tlen = id ? 0 : copy_name(d, TENSOR_MAX, tensor);
    s->tlen = (uint8_t)tlen;
    d += tlen;
    size_t alen = args ? strnlen(args, ARGS_MAX) : 0;
    if (alen == ARGS_MAX) s->flags |= F_ARGS_CUT;
    if (alen) memcpy(d, args, alen);
    s->alen = (uint16_t)alen;
    publish(s, pos);
}

bool kolo__trace_on(void) { return atomic_load_explicit(&ring.on, memory_order_relaxed); }
bool kolo__trace_mark_cycles(void) { return atomic_load_explicit(&ring.cycles, memory_order_relaxed); }

void kolo__trace_begin(const char *tensor, const char *phase, const char *args)
{
    push(K_BEGIN, 0, tensor, phase, args);
}

void kolo__trace_end(const char *tensor, const char *phase) { push(K_END, 0, tensor, phase, NULL); }

void kolo__trace_instant(const char *tensor, const char *name, const char *args)
{
    push(K_INSTANT, 0, tensor, name, args);
}

void kolo__trace_cycle(void)
{
    if (!atomic_load_explicit(&ring.cycles, memory_order_relaxed)) return;
    push(K_CYCLE, 0, NULL, "CYCLE_START", NULL);
}

/* ---- Sequences: many events of one instant in one slot ----
 * A sequence slot (K_SEQ) holds its phase (nlen bytes) and then alen / 4 entries of a tensor's
 * name id and a code: SEQ_BEGIN or SEQ_END of the phase, or the number an instant is named by. */
enum { SEQ_BEGIN = 0xFFFF, SEQ_END = 0xFFFE, SEQ_MARK_MAX = 0xFFFD };
_Static_assert(PHASE_MAX + 4 * KOLO__TRACE_SEQ_MAX <= sizeof(((slot *)0)->data), "a sequence fits a slot");

void kolo__trace_seq_open(kolo__trace_seq *q)
{
    q->ns = kolo__now_ns();
    q->phase = NULL;
    q->n = 0;
}

void kolo__trace_seq_close(kolo__trace_seq *q)
{
    if (!q->n) return;
    unsigned n = q->n;
    q->n = 0;
    uint64_t pos;
    slot *s = reserve(&pos);
    if (!s) return;
    s->ns = q->ns;
    s->kind = K_SEQ;
    s->flags = 0;
    s->name_id = 0;
    s->tlen = 0;
    size_t nlen = copy_name(s->data, PHASE_MAX, q->phase);
    s->nlen = (uint8_t)nlen;
    memcpy(s->data + nlen, q->e, (size_t)n * 4);
    s->alen = (uint16_t)(n * 4);
    publish(s, pos);
}

/* Appends one entry; a name that cannot be interned (too long, or the table is full) is recorded
 * as an event of its own, after the entries before it. */
static void seq_add(kolo__trace_seq *q, const char *tensor, const char *phase, unsigned code)
{
    if (atomic_load_explicit(&ring.enq, memory_order_acquire) & CLOSED) return; /* acquire: the ring and names */
    size_t tlen = tensor ? strnlen(tensor, TENSOR_MAX) : 0;
    uint16_t id = tlen && tlen < TENSOR_MAX ? intern(tensor, tlen) : 0;
    bool new_phase = phase && q->phase != phase && (!q->phase || strcmp(q->phase, phase) != 0);
    if (!id || q->n == KOLO__TRACE_SEQ_MAX || (new_phase && q->n)) kolo__trace_seq_close(q);
    if (phase) q->phase = phase;
    if (id) {
        q->e[q->n].id = id;
        q->e[q->n].code = (uint16_t)code;
        q->n++;
    } else if (code == SEQ_BEGIN || code == SEQ_END) {
        push(code == SEQ_BEGIN ? K_BEGIN : K_END, q->ns, tensor, phase, NULL);
    } else {
        char num[12];
        snprintf(num, sizeof(num), "%u", code);
        push(K_INSTANT, q->ns, tensor, num, NULL);
    }
}

void kolo__trace_seq_begin(kolo__trace_seq *q, const char *tensor, const char *phase)
{
    seq_add(q, tensor, phase, SEQ_BEGIN);
}

void kolo__trace_seq_end(kolo__trace_seq *q, const char *tensor, const char *phase)
{
    seq_add(q, tensor, phase, SEQ_END);
}

void kolo__trace_seq_mark(kolo__trace_seq *q, const char *tensor, int number)
{
    if (number >= 0 && number <= SEQ_MARK_MAX) {
        seq_add(q, tensor, NULL, (unsigned)number);
        return;
    }
    char num[12];
    snprintf(num, sizeof(num), "%d", number);
    kolo__trace_seq_close(q);
    push(K_INSTANT, q->ns, tensor, num, NULL);
}

/* ---- Formatting (writer thread) ---- */

static void put(const char *s, size_t n)
{
    memcpy(w.out + w.out_len, s, n);
    w.out_len += n;
}
#define PUTS(lit) put(lit, sizeof(lit) - 1)

/* "00" to "99": numbers are written two digits at a time. */
static const char DIGITS2[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                 "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                 "8081828384858687888990919293949596979899";

/* v in decimal at d; returns the end. The digits are counted first and written in place from
 * the last, two at a time (formed in a scratch buffer and copied, they cost a stalled load:
 * the copy read what small stores had just written). */
static char *fmt_u64(char *d, uint64_t v)
{
    static const uint64_t pow10[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};
    unsigned n = 1;
    while (n < 20 && v >= pow10[n]) n++;
    char *p = d + n;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, DIGITS2 + 2 * r, 2);
    }
    if (v >= 10) memcpy(p - 2, DIGITS2 + 2 * v, 2);
    else p[-1] = (char)('0' + v);
    return d + n;
}

static void put_u64(uint64_t v) { w.out_len = (size_t)(fmt_u64(w.out + w.out_len, v) - w.out); }

static void put_int(int v)
{
    if (v < 0) PUTS("-");
    put_u64(v < 0 ? 0 - (uint64_t)(int64_t)v : (uint64_t)v);
}

/* Microseconds with three decimals, at d; returns the end. */
static char *fmt_ts(char *d, uint64_t ns)
{
    d = fmt_u64(d, ns / 1000);
    unsigned f = (unsigned)(ns % 1000);
    d[0] = '.';
    d[1] = (char)('0' + f / 100);
    memcpy(d + 2, DIGITS2 + 2 * (f % 100), 2);
    return d + 4;
}

size_t kolo__trace_format_ts(char out[32], uint64_t ns)
{
    size_t n = (size_t)(fmt_ts(out, ns) - out); /* at most 20 digits, '.', 3 decimals */
    out[n] = '\0';
    return n;
}

static void put_cb(void *ctx, const char *s, size_t n)
{
    (void)ctx;
    put(s, n);
}

/* A JSON string of the bytes s[0..n) (kolo__json_str). */
static void put_jstr(const char *s, size_t n) { kolo__json_str(put_cb, NULL, s, n); }

/* ---- A validator for the args the engine hands us ----
 * args is the body of a JSON object. A malformed one would make the whole file unreadable,
 * so it is checked (strictly, as Python's json does) and written as a string if bad. */

typedef struct jv {
    const unsigned char *p, *e;
    int depth;
} jv;

static void jv_ws(jv *v)
{
    while (v->p < v->e && (*v->p == ' ' || *v->p == '\t' || *v->p == '\n' || *v->p == '\r')) v->p++;
}

static bool jv_lit(jv *v, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(v->e - v->p) < n || memcmp(v->p, lit, n) != 0) return false;
    v->p += n;
    return true;
}

static bool jv_digits(jv *v)
{
    const unsigned char *b = v->p;
    while (v->p < v->e && *v->p >= '0' && *v->p <= '9') v->p++;
    return v->p > b;
}

static bool jv_number(jv *v)
{
    if (v->p < v->e && *v->p == '-') v->p++;
    if (v->p < v->e && *v->p == '0') v->p++;
    else if (!jv_digits(v)) return false;
    if (v->p < v->e && *v->p == '.') {
        v->p++;
        if (!jv_digits(v)) return false;
    }
    if (v->p < v->e && (*v->p == 'e' || *v->p == 'E')) {
        v->p++;
        if (v->p < v->e && (*v->p == '+' || *v->p == '-')) v->p++;
        if (!jv_digits(v)) return false;
    }
    return true;
}

static bool jv_string(jv *v)
{
    if (v->p >= v->e || *v->p != '"') return false;
    v->p++;
    while (v->p < v->e) {
        unsigned c = *v->p;
        if (c == '"') {
            v->p++;
            return true;
        }
        if (c >= 0x20 && c < 0x80 && c != '\\') { /* plain ASCII, the usual */
            v->p++;
            continue;
        }
        if (c < 0x20) return false;
        if (c == '\\') {
            if (++v->p >= v->e) return false;
            c = *v->p++;
            if (c == 'u') {
                for (int i = 0; i < 4; i++, v->p++)
                    if (v->p >= v->e || !strchr("0123456789abcdefABCDEF", *v->p) || !*v->p) return false;
            } else if (!c || !strchr("\"\\/bfnrt", (int)c)) {
                return false;
            }
            continue;
        }
        size_t k = kolo__utf8_len(v->p, (size_t)(v->e - v->p));
        if (!k) return false;
        v->p += k;
    }
    return false;
}

static bool jv_value(jv *v);

/* The members of an object or the elements of an array, up to and including `close`. */
static bool jv_items(jv *v, unsigned char close, bool members)
{
    jv_ws(v);
    if (v->p < v->e && *v->p == close) {
        v->p++;
        return true;
    }
    for (;;) {
        if (members) {
            jv_ws(v);
            if (!jv_string(v)) return false;
            jv_ws(v);
            if (v->p >= v->e || *v->p++ != ':') return false;
        }
        if (!jv_value(v)) return false;
        jv_ws(v);
        if (v->p >= v->e) return false;
        unsigned char c = *v->p++;
        if (c == close) return true;
        if (c != ',') return false;
    }
}

static bool jv_value(jv *v)
{
    bool ok;
    jv_ws(v);
    if (v->p >= v->e) return false;
    switch (*v->p) {
    case '"': return jv_string(v);
    case '{':
    case '[':
        if (++v->depth > 32) return false;
        v->p++;
        ok = jv_items(v, v->p[-1] == '{' ? '}' : ']', v->p[-1] == '{');
        v->depth--;
        return ok;
    case 't': return jv_lit(v, "true");
    case 'f': return jv_lit(v, "false");
    case 'n': return jv_lit(v, "null");
    default: return jv_number(v);
    }
}

/* True if a[0..n) is a valid object body ("" included). */
static bool args_valid(const char *a, size_t n)
{
    jv v = {(const unsigned char *)a, (const unsigned char *)a + n, 0};
    jv_ws(&v);
    if (v.p == v.e) return true;
    for (;;) {
        if (!jv_string(&v)) return false;
        jv_ws(&v);
        if (v.p >= v.e || *v.p++ != ':') return false;
        if (!jv_value(&v)) return false;
        jv_ws(&v);
        if (v.p == v.e) return true;
        if (*v.p++ != ',') return false;
        jv_ws(&v);
    }
}

static void put_args(const slot *s)
{
    size_t alen = s->alen;
    const char *a = s->data + s->nlen + s->tlen;
    if (!alen) return;
    if (s->flags & F_ARGS_CUT) {
        PUTS(",\"args\":{\"truncated_args\":");
        put_jstr(a, alen);
        PUTS("}");
    } else if (!args_valid(a, alen)) {
        PUTS(",\"args\":{\"invalid_args\":");
        put_jstr(a, alen);
        PUTS("}");
    } else {
        PUTS(",\"args\":{");
        /* newlines can only be whitespace here; no raw newline may occur inside an event */
        char *d = w.out + w.out_len;
        memcpy(d, a, alen);
        for (size_t i = 0; i < alen; i++)
            if (d[i] == '\n' || d[i] == '\r') d[i] = ' ';
        w.out_len += alen;
        PUTS("}");
    }
}

/* "thread_name" and "thread_sort_index" metadata for a new row. */
static void put_row(int tid, const char *name, size_t len)
{
    PUTS("\n,{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
    put_int(w.rank);
    PUTS(",\"tid\":");
    put_int(tid);
    PUTS(",\"args\":{\"name\":");
    put_jstr(name, len);
    PUTS("}}\n,{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":");
    put_int(w.rank);
    PUTS(",\"tid\":");
    put_int(tid);
    PUTS(",\"args\":{\"sort_index\":");
    put_int(tid);
    PUTS("}}");
}

static bool rows_grow(void)
{
    size_t cap = w.rows_cap ? w.rows_cap * 2 : 256;
    row *r = kolo__calloc(cap, sizeof(row));
    if (!r) return false;
    for (size_t i = 0; i < w.rows_cap; i++) {
        if (!w.rows[i].name) continue;
        size_t j = hash(w.rows[i].name, w.rows[i].len) & (cap - 1);
        while (r[j].name) j = (j + 1) & (cap - 1);
        r[j] = w.rows[i];
    }
    kolo__free(w.rows);
    w.rows = r;
    w.rows_cap = cap;
    return true;
}

/* The tid of a tensor's row, writing the row's metadata the first time. If memory runs out
 * the event goes to the timeline's own row rather than being lost. */
static int row_of(const char *name, size_t len)
{
    if ((w.rows_n + 1) * 2 > w.rows_cap && !rows_grow()) return ROW_TIMELINE;
    size_t j = hash(name, len) & (w.rows_cap - 1);
    for (; w.rows[j].name; j = (j + 1) & (w.rows_cap - 1))
        if (w.rows[j].len == len && memcmp(w.rows[j].name, name, len) == 0) return w.rows[j].tid;
    char *copy = kolo__malloc(len + 1);
    if (!copy) return ROW_TIMELINE;
    memcpy(copy, name, len);
    copy[len] = '\0';
    w.rows[j] = (row){copy, len, w.next_tid++};
    w.rows_n++;
    put_row(w.rows[j].tid, name, len);
    return w.rows[j].tid;
}

static void rows_free(void)
{
    for (size_t i = 0; i < w.rows_cap; i++) kolo__free(w.rows[i].name);
    kolo__free(w.rows);
    w.rows = NULL;
    w.rows_cap = w.rows_n = 0;
}

static int special_row(int tid)
{
    bool *have = tid == ROW_CYCLES ? &w.have_cycles_row : &w.have_timeline_row;
    if (!*have) {
        if (tid == ROW_CYCLES) put_row(tid, "cycles", 6);
        else put_row(tid, "timeline", 8);
        *have = true;
    }
    return tid;
}

/* The start of an event line, up to and including its "name": key. */
static void put_head_keys(char ph, int tid, uint64_t ns)
{
    char *d = w.out + w.out_len;
    memcpy(d, "\n,{\"ph\":\"", 9);
    d[9] = ph;
    memcpy(d + 10, w.pid_key, sizeof(w.pid_key)); /* ","pid":<rank>,"tid": and slack */
    d = fmt_u64(d + 10 + w.pid_key_len, (unsigned)tid);
    memcpy(d, ",\"ts\":", 6);
    d = fmt_ts(d + 6, ns);
    memcpy(d, ",\"name\":", 8);
    w.out_len = (size_t)(d + 8 - w.out);
}

/* The start of an event line up to and including its name. */
static void put_head(char ph, int tid, uint64_t ns, const char *name, size_t nlen)
{
    put_head_keys(ph, tid, ns);
    put_jstr(name, nlen);
}

/* The row of interned name id. */
static int id_row(uint16_t id)
{
    int *tid = &w.name_tid[id - 1];
    if (!*tid) {
        const name_ent *e = &ring.names[id - 1]; /* READY before the slot was published */
        *tid = row_of(e->s, e->len);
    }
    return *tid;
}

/* The row of an event's tensor. */
static int tensor_row(const slot *s)
{
    return s->name_id ? id_row(s->name_id) : row_of(s->data + s->nlen, s->tlen);
}

static void flush_out(void);

/* A sequence's events, one line each; the output is flushed between them when it fills. Their
 * phase is escaped once, at its first use. */
static void format_seq(const slot *s, uint64_t ns)
{
    const unsigned char *e = (const unsigned char *)s->data + s->nlen;
    char phase[PHASE_MAX * 6 + 2]; /* the phase as a JSON string: at most 6 bytes per byte */
    size_t plen = 0;
    for (size_t i = 0; i + 4 <= s->alen; i += 4) {
        uint16_t id, code;
        memcpy(&id, e + i, 2);
        memcpy(&code, e + i + 2, 2);
        if (!id || id > NAMES) continue;
        int tid = id_row(id);
        if (code == SEQ_BEGIN || code == SEQ_END) {
            put_head_keys(code == SEQ_BEGIN ? 'B' : 'E', tid, ns);
            if (plen) {
                put(phase, plen);
            } else {
                size_t at = w.out_len;
                put_jstr(s->data, s->nlen);
                plen = w.out_len - at;
                memcpy(phase, w.out + at, plen);
            }
        } else {
            put_head_keys('i', tid, ns);
            char *d = w.out + w.out_len;
            d[0] = '"';
            d = fmt_u64(d + 1, code);
            memcpy(d, "\",\"s\":\"t\"", 9);
            w.out_len = (size_t)(d + 9 - w.out);
        }
        PUTS("}");
        if (w.out_len > OUT_CAP - OUT_SLACK) flush_out();
    }
}

static void format(const slot *s)
{
    /* a call that began while an earlier timeline with cycle marks was on */
    if (s->kind == K_CYCLE && !w.cycles) return;
    uint64_t ns = s->ns > w.t0 ? s->ns - w.t0 : 0;
    if (s->kind == K_SEQ) {
        format_seq(s, ns);
        return;
    }
    int tid = s->kind == K_CYCLE ? special_row(ROW_CYCLES) : tensor_row(s);
    switch (s->kind) {
    case K_BEGIN:
        put_head('B', tid, ns, s->data, s->nlen);
        put_args(s);
        break;
    case K_END: put_head('E', tid, ns, s->data, s->nlen); break;
    default:
        put_head('i', tid, ns, s->data, s->nlen);
        PUTS(",\"s\":\"t\"");
        put_args(s);
        break;
    }
    PUTS("}");
}

/* An instant on the timeline's row saying how many events the full ring cost. */
static void note_drops(void)
{
    unsigned long long n = atomic_exchange_explicit(&ring.dropped, 0, memory_order_relaxed);
    if (!n) return;
    char name[64];
    int len = snprintf(name, sizeof(name), "DROPPED %llu events", n);
    uint64_t now = kolo__now_ns();
    put_head('i', special_row(ROW_TIMELINE), now > w.t0 ? now - w.t0 : 0, name, (size_t)len);
    PUTS(",\"s\":\"t\",\"args\":{\"dropped\":");
    put_u64(n);
    PUTS("}}");
}

/* Writes the buffered event lines and the closing bracket in one pwrite at the end of the
 * events so far (see the top of the file). After the first write error the timeline only
 * drains: stop reports the error. */
static void flush_out(void)
{
    if (!w.out_len) return;
    size_t n = w.out_len, body = n;
    memcpy(w.out + n, TAIL, 3);
    n += 3;
    w.out_len = 0;
    if (w.err) return;
    for (size_t done = 0; done < n;) {
        ssize_t r = pwrite(w.fd, w.out + done, n - done, w.file_end + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            w.err = r < 0 ? errno : EIO;
            return;
        }
        done += (size_t)r;
    }
    w.file_end += (off_t)body;
}

/* Formats every published event; when stopping, waits for the ones reserved before CLOSED. */
static void drain(bool stopping)
{
    while (!stopping || w.deq < w.stop_at) {
        slot *s = &ring.slots[w.deq & (SLOTS - 1)];
        if (atomic_load_explicit(&s->seq, memory_order_acquire) != w.deq + 1) {
            if (!stopping) return;
            sched_yield(); /* a producer won this slot and is still copying into it */
            continue;
        }
        format(s);
        atomic_store_explicit(&s->seq, w.deq + SLOTS, memory_order_release);
        w.deq++;
        if (w.out_len > OUT_CAP - OUT_SLACK) flush_out();
    }
}

static void nap(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += FLUSH_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (sem_clockwait(&ring.wake, CLOCK_MONOTONIC, &ts) != 0 && errno == EINTR) {
    }
    while (sem_trywait(&ring.wake) == 0) {
    }
}

static void *writer_main(void *arg)
{
    (void)arg;
    bool warned = false;
    for (;;) {
        bool stopping = atomic_load_explicit(&w.stopping, memory_order_acquire);
        drain(stopping);
        note_drops();
        flush_out();
        if (w.err && !warned) {
            KOLO_WARN("timeline: cannot write '%s': %s; no more events will be written", w.path,
                      strerror(w.err));
            warned = true;
        }
        if (stopping) return NULL;
        nap();
    }
}

/* ---- Start and stop ---- */

/* Every slot free for the lap of the current position. */
static void ring_reset(slot *s)
{
    uint64_t base = atomic_load(&ring.enq) & ~CLOSED;
    for (uint64_t i = 0; i < SLOTS; i++)
        atomic_store_explicit(&s[(base + i) & (SLOTS - 1)].seq, base + i, memory_order_relaxed);
}

static void fork_prepare(void) { pthread_mutex_lock(&ctl); }
static void fork_parent(void) { pthread_mutex_unlock(&ctl); }

/* A forked child has no writer thread, shares the parent's file, and may have slots reserved by
 * threads that did not come along: its timeline is off (stop is a no-op), the file is left to
 * the parent, and the ring is reset if the child starts a timeline of its own. */
static void fork_child(void)
{
    pthread_mutex_init(&ctl, NULL);
    atomic_store(&ring.on, false);
    atomic_store(&ring.cycles, false);
    atomic_fetch_or(&ring.enq, CLOSED);
    ring_stale = true;
    /* an entry claimed by a thread that did not come along would stay BUSY for good */
    for (size_t i = 0; ring.names && i < NAMES; i++) {
        uint32_t busy = NAME_BUSY;
        atomic_compare_exchange_strong(&ring.names[i].state, &busy, NAME_FREE);
    }
    if (!running) return;
    close(w.fd);
    rows_free();
    kolo__free(w.path);
    w.path = NULL;
    running = false;
}

static int ring_init(void)
{
    slot *s = kolo__malloc_aligned(sizeof(slot) * SLOTS);
    name_ent *names = kolo__calloc(NAMES, sizeof(name_ent));
    int *name_tid = kolo__calloc(NAMES, sizeof(int));
    int rc = KOLO_OK, e;
    if (!s || !names || !name_tid) {
        rc = kolo__err(KOLO_ERR_NO_MEMORY, "timeline: no memory for the event ring");
        goto fail;
    }
    ring_reset(s);
    if (sem_init(&ring.wake, 0, 0) != 0) {
        rc = kolo__err_sys(errno, "timeline: sem_init");
        goto fail;
    }
    if ((e = pthread_atfork(fork_prepare, fork_parent, fork_child)) != 0) {
        sem_destroy(&ring.wake);
        rc = kolo__err_sys(e, "timeline: pthread_atfork");
        goto fail;
    }
    ring.slots = s;
    ring.names = names;
    w.name_tid = name_tid;
    ring_ready = true;
    return KOLO_OK;
fail:
    kolo__free(s);
    kolo__free(names);
    kolo__free(name_tid);
    return rc;
}

/* The first two lines: the process row named after the rank. */
static void put_header(void)
{
    PUTS("[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
    put_int(w.rank);
    PUTS(",\"args\":{\"name\":\"rank ");
    put_int(w.rank);
    PUTS("\",\"start_time_since_epoch_in_micros\":");
    put_u64(kolo__wall_us());
    PUTS("}}\n,{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":");
    put_int(w.rank);
    PUTS(",\"args\":{\"sort_index\":");
    put_int(w.rank);
    PUTS("}}");
}

int kolo__trace_start(const char *path, int rank, int mark_cycles)
{
    if (!path || !*path) return kolo__err(KOLO_ERR_INVALID_ARG, "timeline: no file path given");
    int rc = KOLO_OK;
    pthread_mutex_lock(&ctl);
    if (running) {
        rc = kolo__err(KOLO_ERR_INVALID_ARG, "a timeline is already being written to '%s'", w.path);
        goto out;
    }
    if (!ring_ready && (rc = ring_init()) != KOLO_OK) goto out;
    if (ring_stale) {
        ring_reset(ring.slots);
        ring_stale = false;
    }
    w.path = kolo__strdup(path);
    if (!w.out) w.out = kolo__malloc(OUT_CAP + 3); /* kept for the next timeline */
    if (!w.path || !w.out) {
        rc = kolo__err(KOLO_ERR_NO_MEMORY, "timeline: no memory for the writer");
        goto err_free;
    }
    w.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        rc = kolo__err_sys(errno, "cannot create the timeline file '%s'", path);
        goto err_free;
    }
    w.rank = rank;
    w.pid_key_len = (size_t)snprintf(w.pid_key, sizeof(w.pid_key), "\",\"pid\":%d,\"tid\":", rank);
    w.cycles = mark_cycles != 0;
    w.t0 = kolo__now_ns();
    w.out_len = 0;
    w.file_end = 0;
    w.err = 0;
    w.have_cycles_row = w.have_timeline_row = false;
    w.next_tid = ROW_FIRST_TENSOR;
    memset(w.name_tid, 0, NAMES * sizeof(int)); /* rows are per file */
    w.deq = atomic_load(&ring.enq) & ~CLOSED;
    put_header();
    flush_out();
    if (w.err) {
        rc = kolo__err_sys(w.err, "cannot write the timeline file '%s'", path);
        goto err_close;
    }
    atomic_store(&w.stopping, false);
    int e = pthread_create(&w.thread, NULL, writer_main, NULL);
    if (e) {
        rc = kolo__err_sys(e, "timeline: cannot start the writer thread");
        goto err_close;
    }
    pthread_setname_np(w.thread, "kolo-timeline");
    atomic_store(&ring.dropped, 0);
    atomic_store(&ring.cycles, mark_cycles != 0);
    atomic_fetch_and_explicit(&ring.enq, ~CLOSED, memory_order_release);
    atomic_store(&ring.on, true);
    running = true;
    goto out;

err_close:
    close(w.fd);
err_free:
    kolo__free(w.path);
    w.path = NULL;
out:
    pthread_mutex_unlock(&ctl);
    return rc;
}

int kolo__trace_stop(void)
{
    int rc = KOLO_OK;
    pthread_mutex_lock(&ctl);
    if (!running) goto out;
    atomic_store(&ring.on, false);
    atomic_store(&ring.cycles, false);
    w.stop_at = atomic_fetch_or_explicit(&ring.enq, CLOSED, memory_order_acq_rel) & ~CLOSED;
    atomic_store_explicit(&w.stopping, true, memory_order_release);
    sem_post(&ring.wake);
    pthread_join(w.thread, NULL);
    if (close(w.fd) != 0 && !w.err) w.err = errno;
    if (w.err) rc = kolo__err_sys(w.err, "cannot write the timeline file '%s'", w.path);
    rows_free();
    kolo__free(w.path);
    w.path = NULL;
    running = false;
out:
    pthread_mutex_unlock(&ctl);
    return rc;
}
