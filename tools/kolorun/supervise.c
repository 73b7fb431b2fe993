/* supervise.c - the job's one poll() loop: output, stdin, signals, worker deaths, the gang-kill and the summary.
 *
 * States: RUNNING until a worker fails (exits non-zero or dies of a signal) or kolorun gets
 * SIGINT/SIGTERM/SIGHUP/SIGQUIT. A failure first waits SETTLE_S (SETTLE_REMOTE_S with remote
 * hosts), so that workers failing together (one bad input on every rank) are all counted as
 * failures and the root cause (below) is chosen among them; then every other worker's process
 * group gets SIGTERM (TERMINATING) and, after --grace-seconds, SIGKILL. A second SIGINT
 * SIGKILLs at once. When every worker has been reaped, whatever is left in their process groups
 * is SIGKILLed and the output pipes are drained (at most DRAIN_S, in case a process escaped its
 * group holding a pipe).
 *
 * A remote worker that has started is terminated by closing its ssh's stdin, the connection's
 * lifeline: the wrapper on its host SIGTERMs the command, SIGKILLs it after the same grace
 * period and exits with its status, so ssh ends only once the remote worker is gone and the
 * job does not end with workers still alive over there (signalling ssh would end ssh at once).
 * Its ssh is SIGKILLed REMOTE_EXTRA_S after the grace period, for a host that does not answer.
 *
 * The root cause among the failures of the SETTLING window: a worker killed by a signal (a
 * crash, the OOM killer, a kill -9) before one that exited with an error code, because when one
 * kolo rank dies the others' collectives fail and they exit with errors of their own, often
 * before the death is reported (a remote one comes through ssh); then one whose last stderr
 * lines do not blame another rank (kolo's "lost rank 1", "rank 1 ... aborted the job because",
 * "left the job": a rank that raised, and the others' errors saying so, end within the window);
 * then the lowest rank (Open MPI's rule: the same bad input on every rank). A remote worker's
 * death by signal N arrives as
 * the wrapper's exit code 128+N (sh cannot re-raise it across ssh).
 *
 * --timeout: a job still RUNNING that long after its launch is stopped like a failed one
 * (after --get-stack-traces' stacks, stacks.c), and exits with 124.
 *
 * Exit code: the root failure's (exit code, or 128+signal), else 128+the signal kolorun got,
 * else the launch error, else 124 after --timeout, else 0. */
#include "kolorun.h"

#include "../../src/net/transport.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SETTLE_S 0.25   /* failures this close together are counted together (one bad input on every rank) */
#define SETTLE_REMOTE_S 0.5   /* with remote hosts: their ends arrive through the wrapper, sshd and ssh */
#define DRAIN_S 1.0
#define REMOTE_EXTRA_S 2.0

enum phase { RUNNING, SETTLING, TERMINATING, KILLED };

typedef struct {
    const kr_opts *o;
    kr_job *j;
    kr_rank *ranks;           /* j->ranks and j->n, refreshed each turn (an elastic job grows) */
    int n;
    const char *unit;         /* "rank", or "worker" in an elastic job (worker ids) */
    enum phase phase;
    double settle;            /* SETTLE_S, or SETTLE_REMOTE_S when the job has remote hosts */
    double deadline;          /* end of SETTLING or TERMINATING */
    double remote_deadline;   /* KILLED: when started remote workers' ssh gets SIGKILL; 0 when done */
    double t0;
    int got_signal;           /* the first terminating signal kolorun received */
    int sigints;
    bool hard_kill;           /* the second SIGINT SIGKILLed everything without grace */
    int root;                 /* rank of the root-cause failure, -1 none */
    int launch_code;
    bool start_timed_out;
    bool elastic_end;         /* the elastic job could not go on (too few slots), no worker failed */
    bool timed_out;           /* the job ran past --timeout */
    /* "beat" lines to the remote wrappers every beat_every s (0: none), so that a machine cut off
     * from this one ends its workers (spawn.c, the remote wrapper); next_beat: when the next */
    double beat_every, next_beat;
    /* stdin forwarding to rank 0 */
    bool stdin_on;
    char *sbuf;
    size_t slen, soff;
} sup;

double kr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The signal that killed the worker, 0 if none: locally from the wait status, for a remote
 * worker from the wrapper's exit code 128+N. */
static int death_signal(const kr_opts *o, const kr_rank *r)
{
    if (WIFSIGNALED(r->wstatus)) return WTERMSIG(r->wstatus);
    if (!o->hosts[r->host].local && r->started && WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) > 128 &&
        WEXITSTATUS(r->wstatus) < 128 + NSIG)
        return WEXITSTATUS(r->wstatus) - 128;
    return 0;
}

static void signal_groups(sup *s, int sig, bool mark_terminated, bool local_only)
{
    for (int i = 0; i < s->n; i++) {
        kr_rank *r = &s->ranks[i];
        if (!r->running) continue;
        bool remote = !s->o->hosts[r->host].local;
        if (local_only && remote) continue;
        if (remote && r->started && sig != SIGKILL) {
            if (r->stdin_fd >= 0) close(r->stdin_fd); /* the wrapper takes it from here */
            r->stdin_fd = -1;
        } else {
            kill(-r->pid, sig);
        }
        if (mark_terminated && !r->failed) r->terminated = true;
        if (sig == SIGKILL) r->killed = true;
    }
}

/* Ctrl-Z and fg for remote workers: a line to the wrapper on the connection's stdin, which it
 * passes on as SIGSTOP or SIGCONT to the command's group (a signal to ssh would end it). Also
 * before the wrapper's start marker has come (the command's first lines may come before it):
 * the line waits in the pipe for the wrapper. */
static void tell_remote_wrappers(sup *s, const char *line)
{
    for (int i = 0; i < s->n; i++) {
        kr_rank *r = &s->ranks[i];
        if (r->running && !s->o->hosts[r->host].local && r->stdin_fd >= 0)
            (void)!write(r->stdin_fd, line, strlen(line)); /* a few bytes into an idle pipe */
    }
}

static void begin_terminate(sup *s, int sig)
{
    signal_groups(s, sig, true, false);
    s->phase = TERMINATING;
    s->deadline = kr_now() + s->o->grace;
}

static int count_running(const sup *s)
{
    int c = 0;
    for (int i = 0; i < s->n; i++) c += s->ranks[i].running;
    return c;
}

/* A local process we reaped (a worker, or a worker's orphan) that was killed in the middle of
 * kolo's shared-memory handshake leaves its segment named in /dev/shm (src/net/shm.c): removed
 * now, when its pid is known to be gone, instead of by a later job's sweep a minute on. */
static void release_shm(const sup *s, pid_t pid, const kr_rank *r)
{
    long long bytes = 0;
    int n = kolo__shm_remove_of(pid, &bytes);
    if (n > 0 && s->o->verbose) {
        if (r)
            kr_say("rank %d (pid %d) left %d shared-memory segment%s in /dev/shm (%lld bytes): removed", r->rank,
                   (int)pid, n, n == 1 ? "" : "s", bytes);
        else
            kr_say("pid %d left %d shared-memory segment%s in /dev/shm (%lld bytes): removed", (int)pid, n,
                   n == 1 ? "" : "s", bytes);
    }
}

static void reap(sup *s)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        kr_rank *r = NULL;
        for (int i = 0; i < s->n && !r; i++)
            if (s->ranks[i].pid == pid && s->ranks[i].running) r = &s->ranks[i];
        if (!r || s->o->hosts[r->host].local) release_shm(s, pid, r);
        if (!r) { /* the guard, a CPU reading's ssh, or an orphan of a worker (kolorun is their subreaper) */
            if (s->j->el) kr_elastic_reaped(s->j, pid);
            continue;
        }
        r->running = false;
        r->wstatus = st;
        r->end_time = kr_now() - s->t0;
        if (r->stdin_fd >= 0) {
            close(r->stdin_fd);
            r->stdin_fd = -1;
        }
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (s->o->verbose) kr_say("rank %d (pid %d) ended: status 0x%x", r->rank, (int)pid, st);
        if (r->terminated && !s->o->hosts[r->host].local && death_signal(s->o, r) == SIGKILL)
            r->killed = true; /* by its wrapper, after the grace period */
        if (s->j->el && s->phase == RUNNING && kr_elastic_on_exit(s->j, (int)(r - s->ranks))) continue;
        if (ok || r->terminated) continue;
        if (s->phase == RUNNING || s->phase == SETTLING) {
            r->failed = true;
            if (s->phase == RUNNING) {
                s->phase = SETTLING;
                s->deadline = kr_now() + s->settle;
            }
        }
    }
}

static const char *sig_name(int sig)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev) snprintf(buf, sizeof(buf), "SIG%s", abbrev);
    else snprintf(buf, sizeof(buf), "signal %d", sig);
    return buf;
}

static void on_signal(sup *s, int sig)
{
    if (sig == SIGTSTP) {
        /* Ctrl-Z: the workers, each in a process group of its own, would not see it, and would
         * go on (and block on their full output pipes) while kolorun stood still. They stop with
         * kolorun (Open MPI's mpirun does so only with orte_forward_job_control=1), by SIGSTOP (a
         * worker that catches SIGTSTP would stop half the job); `fg` or `bg` (SIGCONT) starts
         * them again. A pause of the whole job does not count against KOLO_OP_TIMEOUT (by hand:
         * 6 s stopped under a 3 s timeout, the job went on). Remote workers stop by their
         * wrappers (a signal over ssh would end them). */
        int live = count_running(s);
        kr_say("got SIGTSTP: stopping %d worker%s with kolorun (fg or bg resumes them)", live, live == 1 ? "" : "s");
        signal_groups(s, SIGSTOP, false, true);
        tell_remote_wrappers(s, "stop\n");
        raise(SIGSTOP);
        signal_groups(s, SIGCONT, false, true);
        tell_remote_wrappers(s, "cont\n");
        return;
    }
    if (sig == SIGCONT) { /* kolorun was stopped by someone else: its workers go on with it */
        signal_groups(s, SIGCONT, false, true);
        tell_remote_wrappers(s, "cont\n");
        return;
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        /* passed on to local workers only: for ssh it would be a kill */
        signal_groups(s, sig, false, true);
        return;
    }
    if (sig == SIGINT) s->sigints++;
    if (sig == SIGINT && s->sigints >= 2) {
        kr_say("second SIGINT: killing every worker now");
        s->hard_kill = true;
        signal_groups(s, SIGKILL, true, false);
        s->phase = KILLED;
        return;
    }
    if (!s->got_signal && s->root < 0) s->got_signal = sig;
    int live = count_running(s);
    kr_say("got %s: passing it to %d worker%s%s", sig_name(sig), live, live == 1 ? "" : "s",
           sig == SIGINT ? " (Ctrl-C again kills them at once)" : "");
    signal_groups(s, sig, true, false);
    if (s->phase != TERMINATING && s->phase != KILLED) {
        s->phase = TERMINATING;
        s->deadline = kr_now() + s->o->grace;
    }
}

static int code_of(int st)
{
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 1;
}

void kr_describe(const kr_rank *r, const kr_opts *o, char *out, size_t cap)
{
    bool remote = !o->hosts[r->host].local;
    int sig = death_signal(o, r);
    if (remote && !r->started && WIFEXITED(r->wstatus) && o->use_srun && WEXITSTATUS(r->wstatus) != 0)
        snprintf(out, cap, "could not be started as a Slurm step (srun exited with %d)", WEXITSTATUS(r->wstatus));
    else if (remote && !r->started && WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) == 255)
        snprintf(out, cap, "could not be started over ssh (ssh exited with 255)");
    else if (remote && WIFEXITED(r->wstatus) && sig)
        snprintf(out, cap, "was killed by %s (%s) (ssh reported exit code %d)", sig_name(sig), strsignal(sig),
                 WEXITSTATUS(r->wstatus));
    else if (remote && !o->use_srun && WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) == 255)
        /* ssh's own code: a session that broke (ServerAliveInterval: spawn.c) */
        snprintf(out, cap, "exited with code 255 (ssh's code for a lost session: the host stopped answering or the "
                 "connection broke; unless the worker itself exited with 255)");
    else if (WIFEXITED(r->wstatus))
        snprintf(out, cap, "exited with code %d", WEXITSTATUS(r->wstatus));
    else if (WIFSIGNALED(r->wstatus))
        snprintf(out, cap, "was killed by %s (%s)%s", sig_name(WTERMSIG(r->wstatus)), strsignal(WTERMSIG(r->wstatus)),
                 WCOREDUMP(r->wstatus) ? ", core dumped" : "");
    else
        snprintf(out, cap, "ended with wait status 0x%x", r->wstatus);
}

void kr_print_tail(const kr_rank *r, const char *unit)
{
    int who = strcmp(unit, "rank") == 0 ? r->rank : r->id;
    if (!r->tail || r->tail_count == 0) {
        kr_say("  (%s %d wrote nothing on stderr)", unit, who);
        return;
    }
    kr_say("  last %d line%s of %s %d's stderr:", r->tail_count, r->tail_count == 1 ? "" : "s", unit, who);
    int first = (r->tail_next - r->tail_count + KR_TAIL_LINES) % KR_TAIL_LINES;
    for (int k = 0; k < r->tail_count; k++) kr_say("  | %s", r->tail[(first + k) % KR_TAIL_LINES]);
}

/* Appends "a,b,c-d" lists of ranks that match. */
static int rank_list(const sup *s, bool (*pred)(const kr_rank *), char *out, size_t cap)
{
    size_t w = 0;
    int count = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n; i++) {
        if (!pred(&s->ranks[i])) continue;
        int j = i;
        while (j + 1 < s->n && pred(&s->ranks[j + 1])) j++;
        int m = j > i ? snprintf(out + w, cap - w, "%s%d-%d", w ? "," : "", i, j)
                      : snprintf(out + w, cap - w, "%s%d", w ? "," : "", i);
        if (m < 0 || (size_t)m >= cap - w) break;
        w += (size_t)m;
        count += j - i + 1;
        i = j;
    }
    return count;
}

/* A remote worker whose ssh ended with 255 (a session lost: spawn.c, ServerAliveInterval) while
 * kolorun was ending the job: told nothing, it was not terminated by kolorun. */
static bool is_cut_off(const kr_rank *r)
{
    return r->terminated && !r->failed && r->pid > 0 && r->started && !r->killed && WIFEXITED(r->wstatus) &&
           WEXITSTATUS(r->wstatus) == 255;
}
static bool is_terminated(const kr_rank *r) { return r->terminated && !r->failed && r->pid > 0 && !is_cut_off(r); }
static bool is_running(const kr_rank *r) { return r->running; }
static bool is_killed(const kr_rank *r)
{
    /* a remote worker's SIGKILL arrives as its wrapper's exit code */
    return r->killed && !r->failed && r->pid > 0 &&
           (WIFSIGNALED(r->wstatus) ? WTERMSIG(r->wstatus) == SIGKILL
                                    : WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) == 128 + SIGKILL);
}
static bool never_started(const kr_rank *r) { return r->pid == 0; }

/* "rank 3", or in an elastic job "worker 5 (rank 3)" */
static const char *who(const sup *s, const kr_rank *r, char *buf, size_t cap)
{
    if (s->j->el) snprintf(buf, cap, "worker %d (rank %d)", r->id, r->rank);
    else snprintf(buf, cap, "rank %d", r->rank);
    return buf;
}

/* The rank whose machine r's last stderr lines say stopped answering (tcp.c: "lost rank N on
 * HOST (ADDR): ... its machine stopped answering"), as an index into s->ranks; -1 for none. */
static int machine_blamed(const sup *s, const kr_rank *r)
{
    for (int k = r->tail_count - 1; r->tail && k >= 0; k--) {
        const char *line = r->tail[(r->tail_next - r->tail_count + k + KR_TAIL_LINES) % KR_TAIL_LINES];
        const char *lost = strstr(line, "lost rank ");
        int n;
        if (!lost || !strstr(lost, "its machine stopped answering") || sscanf(lost, "lost rank %d", &n) != 1) continue;
        for (int i = 0; i < s->n; i++) /* in an elastic job the rank of the worker's round */
            if (s->ranks[i].rank == n && s->ranks[i].pid > 0 && s->ranks[i].round == r->round) return i;
    }
    return -1;
}

static void summary(sup *s)
{
    char w[64];
    char list[1024];
    const kr_opts *o = s->o;
    if (s->root >= 0) {
        const kr_rank *r = &s->ranks[s->root];
        char how[256];
        kr_describe(r, o, how, sizeof(how));
        kr_say("%s on host %s %s after %.2f s (pid %d): the first failure of this job", who(s, r, w, sizeof(w)),
               o->hosts[r->host].name, how, r->end_time, (int)r->pid);
        kr_print_tail(r, s->unit);
        /* a machine that went down fails the others, each blaming a rank there, and its own ranks'
         * ssh sessions end with 255 (which may come first): name the machine, by the first
         * failure's error, else another failed rank's */
        int gone = -1, by = s->root;
        for (int i = -1; i < s->n && gone < 0; i++) {
            by = i < 0 ? s->root : i;
            if (i < 0 || (i != s->root && s->ranks[i].failed)) gone = machine_blamed(s, &s->ranks[by]);
        }
        if (gone >= 0) {
            char w2[64], w3[64];
            kr_say("  the cause, by %s's error: host %s, where %s ran, stopped answering (down, or the network to it "
                   "cut)", who(s, &s->ranks[by], w3, sizeof(w3)), o->hosts[s->ranks[gone].host].name,
                   who(s, &s->ranks[gone], w2, sizeof(w2)));
        }
        for (int i = 0; i < s->n; i++) {
            const kr_rank *q = &s->ranks[i];
            if (!q->failed || i == s->root) continue;
            kr_describe(q, o, how, sizeof(how));
            kr_say("%s on host %s also failed at the same time: it %s", who(s, q, w, sizeof(w)), o->hosts[q->host].name, how);
        }
    } else if (s->start_timed_out) {
        for (int i = 0; i < s->n; i++) {
            const kr_rank *q = &s->ranks[i];
            if (o->hosts[q->host].local || q->started) continue;
            kr_say("%s on host %s did not start within %g s (--start-timeout)", who(s, q, w, sizeof(w)),
                   o->hosts[q->host].name, o->start_timeout);
            kr_print_tail(q, s->unit);
        }
    }
    int t = rank_list(s, is_terminated, list, sizeof(list));
    if (t) {
        char why[64];
        if (s->root >= 0) snprintf(why, sizeof(why), "after %s %d failed", s->unit, s->root);
        else if (s->got_signal) snprintf(why, sizeof(why), "because kolorun got %s", sig_name(s->got_signal));
        else if (s->elastic_end) snprintf(why, sizeof(why), "because the elastic job could not go on");
        else if (s->timed_out) snprintf(why, sizeof(why), "at --timeout %g s", o->timeout);
        else snprintf(why, sizeof(why), "because the job could not start");
        kr_say("%s%s %s: terminated by kolorun %s (not a failure of %s)", s->unit, t == 1 ? "" : "s", list, why,
               t == 1 ? "its own" : "their own");
    }
    int cut = rank_list(s, is_cut_off, list, sizeof(list));
    if (cut)
        kr_say("%s%s %s: %s ssh session%s ended with code 255 (the host stopped answering or the connection broke) "
               "before %s could be told to stop; where the host is up, the wrapper there ends %s",
               s->unit, cut == 1 ? "" : "s", list, cut == 1 ? "its" : "their", cut == 1 ? "" : "s",
               cut == 1 ? "it" : "they", cut == 1 ? "it" : "them");
    int k = rank_list(s, is_killed, list, sizeof(list));
    if (k && s->hard_kill)
        kr_say("%s%s %s: killed with SIGKILL at the second Ctrl-C", s->unit, k == 1 ? "" : "s", list);
    else if (k)
        kr_say("%s%s %s: still running %g s after SIGTERM (--grace-seconds), killed with SIGKILL", s->unit,
               k == 1 ? "" : "s", list, o->grace);
    int ns = rank_list(s, never_started, list, sizeof(list));
    if (ns) kr_say("%s%s %s never started", s->unit, ns == 1 ? "" : "s", list);
}

/* --status-file: the job as it is now; final: done, with its exit code. */
static void write_status(sup *s, bool final, int code)
{
    const kr_opts *o = s->o;
    char reason[1024] = "", w[64], how[256];
    if (s->root >= 0) {
        const kr_rank *r = &s->ranks[s->root];
        kr_describe(r, o, how, sizeof(how));
        snprintf(reason, sizeof(reason), "%s on host %s %s", who(s, r, w, sizeof(w)), o->hosts[r->host].name, how);
    } else if (s->phase == SETTLING) {
        snprintf(reason, sizeof(reason), "a %s failed", s->unit);
    } else if (s->got_signal) {
        snprintf(reason, sizeof(reason), "kolorun got %s", sig_name(s->got_signal));
    } else if (s->timed_out) {
        snprintf(reason, sizeof(reason), "the job ran past --timeout %g s", o->timeout);
    } else if (s->elastic_end) {
        snprintf(reason, sizeof(reason), "the elastic job could not go on");
    } else if (s->start_timed_out) {
        snprintf(reason, sizeof(reason), "remote workers did not start within --start-timeout %g s", o->start_timeout);
    } else if (s->launch_code) {
        snprintf(reason, sizeof(reason), "the job could not be started");
    }
    const char *state = final ? "done" : s->phase == RUNNING ? "running" : "stopping";
    kr_status_write(s->j, state, final ? code : -1, reason, kr_now() - s->t0);
}

/* Whether a worker's last stderr lines say it failed because of another rank: kolo's words for a
 * lost, departed or aborting peer (xfer.c, the engine; kolo._tasks reads the same), in C or
 * Python alike. */
static bool blames_another(const kr_rank *r)
{
    static const char *const words[] = {"lost rank ", "left the job", "aborted the job", "(peer lost)", "was lost"};
    for (int k = 0; r->tail && k < r->tail_count; k++) {
        const char *line = r->tail[(r->tail_next - r->tail_count + k + KR_TAIL_LINES) % KR_TAIL_LINES];
        for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
            if (strstr(line, words[w])) return true;
    }
    return false;
}

/* The root cause among the failed ranks (see the top of the file): killed by a signal; else
 * failed without blaming another rank; else the lowest. */
static void pick_root(sup *s)
{
    for (int pass = 0; pass < 3 && s->root < 0; pass++)
        for (int i = 0; i < s->n && s->root < 0; i++) {
            const kr_rank *r = &s->ranks[i];
            if (r->failed && (pass == 2 || (pass == 1 && !blames_another(r)) || death_signal(s->o, r))) s->root = i;
        }
}

static void settle_done(sup *s)
{
    pick_root(s);
    s->got_signal = 0;
    int live = count_running(s);
    if (live) kr_say("%s %d failed: terminating the other %d worker%s", s->unit, s->root, live, live == 1 ? "" : "s");
    begin_terminate(s, SIGTERM);
}

static void forward_stdin(sup *s, short rev0, short rev_pipe)
{
    kr_rank *r0 = &s->ranks[0];
    if (rev_pipe & (POLLERR | POLLHUP)) { /* rank 0 closed its stdin */
        s->stdin_on = false;
        return;
    }
    if ((rev0 & (POLLIN | POLLHUP | POLLERR)) && s->slen == 0) {
        ssize_t n = read(0, s->sbuf, 65536);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (n <= 0) { /* end of our stdin: rank 0 sees it too */
            s->stdin_on = false;
            close(r0->stdin_fd);
            r0->stdin_fd = -1;
            return;
        }
        s->slen = (size_t)n;
        s->soff = 0;
    }
    if (s->slen > s->soff && r0->stdin_fd >= 0) {
        ssize_t w = write(r0->stdin_fd, s->sbuf + s->soff, s->slen - s->soff);
        if (w < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (w < 0) { /* EPIPE: rank 0 no longer reads */
            s->stdin_on = false;
            return;
        }
        s->soff += (size_t)w;
        if (s->soff == s->slen) s->slen = s->soff = 0;
    }
}

int kr_supervise(kr_job *j, int sigfd, int launch_code)
{
    const kr_opts *o = j->o;
    kr_rank *ranks = j->ranks;
    int n = j->n;
    sup s = {.o = o, .j = j, .ranks = ranks, .n = n, .root = -1, .launch_code = launch_code, .t0 = o->t_launch,
             .settle = SETTLE_S, .unit = j->el ? "worker" : "rank"};
    for (int h = 0; h < o->nhosts; h++)
        if (!o->hosts[h].local) {
            s.settle = SETTLE_REMOTE_S;
            s.beat_every = kr_beat_timeout(o) / 4.0;
        }
    s.sbuf = malloc(65536);
    /* Forward stdin only when reading it cannot stop us: a terminal we do not own (kolorun
     * started with &) would send SIGTTIN. */
    s.stdin_on = s.sbuf && n > 0 && ranks[0].stdin_fd >= 0 && o->hosts[ranks[0].host].local &&
                 (!isatty(0) || tcgetpgrp(0) == getpgrp());
    if (launch_code) {
        begin_terminate(&s, SIGTERM);
    }
    double start_deadline = s.t0 + o->start_timeout;
    double job_deadline = o->timeout > 0 ? s.t0 + o->timeout : 1e300;
    double next_status = 0;       /* --status-file: rewritten at a change, and each second */
    uint64_t status_sig = ~0ull;
    double drain_deadline = 0;
    bool groups_cleared = false;

    int pcap = j->cap;
    struct pollfd *pfd = calloc((size_t)(3 + 2 * pcap), sizeof(*pfd));
    kr_stream **whom = calloc((size_t)(3 + 2 * pcap), sizeof(*whom));
    kr_rank **whose = calloc((size_t)(3 + 2 * pcap), sizeof(*whose));
    if (!pfd || !whom || !whose) {
        kr_say("error: out of memory");
        signal_groups(&s, SIGKILL, true, false);
        free(pfd);
        free(whom);
        free(whose);
        free(s.sbuf);
        return KR_EXIT_LAUNCH;
    }

    for (;;) {
        reap(&s);
        double now = kr_now();
        if (j->el && s.phase == RUNNING) {
            int fail_as = kr_elastic_tick(j, now);
            s.ranks = ranks = j->ranks; /* it may have started workers */
            s.n = n = j->n;
            if (fail_as >= 0) { /* the job cannot go on: as if that loss had ended it */
                ranks[fail_as].failed = true;
                ranks[fail_as].lost = false;
                s.phase = SETTLING;
                s.deadline = now;
            } else if (fail_as == KR_ELASTIC_END) {
                s.elastic_end = true;
                s.launch_code = KR_EXIT_LAUNCH;
                begin_terminate(&s, SIGTERM);
            }
            if (j->cap > pcap) {
                pcap = j->cap;
                struct pollfd *p2 = realloc(pfd, (size_t)(3 + 2 * pcap) * sizeof(*pfd));
                if (p2) pfd = p2;
                kr_stream **w2 = realloc(whom, (size_t)(3 + 2 * pcap) * sizeof(*whom));
                if (w2) whom = w2;
                kr_rank **r2 = realloc(whose, (size_t)(3 + 2 * pcap) * sizeof(*whose));
                if (r2) whose = r2;
                if (!p2 || !w2 || !r2) {
                    kr_say("error: out of memory");
                    signal_groups(&s, SIGKILL, true, false);
                    break;
                }
            }
        }
        if (s.phase == SETTLING && now >= s.deadline) settle_done(&s);
        if (s.phase == TERMINATING && now >= s.deadline) {
            /* remote workers: their wrapper counts the grace period from when it saw the
             * connection's stdin close; their ssh goes REMOTE_EXTRA_S later */
            signal_groups(&s, SIGKILL, true, true);
            s.phase = KILLED;
            s.remote_deadline = s.deadline + REMOTE_EXTRA_S;
        }
        if (s.phase == KILLED && s.remote_deadline > 0 && now >= s.remote_deadline) {
            signal_groups(&s, SIGKILL, true, false);
            s.remote_deadline = 0;
        }
        if (s.phase == RUNNING && now >= start_deadline) {
            bool missing = false;
            for (int i = 0; i < n; i++)
                if (ranks[i].running && !o->hosts[ranks[i].host].local && !ranks[i].started) missing = true;
            if (missing) {
                s.start_timed_out = true;
                begin_terminate(&s, SIGTERM);
            }
            start_deadline = now + 1e9;
        }
        if (s.phase == RUNNING && now >= job_deadline) {
            char list[1024];
            int live = rank_list(&s, is_running, list, sizeof(list));
            if (live)
                kr_say("the job ran past --timeout %g s with %d %s%s still running (%s): stopping it", o->timeout, live,
                       s.unit, live == 1 ? "" : "s", list);
            else /* an elastic job waiting for --min-np slots */
                kr_say("the job ran past --timeout %g s with no %s running: stopping it", o->timeout, s.unit);
            if (o->stack_traces) kr_dump_stacks(o, ranks, n, s.unit);
            s.timed_out = true;
            begin_terminate(&s, SIGTERM);
        }
        if (o->status_file) {
            uint64_t started = 0;
            for (int i = 0; i < n; i++) started += ranks[i].started;
            uint64_t sig = (uint64_t)s.phase | (uint64_t)count_running(&s) << 4 | (uint64_t)n << 24 | started << 44;
            if (sig != status_sig || now >= next_status) {
                write_status(&s, false, 0);
                status_sig = sig;
                next_status = now + 1.0;
            }
        }
        int open_streams = 0;
        for (int i = 0; i < n; i++) open_streams += (ranks[i].out.fd >= 0) + (ranks[i].err.fd >= 0);
        if (count_running(&s) == 0) {
            if (!groups_cleared) {
                /* what is left in the workers' groups (background children) goes too */
                for (int i = 0; i < n; i++)
                    if (ranks[i].pid > 0) kill(-ranks[i].pid, SIGKILL);
                groups_cleared = true;
                drain_deadline = now + DRAIN_S;
            }
            if (open_streams == 0 || now >= drain_deadline) break;
        }

        int np = 0;
        pfd[np++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        int stdin_idx = -1, pipe_idx = -1;
        if (s.stdin_on && ranks[0].stdin_fd >= 0) {
            if (s.slen == 0) {
                stdin_idx = np;
                pfd[np++] = (struct pollfd){.fd = 0, .events = POLLIN};
            }
            pipe_idx = np;
            pfd[np++] = (struct pollfd){.fd = ranks[0].stdin_fd, .events = s.slen ? POLLOUT : 0};
        }
        int first_stream = np;
        for (int i = 0; i < n; i++) {
            kr_stream *ss[2] = {&ranks[i].out, &ranks[i].err};
            for (int k = 0; k < 2; k++) {
                if (ss[k]->fd < 0) continue;
                whom[np] = ss[k];
                whose[np] = &ranks[i];
                pfd[np++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
            }
        }
        kr_output_merge_flush(now);
        if (s.beat_every > 0 && now >= s.next_beat) { /* nothing to write once stdin is closed */
            tell_remote_wrappers(&s, "beat\n");
            s.next_beat = now + s.beat_every;
        }
        double wake = now + 3600;
        if (s.beat_every > 0 && s.next_beat < wake) wake = s.next_beat;
        if (kr_output_merge_wake() < wake) wake = kr_output_merge_wake();
        if (s.phase == SETTLING || s.phase == TERMINATING) wake = s.deadline < wake ? s.deadline : wake;
        if (s.phase == KILLED && s.remote_deadline > 0 && s.remote_deadline < wake) wake = s.remote_deadline;
        if (s.phase == RUNNING && start_deadline < wake) wake = start_deadline;
        if (s.phase == RUNNING && job_deadline < wake) wake = job_deadline;
        if (o->status_file && next_status < wake) wake = next_status;
        if (groups_cleared && drain_deadline < wake) wake = drain_deadline;
        if (j->el && s.phase == RUNNING) {
            double ew = kr_elastic_wake(j);
            if (ew < wake) wake = ew;
        }
        int timeout_ms = (int)((wake - now) * 1000.0) + 1;
        if (timeout_ms < 0) timeout_ms = 0;
        int pr = poll(pfd, (nfds_t)np, timeout_ms);
        if (pr < 0) {
            if (errno == EINTR) continue;
            kr_say("error: poll: %s", strerror(errno));
            signal_groups(&s, SIGKILL, true, false);
            s.phase = KILLED;
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                if ((int)si.ssi_signo == SIGCHLD) reap(&s);
                else on_signal(&s, (int)si.ssi_signo);
            }
        }
        if (pipe_idx >= 0) forward_stdin(&s, stdin_idx >= 0 ? pfd[stdin_idx].revents : 0, pfd[pipe_idx].revents);
        for (int i = first_stream; i < np; i++) {
            if (!pfd[i].revents) continue;
            if (!kr_output_read(o, whose[i], whom[i])) { /* stream ended */ }
        }
    }
    /* whatever is still buffered (a stream cut at the drain deadline), and held (--merge-output) */
    for (int i = 0; i < n; i++) {
        kr_output_flush(o, &ranks[i], &ranks[i].out);
        kr_output_flush(o, &ranks[i], &ranks[i].err);
        if (ranks[i].stdin_fd >= 0) close(ranks[i].stdin_fd);
        ranks[i].stdin_fd = -1;
    }
    kr_output_merge_flush(-1);
    free(pfd);
    free(whom);
    free(whose);
    free(s.sbuf);

    pick_root(&s); /* a failure seen just before a signal arrived */
    int code = 0;
    if (s.root >= 0) code = code_of(ranks[s.root].wstatus);
    else if (s.got_signal) code = 128 + s.got_signal;
    else if (s.launch_code) code = s.launch_code;
    else if (s.start_timed_out) code = KR_EXIT_LAUNCH;
    else if (s.timed_out) code = KR_EXIT_TIMEOUT;
    if (s.root >= 0 || s.got_signal || s.start_timed_out || s.launch_code || s.timed_out) summary(&s);
    if (code && (s.root >= 0 || s.start_timed_out || s.timed_out)) kr_say("exit code %d", code);
    write_status(&s, true, code);
    return code;
}
