/* proc.c - what /proc says about a worker's process group (the worker and whatever it started,
 * e.g. a shell's python): its processes, whose stacks --get-stack-traces shows (stacks.c), and
 * the CPU time they used, by which the elastic driver tells a worker that is busy from one that
 * is stuck (elastic.c); a remote worker's from its host's /proc, over ssh. */
#include "kolorun.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GROUP_WAITS_MAX 16 /* processes of a group kr_group_waits looks at */

/* Reads /proc/PID/stat: state, process group and CPU ticks (user + system, its own and that of
 * the children it reaped). False when the process is gone or the line does not parse. */
static bool read_stat_at(const char *path, char *state, int *ppid_out, int *pgrp, long long *ticks)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *q = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    unsigned long long ut = 0, st = 0;
    long long cut = 0, cst = 0;
    int ppid = 0;
    /* fields 3-17: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
     * utime stime cutime cstime */
    if (!q || sscanf(q + 1, " %c %d %d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", state, &ppid, pgrp, &ut,
                     &st, &cut, &cst) != 7)
        return false;
    *ticks = (long long)(ut + st) + cut + cst;
    if (ppid_out) *ppid_out = ppid;
    return true;
}

static bool read_stat(long pid, char *state, int *pgrp, long long *ticks)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    return read_stat_at(path, state, NULL, pgrp, ticks);
}

/* Walks pgid's live processes: the leader (always, first) and the others into out (up to cap),
 * their summed CPU ticks into *ticks. Returns how many live processes the group has. */
static int scan_group(pid_t pgid, pid_t *out, int cap, int *stored, long long *ticks)
{
    int n = 0, k = 0;
    long long sum = 0, t;
    char state;
    int pgrp;
    if (cap > 0) out[k++] = pgid;
    if (read_stat(pgid, &state, &pgrp, &t) && state != 'Z' && state != 'X') {
        n++;
        sum += t;
    }
    DIR *d = opendir("/proc");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            if (*end || pid <= 0 || pid == pgid) continue;
            if (!read_stat(pid, &state, &pgrp, &t) || pgrp != pgid || state == 'Z' || state == 'X') continue;
            if (k < cap) out[k++] = (pid_t)pid; /* a zombie has no stack to show, nor time to use */
            n++;
            sum += t;
        }
        closedir(d);
    }
    if (stored) *stored = k;
    if (ticks) *ticks = sum;
    return n;
}

int kr_group_members(pid_t pgid, pid_t *out, int cap)
{
    int k = 0;
    scan_group(pgid, out, cap, &k, NULL);
    return k;
}

long long kr_group_cpu_ticks(pid_t pgid)
{
    long long ticks = 0;
    return scan_group(pgid, NULL, 0, NULL, &ticks) > 0 ? ticks : -1;
}

/* ---- leftovers ----
 * A worker's process that starts a session or a process group of its own (setsid, a daemon, a
 * server started with start_new_session) escapes the signals kolorun sends the worker's group.
 * kolorun is the subreaper of everything its workers start, so such a process becomes kolorun's
 * child when its parent ends; once the job is over, its children that carry the job's
 * KOLO_JOB_ID (not, say, what a script started before it exec'd kolorun) are those, and none
 * may outlive it. */

#define LEFTOVERS_MAX 64

bool kr_environ_has(long pid, const char *want)
{
    /* the whole environment: kolorun's variables come after the inherited ones, which past
     * 64 KiB are no rarity (module systems' tables) */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    ssize_t k = 0;
    while (buf && (k = read(fd, buf + n, cap - n)) > 0) {
        n += (size_t)k;
        if (n == cap && cap < ((size_t)16 << 20)) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) break;
            buf = b;
            cap *= 2;
        } else if (n == cap) {
            break;
        }
    }
    close(fd);
    bool found = false;
    if (buf) {
        buf[n] = '\0';
        size_t wl = strlen(want);
        for (char *e = buf; e < buf + n && !found; e += strlen(e) + 1)
            found = strncmp(e, want, wl) == 0 && e[wl] == '\0';
    }
    free(buf);
    return found;
}

/* The live children of this process that carry `mark` in their environment (not, say, what a
 * script started before it exec'd kolorun), up to cap, into out; returns how many there are. */
static int live_children(const char *mark, pid_t *out, int cap)
{
    int n = 0, me = (int)getpid();
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end, path[64], state;
        long pid = strtol(e->d_name, &end, 10);
        int ppid, pgrp;
        long long t;
        if (*end || pid <= 0) continue;
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        if (!read_stat_at(path, &state, &ppid, &pgrp, &t) || ppid != me || state == 'Z' || state == 'X' ||
            !kr_environ_has(pid, mark))
            continue;
        if (n < cap) out[n] = (pid_t)pid;
        n++;
    }
    closedir(d);
    return n;
}

static bool listed(const pid_t *pids, int n, pid_t pid)
{
    for (int k = 0; k < n; k++)
        if (pids[k] == pid) return true;
    return false;
}

static void signal_leftover(pid_t pid, int sig)
{
    if (getpgid(pid) == pid) kill(-pid, sig); /* and its group, which it leads */
    kill(pid, sig);
}

static void reap_all(void)
{
    int st;
    while (waitpid(-1, &st, WNOHANG) > 0) {}
}

void kr_end_leftovers(double grace, const char *job_id)
{
    char mark[128];
    snprintf(mark, sizeof(mark), "KOLO_JOB_ID=%s", job_id);
    pid_t seen[LEFTOVERS_MAX], kids[LEFTOVERS_MAX];
    int nseen = 0, total = 0;
    char names[512] = "";
    size_t len = 0;
    double t0 = kr_now();
    bool hard = false;
    for (;;) {
        reap_all();
        int n = live_children(mark, kids, LEFTOVERS_MAX);
        if (n > LEFTOVERS_MAX) n = LEFTOVERS_MAX;
        if (n == 0) break;
        if (!hard && kr_now() - t0 >= grace) hard = true;
        for (int i = 0; i < n; i++) {
            bool known = listed(seen, nseen, kids[i]);
            /* A member of a group whose leader was met (and signalled with its group) is the
             * leader's: SIGKILLed with it, it can outlive the leader by a scheduling delay and come
             * to kolorun, still running, as an orphan (a trap-ignoring `sh -c` and its `sleep`, in
             * a CI run with a CPU wait of 1.1 s): signalled again, not named as one more. */
            if (!known && listed(seen, nseen, getpgid(kids[i]))) {
                known = true;
                if (nseen < LEFTOVERS_MAX) seen[nseen++] = kids[i];
            }
            if (!known) { /* first met: named in the message, sent SIGTERM */
                char path[64], comm[32] = "?";
                snprintf(path, sizeof(path), "/proc/%d/comm", (int)kids[i]);
                FILE *f = fopen(path, "r");
                if (f) {
                    if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
                    fclose(f);
                }
                if (len < sizeof(names) - 1)
                    len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s (pid %d)", total ? ", " : "", comm,
                                            (int)kids[i]);
                total++;
                if (nseen < LEFTOVERS_MAX) seen[nseen++] = kids[i];
                signal_leftover(kids[i], SIGTERM);
            }
            if (hard) signal_leftover(kids[i], SIGKILL);
        }
        if (kr_now() - t0 > grace + 5) break; /* SIGKILLed and still there (in an uninterruptible wait) */
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (total)
        kr_say("the workers left %d process%s running in a session or group of %s own: %s; %s, as the job is over",
               total, total == 1 ? "" : "es", total == 1 ? "its" : "their", names,
               hard ? "killed (SIGTERM, then SIGKILL after the grace period)" : "terminated");
}

/* One thread's "in WCHAN" (sleeping in the kernel function named), or its state spelt out. */
static void thread_wait(long pid, const char *tid, char *out, size_t cap)
{
    char path[320], wchan[64] = "", state = '?';
    snprintf(path, sizeof(path), "/proc/%ld/task/%s/wchan", pid, tid);
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(wchan, 1, sizeof(wchan) - 1, f);
        wchan[n] = '\0';
        fclose(f);
    }
    snprintf(path, sizeof(path), "/proc/%ld/task/%s/stat", pid, tid);
    int pgrp;
    long long ticks;
    if (!read_stat_at(path, &state, NULL, &pgrp, &ticks)) state = '?';
    if (state == 'R') snprintf(out, cap, "running");
    else if (state == 'T' || state == 't') snprintf(out, cap, "stopped");
    else if (wchan[0] && strcmp(wchan, "0") != 0) snprintf(out, cap, "in %s", wchan);
    else snprintf(out, cap, "%s", state == 'D' ? "waiting uninterruptibly" : "sleeping");
}

void kr_group_waits(pid_t pgid, char *out, size_t cap)
{
    enum { KINDS = 8 };
    char kind[KINDS][80];
    int count[KINDS] = {0}, kinds = 0, other = 0;
    pid_t procs[GROUP_WAITS_MAX];
    int np = 0;
    scan_group(pgid, procs, GROUP_WAITS_MAX, &np, NULL);
    for (int i = 0; i < np; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)procs[i]);
        DIR *d = opendir(path);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
            char w[80];
            thread_wait(procs[i], e->d_name, w, sizeof(w));
            int k = 0;
            while (k < kinds && strcmp(kind[k], w) != 0) k++;
            if (k == kinds && kinds < KINDS) snprintf(kind[kinds++], sizeof(kind[0]), "%s", w);
            if (k < kinds) count[k]++;
            else other++;
        }
        closedir(d);
    }
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < kinds && len < cap; k++)
        len += (size_t)snprintf(out + len, cap - len, "%s%d %s", k ? ", " : "", count[k], kind[k]);
    if (other && len < cap) snprintf(out + len, cap - len, ", %d elsewhere", other);
}

/* The remote side of kr_remote_cpu_start: for each command named (the wrapper's pid, its process
 * group's where setsid made it one: spawn.c), the summed CPU ticks of its group's live processes,
 * or of the command alone where it leads no group (fields 14-17 of /proc/PID/stat, counted after
 * the name, which may hold spaces and parentheses), as "@@cpu PID TICKS", or "@@cpu PID -1" when
 * none is alive. cat goes on past processes that end while it reads. */
static const char remote_cpu_script[] =
    "cat /proc/[0-9]*/stat 2>/dev/null | awk -v want=\"$*\" '\n"
    "BEGIN { n = split(want, w, \" \"); for (i = 1; i <= n; i++) { t[w[i]] = 0; seen[w[i]] = 0 } }\n"
    "{ p = $1; sub(/^.*\\) /, \"\"); g = ($3 in t) ? $3 : (p in t) ? p : \"\";\n"
    "  if (g != \"\" && $1 != \"Z\" && $1 != \"X\") { t[g] += $12 + $13 + $14 + $15; seen[g] = 1 } }\n"
    "END { for (g in t) print \"@@cpu\", g, (seen[g] ? t[g] : -1) }'\n";

/* ssh's argv for one ask: the script with the ask's groups as its arguments. */
static char **cpu_argv(const kr_opts *o, const kr_cpu_ask *a)
{
    char *q = kr_shell_quote(remote_cpu_script), *cmd = q ? malloc(strlen(q) + 64 + (size_t)a->n * 12) : NULL;
    if (!cmd) {
        free(q);
        return NULL;
    }
    size_t len = (size_t)sprintf(cmd, "sh -c %s kolorun-cpu", q);
    for (int i = 0; i < a->n; i++) len += (size_t)sprintf(cmd + len, " %d", (int)a->pgids[i]);
    free(q);
    char **argv = kr_ssh_argv(o, a->host, cmd);
    free(cmd);
    return argv;
}

/* One ssh per ask, running side by side. */
struct kr_cpu_read {
    int n;
    kr_cpu_ask *asks;
    struct cpu_ssh {
        kr_capture c;
        char **argv;
        pid_t pid; /* -1: not started, or reaped by the caller's loop */
        int fd;    /* -1: its output ended */
    } *ssh;
    double deadline;
};

kr_cpu_read *kr_remote_cpu_start(const kr_opts *o, const kr_cpu_ask *asks, int nasks)
{
    kr_cpu_read *r = calloc(1, sizeof(*r));
    if (r) {
        r->asks = malloc((size_t)nasks * sizeof(kr_cpu_ask));
        r->ssh = calloc((size_t)nasks, sizeof(struct cpu_ssh));
    }
    if (!r || !r->asks || !r->ssh) {
        if (r) {
            free(r->asks);
            free(r->ssh);
            free(r);
        }
        return NULL;
    }
    r->n = nasks;
    r->deadline = kr_now() + REMOTE_CPU_S;
    for (int a = 0; a < nasks; a++) {
        struct cpu_ssh *h = &r->ssh[a];
        r->asks[a] = asks[a];
        for (int i = 0; i < asks[a].n; i++) asks[a].ticks[i] = -1;
        h->pid = -1;
        h->fd = -1;
        h->c.len = -1;
        size_t cap = 64 + (size_t)asks[a].n * 48; /* a line per group */
        h->c.out = malloc(cap);
        h->argv = h->c.out ? cpu_argv(o, &asks[a]) : NULL;
        if (!h->argv) continue;
        h->c.argv = (const char *const *)h->argv;
        h->c.cap = cap;
        h->pid = kr_capture_start(&h->c, &h->fd);
    }
    return r;
}

bool kr_remote_cpu_poll(kr_cpu_read *r)
{
    bool open_left = false;
    for (int a = 0; a < r->n; a++) {
        struct cpu_ssh *h = &r->ssh[a];
        if (h->fd < 0) continue;
        if (kr_capture_read(&h->c, h->fd)) { /* more to come (the pipe does not block) */
            open_left = true;
        } else {
            close(h->fd);
            h->fd = -1;
        }
    }
    return !open_left || kr_now() >= r->deadline;
}

void kr_remote_cpu_reaped(kr_cpu_read *r, pid_t pid)
{
    for (int a = 0; r && a < r->n; a++)
        if (r->ssh[a].pid == pid) r->ssh[a].pid = -1;
}

void kr_remote_cpu_end(kr_cpu_read *r)
{
    if (!r) return;
    for (int a = 0; a < r->n; a++) {
        struct cpu_ssh *h = &r->ssh[a];
        const kr_cpu_ask *ask = &r->asks[a];
        bool whole = h->fd < 0 && h->c.len >= 0; /* its output to the end */
        if (h->fd >= 0) close(h->fd);
        if (h->pid > 0) { /* done talking, or past the deadline: its group goes */
            kill(-h->pid, SIGKILL);
            kill(h->pid, SIGKILL);
            int st;
            while (waitpid(h->pid, &st, 0) < 0 && errno == EINTR) {
            }
        }
        if (whole)
            for (char *save = NULL, *l = strtok_r(h->c.out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                long pg;
                long long t;
                if (sscanf(l, "@@cpu %ld %lld", &pg, &t) != 2) continue;
                for (int i = 0; i < ask->n; i++)
                    if (ask->pgids[i] == (pid_t)pg) ask->ticks[i] = t;
            }
        free(h->c.out);
        kr_argv_free(h->argv);
    }
    free(r->asks);
    free(r->ssh);
    free(r);
}
