/* main.c - kolorun: parse, place ranks, start the rendezvous store and the workers, supervise, clean up. */
#include "kolorun.h"

#include "../../src/boot/auth.h"
#include "../../src/boot/store.h"
#include "../../src/common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* A closed 0/1/2 would be handed to the first pipe we make and confuse everything after. */
static void ensure_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0) continue;
        int d = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (d >= 0 && d != fd) {
            dup2(d, fd);
            close(d);
        }
    }
}

int kr_job_grow(kr_job *j, int n)
{
    if (n <= j->cap) return 0;
    int cap = j->cap ? j->cap : 4;
    while (cap < n) cap *= 2;
    kr_rank *r = realloc(j->ranks, (size_t)cap * sizeof(*r));
    if (!r) return -1;
    memset(r + j->cap, 0, (size_t)(cap - j->cap) * sizeof(*r));
    j->ranks = r;
    for (int i = j->cap; i < cap; i++) {
        r[i].id = i;
        r[i].out.fd = r[i].err.fd = r[i].stdin_fd = -1;
        r[i].out.file_fd = r[i].err.file_fd = -1;
        r[i].err.is_err = true;
    }
    int old = j->cap;
    j->cap = cap;
    for (int i = old; i < cap; i++) {
        r[i].out.buf = malloc(KR_LINE_MAX);
        r[i].err.buf = malloc(KR_LINE_MAX);
        r[i].tail = calloc(KR_TAIL_LINES, sizeof(*r[i].tail));
        if (!r[i].out.buf || !r[i].err.buf || !r[i].tail) return -1;
    }
    return 0;
}

static void free_ranks(kr_rank *r, int n)
{
    if (!r) return;
    for (int i = 0; i < n; i++) {
        free(r[i].out.buf);
        free(r[i].err.buf);
        free(r[i].tail);
    }
    free(r);
}

int kr_start_worker(kr_job *j, int i, int size)
{
    const kr_opts *o = j->o;
    kr_rank *r = &j->ranks[i];
    const kr_host *h = &o->hosts[r->host];
    char rdv[128];
    snprintf(rdv, sizeof(rdv), "%s:%d", h->rdv_addr, j->port);
    if (r->round && kr_output_open_worker(o, r) != 0) return KR_EXIT_LAUNCH;
    if (r->round && h->local && o->bind_to != KR_BIND_NONE) {
        /* an elastic worker binds by its slot: the lowest that no live worker of this host holds,
         * since the round's local ranks move while the workers stay where they are */
        r->slot = 0;
        for (bool taken = true; taken; r->slot += taken) {
            taken = false;
            for (int k = 0; k < j->n; k++)
                if (k != i && j->ranks[k].running && j->ranks[k].host == r->host && j->ranks[k].slot == r->slot)
                    taken = true;
        }
        int lr = r->local_rank;
        r->local_rank = r->slot;
        int code = kr_bind_plan(o, r, 1);
        r->local_rank = lr;
        if (code) return code;
        if (o->report_bindings) kr_say("worker %d on %s: %s", r->id, h->name, r->bind_desc);
    }
    char **env = kr_env_build(o, r, size, rdv, j->secret, j->job_id);
    if (!env) {
        kr_say("error: out of memory building rank %d's environment", r->rank);
        return KR_EXIT_LAUNCH;
    }
    int code = kr_spawn(o, r, env, h->local ? j->exec_path : j->ssh_path, i == 0 && h->local);
    kr_env_free(env);
    if (!code) {
        kr_guard_add(j->guard_fd, r->pid);
        if (o->verbose) kr_say("rank %d on %s: pid %d", r->rank, h->name, (int)r->pid);
    } else {
        r->wstatus = (code & 0xff) << 8; /* as if it had exited so (127: not found): the job's code */
    }
    return code;
}

/* The command must exist before anything starts: a typo gives one line and exit 127,
 * not N identical failures. Remote hosts need ssh here; their command is checked there. */
static int check_commands(const kr_opts *o, const kr_rank *ranks, char *exec_path, size_t cap, char *ssh_path,
                          size_t ssh_cap)
{
    extern char **environ;
    if (o->discovery) {
        /* The hosts come later and may all be remote, where the command is looked for by the
         * remote shell: one missing here is said, not fatal. A worker started on this host then
         * fails to start and its slot is set aside, as for any worker that cannot start. ssh is
         * looked for, needed or not. */
        int r = kr_find_exec(o->cmd[0], environ, exec_path, cap);
        if (r) {
            kr_say("warning: %s here: '%s'; workers on remote hosts are not affected, a worker on this "
                   "host cannot start",
                   r == KR_EXIT_NOTFOUND ? "command not found" : "not an executable file", o->cmd[0]);
            snprintf(exec_path, cap, "%s", o->cmd[0]);
        }
        char first[256];
        snprintf(first, sizeof(first), "%.*s", (int)strcspn(o->ssh_cmd, " \t"), o->ssh_cmd);
        if (kr_find_exec(first, environ, ssh_path, ssh_cap) != 0) snprintf(ssh_path, ssh_cap, "%s", first);
        return 0;
    }
    bool any_local = false, any_remote = false;
    for (int i = 0; i < o->np; i++) {
        if (o->hosts[ranks[i].host].local) any_local = true;
        else any_remote = true;
    }
    if (any_local) {
        for (int i = 0; i < o->np; i++) {
            if (!o->hosts[ranks[i].host].local) continue;
            /* PATH as the worker will see it (-x PATH=... counts) */
            char **env = kr_env_build(o, &ranks[i], o->np, "", "", "");
            if (!env) {
                kr_say("error: out of memory");
                return KR_EXIT_LAUNCH;
            }
            int r = kr_find_exec(o->cmd[0], env, exec_path, cap);
            kr_env_free(env);
            if (r == KR_EXIT_NOTFOUND) {
                kr_say("error: command not found: '%s'%s", o->cmd[0],
                       strchr(o->cmd[0], '/') ? "" : " (searched PATH)");
                return r;
            }
            if (r == KR_EXIT_NOEXEC) {
                kr_say("error: '%s' is not an executable file (permission denied or a directory)", exec_path);
                return r;
            }
            break;
        }
    }
    if (any_remote) {
        char first[256];
        snprintf(first, sizeof(first), "%.*s", (int)strcspn(o->use_srun ? "srun" : o->ssh_cmd, " \t"),
                 o->use_srun ? "srun" : o->ssh_cmd);
        if (kr_find_exec(first, environ, ssh_path, ssh_cap) != 0) {
            kr_say("error: '%s' not found, but it is needed to start workers on remote hosts", first);
            return KR_EXIT_NOTFOUND;
        }
    }
    return 0;
}

static void report_bindings(const kr_opts *o, const kr_rank *ranks)
{
    for (int i = 0; i < o->np; i++) {
        const kr_host *h = &o->hosts[ranks[i].host];
        if (!h->local) kr_say("rank %d on %s: not bound (remote host)", i, h->name);
        else kr_say("rank %d on %s: %s", i, h->name, ranks[i].bind_desc);
    }
}

int main(int argc, char **argv)
{
    ensure_std_fds();
    kr_opts o;
    memset(&o, 0, sizeof(o));
    int code = kr_cli_parse(argc, argv, &o);
    if (code >= 0) {
        kr_opts_free(&o);
        return code;
    }
    code = o.discovery ? 0 : kr_hosts_resolve(&o); /* a discovery script names them later (elastic.c) */
    if (code) {
        kr_opts_free(&o);
        return code;
    }

    kr_job job = {.o = &o, .guard_fd = -1};
    if (kr_job_grow(&job, o.np) != 0) {
        kr_say("error: out of memory for %d ranks", o.np);
        free_ranks(job.ranks, job.cap);
        kr_opts_free(&o);
        return KR_EXIT_LAUNCH;
    }
    kr_rank *ranks = job.ranks;
    if (!o.discovery) kr_hosts_assign(&o, ranks); /* else round 1 places them (elastic.c) */

    static char exec_path[4096], ssh_path[4096];
    code = check_commands(&o, ranks, exec_path, sizeof(exec_path), ssh_path, sizeof(ssh_path));
    if (code) goto out_free;
    job.exec_path = exec_path;
    job.ssh_path = ssh_path;
    code = o.elastic ? 0 : kr_bind_plan(&o, ranks, o.np); /* elastic: each worker at its start */
    if (code) goto out_free;
    if (o.report_bindings && !o.elastic) report_bindings(&o, ranks);

    /* Room for what kolorun holds per worker (fds.c): the read ends of its stdout and stderr
     * pipes, the status pipe while it starts, its connection to the rendezvous store, and with
     * --output-filename two files, and the strangers' handshakes the store may hold; a stdin pipe
     * and the job's own descriptors are in the spare. */
    int most = o.elastic && o.max_np > o.np ? o.max_np : o.np;
    char who[96];
    snprintf(who, sizeof(who), "kolorun, for %d workers (%d per worker)", most, o.output_dir ? 6 : 4);
    if (kolo__fd_room((size_t)most * (o.output_dir ? 6 : 4) + 8 + KOLO_STORE_PENDING_MAX, who) != KOLO_OK) {
        kr_say("error: %s", kolo_last_error());
        code = KR_EXIT_LAUNCH;
        goto out_free;
    }

    /* Signals arrive through a signalfd in the poll loop. They are blocked before the store
     * server's thread exists, so that it inherits the mask and never takes one. */
    sigset_t mask;
    sigemptyset(&mask);
    int sigs[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(sigs); i++) sigaddset(&mask, sigs[i]);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0) {
        kr_say("error: signalfd: %s", strerror(errno));
        code = KR_EXIT_LAUNCH;
        goto out_free;
    }
    char rnd[80];
    if (kolo__secret_make(job.secret, sizeof(job.secret)) != 0 || kolo__secret_make(rnd, sizeof(rnd)) != 0) {
        kr_say("error: cannot make the job secret: %s", kolo_last_error());
        code = KR_EXIT_LAUNCH;
        close(sigfd);
        goto out_free;
    }
    snprintf(job.job_id, sizeof(job.job_id), "kolorun-%.40s-%d-%.8s", kr_hostname(), (int)getpid(), rnd);

    /* Orphans of workers (children of a shell that already exited) become ours to reap. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int guard_fd = kr_guard_start(job.job_id);
    if (guard_fd < 0) kr_say("warning: no guard process (%s): if kolorun is killed, grandchildren of workers may stay",
                             strerror(errno));
    job.guard_fd = guard_fd;

    bool any_remote = false;
    for (int h = 0; h < o.nhosts; h++) any_remote |= !o.hosts[h].local;

    /* Local-only jobs keep the store on loopback; with remote hosts (or hosts a discovery
     * script may name later) it listens everywhere and each host is told the address it
     * reaches us by. */
    kolo__store_server *store = NULL;
    if (kolo__store_server_start(&store, any_remote || o.discovery ? NULL : "127.0.0.1", 0, job.secret,
                                 strlen(job.secret)) != 0) {
        kr_say("error: cannot start the rendezvous store: %s", kolo_last_error());
        code = KR_EXIT_LAUNCH;
        goto out_guard;
    }
    int port = kolo__store_server_port(store);
    job.port = port;
    /* Workers publish the address of the interface that reaches the store (kolo's mesh), so
     * local workers of a job with remote hosts must not be sent to 127.0.0.1: the remote
     * ranks could not connect to them. They use the address the first remote host reaches. */
    const char *local_rdv = "127.0.0.1";
    for (int h = 0; h < o.nhosts; h++) {
        kr_host *host = &o.hosts[h];
        if (host->local) continue;
        if (kr_route_source(host->name, host->rdv_addr, sizeof(host->rdv_addr))) {
            if (!strcmp(local_rdv, "127.0.0.1")) local_rdv = host->rdv_addr;
        } else {
            /* ssh may know the name (its config) where we do not: let the host resolve ours */
            snprintf(host->rdv_addr, sizeof(host->rdv_addr), "%.60s", kr_hostname());
            kr_say("warning: no route to host %s from here; its workers will look for the store at %s:%d",
                   host->name, host->rdv_addr, port);
        }
    }
    if (o.local_addr[0]) local_rdv = o.local_addr;
    for (int h = 0; h < o.nhosts; h++)
        if (o.hosts[h].local) snprintf(o.hosts[h].rdv_addr, sizeof(o.hosts[h].rdv_addr), "%s", local_rdv);
    if (o.verbose) kr_say("rendezvous store on port %d, job %s", port, job.job_id);

    int launch_code = 0;
    o.t_launch = kr_now();
    if (o.elastic) {
        job.n = 0; /* round 1 places its own workers */
        launch_code = kr_elastic_setup(&job, sigfd);
        if (launch_code && job.n == 0) { /* nothing started: no supervision needed */
            code = launch_code;
            kr_elastic_finish(&job, false);
            kolo__store_server_stop(store);
            goto out_guard;
        }
    } else {
        job.n = o.np;
        code = kr_output_open_files(&o, ranks, o.np);
        launch_code = code;
        for (int i = 0; i < o.np && !launch_code; i++) launch_code = kr_start_worker(&job, i, o.np);
    }
    code = kr_supervise(&job, sigfd, launch_code);
    if (job.el) kr_elastic_finish(&job, true);
    kolo__store_server_stop(store);

out_guard:
    kr_guard_done(guard_fd);
    /* reap what kill(-group) left as zombies of ours (subreaper), and end what the workers left
     * running in sessions of their own */
    kr_end_leftovers(o.grace, job.job_id);
    close(sigfd);
out_free:
    free_ranks(job.ranks, job.cap);
    kr_opts_free(&o);
    return code;
}
