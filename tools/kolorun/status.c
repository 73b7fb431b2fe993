/* status.c - --status-file: the job's state as JSON, for health checks and dashboards.
 *
 * kolorun rewrites the file whenever a worker starts or ends or the job changes phase, and at
 * least once a second while it runs (so that readers see the output idle times move); the
 * last write has the exit code. Each write goes to PATH.tmp and is renamed over PATH, so a
 * reader never sees half a file. The shape (docs/kolorun.md, "Status file"):
 *
 *   {"version": 1, "kolorun_pid": 4242, "state": "running", "elapsed_s": 12.3, "workers_running": 2,
 *    "exit_code": null, "reason": null, "elastic_round": 0,
 *    "workers": [{"rank": 0, "id": 0, "host": "localhost", "pid": 4245, "state": "running",
 *                 "exit_code": null, "signal": null, "output_idle_s": 0.4}, ...]}
 *
 * Job states: running, stopping (a failure, a signal or --timeout: the others are being
 * terminated), done. Worker states: starting (remote, not yet started by its wrapper), running,
 * exited (code 0), failed, terminated (by kolorun), lost and removed (elastic), not_started. */
#include "kolorun.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static const char *worker_state(const kr_opts *o, const kr_rank *r)
{
    if (r->pid <= 0) return "not_started";
    if (r->running) return o->hosts[r->host].local || r->started ? "running" : "starting";
    if (r->removed) return "removed";
    if (r->lost) return "lost";
    if (r->failed) return "failed";
    if (r->terminated) return "terminated";
    return WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) == 0 ? "exited" : "failed";
}

void kr_status_write(const kr_job *j, const char *state, int exit_code, const char *reason, double elapsed)
{
    const kr_opts *o = j->o;
    if (!o->status_file) return;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->status_file);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        static bool said;
        if (!said) kr_say("warning: --status-file: cannot write '%s': %s", tmp, strerror(errno));
        said = true;
        return;
    }
    int running = 0;
    for (int i = 0; i < j->n; i++) running += j->ranks[i].running;
    double now = kr_now();
    fprintf(f, "{\"version\": 1, \"kolorun_pid\": %d, \"state\": ", (int)getpid());
    put_str(f, state);
    fprintf(f, ", \"elapsed_s\": %.3f, \"workers_running\": %d, \"exit_code\": ", elapsed, running);
    if (exit_code >= 0) fprintf(f, "%d", exit_code);
    else fputs("null", f);
    fputs(", \"reason\": ", f);
    if (reason && *reason) put_str(f, reason);
    else fputs("null", f);
    fprintf(f, ", \"elastic_round\": %d,\n \"workers\": [", kr_elastic_round(j));
    for (int i = 0; i < j->n; i++) {
        const kr_rank *r = &j->ranks[i];
        fprintf(f, "%s\n  {\"rank\": %d, \"id\": %d, \"host\": ", i ? "," : "", r->rank, r->id);
        put_str(f, o->hosts[r->host].name);
        fprintf(f, ", \"pid\": %d, \"state\": ", (int)r->pid);
        put_str(f, worker_state(o, r));
        fputs(", \"exit_code\": ", f);
        bool ended = r->pid > 0 && !r->running;
        if (ended && WIFEXITED(r->wstatus)) fprintf(f, "%d", WEXITSTATUS(r->wstatus));
        else fputs("null", f);
        fputs(", \"signal\": ", f);
        if (ended && WIFSIGNALED(r->wstatus)) {
            const char *abbrev = sigabbrev_np(WTERMSIG(r->wstatus));
            char name[32];
            snprintf(name, sizeof(name), "SIG%s", abbrev ? abbrev : "?");
            put_str(f, name);
        } else {
            fputs("null", f);
        }
        fputs(", \"output_idle_s\": ", f);
        if (r->pid > 0 && r->running) fprintf(f, "%.3f", now - r->last_output);
        else fputs("null", f);
        fputc('}', f);
    }
    fputs("\n]}\n", f);
    bool ok = fflush(f) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, o->status_file) != 0) {
        static bool said;
        if (!said) kr_say("warning: --status-file: cannot write '%s': %s", o->status_file, strerror(errno));
        said = true;
        unlink(tmp);
    }
}
