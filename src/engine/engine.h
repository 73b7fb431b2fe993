/* engine.h - the engine's entry points for the core (kolo_init / kolo_shutdown). The rest of
 * the engine's API is public (the "engine" section of kolo.h). */
#ifndef KOLO_ENGINE_H
#define KOLO_ENGINE_H

#include "../common/common.h"

#include <stdint.h>

struct kolo__mesh;

/* Starts the engine thread over kolo__W.mesh[KOLO_CHANNEL_ENGINE]; called at the end of
 * kolo_init, once the meshes and the world group exist. Reads the engine's settings, starts the
 * timeline when KOLO_TIMELINE is set. Returns KOLO_OK, or an error with its message set (then
 * nothing is left running). */
int kolo__engine_start(void);

/* Stops the engine thread (it tells the other ranks it leaves), completes every pending request
 * with KOLO_ERR_SHUT_DOWN, stops the timeline, frees the engine's state. Called at the start of
 * kolo_shutdown, before the meshes are torn down. No-op when the engine is not running. */
void kolo__engine_stop(void);

/* The engine's part of kolo_status_json, appended to b: a JSON object (the sets' pending
 * tables from the engine thread, waited for half a second at most; what that thread does), or
 * null when no engine runs. kolo__status_mesh (core/status.c) appends a mesh's "waiting_for". */
void kolo__engine_status(kolo__sbuf *b);
void kolo__status_mesh(kolo__sbuf *b, const struct kolo__mesh *m);

/* For the benchmark: world-step negotiations that exchanged no descriptions, the total
 * nanoseconds they took (build, exchange, decide), and the part spent in this rank's own work
 * (build and decide, without the exchange, which includes waiting for the other ranks). */
void kolo__engine_negotiation_cost(uint64_t *cycles, uint64_t *ns, uint64_t *local_ns);

/* For the tests: world cycles in a row in which this rank held no requests and no rank held any
 * of a process set that leaves it out (from the third on, this rank's engine waits 4 ms between
 * cycles: engine.c, "Cycle timing"), and world cycles run since kolo_init. */
int kolo__engine_test_quiet_cycles(void);
uint64_t kolo__engine_test_cycles(void);
/* For the tests: since kolo_init, the world exchanges that showed a process set leaving this
 * rank out holding requests (*NEEDED), and the cycles after such an exchange begun because the
 * period ran out (*TIMED), rather than at once for a thread waiting on the set's requests. */
void kolo__engine_test_needed_cycles(uint64_t *needed, uint64_t *timed);
/* Tests: the negotiations this rank's process sets other than the world have run since kolo_init */
uint64_t kolo__engine_test_set_steps(void);
/* Tests: the idle output blocks the engine keeps for its next outputs (request.c), in bytes. */
size_t kolo__engine_test_kept_bytes(void);
/* Tests: the window over which the cap on idle output blocks remembers a peak (request.c; 60 s,
 * which s <= 0 restores). */
void kolo__engine_test_keep_window(double s);

/* Tests: this rank's next description in a negotiation is written garbled, one of these ways
 * (negotiate.c); the members must all fail, naming this rank. */
enum {
    KOLO__GARBLE_NEGATIVE_DIM = 1,
    KOLO__GARBLE_HUGE,           /* a first dimension of 2^46 */
    KOLO__GARBLE_ROOT,           /* a broadcast's root past the last rank */
    KOLO__GARBLE_NEGATIVE_SPLIT, /* an alltoall's */
    KOLO__GARBLE_SPLITS_OVER,    /* an alltoall's splits adding up to more rows than it has */
    KOLO__GARBLE_OP,             /* Adasum (of an integer tensor, or in a reduce-scatter) */
    KOLO__GARBLE_RECORD,         /* a record of no known type */
    KOLO__GARBLE_NAME_LENGTH,    /* a name longer than the message */
    KOLO__GARBLE_COUNT
};
#define KOLO__GARBLE_SPLITS_MAX 64
/* ...and rank 0's engine values, which every rank adopts (engine.c, autotune.c): every rank must
 * fail, naming rank 0. Set before kolo_init for the settings, after it for the cycle time. */
enum {
    KOLO__GARBLE_SETTINGS = 100, /* at the start: a cache capacity of 2^40 */
    KOLO__GARBLE_TUNE_CYCLE,     /* an autotuned cycle's world header: a cycle time of 71 minutes */
};
void kolo__engine_test_garble(int how);

#endif
