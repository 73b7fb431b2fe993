/* timeline-bench.c - what the timeline costs per event, on both of its threads.
 *
 *   timeline-bench [-n STEPS] [-p PAUSE_MS] [-t PATH] [-r REPS]
 *
 * Records, STEPS times with PAUSE_MS between them (default 40 steps, 20 ms), the events the
 * engine records for one ResNet-50 step (161 gradients: negotiation begin and end with a mark
 * per rank of two, the op's begin with args and end, QUEUE, the transfer, and for 109 of them
 * the fusion buffer's copy in and out; 2 046 events, in the engine's order and the engine's
 * way: the op's begins one by one, the rest in sequences of one instant each), into PATH (default
 * /tmp/timeline-bench.json, removed before each start), and prints per event:
 *   - recording: the wall time of the recording calls on this thread, divided by the events;
 *   - writer: the process's CPU time less this thread's, from start to the end of stop (the
 *     writer thread formatting and writing, and the kernel's work for its writes).
 * REPS launches' worth (default 5) are run one after the other and each printed, then the
 * medians. The writer and the recording thread run at once on different cores as in a job.
 */
#include "../src/trace/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { TENSORS = 161, COPIED = 109 };

static double clock_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char names[TENSORS][80];

/* One step's events as the engine records them (a cached negotiation, one bucket); returns how
 * many. Most go in sequences (src/trace/trace.h): one slot for up to 100 events of one instant. */
static long step(const char *args)
{
    kolo__trace_seq q;
    kolo__trace_seq_open(&q); /* the cycle's negotiation */
    for (int i = 0; i < TENSORS; i++) {
        kolo__trace_seq_begin(&q, names[i], "NEGOTIATE_ALLREDUCE");
        kolo__trace_seq_mark(&q, names[i], 0);
        kolo__trace_seq_mark(&q, names[i], 1);
        kolo__trace_seq_end(&q, names[i], "NEGOTIATE_ALLREDUCE");
    }
    kolo__trace_seq_close(&q);
    for (int i = 0; i < TENSORS; i++) kolo__trace_begin(names[i], "ALLREDUCE", args);
    static const struct {
        const char *phase;
        int begin, copied;
    } bucket[] = {{"QUEUE", 1, 0},
                  {"QUEUE", 0, 0},
                  {"MEMCPY_IN_FUSION_BUFFER", 1, 1},
                  {"MEMCPY_IN_FUSION_BUFFER", 0, 1},
                  {"KOLO_ALLREDUCE", 1, 0},
                  {"KOLO_ALLREDUCE", 0, 0},
                  {"MEMCPY_OUT_FUSION_BUFFER", 1, 1},
                  {"MEMCPY_OUT_FUSION_BUFFER", 0, 1},
                  {"ALLREDUCE", 0, 0}};
    for (size_t b = 0; b < sizeof(bucket) / sizeof(bucket[0]); b++) {
        kolo__trace_seq_open(&q);
        for (int i = 0; i < (bucket[b].copied ? COPIED : TENSORS); i++) {
            if (bucket[b].begin) kolo__trace_seq_begin(&q, names[i], bucket[b].phase);
            else kolo__trace_seq_end(&q, names[i], bucket[b].phase);
        }
        kolo__trace_seq_close(&q);
    }
    return 10 * TENSORS + 4 * COPIED;
}

int main(int argc, char **argv)
{
    int steps = 40, pause_ms = 20, reps = 5;
    const char *path = "/tmp/timeline-bench.json";
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-n") && v) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && v) pause_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && v) path = argv[++i];
        else if (!strcmp(argv[i], "-r") && v) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: timeline-bench [-n STEPS] [-p PAUSE_MS] [-t PATH] [-r REPS]\n");
            return 2;
        }
    }
    if (steps < 1 || reps < 1 || pause_ms < 0) {
        fprintf(stderr, "timeline-bench: -n and -r must be at least 1, -p at least 0\n");
        return 2;
    }
    static const char *const parts[] = {"conv1", "conv2", "conv3", "bn1", "bn2", "bn3", "downsample.0", "downsample.1"};
    for (int i = 0; i < TENSORS; i++)
        snprintf(names[i], sizeof(names[i]), "DistributedOptimizer.Allreduce.layer%d.%d.%s.weight", i % 4 + 1,
                 i % 6, parts[i % 8]);
    const char *args = "\"dtype\":\"float32\",\"shape\":\"[256, 256, 3, 3]\"";
    double *rec = calloc((size_t)reps, sizeof(double)), *wr = calloc((size_t)reps, sizeof(double));
    if (!rec || !wr) return 1;
    printf("# timeline-bench: %d steps of the engine's events for 161 gradients, %d ms apart\n", steps, pause_ms);
    for (int r = 0; r < reps; r++) {
        unlink(path);
        double c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), m0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (kolo__trace_start(path, 0, 0) != KOLO_OK) {
            fprintf(stderr, "timeline-bench: %s\n", kolo_last_error());
            return 1;
        }
        double recording = 0;
        long events = 0;
        for (int s = 0; s < steps; s++) {
            double t0 = clock_ns(CLOCK_MONOTONIC);
            events += step(args);
            recording += clock_ns(CLOCK_MONOTONIC) - t0;
            struct timespec ts = {pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        double m1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        if (kolo__trace_stop() != KOLO_OK) {
            fprintf(stderr, "timeline-bench: %s\n", kolo_last_error());
            return 1;
        }
        double c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        rec[r] = recording / (double)events;
        wr[r] = ((c1 - c0) - (m1 - m0)) / (double)events;
        printf("%-8d recording %6.1f ns/event   writer %6.1f ns/event   (%ld events)\n", r + 1, rec[r], wr[r], events);
    }
    qsort(rec, (size_t)reps, sizeof(double), cmp_double);
    qsort(wr, (size_t)reps, sizeof(double), cmp_double);
    printf("median   recording %6.1f ns/event   writer %6.1f ns/event\n", rec[reps / 2], wr[reps / 2]);
    unlink(path);
    free(rec);
    free(wr);
    return 0;
}
