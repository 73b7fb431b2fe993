/* bind.c - CPU topology from /sys and the --map-by/--bind-to placement of local workers.
 *
 * The topology is the CPUs kolorun itself may run on (sched_getaffinity: a cpuset or taskset
 * around kolorun is respected), grouped into cores (package id + core id: hyperthreads of
 * one core stay together), sockets (package id) and NUMA nodes (/sys/devices/system/node).
 * --map-by picks, for each local rank in order, a core: slot and core take the cores in
 * order; socket and numa go round-robin over the domains, so neighbouring ranks land on
 * different sockets (Open MPI's meaning). --bind-to then widens that core to the CPU set the
 * rank may use: the core, its socket or its NUMA node. More ranks than cores wrap around.
 *
 * --bind-to auto (the default) leaves the workers unbound while a host has no more of them than
 * CPUs, and otherwise binds each to one CPU, in blocks of neighbouring local ranks (CPUs in
 * core order; 4 workers on 2 CPUs: 0 and 1 on the first, 2 and 3 on the second), whatever
 * --map-by says; where other processes are bound to single CPUs, the larger blocks go to the CPUs
 * with fewer of them (place_blocks). Unbound, the kernel left three of four workers on one of two CPUs for a few
 * hundred milliseconds at a time, and the fourth alone on the other, so that the same calls
 * took twice as long; Open MPI's workers too. Blocks of neighbours ran rings and broadcasts'
 * chains up to 11 % faster than ranks dealt round the CPUs (docs/kolorun.md, "More workers
 * than CPUs", has the figures). */
#include "kolorun.h"

#include "../../src/net/transport.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int cpu_first;            /* lowest CPU number of the core */
    int package, core_id, node;
    cpu_set_t cpus;
} core_t;

/* Parses a cpulist ("0-3,8,10-11", as /sys and /proc/PID/status write them) into set. */
static bool parse_cpulist(const char *p, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (*p && *p != '\n') {
        char *end;
        long a = strtol(p, &end, 10);
        if (end == p) return false;
        long b = a;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            p = end;
        }
        for (long c = a; c <= b && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
        if (*p == ',') p++;
    }
    return true;
}

static bool read_cpulist(const char *path, cpu_set_t *set)
{
    FILE *f = fopen(path, "re");
    if (!f) return false;
    char buf[4096];
    bool ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    CPU_ZERO(set);
    return ok && parse_cpulist(buf, set);
}

/* The processes bound to one CPU each, counted per CPU into pinned[] (other jobs' bound workers:
 * another kolorun's on a crowded host, Open MPI's under --bind-to core, taskset -c N). Kernel
 * threads (PF_KTHREAD), which every CPU has alike, and this kolorun's own children are not
 * counted. Returns how many were counted. */
static int count_pinned(int *pinned)
{
    memset(pinned, 0, CPU_SETSIZE * sizeof(int));
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int total = 0;
    pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue; /* gone, or not ours to read */
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *q = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
        int ppid = 0;
        unsigned long flags = 0;
        if (!q || sscanf(q + 1, " %*c %d %*d %*d %*d %*d %lu", &ppid, &flags) != 2) continue;
        if ((flags & 0x00200000ul) || ppid == me) continue; /* PF_KTHREAD; our own workers */
        snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
        if (!(f = fopen(path, "re"))) continue;
        cpu_set_t set;
        bool have = false;
        while (fgets(buf, sizeof(buf), f))
            if (strncmp(buf, "Cpus_allowed_list:", 18) == 0) {
                have = parse_cpulist(buf + 18 + strspn(buf + 18, " \t"), &set);
                break;
            }
        fclose(f);
        if (!have || CPU_COUNT(&set) != 1) continue;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) pinned[c]++, total++;
    }
    closedir(d);
    return total;
}

/* Which CPU each block of a crowded host's ranks goes to: place[s] = an index into order[] for
 * the block of slot s (slot = local rank x CPUs / local ranks). Where other processes are bound
 * to single CPUs, the larger blocks go to the CPUs with fewer of them: two crowded jobs at once
 * (3 workers each on 2 CPUs) stacked 4 workers on the first CPU and 2 on the second, each job
 * putting its block of two there; now the second job's block of two goes to the second CPU.
 * Otherwise (and for elastic jobs, whose workers are placed one at a time as they start, so
 * every start must map slots to the same CPUs) slot s on order[s]. Tells the user the placement
 * when it is not the plain one and --report-bindings is on. */
static void place_blocks(const kr_opts *o, const int *order, int ncpus, int nlocal, int *place)
{
    for (int s = 0; s < ncpus; s++) place[s] = s;
    if (o->elastic) return;
    static int pinned[CPU_SETSIZE];
    if (count_pinned(pinned) == 0) return;
    bool even = true;
    for (int s = 1; s < ncpus; s++) even &= pinned[order[s]] == pinned[order[0]];
    if (even) return;
    /* block sizes by slot; slots by size, larger first, and CPUs by what is bound there, fewer
     * first (both stable: ties keep core order) */
    int size[CPU_SETSIZE] = {0}, slots[CPU_SETSIZE], cpus[CPU_SETSIZE];
    for (int lr = 0; lr < nlocal; lr++) size[(int)((long)lr * ncpus / nlocal)]++;
    for (int s = 0; s < ncpus; s++) slots[s] = cpus[s] = s;
    for (int i = 1; i < ncpus; i++)
        for (int j = i; j > 0 && size[slots[j]] > size[slots[j - 1]]; j--) {
            int t = slots[j];
            slots[j] = slots[j - 1], slots[j - 1] = t;
        }
    for (int i = 1; i < ncpus; i++)
        for (int j = i; j > 0 && pinned[order[cpus[j]]] < pinned[order[cpus[j - 1]]]; j--) {
            int t = cpus[j];
            cpus[j] = cpus[j - 1], cpus[j - 1] = t;
        }
    for (int i = 0; i < ncpus; i++) place[slots[i]] = cpus[i];
    if (o->report_bindings) {
        char list[512];
        size_t w = 0;
        list[0] = '\0';
        for (int s = 0; s < ncpus && w < sizeof(list) - 32; s++)
            w += (size_t)snprintf(list + w, sizeof(list) - w, "%scpu %d: %d", s ? ", " : "", order[s], pinned[order[s]]);
        kr_say("other processes bound to one CPU here (%s): the larger blocks of workers go to the CPUs with fewer",
               list);
    }
}

static void format_cpus(const cpu_set_t *set, char *out, size_t cap)
{
    size_t w = 0;
    out[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
        int n = e > c ? snprintf(out + w, cap - w, "%s%d-%d", w ? "," : "", c, e)
                      : snprintf(out + w, cap - w, "%s%d", w ? "," : "", c);
        if (n < 0 || (size_t)n >= cap - w) break;
        w += (size_t)n;
        c = e;
    }
}

static int cmp_core(const void *a, const void *b)
{
    const core_t *x = a, *y = b;
    if (x->package != y->package) return x->package < y->package ? -1 : 1;
    if (x->core_id != y->core_id) return x->core_id < y->core_id ? -1 : 1;
    return x->cpu_first < y->cpu_first ? -1 : x->cpu_first > y->cpu_first;
}

/* Distinct values of a domain key, in order of first appearance among sorted cores. */
static int domain_of(const core_t *c, enum kr_map m) { return m == KR_MAP_NUMA ? c->node : c->package; }

int kr_bind_plan(const kr_opts *o, kr_rank *ranks, int n)
{
    if (o->bind_to == KR_BIND_NONE && !o->report_bindings) return 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        kr_say("error: --bind-to: sched_getaffinity: %s", strerror(errno));
        return KR_EXIT_LAUNCH;
    }
    /* cpu -> numa node */
    static int node_of[CPU_SETSIZE];
    for (int c = 0; c < CPU_SETSIZE; c++) node_of[c] = 0;
    for (int nd = 0; nd < 1024; nd++) {
        char path[128];
        cpu_set_t s;
        snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nd);
        if (!read_cpulist(path, &s)) continue;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &s)) node_of[c] = nd;
    }
    core_t *cores = calloc(CPU_SETSIZE, sizeof(core_t));
    if (!cores) {
        kr_say("error: out of memory");
        return KR_EXIT_LAUNCH;
    }
    int ncores = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        int pkg, core;
        kolo__cpu_place(c, &pkg, &core);
        int k = 0;
        while (k < ncores && !(cores[k].package == pkg && cores[k].core_id == core)) k++;
        if (k == ncores) {
            cores[k].cpu_first = c;
            cores[k].package = pkg;
            cores[k].core_id = core;
            cores[k].node = node_of[c];
            CPU_ZERO(&cores[k].cpus);
            ncores++;
        }
        CPU_SET(c, &cores[k].cpus);
    }
    if (ncores == 0) {
        free(cores);
        kr_say("error: --bind-to: no CPU available to kolorun");
        return KR_EXIT_LAUNCH;
    }
    qsort(cores, (size_t)ncores, sizeof(core_t), cmp_core);

    int doms[CPU_SETSIZE];
    int ndoms = 0;
    enum kr_map m = o->map_by;
    if (m == KR_MAP_SOCKET || m == KR_MAP_NUMA) {
        for (int k = 0; k < ncores; k++) {
            int d = domain_of(&cores[k], m), j = 0;
            while (j < ndoms && doms[j] != d) j++;
            if (j == ndoms) doms[ndoms++] = d;
        }
    }
    /* auto: the CPUs core by core, each core's in order (the library's order, which KOLO_BIND=auto
     * deals out alike) */
    static int order[CPU_SETSIZE];
    int nallowed = kolo__cpus_in_core_order(&allowed, order);
    int max_local = 0;
    for (int i = 0; i < n; i++) max_local = ranks[i].local_size > max_local ? ranks[i].local_size : max_local;
    if (o->bind_to == KR_BIND_CORE && max_local > ncores)
        kr_say("warning: %d workers on one host but only %d cores: some share a core", max_local, ncores);
    /* the workers of a crowded host here (more than the CPUs): their blocks' sizes, not those of
     * a larger host elsewhere, decide where the blocks go */
    static int place[CPU_SETSIZE];
    int crowd = 0;
    for (int i = 0; i < n; i++)
        if (o->hosts[ranks[i].host].local && ranks[i].local_size > nallowed && ranks[i].local_size > crowd)
            crowd = ranks[i].local_size;
    if (o->bind_to == KR_BIND_AUTO && crowd) place_blocks(o, order, nallowed, crowd, place);
    else
        for (int s = 0; s < nallowed; s++) place[s] = s;

    for (int i = 0; i < n; i++) {
        kr_rank *r = &ranks[i];
        if (!o->hosts[r->host].local) continue;
        int lr = r->local_rank, pick = 0;
        if (ndoms > 0) {
            /* the (lr / ndoms)-th core of domain lr % ndoms, wrapping inside the domain */
            int d = doms[lr % ndoms], want = lr / ndoms, inside = 0;
            for (int k = 0; k < ncores; k++) inside += domain_of(&cores[k], m) == d;
            int idx = want % inside, cnt = 0;
            for (int k = 0; k < ncores; k++)
                if (domain_of(&cores[k], m) == d && cnt++ == idx) pick = k;
        } else {
            pick = lr % ncores;
        }
        bool crowded = o->bind_to == KR_BIND_AUTO && r->local_size > nallowed && lr < r->local_size;
        int slot = crowded ? place[(int)((long)lr * nallowed / r->local_size)] : 0;
        if (crowded)
            for (int k = 0; k < ncores; k++)
                if (CPU_ISSET(order[slot], &cores[k].cpus)) pick = k;
        const core_t *c = &cores[pick];
        CPU_ZERO(&r->cpus);
        switch (o->bind_to) {
        case KR_BIND_AUTO:
            if (crowded) CPU_SET(order[slot], &r->cpus);
            else r->cpus = allowed;
            break;
        case KR_BIND_CORE: r->cpus = c->cpus; break;
        case KR_BIND_SOCKET:
        case KR_BIND_NUMA:
            for (int k = 0; k < ncores; k++) {
                bool same = o->bind_to == KR_BIND_SOCKET ? cores[k].package == c->package : cores[k].node == c->node;
                if (same) CPU_OR(&r->cpus, &r->cpus, &cores[k].cpus);
            }
            break;
        case KR_BIND_NONE: r->cpus = allowed; break;
        }
        r->bound = crowded || (o->bind_to != KR_BIND_NONE && o->bind_to != KR_BIND_AUTO);
        char list[96];
        format_cpus(&r->cpus, list, sizeof(list));
        snprintf(r->bind_desc, sizeof(r->bind_desc), "%s %s (core %d, socket %d, numa %d)",
                 r->bound ? "bound to cpus" : "not bound; may use cpus", list, c->core_id, c->package, c->node);
    }
    free(cores);
    return 0;
}
