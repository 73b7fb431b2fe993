/* status.c - kolo_status_json: what this rank is doing and whom it waits for, as one JSON
 * object, for health checks and for finding the rank a stuck job waits on; and
 * KOLO_STATUS_SIGNAL, which has every rank write it to stderr when it gets that signal
 * (kolorun --get-stack-traces sends it at --timeout).
 *
 * The parts come from where they live: the direct collective a user thread runs (kolo.c's
 * enter/leave), the engine's pending tables (asked of the engine thread, engine.c "Status"),
 * and for each channel the ranks a wait that stopped making progress waits on (xfer.c,
 * published at its liveness checks). Reading them takes no lock a collective holds, so the
 * status of a rank stuck in one comes out while it is stuck.
 *
 * The signal: its handler only writes a byte into a pipe (async-signal-safe); a thread of kolo's
 * own, started by kolo_init when the setting is on, reads it and writes the status. The handler
 * replaces the program's own for that signal until kolo_shutdown restores it. */
#include "world.h"

#include "../engine/engine.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#define W kolo__W

/* kolo_status_json against kolo_shutdown: readers hold it shared, shutdown's teardown alone */
static pthread_rwlock_t life = PTHREAD_RWLOCK_INITIALIZER;

void kolo__status_mesh(kolo__sbuf *b, const kolo__mesh *m)
{
    int peers[KOLO__STUCK_MAX], n;
    uint64_t since = kolo__mesh_stuck(m, peers, KOLO__STUCK_MAX, &n), now = kolo__now_ns();
    if (!since) {
        kolo__sb_printf(b, ",\"waiting_for\":null");
        return;
    }
    kolo__sb_printf(b, ",\"waiting_for\":{\"ranks\":[");
    for (int i = 0; i < n && i < KOLO__STUCK_MAX; i++) kolo__sb_printf(b, "%s%d", i ? "," : "", peers[i]);
    kolo__sb_printf(b, "],\"ranks_in_all\":%d,\"seconds_without_progress\":%.3f}", n,
                    now > since ? (double)(now - since) * 1e-9 : 0.0);
}

static void direct_status(kolo__sbuf *b)
{
    kolo__direct_now d;
    if (!kolo__direct_call(&d)) {
        kolo__sb_printf(b, "null");
        return;
    }
    uint64_t now = kolo__now_ns();
    kolo__sb_printf(b, "{\"call\":\"%s\",\"process_set\":%d,\"seconds\":%.3f", d.fn, d.pset,
                    now > d.since ? (double)(now - d.since) * 1e-9 : 0.0);
    /* past its checks: which of this rank's calls on the set it is, and what it was called with,
     * to set beside another rank's when each waits for the other */
    if (d.number) {
        kolo__sb_printf(b, ",\"number\":%llu,\"count\":%zu,\"what\":", (unsigned long long)d.number, d.count);
        kolo__sb_jstr(b, d.what);
    }
    kolo__status_mesh(b, W.mesh[KOLO_CHANNEL_DIRECT]);
    kolo__sb_put(b, "}", 1);
}

/* The whole object into b; the caller holds `life` shared and kolo is initialized. */
static void build(kolo__sbuf *b)
{
    const kolo__peer_info *me = W.peers ? &W.peers[W.info.rank] : NULL;
    kolo__sb_printf(b, "{\"rank\":%d,\"size\":%d,\"local_rank\":%d,\"host\":", W.info.rank, W.info.size,
                    W.local_rank);
    kolo__sb_jstr(b, me ? me->hostname : "");
    kolo__sb_printf(b, ",\"pid\":%d,\"time\":%.3f,\"failed\":", (int)getpid(), (double)kolo__wall_us() * 1e-6);
    const kolo__mesh *failed = NULL;
    for (int c = 0; c < KOLO_NCHANNELS && !failed; c++)
        if (W.mesh[c] && atomic_load_explicit(&W.mesh[c]->failmsg_set, memory_order_acquire)) failed = W.mesh[c];
    if (failed) kolo__sb_jstr(b, failed->failmsg);
    else kolo__sb_printf(b, "null");
    kolo__sb_printf(b, ",\"direct\":");
    direct_status(b);
    kolo__sb_printf(b, ",\"engine\":");
    kolo__engine_status(b);
    kolo__sb_put(b, "}", 1);
}

int kolo_status_json(char *buf, size_t cap)
{
    if (!buf && cap) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_status_json: buf is NULL with cap %zu", cap);
    pthread_rwlock_rdlock(&life);
    if (!W.initialized) {
        pthread_rwlock_unlock(&life);
        return kolo__err(KOLO_ERR_NOT_INITIALIZED, "kolo_status_json: kolo is not initialized");
    }
    kolo__sbuf b = {0};
    build(&b);
    pthread_rwlock_unlock(&life);
    if (b.oom || b.len > (size_t)INT32_MAX) {
        kolo__sb_free(&b);
        return kolo__err(KOLO_ERR_NO_MEMORY, "kolo_status_json: no memory for the status");
    }
    if (cap) {
        size_t n = KOLO_MIN(b.len, cap - 1);
        memcpy(buf, b.p, n);
        buf[n] = '\0';
    }
    int len = (int)b.len;
    kolo__sb_free(&b);
    return len;
}

/* ---- KOLO_STATUS_SIGNAL ---- */

static int sig_no;                  /* the signal, 0 while off */
static pid_t owner;                 /* the process that started the thread (not a forked child) */
static _Atomic int wake_fd = -1;    /* the pipe's write end, for the handler */
static int read_fd = -1;
static _Atomic bool stopping;       /* kolo_shutdown: the thread's next wake-up ends it */
static pthread_t thread;
static struct sigaction old_action;

static void on_signal(int sig)
{
    (void)sig;
    int saved = errno, fd = atomic_load_explicit(&wake_fd, memory_order_relaxed);
    /* a child forked after kolo_init (a data loader's worker) inherits the handler and the pipe,
     * not the thread: its signal would make the parent write its status again */
    if (fd >= 0 && getpid() == owner) {
        char c = 1;
        ssize_t w = write(fd, &c, 1); /* full (a status not written yet): one is enough */
        (void)w;
    }
    errno = saved;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void *status_main(void *arg)
{
    (void)arg;
    char c[64];
    for (;;) {
        ssize_t r = read(read_fd, c, sizeof(c)); /* several signals at once: one status */
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || atomic_load(&stopping)) break;
        kolo__sbuf b = {0};
        kolo__sb_printf(&b, "[kolo %d status] ", W.info.rank);
        pthread_rwlock_rdlock(&life);
        if (W.initialized) build(&b);
        pthread_rwlock_unlock(&life);
        kolo__sb_put(&b, "\n", 1);
        if (!b.oom) write_all(2, b.p, b.len); /* one write: a line no other output cuts */
        kolo__sb_free(&b);
    }
    return NULL;
}

int kolo__status_start(void)
{
    const char *v = kolo__setting_str(KOLO_SET_STATUS_SIGNAL);
    if (!*v) return KOLO_OK;
    if (!strncasecmp(v, "SIG", 3)) v += 3;
    int sig = !strcasecmp(v, "USR1") ? SIGUSR1 : !strcasecmp(v, "USR2") ? SIGUSR2 : 0;
    if (!sig)
        return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_STATUS_SIGNAL='%s' is not one of USR1, USR2",
                         kolo__setting_str(KOLO_SET_STATUS_SIGNAL));
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return kolo__err_sys(errno, "KOLO_STATUS_SIGNAL: pipe");
    fcntl(fds[1], F_SETFL, O_NONBLOCK); /* the handler never blocks */
    read_fd = fds[0];
    /* the thread takes no signals: the program's threads get them, and the handler wakes it */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&thread, NULL, status_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        close(fds[0]);
        close(fds[1]);
        read_fd = -1;
        return kolo__err_sys(err, "KOLO_STATUS_SIGNAL: could not start the status thread");
    }
    owner = getpid();
    atomic_store(&stopping, false);
    atomic_store(&wake_fd, fds[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &old_action);
    sig_no = sig;
    return KOLO_OK;
}

void kolo__status_stop(void)
{
    if (!sig_no) return;
    sigaction(sig_no, &old_action, NULL);
    sig_no = 0;
    /* the write end stays open until the thread is gone: a handler already running on another
     * thread may still write into it (closed, its number could be another file's by then) */
    int fd = atomic_exchange(&wake_fd, -1);
    atomic_store(&stopping, true);
    char c = 0;
    while (write(fd, &c, 1) < 0 && errno == EINTR) {
    }
    pthread_join(thread, NULL);
    close(fd);
    close(read_fd);
    read_fd = -1;
}

void kolo__status_lock_out(bool on)
{
    if (on) pthread_rwlock_wrlock(&life);
    else pthread_rwlock_unlock(&life);
}
