/* local_job.h - `-np N` for the benchmark tools when no launcher started them: a rendezvous store in a
 * child process, N forked ranks, the exit status of the job. Included by kolo-bench.c and
 * engine-bench.c (they link libkolo.a, so the store's private functions are available). */
#ifndef KOLO_BENCH_LOCAL_JOB_H
#define KOLO_BENCH_LOCAL_JOB_H

#include "kolo.h"

#include "../src/boot/auth.h"
#include "../src/boot/store.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The CPU rank r of np is bound to when `bind` asks for it: the r-th CPU this process may run
 * on, or with more ranks than CPUs the CPUs in blocks of neighbouring ranks (4 on 2: 0 and 1 on
 * the first), or -1 (no binding). Forked ranks start on their parent's CPU and the scheduler
 * spreads them only after some milliseconds; a short benchmark of small messages measured
 * during that time shows two ranks taking turns on one core (each wait spins out KOLO_SPIN_US
 * before yielding, ~56 us per operation instead of ~0.3). mpirun binds to cores by default for
 * the same reason, so the benchmarks do too. With more ranks than CPUs mpirun does not bind,
 * but unbound 4 ranks on 2 CPUs sat three on one for a few hundred milliseconds at a time, Open
 * MPI's as well as kolo's; kolorun binds them in blocks by default (tools/kolorun/bind.c), and
 * so do the benchmarks. */
static int bench_rank_cpu(int bind, int np, int r)
{
    cpu_set_t set;
    if (!bind || sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < 1) return -1;
    if (np > CPU_COUNT(&set)) r = (int)((long)r * CPU_COUNT(&set) / np);
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && k++ == r) return c;
    return -1;
}

/* Runs rank_fn(arg) in np forked ranks that form one job named after `tool`; returns the first
 * non-zero exit code (128 + signal for a killed rank), or 0. With `bind`, each rank is bound to
 * one CPU (bench_rank_cpu). The store runs in its own child so this process stays
 * single-threaded and forks its ranks safely (a forked rank must not inherit a lock held by a
 * server thread). When a rank fails, the others are sent SIGTERM. */
static int bench_local_job(int np, int bind, const char *tool, int (*rank_fn)(void *), void *arg)
{
    char secret[80], buf[96];
    if (np < 1 || np > 256) return 2;
    if (kolo__secret_make(secret, sizeof(secret)) != KOLO_OK) {
        fprintf(stderr, "%s: %s\n", tool, kolo_last_error());
        return 1;
    }
    int p[2], port = -1;
    if (pipe(p) != 0) return 1;
    fflush(stdout);
    pid_t store = fork();
    if (store == 0) {
        close(p[0]);
        kolo__store_server *srv = NULL;
        if (kolo__store_server_start(&srv, "127.0.0.1", 0, secret, strlen(secret)) == KOLO_OK)
            port = kolo__store_server_port(srv);
        else
            fprintf(stderr, "%s: cannot start the rendezvous store: %s\n", tool, kolo_last_error());
        if (write(p[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) _exit(1);
        for (;;) pause();
    }
    close(p[1]);
    if (store < 0 || read(p[0], &port, sizeof(port)) != (ssize_t)sizeof(port) || port <= 0) {
        if (store > 0) kill(store, SIGKILL);
        return 1;
    }
    close(p[0]);
    snprintf(buf, sizeof(buf), "127.0.0.1:%d", port);
    setenv("KOLO_RENDEZVOUS", buf, 1);
    setenv("KOLO_SECRET", secret, 1);
    snprintf(buf, sizeof(buf), "%s-%d", tool, (int)getpid());
    setenv("KOLO_JOB_ID", buf, 1);
    snprintf(buf, sizeof(buf), "%d", np);
    setenv("KOLO_SIZE", buf, 1);
    pid_t pids[256];
    for (int r = 0; r < np; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int cpu = bench_rank_cpu(bind, np, r);
            if (cpu >= 0) {
                cpu_set_t one;
                CPU_ZERO(&one);
                CPU_SET(cpu, &one);
                (void)sched_setaffinity(0, sizeof(one), &one);
            }
            snprintf(buf, sizeof(buf), "%d", r);
            setenv("KOLO_RANK", buf, 1);
            _exit(rank_fn(arg));
        }
    }
    int rc = 0;
    for (int left = np; left > 0; left--) {
        int s;
        pid_t w = wait(&s);
        if (w == store) {
            left++;
            continue;
        }
        int code = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
        if (code && !rc) {
            rc = code;
            for (int q = 0; q < np; q++) kill(pids[q], SIGTERM);
        }
    }
    kill(store, SIGKILL);
    waitpid(store, NULL, 0);
    return rc;
}

#endif
