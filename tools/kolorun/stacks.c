/* stacks.c - --get-stack-traces: what every local worker is doing when the job runs past
 * --timeout, printed before kolorun stops it, so that a hang names where each rank waits.
 *
 * Two sources, for every process of a running local worker's process group (the worker and
 * whatever it started, e.g. a shell's python):
 *   - Python stacks: with --get-stack-traces kolorun exports KOLO_STACK_TRACES=1, and a Python
 *     process that imports kolo then has faulthandler print every thread's stack on SIGUSR2
 *     (python/kolo/_lib.py). Such a process is sent SIGUSR2 only when /proc says it catches
 *     it: to anything else the signal would be fatal. The stacks arrive on its stderr, tagged
 *     like its other lines.
 *   - Native stacks of every thread, from gdb (`thread apply all bt`), when gdb is installed;
 *     printed as "[rank]<stack PID>:" lines on kolorun's stderr. At most GDB_S per process.
 *   - kolo's status of each process that uses kolo (kolo_status_json: the collective it is in,
 *     the ranks it waits for, the tensors some ranks submitted and others not): the option
 *     exports KOLO_STATUS_SIGNAL=USR1 (unless the user set it), and such a process writes it as
 *     one "[kolo R status] {...}" line on its stderr when sent SIGUSR1, sent, as SIGUSR2, only to
 *     processes that catch it (a remote one's by a short ssh). First, as gdb stops the processes
 *     it reads; then kolorun says which rank the job waits on (say_waits).
 * A remote worker's host is asked the same over a second ssh (remote_stacks, below; the PID is
 * the remote one). At most 64 local workers. */
#include "kolorun.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define GDB_S 20.0            /* one process's gdb; a remote host gets 3 times this */
#define STACKS_BUDGET_S 120.0 /* all of it, before the job is stopped */
#define GROUP_MAX 16

/* Whether the process has a handler for sig (SigCgt in /proc/PID/status). */
static bool catches(pid_t pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool yes = false;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long mask;
        if (sscanf(line, "SigCgt: %llx", &mask) == 1) {
            yes = (mask >> (sig - 1)) & 1;
            break;
        }
    }
    fclose(f);
    return yes;
}

static void emit(const char *tag, pid_t pid, const char *line, size_t len)
{
    char out[1200];
    int n = snprintf(out, sizeof(out), "%s<stack %d>:%.*s\n", tag, (int)pid, (int)(len < 1100 ? len : 1100), line);
    if (n > 0) kr_write_all(2, out, (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1);
}

/* Runs gdb on pid and prints its threads and frames. Returns false when gdb could not be run. */
static bool gdb_stacks(pid_t pid, const char *tag)
{
    char pidstr[16];
    snprintf(pidstr, sizeof(pidstr), "%d", (int)pid);
    const char *argv[] = {"gdb", "-nx", "-batch", "-p", pidstr, "-ex", "set pagination off", "-ex",
                          "thread apply all bt", NULL};
    size_t cap = (size_t)1 << 20; /* a few hundred threads' frames */
    char *out = malloc(cap);
    int st = 0;
    bool timed_out = false;
    if (!out || kr_run_capture(argv, true, GDB_S, out, cap, &st, &timed_out) < 0) {
        free(out);
        return true; /* no memory or no fork: nothing to say about gdb */
    }
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        /* the threads and their frames; gdb's chatter (libthread_db, source lines) left out */
        if (strncmp(l, "Thread ", 7) != 0 && l[0] != '#') continue;
        emit(tag, pid, l, strlen(l));
        lines++;
    }
    free(out);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127 && lines == 0) return false;
    if (timed_out) emit(tag, pid, " (gdb gave no answer within the time limit)", 43);
    else if (lines == 0) emit(tag, pid, " (gdb printed no stack: ptrace not permitted here?)", 51);
    return true;
}

/* A remote worker's stacks, by a second ssh to its host: the same two sources there, for the
 * processes of the command's process group (its pid came with the wrapper's start marker).
 * The script prints "@@stack PID" before each process's frames. */
enum { REMOTE_OK, REMOTE_NO_GDB, REMOTE_NO_ANSWER };

/* What both remote scripts start with: the processes of the command's process group ($c, its
 * pid, and $more), and for process $p the low bits of its caught signals (SigCgt; signal N is
 * bit N-1), in $m. */
#define GROUP_PIDS "c=$1; more=$(ps -e -o pid= -o pgid= 2>/dev/null | awk -v g=\"$c\" '$2 == g && $1 != g { print $1 }')\n"
#define CAUGHT "m=$(awk '/^SigCgt:/ { print substr($2, length($2) - 3) }' /proc/$p/status 2>/dev/null)\n"

/* A remote worker's kolo status: SIGUSR1 to the processes of its group that catch it, by a short
 * ssh to its host; the status comes on the worker's own stderr stream. 1 when some process was
 * sent it, 0 when none catches it, -1 when the host did not answer (its other workers are not
 * asked). */
static const char status_script[] = GROUP_PIDS "for p in $c $more; do\n  " CAUGHT
                                    "  [ -n \"$m\" ] && [ $(( (0x$m >> 9) & 1 )) = 1 ] && kill -USR1 $p 2>/dev/null && "
                                    "echo @@sent\n"
                                    "done\n";

static int remote_status(const kr_opts *o, const kr_rank *r)
{
    char *q = kr_shell_quote(status_script);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "sh -c %s kolorun-status %d", q ? q : "", r->remote_pid);
    free(q);
    char **argv = kr_ssh_argv(o, r->host, cmd);
    char out[4096];
    int st = 0;
    bool timed_out = false;
    ssize_t got = argv ? kr_run_capture((const char *const *)argv, false, 10.0, out, sizeof(out) - 1, &st, &timed_out)
                       : -1;
    kr_argv_free(argv);
    if (got < 0) return 0;
    out[got] = '\0';
    return strstr(out, "@@sent") ? 1 : timed_out ? -1 : 0;
}
static const char remote_script[] =
    GROUP_PIDS
    "for p in $c $more; do\n  " CAUGHT
    "  [ -n \"$m\" ] && [ $(( (0x$m >> 11) & 1 )) = 1 ] && kill -USR2 $p 2>/dev/null\n"
    "done\n"
    "command -v gdb >/dev/null 2>&1 || { echo @@nogdb; exit 0; }\n"
    "for p in $c $more; do\n"
    "  [ -r /proc/$p/status ] || continue\n"
    "  echo \"@@stack $p\"\n"
    "  timeout 20 gdb -nx -batch -p $p -ex 'set pagination off' -ex 'thread apply all bt' 2>&1 |"
    " grep -E '^(Thread |#)'\n"
    "done\n";

static int remote_stacks(const kr_opts *o, const kr_rank *r, const char *tag)
{
    char *q = kr_shell_quote(remote_script);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "sh -c %s kolorun-stacks %d", q ? q : "", r->remote_pid);
    free(q);
    char **argv = kr_ssh_argv(o, r->host, cmd);
    size_t cap = (size_t)1 << 20;
    char *out = malloc(cap);
    int st = 0;
    bool timed_out = false, gdb = true;
    ssize_t got = argv && out ? kr_run_capture((const char *const *)argv, true, 3 * GDB_S, out, cap, &st, &timed_out)
                              : -1;
    kr_argv_free(argv);
    if (got < 0) {
        free(out);
        return REMOTE_OK; /* no memory or no fork: nothing to say about the host */
    }
    pid_t pid = r->remote_pid;
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strcmp(l, "@@nogdb")) gdb = false;
        else if (!strncmp(l, "@@stack ", 8)) pid = (pid_t)atoi(l + 8);
        else if (!strncmp(l, "Thread ", 7) || l[0] == '#') {
            emit(tag, pid, l, strlen(l));
            lines++;
        }
    }
    free(out);
    if (timed_out) {
        emit(tag, pid, " (no answer from its host within the time limit)", 48);
        return REMOTE_NO_ANSWER;
    }
    if (!gdb) return REMOTE_NO_GDB;
    if (lines == 0) emit(tag, pid, " (no stack from its host: ssh failed, or ptrace is not permitted there)", 71);
    return REMOTE_OK;
}

/* ---- who waits for whom, from the ranks' kolo status lines ----
 * Each status (kolo_status_json, one line of JSON kolo wrote itself) says whom the rank waits
 * for: the ranks its direct collective's wait and its engine's wait wait on, and the members
 * missing from the tensors it has submitted. A rank that others wait for and that waits for no
 * rank itself is what the job waits on. The few members read are found by their keys: the
 * format is kolo's own (kolo.h). */
#define WAIT_KEY "\"waiting_for\":{\"ranks\":"

/* The integers of the JSON list at p ("[1,2]"), at most cap of them; their count. */
static int int_list(const char *p, int *out, int cap)
{
    int k = 0;
    if (!p || *p != '[') return 0;
    for (p++; *p && *p != ']' && k < cap;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[k++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    return k;
}

static const char *after(const char *p, const char *end, const char *key)
{
    const char *k = p ? strstr(p, key) : NULL;
    return k && (!end || k < end) ? k + strlen(key) : NULL;
}

typedef struct waits {
    bool have;         /* the rank gave its status */
    int n, on[16];     /* the ranks it waits for (the first 16) */
    char why[160];     /* the first reason: the call or the tensor */
    /* its direct collective, past its checks: its process set, its number there, what it is */
    int pset;
    long long number;  /* 0: none */
    char what[96];
} waits;

static void add_wait(waits *w, int rank, const char *why)
{
    for (int i = 0; i < w->n; i++)
        if (w->on[i] == rank) return;
    if (w->n < 16) w->on[w->n++] = rank;
    if (!w->why[0]) snprintf(w->why, sizeof(w->why), "%s", why);
}

static void read_waits(const char *st, int size, waits *all)
{
    const char *r = after(st, NULL, "{\"rank\":");
    int me = r ? atoi(r) : -1;
    if (me < 0 || me >= size) return;
    waits *w = &all[me];
    w->have = true;
    int list[64], k;
    const char *eng = strstr(st, "\"engine\":{"), *call = after(st, eng, "\"direct\":{\"call\":\"");
    if (call) {
        char why[160];
        snprintf(why, sizeof(why), "in %.*s", (int)strcspn(call, "\""), call);
        const char *num = after(call, eng, "\"number\":"), *what = after(call, eng, "\"what\":\""),
                   *ps = after(call, eng, "\"process_set\":");
        if (num && what && ps) {
            w->pset = atoi(ps);
            w->number = atoll(num);
            snprintf(w->what, sizeof(w->what), "%.*s", (int)strcspn(what, "\""), what);
            snprintf(why, sizeof(why), "in %s, call %lld on process set %d", w->what, w->number, w->pset);
        }
        k = int_list(after(call, eng, WAIT_KEY), list, 64);
        for (int i = 0; i < k; i++) add_wait(w, list[i], why);
    }
    if (!eng) return;
    k = int_list(after(eng, NULL, WAIT_KEY), list, 64);
    for (int i = 0; i < k; i++) add_wait(w, list[i], "in the engine's exchange");
    for (const char *e = strstr(eng, "{\"name\":\""); e; e = strstr(e + 1, "{\"name\":\"")) {
        const char *end = strstr(e, "]}"), *name = e + 9;
        int by[64], nb = int_list(after(e, end, "\"submitted_by\":"), by, 64), mine = 0;
        for (int i = 0; i < nb; i++) mine |= by[i] == me;
        k = mine ? int_list(after(e, end ? end + 1 : NULL, "\"missing\":"), list, 64) : 0;
        char why[160];
        snprintf(why, sizeof(why), "to submit \"%.*s\"", (int)(strcspn(name, "\"") < 100 ? strcspn(name, "\"") : 100), name);
        for (int i = 0; i < k; i++) add_wait(w, list[i], why);
    }
}

/* Every waiting rank waits for another that waits too (a cycle): what the first pair of ranks in
 * direct collectives, one waiting for the other, differ in. A cycle the call tags do not catch
 * (no message crosses): broadcasts whose ranks name different roots, each waiting to receive;
 * calls on different process sets; a rank that made a call the other did not. */
static bool cycle_why(const waits *all, int size, char *out, size_t cap)
{
    for (int a = 0; a < size; a++) {
        const waits *x = &all[a];
        for (int i = 0; x->number && i < x->n; i++) {
            int b = x->on[i];
            const waits *y = b >= 0 && b < size ? &all[b] : NULL;
            if (!y || !y->number) continue;
            if (x->pset != y->pset)
                snprintf(out, cap,
                         "rank %d waits in %s on process set %d for rank %d, which is in %s on process set %d: the "
                         "ranks called collectives on different process sets, or in different orders",
                         a, x->what, x->pset, b, y->what, y->pset);
            else if (x->number != y->number)
                snprintf(out, cap,
                         "rank %d is in its call %lld on process set %d (%s) and rank %d in its call %lld (%s): one "
                         "rank made direct collectives the other did not",
                         a, x->number, x->pset, x->what, b, y->number, y->what);
            else if (strcmp(x->what, y->what) != 0)
                snprintf(out, cap, "rank %d called %s where rank %d called %s, both call %lld on process set %d: %s",
                         a, x->what, b, y->what, x->number, x->pset,
                         !strncmp(x->what, "kolo_broadcast", 14) && !strncmp(y->what, "kolo_broadcast", 14)
                             ? "the ranks passed different roots"
                             : "the ranks called different collectives");
            else continue;
            return true;
        }
    }
    return false;
}

/* One line per waiting rank, then the ranks the job waits on. */
static void say_waits(kr_rank *ranks, int n)
{
    int size = 0;
    for (int i = 0; i < n; i++) {
        const char *sz = after(ranks[i].status, NULL, "\"size\":");
        if (sz && atoi(sz) > size) size = atoi(sz);
    }
    if (size <= 0 || size > 65536) return;
    waits *all = calloc((size_t)size, sizeof(*all));
    bool *waited = calloc((size_t)size, 1);
    if (!all || !waited) {
        free(all);
        free(waited);
        return;
    }
    for (int i = 0; i < n; i++)
        if (ranks[i].status) read_waits(ranks[i].status, size, all);
    int said = 0;
    for (int r = 0; r < size; r++) {
        waits *w = &all[r];
        if (!w->n) continue;
        char on[128];
        size_t l = 0;
        for (int i = 0; i < w->n && l < sizeof(on) - 16; i++) {
            l += (size_t)snprintf(on + l, sizeof(on) - l, "%s%d", i ? ", " : "", w->on[i]);
            if (w->on[i] >= 0 && w->on[i] < size) waited[w->on[i]] = true;
        }
        if (said++ < 16) kr_say("kolo status: rank %d waits for rank%s %s (%s)", r, w->n > 1 ? "s" : "", on, w->why);
    }
    if (said > 16) kr_say("kolo status: %d more ranks wait", said - 16);
    int culprits = 0;
    for (int r = 0; r < size; r++) {
        if (!waited[r] || all[r].n) continue;
        culprits++;
        if (all[r].have)
            kr_say("kolo status: the job waits for rank %d: it waits for no rank in kolo (see where it is below)", r);
        else
            kr_say("kolo status: the job waits for rank %d, which gave no status (not in kolo_init's job yet, on "
                   "another host, or its process does not answer)", r);
    }
    if (said && !culprits) {
        char why[400];
        if (cycle_why(all, size, why, sizeof(why))) kr_say("kolo status: %s", why);
        else
            kr_say("kolo status: every waiting rank waits for another that waits too: the ranks called different "
                   "collectives, or the same in different orders");
    }
    free(all);
    free(waited);
}

void kr_dump_stacks(const kr_opts *o, kr_rank *ranks, int n, const char *unit)
{
    pid_t members[GROUP_MAX * 64];
    int count[64] = {0};
    int nw = 0, idx[64], sent = 0, statuses = 0;
    for (int i = 0; i < n && nw < 64; i++) {
        const kr_rank *r = &ranks[i];
        if (!r->running || r->pid <= 0 || !o->hosts[r->host].local) continue;
        idx[nw] = i;
        count[nw] = kr_group_members(r->pid, members + nw * GROUP_MAX, GROUP_MAX);
        for (int k = 0; k < count[nw]; k++) {
            pid_t p = members[nw * GROUP_MAX + k];
            if (catches(p, SIGUSR1) && kill(p, SIGUSR1) == 0) {
                statuses++;
                ranks[i].want_status = true;
            }
        }
        nw++;
    }
    char *mute = calloc((size_t)o->nhosts, 1); /* hosts that did not answer */
    for (int i = 0; i < n; i++) { /* remote workers: a short ssh each, the status on their stream */
        kr_rank *r = &ranks[i];
        if (!r->running || o->hosts[r->host].local || r->remote_pid <= 0 || r->err.fd < 0 || (mute && mute[r->host]))
            continue;
        int v = remote_status(o, r);
        if (v > 0) {
            statuses++;
            r->want_status = true;
        } else if (v < 0 && mute) {
            mute[r->host] = 1;
        }
    }
    free(mute);
    /* kolo's status first (KOLO_STATUS_SIGNAL=USR1, which the option exports): the collective
     * each rank is in and the ranks it waits for, on its stderr, read here as it comes (a rank
     * answers within half a second, its engine thread's share, on a crowded machine later: 5 s
     * at most), then who waits for whom. Before gdb, which stops the process it reads. */
    if (statuses) {
        kr_say("kolo status of the %d process%s that use%s kolo, on %s stderr:", statuses, statuses == 1 ? "" : "es",
               statuses == 1 ? "s" : "", statuses == 1 ? "its" : "their");
        for (double end = kr_now() + 5.0; kr_now() < end;) {
            struct pollfd pfd[256];
            kr_rank *who[256];
            int np = 0;
            for (int i = 0; i < n && np < 256; i++) {
                kr_rank *r = &ranks[i];
                if (r->want_status && r->err.fd >= 0) {
                    pfd[np] = (struct pollfd){.fd = r->err.fd, .events = POLLIN};
                    who[np++] = r;
                }
            }
            if (!np) break;
            if (poll(pfd, (nfds_t)np, 50) < 0 && errno != EINTR) break;
            for (int i = 0; i < np; i++)
                if (pfd[i].revents) kr_output_read(o, who[i], &who[i]->err);
        }
        say_waits(ranks, n);
        for (int i = 0; i < n; i++) {
            ranks[i].want_status = false;
            free(ranks[i].status);
            ranks[i].status = NULL;
        }
    }
    for (int w = 0; w < nw; w++)
        for (int k = 0; k < count[w]; k++) {
            pid_t p = members[w * GROUP_MAX + k];
            if (catches(p, SIGUSR2) && kill(p, SIGUSR2) == 0) sent++;
        }
    int nremote = 0;
    for (int i = 0; i < n; i++)
        nremote += ranks[i].running && !o->hosts[ranks[i].host].local && ranks[i].remote_pid > 0;
    if (nw + nremote == 0) return;
    kr_say("stacks of the %d %s%s still running%s:", nw + nremote, unit, nw + nremote == 1 ? "" : "s",
           sent || nremote ? " (Python workers that import kolo print theirs on their stderr)" : "");
    /* the job is stopped only after this: it gets STACKS_BUDGET_S in all, however many workers
     * hang and however many hosts do not answer */
    double budget_end = kr_now() + STACKS_BUDGET_S;
    bool have_gdb = true, out_of_time = false;
    for (int w = 0; w < nw && have_gdb && !out_of_time; w++) {
        const kr_rank *r = &ranks[idx[w]];
        char tag[32];
        snprintf(tag, sizeof(tag), "[%d]", r->rank);
        for (int k = 0; k < count[w] && have_gdb && !(out_of_time = kr_now() > budget_end); k++)
            have_gdb = gdb_stacks(members[w * GROUP_MAX + k], tag);
    }
    if (!have_gdb) kr_say("gdb is not installed: no native stacks (apt-get install gdb)");
    char *skip = calloc((size_t)o->nhosts, 1); /* hosts already found without gdb or not answering */
    for (int i = 0; i < n && !out_of_time; i++) {
        const kr_rank *r = &ranks[i];
        if (!r->running || o->hosts[r->host].local || r->remote_pid <= 0 || (skip && skip[r->host])) continue;
        if ((out_of_time = kr_now() > budget_end)) break;
        char tag[32];
        snprintf(tag, sizeof(tag), "[%d]", r->rank);
        int v = remote_stacks(o, r, tag);
        if (v == REMOTE_NO_GDB)
            kr_say("gdb is not installed on %s: no native stacks of its workers", o->hosts[r->host].name);
        else if (v == REMOTE_NO_ANSWER)
            kr_say("%s did not answer: its other workers' stacks are skipped", o->hosts[r->host].name);
        if (skip && v != REMOTE_OK) skip[r->host] = 1;
    }
    free(skip);
    if (out_of_time) kr_say("%g s spent on stacks: the remaining workers' are skipped", STACKS_BUDGET_S);
}
