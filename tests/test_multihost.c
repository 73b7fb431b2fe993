/* test_multihost.c - kolorun across real hosts: network namespaces with their own addresses, sshd in each, a job over ssh, a worker killed on one host.
 *
 * The cluster (needs root, `ip`, ssh, ssh-keygen and /usr/sbin/sshd; skipped with a message
 * otherwise): three network namespaces named after the test process, "ktmh<pid>-l", "-a" and
 * "-b". "l" is a login node holding a bridge (10.77.0.254/24) with a veth to each of the hosts
 * "a" (10.77.0.1) and "b" (10.77.0.2). Every address and every packet of the test stays inside
 * these namespaces; the machine's own interfaces and routes are not touched. Each host runs an
 * sshd of its own on port 2222, listening on the host's address only, with a host key and an
 * authorized key made for this run in a temporary directory (deleted at the end).
 *
 * The namespaces share the mount and pid namespaces with the machine, so /dev/shm is common to
 * all of them; what tells the hosts apart for kolo is its host key (boot id + network namespace),
 * confirmed by the peer mapping the creator's segment. The workers prove where they ran (their
 * network namespace inode is compared with the namespaces'), which transport each pair chose
 * (shared memory on one host, TCP between hosts, with the 10.77.0.x addresses in kolo's log) and
 * that collectives across both transports give exact results.
 *
 * Teardown does not depend on the test ending well. A guard process, forked before anything is
 * created and in a session of its own (the runner's timeout SIGKILLs the test's process group),
 * waits until the test's end of a pipe closes, however the test ended, then SIGKILLs every
 * process in the namespaces, deletes them and removes the directory. Namespaces of a run whose
 * guard died too are removed by the next run (the dead pid in their name says so). */
#include "kt.h"

#include "../src/coll/coll.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MH_NET "10.77.0"
#define MH_PORT "2222"
#define MH_NETNS_DIR "/var/run/netns" /* where `ip netns add` puts the namespaces (iproute2's NETNS_RUN_DIR) */
#define MH_PREFIX "ktmh"

enum { NS_L, NS_A, NS_B, NS_COUNT };
static const char *const ns_suffix[NS_COUNT] = {"l", "a", "b"};
static const char *const ns_addr[NS_COUNT] = {MH_NET ".254", MH_NET ".1", MH_NET ".2"};

/* ---- workers ---- */

static unsigned long long my_netns(void)
{
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* kolo-tests --worker mh_job [again]: where am I, which transport reaches each peer, and
 * collectives whose results are exact: a 4 MiB allreduce (ring over shm and tcp links), a
 * broadcast from the last rank. Prints one stdout line and one stderr line. Exits 9 when kolorun
 * started it with another launcher's variables beside its own. "again": then kolo_shutdown,
 * kolo_init once more (a new rendezvous) and an allreduce, with a second stdout line. */
KT_WORKER(mh_job)
{
    bool again = argc > 1 && strcmp(argv[1], "again") == 0;
    /* a worker kolorun starts sees kolorun's job only: no launcher's variables of its own (a
     * Slurm step's, when kolorun starts it through srun) */
    if (getenv("KOLO_RANK") && (getenv("SLURM_PROCID") || getenv("SLURM_STEP_ID"))) {
        fprintf(stderr, "mh: KOLO_RANK=%s beside SLURM_PROCID=%s\n", getenv("KOLO_RANK"),
                getenv("SLURM_PROCID") ? getenv("SLURM_PROCID") : "(unset)");
        return 9;
    }
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "mh: kolo_init: %s\n", kolo_last_error());
        return 3;
    }
    int rank = kolo_rank(), n = kolo_size();
    unsigned long long ns = my_netns(), *all = calloc((size_t)n, sizeof(*all));
    const size_t count = (size_t)1 << 20;
    int32_t *x = malloc(count * sizeof(*x)), *sum = malloc(count * sizeof(*sum));
    if (!all || !x || !sum) return 4;
    if (kolo_allgather(&ns, 1, all, NULL, KOLO_INT64, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "mh: allgather: %s\n", kolo_last_error());
        return 5;
    }
    /* "0=self 1=shm 2=tcp 3=tcp": shm exactly where the network namespace is the same */
    char tp[256] = "";
    size_t w = 0;
    int wrong_tp = 0;
    for (int p = 0; p < n && w < sizeof(tp) - 32; p++) {
        const char *t = kolo_peer_transport(p);
        const char *want = p == rank ? "self" : all[p] == ns ? "shm" : "tcp";
        if (!t || strcmp(t, want) != 0) wrong_tp++;
        w += (size_t)snprintf(tp + w, sizeof(tp) - w, "%s%d=%s", p ? " " : "", p, t ? t : "?");
    }
    for (size_t i = 0; i < count; i++) x[i] = (rank + 1) * (int32_t)(i % 1009);
    /* 4 MiB, hosts of equal rank counts: the hierarchical allreduce (coll/hier.c), by default */
    int ls = kolo_local_size(), cs = kolo_cross_size();
    uint64_t hier0 = kolo__coll_hier_runs(), want_hier = ls >= 2 && cs >= 2 && ls * cs == n;
    if (kolo_allreduce(x, sum, count, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "mh: allreduce: %s\n", kolo_last_error());
        return 6;
    }
    size_t bad = 0;
    uint64_t hier = kolo__coll_hier_runs() - hier0;
    for (size_t i = 0; i < count; i++) bad += sum[i] != n * (n + 1) / 2 * (int32_t)(i % 1009);
    for (size_t i = 0; i < count; i++) x[i] = rank == n - 1 ? (int32_t)(i * 3 + 7) : -1;
    if (kolo_broadcast(x, count, KOLO_INT32, n - 1, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "mh: broadcast: %s\n", kolo_last_error());
        return 7;
    }
    for (size_t i = 0; i < count; i++) bad += x[i] != (int32_t)(i * 3 + 7);
    printf("mh rank %d/%d local %d/%d cross %d/%d netns %llu transports %s hierarchical %llu: %s\n", rank, n,
           kolo_local_rank(), kolo_local_size(), kolo_cross_rank(), kolo_cross_size(), ns, tp,
           (unsigned long long)hier, bad || wrong_tp || hier != want_hier ? "WRONG" : "results exact");
    fflush(stdout);
    fprintf(stderr, "mh rank %d says goodbye on stderr\n", rank);
    free(all);
    free(x);
    free(sum);
    kolo_shutdown();
    if (bad || wrong_tp || hier != want_hier) return 8;
    if (again) {
        int one = 1, total = 0;
        if (kolo_init() != KOLO_OK || kolo_allreduce(&one, &total, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) {
            fprintf(stderr, "mh: after kolo_init again: %s\n", kolo_last_error());
            return 10;
        }
        printf("mh rank %d again: %d ranks\n", kolo_rank(), total);
        kolo_shutdown();
    }
    return 0;
}

/* kolo-tests --worker mh_hold [stubborn_rank]: says where it runs, then allreduces every 20 ms
 * until a collective fails, as a training loop would; then, like a training script, reports
 * the error and exits 1. The stubborn rank instead ignores SIGTERM and stays (a worker stuck
 * in a hung operation): only a SIGKILL ends it. */
KT_WORKER(mh_hold)
{
    int stubborn = argc > 1 ? atoi(argv[1]) : -1;
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "mh: kolo_init: %s\n", kolo_last_error());
        return 3;
    }
    int rank = kolo_rank(), one = 1, sum = 0;
    if (kolo_allreduce(&one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK || sum != kolo_size()) {
        fprintf(stderr, "mh: first allreduce: %s\n", kolo_last_error());
        return 5;
    }
    if (rank == stubborn) signal(SIGTERM, SIG_IGN);
    printf("mh rank %d ready pid %d netns %llu\n", rank, (int)getpid(), my_netns());
    fflush(stdout);
    for (int i = 0; i < 3000; i++) { /* a minute at most */
        int st = kolo_allreduce(&one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD);
        if (st != KOLO_OK) {
            fprintf(stderr, "mh rank %d: allreduce failed: %s\n", rank, kolo_last_error());
            if (rank != stubborn) {
                kolo_shutdown();
                return 1;
            }
            for (int k = 0; k < 600; k++) usleep(100000);
            return 10;
        }
        usleep(20000);
    }
    fprintf(stderr, "mh rank %d: nobody was killed\n", rank);
    return 9;
}

/* ---- processes ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Puts the calling process into network namespace `ns`. */
static int enter_netns(const char *ns)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", MH_NETNS_DIR, ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int r = setns(fd, CLONE_NEWNET);
    close(fd);
    return r;
}

typedef kt_proc proc;

static int setup_netns(void *ns) { return enter_netns(ns); }

/* Starts argv in network namespace ns (NULL: here) in a process group of its own, stdin
 * /dev/null, stdout and stderr captured. */
static void proc_start(proc *p, const char *ns, const char *const *argv)
{
    kt_proc_opts o = {.own_group = 1, .cap = 1 << 20, .child_setup = ns ? setup_netns : NULL,
                      .arg = (void *)(uintptr_t)ns};
    kt_proc_start(p, argv, &o);
}

/* ---- processes by network namespace ---- */

static unsigned long long netns_ino(const char *ns)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", MH_NETNS_DIR, ns);
    return stat(path, &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

static unsigned long long pid_netns(pid_t pid)
{
    char path[64], link[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0) return 0;
    link[n] = '\0';
    unsigned long long ino = 0;
    return sscanf(link, "net:[%llu]", &ino) == 1 ? ino : 0;
}

/* Calls fn for every process in network namespace ino (a process that ends meanwhile may be
 * skipped or passed once more; callers are written for both). Returns how many it found. */
static int for_each_in_netns(unsigned long long ino, void (*fn)(pid_t pid, void *arg), void *arg)
{
    if (!ino) return 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid_netns((pid_t)pid) != ino) continue;
        found++;
        if (fn) fn((pid_t)pid, arg);
    }
    closedir(d);
    return found;
}

static void kill_one(pid_t pid, void *arg)
{
    (void)arg;
    kill(pid, SIGKILL);
}

/* ---- the cluster ---- */

typedef struct {
    char tag[32];             /* "ktmh<pid>" */
    char dir[64];             /* keys, sshd configs and logs of this run */
    char ns[NS_COUNT][48];    /* "ktmh<pid>-l", "-a", "-b" */
    unsigned long long ino[NS_COUNT];
    pid_t sshd[NS_COUNT];     /* a and b only */
    pid_t guard;
    int guard_fd;             /* the test's end of the guard's pipe */
    char key[128];            /* the client's private key */
    char ssh[768];            /* kolorun's --ssh value */
} cluster;

/* Kills what is in the namespaces, deletes them, removes the directory. Idempotent. */
static void teardown(const char *const ns[], int nns, const char *dir)
{
    for (int pass = 0; pass < 100; pass++) { /* what is forking while we kill comes back for another pass */
        int found = 0;
        for (int i = 0; i < nns; i++) found += for_each_in_netns(netns_ino(ns[i]), kill_one, NULL);
        if (!found) break;
        usleep(20000);
    }
    char cmd[512];
    for (int i = 0; i < nns; i++) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s >/dev/null 2>&1", ns[i]);
        if (system(cmd)) {}
    }
    if (dir && dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd)) {}
    }
}

/* Namespaces of earlier runs whose test process is gone and whose guard did not clean up. */
static void sweep_stale(void)
{
    DIR *d = opendir(MH_NETNS_DIR);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0, len = 0;
        if (sscanf(e->d_name, MH_PREFIX "%d-%*1[lab]%n", &pid, &len) != 1 || !len || e->d_name[len] || pid <= 0) continue;
        if (pid != (int)getpid() && (kill(pid, 0) == 0 || errno != ESRCH)) continue; /* ours cannot exist yet */
        const char *one[1] = {e->d_name};
        teardown(one, 1, NULL);
    }
    closedir(d);
}

/* The guard: in a session of its own, stdio on /dev/null, it waits for end of file on its
 * pipe, then tears the cluster down. */
static void start_guard(cluster *c)
{
    int p[2];
    KT_ASSERT(pipe2(p, O_CLOEXEC) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid == 0) {
        close(p[1]);
        setsid();
        int dn = open("/dev/null", O_RDWR);
        dup2(dn, 0);
        dup2(dn, 1);
        dup2(dn, 2);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        char b;
        for (;;) {
            ssize_t r = read(p[0], &b, 1);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
        }
        const char *ns[NS_COUNT] = {c->ns[0], c->ns[1], c->ns[2]};
        teardown(ns, NS_COUNT, c->dir);
        _exit(0);
    }
    close(p[0]);
    c->guard = pid;
    c->guard_fd = p[1];
}

static void slurp(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs a shell command with its output appended to <dir>/setup.log; returns its status. */
static int sh(const cluster *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(const cluster *c, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    KT_ASSERT(n > 0 && (size_t)n < sizeof(cmd) - 200);
    snprintf(cmd + n, sizeof(cmd) - (size_t)n, " >>%s/setup.log 2>&1 </dev/null", c->dir);
    return system(cmd);
}

static void must(const cluster *c, int status, const char *what)
{
    if (status == 0) return;
    char path[128], log[8192];
    snprintf(path, sizeof(path), "%s/setup.log", c->dir);
    slurp(path, log, sizeof(log));
    kt_fail(__FILE__, __LINE__, "setting up the cluster: %s failed (status 0x%x); log:\n%s", what, status, log);
}

static bool have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* Ends the test with a skip line when this machine cannot host the cluster. */
static bool can_build(void)
{
    const char *why = NULL;
    if (geteuid() != 0) why = "not root (network namespaces need it; CI runs as root)";
    else if (!have("ip")) why = "no `ip` (apt-get install iproute2)";
    else if (access("/usr/sbin/sshd", X_OK) != 0) why = "no /usr/sbin/sshd (apt-get install openssh-server)";
    else if (!have("ssh") || !have("ssh-keygen")) why = "no ssh or ssh-keygen (apt-get install openssh-client)";
    if (why) printf("  skip: %s\n", why);
    return !why;
}

static void start_sshd(cluster *c, int h)
{
    char conf[128], pidf[128], log[128];
    snprintf(conf, sizeof(conf), "%s/sshd-%s.conf", c->dir, ns_suffix[h]);
    snprintf(pidf, sizeof(pidf), "%s/sshd-%s.pid", c->dir, ns_suffix[h]);
    snprintf(log, sizeof(log), "%s/sshd-%s.log", c->dir, ns_suffix[h]);
    FILE *f = fopen(conf, "w");
    KT_ASSERT(f);
    fprintf(f,
            "Port " MH_PORT "\nListenAddress %s\nHostKey %s/host_key\nPidFile %s\n"
            "AuthorizedKeysFile %s/user_key.pub\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\nPrintMotd no\n"
            "PrintLastLog no\nMaxStartups 64\nLogLevel ERROR\n",
            ns_addr[h], c->dir, pidf, c->dir);
    KT_ASSERT(fclose(f) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int dn = open("/dev/null", O_RDONLY);
        dup2(dn, 0);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (enter_netns(c->ns[h]) != 0) _exit(98);
        execl("/usr/sbin/sshd", "/usr/sbin/sshd", "-D", "-e", "-f", conf, (char *)NULL);
        _exit(99);
    }
    c->sshd[h] = pid;
}

/* sshd writes its pid file once it listens. */
static void wait_sshd(cluster *c, int h)
{
    char pidf[128], log[128], text[4096];
    snprintf(pidf, sizeof(pidf), "%s/sshd-%s.pid", c->dir, ns_suffix[h]);
    snprintf(log, sizeof(log), "%s/sshd-%s.log", c->dir, ns_suffix[h]);
    for (double end = now_s() + 10; access(pidf, F_OK) != 0;) {
        int st;
        if (waitpid(c->sshd[h], &st, WNOHANG) == c->sshd[h] || now_s() > end) {
            slurp(log, text, sizeof(text));
            kt_fail(__FILE__, __LINE__, "sshd in %s did not start; its log:\n%s", c->ns[h], text);
        }
        usleep(10000);
    }
}

/* Builds the cluster. Returns false (after printing a skip line) when this machine cannot. */
static bool cluster_up(cluster *c)
{
    memset(c, 0, sizeof(*c));
    c->guard_fd = -1;
    if (!can_build()) return false;
    double t0 = now_s();
    sweep_stale();
    snprintf(c->tag, sizeof(c->tag), MH_PREFIX "%d", (int)getpid());
    for (int i = 0; i < NS_COUNT; i++)
        snprintf(c->ns[i], sizeof(c->ns[i]), MH_PREFIX "%d-%s", (int)getpid(), ns_suffix[i]);
    snprintf(c->dir, sizeof(c->dir), "/tmp/kolo-multihost-XXXXXX");
    KT_ASSERT(mkdtemp(c->dir) != NULL);
    start_guard(c); /* from here on, however the test ends, the cluster goes */

    if (sh(c, "ip netns add %s", c->ns[NS_L]) != 0) {
        char path[128], log[2048];
        snprintf(path, sizeof(path), "%s/setup.log", c->dir);
        slurp(path, log, sizeof(log));
        log[strcspn(log, "\n")] = '\0';
        printf("  skip: cannot create network namespaces here (%s)\n", log);
        return false;
    }
    must(c, sh(c, "ip netns add %s && ip netns add %s", c->ns[NS_A], c->ns[NS_B]), "ip netns add");
    must(c,
         sh(c, "ip -n %1$s link set lo up && ip -n %1$s link add br0 type bridge && ip -n %1$s link set br0 up && "
               "ip -n %1$s addr add %2$s/24 dev br0",
            c->ns[NS_L], ns_addr[NS_L]),
         "the bridge in the login namespace");
    for (int h = NS_A; h <= NS_B; h++)
        must(c,
             sh(c, "ip -n %1$s link add v%3$s type veth peer name eth0 netns %2$s && ip -n %1$s link set v%3$s master br0 up && "
                   "ip -n %2$s link set lo up && ip -n %2$s addr add %4$s/24 dev eth0 && ip -n %2$s link set eth0 up",
                c->ns[NS_L], c->ns[h], ns_suffix[h], ns_addr[h]),
             "a host's veth");
    for (int i = 0; i < NS_COUNT; i++) {
        c->ino[i] = netns_ino(c->ns[i]);
        KT_ASSERT(c->ino[i] != 0);
    }

    /* Keys for this run only; sshd needs its privilege separation directory (Debian's
     * service unit makes it; here nothing may have). */
    must(c, sh(c, "ssh-keygen -q -t ed25519 -N '' -C kolo-multihost-host -f %1$s/host_key && "
                  "ssh-keygen -q -t ed25519 -N '' -C kolo-multihost-user -f %1$s/user_key", c->dir),
         "ssh-keygen");
    must(c, mkdir("/run/sshd", 0755) == 0 || errno == EEXIST ? 0 : errno, "mkdir /run/sshd");
    snprintf(c->key, sizeof(c->key), "%s/user_key", c->dir);
    /* -F /dev/null: neither the user's nor the system's ssh configuration takes part */
    snprintf(c->ssh, sizeof(c->ssh),
             "ssh -F /dev/null -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
             "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o IdentityAgent=none -o LogLevel=ERROR");
    for (int h = NS_A; h <= NS_B; h++) start_sshd(c, h);
    for (int h = NS_A; h <= NS_B; h++) wait_sshd(c, h);
    printf("  cluster %s-{l,a,b} up in %.2f s (%s)\n", c->tag, now_s() - t0, c->dir);
    return true;
}

/* Closes the guard's pipe and waits until it has torn everything down; checks that it did. */
static void cluster_down(cluster *c)
{
    if (c->guard_fd < 0) return;
    close(c->guard_fd);
    c->guard_fd = -1;
    double end = now_s() + 15;
    int st;
    while (waitpid(c->guard, &st, WNOHANG) != c->guard) {
        KT_ASSERTF(now_s() < end, "the teardown did not end within 15 s");
        usleep(10000);
    }
    for (int h = NS_A; h <= NS_B; h++)
        if (c->sshd[h] > 0) waitpid(c->sshd[h], &st, 0);
    for (int i = 0; i < NS_COUNT; i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", MH_NETNS_DIR, c->ns[i]);
        KT_ASSERTF(access(path, F_OK) != 0, "namespace %s is still there after teardown", c->ns[i]);
    }
    KT_ASSERTF(access(c->dir, F_OK) != 0, "%s is still there after teardown", c->dir);
}

typedef struct {
    const cluster *c;
    bool job_only;            /* count the job's processes, not the ssh sessions sshd is closing */
    char list[4096];
    size_t len;
    int extra;
} leftovers;

static void note_leftover(pid_t pid, void *arg)
{
    leftovers *l = arg;
    for (int h = NS_A; h <= NS_B; h++)
        if (pid == l->c->sshd[h]) return; /* the listening sshd is the host's, not the job's */
    char path[64], cmd[512] = "";
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, cmd, sizeof(cmd) - 1);
        close(fd);
        for (ssize_t i = 0; i < n - 1; i++)
            if (!cmd[i]) cmd[i] = ' ';
        if (n > 0) cmd[n] = '\0';
        if (n > 120) snprintf(cmd + 110, sizeof(cmd) - 110, "...");
    }
    if (!cmd[0]) return; /* a zombie on its way out, or already gone */
    if (l->job_only && strncmp(cmd, "sshd: ", 6) == 0) return;
    /* a Slurm test's daemons are the cluster's, not the job's (its steps' slurmstepd are the job's) */
    static const char *const daemons[] = {"/usr/sbin/slurmd ", "/usr/sbin/slurmctld ", "slurmctld: slurmscriptd",
                                          "/usr/sbin/munged "};
    for (size_t i = 0; i < sizeof(daemons) / sizeof(daemons[0]); i++)
        if (strncmp(cmd, daemons[i], strlen(daemons[i])) == 0) return;
    l->extra++;
    if (l->len < sizeof(l->list) - 200)
        l->len += (size_t)snprintf(l->list + l->len, sizeof(l->list) - l->len, "  pid %d: %s\n", (int)pid, cmd);
}

/* After the job: nothing may be left in any namespace but the hosts' listening sshd: no
 * worker, wrapper, watcher, ssh client or launcher guard the moment kolorun has returned
 * (job_only), and no ssh session either once sshd has closed them (within timeout). */
static void assert_no_leftovers(const cluster *c, bool job_only, double timeout)
{
    double end = now_s() + timeout;
    for (;;) {
        leftovers l = {.c = c, .job_only = job_only};
        for (int i = 0; i < NS_COUNT; i++) for_each_in_netns(c->ino[i], note_leftover, &l);
        if (!l.extra) return;
        if (now_s() > end)
            kt_fail(__FILE__, __LINE__, "%d process(es) left in the cluster %.0f s after the job ended:\n%s", l.extra,
                    timeout, l.list);
        usleep(20000);
    }
}

static const char *kolorun_path(void)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s/bin/kolorun", kt_build_dir());
    return path;
}

/* Whether rank r is in a summary's list such as "0-1,3". */
static bool in_rank_list(const char *list, int r)
{
    for (const char *s = list; *s;) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s) return false;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        if (r >= a && r <= b) return true;
        s = *end == ',' ? end + 1 : end + strlen(end);
    }
    return false;
}

/* Fails unless every line of buf is tagged "[rank]<stream>:" with 0 <= rank < n. */
static void assert_all_tagged(const char *buf, const char *stream, int n)
{
    for (const char *s = buf; *s;) {
        size_t len = strcspn(s, "\n");
        char tag[32];
        snprintf(tag, sizeof(tag), "]<%s>:", stream);
        char *end = NULL;
        long r = s[0] == '[' ? strtol(s + 1, &end, 10) : -1;
        bool ok = end && end > s + 1 && r >= 0 && r < n && strncmp(end, tag, strlen(tag)) == 0;
        /* kolorun's own lines on stderr are "kolorun: ..." */
        if (!ok && strcmp(stream, "stderr") == 0 && strncmp(s, "kolorun: ", 9) == 0) ok = true;
        KT_ASSERTF(ok, "untagged %s line '%.*s'", stream, (int)len, s);
        s += len + (s[len] == '\n');
    }
}

/* ---- the tests ---- */

/* kolorun on the login node starts 2 ranks on each host over ssh: the ranks are where the
 * host list says, shared memory joins the ranks of a host and TCP the hosts (over the
 * 10.77.0.x addresses), results are exact, every line is tagged, and nothing stays behind. */
KT_TEST(multihost_job_over_ssh_shm_inside_tcp_between, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "--log-level", "info", kt_self(), "--worker", "mh_job", NULL};
    proc p;
    proc_start(&p, c.ns[NS_L], argv);
    int rc = kt_proc_finish(&p, 40);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    printf("  4 ranks on 2 hosts over ssh: %.2f s\n", p.t_end - p.t0);

    /* links between the namespaces run on this machine's cores, as loopback does: a loss-based
     * congestion control (KOLO_TCP_CONGESTION=auto; BBR, this VM's default, stalled them), cubic
     * where the kernel has it; links to other machines would keep the system's */
    char avail[256] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_available_congestion_control", "r");
    if (f && !fgets(avail, sizeof(avail), f)) avail[0] = '\0';
    if (f) fclose(f);
    const char *cc = strstr(avail, "cubic") ? "cubic" : "reno";
    static const char *const tps[4] = {"0=self 1=shm 2=tcp 3=tcp", "0=shm 1=self 2=tcp 3=tcp",
                                       "0=tcp 1=tcp 2=self 3=shm", "0=tcp 1=tcp 2=shm 3=self"};
    for (int r = 0; r < 4; r++) {
        int h = r < 2 ? NS_A : NS_B;
        char want[512];
        snprintf(want, sizeof(want),
                 "[%d]<stdout>:mh rank %d/4 local %d/2 cross %d/2 netns %llu transports %s hierarchical 1: "
                 "results exact\n",
                 r, r, r % 2, r / 2, c.ino[h], tps[r]);
        KT_ASSERTF(strstr(p.obuf, want), "no line '%.*s' (rank %d should run in %s); stdout:\n%s", (int)strlen(want) - 1,
                   want, r, c.ns[h], p.obuf);
        snprintf(want, sizeof(want), "[%d]<stderr>:mh rank %d says goodbye on stderr\n", r, r);
        KT_CONTAINS(p.ebuf, want);
        /* kolo's own account of each link: the peer's host and address, and the transport */
        for (int q = 0; q < 4; q++) {
            if (q == r) continue;
            const char *addr = ns_addr[q < 2 ? NS_A : NS_B];
            snprintf(want, sizeof(want), "[%d]<stderr>:[kolo %d info] channel 0: rank %d <-> rank %d on %s (%s) via %s", r,
                     r, r, q, addr, addr, q / 2 == r / 2 ? "shm" : "tcp");
            if (q / 2 != r / 2) snprintf(want + strlen(want), sizeof(want) - strlen(want), " (congestion control %s)", cc);
            KT_ASSERTF(strstr(p.ebuf, want), "no '%s' in stderr:\n%s", want, p.ebuf);
        }
    }
    KT_EQ(kt_count(p.obuf, "\n"), 4);
    assert_all_tagged(p.obuf, "stdout", 4);
    assert_all_tagged(p.ebuf, "stderr", 4);
    KT_ASSERT(strstr(p.obuf, "kolorun-remote-started") == NULL && strstr(p.ebuf, "kolorun-remote-started") == NULL);
    assert_no_leftovers(&c, true, 0.5);
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* Runs argv on the login node, which must exit 0 within `timeout` s; else fails, showing its stdout
 * and the end of its stderr. */
static void run_ok(cluster *c, proc *p, const char *const *argv, double timeout, const char *what)
{
    proc_start(p, c->ns[NS_L], argv);
    int rc = kt_proc_finish(p, timeout);
    size_t el = strlen(p->ebuf);
    KT_ASSERTF(rc == 0, "%s: %s exited %d; stdout:\n%s\nstderr (its end):\n%s", what, argv[0], rc, p->obuf,
               p->ebuf + (el > 4000 ? el - 4000 : 0));
}

/* Every rank's line of the engine's mix (tests/test_engine.c, engine_mix) at 2 ranks on each of
 * the 2 hosts, after the launcher's tag */
enum { TAG_NONE, TAG_KOLORUN, TAG_MPIRUN };
static void assert_engine_mix_ran(const proc *p, int tag, const char *what)
{
    for (int r = 0; r < 4; r++) {
        char want[256];
        int k = tag == TAG_KOLORUN  ? snprintf(want, sizeof(want), "[%d]<stdout>:", r)
                : tag == TAG_MPIRUN ? snprintf(want, sizeof(want), "[1,%d]<stdout>:", r)
                                    : 0;
        snprintf(want + k, sizeof(want) - (size_t)k,
                 "engine mix: rank %d of 4 (local %d of 2, cross %d of 2), every element right\n", r, r % 2, r / 2);
        KT_ASSERTF(strstr(p->obuf, want), "%s: no line '%.*s'; stdout:\n%s", what, (int)strlen(want) - 1, want,
                   p->obuf);
    }
}

/* KT_MIX_SEED, or "0" (the mix's default plan) */
static const char *mix_seed(void) { return getenv("KT_MIX_SEED") ? getenv("KT_MIX_SEED") : "0"; }

/* Runs the launcher command argv of the engine's mix (4 ranks on the 2 hosts), which must exit 0,
 * and finds every rank's line after the launcher's tag. */
static void run_engine_mix(cluster *c, const char *const *argv, int tag, const char *what)
{
    proc p;
    run_ok(c, &p, argv, 90, what);
    printf("  the engine's mix (%s), 4 ranks on 2 hosts: %.2f s\n", what, p.t_end - p.t0);
    assert_engine_mix_ran(&p, tag, what);
    kt_proc_free(&p);
}

/* The engine's random mix (tests/test_engine.c, engine_mix) as a job kolorun starts over ssh, 2
 * ranks on each host: every kind of request in each rank's own order, checked element by element,
 * with shared memory within a host, TCP between real network namespaces, and the hierarchical
 * stages on (they must have run); then the same ending in uneven steps and kolo_ijoin. The mix's
 * own tests pose the hosts inside one namespace. KT_MIX_SEED picks another plan. */
KT_TEST(multihost_engine_random_mix, 120)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    static const char *const ways[] = {"plain", "join"};
    for (int w = 0; w < 2; w++) {
        const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                              "--start-timeout", "20", "-x", "KOLO_HIERARCHICAL_ALLREDUCE=1", "-x",
                              "KOLO_HIERARCHICAL_ALLGATHER=1", kt_self(), "--worker", "engine_mix", ways[w],
                              mix_seed(), NULL};
        run_engine_mix(&c, argv, TAG_KOLORUN, ways[w]);
        assert_no_leftovers(&c, true, 5);
    }
    cluster_down(&c);
}

/* ... and through an elastic round (engine_mix_elastic): 4 workers on the 2 hosts, one killed at a
 * step of round 1's plan (every survivor's every request must end naming it, over TCP between
 * the hosts too), and round 2's new plan whole on the 3 left. */
KT_TEST(multihost_elastic_engine_mix_goes_on_after_a_death, 90)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    const char *seed = getenv("KT_MIX_SEED");
    const char *argv[] = {kolorun_path(), "-np", "4", "--min-np", "3", "-H", hosts, "-p", port_opt, "-i", c.key,
                          "--ssh", c.ssh, "--start-timeout", "20", kt_self(), "--worker", "engine_mix_elastic",
                          seed ? seed : NULL, NULL};
    proc p;
    run_ok(&c, &p, argv, 80, "elastic");
    printf("  the engine's mix through a death, 4 then 3 ranks on 2 hosts over ssh: %.2f s\n", p.t_end - p.t0);
    KT_CONTAINS(p.ebuf, "was killed by SIGKILL");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 3 workers (after losing worker ");
    KT_EQ(kt_count(p.obuf, ", round 2: "), 3);
    KT_EQ(kt_count(p.obuf, "every element right"), 3);
    KT_ASSERTF(strstr(p.ebuf, "FAIL") == NULL, "%s", p.ebuf);
    kt_proc_free(&p);
    assert_no_leftovers(&c, true, 5);
    cluster_down(&c);
}

/* Runs a launcher's command line (argv) on the login node, starting the mh_job worker as 4 ranks,
 * 2 on each host: it must exit 0, and each rank must run on its host with shared memory to its
 * neighbour, TCP to the other host, and exact results. */
static void run_mh_job(cluster *c, proc *p, const char *const *argv)
{
    run_ok(c, p, argv, 70, argv[0]);
    printf("  4 ranks on 2 hosts under %s: %.2f s\n", argv[0], p->t_end - p->t0);
    static const char *const tps[4] = {"0=self 1=shm 2=tcp 3=tcp", "0=shm 1=self 2=tcp 3=tcp",
                                       "0=tcp 1=tcp 2=self 3=shm", "0=tcp 1=tcp 2=shm 3=self"};
    for (int r = 0; r < 4; r++) {
        int h = r < 2 ? NS_A : NS_B;
        char want[512];
        snprintf(want, sizeof(want),
                 "mh rank %d/4 local %d/2 cross %d/2 netns %llu transports %s hierarchical 1: results exact\n", r,
                 r % 2, r / 2, c->ino[h], tps[r]);
        KT_ASSERTF(strstr(p->obuf, want), "no line '%.*s' (rank %d should run in %s); stdout:\n%s\nstderr:\n%s",
                   (int)strlen(want) - 1, want, r, c->ns[h], p->obuf, p->ebuf);
    }
}

/* kolorun inside a batch job's allocation, without -H or -np: the hosts and slots come from
 * Slurm's variables, then from PBS's node file, then from LSF's list, and the job runs 2 ranks
 * on each host as with -H; kolorun says where they came from. */
KT_TEST(multihost_kolorun_takes_the_batch_allocation, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char port_opt[] = MH_PORT, nodefile[300], lsf[64];
    snprintf(nodefile, sizeof(nodefile), "%s/pbs_nodefile", c.dir);
    FILE *f = fopen(nodefile, "w");
    KT_ASSERT(f);
    fprintf(f, "%s\n%s\n%s\n%s\n", ns_addr[NS_A], ns_addr[NS_A], ns_addr[NS_B], ns_addr[NS_B]);
    fclose(f);
    snprintf(lsf, sizeof(lsf), "%s 2 %s 2", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-p", port_opt, "-i", c.key, "--ssh", c.ssh, "--start-timeout", "20",
                          kt_self(), "--worker", "mh_job", NULL};
    static const char *const nodelist = MH_NET ".[1-2]";
    char hosts[64];
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2 (-H overrides)", ns_addr[NS_A], ns_addr[NS_B]);
    for (int batch = 0; batch < 3; batch++) {
        unsetenv("SLURM_JOB_NODELIST");
        unsetenv("PBS_NODEFILE");
        unsetenv("LSB_MCPU_HOSTS");
        char want[512];
        if (batch == 0) {
            setenv("SLURM_JOB_NODELIST", nodelist, 1);
            setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
            snprintf(want, sizeof(want), "kolorun: hosts from the Slurm allocation (SLURM_JOB_NODELIST=%s, "
                     "SLURM_TASKS_PER_NODE=2(x2)): %s", nodelist, hosts);
        } else if (batch == 1) {
            setenv("PBS_NODEFILE", nodefile, 1);
            snprintf(want, sizeof(want), "kolorun: hosts from the PBS allocation (PBS_NODEFILE=%s): %s", nodefile, hosts);
        } else {
            setenv("LSB_MCPU_HOSTS", lsf, 1);
            snprintf(want, sizeof(want), "kolorun: hosts from the LSF allocation (LSB_MCPU_HOSTS=%s): %s", lsf, hosts);
        }
        proc p;
        run_mh_job(&c, &p, argv);
        KT_ASSERTF(strstr(p.ebuf, want), "no '%s' in stderr:\n%s", want, p.ebuf);
        kt_proc_free(&p);
    }
    cluster_down(&c);
}

/* Waits up to 30 s for both Slurm nodes to be idle: the allocation before has ended there. */
static void slurm_idle(cluster *c)
{
    double end = now_s() + 30;
    while (sh(c, "test \"$(nsenter --net=%s/%s sinfo -h -N -o %%T | grep -c '^idle$')\" = 2", MH_NETNS_DIR,
              c->ns[NS_L]) != 0) {
        must(c, now_s() < end ? 0 : 1, "waiting for both nodes to be idle in sinfo");
        usleep(200000);
    }
}

/* A Slurm cluster on the namespaces, for real: a private munged and slurmctld on the login node,
 * a slurmd on each host (nodea, nodeb), in a mount namespace of its own whose /etc/hosts names
 * them, so that their tasks resolve the node names as a cluster's machines do (the machine's own
 * /etc/hosts is left alone). Everything runs in the cluster's namespaces and goes with them.
 * Sets SLURM_CONF for the commands that follow. False (after saying why) without Slurm. */
static bool slurm_up(cluster *c, char *hosts, size_t cap)
{
    char me[256] = "localhost"; /* slurmctld runs only where SlurmctldHost names this machine */
    if (gethostname(me, sizeof(me) - 1) != 0) snprintf(me, sizeof(me), "localhost");
    static const char *const progs[] = {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun",
                                        "/usr/bin/salloc", "/usr/bin/sinfo"};
    for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++)
        if (access(progs[i], X_OK) != 0) {
            printf("  skip: no %s (apt-get install slurmctld slurmd slurm-client munge)\n", progs[i]);
            return false;
        }
    char conf[300];
    snprintf(hosts, cap, "%s/hosts", c->dir);
    snprintf(conf, sizeof(conf), "%s/slurm.conf", c->dir);
    char etc[8192];
    slurp("/etc/hosts", etc, sizeof(etc));
    FILE *f = fopen(hosts, "w");
    KT_ASSERT(f);
    fprintf(f, "%s\n%s nodea\n%s nodeb\n", etc, ns_addr[NS_A], ns_addr[NS_B]);
    fclose(f);
    f = fopen(conf, "w");
    KT_ASSERT(f);
    fprintf(f,
            "ClusterName=kolotest\nSlurmctldHost=%s(%s)\nSlurmUser=root\nSlurmdUser=root\n"
            "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=%s/munge.sock\n"
            "StateSaveLocation=%s/state\nSlurmdSpoolDir=%s/spool-%%n\nSlurmctldPidFile=%s/slurmctld.pid\n"
            "SlurmdPidFile=%s/slurmd-%%n.pid\nSlurmctldLogFile=%s/slurmctld.log\nSlurmdLogFile=%s/slurmd-%%n.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSchedulerType=sched/builtin\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nMpiDefault=none\nReturnToService=2\n"
            "SlurmdParameters=config_overrides\nJobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\nMailProg=/bin/true\nDebugFlags=NO_CONF_HASH\n"
            "NodeName=nodea NodeAddr=%s CPUs=2 State=UNKNOWN\nNodeName=nodeb NodeAddr=%s CPUs=2 State=UNKNOWN\n"
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
            me, ns_addr[NS_L], c->dir, c->dir, c->dir, c->dir, c->dir, c->dir, c->dir, ns_addr[NS_A],
            ns_addr[NS_B]);
    fclose(f);
    /* srun --mpi=pmix: each step's PMIx server makes its clients' directory under this base, by
     * the same name on every node; the nodes share this machine's file system, so each slurmd
     * sees a directory of its own there (bound over it in its mount namespace, below) */
    snprintf(conf, sizeof(conf), "%s/mpi.conf", c->dir);
    f = fopen(conf, "w");
    KT_ASSERT(f);
    fprintf(f, "PMIxCliTmpDirBase=%s/pmix\n", c->dir);
    fclose(f);
    snprintf(conf, sizeof(conf), "%s/slurm.conf", c->dir);
    setenv("SLURM_CONF", conf, 1);
    must(c, sh(c, "mkdir -p %1$s/state && dd if=/dev/urandom of=%1$s/munge.key bs=1024 count=1 2>/dev/null && "
                  "chmod 600 %1$s/munge.key && nsenter --net=%2$s/%3$s /usr/sbin/munged --force "
                  "--socket=%1$s/munge.sock --key-file=%1$s/munge.key --pid-file=%1$s/munged.pid "
                  "--log-file=%1$s/munged.log --seed-file=%1$s/munged.seed",
               c->dir, MH_NETNS_DIR, c->ns[NS_L]),
         "munged");
    must(c, sh(c, "nsenter --net=%s/%s /usr/sbin/slurmctld -c -i", MH_NETNS_DIR, c->ns[NS_L]), "slurmctld");
    for (int h = NS_A; h <= NS_B; h++)
        must(c, sh(c, "mkdir -p %1$s/pmix %1$s/pmix-%5$s && unshare -m --propagation private sh -c 'mount --bind "
                      "%2$s /etc/hosts && mount --bind %1$s/pmix-%5$s %1$s/pmix && exec nsenter --net=%3$s/%4$s "
                      "/usr/sbin/slurmd -N node%5$s'",
                   c->dir, hosts, MH_NETNS_DIR, c->ns[h], ns_suffix[h]),
             "slurmd");
    slurm_idle(c);
    return true;
}

/* Whether pid is stopped ('T' in /proc/PID/stat), waiting up to 5 s for it to become `want`. */
static bool stopped_becomes(pid_t pid, bool want)
{
    double end = now_s() + 5 * kt_timeout_scale();
    for (;;) {
        char path[64], buf[512] = "";
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = '\0';
        const char *q = strrchr(buf, ')');
        bool stopped = q && q[1] == ' ' && q[2] == 'T';
        if (stopped == want || now_s() > end) return stopped;
        usleep(10000);
    }
}

/* The pid of the first descendant of root named comm, 0 if none (yet). */
static pid_t descendant_named(pid_t root, const char *comm)
{
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char *end, path[64], name[64] = "";
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(name, sizeof(name), f)) name[0] = '\0';
        fclose(f);
        name[strcspn(name, "\n")] = '\0';
        if (strcmp(name, comm) != 0) continue;
        for (long up = pid; up > 1 && !found;) { /* its ancestors, by /proc/PID/stat's ppid */
            char buf[512] = "";
            snprintf(path, sizeof(path), "/proc/%ld/stat", up);
            f = fopen(path, "r");
            size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
            if (f) fclose(f);
            buf[n] = '\0';
            const char *q = strrchr(buf, ')');
            long ppid = 0;
            if (!q || sscanf(q + 2, "%*c %ld", &ppid) != 1) break;
            if (ppid == root) found = (pid_t)pid;
            up = ppid;
        }
    }
    closedir(d);
    return found;
}

/* Slurm for real, across the two hosts: srun starts 4 ranks, 2 per node (plainly, and with Slurm's
 * PMI-2 and PMIx servers, which set variables of their own), which find rank 0 at the first node
 * of the step (through the PMIx server, also where the node names do not resolve) and run the
 * job of the tests above; then kolorun inside an allocation
 * (salloc -N 2 -n 4) takes the nodes and slots from it and starts the ranks over ssh, and, given
 * no ssh option, as Slurm steps through srun. */
KT_TEST(multihost_slurm_srun_and_kolorun_in_salloc, 120)
{
    cluster c;
    char hosts[300];
    if (!cluster_up(&c) || !slurm_up(&c, hosts, sizeof(hosts))) {
        cluster_down(&c);
        return;
    }
    const char *srun[] = {"/usr/bin/srun", "-N", "2", "-n", "4", kt_self(), "--worker", "mh_job", NULL};
    proc p;
    run_mh_job(&c, &p, srun);
    kt_proc_free(&p);
    /* the engine's mix as Slurm's steps (KT_MIX_SEED picks another plan; the stages across hosts
     * must run) */
    const char *mix[] = {"/usr/bin/srun", "--export=ALL,KOLO_HIERARCHICAL_ALLREDUCE=1,KOLO_HIERARCHICAL_ALLGATHER=1",
                         "-N", "2", "-n", "4", kt_self(), "--worker", "engine_mix", "plain", mix_seed(), NULL};
    run_engine_mix(&c, mix, TAG_NONE, "srun");
    /* the same with Slurm's PMI-2 and PMIx servers, which give the ranks their own variables */
    const char *pmi2[] = {"/usr/bin/srun", "--mpi=pmi2", "-N", "2", "-n", "4", kt_self(), "--worker", "mh_job", NULL};
    run_mh_job(&c, &p, pmi2);
    kt_proc_free(&p);
    const char *pmix[] = {"/usr/bin/srun", "--mpi=pmix", "--export=ALL,KOLO_LOG_LEVEL=info", "-N", "2", "-n", "4",
                          kt_self(), "--worker", "mh_job", "again", NULL};
    /* libpmix initialized again after its finalize leaks a string of its own (pmix_mca_base_open);
     * lsan-suppressions.txt names libpmix, which only a whole stack shows: the fast unwinder
     * stops at glibc's vasprintf. So under ASan these ranks take whole stacks. */
    char *asan = getenv("ASAN_OPTIONS") ? strdup(getenv("ASAN_OPTIONS")) : NULL, opts[600];
    if (asan) {
        snprintf(opts, sizeof(opts), "%s:fast_unwind_on_malloc=0", asan);
        setenv("ASAN_OPTIONS", opts, 1);
    }
    run_mh_job(&c, &p, pmix);
    if (asan) setenv("ASAN_OPTIONS", asan, 1);
    free(asan);
    /* there rank 0 publishes the address its node's name stands for, with a port it found free
     * (the node-list way would say "nodea:<port>"); a second kolo_init in the same processes
     * exchanges its own */
    char at_a[64], again[64];
    snprintf(at_a, sizeof(at_a), "rendezvous at %s:", ns_addr[NS_A]);
    KT_CONTAINS(p.ebuf, at_a);
    KT_CONTAINS(p.ebuf, ", rank 0's address through Slurm's PMIx server\n");
    for (int r = 0; r < 4; r++) {
        snprintf(again, sizeof(again), "mh rank %d again: 4 ranks\n", r);
        KT_CONTAINS(p.obuf, again);
    }
    kt_proc_free(&p);

    /* node names that do not resolve where the tasks run (a cluster whose names only Slurm
     * knows): with PMIx the job runs all the same, rank 0 reached at the address towards srun's
     * host; without, every rank stops at the name (-K: srun ends the step at the first) */
    char bare[320], unmap[400];
    snprintf(bare, sizeof(bare), "%s/hosts-bare", c.dir);
    must(&c, sh(&c, "cp /etc/hosts %s", bare), "copying /etc/hosts");
    snprintf(unmap, sizeof(unmap), "mount --bind %s /etc/hosts && exec \"$@\"", bare);
    const char *unresolved[] = {"/usr/bin/srun", "--mpi=pmix", "--export=ALL,KOLO_LOG_LEVEL=info", "-N", "2", "-n",
                                "4", "unshare", "-m", "--propagation", "private", "sh", "-c", unmap, "sh", kt_self(),
                                "--worker", "mh_job", NULL};
    run_mh_job(&c, &p, unresolved);
    KT_CONTAINS(p.ebuf, at_a);
    kt_proc_free(&p);
    const char *nopmix[] = {"/usr/bin/srun", "-K", "--export=ALL,KOLO_START_TIMEOUT=3", "-N", "2", "-n", "4",
                            "unshare", "-m", "--propagation", "private", "sh", "-c", unmap, "sh", kt_self(),
                            "--worker", "mh_job", NULL};
    proc_start(&p, c.ns[NS_L], nopmix);
    KT_ASSERTF(kt_proc_finish(&p, 60) != 0, "srun without PMIx ran with unresolvable node names; stderr:\n%s",
               p.ebuf);
    KT_CONTAINS(p.ebuf, "could not reach the rendezvous store at nodea:");
    KT_CONTAINS(p.ebuf, "name resolution");
    kt_proc_free(&p);

    /* kolorun runs on the login node under salloc; it resolves the node names as the nodes do */
    char mount[400], port_opt[] = MH_PORT;
    snprintf(mount, sizeof(mount), "mount --bind %s /etc/hosts && exec \"$@\"", hosts);
    const char *salloc[] = {"/usr/bin/salloc", "--quiet", "-N", "2", "-n", "4", "unshare", "-m", "--propagation",
                            "private", "sh", "-c", mount, "sh", kolorun_path(), "-p", port_opt, "-i", c.key, "--ssh",
                            c.ssh, "--start-timeout", "20", kt_self(), "--worker", "mh_job", NULL};
    slurm_idle(&c);
    run_mh_job(&c, &p, salloc);
    KT_CONTAINS(p.ebuf, "kolorun: hosts from the Slurm allocation (SLURM_JOB_NODELIST=nodea,nodeb, "
                        "SLURM_TASKS_PER_NODE=2(x2)): nodea:2,nodeb:2 (-H overrides)\n");
    kt_proc_free(&p);

    /* no ssh option: the workers start as steps of the allocation, through srun (sites that
     * allow no ssh between nodes); the summary, stack traces and lifeline go the same way */
    const char *steps[] = {"/usr/bin/salloc", "--quiet", "-N", "2", "-n", "4", "unshare", "-m", "--propagation",
                           "private", "sh", "-c", mount, "sh", kolorun_path(), "--start-timeout", "20", kt_self(),
                           "--worker", "mh_job", NULL};
    slurm_idle(&c);
    run_mh_job(&c, &p, steps);
    KT_CONTAINS(p.ebuf, "nodea:2,nodeb:2 (-H overrides); remote workers start with srun, a step each "
                        "(--launcher ssh for ssh)\n");
    kt_proc_free(&p);
    assert_no_leftovers(&c, true, 5);

    /* Ctrl-Z of a kolorun whose workers are srun steps: its "stop" reaches each step's wrapper
     * through srun's stdin, the workers on both nodes stop, and fg (SIGCONT) resumes them */
    const char *tstp[] = {"/usr/bin/salloc", "--quiet", "-N", "2", "-n", "2", "unshare", "-m", "--propagation",
                          "private", "sh", "-c", mount, "sh", kolorun_path(), "--start-timeout", "20",
                          "/usr/bin/python3", "-c",
                          /* no fork: a shell's `sleep` could hold the shell in its vfork wait (D, not T) */
                          "import os, time\nprint('pid', os.getpid(), flush=True)\n"
                          "for _ in range(40): time.sleep(0.1)\nprint('finished')",
                          NULL};
    slurm_idle(&c);
    proc_start(&p, c.ns[NS_L], tstp);
    kt_proc_wait_for(&p, "<stdout>:pid ", 2, 40);
    pid_t workers[2] = {0, 0}, launcher = descendant_named(p.pid, "kolorun");
    for (int r = 0; r < 2; r++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "[%d]<stdout>:pid ", r);
        const char *at = strstr(p.obuf, tag);
        int pid = 0;
        KT_ASSERTF(at && sscanf(at + strlen(tag), "%d", &pid) == 1 && pid > 0, "no pid of rank %d:\n%s", r, p.obuf);
        workers[r] = (pid_t)pid;
        KT_ASSERT(pid_netns(workers[r]) == c.ino[r == 0 ? NS_A : NS_B]);
    }
    KT_ASSERTF(launcher > 0, "no kolorun under salloc (pid %d)", (int)p.pid);
    kill(launcher, SIGTSTP);
    for (int r = 0; r < 2; r++)
        KT_ASSERTF(stopped_becomes(workers[r], true), "rank %d's step (pid %d) did not stop", r, (int)workers[r]);
    usleep(300000);
    for (int r = 0; r < 2; r++)
        KT_ASSERTF(stopped_becomes(workers[r], true), "rank %d's step (pid %d) went on", r, (int)workers[r]);
    kill(launcher, SIGCONT);
    for (int r = 0; r < 2; r++)
        KT_ASSERTF(!stopped_becomes(workers[r], false), "rank %d's step (pid %d) stayed stopped", r,
                   (int)workers[r]);
    int rc = kt_proc_finish(&p, 40);
    KT_ASSERTF(rc == 0, "kolorun under salloc exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    KT_EQ(kt_count(p.obuf, "<stdout>:finished\n"), 2);
    kt_proc_free(&p);
    assert_no_leftovers(&c, true, 5);

    /* rank 3 fails while the others sleep: kolorun ends their steps, names rank 3, and nothing
     * of the job is left on either node */
    const char *fail[] = {"/usr/bin/salloc", "--quiet", "-N", "2", "-n", "4", "unshare", "-m", "--propagation",
                          "private", "sh", "-c", mount, "sh", kolorun_path(), "sh", "-c",
                          "[ \"$KOLO_RANK\" = 3 ] && exit 7; exec sleep 60", NULL};
    /* its allocation must not wait for the last one's end (in one CI run under load, 40 s passed
     * with nothing said, as salloc --quiet says nothing while it waits) */
    slurm_idle(&c);
    proc_start(&p, c.ns[NS_L], fail);
    rc = kt_proc_finish(&p, 40);
    KT_ASSERTF(rc == 7 && p.t_end - p.t0 < 30, "exit %d after %.1f s; stderr:\n%s", rc, p.t_end - p.t0, p.ebuf);
    KT_CONTAINS(p.ebuf, "rank 3 on host nodeb");
    kt_proc_free(&p);
    assert_no_leftovers(&c, true, 10);
    cluster_down(&c);
}

/* A job of 4 ranks under an MPI launcher with KOLO_IFACE=nope0 ended with every rank's reason,
 * each on its own line: rank 0's (said before the fence), ranks 1-3's that rank 0 published no
 * address through `via` (said before the second fence, src/boot/pmix_rdv.c), and the advice from
 * at least the first rank to leave. Open MPI's --tag-output starts rank r's lines "[job,r]<stderr>:"
 * (matched from the comma), Hydra's -prepend-rank "[r] ". */
static void assert_every_rank_said_why(const char *ebuf, bool openmpi, const char *via)
{
    char said[240];
    snprintf(said, sizeof(said), "%s[kolo error] rank 0 found no IPv4 address to publish through %s "
             "(KOLO_IFACE='nope0'); the other ranks learn of it now", openmpi ? ",0]<stderr>:" : "[0] ", via);
    KT_CONTAINS(ebuf, said);
    for (int r = 1; r < 4; r++) {
        char tag[32];
        snprintf(tag, sizeof(tag), openmpi ? ",%d]<stderr>:" : "[%d] ", r);
        snprintf(said, sizeof(said), "%s[kolo error] rank 0 published no address through %s (see rank 0's error)", tag,
                 via);
        KT_CONTAINS(ebuf, said);
    }
    KT_CONTAINS(ebuf, "): set KOLO_RENDEZVOUS=host:port to a free port on rank 0's host");
}

/* Open MPI's mpirun from the login node across both hosts, over the same ssh, without
 * KOLO_RENDEZVOUS: rank 0 publishes its address through the PMIx server mpirun's daemons run
 * (src/boot/pmix_rdv.c), the ranks find it, and the job is the one kolorun runs above: ranks of
 * a host on shared memory, TCP between hosts, results exact. */
KT_TEST(multihost_mpirun_finds_rank_0_through_pmix, 90)
{
    if (access("/usr/bin/mpirun.openmpi", X_OK) != 0) {
        printf("  skip: mpirun.openmpi not installed (apt-get install openmpi-bin)\n");
        return;
    }
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], agent[1200], net[32];
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    snprintf(agent, sizeof(agent), "%s -i %s -p %s", c.ssh, c.key, MH_PORT);
    snprintf(net, sizeof(net), "%s.0/24", MH_NET);
    /* the sanitizer build's leak suppressions reach the ranks mpirun starts over ssh too */
    char lsan[600], setting[64] = "KOLO_LOG_LEVEL=info";
    snprintf(lsan, sizeof(lsan), "LSAN_OPTIONS=%s", getenv("LSAN_OPTIONS") ? getenv("LSAN_OPTIONS") : "");
    const char *argv[] = {"/usr/bin/mpirun.openmpi", "--allow-run-as-root", "-np", "4", "-H", hosts,
                          "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
                          "--mca", "oob_tcp_if_include", net, "--mca", "btl", "self", "--tag-output",
                          "-x", setting, "-x", lsan, kt_self(), "--worker", "mh_job", NULL};
    proc p;
    run_mh_job(&c, &p, argv);
    /* rank 0 said where it serves: host a's address, found through PMIx */
    char want[128];
    snprintf(want, sizeof(want), "openmpi: rendezvous at %s:", ns_addr[NS_A]);
    KT_ASSERTF(strstr(p.ebuf, want) && strstr(p.ebuf, "rank 0's address through PMIx"), "no '%s' in stderr:\n%s", want,
               p.ebuf);
    kt_proc_free(&p);

    /* the engine's mix under mpirun (KT_MIX_SEED picks another plan; the stages across hosts must
     * run) */
    const char *mix[] = {"/usr/bin/mpirun.openmpi", "--allow-run-as-root", "-np", "4", "-H", hosts,
                         "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
                         "--mca", "oob_tcp_if_include", net, "--mca", "btl", "self", "--tag-output",
                         "-x", "KOLO_HIERARCHICAL_ALLREDUCE=1", "-x", "KOLO_HIERARCHICAL_ALLGATHER=1", "-x", lsan,
                         kt_self(), "--worker", "engine_mix", "plain", mix_seed(), NULL};
    run_engine_mix(&c, mix, TAG_MPIRUN, "Open MPI's mpirun");

    /* rank 0 with nothing to publish (KOLO_IFACE names no interface): every rank says why before
     * any leaves, since mpirun ends the job at the first rank's exit */
    snprintf(setting, sizeof(setting), "KOLO_IFACE=nope0");
    proc_start(&p, c.ns[NS_L], argv);
    int rc = kt_proc_finish(&p, 70);
    KT_ASSERTF(rc != 0, "mpirun exited 0 with KOLO_IFACE=nope0; stderr:\n%s", p.ebuf);
    assert_every_rank_said_why(p.ebuf, true, "PMIx");
    kt_proc_free(&p);
    cluster_down(&c);
}

/* MPICH's mpirun (Hydra) from the login node across both hosts, over the same ssh, without
 * KOLO_RENDEZVOUS: Hydra gives no address and no PMIx, so rank 0 publishes its address through
 * the PMI-1 connection every rank has to its host's proxy (src/boot/pmi_rdv.c). The job is the
 * one above: shared memory within a host, TCP between hosts, results exact, exit 0 (Hydra ends
 * a job whose process leaves PMI without finalize). */
KT_TEST(multihost_mpich_mpirun_finds_rank_0_through_pmi, 90)
{
    if (access("/usr/bin/mpirun.mpich", X_OK) != 0) {
        printf("  skip: mpirun.mpich not installed (apt-get install mpich)\n");
        return;
    }
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    /* Hydra runs its launcher as `<exec> -x <host> <command>`: ssh with this cluster's key */
    char agent[300], hosts[64];
    snprintf(agent, sizeof(agent), "%s/ssh-agent.sh", c.dir);
    FILE *f = fopen(agent, "w");
    KT_ASSERT(f);
    fprintf(f, "#!/bin/sh\nexec %s -i %s -p %s \"$@\"\n", c.ssh, c.key, MH_PORT);
    fclose(f);
    KT_ASSERT(chmod(agent, 0755) == 0);
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    /* -iface br0: the proxies reach mpirun at the login node's bridge address, not at its name */
    const char *argv[] = {"/usr/bin/mpirun.mpich", "-launcher", "ssh", "-launcher-exec", agent, "-iface", "br0",
                          "-hosts", hosts, "-np", "4", "-genv", "KOLO_LOG_LEVEL", "info", kt_self(), "--worker",
                          "mh_job", NULL};
    proc p;
    run_mh_job(&c, &p, argv);
    /* every rank learned host a's address, found through PMI */
    char want[128];
    snprintf(want, sizeof(want), "pmi: rendezvous at %s:", ns_addr[NS_A]);
    KT_ASSERTF(kt_count(p.ebuf, want) == 4 && kt_count(p.ebuf, "rank 0's address through PMI\n") == 4,
               "not 4 times '%s... through PMI' in stderr:\n%s", want, p.ebuf);
    kt_proc_free(&p);

    /* the engine's mix under Hydra (KT_MIX_SEED picks another plan; the stages across hosts must
     * run) */
    const char *mix[] = {"/usr/bin/mpirun.mpich", "-launcher", "ssh", "-launcher-exec", agent, "-iface", "br0",
                         "-hosts", hosts, "-np", "4", "-genv", "KOLO_HIERARCHICAL_ALLREDUCE", "1", "-genv",
                         "KOLO_HIERARCHICAL_ALLGATHER", "1", kt_self(), "--worker", "engine_mix", "plain", mix_seed(),
                         NULL};
    run_engine_mix(&c, mix, TAG_NONE, "MPICH's mpirun");

    /* rank 0 with nothing to publish: as under Open MPI's mpirun above, every rank says why
     * before any leaves (Hydra too ends the job at the first rank's failure) */
    const char *bad[] = {"/usr/bin/mpirun.mpich", "-launcher", "ssh", "-launcher-exec", agent, "-iface", "br0",
                         "-hosts", hosts, "-np", "4", "-prepend-rank", "-genv", "KOLO_IFACE", "nope0", kt_self(),
                         "--worker", "mh_job", NULL};
    proc_start(&p, c.ns[NS_L], bad);
    int rc = kt_proc_finish(&p, 70);
    KT_ASSERTF(rc != 0, "mpirun exited 0 with KOLO_IFACE=nope0; stderr:\n%s", p.ebuf);
    assert_every_rank_said_why(p.ebuf, false, "PMI");
    kt_proc_free(&p);
    cluster_down(&c);
}

/* A Kubeflow TrainJob's pods, their program started without torchrun: each host stands for a pod
 * (a network namespace of its own) with nothing but the PET_* variables Trainer v2 sets. Rank 1's
 * pod starts first, before rank 0 serves (pods come up in any order): it waits for the store at
 * PET_MASTER_PORT+1. One rank per pod, TCP between them, results exact; a pod whose
 * PET_NPROC_PER_NODE asks for more processes than torchrun is there to start is one rank, and
 * rank 0 says so. */
/* Two pods of a TrainJob, one on each host with nothing but the PET_* variables (master the
 * address of host a, nproc its PET_NPROC_PER_NODE), rank 1's started first (pods come up in any
 * order); both must end well with exact results over TCP. The pods' output stays in pod[] for the
 * caller, who frees it. */
static void trainjob_pods(cluster *c, proc pod[2], const char *master, const char *nproc)
{
    char addr[96], per[40], node_rank[2][32];
    snprintf(addr, sizeof(addr), "PET_MASTER_ADDR=%s", master);
    snprintf(per, sizeof(per), "PET_NPROC_PER_NODE=%s", nproc);
    for (int r = 1; r >= 0; r--) {
        snprintf(node_rank[r], sizeof(node_rank[r]), "PET_NODE_RANK=%d", r);
        const char *argv[] = {"/usr/bin/env", "PET_NNODES=2", node_rank[r], per, addr, "PET_MASTER_PORT=29500",
                              "KOLO_LOG_LEVEL=info", kt_self(), "--worker", "mh_job", NULL};
        proc_start(&pod[r], c->ns[r ? NS_B : NS_A], argv);
        if (r) usleep(300000);
    }
    for (int r = 0; r < 2; r++) {
        int rc = kt_proc_finish(&pod[r], 40);
        KT_ASSERTF(rc == 0, "pod %d exited %d; stdout:\n%s\nstderr:\n%s", r, rc, pod[r].obuf, pod[r].ebuf);
        char want[256];
        snprintf(want, sizeof(want),
                 "mh rank %d/2 local 0/1 cross %d/2 netns %llu transports %s hierarchical 0: results exact\n", r, r,
                 c->ino[r ? NS_B : NS_A], r ? "0=tcp 1=self" : "0=self 1=tcp");
        KT_ASSERTF(strstr(pod[r].obuf, want), "no line '%.*s' from pod %d; stdout:\n%s\nstderr:\n%s",
                   (int)strlen(want) - 1, want, r, pod[r].obuf, pod[r].ebuf);
    }
}

KT_TEST(multihost_trainjob_pods_without_torchrun, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    for (int round = 0; round < 2; round++) {
        proc pod[2];
        trainjob_pods(&c, pod, ns_addr[NS_A], round ? "auto" : "1");
        const char *warning = "PET_NPROC_PER_NODE=auto, but this process was not started by torchrun";
        KT_ASSERTF((strstr(pod[0].ebuf, warning) != NULL) == (round == 1), "round %d: rank 0's stderr:\n%s", round,
                   pod[0].ebuf);
        KT_ASSERTF(!strstr(pod[1].ebuf, "PET_NPROC_PER_NODE"), "round %d: rank 1's stderr:\n%s", round, pod[1].ebuf);
        for (int r = 0; r < 2; r++) kt_proc_free(&pod[r]);
    }
    cluster_down(&c);
}

/* The same pods on a network of IPv6 alone (an IPv6-only Kubernetes cluster): the hosts' IPv4
 * addresses removed, fd77::1 and fd77::2 in their place, PET_MASTER_ADDR an IPv6 address. Each
 * rank finds no IPv4 route to rank 0, listens on its IPv6 address and publishes it; the ranks
 * connect over IPv6, results exact. */
KT_TEST(multihost_ipv6_only_pods, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    static const char *const v6[2] = {"fd77::1", "fd77::2"};
    for (int r = 0; r < 2; r++)
        must(&c,
             sh(&c, "ip -n %1$s addr flush dev eth0 && ip -n %1$s addr add %2$s/64 dev eth0 nodad",
                c.ns[r ? NS_B : NS_A], v6[r]),
             "IPv6 alone on a host");
    proc pod[2];
    trainjob_pods(&c, pod, v6[0], "1");
    for (int r = 0; r < 2; r++) {
        /* each names the other by its IPv6 address */
        char want[64];
        snprintf(want, sizeof(want), "(%s) via tcp", v6[!r]);
        KT_ASSERTF(strstr(pod[r].ebuf, want), "pod %d: no '%s' in stderr:\n%s", r, want, pod[r].ebuf);
        kt_proc_free(&pod[r]);
    }
    cluster_down(&c);
}

/* kolo-tests --worker mh_vanish: rank 1 (on b) sleeps after a first allreduce; rank 0 (on a)
 * says it calls, then waits in a 1 MiB allreduce for rank 1, and prints how it ended and when. */
KT_WORKER(mh_vanish)
{
    (void)argc;
    (void)argv;
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "mh: kolo_init: %s\n", kolo_last_error());
        return 3;
    }
    int rank = kolo_rank(), one = 1, sum = 0;
    if (kolo_allreduce(&one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) return 5;
    if (rank == 1) {
        for (int k = 0; k < 1200; k++) usleep(100000); /* b is cut off meanwhile */
        return 0;
    }
    static int32_t x[1 << 18], y[1 << 18];
    printf("mh rank 0 calls\n");
    fflush(stdout);
    const char *how = getenv("MH_HOW");
    if (how && strcmp(how, "late") == 0) sleep(2); /* b is cut off meanwhile */
    double t0 = kt_now();
    int st;
    if (how && strcmp(how, "engine") == 0) { /* as every call of the Python bindings */
        kolo_shape_t shape = {.ndim = 1, .dims = {1 << 18}};
        kolo_request_t *r = NULL;
        st = kolo_iallreduce("gradients", x, y, KOLO_INT32, &shape, KOLO_SUM, 1, 1, NULL, &r);
        if (st == KOLO_OK) st = kolo_request_wait(r, -1);
    } else {
        st = kolo_allreduce(x, y, 1 << 18, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD);
    }
    printf("mh rank 0: allreduce returned %d after %.1f s: %s\n", st, kt_now() - t0, st ? kolo_last_error() : "");
    fflush(stdout);
    return st == KOLO_OK ? 0 : 1;
}

/* A machine that vanishes (powered off, a kernel panic, its network cut) sends nothing more, not
 * even a reset: rank 0 on a, waiting in an allreduce for rank 1 on b when b's link goes down,
 * waited out KOLO_OP_TIMEOUT (120 s here) and then blamed a silent peer. Now (KOLO_TCP_KEEPALIVE=3
 * here) it fails within seconds, naming rank 1 and why: in the first round b had acknowledged
 * rank 0's bytes before going (keepalive probes find it gone), in the second they were still on
 * their way (retransmitted, and nothing acknowledged: tcp.c, kolo__tcp_unanswered). */
KT_TEST(multihost_a_vanished_machine_is_named_in_seconds, 90)
{
    static const char *const hows[] = {"MH_HOW=early", "MH_HOW=late", "MH_HOW=engine"};
    for (int late = 0; late < 3; late++) {
        cluster c;
        if (!cluster_up(&c)) {
            cluster_down(&c);
            return;
        }
        char addr[96], node_rank[2][32];
        snprintf(addr, sizeof(addr), "PET_MASTER_ADDR=%s", ns_addr[NS_A]);
        proc pod[2];
        for (int r = 0; r < 2; r++) {
            snprintf(node_rank[r], sizeof(node_rank[r]), "PET_NODE_RANK=%d", r);
            const char *argv[] = {"/usr/bin/env", "PET_NNODES=2", node_rank[r], addr, "PET_MASTER_PORT=29500",
                                  "KOLO_TCP_KEEPALIVE=3", "KOLO_OP_TIMEOUT=120", hows[late],
                                  kt_self(), "--worker", "mh_vanish", NULL};
            proc_start(&pod[r], c.ns[r ? NS_B : NS_A], argv);
        }
        kt_proc_wait_for(&pod[0], "mh rank 0 calls\n", 1, 30);
        /* early: its first bytes reach b and are acknowledged first; late: it calls 2 s after */
        if (late != 1) usleep(300000);
        must(&c, sh(&c, "ip -n %s link set eth0 down", c.ns[NS_B]), "b's link down");
        int rc = kt_proc_finish(&pod[0], 40);
        KT_ASSERTF(rc == 1, "round %d: rank 0 exited %d; stdout:\n%s\nstderr:\n%s", late, rc, pod[0].obuf,
                   pod[0].ebuf);
        char want[192];
        snprintf(want, sizeof(want), " (%s): receiving from it failed (Connection timed out): its machine stopped "
                 "answering", ns_addr[NS_B]);
        KT_ASSERTF(strstr(pod[0].obuf, "allreduce returned -10 after ") && strstr(pod[0].obuf, "lost rank 1 on ") &&
                       strstr(pod[0].obuf, want) && strstr(pod[0].obuf, "answered nothing for KOLO_TCP_KEEPALIVE, 3 s"),
                   "round %d: rank 0's stdout:\n%s\nstderr:\n%s", late, pod[0].obuf, pod[0].ebuf);
        kill(-pod[1].pid, SIGKILL);
        kt_proc_finish(&pod[1], 10);
        kt_proc_free(&pod[0]);
        kt_proc_free(&pod[1]);
        cluster_down(&c);
    }
}

/* kolo-tests --worker mh_idle: a first allreduce, "ready", then a minute outside kolo (an
 * evaluation, a checkpoint being written). */
KT_WORKER(mh_idle)
{
    (void)argc;
    (void)argv;
    int one = 1, sum = 0;
    if (kolo_init() != KOLO_OK || kolo_allreduce(&one, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "mh: %s\n", kolo_last_error());
        return 3;
    }
    printf("mh rank %d ready\n", kolo_rank());
    fflush(stdout);
    for (int k = 0; k < 600; k++) usleep(100000);
    kolo_shutdown();
    return 0;
}

/* kolorun on a, two ranks there and two on b over ssh, all of them busy outside kolo when b's link
 * goes down: no worker's call fails, and kolorun waited on b's ssh sessions for ssh's default (two
 * hours of TCP keepalive), here the workers' minute. Its ssh sessions now ask the host every
 * quarter of KOLO_TCP_KEEPALIVE (4 s here) and give up after 4 unanswered ("Timeout, server ...
 * not responding" at ssh's default log level, which this cluster's ssh lowers): kolorun names a
 * rank on b as the first failure and ends the job within seconds (4.9 s by hand). On b, the
 * wrappers miss kolorun's beats and end the workers there too. */
KT_TEST(multihost_kolorun_names_a_host_that_stopped_answering, 90)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "--grace-seconds", "1", "-x", "KOLO_TCP_KEEPALIVE=4", kt_self(),
                          "--worker", "mh_idle", NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    kt_proc_wait_for(&p, " ready\n", 4, 30);
    must(&c, sh(&c, "ip -n %s link set eth0 down", c.ns[NS_B]), "b's link down");
    double t_cut = now_s();
    int rc = kt_proc_finish(&p, 40);
    printf("  kolorun ended %.2f s after b's link went down\n", p.t_end - t_cut);
    KT_ASSERTF(rc == 255, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    char want[160];
    snprintf(want, sizeof(want), " on host %s exited with code 255 (ssh's code for a lost session: the host stopped "
             "answering", ns_addr[NS_B]);
    KT_ASSERTF(strstr(p.ebuf, want) && strstr(p.ebuf, ": the first failure of this job"), "stderr:\n%s", p.ebuf);
    KT_ASSERTF(p.t_end - t_cut < 20, "kolorun ended %.2f s after the cut; stderr:\n%s", p.t_end - t_cut, p.ebuf);
    /* and b, which could not be told, ends its workers when kolorun's beats stop coming: they
     * slept on for their minute before (its sshd does not know the session is gone) */
    assert_no_leftovers(&c, true, 10);
    printf("  no worker left on b %.2f s after the cut\n", now_s() - t_cut);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* kolorun on a, two ranks there and two on b over ssh, training (an allreduce every 20 ms) when
 * b's link goes down. Ranks 0 and 1 fail within KOLO_TCP_KEEPALIVE (3 s here), blaming a rank on
 * b; kolorun's ssh sessions to b, kept longer here (--ssh's 6 x 1 s beat kolorun's own options),
 * end with 255 while kolorun ends the job (before the 5 s grace period and its SIGKILL). The
 * summary names b as the cause by the first failure's error, and says of ranks 2 and 3 that their
 * sessions were lost, not that kolorun terminated them. */
KT_TEST(multihost_kolorun_names_the_machine_its_workers_lost, 90)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT, ssh[sizeof(c.ssh) + 64];
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    snprintf(ssh, sizeof(ssh), "%s -o ServerAliveInterval=1 -o ServerAliveCountMax=6", c.ssh);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", ssh,
                          "--start-timeout", "20", "--grace-seconds", "5", "-x", "KOLO_TCP_KEEPALIVE=3", kt_self(),
                          "--worker", "mh_hold", NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    kt_proc_wait_for(&p, " ready pid ", 4, 30);
    must(&c, sh(&c, "ip -n %s link set eth0 down", c.ns[NS_B]), "b's link down");
    int rc = kt_proc_finish(&p, 40);
    KT_ASSERTF(rc == 1, "kolorun exited %d; stderr:\n%s", rc, p.ebuf);
    char want[192];
    snprintf(want, sizeof(want), "'s error: host %s, where rank ", ns_addr[NS_B]);
    const char *cause = strstr(p.ebuf, want), *first = strstr(p.ebuf, ": the first failure of this job");
    KT_ASSERTF(first && cause && cause > first && strstr(p.ebuf, "kolorun:   the cause, by rank ") &&
                   (cause[strlen(want)] == '2' || cause[strlen(want)] == '3') &&
                   strstr(cause, " ran, stopped answering (down, or the network to it cut)"),
               "stderr:\n%s", p.ebuf);
    KT_ASSERTF(strstr(p.ebuf, "kolorun: ranks 2-3: their ssh sessions ended with code 255 (the host stopped answering "
                              "or the connection broke) before they could be told to stop") &&
                   !strstr(p.ebuf, "terminated by kolorun") && !strstr(p.ebuf, "killed with SIGKILL"),
               "stderr:\n%s", p.ebuf);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* kolorun on host a (its ranks local, b's over ssh); rank 3 on b is SIGKILLed mid-training.
 * Ranks 0 and 1 get kolo's lost-peer error and exit 1, as a training script would; rank 2 (on
 * b too) ignores SIGTERM, so only b's wrapper SIGKILLing it after the grace period ends the job.
 * The summary names rank 3 on b, killed by SIGKILL, as the first failure and accounts for every
 * other rank, the exit code is SIGKILL's 137, and the moment kolorun returns no worker, wrapper
 * or watcher is left on either host (nor, shortly after, any ssh session). */
KT_TEST(multihost_worker_killed_on_b_stops_the_job, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2,%s:2", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "--grace-seconds", "2", kt_self(), "--worker", "mh_hold", "2", NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    kt_proc_wait_for(&p, " ready pid ", 4, 30);
    for (int r = 0; r < 4; r++) {
        char pat[64];
        snprintf(pat, sizeof(pat), "[%d]<stdout>:mh rank %d ready pid ", r, r);
        const char *s = strstr(p.obuf, pat);
        KT_ASSERTF(s, "no '%s' in:\n%s", pat, p.obuf);
        int pid = 0;
        unsigned long long ns = 0;
        KT_EQ(sscanf(s + strlen(pat), "%d netns %llu", &pid, &ns), 2);
        int h = r < 2 ? NS_A : NS_B;
        KT_ASSERTF(ns == c.ino[h] && pid_netns(pid) == c.ino[h], "rank %d (pid %d) is not in %s", r, pid, c.ns[h]);
        if (r == 3) {
            KT_ASSERT(kill(pid, SIGKILL) == 0);
        }
    }
    double t_kill = now_s();
    int rc = kt_proc_finish(&p, 30);
    double took = p.t_end - t_kill;
    printf("  job down %.2f s after the kill\n", took);
    KT_ASSERTF(rc == 128 + SIGKILL, "kolorun exited %d, expected %d; stdout:\n%s\nstderr:\n%s", rc, 128 + SIGKILL, p.obuf,
               p.ebuf);
    /* rank 2 ignores SIGTERM: the job is over when b's wrapper has SIGKILLed it, after the grace period */
    KT_ASSERTF(took > 1.5 && took < 2 + 4, "the job took %.2f s to go down (grace 2 s); stderr:\n%s", took, p.ebuf);
    char want[256];
    snprintf(want, sizeof(want),
             "kolorun: rank 3 on host %s was killed by SIGKILL (Killed) (ssh reported exit code 137) after ", ns_addr[NS_B]);
    KT_ASSERTF(strstr(p.ebuf, want) && strstr(p.ebuf, ": the first failure of this job"),
               "no root cause '%s...: the first failure of this job' in stderr:\n%s", want, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: exit code 137\n");
    KT_EQ(kt_count(p.ebuf, "the first failure of this job"), 1);
    /* the workers left nothing: b's wrappers must not take their own watcher and checker, which
     * they SIGKILL before they look, for a worker's leftovers (they did, still dying, under load,
     * and reported rank 3's end 0.5 s later, after ranks 0 and 1's own errors: exit code 1) */
    KT_ASSERTF(!strstr(p.ebuf, "left processes running"), "stderr:\n%s", p.ebuf);
    /* Ranks 0 and 1 lose rank 3 and exit with an error of their own, usually before b's ssh
     * has reported the death: then they are listed as failing at the same time, otherwise as
     * terminated. Rank 2 never ends by itself: terminated, then SIGKILLed on b. */
    const char *tl = strstr(p.ebuf, ": terminated by kolorun after rank 3 failed (not a failure of ");
    char terminated[64] = "";
    if (tl) {
        const char *b = tl;
        while (b > p.ebuf && b[-1] != ' ') b--;
        snprintf(terminated, sizeof(terminated), "%.*s", (int)(tl - b), b);
    }
    for (int r = 0; r < 3; r++) {
        snprintf(want, sizeof(want), "kolorun: rank %d on host %s also failed at the same time: it exited with code ", r,
                 ns_addr[r < 2 ? NS_A : NS_B]);
        bool also = strstr(p.ebuf, want) != NULL, term = in_rank_list(terminated, r);
        KT_ASSERTF(also != term && (r < 2 || term), "rank %d: %s; stderr:\n%s", r,
                   also && term ? "both failed and terminated" : also ? "counted as a failure" : "not accounted for",
                   p.ebuf);
    }
    KT_CONTAINS(p.ebuf, "2: still running 2 s after SIGTERM (--grace-seconds), killed with SIGKILL\n");
    assert_all_tagged(p.obuf, "stdout", 4);
    assert_all_tagged(p.ebuf, "stderr", 4);
    assert_no_leftovers(&c, true, 0.5);
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* What a worker on b leaves running in a session of its own (setsid; one ignoring SIGTERM) ends
 * with the worker: b's wrapper finds it by the mark in its environment (kolorun, on a, is not
 * its subreaper there). */
KT_TEST(multihost_what_a_worker_leaves_on_b_ends_with_it, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:2", ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "--grace-seconds", "1", "sh", "-c",
                          "setsid sleep 60 & setsid sh -c 'trap \"\" TERM; sleep 60' & sleep 0.3; echo done", NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    int rc = kt_proc_finish(&p, 30);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    KT_EQ(kt_count(p.obuf, "<stdout>:done\n"), 2);
    KT_EQ(kt_count(p.ebuf, "<stderr>:kolorun: the worker left processes running in a session or group of their "
                           "own on "),
          2);
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* Ctrl-Z across hosts: kolorun on a tells b's wrapper "stop" on the connection, and b's worker
 * stops with it; "cont" resumes it (a signal to ssh would have ended it). Stopped, kolorun sends
 * no beats: b's wrapper, told "stop", waits past its 4 s heartbeat timeout (6 s here) without
 * taking kolorun for gone. */
KT_TEST(multihost_ctrl_z_stops_the_worker_on_b, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:1", ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "-x", "KOLO_TCP_KEEPALIVE=4", "/usr/bin/python3", "-c",
                          /* no fork: a shell's `sleep` could hold the shell in its vfork wait (D, not T) */
                          "import os, time\nprint('pid', os.getpid(), flush=True)\n"
                          "for _ in range(40): time.sleep(0.1)\nprint('finished')",
                          NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    kt_proc_wait_for(&p, "[0]<stdout>:pid ", 1, 30);
    int pid = 0;
    KT_ASSERT(sscanf(strstr(p.obuf, "[0]<stdout>:pid ") + 16, "%d", &pid) == 1 && pid > 0);
    KT_ASSERT(pid_netns(pid) == c.ino[NS_B]);
    kill(p.pid, SIGTSTP);
    KT_ASSERTF(stopped_becomes(pid, true), "the worker on b (pid %d) did not stop", pid);
    usleep(6000000);
    KT_ASSERTF(stopped_becomes(pid, true), "the worker on b (pid %d) went on, or ended", pid);
    kill(p.pid, SIGCONT);
    KT_ASSERTF(!stopped_becomes(pid, false), "the worker on b (pid %d) stayed stopped", pid);
    int rc = kt_proc_finish(&p, 30);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    KT_CONTAINS(p.obuf, "[0]<stdout>:finished\n");
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* --timeout --get-stack-traces across hosts: rank 1 on b, asleep, never joins rank 0's allreduce
 * on a; at the timeout kolorun has both print their kolo status (b's asked over a short ssh),
 * names rank 1 as the one the job waits for, prints both ranks' stacks, b's over a second ssh,
 * then stops the job (the worker is test_kolorun.c's). */
KT_TEST(multihost_timeout_prints_remote_stacks, 60)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    if (!have("gdb")) {
        printf("  (skipped: no gdb)\n");
        cluster_down(&c);
        return;
    }
    char hosts[64], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s:1,%s:1", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-p", port_opt, "-i", c.key, "--ssh", c.ssh,
                          "--start-timeout", "20", "--grace-seconds", "1", "--timeout", "4", "--get-stack-traces",
                          kt_self(), "--worker", "kolorun_hang", NULL};
    proc p;
    proc_start(&p, c.ns[NS_A], argv);
    int rc = kt_proc_finish(&p, 50);
    KT_ASSERTF(rc == 124, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    KT_CONTAINS(p.obuf, "[1]<stdout>:rank 1 waits");
    KT_CONTAINS(p.ebuf, "stacks of the 2 ranks still running");
    const char *s0 = strstr(p.ebuf, "[0]<stack "), *s1 = strstr(p.ebuf, "[1]<stack ");
    KT_ASSERTF(s0 && s1, "no stacks of both ranks:\n%s", p.ebuf);
    KT_ASSERTF(strstr(s0, "kolo_allreduce"), "rank 0's stack (local) does not show kolo_allreduce:\n%s", p.ebuf);
    KT_ASSERTF(strstr(s1, "sleep"), "rank 1's stack (on b) does not show its sleep:\n%s", s1);
    /* both ranks' kolo status (b's signalled over a short ssh) and kolorun's reading of them */
    KT_CONTAINS(p.ebuf, "[1]<stderr>:[kolo 1 status] {\"rank\":1,");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 0 waits for rank 1 (in kolo_allreduce (float32, sum), call 1 on "
                        "process set 0)\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: the job waits for rank 1: it waits for no rank in kolo");
    KT_CONTAINS(p.ebuf, "kolorun: exit code 124\n");
    assert_no_leftovers(&c, true, 0.5);
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* An elastic job across hosts (the worker is test_elastic.c's training loop): it starts on a
 * alone, grows onto b when the discovery script lists b, and goes on when a worker on b is
 * killed; b's other worker stays in the job. kolorun runs on the login node, so every worker is
 * remote and the store listens on all interfaces. */
KT_TEST(multihost_elastic_grows_onto_b_and_survives_a_death_there, 90)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char hosts[128], script[256], port_opt[] = MH_PORT;
    snprintf(hosts, sizeof(hosts), "%s/elastic-hosts", c.dir);
    FILE *f = fopen(hosts, "w");
    KT_ASSERT(f);
    fprintf(f, "%s:2\n", ns_addr[NS_A]);
    fclose(f);
    snprintf(script, sizeof(script), "cat %s", hosts);
    const char *argv[] = {kolorun_path(), "-np", "2", "--max-np", "4", "--min-np", "2", "--host-discovery-script", script,
                          "-p", port_opt, "-i", c.key, "--ssh", c.ssh, "--start-timeout", "20", kt_self(), "--worker",
                          "elastic_train", "400", "die=3:120", NULL};
    proc p;
    proc_start(&p, c.ns[NS_L], argv);
    kt_proc_wait_for(&p, "step 10\n", 1, 30);
    f = fopen(hosts, "w");
    KT_ASSERT(f);
    fprintf(f, "%s:2\n%s:2\n", ns_addr[NS_A], ns_addr[NS_B]);
    fclose(f);
    int rc = kt_proc_finish(&p, 60);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    KT_CONTAINS(p.obuf, "round 2 size 4 from step");
    KT_CONTAINS(p.obuf, "round 3 size 3 from step");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 4 workers (2 new, 0 removed)");
    char want[256];
    snprintf(want, sizeof(want), "kolorun: worker 3 (rank 3 of round 2) on host %s was killed by SIGKILL", ns_addr[NS_B]);
    KT_CONTAINS(p.ebuf, want);
    KT_CONTAINS(p.ebuf, "kolorun: round 3: 3 workers (after losing worker 3; 0 new, 0 removed)");
    for (int w = 0; w < 3; w++) {
        snprintf(want, sizeof(want), "done: worker %d rank %d size 3 round 3 step 400", w, w);
        KT_CONTAINS(p.obuf, want);
    }
    assert_no_leftovers(&c, true, 0.5);
    assert_no_leftovers(&c, false, 5);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* kolorun on a with 3 of test_elastic.c's training workers, 0 and 1 on a, 2 on b, with
 * --min-np min_np, KOLO_OP_TIMEOUT=op_timeout and the worker's arguments steps and what; into
 * p, started. False (and nothing run) where the cluster cannot come up. */
static bool elastic_on_a_and_b_start(cluster *c, proc *p, const char *min_np, const char *op_timeout,
                                     const char *steps, const char *what)
{
    if (!cluster_up(c)) {
        cluster_down(c);
        return false;
    }
    char hosts[64], port_opt[] = MH_PORT, timeout[32];
    snprintf(hosts, sizeof(hosts), "%s:2,%s:1", ns_addr[NS_A], ns_addr[NS_B]);
    snprintf(timeout, sizeof(timeout), "KOLO_OP_TIMEOUT=%s", op_timeout);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-np", "3", "--min-np", min_np, "-x", timeout, "-p", port_opt,
                          "-i", c->key, "--ssh", c->ssh, "--start-timeout", "20", "--grace-seconds", "2", kt_self(),
                          "--worker", "elastic_train", steps, what, NULL};
    proc_start(p, c->ns[NS_A], argv);
    return true;
}

/* The same, finished: kolorun must exit 0. */
static bool elastic_on_a_and_b(cluster *c, proc *p, const char *min_np, const char *op_timeout, const char *steps,
                               const char *what)
{
    if (!elastic_on_a_and_b_start(c, p, min_np, op_timeout, steps, what)) return false;
    int rc = kt_proc_finish(p, 70);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p->obuf, p->ebuf);
    return true;
}

static void elastic_on_a_and_b_done(cluster *c, proc *p)
{
    assert_no_leftovers(c, true, 0.5);
    assert_no_leftovers(c, false, 5);
    kt_proc_free(p);
    cluster_down(c);
}

/* kolorun killed worker 2, on b, as silent, saying why (`why` follows "... asked for a new round N"),
 * and workers 0 and 1 finished in the round after, without it. */
static void went_on_without_worker_2(const proc *p, const char *why)
{
    char want[256];
    snprintf(want, sizeof(want), "kolorun: worker 2 (rank 2) on host %s stopped answering: 2 workers gave up on it",
             ns_addr[NS_B]);
    KT_CONTAINS(p->ebuf, want);
    KT_CONTAINS(p->ebuf, why);
    KT_CONTAINS(p->ebuf, "kolorun: round 2: 2 workers (after losing worker 2; 0 new, 0 removed)");
    for (int w = 0; w < 2; w++) {
        snprintf(want, sizeof(want), "done: worker %d rank %d size 2 round ", w, w);
        KT_CONTAINS(p->obuf, want);
    }
}

/* A worker on b that stops answering (SIGSTOP) while the others, on a, time out on it: kolorun
 * reads on b that it used no CPU time, kills it, and the job goes on without it (--min-np 2). */
KT_TEST(multihost_elastic_kills_a_stopped_worker_on_b, 90)
{
    cluster c;
    proc p;
    if (!elastic_on_a_and_b(&c, &p, "2", "2", "60", "stop=2:12")) return;
    went_on_without_worker_2(&p, " s ago, and it used no CPU time in the last ");
    elastic_on_a_and_b_done(&c, &p);
}

/* An elastic job whose host b goes down mid-training (its link cut): workers 0 and 1 on a lose
 * worker 2 within KOLO_TCP_KEEPALIVE (4 s here; KOLO_OP_TIMEOUT is 120), kolorun cannot reach b to
 * read worker 2's CPU time nor keep its ssh session, and the job goes on without it (--min-np 2). */
KT_TEST(multihost_elastic_goes_on_when_b_goes_down, 90)
{
    cluster c;
    proc p;
    setenv("KOLO_TCP_KEEPALIVE", "4", 1);
    bool up = elastic_on_a_and_b_start(&c, &p, "2", "120", "150", "");
    unsetenv("KOLO_TCP_KEEPALIVE");
    if (!up) return;
    kt_proc_wait_for(&p, "step 10\n", 1, 30);
    must(&c, sh(&c, "ip -n %s link set eth0 down", c.ns[NS_B]), "b's link down");
    double t_cut = now_s();
    int rc = kt_proc_finish(&p, 70);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    printf("  the job ended %.1f s after b's link went down\n", p.t_end - t_cut);
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 2 workers (after losing worker 2; 0 new, 0 removed)");
    for (int w = 0; w < 2; w++) {
        char want[64];
        snprintf(want, sizeof(want), "done: worker %d rank %d size 2 round ", w, w);
        KT_CONTAINS(p.obuf, want);
    }
    assert_no_leftovers(&c, true, 10);
    kt_proc_free(&p);
    cluster_down(&c);
}

/* A worker on b that stops answering while b itself stops answering new ssh connections (its
 * listening sshd stopped; the job's sessions go on): kolorun's readings of its CPU time get no
 * answer, and after two (5 s each, 5 s apart) it kills it as silent, "its host did not tell its
 * CPU time", and the job goes on without it (--min-np 2). */
KT_TEST(multihost_elastic_kills_a_worker_whose_host_does_not_answer, 90)
{
    cluster c;
    proc p;
    if (!elastic_on_a_and_b_start(&c, &p, "2", "2", "60", "stop=2:12")) return;
    kt_proc_wait_for(&p, "step 10\n", 1, 30); /* worker 2 stops at step 12; the others ask 2 s later */
    KT_EQ(kill(c.sshd[NS_B], SIGSTOP), 0);
    int rc = kt_proc_finish(&p, 70);
    kill(c.sshd[NS_B], SIGCONT);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    went_on_without_worker_2(&p, " s ago, and its host did not tell its CPU time; killing it, the job goes on without it");
    elastic_on_a_and_b_done(&c, &p);
}

/* kolorun reads the CPU time of the workers on every remote host at once, and goes on meanwhile:
 * kolorun on l, worker 2 on b busy outside kolo for 15 s (the readings below take their time: it
 * must still be busy at the second, 5 s after the first answered), printing a line every 0.25 s,
 * workers 0 and 1 on a timing out on it (as in the test below). An --ssh wrapper holds
 * each host's first reading until the other host's has begun and the test has seen two more of
 * the busy worker's lines come through kolorun after that (or 8 s, past kolorun's 5 s for a
 * reading). Read one host after the other, or with kolorun's loop waiting for the reading, b's
 * first reading is cut off at 5 s, worker 2's CPU time stays unknown, and kolorun kills it as
 * silent ("its host did not tell its CPU time"): the job ends (--min-np 3). */
KT_TEST(multihost_elastic_reads_remote_hosts_at_once, 90)
{
    cluster c;
    if (!cluster_up(&c)) {
        cluster_down(&c);
        return;
    }
    char wrap[128], ssh[1024], hosts[64], port_opt[] = MH_PORT;
    snprintf(wrap, sizeof(wrap), "%s/ssh-wrap", c.dir);
    FILE *f = fopen(wrap, "w");
    KT_ASSERT(f);
    fprintf(f,
            "#!/bin/sh\n"
            "case \"$*\" in *kolorun-cpu*)\n"
            "  for h in %1$s %2$s; do case \" $* \" in *\" $h \"*) me=$h;; esac; done\n"
            "  if mkdir %3$s/cpu-$me 2>/dev/null; then\n"
            "    i=0\n"
            "    until [ $i -ge 80 ] || { [ $(ls -d %3$s/cpu-* | wc -l) -ge 2 ] && [ -e %3$s/go ]; }; do\n"
            "      sleep 0.1; i=$((i + 1))\n"
            "    done\n"
            "  fi;;\n"
            "esac\n"
            "exec \"$@\"\n",
            ns_addr[NS_A], ns_addr[NS_B], c.dir);
    KT_EQ(fclose(f), 0);
    KT_EQ(chmod(wrap, 0755), 0);
    snprintf(ssh, sizeof(ssh), "%s %s", wrap, c.ssh);
    snprintf(hosts, sizeof(hosts), "%s:2,%s:1", ns_addr[NS_A], ns_addr[NS_B]);
    const char *argv[] = {kolorun_path(), "-H", hosts, "-np", "3", "--min-np", "3", "-x", "KOLO_OP_TIMEOUT=2", "-p",
                          port_opt, "-i", c.key, "--ssh", ssh, "--start-timeout", "20", "--grace-seconds", "2",
                          kt_self(), "--worker", "elastic_train", "40", "busy=2:12:15000", NULL};
    proc p;
    proc_start(&p, c.ns[NS_L], argv);
    char held[2][96], go[96];
    for (int h = 0; h < 2; h++) snprintf(held[h], sizeof(held[h]), "%s/cpu-%s", c.dir, ns_addr[h ? NS_A : NS_B]);
    snprintf(go, sizeof(go), "%s/go", c.dir);
    double until = kt_now() + 40 * kt_timeout_scale();
    while (access(held[0], F_OK) != 0 || access(held[1], F_OK) != 0) { /* both hosts' first readings began */
        KT_ASSERTF(kt_now() < until && !p.done, "kolorun began no reading on %s; stdout:\n%s\nstderr:\n%s",
                   access(held[0], F_OK) ? "b" : "a", p.obuf, p.ebuf);
        kt_proc_pump(&p, 50);
    }
    kt_proc_wait_for(&p, "worker 2 spinning", kt_count(p.obuf, "worker 2 spinning") + 2, 20);
    f = fopen(go, "w");
    KT_ASSERT(f);
    KT_EQ(fclose(f), 0);
    int rc = kt_proc_finish(&p, 70);
    KT_ASSERTF(rc == 0, "kolorun exited %d; stdout:\n%s\nstderr:\n%s", rc, p.obuf, p.ebuf);
    kt_spared_busy_worker(p.ebuf); /* test_elastic.c */
    char want[96];
    for (int w = 0; w < 3; w++) {
        snprintf(want, sizeof(want), "done: worker %d rank %d size 3 round ", w, w);
        KT_CONTAINS(p.obuf, want);
    }
    elastic_on_a_and_b_done(&c, &p);
}

/* A worker on b busy outside kolo (it spins 12 s) when the others, on a, time out on it: kolorun
 * reads its CPU time on b (one ssh, tools/kolorun/proc.c) and waits for it, and its next
 * collective fails at once and asks too, so the new round keeps all three (--min-np 3: killing
 * it would end the job, as kolorun did before it read remote workers' CPU time). The checks are
 * test_elastic.c's for a local busy worker. */
KT_TEST(multihost_elastic_waits_for_a_busy_worker_on_b, 90)
{
    cluster c;
    proc p;
    if (!elastic_on_a_and_b(&c, &p, "3", "2", "40", "busy=2:12:12000")) return;
    kt_spared_busy_worker(p.ebuf); /* test_elastic.c */
    KT_CONTAINS(p.ebuf, "kolorun: every worker asked for a new round (a collective failed on all of them): forming it");
    for (int w = 0; w < 3; w++) {
        char want[96];
        snprintf(want, sizeof(want), "done: worker %d rank %d size 3 round ", w, w); /* 2, or later on a busy host */
        KT_CONTAINS(p.obuf, want);
    }
    elastic_on_a_and_b_done(&c, &p);
}
