/* env.c - who am I: rank, size, local/cross hints, rendezvous address, job id and secret, read
 * from the environment of whichever launcher started this process.
 *
 * Detection order. The first convention whose marker variable is set wins; a convention that is
 * found but incomplete or malformed is an error (KOLO_ERR_INVALID_ARG naming the variable and
 * its value), never a silent fall-through to the next one. Empty variables count as unset.
 *
 *  1. kolo      KOLO_RANK or KOLO_SIZE. Also KOLO_LOCAL_RANK/SIZE, KOLO_CROSS_RANK/SIZE,
 *               KOLO_RENDEZVOUS (required when KOLO_SIZE > 1). kolorun serves the store itself,
 *               so rdv_serve = 0, unless KOLO_RENDEZVOUS_SERVER=rank0 says that no launcher
 *               serves it (ranks started by hand, or by kolo.spark): then rank 0 does.
 *  2. horovod   HOROVOD_RANK or HOROVOD_SIZE (+ LOCAL_/CROSS_ variants). horovodrun's own
 *               rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT) speaks HTTP, not our protocol,
 *               and its address is the launcher's host, where no rank runs; it only names the
 *               job. Rank 0 serves kolo's store: at KOLO_RENDEZVOUS if set; else, when every
 *               rank is on one host (HOROVOD_LOCAL_SIZE == HOROVOD_SIZE), on 127.0.0.1 at a
 *               port derived from the job id; else it is an error asking for KOLO_RENDEZVOUS.
 *  3. torchrun  RANK and WORLD_SIZE (both; one alone is ignored with a warning), LOCAL_RANK,
 *               LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
 *               torchrun's agent already runs its TCPStore on MASTER_PORT, so kolo never binds
 *               that port: rank 0 serves at MASTER_ADDR:MASTER_PORT+1 (MASTER_PORT-1 when
 *               MASTER_PORT is 65535). The job id includes TORCHELASTIC_RUN_ID and
 *               TORCHELASTIC_RESTART_COUNT, so a restarted group never sees stale keys.
 *  4. openmpi   OMPI_COMM_WORLD_RANK (+ SIZE, LOCAL_RANK, LOCAL_SIZE). OMPI_COMM_WORLD_NODE_RANK
 *               counts processes of all jobs on the node: it is not a host index and is unused.
 *  5. pmi       PMI_RANK, PMI_SIZE, MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH Hydra, Intel MPI),
 *               else PMI_LOCAL_RANK/PMI_LOCAL_SIZE (Cray). Under `mpiexec -pmi-port` Hydra sets
 *               PMI_PORT and PMI_ID instead of PMI_RANK: rank and size come through the PMI
 *               connection (pmi_rdv.c), and its key-value space names the job.
 *  6. pmix      PMIX_RANK, with the size from PMI_SIZE or PMIX_SIZE. Without a size, when
 *               Slurm's variables describe this very process (srun --mpi=pmix), Slurm is used.
 *     For 4-6 no address is given. Rank 0 serves: at KOLO_RENDEZVOUS if set; else, when all
 *     ranks share one host (local size == size), on 127.0.0.1 at a port derived from the job
 *     id; else at Slurm's address (7) when Slurm's variables describe the same world (mpirun or
 *     srun --mpi=pmi2 inside an allocation); else, when the process has a PMI-1 connection
 *     (PMI_FD or PMI_PORT: MPICH's Hydra), at the address rank 0 publishes through it, the job
 *     named by its key-value space (pmi_rdv.c); else, when a PMIx server gave this process its
 *     address (PMIX_SERVER_URI*: mpirun of Open MPI), at the address rank 0 publishes through
 *     PMIx (pmix_rdv.c); both are collectives at kolo_init. Else it is an error asking for
 *     KOLO_RENDEZVOUS.
 *  7. slurm     SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID, SLURM_NODEID,
 *               SLURM_STEP_NUM_NODES (or SLURM_NNODES); local size from
 *               SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE ("2(x3),1") or
 *               SLURM_NTASKS_PER_NODE. Under srun --mpi=pmix rank 0 publishes its address and a
 *               free port through Slurm's PMIx server (slurm_address). Else rank 0 serves at the
 *               first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST), at
 *               a port derived from SLURM_JOB_ID and SLURM_STEP_ID. With block and cyclic
 *               distributions rank 0 runs there.
 *  8. pet       PET_NNODES and PET_NODE_RANK (both; one alone is ignored with a warning):
 *               torchrun's arguments as variables, all a Kubeflow TrainJob (Trainer v2) gives
 *               its pods; torchrun reads them when it starts a pod's processes. Without torchrun
 *               (which sets RANK and WORLD_SIZE, so 3 wins) the program is its pod's one
 *               process: rank PET_NODE_RANK of PET_NNODES, one rank per pod (local 0 of 1, cross
 *               = rank), whatever PET_NPROC_PER_NODE says (rank 0 warns when it is not 1). Rank
 *               0 serves at PET_MASTER_ADDR:PET_MASTER_PORT+1, as under torchrun (the pod's
 *               program may start torch.distributed's store on PET_MASTER_PORT itself). An
 *               elastic range (PET_NNODES=1:4) needs torchrun and is an error.
 *  9. none      rank 0 of 1; no store.
 *
 * KOLO_RENDEZVOUS=host:port overrides the address of every convention (and makes rank 0 serve
 * it unless kolorun started us). A world of one needs no store: unless KOLO_RENDEZVOUS is set,
 * its rdv_port is 0.
 *
 * Derived ports: FNV-1a of a text every rank computes identically, mapped into [20000, 32767]:
 * below Linux's ephemeral range (32768-60999), where any outgoing connection may hold a port.
 * The range overlaps Linux's ephemeral ports (32768-60999), so the port may be busy: that shows
 * up at once as an "address in use" error on rank 0 naming host:port, and KOLO_RENDEZVOUS
 * fixes it.
 *
 * Job id: KOLO_JOB_ID, else "<convention>-<launcher's job identifiers>": horovod
 * HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT; torchrun run id, restart count, MASTER_ADDR:PORT; Open MPI
 * OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE; PMI PMI_KVSNAME or PMI_JOBID, else (across hosts
 * and under -pmi-port) the PMI connection's key-value space; PMIx PMIX_NAMESPACE;
 * Slurm SLURM_JOB_ID.SLURM_STEP_ID; pet PET_MASTER_ADDR:PORT. Without any: the KOLO_RENDEZVOUS text, else (one host
 * only) the parent pid and uid - every rank of one mpirun on one host has the same parent.
 * Ids longer than job_id holds or with characters outside [A-Za-z0-9._:@-] become a cleaned
 * prefix plus a 64-bit hash of the whole text, so they stay safe in shared-memory names.
 *
 * Secret: the bytes of KOLO_SECRET; else HMAC(job_id) in hex (secret_derived = 1).
 */
#include "env.h"

#include "auth.h"
#include "pmi_rdv.h"
#include "pmix_rdv.h"
#include "../net/transport.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Variable names of one convention's integers; NULL where the convention has none. */
typedef struct names {
    const char *rank, *size, *lrank, *lsize, *crank, *csize;
} names;

static const char *var(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return (v && *v) ? v : NULL;
}

static bool parse_uint(const char *v, int *out)
{
    long long x = 0;
    if (!v || !*v) return false;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        x = x * 10 + (*p - '0');
        if (x > INT_MAX) return false;
    }
    *out = (int)x;
    return true;
}

/* *out = value of `name`, or -1 when unset (or name is NULL). */
static int opt_int(const char *name, int *out)
{
    const char *v = var(name);
    *out = -1;
    if (!v) return KOLO_OK;
    if (!parse_uint(v, out))
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s='%s' is not a non-negative integer",
                         name, v);
    return KOLO_OK;
}

static int req_int(const char *name, const char *why, int *out)
{
    if (!var(name)) return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s is not set (%s)", name, why);
    return opt_int(name, out);
}

/* A (rank, size) pair: size >= 1 when given, rank < size when both are given. */
static int check_pair(const char *rn, int r, const char *sn, int s)
{
    if (s == 0) return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s=0: a size must be at least 1", sn);
    if (r >= 0 && s > 0 && r >= s)
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s=%d is not below %s=%d", rn, r, sn, s);
    return KOLO_OK;
}

/* Reads and validates a convention's integers into w. */
static int read_ints(const names *n, const char *why, kolo__world_info *w)
{
    int s;
    if ((s = req_int(n->rank, why, &w->rank)) || (s = req_int(n->size, why, &w->size)) ||
        (s = opt_int(n->lrank, &w->local_rank)) || (s = opt_int(n->lsize, &w->local_size)) ||
        (s = opt_int(n->crank, &w->cross_rank)) || (s = opt_int(n->csize, &w->cross_size)))
        return s;
    if ((s = check_pair(n->rank, w->rank, n->size, w->size)) ||
        (s = check_pair(n->lrank, w->local_rank, n->lsize, w->local_size)) ||
        (s = check_pair(n->crank, w->cross_rank, n->csize, w->cross_size)))
        return s;
    if (w->local_size > w->size)
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s=%d exceeds %s=%d", n->lsize,
                         w->local_size, n->size, w->size);
    if (w->cross_size > w->size)
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s=%d exceeds %s=%d", n->csize,
                         w->cross_size, n->size, w->size);
    return KOLO_OK;
}

int kolo__env_port_from(const char *key)
{
    uint64_t h = kolo__fnv1a(key ? key : "", key ? strlen(key) : 0);
    h ^= h >> 29; /* FNV's low bits mix weakly; fold the high ones in */
    return 20000 + (int)(h % 12768u);
}

static bool job_char_ok(char c) { return isalnum((unsigned char)c) || strchr("._:@-", c) != NULL; }

static void set_job_id(kolo__world_info *w, const char *raw)
{
    size_t n = strlen(raw);
    bool ok = n > 0 && n < sizeof(w->job_id);
    for (size_t i = 0; ok && i < n; i++) ok = job_char_ok(raw[i]);
    if (ok) {
        memcpy(w->job_id, raw, n + 1);
        return;
    }
    size_t keep = KOLO_MIN(n, (size_t)48), j = 0;
    for (size_t i = 0; i < keep; i++) w->job_id[j++] = job_char_ok(raw[i]) ? raw[i] : '_';
    snprintf(w->job_id + j, sizeof(w->job_id) - j, "-%016llx", (unsigned long long)kolo__fnv1a(raw, strlen(raw)));
}

bool kolo__parse_hostport(const char *s, char *host, size_t cap, int *port)
{
    if (!s || !host || !port || cap == 0) return false;
    const char *hb, *he, *colon;
    if (s[0] == '[') {
        hb = s + 1;
        he = strchr(hb, ']');
        if (!he || he[1] != ':') return false;
        colon = he + 1;
    } else {
        hb = s;
        colon = strchr(s, ':');
        if (!colon || strchr(colon + 1, ':')) return false; /* a bare IPv6 address needs brackets */
        he = colon;
    }
    size_t hl = (size_t)(he - hb);
    if (hl == 0 || hl >= cap) return false;
    for (const char *p = hb; p < he; p++)
        if (isspace((unsigned char)*p) || *p == '[' || *p == ']' || *p == '/') return false;
    int p;
    if (!parse_uint(colon + 1, &p) || p < 1 || p > 65535) return false;
    memcpy(host, hb, hl);
    host[hl] = '\0';
    *port = p;
    return true;
}

/* ---- Slurm lists ---- */

static bool host_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_'; }

/* One host expression of a Slurm list ("rack[1-2]-n[08-09]"): literal runs and bracket groups
 * of ranges, each range's numbers as wide as its lower bound's digits (zero padding kept). */
#define HL_GROUPS 8
#define HL_RANGES 64
typedef struct hl_range {
    unsigned long long lo, hi;
    int width;
} hl_range;
typedef struct hl_expr {
    int ngroups;
    const char *lit[HL_GROUPS + 1]; /* the literal before group g, and after the last */
    size_t litlen[HL_GROUPS + 1];
    int nranges[HL_GROUPS];
    hl_range range[HL_GROUPS][HL_RANGES];
} hl_expr;

static bool parse_number(const char **pp, unsigned long long *v, int *width)
{
    const char *p = *pp;
    while (isdigit((unsigned char)*p)) p++;
    size_t n = (size_t)(p - *pp);
    if (n == 0 || n > 18) return false;
    *v = strtoull(*pp, NULL, 10);
    *width = (int)n;
    *pp = p;
    return true;
}

/* Parses the expression starting at *pp up to ',' or the end; false when malformed. */
static bool parse_expr(const char **pp, hl_expr *e)
{
    const char *p = *pp;
    memset(e, 0, sizeof(*e));
    e->lit[0] = p;
    bool empty = true;
    while (*p && *p != ',') {
        if (*p == '[') {
            if (e->ngroups == HL_GROUPS) return false;
            int g = e->ngroups++;
            e->litlen[g] = (size_t)(p - e->lit[g]);
            p++;
            for (;;) {
                hl_range *r = &e->range[g][e->nranges[g]];
                if (e->nranges[g] == HL_RANGES || !parse_number(&p, &r->lo, &r->width)) return false;
                r->hi = r->lo;
                if (*p == '-') {
                    p++;
                    int w;
                    if (!parse_number(&p, &r->hi, &w) || r->hi < r->lo) return false;
                }
                e->nranges[g]++;
                if (*p == ',') {
                    p++;
                    continue;
                }
                if (*p != ']') return false;
                p++;
                break;
            }
            e->lit[g + 1] = p;
        } else if (host_char(*p)) {
            p++;
        } else {
            return false;
        }
        empty = false;
    }
    if (empty) return false;
    e->litlen[e->ngroups] = (size_t)(p - e->lit[e->ngroups]);
    *pp = p;
    return true;
}

typedef struct hl_walk {
    bool (*each)(const char *host, void *arg);
    void *arg;
    long count, limit;
    bool stop;
} hl_walk;

/* Emits every host of e from group g on, after the n characters already in buf. */
static bool expand(const hl_expr *e, int g, char *buf, size_t n, size_t cap, hl_walk *w)
{
    if (n + e->litlen[g] >= cap) return false;
    memcpy(buf + n, e->lit[g], e->litlen[g]);
    n += e->litlen[g];
    if (g == e->ngroups) {
        buf[n] = '\0';
        if (++w->count > w->limit) return false;
        if (!w->each(buf, w->arg)) w->stop = true;
        return true;
    }
    for (int i = 0; i < e->nranges[g] && !w->stop; i++)
        for (unsigned long long v = e->range[g][i].lo; v <= e->range[g][i].hi && !w->stop; v++) {
            int k = snprintf(buf + n, cap - n, "%0*llu", e->range[g][i].width, v);
            if (k < 0 || (size_t)k >= cap - n || !expand(e, g + 1, buf, n + (size_t)k, cap, w)) return false;
        }
    return true;
}

long kolo__slurm_hosts(const char *nodelist, bool (*each)(const char *host, void *arg), void *arg)
{
    if (!nodelist) return -1;
    /* the whole list must parse before any host is given out */
    hl_expr e;
    for (const char *p = nodelist;;) {
        if (!parse_expr(&p, &e)) return -1;
        if (!*p) break;
        p++;
    }
    hl_walk w = {each, arg, 0, 1L << 20, false};
    char buf[256];
    for (const char *p = nodelist; !w.stop;) {
        parse_expr(&p, &e);
        if (!expand(&e, 0, buf, 0, sizeof(buf), &w)) return -1;
        if (!*p) break;
        p++;
    }
    return w.count;
}

typedef struct first_host_arg {
    char *out;
    size_t cap;
    bool fits;
} first_host_arg;

static bool take_first(const char *host, void *arg)
{
    first_host_arg *f = arg;
    f->fits = strlen(host) < f->cap;
    if (f->fits) memcpy(f->out, host, strlen(host) + 1);
    return false;
}

bool kolo__slurm_first_host(const char *nodelist, char *out, size_t cap)
{
    if (!out || cap == 0) return false;
    first_host_arg f = {out, cap, false};
    return kolo__slurm_hosts(nodelist, take_first, &f) > 0 && f.fits;
}

bool kolo__slurm_tasks_on_node(const char *tpn, int node, int *count)
{
    if (!tpn || !*tpn || node < 0) return false;
    const char *p = tpn;
    long long seen = 0;
    int found = -1;
    for (;;) {
        char *end;
        if (!isdigit((unsigned char)*p)) return false;
        unsigned long c = strtoul(p, &end, 10);
        p = end;
        unsigned long rep = 1;
        if (*p == '(') {
            if (p[1] != 'x' || !isdigit((unsigned char)p[2])) return false;
            rep = strtoul(p + 2, &end, 10);
            if (*end != ')' || rep == 0) return false;
            p = end + 1;
        }
        if (c == 0 || c > INT_MAX || rep > INT_MAX) return false;
        if (found < 0 && node < seen + (long long)rep) found = (int)c;
        seen += (long long)rep;
        if (!*p) break;
        if (*p != ',') return false;
        p++;
    }
    if (found < 0) return false;
    *count = found;
    return true;
}

/* ---- conventions ---- */

/* What detection has found so far, besides the world info itself. */
typedef struct ctx {
    bool have_rdv;          /* KOLO_RENDEZVOUS parsed into rdv_host/rdv_port */
    char rdv_host[256];
    int rdv_port;
    const char *rdv_text;
    char jid[640];          /* raw job id before set_job_id */
} ctx;

static void use_override(kolo__world_info *w, const ctx *c, int serve)
{
    snprintf(w->rdv_host, sizeof(w->rdv_host), "%s", c->rdv_host);
    w->rdv_port = c->rdv_port;
    w->rdv_serve = serve;
}

/* The identifier every rank computes when the launcher names no job. */
static void fallback_jid(const ctx *c, const char *source, char *out, size_t cap)
{
    if (c->have_rdv) snprintf(out, cap, "%s-rdv-%s", source, c->rdv_text);
    else snprintf(out, cap, "%s-ppid%d-uid%u", source, (int)getppid(), (unsigned)getuid());
}

/* Ranks on one host, no address given: rank 0 serves on loopback at a derived port.
 * Requires the job id to be final (KOLO_JOB_ID already applied). */
static void serve_loopback(kolo__world_info *w)
{
    snprintf(w->rdv_host, sizeof(w->rdv_host), "127.0.0.1");
    w->rdv_port = kolo__env_port_from(w->job_id);
    w->rdv_serve = 1;
}

static void apply_job_id(kolo__world_info *w, const ctx *c)
{
    const char *user = var("KOLO_JOB_ID");
    set_job_id(w, user ? user : c->jid);
}

static int from_kolo(kolo__world_info *w, ctx *c)
{
    static const names n = {"KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
                            "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"};
    int s = read_ints(&n, "KOLO_RANK and KOLO_SIZE go together", w);
    if (s) return s;
    const char *server = kolo__setting_str(KOLO_SET_RENDEZVOUS_SERVER);
    bool rank0 = strcmp(server, "rank0") == 0;
    if (!rank0 && strcmp(server, "launcher") != 0)
        return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_RENDEZVOUS_SERVER='%s' is neither launcher nor rank0", server);
    if (c->have_rdv) use_override(w, c, rank0);
    else if (w->size > 1)
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "KOLO_SIZE=%d but KOLO_RENDEZVOUS is not set: kolorun sets both; when starting "
                         "ranks by hand, set KOLO_RENDEZVOUS=host:port (a free port on rank 0's host) and "
                         "KOLO_RENDEZVOUS_SERVER=rank0", w->size);
    if (c->have_rdv) snprintf(c->jid, sizeof(c->jid), "kolo-%s", c->rdv_text);
    else snprintf(c->jid, sizeof(c->jid), "kolo-pid%d", (int)getpid());
    apply_job_id(w, c);
    return KOLO_OK;
}

static int from_horovod(kolo__world_info *w, ctx *c)
{
    static const names n = {"HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                            "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"};
    int s = read_ints(&n, "HOROVOD_RANK and HOROVOD_SIZE go together", w);
    if (s) return s;
    const char *ha = var("HOROVOD_GLOO_RENDEZVOUS_ADDR"), *hp = var("HOROVOD_GLOO_RENDEZVOUS_PORT");
    if (ha && hp) snprintf(c->jid, sizeof(c->jid), "horovod-%s:%s", ha, hp);
    else fallback_jid(c, "horovod", c->jid, sizeof(c->jid));
    apply_job_id(w, c);
    if (c->have_rdv) use_override(w, c, 1);
    else if (w->size == 1) {
        /* a world of one needs no store */
    } else if (w->local_size == w->size) serve_loopback(w);
    else
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "horovod: %d ranks on %s hosts and no address for kolo's store (horovodrun's "
                         "rendezvous speaks another protocol): set KOLO_RENDEZVOUS=host:port to a free port "
                         "on rank 0's host, e.g. horovodrun ... with KOLO_RENDEZVOUS exported",
                         w->size, w->local_size < 0 ? "unknown" : "several");
    return KOLO_OK;
}

/* torchrun's MASTER_PORT, or a TrainJob's PET_MASTER_PORT (prefix "PET_"): *port, -1 when unset. */
static int master_port(const char *prefix, int *port)
{
    char name[32];
    snprintf(name, sizeof(name), "%sMASTER_PORT", prefix);
    const char *v = var(name);
    *port = -1;
    if (v && (!parse_uint(v, port) || *port < 1 || *port > 65535))
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s='%s' is not a port (1-65535)", name, v);
    return KOLO_OK;
}

/* Rank 0 serves beside the port torchrun's agent holds with its own TCPStore (or would, in a
 * TrainJob's pod: the program may start torch.distributed's store there itself): at
 * <prefix>MASTER_ADDR, <prefix>MASTER_PORT + 1. `what` names the variables that made the world. */
static int serve_beside_master(kolo__world_info *w, const ctx *c, const char *prefix, const char *ma, int mport,
                               const char *what)
{
    if (c->have_rdv) {
        use_override(w, c, 1);
        return KOLO_OK;
    }
    if (w->size == 1) return KOLO_OK;
    if (!ma || mport < 0)
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "%s=%d are set but %sMASTER_%s is not; set %sMASTER_ADDR and %sMASTER_PORT (or "
                         "KOLO_RENDEZVOUS=host:port)", what, w->size, prefix, ma ? "PORT" : "ADDR", prefix, prefix);
    if (strlen(ma) >= sizeof(w->rdv_host))
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %sMASTER_ADDR is too long (%zu bytes)", prefix,
                         strlen(ma));
    snprintf(w->rdv_host, sizeof(w->rdv_host), "%s", ma);
    w->rdv_port = mport < 65535 ? mport + 1 : mport - 1;
    w->rdv_serve = 1;
    return KOLO_OK;
}

static int from_torchrun(kolo__world_info *w, ctx *c)
{
    static const names n = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                            "GROUP_WORLD_SIZE"};
    int s = read_ints(&n, "torchrun sets RANK and WORLD_SIZE", w);
    if (s) return s;
    const char *ma = var("MASTER_ADDR");
    int mport;
    if ((s = master_port("", &mport))) return s;
    const char *run = var("TORCHELASTIC_RUN_ID"), *restart = var("TORCHELASTIC_RESTART_COUNT");
    int rc = 0;
    if (restart && !parse_uint(restart, &rc))
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "environment variable TORCHELASTIC_RESTART_COUNT='%s' is not a non-negative integer", restart);
    if (ma && mport > 0)
        snprintf(c->jid, sizeof(c->jid), "torch-%s-r%d-%s:%d", run ? run : "none", rc, ma, mport);
    else {
        char fb[512];
        fallback_jid(c, "torch", fb, sizeof(fb));
        snprintf(c->jid, sizeof(c->jid), "%s-%s-r%d", fb, run ? run : "none", rc);
    }
    apply_job_id(w, c);
    return serve_beside_master(w, c, "", ma, mport, "torchrun: RANK and WORLD_SIZE");
}

/* "slurm-<job>.<step>" into out; false (out untouched) when SLURM_JOB_ID is not set. */
static bool slurm_key(char *out, size_t cap)
{
    const char *job = var("SLURM_JOB_ID"), *step = var("SLURM_STEP_ID");
    if (!job) job = var("SLURM_JOBID");
    if (!step) step = var("SLURM_STEPID");
    if (!job) return false;
    snprintf(out, cap, "slurm-%s.%s", job, step ? step : "none");
    return true;
}

/* Whether a PMIx server gave this process its address (PMIX_SERVER_URI, ..._URI4, ...): a
 * namespace alone (the unit tests, a stale environment) is not worth a client's start-up. */
static bool pmix_server_known(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "PMIX_SERVER_URI", 15) == 0 && strchr(*e, '=') && strchr(*e, '=')[1]) return true;
    return false;
}

/* KOLO_START_TIMEOUT for the PMI and PMIx exchanges, which count whole seconds: rounded up, as
 * truncated 0.5 s was 0 (a PMI answer then had to be there already; PMIx took 0 for its 30 s).
 * kolo__env_detect has refused values outside (0, 1e7] before any of them asks. */
static int pmi_timeout_s(void) { return (int)ceil(kolo__setting_double(KOLO_SET_START_TIMEOUT)); }

/* Whether Slurm's address goes through a PMIx server (srun --mpi=pmix). */
static bool slurm_pmix(void) { return pmix_server_known() && kolo__pmix_loadable(); }

/* Slurm's address for this job step. Under srun --mpi=pmix (a PMIx server in every node's
 * slurmstepd) rank 0 publishes its address and a port it found free through PMIx, a collective
 * (pmix_rdv.c): no port that another program on the node may hold, no node name the other nodes
 * must resolve. Its address is the one towards its node's name in Slurm's list (the interface
 * that name stands for), else, where the name does not resolve or resolves to loopback, towards
 * srun's host (SLURM_LAUNCH_NODE_IPADDR). Otherwise (no PMIx server, or no libpmix.so.2 to speak
 * to it) every rank computes the same address: the first host of the node list, and a port
 * derived from the job and step ids. Not through srun --mpi=pmi2's PMI_FD: the process has one
 * such connection, and an MPI library in it (MPI_Init, also after kolo_init) needs it to itself. */
static int slurm_address(kolo__world_info *w, const char *source)
{
    const char *list = var("SLURM_STEP_NODELIST");
    const char *lname = "SLURM_STEP_NODELIST";
    if (!list) list = var(lname = "SLURM_JOB_NODELIST");
    if (!list) list = var(lname = "SLURM_NODELIST");
    char host[256] = "", key[320];
    bool listed = list && kolo__slurm_first_host(list, host, sizeof(host));
    if (slurm_pmix()) {
        const char *iface = kolo__setting_str(KOLO_SET_IFACE), *towards = NULL;
        int timeout = pmi_timeout_s();
        char addr[64], hp[300];
        if (w->rank == 0 && !*iface) {
            towards = var("SLURM_LAUNCH_NODE_IPADDR");
            if (listed && kolo__route_address(host, 0, addr, sizeof(addr)) == KOLO_OK && strncmp(addr, "127.", 4) != 0)
                towards = host;
        }
        /* Open MPI's mpirun inside an allocation, one rank per node: its own server */
        const char *whose = strcmp(source, "openmpi") == 0 ? "mpirun's" : "Slurm's";
        int st = kolo__pmix_rendezvous(w->rank, iface, towards, timeout, hp, sizeof(hp));
        if (st == KOLO_OK && kolo__parse_hostport(hp, w->rdv_host, sizeof(w->rdv_host), &w->rdv_port)) {
            w->rdv_serve = 1;
            KOLO_INFO("%s: rendezvous at %s:%d, rank 0's address through %s PMIx server", source, w->rdv_host,
                      w->rdv_port, whose);
            return KOLO_OK;
        }
        return kolo__err(KOLO_ERR_STARTUP,
                         "%s: rank 0's address could not be exchanged through %s PMIx server (%s): set "
                         "KOLO_RENDEZVOUS=host:port to a free port on %s in every rank's environment",
                         source, whose, st == KOLO_OK ? hp : kolo__errmsg(), *host ? host : "the step's first node");
    }
    if (!list)
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "%s: none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set, so "
                         "rank 0's host is unknown; set KOLO_RENDEZVOUS=host:port", source);
    if (!listed)
        return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s='%s' is not a Slurm host list", lname, list);
    if (!slurm_key(key, sizeof(key)))
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "%s: SLURM_JOB_ID is not set, so no rendezvous port can be derived; set "
                         "KOLO_RENDEZVOUS=host:port", source);
    snprintf(w->rdv_host, sizeof(w->rdv_host), "%s", host);
    w->rdv_port = kolo__env_port_from(key);
    w->rdv_serve = 1;
    KOLO_INFO("%s: rendezvous at the first host of Slurm's node list, %s:%d", source, w->rdv_host, w->rdv_port);
    return KOLO_OK;
}

/* Whether Slurm's variables describe this very process in this very world. */
static bool slurm_matches(int rank, int size)
{
    int r, n;
    const char *nt = var("SLURM_NTASKS");
    if (!nt) nt = var("SLURM_NPROCS");
    return parse_uint(var("SLURM_PROCID"), &r) && parse_uint(nt, &n) && r == rank && n == size;
}

/* Open MPI, PMI, PMIx: no address; see the top of the file. */
static int mpi_address(kolo__world_info *w, ctx *c, const char *source, const char *launcher_jid)
{
    if (launcher_jid) snprintf(c->jid, sizeof(c->jid), "%s-%s", source, launcher_jid);
    else fallback_jid(c, source, c->jid, sizeof(c->jid));
    apply_job_id(w, c);
    if (c->have_rdv) {
        use_override(w, c, 1);
        return KOLO_OK;
    }
    if (w->size == 1) return KOLO_OK;
    if (w->local_size == w->size) {
        serve_loopback(w);
        return KOLO_OK;
    }
    if (slurm_matches(w->rank, w->size)) {
        int st = slurm_address(w, source);
        /* after the collective exchange, its result; else, without the node list or a job id,
         * the ways below */
        if (st == KOLO_OK || slurm_pmix()) return st;
    }
    const char *how = w->local_size < 0 ? "on hosts the launcher does not describe" : "on several hosts";
    const char *example = strcmp(source, "pmi") == 0 ? "mpirun -genv KOLO_RENDEZVOUS node1:29400 ..."
                                                     : "mpirun -x KOLO_RENDEZVOUS=node1:29400 ...";
    /* a PMI-1 connection (MPICH's Hydra; under srun, PMI_FD speaks Slurm's PMI-2 instead), else a
     * PMIx server in every host's daemon (mpirun of Open MPI): rank 0 publishes its address */
    const char *via = kolo__pmi_available() && !slurm_matches(w->rank, w->size) ? "PMI"
                      : pmix_server_known()                                   ? "PMIx"
                                                                              : NULL;
    if (via) {
        char hp[300];
        const char *iface = kolo__setting_str(KOLO_SET_IFACE);
        int timeout = pmi_timeout_s();
        int st = via[3] ? kolo__pmix_rendezvous(w->rank, iface, NULL, timeout, hp, sizeof(hp))
                        : kolo__pmi_rendezvous(w->rank, iface, timeout, hp, sizeof(hp));
        if (st == KOLO_OK && kolo__parse_hostport(hp, w->rdv_host, sizeof(w->rdv_host), &w->rdv_port)) {
            w->rdv_serve = 1;
            KOLO_INFO("%s: rendezvous at %s:%d, rank 0's address through %s", source, w->rdv_host, w->rdv_port, via);
            return KOLO_OK;
        }
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "%s: %d ranks %s, and rank 0's address could not be exchanged through the launcher's %s "
                         "(%s): set KOLO_RENDEZVOUS=host:port to a free port on rank 0's host in every rank's "
                         "environment (e.g. %s)",
                         source, w->size, how, via, st == KOLO_OK ? hp : kolo__errmsg(), example);
    }
    return kolo__err(KOLO_ERR_INVALID_ARG,
                     "%s: %d ranks %s and the launcher gives no rendezvous address: set "
                     "KOLO_RENDEZVOUS=host:port to a free port on rank 0's host in every rank's environment "
                     "(e.g. %s)",
                     source, w->size, how, example);
}

static int from_openmpi(kolo__world_info *w, ctx *c)
{
    static const names n = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL};
    int s = read_ints(&n, "mpirun sets both", w);
    if (s) return s;
    const char *id = var("OMPI_MCA_ess_base_jobid");
    if (!id) id = var("PMIX_NAMESPACE");
    return mpi_address(w, c, "openmpi", id);
}

static int from_pmi(kolo__world_info *w, ctx *c)
{
    names n = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", NULL, NULL};
    if (!var("MPI_LOCALRANKID") && !var("MPI_LOCALNRANKS")) {
        n.lrank = "PMI_LOCAL_RANK";
        n.lsize = "PMI_LOCAL_SIZE";
    }
    int timeout = pmi_timeout_s(), s;
    bool by_port = !var("PMI_RANK"); /* mpiexec -pmi-port: rank and size come through the connection */
    if (by_port) {
        if ((s = kolo__pmi_identity(&w->rank, &w->size, timeout)) || (s = opt_int(n.lrank, &w->local_rank)) ||
            (s = opt_int(n.lsize, &w->local_size)) || (s = check_pair(n.lrank, w->local_rank, n.lsize, w->local_size)))
            return s;
        if (w->local_size > w->size)
            return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s=%d exceeds the PMI server's size %d",
                             n.lsize, w->local_size, w->size);
    } else if ((s = read_ints(&n, "the process manager sets PMI_RANK and PMI_SIZE", w))) {
        return s;
    }
    const char *id = var("PMI_KVSNAME");
    if (!id) id = var("PMI_JOBID");
    /* Hydra names the job only through the connection: use it where it is used anyway (across
     * hosts, where the ranks' parents differ, or under -pmi-port) */
    char kvs[257];
    bool across = w->size > 1 && w->local_size != w->size && !c->have_rdv;
    if (!id && kolo__pmi_available() && (by_port || across) && !slurm_matches(w->rank, w->size) &&
        kolo__pmi_kvsname(kvs, sizeof(kvs), timeout) == KOLO_OK)
        id = kvs;
    return mpi_address(w, c, "pmi", id);
}

static int from_pmix(kolo__world_info *w, ctx *c)
{
    names n = {"PMIX_RANK", var("PMI_SIZE") ? "PMI_SIZE" : "PMIX_SIZE", NULL, NULL, NULL, NULL};
    int s = read_ints(&n, "PMIx gives the size only through a query: set KOLO_SIZE, or start with "
                          "mpirun or srun, which also set their own size variables", w);
    if (s) return s;
    return mpi_address(w, c, "pmix", var("PMIX_NAMESPACE"));
}

static int from_slurm(kolo__world_info *w, ctx *c)
{
    names n = {"SLURM_PROCID", var("SLURM_NTASKS") || !var("SLURM_NPROCS") ? "SLURM_NTASKS" : "SLURM_NPROCS",
               "SLURM_LOCALID", NULL, "SLURM_NODEID",
               var("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES"};
    int s = read_ints(&n, "srun sets SLURM_PROCID and SLURM_NTASKS", w);
    if (s) return s;
    if (w->size > 1 && !var("SLURM_STEP_ID") && !var("SLURM_STEPID"))
        KOLO_WARN("slurm: SLURM_NTASKS=%d but no SLURM_STEP_ID: this looks like a batch script rather than "
                  "a task started by srun; start every rank with srun", w->size);
    /* Local size: the step's own list, then the job's (which describes the allocation and
     * can disagree with a smaller step: then it is dropped, it is only a hint). */
    const char *tpn = var("SLURM_STEP_TASKS_PER_NODE");
    const char *tname = "SLURM_STEP_TASKS_PER_NODE";
    if (!tpn) tpn = var(tname = "SLURM_TASKS_PER_NODE");
    int ls = -1;
    if (tpn) {
        if (!kolo__slurm_tasks_on_node(tpn, 0, &ls))
            return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable %s='%s' is not a Slurm tasks-per-node list",
                             tname, tpn);
        if (w->cross_rank < 0 || !kolo__slurm_tasks_on_node(tpn, w->cross_rank, &ls)) ls = -1;
    } else if (var("SLURM_NTASKS_PER_NODE")) {
        if ((s = opt_int("SLURM_NTASKS_PER_NODE", &ls))) return s;
        if (ls == 0) ls = -1;
    }
    if (ls > w->size || (w->local_rank >= 0 && ls >= 0 && w->local_rank >= ls)) ls = -1;
    w->local_size = ls;
    if (c->have_rdv || w->size == 1) {
        if (!slurm_key(c->jid, sizeof(c->jid))) fallback_jid(c, "slurm", c->jid, sizeof(c->jid));
        apply_job_id(w, c);
        if (c->have_rdv) use_override(w, c, 1);
        return KOLO_OK;
    }
    if ((s = slurm_address(w, "slurm"))) return s;
    slurm_key(c->jid, sizeof(c->jid));
    apply_job_id(w, c);
    return KOLO_OK;
}

/* Kubeflow's TrainJob without torchrun (see the top of the file). Pods do not share /dev/shm or
 * a network namespace, so each is a host of one rank: TCP between all of them.
 *
 * A TrainJob's pods start as the scheduler finds them nodes and the nodes pull the image, minutes
 * apart where a node must be added or an image is large, and the program in each calls kolo_init
 * at once. KOLO_START_TIMEOUT's 30 s (Horovod's, for processes one launcher starts together) would
 * fail such a job and have Kubernetes restart it, so without the setting these ranks wait 10
 * minutes: torchrun's own rendezvous, which the pods would otherwise go through, gives its nodes
 * 600 s (static and c10d), and Flyte's Kubeflow plugin 15 minutes. Under torchrun the agents
 * assemble before starting any worker, so the workers keep the 30 s. */
#define PET_START_TIMEOUT 600.0

static int from_pet(kolo__world_info *w, ctx *c)
{
    const char *nn = var("PET_NNODES"), *colon = strchr(nn, ':');
    int lo = -1, hi = -1, s;
    if (colon) {
        /* torchrun's MIN:MAX; a fixed count may be written N:N */
        char first[32];
        size_t len = (size_t)(colon - nn);
        snprintf(first, sizeof(first), "%.*s", (int)KOLO_MIN(len, sizeof(first) - 1), nn);
        if (!parse_uint(first, &lo) || !parse_uint(colon + 1, &hi) || lo < 1 || hi < lo)
            return kolo__err(KOLO_ERR_INVALID_ARG, "environment variable PET_NNODES='%s' is neither a node count nor "
                             "MIN:MAX", nn);
        if (lo != hi)
            return kolo__err(KOLO_ERR_INVALID_ARG,
                             "PET_NNODES=%s is an elastic range of nodes, which only torchrun can form: start the "
                             "program with torchrun (it reads PET_*), or give a fixed count", nn);
        w->size = lo;
    } else if ((s = opt_int("PET_NNODES", &w->size))) {
        return s;
    }
    if ((s = opt_int("PET_NODE_RANK", &w->rank)) || (s = check_pair("PET_NODE_RANK", w->rank, "PET_NNODES", w->size)))
        return s;
    w->local_rank = 0;
    w->local_size = 1;
    w->cross_rank = w->rank;
    w->cross_size = w->size;
    const char *np = var("PET_NPROC_PER_NODE");
    int per = 1;
    if (np && (!parse_uint(np, &per) || per != 1) && w->rank == 0 && w->size > 1)
        KOLO_WARN("pet: PET_NPROC_PER_NODE=%s, but this process was not started by torchrun, which would start that "
                  "many in each pod: the job is one rank per pod, %d in all (start the program with torchrun for "
                  "more)", np, w->size);
    const char *ma = var("PET_MASTER_ADDR");
    int mport;
    if ((s = master_port("PET_", &mport))) return s;
    if (ma && mport > 0) snprintf(c->jid, sizeof(c->jid), "pet-%s:%d", ma, mport);
    else fallback_jid(c, "pet", c->jid, sizeof(c->jid));
    apply_job_id(w, c);
    return serve_beside_master(w, c, "PET_", ma, mport, "pet: PET_NODE_RANK and PET_NNODES");
}

static int from_nothing(kolo__world_info *w, ctx *c)
{
    w->rank = 0;
    w->size = 1;
    w->local_rank = w->cross_rank = 0;
    w->local_size = w->cross_size = 1;
    snprintf(c->jid, sizeof(c->jid), "single-pid%d-uid%u", (int)getpid(), (unsigned)getuid());
    apply_job_id(w, c);
    return KOLO_OK;
}

static int make_secret(kolo__world_info *w)
{
    const char *sec = kolo__setting_str(KOLO_SET_SECRET);
    if (*sec) {
        size_t n = strlen(sec);
        if (n >= sizeof(w->secret))
            return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_SECRET is %zu bytes long; at most %zu are allowed", n,
                             sizeof(w->secret) - 1);
        memcpy(w->secret, sec, n + 1);
        w->secret_len = n;
        w->secret_derived = 0;
        return KOLO_OK;
    }
    uint8_t mac[KOLO_MAC_LEN];
    int s = kolo__hmac(mac, w->job_id, strlen(w->job_id), "kolo-derived-secret", NULL, 0);
    if (s) return s;
    for (size_t i = 0; i < sizeof(mac); i++) snprintf(w->secret + 2 * i, 3, "%02x", mac[i]);
    w->secret_len = 2 * sizeof(mac);
    w->secret_derived = 1;
    if (w->size > 1)
        KOLO_INFO("KOLO_SECRET is not set: using a secret derived from the job id '%s'; connections are "
                  "protected against accidents (another job's ranks), not against an attacker",
                  w->job_id);
    return KOLO_OK;
}

int kolo__env_detect(kolo__world_info *out)
{
    if (!out) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo__env_detect: out is NULL");
    /* read as seconds and as whole seconds below (the PMI and PMIx exchanges), and waited out by
     * the mesh: 0, a negative, "inf" or "nan" gave up at once or converted without a defined
     * value (a fuzzer's find) */
    double start_s = kolo__setting_double(KOLO_SET_START_TIMEOUT);
    if (!(start_s > 0 && start_s <= 1e7))
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "environment variable KOLO_START_TIMEOUT (or HOROVOD_GLOO_TIMEOUT_SECONDS)='%s' is not a "
                         "number of seconds above 0 and up to 10000000",
                         kolo__setting_str(KOLO_SET_START_TIMEOUT));
    kolo__world_info w;
    memset(&w, 0, sizeof(w));
    w.local_rank = w.local_size = w.cross_rank = w.cross_size = -1;
    ctx c;
    memset(&c, 0, sizeof(c));
    const char *rdv = kolo__setting_str(KOLO_SET_RENDEZVOUS);
    if (*rdv) {
        if (!kolo__parse_hostport(rdv, c.rdv_host, sizeof(c.rdv_host), &c.rdv_port))
            return kolo__err(KOLO_ERR_INVALID_ARG,
                             "environment variable KOLO_RENDEZVOUS='%s' is not host:port ([v6addr]:port for "
                             "IPv6; port 1-65535)", rdv);
        c.have_rdv = true;
        c.rdv_text = rdv;
    }

    int s;
    const char *src;
    if (var("KOLO_RANK") || var("KOLO_SIZE")) {
        src = "kolo";
        s = from_kolo(&w, &c);
    } else if (var("HOROVOD_RANK") || var("HOROVOD_SIZE")) {
        src = "horovod";
        s = from_horovod(&w, &c);
    } else if (var("RANK") && var("WORLD_SIZE")) {
        src = "torchrun";
        s = from_torchrun(&w, &c);
    } else if (var("OMPI_COMM_WORLD_RANK")) {
        src = "openmpi";
        s = from_openmpi(&w, &c);
    } else if (var("PMI_RANK") || (var("PMI_PORT") && var("PMI_ID"))) {
        src = "pmi";
        s = from_pmi(&w, &c);
    } else if (var("PMIX_RANK") && (var("PMI_SIZE") || var("PMIX_SIZE") || !var("SLURM_PROCID"))) {
        src = "pmix";
        s = from_pmix(&w, &c);
    } else if (var("PMIX_RANK") && strcmp(var("PMIX_RANK"), var("SLURM_PROCID")) != 0) {
        return kolo__err(KOLO_ERR_INVALID_ARG,
                         "pmix: PMIX_RANK='%s' but SLURM_PROCID='%s' and no size variable: set KOLO_RANK and "
                         "KOLO_SIZE, or KOLO_RENDEZVOUS with PMI_SIZE", var("PMIX_RANK"), var("SLURM_PROCID"));
    } else if (var("SLURM_PROCID")) {
        src = "slurm";
        s = from_slurm(&w, &c);
    } else if (var("PET_NNODES") && var("PET_NODE_RANK")) {
        src = "pet";
        s = from_pet(&w, &c);
    } else {
        if (var("RANK") || var("WORLD_SIZE"))
            KOLO_WARN("%s is set but %s is not: not a torchrun environment; running as a world of one",
                      var("RANK") ? "RANK" : "WORLD_SIZE", var("RANK") ? "WORLD_SIZE" : "RANK");
        if (var("PET_NNODES") || var("PET_NODE_RANK"))
            KOLO_WARN("%s is set but %s is not: not a TrainJob's environment; running as a world of one",
                      var("PET_NNODES") ? "PET_NNODES" : "PET_NODE_RANK",
                      var("PET_NNODES") ? "PET_NODE_RANK" : "PET_NNODES");
        src = "none";
        s = from_nothing(&w, &c);
    }
    if (s) return s;
    snprintf(w.source, sizeof(w.source), "%s", src);
    if (w.size == 1 && !c.have_rdv) {
        w.rdv_host[0] = '\0';
        w.rdv_port = 0;
        w.rdv_serve = 0;
    }
    if ((s = make_secret(&w))) return s;
    w.start_timeout = start_s;
    if (strcmp(src, "pet") == 0 && !kolo__setting_is_set(KOLO_SET_START_TIMEOUT)) w.start_timeout = PET_START_TIMEOUT;
    KOLO_DEBUG("environment: %s, rank %d of %d (local %d of %d, cross %d of %d), store %s:%d%s, job %s",
               w.source, w.rank, w.size, w.local_rank, w.local_size, w.cross_rank, w.cross_size,
               w.rdv_port ? w.rdv_host : "-", w.rdv_port, w.rdv_serve ? " (rank 0 serves)" : "", w.job_id);
    *out = w;
    return KOLO_OK;
}
