/* perf_ctl.h - lets a profile sample only a benchmark's timed calls.
 *
 * bench/profile.py starts a benchmark under `perf record --delay=-1 --control=fifo:CTL,ACK` (events
 * off at the start) with KOLO_BENCH_PERF_CTL=CTL and KOLO_BENCH_PERF_ACK=ACK in its environment.
 * One rank calls bench_perf_ctl(1) right before its timed calls and bench_perf_ctl(0) right after:
 * the command is written to CTL and perf's "ack" awaited on ACK (up to a second), so the samples
 * cover the calls and not the setup (fork, rendezvous, buffers first touched) or the checks.
 * Without the variables, or when perf is gone, it does nothing. Header-only: kolo-bench,
 * engine-bench and the MPI peers' benchmark (built with mpicc) include it. */
#ifndef KOLO_BENCH_PERF_CTL_H
#define KOLO_BENCH_PERF_CTL_H

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void bench_perf_ctl(int enable)
{
    const char *ctl = getenv("KOLO_BENCH_PERF_CTL"), *ack = getenv("KOLO_BENCH_PERF_ACK");
    if (!ctl || !*ctl) return;
    static int cfd = -1, afd = -1;
    if (cfd < 0) cfd = open(ctl, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (afd < 0 && ack && *ack) afd = open(ack, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (cfd < 0) return;
    const char *cmd = enable ? "enable\n" : "disable\n";
    if (write(cfd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd) || afd < 0) return;
    struct pollfd p = {.fd = afd, .events = POLLIN};
    char buf[16];
    if (poll(&p, 1, 1000) == 1 && read(afd, buf, sizeof(buf)) < 0) return;
}

#endif
