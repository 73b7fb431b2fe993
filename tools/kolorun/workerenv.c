/* workerenv.c - each worker's environment (rank variables in kolo's, Horovod's and torch's names) and PATH lookup. */
#include "kolorun.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    char **v;
    size_t n, cap;
    bool oom;
} strvec;

static void push(strvec *s, char *kv)
{
    if (!kv) {
        s->oom = true;
        return;
    }
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char **g = realloc(s->v, cap * sizeof(*g));
        if (!g) {
            free(kv);
            s->oom = true;
            return;
        }
        s->v = g;
        s->cap = cap;
    }
    s->v[s->n++] = kv;
    s->v[s->n] = NULL;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *out = NULL;
    if (vasprintf(&out, f, ap) < 0) out = NULL;
    va_end(ap);
    return out;
}

static size_t name_len(const char *kv) { return strcspn(kv, "="); }

/* Removes every earlier entry with kv's name, so that the last word wins. */
static void set_var(strvec *s, char *kv)
{
    if (!kv) {
        s->oom = true;
        return;
    }
    size_t nl = name_len(kv);
    for (size_t i = 0; i < s->n;) {
        if (name_len(s->v[i]) == nl && strncmp(s->v[i], kv, nl) == 0) {
            free(s->v[i]);
            memmove(&s->v[i], &s->v[i + 1], (s->n - i) * sizeof(char *)); /* moves the NULL too */
            s->n--;
        } else {
            i++;
        }
    }
    push(s, kv);
}

/* Remote workers get kolo's and Horovod's variables from our environment, not all of it:
 * PATH, HOME, SSH_* and the like belong to the remote machine (Open MPI's rule). Use -x
 * for anything else. */
static bool exported_remote(const char *kv)
{
    return strncmp(kv, "KOLO_", 5) == 0 || strncmp(kv, "HOROVOD_", 8) == 0;
}

char **kr_env_build(const kr_opts *o, const kr_rank *r, int size, const char *rdv, const char *secret,
                    const char *job_id)
{
    strvec s = {0};
    const kr_host *h = &o->hosts[r->host];
    bool remote = !h->local;
    for (char **e = environ; e && *e; e++) {
        if (!strchr(*e, '=')) continue;
        if (remote && !exported_remote(*e)) continue;
        push(&s, strdup(*e));
    }
    /* Python buffers a pipe's output in 8 KiB blocks: lines would arrive late and out of
     * order with stderr. Horovod sets this too; -x PYTHONUNBUFFERED= overrides. */
    if (!getenv("PYTHONUNBUFFERED")) set_var(&s, strdup("PYTHONUNBUFFERED=1"));

    int hosts_used = 0;
    for (int i = 0, filled = 0; i < o->nhosts && filled < size; i++, hosts_used++) filled += o->hosts[i].slots;
    const char *hostname = h->name;
    if (!o->hosts_arg && !o->hostfile) hostname = kr_hostname();

    static const char *const pre[] = {"KOLO_", "HOROVOD_"};
    for (size_t p = 0; p < 2; p++) {
        set_var(&s, fmt("%sRANK=%d", pre[p], r->rank));
        set_var(&s, fmt("%sSIZE=%d", pre[p], size));
        set_var(&s, fmt("%sLOCAL_RANK=%d", pre[p], r->local_rank));
        set_var(&s, fmt("%sLOCAL_SIZE=%d", pre[p], r->local_size));
        set_var(&s, fmt("%sCROSS_RANK=%d", pre[p], r->cross_rank));
        set_var(&s, fmt("%sCROSS_SIZE=%d", pre[p], r->cross_size));
        set_var(&s, fmt("%sHOSTNAME=%s", pre[p], hostname));
    }
    set_var(&s, fmt("KOLO_RENDEZVOUS=%s", rdv));
    set_var(&s, fmt("KOLO_SECRET=%s", secret));
    set_var(&s, fmt("KOLO_JOB_ID=%s", job_id));
    /* torchrun's names. GROUP_RANK is the index of this host (hosts fill in order, so it is
     * the host index). MASTER_ADDR/MASTER_PORT are deliberately not set: torch.distributed
     * would open its own TCPStore there (rank 0 binding the port), and neither our store's
     * port (another protocol, already bound) nor a guessed free port would be right.
     * Pass -x MASTER_ADDR=... -x MASTER_PORT=... to use torch.distributed alongside kolo. */
    set_var(&s, fmt("RANK=%d", r->rank));
    set_var(&s, fmt("WORLD_SIZE=%d", size));
    set_var(&s, fmt("LOCAL_RANK=%d", r->local_rank));
    set_var(&s, fmt("LOCAL_WORLD_SIZE=%d", r->local_size));
    set_var(&s, fmt("GROUP_RANK=%d", r->host));
    set_var(&s, fmt("GROUP_WORLD_SIZE=%d", hosts_used));

    if (r->round) {
        /* an elastic worker: kolo_init asks the store for its place in the newest round, and
         * waits for peers as long as kolorun waits for slots (new workers wait for the old
         * ones to reach their next commit) */
        set_var(&s, strdup("KOLO_ELASTIC=1"));
        set_var(&s, strdup("HOROVOD_ELASTIC=1"));
        set_var(&s, fmt("KOLO_ELASTIC_ID=%d", r->id));
        set_var(&s, fmt("KOLO_ELASTIC_ROUND=%d", r->round));
        if (!o->start_timeout_given) set_var(&s, fmt("KOLO_START_TIMEOUT=%g", o->elastic_timeout));
    }
    for (int i = 0; i < o->nsetenv; i++) set_var(&s, strdup(o->setenv[i]));
    for (int i = 0; i < o->nxenv; i++) {
        const char *x = o->xenv[i];
        if (strchr(x, '=')) {
            set_var(&s, strdup(x));
        } else {
            const char *v = getenv(x);
            if (v) set_var(&s, fmt("%s=%s", x, v));
        }
    }
    if (s.oom || !s.v) {
        kr_env_free(s.v);
        return NULL;
    }
    return s.v;
}

const char *kr_worker_setting(const kr_opts *o, const char *name)
{
    size_t nl = strlen(name);
    for (int i = o->nxenv - 1; i >= 0; i--) { /* kr_env_build's order, the last word first */
        const char *x = o->xenv[i];
        if (strncmp(x, name, nl) == 0 && x[nl] == '=') return x + nl + 1;
        if (strcmp(x, name) == 0 && getenv(name)) return getenv(name);
    }
    for (int i = o->nsetenv - 1; i >= 0; i--) {
        const char *x = o->setenv[i];
        if (strncmp(x, name, nl) == 0 && x[nl] == '=') return x + nl + 1;
    }
    return getenv(name);
}

void kr_env_free(char **env)
{
    if (!env) return;
    for (char **e = env; *e; e++) free(*e);
    free(env);
}

static int check_file(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return KR_EXIT_NOTFOUND;
    if (S_ISDIR(st.st_mode) || access(path, X_OK) != 0) return KR_EXIT_NOEXEC;
    return 0;
}

int kr_find_exec(const char *cmd, char *const *env, char *out, size_t cap)
{
    if (!*cmd) return KR_EXIT_NOTFOUND;
    if (strchr(cmd, '/')) {
        snprintf(out, cap, "%s", cmd);
        return check_file(cmd);
    }
    const char *path = NULL;
    for (char *const *e = env; e && *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    if (!path) path = "/bin:/usr/bin"; /* glibc's execvp default (confstr _CS_PATH) */
    int best = KR_EXIT_NOTFOUND;
    for (const char *p = path;;) {
        size_t n = strcspn(p, ":");
        char cand[4096];
        if (n == 0) snprintf(cand, sizeof(cand), "%s", cmd); /* empty entry: current directory */
        else snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, p, cmd);
        int r = check_file(cand);
        if (r == 0) {
            snprintf(out, cap, "%s", cand);
            return 0;
        }
        if (r == KR_EXIT_NOEXEC) best = KR_EXIT_NOEXEC;
        if (!p[n]) break;
        p += n + 1;
    }
    return best;
}

char *kr_shell_quote(const char *s)
{
    size_t n = 2;
    for (const char *p = s; *p; p++) n += *p == '\'' ? 4 : 1;
    char *out = malloc(n + 1), *w = out;
    if (!out) return NULL;
    *w++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(w, "'\\''", 4);
            w += 4;
        } else {
            *w++ = *p;
        }
    }
    *w++ = '\'';
    *w = '\0';
    return out;
}
