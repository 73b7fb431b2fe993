/* elastic.c - kolorun's elastic driver: the job goes on when workers fail or hosts come and go.
 *
 * The job runs in rounds. Round 1 starts -np workers (after waiting for --min-np slots). A
 * later round is formed when a worker fails (its host gets no new workers: the failure may be
 * the host's), when the usable slots grow (the discovery script names a new host or more slots,
 * or a failed host's cooldown ends) while fewer than --max-np workers run, or when a host with
 * workers leaves the discovery script's list (its workers are removed). A round keeps every
 * live worker, starts new ones on free usable slots up to --max-np, and gives ranks host-major
 * with the hosts ordered by their oldest worker and the workers of a host by age: rank 0 is the
 * oldest worker alive, which holds the state the new ones get.
 *
 * kolorun writes each round into its store (the keys are described in src/core/elastic.c);
 * workers learn of it from a failing collective (a lost peer) or from kolo_elastic_check at
 * their next commit, and kolo_init joins it. A round with fewer than --min-np workers cannot
 * be formed: with a discovery script kolorun waits --elastic-timeout seconds for slots, without
 * one the job ends as a failed job would, the last lost worker named as its failure. So does
 * going past --reset-limit re-formations.
 *
 * The job ends when its workers end. Once one worker has exited 0 no round is formed any
 * more: a failure then ends the job as without elastic mode, and workers that had not joined
 * the finishing worker's round (new ones still waiting for the old ones) are stopped. */
#include "kolorun.h"

#include "../../src/boot/store.h"
#include "../../src/common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define DISCOVERY_PERIOD_S 1.0   /* Horovod's */
#define DISCOVERY_TIMEOUT_S 10.0 /* a script that takes longer is killed; its hosts stay as they were */
#define SETTLE_S 0.05            /* failures this close together make one round */
#define STRAGGLER_GRACE_S 2.0    /* a finishing job's workers have this long to say they joined */
#define ASKED_PERIOD_S 0.5       /* how often the workers' requests for a new round are read */
#define STUCK_GRACE_S 5.0        /* some ask, others do not: after this long those others are stuck */
#define READ_POLL_S 0.05         /* how often kolorun looks for a CPU reading's answers from remote hosts */
#define BUSY_GRACE_MIN_S 30.0    /* ... unless they use CPU time: then they get KOLO_OP_TIMEOUT, at least this */

typedef struct kr_elastic {
    kolo__store *store;
    int round;
    int resets;               /* rounds after the first */
    int lost;                 /* workers lost on the way */
    int last_lost;            /* worker id of the latest loss, -1 none */
    char lost_now[64];        /* ids lost since the last round, "2, 5" */
    char local_rdv[KR_ADDR_MAX]; /* the store's address for workers on this machine */
    double next_discovery;
    int last_usable;          /* usable slots at the previous tick */
    bool reform;              /* a round is due at reform_at */
    double reform_at;
    bool waiting;             /* for --min-np slots, until wait_deadline */
    double wait_deadline;
    bool finishing;           /* a worker exited 0 */
    int finish_round;
    double straggler_check;   /* when to stop workers that never joined finish_round; 0 done */
    bool script_failing;      /* the discovery script's last run failed (said once) */
    double next_asked;        /* when to read the workers' requests again */
    double asked_since;       /* since when some (not all) workers ask for a new round; 0 none */
    double cpu_since;         /* when the silent workers' CPU time was last read */
    double busy_grace;        /* how long a silent worker that uses CPU time is waited for */
    struct cpu_reading {      /* the workers' CPU time being read (read_begin), or none */
        bool on, decides;     /* whether it decides (else the first reading of a wait) */
        int n;                /* j->n when it began: cpu[] has as many */
        long long *cpu, *t;   /* by index in j->ranks; the remote ones', side by side */
        int *idx, k;          /* t[m] is worker idx[m]'s, m < k */
        pid_t *pg;
        kr_cpu_ask *asks;
        kr_cpu_read *remote;  /* NULL: nothing remote to wait for */
    } rd;
} kr_elastic;

static bool blocked(const kr_host *h, double now) { return h->blocked_until > now; }

static bool member(const kr_rank *r) { return r->running && !r->removed && !r->terminated; }

static int count_members(const kr_job *j)
{
    int c = 0;
    for (int i = 0; i < j->n; i++) c += member(&j->ranks[i]);
    return c;
}

/* Slots on present, unblocked hosts. */
static int usable_slots(const kr_job *j, double now)
{
    int s = 0;
    for (int h = 0; h < j->o->nhosts; h++)
        if (j->o->hosts[h].present && !blocked(&j->o->hosts[h], now)) s += j->o->hosts[h].slots;
    return s;
}

/* ---- the discovery script ---- */

static int add_host(kr_job *j, const char *name, int slots)
{
    kr_opts *o = j->o;
    kr_host *grown = realloc(o->hosts, (size_t)(o->nhosts + 1) * sizeof(*grown));
    if (!grown) return -1;
    o->hosts = grown;
    kr_host *h = &o->hosts[o->nhosts];
    memset(h, 0, sizeof(*h));
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->slots = slots;
    h->present = true;
    h->local = kr_host_is_local(name);
    if (h->local) snprintf(h->rdv_addr, sizeof(h->rdv_addr), "%s", j->el->local_rdv);
    else if (!kr_route_source(name, h->rdv_addr, sizeof(h->rdv_addr))) {
        snprintf(h->rdv_addr, sizeof(h->rdv_addr), "%.60s", kr_hostname());
        kr_say("warning: no route to host %s from here; its workers will look for the store at %s:%d", name,
               h->rdv_addr, j->port);
    }
    if (!h->local && !strcmp(j->el->local_rdv, "127.0.0.1") && strcmp(h->rdv_addr, "127.0.0.1") && j->n == 0) {
        /* no default route, and no worker started yet: this machine's workers will reach the
         * store, and be reached, at the address the remote hosts see us at */
        snprintf(j->el->local_rdv, sizeof(j->el->local_rdv), "%s", h->rdv_addr);
        for (int i = 0; i < o->nhosts; i++)
            if (o->hosts[i].local) snprintf(o->hosts[i].rdv_addr, sizeof(o->hosts[i].rdv_addr), "%s", h->rdv_addr);
    } else if (!h->local && !strcmp(j->el->local_rdv, "127.0.0.1")) {
        kr_say("warning: host %s is remote, but this machine's workers reach the store over loopback: they "
               "cannot be reached from there", name);
    }
    o->nhosts++;
    return 0;
}

/* Runs the script; on success marks the hosts it lists present (with its slots) and the others
 * absent. Returns false (hosts unchanged) when it failed. */
static bool discover(kr_job *j)
{
    kr_elastic *el = j->el;
    const char *argv[] = {"/bin/sh", "-c", j->o->discovery, NULL};
    static char out[65536];
    int st = 0;
    bool timed_out = false;
    if (kr_run_capture(argv, false, DISCOVERY_TIMEOUT_S, out, sizeof(out), &st, &timed_out) < 0) return false;
    char why[128] = "";
    if (timed_out) snprintf(why, sizeof(why), "it ran longer than %g s", DISCOVERY_TIMEOUT_S);
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char how[96];
        kr_rank fake = {.wstatus = st};
        kr_describe(&fake, j->o, how, sizeof(how));
        snprintf(why, sizeof(why), "it %s", how);
    }
    /* parse: host[:slots] per line; '#' comments; blank lines */
    typedef struct { char name[KR_HOST_MAX]; int slots; } entry;
    entry *list = NULL;
    int nlist = 0;
    for (char *save = NULL, *line = strtok_r(out, "\n", &save); line && !why[0]; line = strtok_r(NULL, "\n", &save)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char name[KR_HOST_MAX], extra;
        int slots = j->o->slots_per_host;
        char *colon = strrchr(line, ':');
        int got = colon ? sscanf(line, " %255[^: \t] : %d %c", name, &slots, &extra)
                        : sscanf(line, " %255s %c", name, &extra);
        if (got <= 0) continue; /* blank */
        if ((colon && got != 2) || (!colon && got != 1) || slots < 1 || slots > (1 << 20) ||
            !kr_valid_host_name(name, strlen(name))) {
            snprintf(why, sizeof(why), "it printed '%.60s', not 'host' or 'host:slots'", line);
            break;
        }
        entry *g = realloc(list, (size_t)(nlist + 1) * sizeof(*g));
        if (!g) {
            snprintf(why, sizeof(why), "out of memory");
            break;
        }
        list = g;
        snprintf(list[nlist].name, sizeof(list[nlist].name), "%s", name);
        list[nlist++].slots = slots;
    }
    if (why[0]) {
        if (!el->script_failing)
            kr_say("warning: host discovery script failed: %s; the hosts stay as they were", why);
        el->script_failing = true;
        free(list);
        return false;
    }
    el->script_failing = false;
    for (int h = 0; h < j->o->nhosts; h++) j->o->hosts[h].present = false;
    for (int e = 0; e < nlist; e++) {
        int h = 0;
        while (h < j->o->nhosts && strcmp(j->o->hosts[h].name, list[e].name) != 0) h++;
        if (h == j->o->nhosts) {
            if (add_host(j, list[e].name, list[e].slots) != 0) break;
            if (j->o->verbose) kr_say("discovered host %s with %d slot%s", list[e].name, list[e].slots, list[e].slots == 1 ? "" : "s");
        } else {
            j->o->hosts[h].present = true;
            j->o->hosts[h].slots = list[e].slots;
        }
    }
    free(list);
    return true;
}

/* ---- rounds ---- */

/* A worker's number under <job>/elastic/<what>/<id> (src/core/elastic.c: "joined", the round it
 * started last; "waiting", the round it asks for), or `absent`. */
static int worker_value(kr_job *j, const char *what, const kr_rank *r, int absent)
{
    char key[160];
    snprintf(key, sizeof(key), "%s/elastic/%s/%d", j->job_id, what, r->id);
    void *v = NULL;
    size_t len = 0;
    if (kolo__store_get(j->el->store, key, &v, &len, 0) != 0) return absent;
    int g = atoi(v);
    kolo__free(v);
    return g;
}

/* Ends a running worker outside any failure of its own: a local one's process group gets sig; a
 * started remote one's connection is closed, and its wrapper stops it (SIGTERM, then SIGKILL
 * after the grace period), as supervise.c does. */
static void stop_worker(kr_job *j, kr_rank *r, int sig)
{
    if (!j->o->hosts[r->host].local && r->started && r->stdin_fd >= 0) {
        close(r->stdin_fd);
        r->stdin_fd = -1;
    } else {
        kill(-r->pid, sig);
    }
}

/* Counts worker i as lost: its host gets no new workers (for good, or for a cooldown), and the
 * next round goes on without it. */
static void lose(kr_job *j, int i, double now)
{
    kr_elastic *el = j->el;
    kr_opts *o = j->o;
    kr_rank *r = &j->ranks[i];
    kr_host *h = &o->hosts[r->host];
    h->failures++;
    if (o->cooldown_min > 0) {
        double d = o->cooldown_min * pow(2.0, h->failures - 1);
        h->blocked_until = now + (d < o->cooldown_max ? d : o->cooldown_max);
    } else {
        h->blocked_until = INFINITY;
    }
    r->lost = true;
    el->lost++;
    el->last_lost = i;
    size_t ln = strlen(el->lost_now);
    if (ln < sizeof(el->lost_now) - 12)
        snprintf(el->lost_now + ln, sizeof(el->lost_now) - ln, "%s%d", ln ? ", " : "", r->id);
    if (!el->reform) {
        el->reform = true;
        el->reform_at = now + SETTLE_S;
    }
}

static int put(kr_job *j, const char *key_fmt_arg, int g, const char *val)
{
    char key[200];
    snprintf(key, sizeof(key), "%s/elastic/%d/%s", j->job_id, g, key_fmt_arg);
    return kolo__store_set(j->el->store, key, val, strlen(val));
}

typedef struct {
    const kr_rank *ranks;
    const int *hkey; /* each host's oldest member: the hosts' order */
} order_ctx;

static int by_host_then_age(const void *a, const void *b, void *arg)
{
    const order_ctx *c = arg;
    const kr_rank *x = &c->ranks[*(const int *)a], *y = &c->ranks[*(const int *)b];
    if (c->hkey[x->host] != c->hkey[y->host]) return c->hkey[x->host] < c->hkey[y->host] ? -1 : 1;
    if (x->host != y->host) return x->host < y->host ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Forms the next round with up to `want` workers. Returns 0; 1 when fewer than --min-np
 * workers could be placed (nothing changed); -1 when the store failed. */
static int form_round(kr_job *j, int want, const char *why)
{
    kr_opts *o = j->o;
    kr_elastic *el = j->el;
    double now = kr_now();
    int nh = o->nhosts;
    int *on_host = calloc((size_t)nh + 1, sizeof(int));
    int *hkey = calloc((size_t)nh + 1, sizeof(int));
    int *add_on = calloc((size_t)nh + 1, sizeof(int));
    if (!on_host || !hkey || !add_on) {
        free(on_host);
        free(hkey);
        free(add_on);
        return -1;
    }
    int members = 0, removing = 0;
    for (int i = 0; i < j->n; i++) {
        kr_rank *r = &j->ranks[i];
        if (!member(r)) continue;
        if (!o->hosts[r->host].present) {
            removing++;
            continue;
        }
        on_host[r->host]++;
        members++;
    }
    int adding = 0;
    for (int h = 0; h < nh && members + adding < want; h++) {
        const kr_host *host = &o->hosts[h];
        if (!host->present || blocked(host, now)) continue;
        int free_slots = host->slots - on_host[h];
        while (free_slots-- > 0 && members + adding < want) {
            add_on[h]++;
            adding++;
        }
    }
    if (members + adding < o->min_np) {
        free(on_host);
        free(hkey);
        free(add_on);
        return 1;
    }
    int first_new = j->n;
    if (kr_job_grow(j, j->n + adding) != 0) {
        free(on_host);
        free(hkey);
        free(add_on);
        return -1;
    }
    int g = ++el->round;
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < add_on[h]; k++) {
            kr_rank *r = &j->ranks[j->n++];
            r->host = h;
            r->round = g;
            r->running = false;
        }
    /* order: hosts by their oldest member, then each host's workers by age */
    int size = members + adding;
    int *order = calloc((size_t)size + 1, sizeof(int));
    if (!order) {
        free(on_host);
        free(hkey);
        free(add_on);
        return -1;
    }
    int m = 0;
    for (int h = 0; h < nh; h++) hkey[h] = INT_MAX;
    for (int i = 0; i < j->n; i++) {
        kr_rank *r = &j->ranks[i];
        if (i < first_new && (!member(r) || !o->hosts[r->host].present)) continue;
        order[m++] = i;
        if (i < hkey[r->host]) hkey[r->host] = i;
    }
    order_ctx oc = {j->ranks, hkey};
    qsort_r(order, (size_t)m, sizeof(int), by_host_then_age, &oc);
    /* local ranks, then cross ranks (Horovod's rule: among the hosts with that local rank) */
    for (int k = 0; k < m; k++) {
        kr_rank *r = &j->ranks[order[k]];
        r->rank = k;
        r->local_rank = 0;
        r->local_size = 0;
        for (int q = 0; q < m; q++) {
            const kr_rank *p = &j->ranks[order[q]];
            if (p->host != r->host) continue;
            if (q < k) r->local_rank++;
            r->local_size++;
        }
    }
    for (int k = 0; k < m; k++) {
        kr_rank *r = &j->ranks[order[k]];
        r->cross_rank = r->cross_size = 0;
        int last_host = -1;
        for (int q = 0; q < m; q++) {
            const kr_rank *p = &j->ranks[order[q]];
            if (p->local_rank != r->local_rank || p->host == last_host) continue;
            last_host = p->host;
            if (q < k) r->cross_rank++;
            r->cross_size++;
        }
    }
    int st = 0;
    char val[96], key[32];
    for (int k = 0; k < m && !st; k++) {
        const kr_rank *r = &j->ranks[order[k]];
        snprintf(val, sizeof(val), "%d %d %d %d %d %d", r->rank, size, r->local_rank, r->local_size, r->cross_rank,
                 r->cross_size);
        snprintf(key, sizeof(key), "w/%d", r->id);
        st = put(j, key, g, val);
    }
    for (int i = 0; i < first_new && !st; i++) {
        kr_rank *r = &j->ranks[i];
        if (!member(r) || o->hosts[r->host].present) continue;
        r->removed = true;
        snprintf(key, sizeof(key), "w/%d", r->id);
        st = put(j, key, g, "removed");
        kr_say("worker %d (rank %d) on host %s is removed: its host left the job", r->id, r->rank, o->hosts[r->host].name);
    }
    if (!st) st = put(j, "kind", g, adding || g == 1 ? "added" : "removed");
    if (!st) {
        char lk[160], lv[16];
        snprintf(lk, sizeof(lk), "%s/elastic/latest", j->job_id);
        snprintf(lv, sizeof(lv), "%d", g);
        st = kolo__store_set(el->store, lk, lv, strlen(lv));
    }
    if (st) kr_say("error: cannot write round %d into the store: %s", g, kolo_last_error());
    if (g > 1 && !st)
        kr_say("round %d: %d worker%s (%s%s%d new%s%d removed)", g, size, size == 1 ? "" : "s", why, *why ? "; " : "",
               adding, ", ", removing);
    /* start the new ones */
    for (int i = first_new; i < j->n && !st; i++) {
        if (kr_start_worker(j, i, size) != 0) lose(j, i, now); /* the next round goes on without it */
    }
    free(order);
    free(on_host);
    free(hkey);
    free(add_on);
    return st ? -1 : 0;
}

/* ---- the driver ---- */

static bool read_signal(int sigfd, int *sig)
{
    struct signalfd_siginfo si;
    while (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if ((int)si.ssi_signo == SIGCHLD) continue;
        *sig = (int)si.ssi_signo;
        return true;
    }
    return false;
}

/* KOLO_OP_TIMEOUT as the workers read it: their value (-x, options, environment), or the
 * settings table's default where it is unset or does not parse (a worker warns and uses that). */
static double workers_op_timeout(const kr_opts *o)
{
    size_t n;
    const char *v = kr_worker_setting(o, "KOLO_OP_TIMEOUT"), *def = kolo__setting_table(&n)[KOLO_SET_OP_TIMEOUT].def;
    char *end;
    double t = v ? strtod(v, &end) : 0;
    return v && end != v && !*end ? t : strtod(def, NULL);
}

int kr_elastic_setup(kr_job *j, int sigfd)
{
    kr_opts *o = j->o;
    kr_elastic *el = calloc(1, sizeof(*el));
    if (!el) return KR_EXIT_LAUNCH;
    j->el = el;
    el->last_lost = -1;
    if (!o->max_np) o->max_np = o->np;
    /* this machine's workers reach the store where the other hosts' do: through the address
     * of the route to the first remote host (main.c), or, when a script names the hosts, the
     * default route's; without one, the route's to the first remote host the script lists
     * before round 1 (add_host), else loopback; --local-address before all */
    snprintf(el->local_rdv, sizeof(el->local_rdv), "127.0.0.1");
    for (int h = 0; h < o->nhosts; h++)
        if (o->hosts[h].local) snprintf(el->local_rdv, sizeof(el->local_rdv), "%s", o->hosts[h].rdv_addr);
    if (o->discovery && !kr_route_source("192.0.2.1", el->local_rdv, sizeof(el->local_rdv)))
        snprintf(el->local_rdv, sizeof(el->local_rdv), "127.0.0.1");
    if (o->local_addr[0]) snprintf(el->local_rdv, sizeof(el->local_rdv), "%s", o->local_addr);
    for (int h = 0; h < o->nhosts; h++) o->hosts[h].present = true;
    if (kolo__store_connect(&el->store, "127.0.0.1", j->port, j->secret, strlen(j->secret), 10) != 0) {
        kr_say("error: cannot reach our own store: %s", kolo_last_error());
        return KR_EXIT_LAUNCH;
    }
    double deadline = kr_now() + o->elastic_timeout;
    bool said = false;
    for (;;) {
        if (o->discovery) discover(j);
        int slots = usable_slots(j, kr_now());
        if (slots >= o->min_np) break;
        if (!o->discovery) { /* -H can only have fewer slots than -np when -np was checked: not here */
            kr_say("error: %d slot%s, fewer than --min-np %d", slots, slots == 1 ? "" : "s", o->min_np);
            return KR_EXIT_USAGE;
        }
        if (kr_now() >= deadline) {
            kr_say("error: the host discovery script found %d slot%s, fewer than --min-np %d, within %g s "
                   "(--elastic-timeout)", slots, slots == 1 ? "" : "s", o->min_np, o->elastic_timeout);
            return KR_EXIT_LAUNCH;
        }
        if (!said) kr_say("waiting for --min-np %d slots (%d found)", o->min_np, slots);
        said = true;
        struct pollfd pfd = {.fd = sigfd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(DISCOVERY_PERIOD_S * 1000)) > 0) {
            int sig = 0;
            if (read_signal(sigfd, &sig) && sig != SIGUSR1 && sig != SIGUSR2) {
                kr_say("got signal %d while waiting for slots: nothing was started", sig);
                return 128 + sig;
            }
        }
    }
    el->next_discovery = kr_now() + DISCOVERY_PERIOD_S;
    /* KOLO_OP_TIMEOUT=0: the workers wait for a silent peer without end, and so does kolorun for a
     * busy one (it was given 30 s, then killed: an evaluation longer than that ended it) */
    double op_timeout = workers_op_timeout(o);
    el->busy_grace = op_timeout == 0 ? INFINITY : KOLO_MAX(op_timeout, BUSY_GRACE_MIN_S);
    int st = form_round(j, o->np, "");
    el->last_usable = usable_slots(j, kr_now());
    if (st != 0) return KR_EXIT_LAUNCH;
    for (int i = 0; i < j->n; i++)
        if (j->ranks[i].lost) /* a worker of round 1 could not be started: its code (127: not found) */
            return WIFEXITED(j->ranks[i].wstatus) && WEXITSTATUS(j->ranks[i].wstatus) ? WEXITSTATUS(j->ranks[i].wstatus)
                                                                                       : KR_EXIT_LAUNCH;
    return 0;
}

static void read_free(struct cpu_reading *rd)
{
    kr_remote_cpu_end(rd->remote);
    free(rd->cpu);
    free(rd->t);
    free(rd->idx);
    free(rd->pg);
    free(rd->asks);
    *rd = (struct cpu_reading){0};
}

/* The first reading of a wait: what the next, STUCK_GRACE_S after its answers, is compared with. */
static void read_baseline(kr_job *j, const long long *cpu, int n)
{
    j->el->cpu_since = kr_now();
    for (int i = 0; i < j->n; i++) {
        j->ranks[i].said_busy = false;
        j->ranks[i].cpu_seen = i < n ? cpu[i] : -1;
    }
}

/* A reading STUCK_GRACE_S or more after the one before: which silent workers to kill. */
static void read_decide(kr_job *j, const long long *cpu, int n)
{
    kr_elastic *el = j->el;
    double now = kr_now(); /* after the remote hosts answered */
    double silent = now - el->asked_since, window = now - el->cpu_since;
    el->cpu_since = now;
    int asking = 0;
    for (int i = 0; i < j->n; i++) asking += member(&j->ranks[i]) && j->ranks[i].asking;
    bool killed = false;
    for (int i = 0; i < j->n; i++) {
        kr_rank *r = &j->ranks[i];
        if (!member(r) || r->asking) continue;
        bool local = j->o->hosts[r->host].local;
        long long c = i < n ? cpu[i] : -1;
        bool known = c >= 0 && r->cpu_seen >= 0, busy = known && c > r->cpu_seen;
        r->cpu_seen = c;
        if (busy && silent < el->busy_grace) {
            if (!r->said_busy) {
                char wait[96] = "waiting for it while it runs (KOLO_OP_TIMEOUT=0: no limit)";
                if (!isinf(el->busy_grace))
                    snprintf(wait, sizeof(wait), "waiting up to %g s for it (KOLO_OP_TIMEOUT, at least %g s)",
                             el->busy_grace, BUSY_GRACE_MIN_S);
                kr_say("worker %d (rank %d) has not asked for the new round %.0f s after %d worker%s gave up on it, "
                       "but it is running (it used CPU time): %s", r->id, r->rank, silent, asking, asking == 1 ? "" : "s",
                       wait);
            }
            r->said_busy = true;
            continue;
        }
        char why[320];
        if (busy)
            snprintf(why, sizeof(why), ", and it kept running %.0f s without asking", silent);
        else if (local || known) {
            char waits[200] = "";
            if (local) kr_group_waits(r->pid, waits, sizeof(waits));
            snprintf(why, sizeof(why), ", and it used no CPU time in the last %.0f s%s%s%s", window,
                     waits[0] ? " (its threads: " : "", waits, waits[0] ? ")" : "");
        }
        else
            snprintf(why, sizeof(why), ", and its host did not tell its CPU time");
        kr_say("worker %d (rank %d) on host %s stopped answering: %d worker%s gave up on it and asked for a new round "
               "%.0f s ago%s; killing it, the job goes on without it", r->id, r->rank, j->o->hosts[r->host].name,
               asking, asking == 1 ? "" : "s", silent, why);
        r->removed = true; /* its end is not news any more */
        stop_worker(j, r, SIGKILL);
        lose(j, i, now);
        killed = true;
    }
    if (killed) el->asked_since = 0;
}

/* The reading in flight has its answers (or its time is up): the remote ones into cpu[], and
 * what it was for. */
static void read_done(kr_job *j)
{
    struct cpu_reading *rd = &j->el->rd;
    kr_remote_cpu_end(rd->remote);
    rd->remote = NULL;
    for (int m = 0; m < rd->k; m++) rd->cpu[rd->idx[m]] = rd->t[m];
    if (rd->decides) read_decide(j, rd->cpu, rd->n);
    else read_baseline(j, rd->cpu, rd->n);
    read_free(rd);
}

/* Begins reading the CPU ticks of the workers check_asked reads (every member, or only those not
 * asking): a local worker's from /proc here, at once; remote ones' by one ssh to each of their
 * hosts, all at once, while kolorun's loop goes on (kr_remote_cpu_start; kr_elastic_tick polls
 * it, read_done ends it); -1 where unknown or not read. */
static void read_begin(kr_job *j, bool silent_only, bool decides)
{
    struct cpu_reading *rd = &j->el->rd;
    int n = j->n, nh = j->o->nhosts;
    *rd = (struct cpu_reading){.on = true, .decides = decides, .n = n};
    rd->cpu = malloc((size_t)n * sizeof(long long));
    rd->t = malloc((size_t)n * sizeof(long long));
    rd->idx = malloc((size_t)n * sizeof(int));
    rd->pg = malloc((size_t)n * sizeof(pid_t));
    rd->asks = malloc((size_t)nh * sizeof(kr_cpu_ask));
    if (!rd->cpu || !rd->t || !rd->idx || !rd->pg || !rd->asks) { /* read as unknown */
        long long none[1] = {-1};
        read_free(rd);
        if (decides) read_decide(j, none, 0);
        else read_baseline(j, none, 0);
        return;
    }
    for (int i = 0; i < n; i++) {
        kr_rank *r = &j->ranks[i];
        bool wanted = member(r) && !(silent_only && r->asking);
        rd->cpu[i] = wanted && j->o->hosts[r->host].local ? kr_group_cpu_ticks(r->pid) : -1;
    }
    int na = 0;
    for (int h = 0; h < nh; h++) { /* a host's workers side by side in pg */
        if (j->o->hosts[h].local) continue;
        int first = rd->k;
        for (int i = 0; i < n; i++) {
            kr_rank *r = &j->ranks[i];
            if (r->host != h || !member(r) || (silent_only && r->asking) || r->remote_pid <= 0) continue;
            rd->pg[rd->k] = (pid_t)r->remote_pid;
            rd->idx[rd->k++] = i;
        }
        if (rd->k > first)
            rd->asks[na++] = (kr_cpu_ask){.host = h, .pgids = rd->pg + first, .n = rd->k - first, .ticks = rd->t + first};
    }
    for (int m = 0; m < rd->k; m++) rd->t[m] = -1;
    if (na) rd->remote = kr_remote_cpu_start(j->o, rd->asks, na);
    if (!rd->remote) read_done(j);
}

/* Workers ask for a new round when a collective failed on them. All of them asking (an error
 * every rank saw, such as a mismatch) gets one with the same workers: Horovod's reset. Some
 * asking while the others keep quiet means the others stopped answering (stopped, or stuck
 * outside kolo; a dead one would have been reaped by then), or are busy outside kolo (a long
 * step, an evaluation) and will learn of the failure at their next collective, which then fails
 * at once (the peers have left it) and asks too. kolorun tells the two apart by CPU time: one
 * that used none in the last STUCK_GRACE_S is killed and the round goes on without it; one that
 * did is waited for as long as a worker waits for a silent peer
 * (KOLO_OP_TIMEOUT as the workers get it, at least BUSY_GRACE_MIN_S: a short one set for a test
 * should not turn a host's load into a kill). A remote worker's is read on its host, by one ssh
 * per host at each reading, to all hosts at once and while kolorun's loop goes on (output,
 * signals, deaths; read_begin), for at most REMOTE_CPU_S; a host that does not answer leaves it
 * unknown, and such a worker silent for STUCK_GRACE_S is killed, as before kolorun read any. */
static void check_asked(kr_job *j, double now)
{
    kr_elastic *el = j->el;
    int want = el->round + 1, members = 0, asking = 0;
    for (int i = 0; i < j->n; i++) {
        kr_rank *r = &j->ranks[i];
        if (!member(r)) continue;
        members++;
        r->asking = worker_value(j, "waiting", r, 0) == want;
        asking += r->asking;
    }
    if (asking == 0 || asking == members) {
        read_free(&el->rd); /* a reading in flight is moot */
        el->asked_since = 0;
    }
    if (asking == 0) return;
    if (asking == members) {
        kr_say("every worker asked for a new round (a collective failed on all of them): forming it");
        el->reform = true;
        el->reform_at = now;
        return;
    }
    if (el->rd.on) return; /* its answers decide */
    if (el->asked_since == 0) {
        el->asked_since = now;
        read_begin(j, false, false);
    } else if (now - el->cpu_since >= STUCK_GRACE_S) {
        read_begin(j, true, true);
    }
}

/* Workers still running that did not start the finishing round (or never said so) are waiting
 * for a round that will not start: stopped. */
static void stop_stragglers(kr_job *j)
{
    kr_elastic *el = j->el;
    for (int i = 0; i < j->n; i++) {
        kr_rank *r = &j->ranks[i];
        if (!member(r)) continue;
        if (worker_value(j, "joined", r, 0) == el->finish_round) continue;
        kr_say("the job finished in round %d, which worker %d (started for round %d) never joined: stopping it",
               el->finish_round, r->id, r->round);
        r->terminated = true;
        stop_worker(j, r, SIGTERM);
    }
}

bool kr_elastic_on_exit(kr_job *j, int i)
{
    kr_elastic *el = j->el;
    kr_opts *o = j->o;
    kr_rank *r = &j->ranks[i];
    kr_host *h = &o->hosts[r->host];
    bool ok = WIFEXITED(r->wstatus) && WEXITSTATUS(r->wstatus) == 0;
    if (r->removed) {
        if (o->verbose) kr_say("worker %d (removed with host %s) ended", r->id, h->name);
        return true;
    }
    if (r->terminated) return false;
    if (ok) {
        if (!el->finishing) {
            el->finishing = true;
            el->reform = false;
            el->finish_round = worker_value(j, "joined", r, el->round);
            el->straggler_check = kr_now() + STRAGGLER_GRACE_S;
        }
        return false;
    }
    if (el->finishing) return false;
    if (count_members(j) == 0) return false; /* nobody left to go on */
    lose(j, i, kr_now());
    char how[256];
    kr_describe(r, o, how, sizeof(how));
    kr_say("worker %d (rank %d of round %d) on host %s %s after %.2f s: the job goes on without it", r->id, r->rank,
           el->round, h->name, how, r->end_time);
    kr_print_tail(r, "worker");
    return true;
}

int kr_elastic_tick(kr_job *j, double now)
{
    kr_elastic *el = j->el;
    kr_opts *o = j->o;
    if (el->rd.on && (el->finishing || el->reform)) read_free(&el->rd); /* moot */
    if (el->rd.on && el->rd.remote && kr_remote_cpu_poll(el->rd.remote)) read_done(j);
    if (el->finishing) {
        if (el->straggler_check > 0 && now >= el->straggler_check) {
            el->straggler_check = 0;
            stop_stragglers(j);
        }
        return -1;
    }
    if (o->discovery && now >= el->next_discovery) {
        discover(j);
        el->next_discovery = kr_now() + DISCOVERY_PERIOD_S;
        for (int i = 0; i < j->n; i++)
            if (member(&j->ranks[i]) && !o->hosts[j->ranks[i].host].present && !el->reform) {
                el->reform = true; /* a host with workers left */
                el->reform_at = now;
            }
    }
    if (!el->reform && now >= el->next_asked) {
        el->next_asked = now + ASKED_PERIOD_S;
        check_asked(j, now);
    }
    int usable = usable_slots(j, now);
    if (usable > el->last_usable && count_members(j) < o->max_np && !el->reform) {
        el->reform = true; /* a host came, or a cooldown ended */
        el->reform_at = now;
    }
    el->last_usable = usable;
    if (!el->reform || now < el->reform_at) return -1;
    /* the last lost worker stands for the failure; with none lost (hosts left), no worker does */
    int fail_as = el->last_lost >= 0 ? el->last_lost : KR_ELASTIC_END;
    if (o->reset_limit >= 0 && el->resets >= o->reset_limit) {
        kr_say("the job was re-formed %d time%s, the --reset-limit: ending it", el->resets, el->resets == 1 ? "" : "s");
        return fail_as;
    }
    char why[96] = "";
    if (el->lost_now[0])
        snprintf(why, sizeof(why), "after losing worker%s %s", strchr(el->lost_now, ',') ? "s" : "", el->lost_now);
    int st = form_round(j, o->max_np, why);
    if (st < 0) return fail_as;
    if (st == 0) {
        el->lost_now[0] = '\0';
        el->resets++;
        el->reform = false;
        el->waiting = false;
        return -1;
    }
    int members = 0; /* those on hosts still listed */
    for (int i = 0; i < j->n; i++)
        members += member(&j->ranks[i]) && o->hosts[j->ranks[i].host].present;
    if (!o->discovery) {
        kr_say("%d worker%s left, fewer than --min-np %d, and no usable slot to start more on: ending the job", members,
               members == 1 ? "" : "s", o->min_np);
        return fail_as;
    }
    if (!el->waiting) {
        el->waiting = true;
        el->wait_deadline = now + o->elastic_timeout;
        kr_say("%d worker%s left, fewer than --min-np %d: waiting up to %g s (--elastic-timeout) for hosts", members,
               members == 1 ? "" : "s", o->min_np, o->elastic_timeout);
    } else if (now >= el->wait_deadline) {
        kr_say("no hosts came within %g s (--elastic-timeout): ending the job", o->elastic_timeout);
        return fail_as;
    }
    el->reform_at = el->next_discovery + 0.01; /* try again after the next discovery */
    return -1;
}

double kr_elastic_wake(const kr_job *j)
{
    const kr_elastic *el = j->el;
    double w = kr_now() + 3600;
    if (el->finishing) return el->straggler_check > 0 ? el->straggler_check : w;
    if (j->o->discovery && el->next_discovery < w) w = el->next_discovery;
    if (!el->reform && el->next_asked < w) w = el->next_asked;
    if (el->rd.on && kr_now() + READ_POLL_S < w) w = kr_now() + READ_POLL_S; /* its answers */
    if (el->reform && el->reform_at < w) w = el->reform_at;
    /* a cooldown that ends */
    for (int h = 0; h < j->o->nhosts; h++) {
        double b = j->o->hosts[h].blocked_until;
        if (b > kr_now() && isfinite(b) && b < w) w = b;
    }
    return w;
}

void kr_elastic_finish(kr_job *j, bool print)
{
    kr_elastic *el = j->el;
    if (!el) return;
    read_free(&el->rd);
    if (print && el->lost)
        kr_say("elastic job: %d round%s, %d worker%s lost on the way", el->round, el->round == 1 ? "" : "s", el->lost,
               el->lost == 1 ? "" : "s");
    kolo__store_close(el->store);
    free(el);
    j->el = NULL;
}

int kr_elastic_round(const kr_job *j) { return j->el ? j->el->round : 0; }

void kr_elastic_reaped(kr_job *j, pid_t pid)
{
    if (j->el) kr_remote_cpu_reaped(j->el->rd.remote, pid);
}
