/* hosts.c - the host list (-H, --hostfile, a batch system's allocation, default), rank placement,
 * and which hosts are this machine. */
#include "kolorun.h"

#include "../../src/boot/env.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

const char *kr_hostname(void)
{
    static char name[KR_HOST_MAX];
    if (!name[0]) {
        if (gethostname(name, sizeof(name) - 1) != 0 || !name[0]) snprintf(name, sizeof(name), "localhost");
        name[sizeof(name) - 1] = '\0';
    }
    return name;
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

bool kr_host_is_local(const char *name)
{
    if (strcasecmp(name, "localhost") == 0 || strcmp(name, "::1") == 0 || strncmp(name, "127.", 4) == 0)
        return true;
    const char *me = kr_hostname();
    if (strcasecmp(name, me) == 0) return true;
    /* "node1" against "node1.cluster" and the other way round */
    size_t nl = strcspn(name, "."), ml = strcspn(me, ".");
    if (nl == ml && strncasecmp(name, me, nl) == 0 && (!name[nl] || !me[ml])) return true;

    /* An address (or a name resolving to one) of one of our interfaces. Names that do not
     * resolve here may still mean something to ssh (its config's Host aliases): remote. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0) return false;
    struct ifaddrs *ifs = NULL;
    bool local = false;
    if (getifaddrs(&ifs) == 0) {
        for (struct addrinfo *ai = res; ai && !local; ai = ai->ai_next) {
            if (ai->ai_family == AF_INET &&
                (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127)
                local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && same_addr(i->ifa_addr, ai->ai_addr)) local = true;
        }
        freeifaddrs(ifs);
    }
    freeaddrinfo(res);
    return local;
}

/* The UDP connect() trick: no packet is sent, but the kernel picks the route and with it
 * the source address that the host would see us as. */
bool kr_route_source(const char *host, char *out, size_t cap)
{
    if (kr_host_is_local(host)) {
        snprintf(out, cap, "127.0.0.1");
        return true;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0) return false;
    bool ok = false;
    for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        memset(&ss, 0, sizeof(ss)); /* getsockname fills it on success; zeroed, as in src/net/tcp.c */
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            const void *a = ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                                    : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
            char txt[INET6_ADDRSTRLEN];
            if (inet_ntop(ss.ss_family, a, txt, sizeof(txt))) {
                /* an IPv6 address needs brackets in host:port */
                if (ss.ss_family == AF_INET6) snprintf(out, cap, "[%s]", txt);
                else snprintf(out, cap, "%s", txt);
                ok = true;
            }
        }
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

bool kr_valid_host_name(const char *s, size_t n)
{
    if (n == 0 || n >= KR_HOST_MAX || s[0] == '-') return false; /* a leading - would be an ssh option */
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '.' || s[i] == '-' || s[i] == '_')) return false;
    return true;
}

/* The hosts' names by hash: a host listed twice is found without comparing each host with every
 * other, which for a long Slurm range ("n[1-100000]") or PBS node file took minutes (hours for the
 * million hosts a Slurm list may expand to). One per parser, with the room it gave o->hosts. */
typedef struct host_index {
    int *at;      /* 1 + the host's index in o->hosts; 0: free */
    size_t cap;   /* a power of two, over twice the hosts */
    int room;     /* hosts o->hosts has room for, as this index grew it (0: not grown yet) */
} host_index;

static size_t name_slot(const host_index *x, const char *name, size_t n)
{
    uint64_t h = 14695981039346656037ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)name[i]) * 1099511628211ULL;
    return (size_t)h & (x->cap - 1);
}

/* The index in o->hosts of the host named so, or -1. */
static int find_host(const kr_opts *o, const host_index *x, const char *name, size_t n)
{
    if (!x->cap) return -1;
    for (size_t k = name_slot(x, name, n);; k = (k + 1) & (x->cap - 1)) {
        int i = x->at[k] - 1;
        if (i < 0) return -1;
        if (strlen(o->hosts[i].name) == n && strncmp(o->hosts[i].name, name, n) == 0) return i;
    }
}

static void index_put(host_index *x, const char *name, int i)
{
    size_t k = name_slot(x, name, strlen(name));
    while (x->at[k]) k = (k + 1) & (x->cap - 1);
    x->at[k] = i + 1;
}

static int add_host(kr_opts *o, host_index *x, const char *name, size_t nlen, long slots, const char *where)
{
    if (find_host(o, x, name, nlen) >= 0)
        return kr_usage_error("%s: host '%.*s' is listed twice", where, (int)nlen, name);
    int n = o->nhosts;
    if (n >= x->room) { /* the array doubles, whatever room it had before this parser */
        int room = n ? 2 * n : 16;
        kr_host *grown = realloc(o->hosts, (size_t)room * sizeof(*grown));
        if (!grown) return kr_usage_error("out of memory");
        o->hosts = grown;
        x->room = room;
    }
    /* the index gets its table with the first host (x->at is NULL until then, as find_host knows),
     * and stays under half full */
    if (!x->cap || 2 * (size_t)(n + 1) > x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 32;
        int *at = calloc(cap, sizeof(*at));
        if (!at) return kr_usage_error("out of memory");
        free(x->at);
        x->at = at;
        x->cap = cap;
        for (int i = 0; i < n; i++) index_put(x, o->hosts[i].name, i);
    }
    kr_host *h = &o->hosts[o->nhosts++];
    memset(h, 0, sizeof(*h));
    memcpy(h->name, name, nlen);
    h->name[nlen] = '\0';
    h->slots = (int)slots;
    index_put(x, h->name, n);
    return 0;
}

static bool parse_slots(const char *s, size_t n, long *out)
{
    if (n == 0 || n > 7) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1) return false;
    *out = v;
    return true;
}

/* -H h1:2,h2:4 (a host without ":N" has one slot, as with mpirun). */
static int parse_hosts_arg(kr_opts *o, const char *arg)
{
    const char *p = arg;
    host_index x = {0};
    int r = 0;
    for (int item = 1; !r; item++) {
        size_t n = strcspn(p, ",");
        const char *colon = memchr(p, ':', n);
        size_t hl = colon ? (size_t)(colon - p) : n;
        long slots = 1;
        char where[64];
        snprintf(where, sizeof(where), "-H item %d", item);
        if (!kr_valid_host_name(p, hl))
            r = kr_usage_error("-H '%s': item %d '%.*s' is not host:slots (e.g. node1:4,node2:4)", arg, item, (int)n,
                               p);
        else if (colon && !parse_slots(colon + 1, n - hl - 1, &slots))
            r = kr_usage_error("-H '%s': item %d '%.*s' has no valid slot count after ':'", arg, item, (int)n, p);
        else r = add_host(o, &x, p, hl, slots, where);
        if (!p[n]) break;
        p += n + 1;
    }
    free(x.at);
    return r;
}

/* Lines "host", "host slots=N [max_slots=M]" (Open MPI, Horovod) or "host:N" (MPICH). */
static int parse_hostfile(kr_opts *o, const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f) return kr_usage_error("--hostfile %s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, r = 0;
    host_index x = {0};
    for (long got; (got = kr_read_line(f, line, sizeof(line))) != -1;) {
        lineno++;
        char where[512];
        snprintf(where, sizeof(where), "%.400s:%d", path, lineno);
        if (got < 0) {
            r = kr_usage_error("%s: %s", where, kr_read_line_problem(got, sizeof(line)));
            break;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = line;
        while (isspace((unsigned char)*s)) s++;
        size_t len = strlen(s);
        while (len && isspace((unsigned char)s[len - 1])) s[--len] = '\0';
        if (!len) continue;
        size_t hl = strcspn(s, " \t:");
        long slots = 1;
        const char *rest = s + hl;
        if (*rest == ':') {
            if (!parse_slots(rest + 1, strlen(rest + 1), &slots)) {
                r = kr_usage_error("%s: '%s': expected 'host slots=N' or 'host:N'", where, s);
                break;
            }
        } else {
            /* key=value words; slots= sets the count, max_slots= is accepted and ignored */
            bool bad = false;
            while (*rest && !bad) {
                while (isspace((unsigned char)*rest)) rest++;
                size_t wl = strcspn(rest, " \t");
                if (wl > 6 && strncmp(rest, "slots=", 6) == 0) {
                    if (!parse_slots(rest + 6, wl - 6, &slots)) bad = true;
                } else if (wl > 10 && strncmp(rest, "max_slots=", 10) == 0) {
                    long ignored;
                    if (!parse_slots(rest + 10, wl - 10, &ignored)) bad = true;
                } else if (wl) {
                    bad = true;
                }
                rest += wl;
            }
            if (bad) {
                r = kr_usage_error("%s: '%s': expected 'host slots=N' or 'host:N'", where, s);
                break;
            }
        }
        if (!kr_valid_host_name(s, hl)) {
            r = kr_usage_error("%s: '%.*s' is not a host name", where, (int)hl, s);
            break;
        }
        r = add_host(o, &x, s, hl, slots, where);
        if (r) break;
    }
    if (!r && ferror(f)) r = kr_usage_error("--hostfile %s: read error", path);
    fclose(f);
    free(x.at);
    if (!r && o->nhosts == 0) r = kr_usage_error("--hostfile %s: no hosts in the file", path);
    return r;
}

/* ---- a batch system's allocation ---- */

static const char *env_var(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

const char *kr_allocation(void)
{
    if (env_var("SLURM_JOB_NODELIST") || env_var("SLURM_NODELIST")) return "Slurm";
    if (env_var("PBS_NODEFILE")) return "PBS";
    if (env_var("LSB_MCPU_HOSTS")) return "LSF";
    return NULL;
}

typedef struct slurm_ctx {
    kr_opts *o;
    const char *tasks, *tasks_var, *list, *list_var;
    int node, r;
    host_index x;
} slurm_ctx;

static bool add_slurm_host(const char *host, void *arg)
{
    slurm_ctx *c = arg;
    /* Slurm's own names never start with '-', but a list from the environment is text like any
     * other: a host "-oX" would reach ssh as an option (kr_valid_host_name, as for -H) */
    if (!kr_valid_host_name(host, strlen(host))) {
        c->r = kr_usage_error("Slurm allocation: %s='%s': node %d '%s' is not a host name", c->list_var, c->list,
                              c->node, host);
        return false;
    }
    int slots;
    if (!kolo__slurm_tasks_on_node(c->tasks, c->node, &slots)) {
        c->r = kr_usage_error("Slurm allocation: %s='%s' gives no count for node %d (%s) of %s", c->tasks_var,
                              c->tasks, c->node, host, c->list);
        return false;
    }
    c->node++;
    c->r = add_host(c->o, &c->x, host, strlen(host), slots, "the Slurm allocation");
    return c->r == 0;
}

/* Slurm: SLURM_JOB_NODELIST, slots per node from SLURM_TASKS_PER_NODE (the tasks sbatch/salloc
 * was given), else SLURM_JOB_CPUS_PER_NODE; both "4(x2),2". */
static int slurm_hosts(kr_opts *o, char *what, size_t cap)
{
    const char *lv = env_var("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
    slurm_ctx c = {o, env_var("SLURM_TASKS_PER_NODE"), "SLURM_TASKS_PER_NODE", env_var(lv), lv, 0, 0, {0}};
    if (!c.tasks) {
        c.tasks_var = "SLURM_JOB_CPUS_PER_NODE";
        c.tasks = env_var(c.tasks_var);
    }
    if (!c.tasks)
        return kr_usage_error("Slurm allocation %s='%s': neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE "
                              "is set, so the slots per node are unknown; give -H", lv, c.list);
    snprintf(what, cap, "the Slurm allocation (%s=%s, %s=%s)", lv, c.list, c.tasks_var, c.tasks);
    long listed = kolo__slurm_hosts(c.list, add_slurm_host, &c);
    free(c.x.at);
    if (listed < 0 && !c.r) return kr_usage_error("Slurm allocation: %s='%s' is not a Slurm host list", lv, c.list);
    return c.r;
}

/* PBS/Torque: PBS_NODEFILE has a line per slot, a host's lines usually together. */
static int pbs_hosts(kr_opts *o, char *what, size_t cap)
{
    const char *path = env_var("PBS_NODEFILE");
    snprintf(what, cap, "the PBS allocation (PBS_NODEFILE=%s)", path);
    FILE *f = fopen(path, "re");
    if (!f) return kr_usage_error("PBS allocation: PBS_NODEFILE=%s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, r = 0;
    host_index x = {0};
    for (long got; !r && (got = kr_read_line(f, line, sizeof(line))) != -1;) {
        lineno++;
        if (got < 0) {
            r = kr_usage_error("PBS allocation: %s:%d: %s", path, lineno, kr_read_line_problem(got, sizeof(line)));
            break;
        }
        size_t n = strcspn(line, " \t\r");
        if (n == 0) continue;
        if (!kr_valid_host_name(line, n)) {
            r = kr_usage_error("PBS allocation: %s:%d: '%.*s' is not a host name", path, lineno, (int)n, line);
            break;
        }
        int i = find_host(o, &x, line, n); /* a line per slot */
        if (i >= 0) o->hosts[i].slots++;
        else r = add_host(o, &x, line, n, 1, "the PBS allocation");
    }
    if (!r && ferror(f)) r = kr_usage_error("PBS allocation: PBS_NODEFILE=%s: read error", path);
    fclose(f);
    free(x.at);
    if (!r && o->nhosts == 0) r = kr_usage_error("PBS allocation: PBS_NODEFILE=%s names no host", path);
    return r;
}

/* LSF: LSB_MCPU_HOSTS="hostA 4 hostB 4". */
static int lsf_hosts(kr_opts *o, char *what, size_t cap)
{
    const char *v = env_var("LSB_MCPU_HOSTS");
    snprintf(what, cap, "the LSF allocation (LSB_MCPU_HOSTS=%s)", v);
    host_index x = {0};
    int r = 0;
    for (const char *p = v; !r;) {
        p += strspn(p, " ");
        if (!*p) break;
        size_t hl = strcspn(p, " ");
        const char *q = p + hl + strspn(p + hl, " ");
        size_t sl = strcspn(q, " ");
        long slots;
        if (!kr_valid_host_name(p, hl) || !parse_slots(q, sl, &slots))
            r = kr_usage_error("LSF allocation: LSB_MCPU_HOSTS='%s' is not 'host slots host slots ...'", v);
        else r = add_host(o, &x, p, hl, slots, "the LSF allocation");
        p = q + sl;
    }
    free(x.at);
    if (r) return r;
    return o->nhosts ? 0 : kr_usage_error("LSF allocation: LSB_MCPU_HOSTS is empty");
}

/* The hosts of the allocation kolorun runs in, when it spans other hosts than this one; on this
 * host alone, the default (np slots here) stays, so a job may still oversubscribe its node. */
static int allocation_hosts(kr_opts *o, char *what, size_t cap)
{
    const char *a = kr_allocation();
    int r = !a ? -1 : strcmp(a, "Slurm") == 0 ? slurm_hosts(o, what, cap)
                    : strcmp(a, "PBS") == 0   ? pbs_hosts(o, what, cap)
                                              : lsf_hosts(o, what, cap);
    if (r) return r;
    if (o->nhosts == 1 && kr_host_is_local(o->hosts[0].name)) {
        if (!o->np) o->np = o->hosts[0].slots;
        o->nhosts = 0;
        return -1;
    }
    return 0;
}

int kr_hosts_resolve(kr_opts *o)
{
    int r = 0;
    char what[1200];
    snprintf(what, sizeof(what), "%s", o->hosts_arg ? "-H" : "--hostfile");
    bool alloc = false;
    if (o->hosts_arg) r = parse_hosts_arg(o, o->hosts_arg);
    else if (o->hostfile) r = parse_hostfile(o, o->hostfile);
    else if ((r = allocation_hosts(o, what, sizeof(what))) == -1) {
        host_index x = {0};
        r = add_host(o, &x, "localhost", strlen("localhost"), o->np, "default hosts");
        free(x.at);
    } else {
        alloc = r == 0;
    }
    if (r) return r;
    long total = 0;
    for (int i = 0; i < o->nhosts; i++) total += o->hosts[i].slots;
    if (!o->np) o->np = total > (1 << 20) ? (1 << 20) : (int)total;
    if (o->np > total)
        return kr_usage_error("-np %d is more than the %ld slot%s of %s%s", o->np, total, total == 1 ? "" : "s", what,
                              alloc ? ": give -H to place the workers yourself" : "");
    if (o->launcher == KR_LAUNCH_SRUN && !env_var("SLURM_JOB_ID"))
        return kr_usage_error("--launcher srun starts workers as steps of a Slurm job: run kolorun inside one "
                              "(salloc, sbatch)");
    o->use_srun = o->launcher == KR_LAUNCH_SRUN ||
                  (o->launcher == KR_LAUNCH_AUTO && alloc && strcmp(kr_allocation(), "Slurm") == 0 && !o->ssh_given);
    if (alloc) {
        char list[600] = "";
        for (int i = 0; i < o->nhosts && strlen(list) < 500; i++)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s:%d", i ? "," : "", o->hosts[i].name,
                     o->hosts[i].slots);
        kr_say("hosts from %s: %s%s (-H overrides)%s", what, list, strlen(list) >= 500 ? ",..." : "",
               o->use_srun ? "; remote workers start with srun, a step each (--launcher ssh for ssh)" : "");
    }
    for (int i = 0; i < o->nhosts; i++) o->hosts[i].local = kr_host_is_local(o->hosts[i].name);
    return 0;
}

/* Host-major placement, as horovodrun's get_host_assignments: ranks fill the first host's
 * slots, then the next host's. cross_rank is this host's index among the hosts that have a
 * rank with the same local_rank; cross_size the number of such hosts. */
void kr_hosts_assign(const kr_opts *o, kr_rank *ranks)
{
    int rank = 0;
    for (int h = 0; h < o->nhosts && rank < o->np; h++) {
        int first = rank;
        for (int s = 0; s < o->hosts[h].slots && rank < o->np; s++, rank++) {
            ranks[rank].rank = rank;
            ranks[rank].host = h;
            ranks[rank].local_rank = s;
        }
        for (int r = first; r < rank; r++) ranks[r].local_size = rank - first;
    }
    /* The hosts come in order, so a rank's cross rank is the number of hosts before its own with
     * a rank of its local rank: one pass, where comparing every rank with every host took minutes
     * for a long Slurm range. */
    int *hosts_with = calloc((size_t)(o->np > 0 ? o->np : 1), sizeof(int)); /* by local rank */
    for (int r = 0; r < o->np; r++) ranks[r].cross_rank = hosts_with ? hosts_with[ranks[r].local_rank]++ : 0;
    for (int r = 0; r < o->np; r++) ranks[r].cross_size = hosts_with ? hosts_with[ranks[r].local_rank] : 1;
    free(hosts_with);
}
