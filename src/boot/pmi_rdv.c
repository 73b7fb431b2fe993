/* pmi_rdv.c - rank 0's address through the PMI-1 wire protocol, for jobs that MPICH's Hydra
 * (mpirun.mpich, mpiexec.hydra; Intel MPI's mpirun is Hydra too) starts across hosts. Hydra gives
 * every process a connection to its host's proxy but no address where rank 0 could be found.
 *
 * The protocol is lines of "cmd=<name> key=value ...", one answer per request. kolo speaks it
 * itself, nothing linked: "init" (PMI 1.1), "get_my_kvsname" (the job's key-value space, whose
 * name is also kolo's job id), "put" (rank 0: kolo.rdv.<n> = "<address>:<port>"), "barrier_in"
 * (answered with "barrier_out" once every rank entered), "get". The connection is PMI_FD, an open
 * descriptor; or, under `mpiexec -pmi-port`, PMI_PORT (host:port) with PMI_ID, where kolo
 * connects and the server's "initack" names rank and size, which the environment then lacks.
 *
 * Hydra ends the whole job when a process that spoke PMI closes the connection without
 * "finalize" (it takes that for a crash). So the first use registers an exit handler that sends
 * "finalize" when the process exits normally; a crash still ends the job, as it should. The
 * handler does nothing in a forked child (the connection is the parent's), nor when MPI in the
 * same process finalized PMI_FD's connection already (MPI_Finalized, looked up at exit): MPICH's
 * MPI_Init and MPI_Finalize speak on that same connection, before or after kolo's exchange.
 * Under PMI_PORT kolo's connection is its own, and is always finalized.
 * Answers are read a byte at a time so that nothing of a later answer, MPI's, is taken. */
#include "pmi_rdv.h"

#include "../common/common.h"
#include "env.h"
#include "../net/transport.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_ 1024 /* Hydra's longest PMI-1 line */

static struct {
    pthread_mutex_t mu;
    int fd;        /* -1: not connected */
    bool own_fd;   /* connected here (PMI_PORT): closed after finalize */
    pid_t pid;     /* the process that connected */
    int rank, size; /* from initack under PMI_PORT; -1 otherwise */
    char kvs[257];
    int exchanges; /* rendezvous keys used: one per kolo_init */
    bool at_exit;
    char where[300]; /* "PMI_FD=6" or "PMI_PORT=host:port", for messages */
    char failed[512]; /* why connecting failed, said again to later callers */
} P = {PTHREAD_MUTEX_INITIALIZER, -1, false, 0, -1, -1, "", 0, false, "", ""};

static const char *var(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bool kolo__pmi_available(void) { return var("PMI_FD") || (var("PMI_PORT") && var("PMI_ID")); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int send_line(const char *line, const char *what)
{
    size_t n = strlen(line), off = 0;
    while (off < n) {
        ssize_t k = send(P.fd, line + off, n - off, MSG_NOSIGNAL);
        if (k < 0 && errno == ENOTSOCK) k = write(P.fd, line + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): sending %s: %s", P.where, what, strerror(errno));
        off += (size_t)k;
    }
    return KOLO_OK;
}

/* One answer line (without its '\n') into buf, by the deadline. */
static int read_line(char *buf, size_t cap, double deadline, const char *what, int timeout_s)
{
    size_t n = 0;
    for (;;) {
        int left = (int)((deadline - now_s()) * 1000);
        struct pollfd pf = {.fd = P.fd, .events = POLLIN};
        int r = left > 0 ? poll(&pf, 1, left) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r == 0)
            return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): no answer to %s within %d s%s", P.where, what, timeout_s,
                             strcmp(what, "barrier_in") == 0 ? " (not every rank reached kolo_init)" : "");
        char c;
        ssize_t k = r > 0 ? read(P.fd, &c, 1) : -1;
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the process manager %s while kolo waited for the answer to %s",
                             P.where, k == 0 ? "closed the connection" : strerror(errno), what);
        if (c == '\n') break;
        if (n + 1 >= cap) return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the answer to %s is longer than %zu bytes", P.where, what, cap - 1);
        buf[n++] = c;
    }
    buf[n] = '\0';
    return KOLO_OK;
}

/* The value of key in a line of "k=v" words, into out; false when absent or too long. */
static bool field(const char *line, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = line; *p;) {
        p += strspn(p, " ");
        size_t wl = strcspn(p, " ");
        if (wl > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
            size_t vl = wl - kl - 1;
            if (vl >= cap) return false;
            memcpy(out, p + kl + 1, vl);
            out[vl] = '\0';
            return true;
        }
        p += wl;
    }
    return false;
}

/* Sends req ("cmd=<what> ..."), reads the answer, which must be "cmd=<want> ..." with rc=0 when
 * it has an rc. */
static int request(const char *req, const char *what, const char *want, char *ans, size_t cap, int timeout_s)
{
    char line[LINE_MAX_ + 2];
    snprintf(line, sizeof(line), "%s\n", req);
    int st = send_line(line, what);
    if (st) return st;
    if ((st = read_line(ans, cap, now_s() + timeout_s, what, timeout_s))) return st;
    char cmd[64], rc[16], msg[256];
    if (!field(ans, "cmd", cmd, sizeof(cmd)) || strcmp(cmd, want) != 0)
        return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the process manager answered '%.200s' to %s (expected cmd=%s)",
                         P.where, ans, what, want);
    if (field(ans, "rc", rc, sizeof(rc)) && strcmp(rc, "0") != 0) {
        bool has_msg = field(ans, "msg", msg, sizeof(msg));
        return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): %s failed: rc=%s%s%s", P.where, what, rc, has_msg ? " " : "",
                         has_msg ? msg : "");
    }
    return KOLO_OK;
}

/* MPI_Initialized or MPI_Finalized of an MPI in this process; false without MPI. */
static bool mpi_says(const char *fn)
{
    int (*f)(int *) = (int (*)(int *))dlsym(RTLD_DEFAULT, fn);
    int yes = 0;
    return f && f(&yes) == 0 && yes;
}

static void finalize_at_exit(void)
{
    /* a thread that exits the process while another is in an exchange: no goodbye (Hydra then
     * ends the job, as for a crash) rather than a process that never exits */
    if (pthread_mutex_trylock(&P.mu) != 0) return;
    if (P.fd >= 0 && P.pid == getpid() && (P.own_fd || !mpi_says("MPI_Finalized"))) {
        char ans[LINE_MAX_ + 2];
        /* a short wait: the proxy answers at once, and a process on its way out must not hang */
        if (request("cmd=finalize", "finalize", "finalize_ack", ans, sizeof(ans), 5) != KOLO_OK)
            fprintf(stderr, "[kolo] %s\n", kolo_last_error());
        if (P.own_fd) close(P.fd);
        P.fd = -1;
    }
    pthread_mutex_unlock(&P.mu);
}

/* TCP to "host:port" of PMI_PORT. */
static int dial(const char *hostport)
{
    char host[256];
    int port;
    if (!kolo__parse_hostport(hostport, host, sizeof(host), &port))
        return kolo__err(KOLO_ERR_STARTUP, "environment variable PMI_PORT='%s' is not host:port", hostport);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return kolo__err(KOLO_ERR_STARTUP, "PMI_PORT='%s': %s does not resolve (%s)", hostport, host, gai_strerror(g));
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return kolo__err(KOLO_ERR_STARTUP, "PMI_PORT='%s': connect: %s", hostport, strerror(err));
    P.fd = fd;
    P.own_fd = true;
    return KOLO_OK;
}

/* Under PMI_PORT: "cmd=initack pmiid=<id>", answered with initack, then set size, rank, debug. */
static int initack(int timeout_s)
{
    const char *id = var("PMI_ID");
    char req[128], ans[LINE_MAX_ + 2], v[32];
    int st;
    snprintf(req, sizeof(req), "cmd=initack pmiid=%s", id);
    if ((st = request(req, "initack", "initack", ans, sizeof(ans), timeout_s))) return st;
    double deadline = now_s() + timeout_s;
    for (int i = 0; i < 3; i++) {
        if ((st = read_line(ans, sizeof(ans), deadline, "initack", timeout_s))) return st;
        char cmd[16];
        int *dst = field(ans, "size", v, sizeof(v)) ? &P.size : field(ans, "rank", v, sizeof(v)) ? &P.rank : NULL;
        if (!field(ans, "cmd", cmd, sizeof(cmd)) || strcmp(cmd, "set") != 0)
            return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the process manager answered '%.200s' after initack (expected cmd=set)",
                             P.where, ans);
        if (dst) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 0 || x > (1 << 24))
                return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): '%.200s' is no number", P.where, ans);
            *dst = (int)x;
        }
    }
    if (P.rank < 0 || P.size < 1 || P.rank >= P.size)
        return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): initack gave rank %d of %d", P.where, P.rank, P.size);
    return KOLO_OK;
}

static int connect_first(int timeout_s);

static int connect_once(int timeout_s)
{
    if (P.fd >= 0 && P.pid == getpid()) return P.kvs[0] ? KOLO_OK : kolo__err(KOLO_ERR_STARTUP, "%s", P.failed);
    int st = connect_first(timeout_s);
    if (st) snprintf(P.failed, sizeof(P.failed), "%s", kolo__errmsg());
    return st;
}

/* Connects once per process (P.mu held): the descriptor or the port, init, the kvs name; a
 * failure is remembered and said again to later callers (from_pmi asks for the kvs name first). */
static int connect_first(int timeout_s)
{
    P.fd = -1;
    P.own_fd = false;
    P.rank = P.size = -1;
    P.kvs[0] = '\0';
    P.exchanges = 0;
    const char *fdv = var("PMI_FD"), *port = var("PMI_PORT");
    int st;
    if (fdv) {
        snprintf(P.where, sizeof(P.where), "PMI_FD=%s", fdv);
        char *end;
        long fd = strtol(fdv, &end, 10);
        if (*end || fd < 0 || fd > INT32_MAX || fcntl((int)fd, F_GETFD) < 0)
            return kolo__err(KOLO_ERR_STARTUP, "environment variable PMI_FD='%s' is not an open descriptor", fdv);
        P.fd = (int)fd;
    } else if (port && var("PMI_ID")) {
        snprintf(P.where, sizeof(P.where), "PMI_PORT=%s", port);
        /* Hydra serves one connection per process id: a second one, beside MPI's, leaves MPI's
         * unanswered (MPI_Finalize then hangs) */
        if (mpi_says("MPI_Initialized"))
            return kolo__err(KOLO_ERR_STARTUP,
                             "PMI (%s): MPI_Init already holds this process's PMI connection, and mpiexec "
                             "-pmi-port serves one per process: call kolo_init before MPI_Init, or start "
                             "without -pmi-port", P.where);
        if ((st = dial(port))) return st;
    } else {
        return kolo__err(KOLO_ERR_STARTUP, "no PMI connection: neither PMI_FD nor PMI_PORT with PMI_ID is set");
    }
    P.pid = getpid();
    if (!P.at_exit) P.at_exit = atexit(finalize_at_exit) == 0;
    char ans[LINE_MAX_ + 2];
    if ((!fdv && (st = initack(timeout_s))) ||
        (st = request("cmd=init pmi_version=1 pmi_subversion=1", "init", "response_to_init", ans, sizeof(ans), timeout_s)) ||
        (st = request("cmd=get_my_kvsname", "get_my_kvsname", "my_kvsname", ans, sizeof(ans), timeout_s)))
        return st;
    if (!field(ans, "kvsname", P.kvs, sizeof(P.kvs)) || !P.kvs[0])
        return kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the answer '%.200s' names no kvsname", P.where, ans);
    return KOLO_OK;
}

int kolo__pmi_identity(int *rank, int *size, int timeout_s)
{
    pthread_mutex_lock(&P.mu);
    int st = connect_once(timeout_s);
    if (st == KOLO_OK && P.size < 1)
        st = kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the process manager gives no rank through PMI_FD; "
                       "PMI_RANK and PMI_SIZE should be set", P.where);
    if (st == KOLO_OK) {
        *rank = P.rank;
        *size = P.size;
    }
    pthread_mutex_unlock(&P.mu);
    return st;
}

int kolo__pmi_kvsname(char *out, size_t cap, int timeout_s)
{
    pthread_mutex_lock(&P.mu);
    int st = connect_once(timeout_s);
    if (st == KOLO_OK) snprintf(out, cap, "%s", P.kvs);
    pthread_mutex_unlock(&P.mu);
    return st;
}

int kolo__pmi_rendezvous(int rank, const char *iface, int timeout_s, char *host, size_t cap)
{
    pthread_mutex_lock(&P.mu);
    char req[LINE_MAX_], ans[LINE_MAX_ + 2], mine[300] = "", key[64];
    bool published_nothing = false; /* rank 0 had no address: every rank knows after the barrier */
    int st = connect_once(timeout_s);
    if (st) goto out;
    snprintf(key, sizeof(key), "kolo.rdv.%d", P.exchanges++);
    if (rank == 0) {
        st = kolo__rdv_endpoint(iface, NULL, "PMI", mine, sizeof(mine));
        /* said now, before the barrier through which the others learn of it (pmix_rdv.c) */
        if (st != KOLO_OK) KOLO_ERROR("%s; the other ranks learn of it now", kolo__errmsg());
        /* publish even an empty value: the others learn of the failure at once, not by timeout */
        snprintf(req, sizeof(req), "cmd=put kvsname=%s key=%s value=%s", P.kvs, key, *mine ? mine : "-");
        int ps = request(req, "put", "put_result", ans, sizeof(ans), timeout_s);
        published_nothing = st != KOLO_OK && ps == KOLO_OK;
        if (st == KOLO_OK) st = ps;
    }
    int bs = request("cmd=barrier_in", "barrier_in", "barrier_out", ans, sizeof(ans), timeout_s);
    if (st == KOLO_OK) st = bs;
    if (bs) goto out;
    if (st) goto said;
    snprintf(req, sizeof(req), "cmd=get kvsname=%s key=%s", P.kvs, key);
    if ((st = request(req, "get", "get_result", ans, sizeof(ans), timeout_s))) goto out;
    if (!field(ans, "value", mine, sizeof(mine))) {
        st = kolo__err(KOLO_ERR_STARTUP, "PMI (%s): the answer '%.200s' to get has no value", P.where, ans);
    } else if (strcmp(mine, "-") == 0) {
        st = kolo__err(KOLO_ERR_STARTUP, "rank 0 published no address through PMI (see rank 0's error)");
        published_nothing = true;
        KOLO_ERROR("%s", kolo__errmsg());
    } else {
        snprintf(host, cap, "%s", mine);
    }
said:
    /* every rank has said why now; a second barrier keeps any from leaving before the rest have
     * (pmix_rdv.c: the first rank to exit ends the job) */
    if (published_nothing) {
        char why[1024]; /* the reason, kept from a failing barrier's own */
        snprintf(why, sizeof(why), "%s", kolo__errmsg());
        if (request("cmd=barrier_in", "barrier_in", "barrier_out", ans, sizeof(ans), kolo__rdv_parting_s(timeout_s)))
            kolo__err(st, "%s", why);
    }
out:
    pthread_mutex_unlock(&P.mu);
    return st;
}

int kolo__rdv_parting_s(int timeout_s) { return timeout_s > 0 && timeout_s < 10 ? timeout_s : 10; }

/* A TCP port free on all interfaces now. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof(sa);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

int kolo__rdv_endpoint(const char *iface, const char *towards, const char *via, char *out, size_t cap)
{
    char addr[INET_ADDRSTRLEN] = "";
    if (*iface) {
        if (kolo__iface_address(iface, addr, sizeof(addr)) != KOLO_OK) addr[0] = '\0';
    } else if (!(towards && kolo__route_address(towards, 0, addr, sizeof(addr)) == KOLO_OK &&
                 strncmp(addr, "127.", 4) != 0)) {
        if (kolo__iface_address("", addr, sizeof(addr)) != KOLO_OK) addr[0] = '\0';
    }
    if (!*addr)
        return kolo__err(KOLO_ERR_STARTUP, "rank 0 found no IPv4 address to publish through %s%s%s%s", via,
                         *iface ? " (KOLO_IFACE='" : "", iface, *iface ? "')" : "");
    int port = free_port();
    if (port <= 0) return kolo__err_sys(errno, "rank 0 found no free TCP port for the rendezvous store");
    snprintf(out, cap, "%s:%d", addr, port);
    return KOLO_OK;
}
