/* perf_ctl.h - lets a profile sample only a benchmark's timed calls.
 *
 * bench/profile.py starts a benchmark under `perf record --delay=-1 --control=fifo:CTL,ACK` (events
 * off at the start) with KOLO_BENCH_PERF_CTL=CTL and KOLO_BENCH_PERF_ACK=ACK in its environment.
 * One rank calls bench_perf_ctl(1) right before its timed calls and bench_perf_ctl(0) right after:
 * the command is written to CTL and perf's answer awaited on ACK, so the samples cover the calls
 * and not the setup (fork, rendezvous, buffers first touched) or the checks. perf answers every
 * command with "ack\n" and a NUL; each call waits (up to 10 s) until every command sent so far has
 * its answer. Waiting for one answer of any age let a late answer to "enable" pass for the answer
 * to "disable", and the benchmark then filled and checked its buffers while perf still sampled
 * (a CI run found one sample in `fill` on a busy machine). Without the variables, or when perf is
 * gone, it does nothing. Header-only: kolo-bench, engine-bench and the MPI peers' benchmark (built
 * with mpicc) include it. */
#ifndef KOLO_BENCH_PERF_CTL_H
#define KOLO_BENCH_PERF_CTL_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void bench_perf_ctl(int enable)
{
    const char *ctl = getenv("KOLO_BENCH_PERF_CTL"), *ack = getenv("KOLO_BENCH_PERF_ACK");
    if (!ctl || !*ctl) return;
    static int cfd = -1, afd = -1, owed = 0; /* owed: commands not answered yet */
    if (cfd < 0) cfd = open(ctl, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (afd < 0 && ack && *ack) afd = open(ack, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (cfd < 0) return;
    const char *cmd = enable ? "enable\n" : "disable\n";
    if (write(cfd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd) || afd < 0) return;
    owed++;
    for (int tries = 0; owed > 0 && tries < 100; tries++) { /* 100 polls of at most 0.1 s */
        struct pollfd p = {.fd = afd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1) continue;
        char buf[64];
        ssize_t got = read(afd, buf, sizeof(buf));
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (got <= 0) { /* perf is gone */
            owed = 0;
            break;
        }
        for (ssize_t i = 0; i < got; i++)
            if (buf[i] == '\n') owed--;
    }
}

#endif
