/* trace.h - the timeline: engine events recorded into one lock-free ring off the hot path and
 * written by a writer thread as Chrome trace JSON (chrome://tracing, Perfetto). */
#ifndef KOLO_TRACE_H
#define KOLO_TRACE_H

#include "../common/common.h"

/* Opens path for writing (truncates) and starts the writer. rank goes into every event's pid.
 * Returns KOLO_ERR_SYSTEM (message with the path) if the file cannot be created. Safe to call
 * again after kolo__trace_stop. */
int kolo__trace_start(const char *path, int rank, int mark_cycles);
/* Flushes every recorded event, writes the closing bracket, closes the file. No-op when off. */
int kolo__trace_stop(void);
/* True while a timeline is being written (cheap: one relaxed atomic load). */
bool kolo__trace_on(void);
bool kolo__trace_mark_cycles(void);

/* Events. `tensor` names the timeline row (Chrome "tid" row per tensor name), `phase` is the
 * activity ("NEGOTIATE_ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", ...).
 * Begin/end pairs must nest per tensor. `args` is a JSON object body without braces
 * (e.g. "\"dtype\":\"float32\",\"shape\":\"[2, 3]\"") or NULL. All copy their strings.
 * They never block and never fail the caller: when the ring is full the event is dropped and
 * counted (the file then says how many were dropped). Callable from any thread. */
void kolo__trace_begin(const char *tensor, const char *phase, const char *args);
void kolo__trace_end(const char *tensor, const char *phase);
/* An instant mark on a tensor's row (e.g. rank N reported during negotiation). */
void kolo__trace_instant(const char *tensor, const char *name, const char *args);
/* A CYCLE_START mark on its own row when mark_cycles is on. */
void kolo__trace_cycle(void);

/* A sequence: events on many tensors at one instant (the engine's loops over a bucket or a
 * cycle's names), recorded as one slot per KOLO__TRACE_SEQ_MAX events instead of one each, which
 * is what keeps the timeline cheap for the thread that runs the collectives. open takes the
 * instant; begin/end/mark append an event in order (a begin or end of `phase`, or an instant
 * named by a number, e.g. the rank that reported); close records what is left. The events keep
 * their order in the file, and with the individual events recorded between open and close
 * (a name too long to intern travels as one). Lives on the caller's stack; a phase string must
 * stay valid until close. */
enum { KOLO__TRACE_SEQ_MAX = 100 };
typedef struct kolo__trace_seq {
    uint64_t ns;
    const char *phase;
    unsigned n;
    struct {
        uint16_t id, code;
    } e[KOLO__TRACE_SEQ_MAX];
} kolo__trace_seq;
void kolo__trace_seq_open(kolo__trace_seq *q);
void kolo__trace_seq_begin(kolo__trace_seq *q, const char *tensor, const char *phase);
void kolo__trace_seq_end(kolo__trace_seq *q, const char *tensor, const char *phase);
void kolo__trace_seq_mark(kolo__trace_seq *q, const char *tensor, int number);
void kolo__trace_seq_close(kolo__trace_seq *q);

/* An event's "ts" as the writer formats it: ns in microseconds with three decimals, into out
 * (NUL-terminated; 20 + 4 bytes at most, and fmt_u64's copy needs the rest). For tests. */
size_t kolo__trace_format_ts(char out[32], uint64_t ns);

#endif
