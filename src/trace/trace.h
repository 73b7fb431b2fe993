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

#endif
