/* spawn.c - starting workers: fork/exec here, ssh for other hosts, and the guard that outlives a killed kolorun.
 *
 * Local worker: fork; in the child (only async-signal-safe calls: the store server's thread
 * exists) reset signals, make a process group of its own (so that kolorun can signal the
 * worker and everything it starts), PR_SET_PDEATHSIG=SIGKILL then check getppid() (kolorun
 * may have died before prctl), connect the pipes, bind CPUs, mark every other fd
 * close-on-exec, execve. A CLOEXEC pipe reports an execve failure to the parent.
 *
 * Remote worker: the same, running `ssh host '<remote command>'`. The remote command goes to
 * the working directory, sets the environment with env(1) and runs a small POSIX sh wrapper
 * (below) that starts the command in a new session and watches its own stdin, which is the
 * ssh connection: kolorun writes nothing there but "stop" and "cont" lines (Ctrl-Z and fg,
 * passed on as SIGSTOP and SIGCONT to the command's group); when the connection drops (kolorun
 * or ssh killed, network gone) the watcher's `read` sees end of file and the wrapper SIGTERMs
 * the command's process group, waits the grace period and SIGKILLs it. kolorun keeps the write
 * end of ssh's stdin open for the whole job, so the remote stdin closes exactly when kolorun (or
 * its ssh) goes away.
 *
 * Guard: a process forked before anything else, in a process group of its own, that knows
 * every worker's process group. kolorun says goodbye (a 0) when it ends normally; if its pipe
 * closes without that (kolorun got SIGKILL) the guard SIGKILLs every group, then every process
 * whose environment holds this job's KOLO_JOB_ID (what workers started in sessions of their
 * own, which kolorun's end would have found as its children). PDEATHSIG alone only reaches
 * each worker's first process, not the shell's children. */
#include "kolorun.h"

#include "../../src/boot/auth.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

const char kr_start_marker[] = "\x01kolorun-remote-started\x01";

static const int reset_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD};

/* ---- guard ---- */

static pid_t guard_pid;

/* SIGKILLs every other process whose environment holds `want`; how many it found. */
static int kill_marked(const char *want)
{
    int found = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || !kr_environ_has(pid, want)) continue;
        kill((pid_t)pid, SIGKILL);
        found++;
    }
    closedir(d);
    return found;
}

__attribute__((noreturn)) static void guard_main(int rfd, const char *job_id)
{
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
    }
    for (size_t i = 0; i < sizeof(reset_signals) / sizeof(reset_signals[0]); i++)
        signal(reset_signals[i], SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    pid_t *groups = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        int32_t msg;
        ssize_t r = read(rfd, &msg, sizeof(msg));
        if (r < 0 && errno == EINTR) continue;
        if (r != (ssize_t)sizeof(msg)) break; /* kolorun is gone without saying goodbye */
        if (msg == 0) _exit(0);
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            pid_t *g = realloc(groups, cap * sizeof(*g));
            if (!g) break; /* cannot remember more: act now rather than miss one later */
            groups = g;
        }
        groups[n++] = (pid_t)msg;
    }
    for (size_t i = 0; i < n; i++) kill(-groups[i], SIGKILL);
    /* and what the workers started in sessions or groups of their own, by the job id they
     * inherited (a few passes: a process being forked as the first ran may have escaped it) */
    char want[128];
    snprintf(want, sizeof(want), "KOLO_JOB_ID=%s", job_id);
    for (int pass = 0; pass < 5 && kill_marked(want) > 0; pass++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    _exit(0);
}

int kr_guard_start(const char *job_id)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[1]);
        setpgid(0, 0); /* not in kolorun's group: a Ctrl-C or kill of that group spares it */
        guard_main(p[0], job_id);
    }
    setpgid(pid, pid);
    close(p[0]);
    guard_pid = pid;
    return p[1];
}

void kr_guard_add(int guard_fd, pid_t pgid)
{
    int32_t msg = (int32_t)pgid;
    if (guard_fd >= 0) (void)kr_write_all(guard_fd, &msg, sizeof(msg));
}

void kr_guard_done(int guard_fd)
{
    if (guard_fd < 0) return;
    int32_t msg = 0;
    (void)kr_write_all(guard_fd, &msg, sizeof(msg));
    close(guard_fd);
    if (guard_pid > 0) {
        int st;
        while (waitpid(guard_pid, &st, 0) < 0 && errno == EINTR) {}
    }
}

/* ---- the remote wrapper ----
 * $1: the grace period in half-seconds, $2: the heartbeat timeout in seconds (0: none), then the
 * command. fd 3 keeps the ssh connection's stdin for the watcher (an asynchronous list's stdin is
 * /dev/null unless redirected explicitly). The watcher: read lines ("stop", "cont": SIGSTOP,
 * SIGCONT to the command's group; "beat": kolorun is there) until end of file, then end the
 * command ($E: SIGTERM the command's group, poll every half second until it is gone, SIGKILL it
 * when the grace period is over). The wrapper kills the watcher once the command has ended, and
 * exits with the command's status (128+N when a signal killed it: sh cannot re-raise it across
 * ssh). The start marker carries the command's pid there (its process group's, by setsid), for
 * --get-stack-traces (stacks.c).
 * The heartbeat: end of file comes only where the connection ends cleanly. A machine cut off from
 * kolorun's (its network down, kolorun's machine gone) hears nothing more, and its sshd learns that
 * the session is gone only from its own TCP keepalive, two hours by default: a worker there that
 * never called kolo again (or a program that does not use kolo) outlived the job. kolorun writes
 * "beat" every quarter of the timeout (supervise.c); the watcher marks every line in a file, and
 * the checker, after a first timeout, looks every half timeout: a half without a line ends the
 * command as end of file does. "stop" pauses the check until "cont" (Ctrl-Z stops kolorun, and
 * its beats, too). Without mktemp there is no check.
 * Before it exits, the wrapper ends what the command left running in sessions or groups of its
 * own (setsid, daemons), which no signal to the command's group reaches and kolorun, not their
 * subreaper there, cannot see: every process whose environment holds this worker's
 * KOLORUN_MARK (a random value kolorun sets per remote worker; the wrapper's own, and those of
 * its finished pipeline, excepted), SIGTERM, then SIGKILL after the grace period. It needs
 * GNU grep's -z; without it nothing is swept. The watcher and the checker carry the mark too,
 * and are SIGKILLed just before: the sweep skips their process groups (/proc/PID/stat's fifth
 * field), or it took them, still dying, for the worker's leftovers, said so, and reported the
 * worker's end 0.5 s later (a CI run: a local rank's own error came first, and was blamed for
 * the job). Waiting for those groups to go instead waited on their SIGKILLed sleeps, zombies
 * until their subreaper reaps them. */
static const char remote_wrapper[] =
    "g=$1; b=$2; shift 2\n"
    "exec 3<&0\n"
    "S=; command -v setsid >/dev/null 2>&1 && S=setsid\n"
    "$S \"$@\" 3<&- </dev/null &\n"
    "c=$!\n"
    "E='kill -TERM -$1 $1 2>/dev/null; n=0; while kill -0 -$1 2>/dev/null || kill -0 $1 2>/dev/null; do "
    "[ $n -ge $2 ] && { kill -KILL -$1 $1 2>/dev/null; break; }; sleep 0.5; n=$((n+1)); done'\n"
    "f=; [ \"$b\" -gt 0 ] 2>/dev/null && f=$(mktemp 2>/dev/null)\n"
    "$S sh -c 'while IFS= read -r l; do [ -z \"$3\" ] || : > \"$3\"; case $l in "
    "stop) [ -z \"$3\" ] || : > \"$3.stop\"; kill -STOP -$1 $1;; cont) rm -f \"$3.stop\"; kill -CONT -$1 $1;; esac; "
    "done; eval \"$4\"' "
    "kolorun-watch $c $g \"$f\" \"$E\" <&3 >/dev/null 2>&1 &\n"
    "w=$!\n"
    "exec 3<&-\n"
    "k=\n"
    "if [ -n \"$f\" ]; then\n"
    "  $S sh -c 'p=$(( ($5 + 1) / 2 )); sleep $5; while [ -e \"$3.stop\" ] || [ -e \"$3\" ]; do rm -f \"$3\"; "
    "sleep $p; done; kill -KILL -$6 $6 2>/dev/null; eval \"$4\"' "
    "kolorun-beat $c $g \"$f\" \"$E\" $b $w >/dev/null 2>&1 &\n"
    "  k=$!\n"
    "fi\n"
    "trap 'kill -TERM -$c $c 2>/dev/null' TERM HUP INT\n"
    "printf '\\001kolorun-remote-started\\001%s\\n' \"$c\"\n"
    "while :; do wait $c; s=$?; kill -0 $c 2>/dev/null || break; done\n"
    "kill -KILL -$w $w 2>/dev/null\n"
    "[ -z \"$k\" ] || kill -KILL -$k $k 2>/dev/null\n"
    "[ -z \"$f\" ] || rm -f \"$f\" \"$f.stop\"\n"
    "n=0; t=\n"
    "while :; do m=$(grep -lzx \"KOLORUN_MARK=$KOLORUN_MARK\" /proc/[0-9]*/environ 2>/dev/null)\n"
    "  l=; for f in $m; do p=${f#/proc/}; p=${p%/environ}; q=; read -r q 2>/dev/null < /proc/$p/stat; q=${q##*) }\n"
    "    set -- $q; [ \"$p\" != $$ ] && [ \"$3\" != \"$w\" ] && [ \"$3\" != \"${k:-$w}\" ] &&\n"
    "      kill -0 \"$p\" 2>/dev/null && l=\"$l $p\"; done\n"
    "  [ -z \"$l\" ] && break\n"
    "  [ -z \"$t\" ] && { t=1; echo \"kolorun: the worker left processes running in a session or group of their own on "
    "$(uname -n): pids$l; terminating them, as the worker is over\" >&2; }\n"
    "  if [ $n -ge $g ]; then kill -KILL $l 2>/dev/null; else kill -TERM $l 2>/dev/null; fi\n"
    "  [ $n -gt $((g + 4)) ] && break; sleep 0.5; n=$((n+1))\n"
    "done\n"
    "exit $s\n";

typedef struct {
    char **v;
    int n;
} argvec;

static bool arg_push(argvec *a, char *s)
{
    if (!s) return false;
    char **g = realloc(a->v, (size_t)(a->n + 2) * sizeof(char *));
    if (!g) {
        free(s);
        return false;
    }
    a->v = g;
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
    return true;
}

static void arg_free(argvec *a)
{
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

/* Appends s to *buf (growing). */
static bool cat(char **buf, size_t *len, const char *s)
{
    if (!s) return false;
    size_t n = strlen(s);
    char *g = realloc(*buf, *len + n + 2);
    if (!g) return false;
    *buf = g;
    memcpy(*buf + *len, s, n + 1);
    *len += n;
    return true;
}

static bool cat_quoted(char **buf, size_t *len, const char *s)
{
    char *q = kr_shell_quote(s);
    bool ok = q && cat(buf, len, " ") && cat(buf, len, q);
    free(q);
    return ok;
}

/* srun --nodes=1 --ntasks=1 --nodelist=host --overlap ... /bin/sh -c, into a: the remote command
 * runs as a step of the Slurm job kolorun runs in. --overlap lets the steps of one node share its
 * CPUs (one step per worker); srun forwards stdin (the wrapper's lifeline), stdout, stderr and the
 * exit status, and Slurm ends the step when srun goes. */
static bool srun_base(const kr_opts *o, int host, argvec *a)
{
    char nodelist[KR_HOST_MAX + 16];
    snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", o->hosts[host].name);
    return arg_push(a, strdup("srun")) && arg_push(a, strdup("--nodes=1")) && arg_push(a, strdup("--ntasks=1")) &&
           arg_push(a, strdup(nodelist)) && arg_push(a, strdup("--overlap")) && arg_push(a, strdup("--quiet")) &&
           arg_push(a, strdup("--job-name=kolorun")) && arg_push(a, strdup("/bin/sh")) && arg_push(a, strdup("-c"));
}

int kr_beat_timeout(const kr_opts *o)
{
    size_t n;
    const char *v = kr_worker_setting(o, "KOLO_TCP_KEEPALIVE");
    const char *def = kolo__setting_table(&n)[KOLO_SET_TCP_KEEPALIVE].def;
    char *end;
    double t = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end) t = strtod(def, NULL);
    if (!(t >= 1)) return 0;
    return t > 86400 ? 86400 : t < 4 ? 4 : (int)t;
}

/* ssh's keepalive interval for the workers' sessions, in seconds (0: none): a quarter of
 * KOLO_TCP_KEEPALIVE as the workers read it (kr_beat_timeout), so that ssh gives up on a machine
 * that went down or was cut off (4 unanswered messages, "Timeout, server ... not responding",
 * exit 255) about when the workers' own connections to it do. A job whose workers talk to that
 * machine learns of it from them; one whose workers are all busy outside kolo (an evaluation, a
 * checkpoint) waited on its session for ssh's system default, two hours of TCP keepalive, or for
 * ever. */
static int ssh_alive_interval(const kr_opts *o) { return kr_beat_timeout(o) / 4; }

/* ssh [--ssh words] -T -o BatchMode=yes -o ConnectTimeout=T -o StrictHostKeyChecking=accept-new
 * [-o ServerAliveInterval=I -o ServerAliveCountMax=4] [-p P] [-i F] host, into a.
 * Options of --ssh come first: ssh keeps the first value it sees for an option. With srun as the
 * launcher, srun_base instead: either way the remote shell command comes next. */
static bool ssh_base(const kr_opts *o, int host, argvec *a)
{
    if (o->use_srun) return srun_base(o, host, a);
    char *words = strdup(o->ssh_cmd);
    if (!words) return false;
    bool ok = true;
    for (char *save = NULL, *w = strtok_r(words, " \t", &save); w && ok; w = strtok_r(NULL, " \t", &save))
        ok = arg_push(a, strdup(w));
    free(words);
    char ct[64];
    snprintf(ct, sizeof(ct), "ConnectTimeout=%d", (int)(o->start_timeout < 1 ? 1 : o->start_timeout));
    ok = ok && arg_push(a, strdup("-T")) && arg_push(a, strdup("-o")) && arg_push(a, strdup("BatchMode=yes")) &&
         arg_push(a, strdup("-o")) && arg_push(a, strdup(ct)) && arg_push(a, strdup("-o")) &&
         arg_push(a, strdup("StrictHostKeyChecking=accept-new"));
    int alive = ssh_alive_interval(o);
    if (ok && alive) {
        char iv[48];
        snprintf(iv, sizeof(iv), "ServerAliveInterval=%d", alive);
        ok = arg_push(a, strdup("-o")) && arg_push(a, strdup(iv)) && arg_push(a, strdup("-o")) &&
             arg_push(a, strdup("ServerAliveCountMax=4"));
    }
    if (ok && o->ssh_port) {
        char port[16];
        snprintf(port, sizeof(port), "%d", o->ssh_port);
        ok = arg_push(a, strdup("-p")) && arg_push(a, strdup(port));
    }
    if (ok && o->ssh_identity) ok = arg_push(a, strdup("-i")) && arg_push(a, strdup(o->ssh_identity));
    return ok && arg_push(a, strdup(o->hosts[host].name));
}

char **kr_ssh_argv(const kr_opts *o, int host, const char *remote_cmd)
{
    argvec a = {NULL, 0};
    if (ssh_base(o, host, &a) && arg_push(&a, strdup(remote_cmd))) return a.v;
    arg_free(&a);
    return NULL;
}

void kr_argv_free(char **argv)
{
    argvec a = {argv, 0};
    while (argv && argv[a.n]) a.n++;
    arg_free(&a);
}

/* ssh ... host 'cd DIR; exec env VARS /bin/sh -c WRAPPER kolorun-wrap GRACE BEAT command...' */
static bool build_ssh_argv(const kr_opts *o, const kr_rank *r, char **env, argvec *a)
{
    bool ok = ssh_base(o, r->host, a);
    char cwd[4096];
    if (!getcwd(cwd, sizeof(cwd))) snprintf(cwd, sizeof(cwd), ".");
    char *cmd = NULL;
    size_t len = 0;
    char *qcwd = kr_shell_quote(cwd);
    char grace[32], beat[32];
    snprintf(grace, sizeof(grace), "%ld", (long)(o->grace * 2 + 0.999));
    snprintf(beat, sizeof(beat), "%d", kr_beat_timeout(o));
    /* Like Open MPI: a missing directory on the remote host is a warning, and the worker
     * runs in the home directory there. */
    /* A Slurm step's task inherits srun's SLURM_* (and the site's PMI_*) variables, which would
     * describe a job of one task: frameworks that read them (torch, Lightning) must see only
     * kolorun's job. */
    if (o->use_srun)
        ok = ok && cat(&cmd, &len, "for v in $(env | sed -n 's/^\\(SLURM_[A-Za-z0-9_]*\\|PMIX\\{0,1\\}_[A-Za-z0-9_]*\\)=.*/\\1/p'); "
                                   "do unset \"$v\"; done; ");
    ok = ok && qcwd && cat(&cmd, &len, "cd ") && cat(&cmd, &len, qcwd) &&
         cat(&cmd, &len, " 2>/dev/null || { echo \"kolorun: warning: no directory ") && cat(&cmd, &len, qcwd) &&
         cat(&cmd, &len, " on $(hostname); running in $HOME\" >&2; cd; }; exec env");
    free(qcwd);
    for (char **e = env; ok && e && *e; e++) ok = cat_quoted(&cmd, &len, *e);
    char mark[80] = "KOLORUN_MARK=";
    ok = ok && kolo__secret_make(mark + 13, sizeof(mark) - 13) == 0 && cat_quoted(&cmd, &len, mark);
    ok = ok && cat(&cmd, &len, " /bin/sh -c") && cat_quoted(&cmd, &len, remote_wrapper) &&
         cat(&cmd, &len, " kolorun-wrap") && cat_quoted(&cmd, &len, grace) && cat_quoted(&cmd, &len, beat);
    for (int i = 0; ok && i < o->ncmd; i++) ok = cat_quoted(&cmd, &len, o->cmd[i]);
    if (ok) ok = arg_push(a, cmd);
    else free(cmd);
    return ok;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Runs in the forked child: async-signal-safe calls only. Never returns. */
__attribute__((noreturn)) static void child(pid_t parent, int in_fd, int out_fd, int err_fd, int status_fd, const kr_rank *r,
                  const char *path, char **argv, char **env)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof(reset_signals) / sizeof(reset_signals[0]); i++)
        sigaction(reset_signals[i], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(KR_EXIT_LAUNCH);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
        int e = errno;
        (void)!write(status_fd, &e, sizeof(e));
        _exit(KR_EXIT_LAUNCH);
    }
    if (r->bound) (void)sched_setaffinity(0, sizeof(r->cpus), &r->cpus);
    /* Whatever another part of kolorun (or a library) opened without O_CLOEXEC stays here. */
    (void)syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    execve(path, argv, env);
    int e = errno;
    (void)!write(status_fd, &e, sizeof(e));
    _exit(e == ENOENT ? KR_EXIT_NOTFOUND : KR_EXIT_NOEXEC);
}

int kr_spawn(const kr_opts *o, kr_rank *r, char **env, const char *exec_path, bool give_stdin)
{
    bool remote = !o->hosts[r->host].local;
    argvec a = {0};
    char **argv = o->cmd;
    if (remote) {
        if (!build_ssh_argv(o, r, env, &a)) {
            arg_free(&a);
            kr_say("error: out of memory building the ssh command for rank %d", r->rank);
            return KR_EXIT_LAUNCH;
        }
        argv = a.v;
    }
    int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, st[2] = {-1, -1};
    int code = KR_EXIT_LAUNCH;
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(st, O_CLOEXEC)) {
        kr_say("error: rank %d: pipe: %s", r->rank, strerror(errno));
        goto err_close;
    }
    /* stdin: rank 0 (local) reads what kolorun forwards; a remote worker's ssh gets a pipe
     * kept open as the lifeline; every other worker reads /dev/null. */
    if (give_stdin || remote) {
        if (pipe2(in, O_CLOEXEC)) {
            kr_say("error: rank %d: pipe: %s", r->rank, strerror(errno));
            goto err_close;
        }
    } else {
        in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in[0] < 0) {
            kr_say("error: /dev/null: %s", strerror(errno));
            goto err_close;
        }
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        kr_say("error: rank %d: fork: %s", r->rank, strerror(errno));
        goto err_close;
    }
    /* srun itself needs this job's SLURM_* variables (the worker's own environment travels in
     * its command line) */
    extern char **environ;
    if (pid == 0) child(parent, in[0], out[1], err[1], st[1], r, exec_path, argv, remote && o->use_srun ? environ : env);

    setpgid(pid, pid); /* both sides set it, so that it holds whoever runs first */
    close(out[1]);
    close(err[1]);
    close(in[0]);
    close(st[1]);
    out[1] = err[1] = in[0] = st[1] = -1;
    int e = 0;
    ssize_t n;
    while ((n = read(st[0], &e, sizeof(e))) < 0 && errno == EINTR) {}
    close(st[0]);
    st[0] = -1;
    if (n == (ssize_t)sizeof(e)) { /* execve failed: the child exits at once */
        int ws;
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {}
        code = e == ENOENT ? KR_EXIT_NOTFOUND : KR_EXIT_NOEXEC;
        kr_say("error: rank %d: cannot run '%s': %s", r->rank, exec_path, strerror(e));
        goto err_close;
    }
    r->pid = pid;
    r->last_output = kr_now();
    r->running = true;
    r->out.fd = out[0];
    r->err.fd = err[0];
    r->stdin_fd = in[1];
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    if (in[1] >= 0) set_nonblock(in[1]);
    arg_free(&a);
    return 0;

err_close:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0) close(out[i]);
        if (err[i] >= 0) close(err[i]);
        if (in[i] >= 0) close(in[i]);
        if (st[i] >= 0) close(st[i]);
    }
    arg_free(&a);
    return code;
}

/* ---- helpers kolorun runs itself (a discovery script, gdb) ---- */

pid_t kr_capture_start(kr_capture *c, int *fd)
{
    c->len = -1;
    *fd = -1;
    int p[2];
    if (c->cap == 0 || pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        /* kolorun blocks the signals it reads through signalfd, and ignores some: not for this */
        for (size_t i = 0; i < sizeof(reset_signals) / sizeof(reset_signals[0]); i++) signal(reset_signals[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setpgid(0, 0); /* a group of its own: a Ctrl-C meant for the job does not reach it, a timeout kills all of it */
        dup2(p[1], 1);
        if (c->with_stderr) dup2(p[1], 2);
        int dn = open("/dev/null", O_RDONLY);
        if (dn >= 0) dup2(dn, 0);
        execvp(c->argv[0], (char *const *)c->argv);
        _exit(127);
    }
    close(p[1]);
    set_nonblock(p[0]);
    *fd = p[0];
    c->len = 0;
    c->out[0] = '\0';
    return pid;
}

bool kr_capture_read(kr_capture *c, int fd)
{
    for (;;) {
        ssize_t k = read(fd, c->out + c->len, c->cap - 1 - (size_t)c->len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) return true;
        if (k > 0) c->len += k;
        c->out[c->len] = '\0';
        if (k <= 0 || (size_t)c->len == c->cap - 1) return false; /* the end, or full: the rest is not read */
    }
}

ssize_t kr_run_capture(const char *const *argv, bool with_stderr, double timeout_s, char *out, size_t cap,
                       int *status, bool *timed_out)
{
    kr_capture c = {.argv = argv, .with_stderr = with_stderr, .out = out, .cap = cap};
    int fd;
    pid_t pid = kr_capture_start(&c, &fd);
    *status = 0;
    *timed_out = false;
    if (pid < 0) return -1;
    double deadline = kr_now() + timeout_s;
    for (bool more = true; more;) {
        double left = deadline - kr_now();
        if (left <= 0) {
            *timed_out = true;
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, (int)(left * 1000) + 1) > 0) more = kr_capture_read(&c, fd);
    }
    close(fd);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
    }
    return c.len;
}
