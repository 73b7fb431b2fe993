/* mesh.c - assembling the job: publish this rank, learn every peer, connect to all of them.
 *
 * Steps:
 *   1. Pick the local address: the one on the interface that routes to the rendezvous host
 *      (a UDP connect() reveals it without sending anything), or the first address of an
 *      interface allowed by KOLO_IFACE. Listen there on port 0.
 *   2. Publish "<job>/peer/<rank>" = address, port, pid, host key, cores, pid namespace, host
 *      name; read every other rank's entry, waiting until KOLO_START_TIMEOUT, then name the
 *      missing ranks.
 *   3. For each channel and each pair, the higher rank connects to the lower one. Handshake
 *      (all fixed-size binary messages; HMAC-SHA256 with the job secret, distinct labels):
 *        A (acceptor) -> C: "KOLOMSH6", rank_a, nonce_a
 *        C -> A: "KOLOMSH6", rank_c, channel, nonce_c, mac(connect: job, nonce_a, rank_c, channel, rank_a)
 *        A -> C: mac(accept: job, nonce_c, rank_a, channel, rank_c), transport offer
 *                (tcp, or shm with a segment name), A's pid and a probe address for CMA
 *        C -> A: shm opened and token matched?, CMA read of A's probe worked (and KOLO_SHM_CMA
 *                is not 0 at C)?, C's probe address
 *        A -> C: CMA read of C's probe worked (and KOLO_SHM_CMA is not 0 at A)?
 *      A proves its identity to C and C to A; neither answer can be replayed (fresh nonces,
 *      labels per direction). Shared memory is offered only when the host keys (boot id +
 *      network namespace) are equal, and used only when the peer actually finds the creator's
 *      token in the segment, so "same host" is proven, not guessed from a hostname. A rank
 *      with KOLO_TRANSPORT=tcp neither offers nor accepts it: all of its pairs are TCP. A CMA
 *      probe is read only between ranks of one pid namespace (a pid names another process in
 *      another), and its value is random, so that a rank cannot pass it by reading itself.
 *   4. Anything else that connects (a stranger, garbage, a wrong secret, a duplicate) is
 *      refused, logged with its address, and the start-up goes on. All sockets are
 *      non-blocking in one epoll loop, so a silent stranger cannot stall the others.
 *      The listening socket is closed at the end: no port stays open after start-up.
 */
#include "transport.h"

#include "../boot/auth.h"
#include "../boot/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

/* The greeting's magic names the wire's version: KOLOMSH2 since TCP frames may carry filler
 * (tcp.c), KOLOMSH3 since shared-memory control blocks carry a doorbell, KOLOMSH4 since a
 * sleeper says there what it waits for (shm.c, "Sleeping"), KOLOMSH5 since they hold the ways
 * of a fourth kind of call (KOLO_PAIR_KINDS: a crowded host's alltoalls), which moved the
 * doorbell, KOLOMSH6 since a frame's length carries its sender's call tag in its top 16 bits
 * (xfer.c, "Call tags"). A peer of another version would misread our frames, so it is refused
 * by name. */
#define HS_MAGIC "KOLOMSH6"
#define HS_FAMILY_LEN 7 /* "KOLOMSH": a kolo peer, of some wire version */
#define HELLO_A_LEN (8 + 4 + KOLO_NONCE_LEN)
#define HELLO_C_LEN (8 + 4 + 4 + KOLO_NONCE_LEN + KOLO_MAC_LEN)
#define SHM_NAME_LEN 96
#define ACK_LEN (KOLO_MAC_LEN + 4 + SHM_NAME_LEN + 4 + 8 + 8)
#define RESULT_LEN (4 + 4 + 8 + 8)
#define FINAL_LEN 4
#define HS_BUF 192
#define CONNECT_HANGUPS_MAX 16 /* a connector's tries at an acceptor that closes before accepting */
#define ACCEPTS_PER_EVENT 256  /* connections taken from the backlog before the handshakes go on */

/* CMA probe: a value the peer reads from our memory to prove process_vm_readv works, drawn anew
 * by each start-up (set_cma_probe), as ranks forked from one process would share one drawn once.
 * A constant let a rank whose peer's pid named itself (ranks in pid namespaces of their own are
 * pid 1 alike) read its own copy and pass wherever the two mapped libkolo at one address (forked
 * ranks, or ASLR off): the first single-copy read then failed the job ("Bad address") or read the
 * rank's own buffer as the peer's. */
static volatile uint64_t cma_probe;

static void set_cma_probe(void)
{
    uint64_t v = 0;
    if (kolo__random_bytes(&v, sizeof(v)) != KOLO_OK) v = kolo__now_ns() ^ ((uint64_t)getpid() << 32);
    cma_probe = v;
}

enum hs_state {
    HS_CONNECTING,  /* C: waiting for connect() */
    HS_WAIT_HELLO_A,
    HS_WAIT_HELLO_C,
    HS_WAIT_ACK,
    HS_WAIT_RESULT,
    HS_WAIT_FINAL,
    HS_DONE,
    HS_FREE
};

typedef struct hs {
    int fd, state, role; /* role: 'A' or 'C' */
    uint32_t gen;        /* told apart from an earlier handshake in the same slot, in epoll's events */
    int peer, channel;
    int hangups;         /* C: the acceptor closed before accepting (see on_readable) */
    uint64_t deadline, retry_at;
    size_t need, have;
    unsigned char in[HS_BUF];
    unsigned char nonce[KOLO_NONCE_LEN];
    char shm_name[SHM_NAME_LEN];
    char from[96];
    kolo__conn *conn;
} hs;

typedef struct build {
    const kolo__world_info *wi;
    kolo__mesh **meshes;
    kolo__peer_info *peers;
    int tcp_only, want_cma, populate; /* want_cma: 0 no, 1 yes, 2 auto (capable, decided later) */
    int reserve;                      /* segments' pages allocated in /dev/shm at creation */
    int shm_failed;                   /* pairs that could not have shared memory: the first warns */
    uint64_t greet_ns; /* how long an accepted connection may take to say who it is */
    size_t ring, cma_threshold;
    hs *hss;
    size_t nhs, caphs, nfree; /* nfree: slots of refused handshakes, for reuse */
    int pending_in, pending_out;
    unsigned char *ready; /* [channel * size + peer]: handshake complete */
    kolo__store *store;
    uint64_t next_abort_check;
    int epfd;          /* every handshake's socket and the listener: one event per socket ready */
    uint32_t gen;      /* the last hs.gen given */
    uint64_t next_due; /* the earliest retry or greeting deadline in the table (0: none known) */
    uint64_t quiet_ns; /* KOLO_START_TIMEOUT: how long the start-up may go without progress */
    uint64_t progress; /* when a handshake last finished (or the rendezvous did) */
    /* refused connections: REFUSALS_LOGGED are logged, the rest counted (the latest kept) */
    unsigned refusals;
    char last_refused[96 + 192];
    uint64_t accept_resume; /* out of descriptors with no handshake to close: the listener rests till then */
} build;

/* ---- elastic rounds ---- */

#define ABORT_CHECK_NS 200000000ull

/* How the last kolo__mesh_build ended, for kolo_init's retry in elastic jobs. */
static int last_end;

int kolo__mesh_last_end(void) { return last_end; }

/* An elastic job's round is superseded when kolorun has given this worker a place in the next
 * one (wi->abort_key exists): a member died or a host came while this round was starting, and
 * its missing ranks will never come. Looked up at most every ABORT_CHECK_NS. */
static int check_superseded(build *b)
{
    const kolo__world_info *wi = b->wi;
    uint64_t now = kolo__now_ns();
    if (!wi->abort_key[0] || now < b->next_abort_check) return KOLO_OK;
    b->next_abort_check = now + ABORT_CHECK_NS;
    void *v = NULL;
    size_t len = 0;
    if (kolo__store_get(b->store, wi->abort_key, &v, &len, 0) != KOLO_OK) {
        kolo__err_clear();
        return KOLO_OK;
    }
    kolo__free(v);
    last_end = KOLO__MESH_SUPERSEDED;
    return kolo__err(KOLO_ERR_STARTUP, "rank %d: kolorun formed a newer round of the elastic job while round %d was starting",
                     wi->rank, wi->epoch);
}

/* ---- local address ---- */

static bool iface_allowed(const char *name, const char *spec)
{
    if (!spec || !*spec) return strncmp(name, "lo", 2) != 0 && strncmp(name, "docker", 6) != 0;
    bool exclude = spec[0] == '^';
    if (exclude) spec++;
    bool exact = spec[0] == '=';
    if (exact) spec++;
    bool match = false;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (exact ? strcmp(name, tok) == 0 : strncmp(name, tok, strlen(tok)) == 0) match = true;
    }
    return exclude ? !match : match;
}

/* The address of `family` (AF_INET, AF_INET6) this host sends from towards host. */
static int route_family(const char *host, int port, int family, char *addr, size_t cap)
{
    struct addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port > 0 ? port : 9);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) return kolo__err(KOLO_ERR_STARTUP, "cannot resolve the host '%s': %s", host, gai_strerror(g));
    int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &sl) == 0;
    int e = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    if (!ok) return kolo__err_sys(e, "no route to %s", host);
    const void *in = family == AF_INET ? (const void *)&((struct sockaddr_in *)&sa)->sin_addr
                                       : (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr;
    if (!inet_ntop(family, in, addr, (socklen_t)cap)) return kolo__err_sys(errno, "the address towards %s", host);
    return KOLO_OK;
}

int kolo__route_address(const char *host, int port, char *addr, size_t cap)
{
    return route_family(host, port, AF_INET, addr, cap);
}

/* The first address of `family` on an interface that is up and that spec allows; for IPv6 a
 * global one (a link-local address needs its interface named beside it, which peers cannot). */
static bool iface_family(const char *spec, int family, char *addr, size_t cap)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
        if (!iface_allowed(i->ifa_name, spec)) continue;
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (family == AF_INET6 && (IN6_IS_ADDR_LINKLOCAL(a6) || (!*spec && IN6_IS_ADDR_LOOPBACK(a6)))) continue;
        const void *in = family == AF_INET ? (const void *)&((const struct sockaddr_in *)i->ifa_addr)->sin_addr
                                           : (const void *)a6;
        found = inet_ntop(family, in, addr, (socklen_t)cap) != NULL;
    }
    freeifaddrs(ifs);
    return found;
}

int kolo__iface_address(const char *spec, char *addr, size_t cap)
{
    if (!iface_family(spec, AF_INET, addr, cap))
        return kolo__err(KOLO_ERR_STARTUP, "no IPv4 interface matches KOLO_IFACE='%s'", spec);
    return KOLO_OK;
}

/* The address this rank listens on for the others: IPv4 where it has one (the interface
 * KOLO_IFACE names, else the one that routes to the rendezvous host), else IPv6, for a cluster
 * with IPv6 alone (Kubernetes can be one). Every rank reaches the others the way it reaches the
 * rendezvous host, so they all publish the same family. */
static int pick_address(const kolo__world_info *wi, char *addr, size_t cap)
{
    const char *spec = kolo__setting_str(KOLO_SET_IFACE);
    if (*spec) {
        if (iface_family(spec, AF_INET, addr, cap) || iface_family(spec, AF_INET6, addr, cap)) return KOLO_OK;
        return kolo__err(KOLO_ERR_STARTUP, "no interface that is up matches KOLO_IFACE='%s' with an IPv4 address or a "
                         "global IPv6 one", spec);
    }
    if (route_family(wi->rdv_host, wi->rdv_port, AF_INET, addr, cap) == KOLO_OK) return KOLO_OK;
    char v4[256];
    snprintf(v4, sizeof(v4), "%s", kolo__errmsg());
    if (route_family(wi->rdv_host, wi->rdv_port, AF_INET6, addr, cap) == KOLO_OK) return KOLO_OK;
    return kolo__err(KOLO_ERR_STARTUP, "rendezvous host %s:%d: %s; over IPv6: %s", wi->rdv_host, wi->rdv_port, v4,
                     kolo__errmsg());
}

/* addr (numeric, IPv4 or IPv6) and port as a socket address; 0 when addr is neither. */
static socklen_t sockaddr_of(const char *addr, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        return sizeof(*a4);
    }
    if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        return sizeof(*a6);
    }
    return 0;
}

/* test hook: a name appended to this process's host key, so that ranks of one machine look like
 * ranks of several hosts (TCP between them, and the hierarchical collectives' layout) */
static char test_host[16];
void kolo__mesh_test_host(const char *name) { snprintf(test_host, sizeof(test_host), "%s", name ? name : ""); }

void kolo__host_key(char *out, size_t cap)
{
    char boot[64] = "noboot", ns[64] = "nons";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (fgets(boot, sizeof(boot), f)) boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
    if (n > 0) ns[n] = '\0';
    snprintf(out, cap, "%.40s/%.38s%.15s", boot, ns, test_host);
}

/* The inode of this process's pid namespace (0 where /proc does not say): ranks of one host with
 * different ones cannot name each other by pid (containers sharing the host's network and
 * /dev/shm, each with pids of its own). */
static uint64_t pid_ns(void)
{
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
    unsigned long long ino = 0;
    if (n <= 0) return 0;
    link[n] = '\0';
    return sscanf(link, "pid:[%llu]", &ino) == 1 ? (uint64_t)ino : 0;
}

/* Whether this rank may read a peer's memory by the pid it published: the same pid namespace,
 * or one of them could not tell (the random probe value still guards that case). */
static bool pids_shared(const kolo__peer_info *a, const kolo__peer_info *b)
{
    return a->pidns == b->pidns || !a->pidns || !b->pidns;
}

/* Whether two ranks' host keys name the same boot of the same kernel (whatever their network
 * namespaces): they run on the same machine's cores. Never for ranks that could not read their
 * boot id (host_key's "noboot"). */
static bool same_kernel(const kolo__peer_info *a, const kolo__peer_info *b)
{
    size_t boot = strcspn(a->hostkey, "/");
    return strcspn(b->hostkey, "/") == boot && strncmp(a->hostkey, b->hostkey, boot) == 0 &&
           strncmp(a->hostkey, "noboot/", 7) != 0;
}

/* The set kolo__host_cpus counts, hashed (FNV-1a): the affinity mask, or 0 for all online cores
 * (bound to one core, or no mask). */
static uint64_t cores_key(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) <= 1) return 0;
    return kolo__fnv1a(&set, sizeof(set));
}

/* ---- helpers ---- */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* HMAC over job id, nonce and three integers: the fields each side must bind. */
static int hs_mac(uint8_t out[KOLO_MAC_LEN], const kolo__world_info *wi, const char *label,
                  const unsigned char *nonce, uint32_t a, uint32_t b, uint32_t c)
{
    unsigned char msg[sizeof(wi->job_id) + KOLO_NONCE_LEN + 12];
    size_t jl = strlen(wi->job_id);
    memcpy(msg, wi->job_id, jl);
    memcpy(msg + jl, nonce, KOLO_NONCE_LEN);
    put32(msg + jl + KOLO_NONCE_LEN, a);
    put32(msg + jl + KOLO_NONCE_LEN + 4, b);
    put32(msg + jl + KOLO_NONCE_LEN + 8, c);
    return kolo__hmac(out, wi->secret, wi->secret_len, label, msg, jl + KOLO_NONCE_LEN + 12);
}

static int send_all(hs *h, const void *buf, size_t len)
{
    /* handshake messages are < 200 bytes on a fresh socket: they always fit its buffer */
    ssize_t k = send(h->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k == (ssize_t)len) return 0;
    return -1;
}

/* A slot in the table, reused once its handshake was refused. Slots of finished handshakes are
 * not: their connections are named in the table until the end. */
static hs *hs_new(build *b)
{
    hs *h = NULL;
    for (size_t i = b->nfree ? 0 : b->nhs; i < b->nhs; i++)
        if (b->hss[i].state == HS_FREE) {
            h = &b->hss[i];
            b->nfree--;
            break;
        }
    if (!h) {
        if (b->nhs == b->caphs) {
            size_t nc = b->caphs ? b->caphs * 2 : 16;
            hs *n = kolo__realloc(b->hss, nc * sizeof(hs));
            if (!n) return NULL;
            b->hss = n;
            b->caphs = nc;
        }
        h = &b->hss[b->nhs++];
    }
    memset(h, 0, sizeof(*h));
    h->gen = ++b->gen;
    return h;
}

static void due_at(build *b, uint64_t t)
{
    if (!b->next_due || t < b->next_due) b->next_due = t;
}

/* Watches h's socket for what its state waits for: writable while connecting, readable after. */
static int hs_watch(build *b, hs *h, int op)
{
    struct epoll_event ev = {.events = h->state == HS_CONNECTING ? EPOLLOUT : EPOLLIN,
                             .data.u64 = (uint64_t)h->gen << 32 | (uint64_t)(h - b->hss)};
    if (epoll_ctl(b->epfd, op, h->fd, &ev) != 0) return kolo__err_sys(errno, "epoll_ctl() on a handshake's socket");
    return KOLO_OK;
}

/* Refusals logged one by one: a port scan of a rank starting up wrote a line per port hit. The
 * rest are counted, and told in one line when the handshakes end (report_refusals). */
#define REFUSALS_LOGGED 10

static void refuse(build *b, hs *h, const char *why)
{
    if (++b->refusals <= REFUSALS_LOGGED)
        KOLO_WARN("refused a connection from %s: %s%s", h->from, why,
                  b->refusals == REFUSALS_LOGGED ? " (more refusals are counted, not logged)" : "");
    else
        snprintf(b->last_refused, sizeof(b->last_refused), "%s: %s", h->from, why);
    close(h->fd); /* leaves the epoll set with it */
    h->fd = -1;
    h->state = HS_FREE;
    b->nfree++;
}

static void report_refusals(build *b)
{
    if (b->refusals > REFUSALS_LOGGED)
        KOLO_WARN("refused %u more connections during the start-up (the latest from %s)", b->refusals - REFUSALS_LOGGED,
                  b->last_refused);
}

/* Out of descriptors: closes the connection that has waited longest without saying who it is
 * (under a flood of silent strangers, a stranger; a rank's connection says who it is within
 * milliseconds). false when there is none. Before, accept() out of descriptors left the
 * listener ready and the loop spinning on it until the strangers' greeting time ran out. */
static bool make_room(build *b, const char *why)
{
    hs *oldest = NULL;
    for (size_t i = 0; i < b->nhs; i++) {
        hs *h = &b->hss[i];
        if (h->role == 'A' && h->state == HS_WAIT_HELLO_C && h->fd >= 0 && (!oldest || h->deadline < oldest->deadline))
            oldest = h;
    }
    if (!oldest) return false;
    refuse(b, oldest, why);
    return true;
}

static kolo__conn *conn_new(build *b, int channel, int peer, int fd)
{
    kolo__conn *c = kolo__calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->mesh = b->meshes[channel];
    c->peer = peer;
    c->fd = fd;
    c->sendq_tail = &c->sendq;
    c->recvq_tail = &c->recvq;
    return c;
}

/* ---- acceptor side ---- */

/* A greeting whose magic is kolo's but not this build's wire version: true, with the version it
 * names in `name` (its last byte escaped unless printable, as it comes off the wire). */
static bool other_version(const unsigned char *magic, char name[16])
{
    if (memcmp(magic, HS_MAGIC, HS_FAMILY_LEN) != 0 || memcmp(magic, HS_MAGIC, 8) == 0) return false;
    unsigned char v = magic[HS_FAMILY_LEN];
    if (v >= 0x20 && v < 0x7f) snprintf(name, 16, "%.7s%c", (const char *)magic, v);
    else snprintf(name, 16, "%.7s\\x%02x", (const char *)magic, v);
    return true;
}

static int on_hello_c(build *b, hs *h)
{
    const kolo__world_info *wi = b->wi;
    char version[16];
    if (other_version(h->in, version)) {
        char why[160];
        snprintf(why, sizeof(why), "a kolo of another wire version (%s; this one speaks %s): every rank of a job "
                 "must run the same kolo", version, HS_MAGIC);
        refuse(b, h, why);
        return KOLO_OK;
    }
    if (memcmp(h->in, HS_MAGIC, 8) != 0) {
        refuse(b, h, "not a kolo peer (bad magic)");
        return KOLO_OK;
    }
    uint32_t rc = get32(h->in + 8), ch = get32(h->in + 12);
    const unsigned char *nonce_c = h->in + 16, *mac = h->in + 16 + KOLO_NONCE_LEN;
    uint8_t want[KOLO_MAC_LEN];
    if (hs_mac(want, wi, "kolo-mesh-connect", h->nonce, rc, ch, (uint32_t)wi->rank) != KOLO_OK) return KOLO_ERR_INTERNAL;
    if (!kolo__mac_equal(want, mac)) {
        refuse(b, h, "it does not hold this job's secret (or belongs to another job)");
        return KOLO_OK;
    }
    if ((int)rc <= wi->rank || (int)rc >= wi->size || ch >= KOLO_NCHANNELS) {
        refuse(b, h, "it claims a rank or channel that cannot connect here");
        return KOLO_OK;
    }
    if (b->meshes[ch]->conns[rc]) {
        refuse(b, h, "duplicate connection for a rank already connected");
        return KOLO_OK;
    }
    h->peer = (int)rc;
    h->channel = (int)ch;
    b->progress = kolo__now_ns(); /* a peer proved itself */
    kolo__conn *c = conn_new(b, (int)ch, (int)rc, h->fd);
    if (!c) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a connection");
    h->conn = c;
    b->meshes[ch]->conns[rc] = c;

    unsigned char ack[ACK_LEN];
    memset(ack, 0, sizeof(ack));
    if (hs_mac(ack, wi, "kolo-mesh-accept", nonce_c, (uint32_t)wi->rank, ch, rc) != KOLO_OK) return KOLO_ERR_INTERNAL;
    uint32_t offer = 0;
    if (!b->tcp_only && strcmp(b->peers[rc].hostkey, b->peers[wi->rank].hostkey) == 0) {
        /* Each channel's connection makes its own segment, so in a short /dev/shm one channel of a
         * pair may find room where the other did not: the message says which calls go slow. */
        const char *calls = ch == KOLO_CHANNEL_ENGINE
                                ? "the engine's collectives (the *_async calls, and every call of the Python bindings)"
                                : "direct collectives (kolo_allreduce and the other blocking calls of the C API)";
        if (kolo__shm_create(c, h->shm_name, sizeof(h->shm_name), b->ring, b->populate, b->reserve) == KOLO_OK)
            offer = 1;
        else if (b->shm_failed++ == 0)
            KOLO_WARN("shared memory with rank %d unavailable for %s, using TCP: %s", (int)rc, calls, kolo__errmsg());
        else
            KOLO_INFO("shared memory with rank %d unavailable for %s, using TCP: %s", (int)rc, calls, kolo__errmsg());
    }
    put32(ack + KOLO_MAC_LEN, offer);
    memcpy(ack + KOLO_MAC_LEN + 4, h->shm_name, SHM_NAME_LEN);
    put32(ack + KOLO_MAC_LEN + 4 + SHM_NAME_LEN, (uint32_t)getpid());
    put64(ack + KOLO_MAC_LEN + 8 + SHM_NAME_LEN, (uint64_t)(uintptr_t)&cma_probe);
    put64(ack + KOLO_MAC_LEN + 16 + SHM_NAME_LEN, cma_probe);
    if (send_all(h, ack, sizeof(ack)) != 0) {
        return kolo__err(KOLO_ERR_STARTUP, "rank %d on %s hung up during the handshake", (int)rc, h->from);
    }
    h->state = HS_WAIT_RESULT;
    h->need = RESULT_LEN;
    h->have = 0;
    return KOLO_OK;
}

/* Whether this rank can read the probe value `expect` at `addr` in h's peer (single-copy reads
 * from it will work), where KOLO_SHM_CMA allows them. */
static bool cma_probe_peer(build *b, const hs *h, uint64_t addr, uint64_t expect)
{
    const kolo__peer_info *p = &b->peers[h->peer];
    if (!b->want_cma) return false;
    if (!pids_shared(p, &b->peers[b->wi->rank])) {
        if (h->channel == 0)
            KOLO_INFO("rank %d runs in another pid namespace (a container of its own?): no single-copy reads "
                      "between us, ring copies only", h->peer);
        return false;
    }
    uint64_t v = 0;
    struct iovec l = {&v, sizeof(v)}, r = {(void *)(uintptr_t)addr, sizeof(v)};
    return process_vm_readv(p->pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(v) && v == expect;
}

static unsigned test_slow_us;
void kolo__mesh_test_slow_handshakes(unsigned ms) { test_slow_us = ms * 1000u; }

static int finish_transport(build *b, hs *h, bool shm_ok, bool cma_ok)
{
    kolo__conn *c = h->conn;
    if (!shm_ok) {
        if (c->tp == &kolo__shm_transport) c->tp->close(c);
        c->priv = NULL;
        int st = kolo__tcp_attach(c, same_kernel(&b->peers[c->peer], &b->peers[b->wi->rank]));
        if (st != KOLO_OK) return st;
    } else {
        int st = set_nonblock(c->fd);
        if (st != 0) return kolo__err_sys(errno, "configuring the socket to rank %d", c->peer);
        if (cma_ok && b->want_cma) kolo__shm_enable_cma(c, b->peers[c->peer].pid, b->cma_threshold, b->want_cma);
    }
    char how[64] = "";
    if (c->tp == &kolo__shm_transport)
        snprintf(how, sizeof(how), "%s", cma_ok && b->want_cma == 1 ? " (single-copy CMA for large messages)"
                                         : cma_ok && b->want_cma    ? " (ring copies or CMA, whichever times faster)"
                                                                    : " (ring copies)");
    else if (KOLO_LOG_INFO >= kolo__log_level)
        snprintf(how, sizeof(how), " (congestion control %s)", kolo__tcp_congestion(c));
    KOLO_INFO("channel %d: rank %d <-> rank %d on %s via %s%s", h->channel, b->wi->rank, c->peer,
              kolo__peer_name(c->mesh, c->peer), c->tp->name, how);
    h->state = HS_DONE;
    if (test_slow_us) usleep(test_slow_us);
    b->progress = kolo__now_ns();
    (void)epoll_ctl(b->epfd, EPOLL_CTL_DEL, h->fd, NULL); /* its events are the transport's now */
    h->fd = -1; /* owned by the conn now */
    b->ready[h->channel * b->wi->size + c->peer] = 1;
    return KOLO_OK;
}

static int on_result(build *b, hs *h)
{
    bool shm_ok = get32(h->in) != 0, cma_c = get32(h->in + 4) != 0;
    uint64_t addr = get64(h->in + 8), val = get64(h->in + 16);
    /* Taken where none was offered (another host, KOLO_TRANSPORT=tcp), only a garbled result
     * says: believed, it left the pair with no transport, and a CMA verdict wrote through the
     * segment that was never made (found by tests/fuzz/fuzz_mesh.c). */
    if (shm_ok && h->conn->tp != &kolo__shm_transport)
        return kolo__err(KOLO_ERR_PROTOCOL, "rank %d at %s:%d says it took shared memory, which this rank did not "
                         "offer it (a garbled handshake)", h->peer, b->peers[h->peer].addr, b->peers[h->peer].port);
    /* KOLO_SHM_CMA=0 here answers as a failed probe: a pair reads single-copy only where both
     * ranks allow it, or one would send descriptors the other refuses */
    bool cma_a = shm_ok && cma_probe_peer(b, h, addr, val);
    unsigned char fin[FINAL_LEN];
    put32(fin, cma_a);
    if (send_all(h, fin, sizeof(fin)) != 0)
        return kolo__err(KOLO_ERR_STARTUP, "rank %d hung up during the handshake", h->peer);
    if (h->shm_name[0]) kolo__shm_unlink(h->shm_name);
    h->shm_name[0] = '\0';
    b->pending_in--;
    return finish_transport(b, h, shm_ok, cma_a && cma_c);
}

/* ---- connector side ---- */

static int test_fail_shm_from = -1;
void kolo__mesh_test_fail_shm_from(int peer) { test_fail_shm_from = peer; }

/* Whether the shared memory segment `name` (seen in this rank's /dev/shm) belongs to another
 * user: it is made mode 0600, so ranks of one host run as different users (containers with the
 * host's IPC and users of their own, a pod's runAsUser) cannot open each other's. */
static bool other_users_segment(const char *name, uid_t *owner)
{
    char path[SHM_NAME_LEN + 16];
    struct stat st;
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    if (stat(path, &st) != 0 || st.st_uid == geteuid()) return false;
    *owner = st.st_uid;
    return true;
}

static int on_hello_a(build *b, hs *h)
{
    const kolo__world_info *wi = b->wi;
    char version[16];
    if (other_version(h->in, version))
        return kolo__err(KOLO_ERR_PROTOCOL,
                         "rank %d at %s:%d runs a kolo of another wire version (%s; this one speaks %s): every "
                         "rank of a job must run the same kolo",
                         h->peer, b->peers[h->peer].addr, b->peers[h->peer].port, version, HS_MAGIC);
    if (memcmp(h->in, HS_MAGIC, 8) != 0 || (int)get32(h->in + 8) != h->peer)
        return kolo__err(KOLO_ERR_PROTOCOL, "the process at %s:%d is not rank %d of this job (bad greeting)",
                         b->peers[h->peer].addr, b->peers[h->peer].port, h->peer);
    unsigned char msg[HELLO_C_LEN];
    memcpy(msg, HS_MAGIC, 8);
    put32(msg + 8, (uint32_t)wi->rank);
    put32(msg + 12, (uint32_t)h->channel);
    int st = kolo__random_bytes(h->nonce, KOLO_NONCE_LEN);
    if (st != KOLO_OK) return st;
    memcpy(msg + 16, h->nonce, KOLO_NONCE_LEN);
    if (hs_mac(msg + 16 + KOLO_NONCE_LEN, wi, "kolo-mesh-connect", h->in + 12, (uint32_t)wi->rank,
               (uint32_t)h->channel, (uint32_t)h->peer) != KOLO_OK)
        return KOLO_ERR_INTERNAL;
    if (send_all(h, msg, sizeof(msg)) != 0)
        return kolo__err(KOLO_ERR_STARTUP, "rank %d hung up during the handshake", h->peer);
    h->state = HS_WAIT_ACK;
    h->need = ACK_LEN;
    h->have = 0;
    return KOLO_OK;
}

static int on_ack(build *b, hs *h)
{
    const kolo__world_info *wi = b->wi;
    uint8_t want[KOLO_MAC_LEN];
    if (hs_mac(want, wi, "kolo-mesh-accept", h->nonce, (uint32_t)h->peer, (uint32_t)h->channel,
               (uint32_t)wi->rank) != KOLO_OK)
        return KOLO_ERR_INTERNAL;
    if (!kolo__mac_equal(want, h->in))
        return kolo__err(KOLO_ERR_AUTH,
                         "the process at %s:%d (published as rank %d) could not prove it holds the job secret",
                         b->peers[h->peer].addr, b->peers[h->peer].port, h->peer);
    b->progress = kolo__now_ns(); /* the peer proved itself */
    kolo__conn *c = conn_new(b, h->channel, h->peer, h->fd);
    if (!c) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for a connection");
    h->conn = c;
    b->meshes[h->channel]->conns[h->peer] = c;
    uint32_t offer = get32(h->in + KOLO_MAC_LEN);
    char name[SHM_NAME_LEN + 1];
    memcpy(name, h->in + KOLO_MAC_LEN + 4, SHM_NAME_LEN);
    name[SHM_NAME_LEN] = '\0';
    uint64_t addr = get64(h->in + KOLO_MAC_LEN + 8 + SHM_NAME_LEN);
    uint64_t val = get64(h->in + KOLO_MAC_LEN + 16 + SHM_NAME_LEN);
    bool shm_ok = false, cma_c = false;
    if (offer == 1 && h->peer == test_fail_shm_from) {
        KOLO_INFO("rank %d offered shared memory but it is not reachable here (test hook); using TCP", h->peer);
    } else if (offer == 1 && b->tcp_only) {
        /* this rank asked for TCP (its own KOLO_TRANSPORT); the lower rank, which offers, may not
         * have: a pair shares memory only when both sides allow it */
        KOLO_DEBUG("rank %d offered shared memory; declined, KOLO_TRANSPORT=tcp here", h->peer);
    } else if (offer == 1) {
        shm_ok = kolo__shm_open(c, name, b->populate) == KOLO_OK;
        /* the same boot and network, another /dev/shm: containers on one host with the host's
         * network and IPC of their own (Docker's --network=host, a pod's hostNetwork), or one
         * /dev/shm and two users; such pairs run at TCP's speed (half the shared rings' bus
         * bandwidth here), so the first says what would share memory */
        uid_t owner;
        if (!shm_ok && h->channel == 0 && b->shm_failed++ == 0) {
            if (other_users_segment(name, &owner))
                KOLO_WARN("rank %d offered shared memory but it is not reachable here (%s); using TCP. Its segment "
                          "belongs to uid %u and this rank runs as uid %u: ranks on one host share memory only "
                          "where they run as one user", h->peer, kolo__errmsg(), (unsigned)owner, (unsigned)geteuid());
            else
                KOLO_WARN("rank %d offered shared memory but it is not reachable here (%s); using TCP. Ranks on one "
                          "host share memory only where they see the same /dev/shm: containers need the host's IPC "
                          "(docker run --ipc=host, a Kubernetes pod's hostIPC)", h->peer, kolo__errmsg());
        }
        else if (!shm_ok)
            KOLO_INFO("rank %d offered shared memory but it is not reachable here (%s); using TCP", h->peer, kolo__errmsg());
        cma_c = shm_ok && cma_probe_peer(b, h, addr, val); /* as cma_a */
    }
    unsigned char res[RESULT_LEN];
    put32(res, shm_ok);
    put32(res + 4, cma_c);
    put64(res + 8, (uint64_t)(uintptr_t)&cma_probe);
    put64(res + 16, cma_probe);
    if (send_all(h, res, sizeof(res)) != 0)
        return kolo__err(KOLO_ERR_STARTUP, "rank %d hung up during the handshake", h->peer);
    h->shm_name[0] = shm_ok ? 1 : 0; /* remember the outcome until FINAL */
    h->state = HS_WAIT_FINAL;
    h->need = FINAL_LEN;
    h->have = 0;
    return KOLO_OK;
}

/* Whether a peer runs on this machine: the same boot id, the same address, or a loopback one
 * (what kolo__tcp_attach will find, known here before the connection is made). */
static bool on_this_machine(const build *b, int peer)
{
    const kolo__peer_info *p = &b->peers[peer], *me = &b->peers[b->wi->rank];
    return same_kernel(p, me) || strcmp(p->addr, me->addr) == 0 || strncmp(p->addr, "127.", 4) == 0 ||
           strcmp(p->addr, "::1") == 0;
}

static int start_connect(build *b, hs *h)
{
    const kolo__peer_info *p = &b->peers[h->peer];
    struct sockaddr_storage sa;
    socklen_t sl = sockaddr_of(p->addr, p->port, &sa);
    if (!sl) return kolo__err(KOLO_ERR_PROTOCOL, "rank %d published a bad address '%s'", h->peer, p->addr);
    h->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (h->fd < 0 && (errno == EMFILE || errno == ENFILE) && /* strangers took them (make_room) */
        make_room(b, errno == EMFILE ? "closed for room: this process is out of file descriptors to connect"
                                     : "closed for room: the system is out of file descriptors to connect"))
        h->fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (h->fd < 0) return kolo__err_sys(errno, "socket()");
    kolo__tcp_congestion_early(h->fd, on_this_machine(b, h->peer));
    kolo__fmt_hostport(h->from, sizeof(h->from), p->addr, p->port);
    if (connect(h->fd, (struct sockaddr *)&sa, sl) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(h->fd);
        h->fd = -1;
        if (e == ECONNREFUSED) { /* retry shortly */
            h->retry_at = kolo__now_ns() + 20000000;
            return KOLO_OK;
        }
        return kolo__err_sys(e, "connecting to rank %d at %s", h->peer, h->from);
    }
    h->state = HS_CONNECTING;
    return KOLO_OK;
}

static int on_readable(build *b, hs *h)
{
    ssize_t k = recv(h->fd, h->in + h->have, h->need - h->have, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return KOLO_OK;
    if (k <= 0) {
        if (h->role == 'A' && (h->state == HS_WAIT_HELLO_C)) {
            refuse(b, h, "it hung up before identifying itself");
            return KOLO_OK;
        }
        /* An acceptor that closes before it has accepted us may have closed for room (make_room:
         * strangers had taken its descriptors, and ours waited longest): connect again. One that
         * refuses us (another job's secret) does so every time: then say so. */
        if (h->role == 'C' && (h->state == HS_WAIT_HELLO_A || h->state == HS_WAIT_ACK) &&
            ++h->hangups < CONNECT_HANGUPS_MAX) {
            KOLO_DEBUG("rank %d (%s) closed channel %d's handshake before accepting it: connecting again", h->peer,
                       h->from, h->channel);
            close(h->fd); /* leaves the epoll set with it */
            h->fd = -1;
            h->have = 0;
            h->retry_at = kolo__now_ns() + 20000000;
            due_at(b, h->retry_at);
            return KOLO_OK;
        }
        if (h->hangups >= CONNECT_HANGUPS_MAX)
            return kolo__err(KOLO_ERR_STARTUP, "rank %d (%s) closed this rank's connection %d times before accepting "
                             "it (another job's secret? its log says why it refused)", h->peer, h->from, h->hangups);
        return kolo__err(KOLO_ERR_STARTUP, "rank %d (%s) hung up during the connection handshake", h->peer, h->from);
    }
    h->have += (size_t)k;
    if (h->have < h->need) return KOLO_OK;
    switch (h->state) {
    case HS_WAIT_HELLO_C: return on_hello_c(b, h);
    case HS_WAIT_HELLO_A: return on_hello_a(b, h);
    case HS_WAIT_ACK: return on_ack(b, h);
    case HS_WAIT_RESULT: return on_result(b, h);
    case HS_WAIT_FINAL: {
        bool cma_a = get32(h->in) != 0;
        bool shm_ok = h->shm_name[0] == 1;
        b->pending_out--;
        return finish_transport(b, h, shm_ok, cma_a && shm_ok && h->conn->priv);
    }
    default: return kolo__err(KOLO_ERR_INTERNAL, "handshake in state %d", h->state);
    }
}

/* ---- the loop ---- */

static int on_connected(build *b, hs *h)
{
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err) { /* refused or reset: the peer may not listen yet, or its backlog was full */
        close(h->fd);
        h->fd = -1;
        h->retry_at = kolo__now_ns() + 20000000;
        due_at(b, h->retry_at);
        return KOLO_OK;
    }
    h->state = HS_WAIT_HELLO_A;
    h->need = HELLO_A_LEN;
    h->have = 0;
    return hs_watch(b, h, EPOLL_CTL_MOD);
}

static int on_accept(build *b, int fd, const struct sockaddr_storage *sa, socklen_t sl)
{
    hs *h = hs_new(b);
    if (!h) {
        close(fd);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the handshake table");
    }
    h->role = 'A';
    h->fd = fd;
    h->peer = -1;
    h->state = HS_WAIT_HELLO_C;
    h->need = HELLO_C_LEN;
    h->deadline = kolo__now_ns() + b->greet_ns;
    due_at(b, h->deadline + 1);
    kolo__fmt_sockaddr(h->from, sizeof(h->from), (const struct sockaddr *)sa, sl);
    int st = hs_watch(b, h, EPOLL_CTL_ADD);
    if (st != KOLO_OK) {
        close(fd);
        h->fd = -1;
        h->state = HS_FREE;
        b->nfree++;
        return st;
    }
    unsigned char hello[HELLO_A_LEN];
    memcpy(hello, HS_MAGIC, 8);
    put32(hello + 8, (uint32_t)b->wi->rank);
    if ((st = kolo__random_bytes(h->nonce, KOLO_NONCE_LEN)) != KOLO_OK) return st;
    memcpy(hello + 12, h->nonce, KOLO_NONCE_LEN);
    if (send_all(h, hello, sizeof(hello)) != 0) refuse(b, h, "it hung up at once");
    return KOLO_OK;
}

/* The timers: connections to retry, greetings overdue. A walk of the whole table, so only when
 * one is due (b->next_due, at most every TICK_NS), not at every event: with hundreds of ranks
 * each rank has twice as many handshakes, and a walk (and a poll() of every socket, until
 * 2026-12-02) per event made the start-up quadratic in the ranks. */
#define TICK_NS 10000000ull

/* the last build's table walks and socket events (kolo__mesh_test_counts) */
static uint64_t test_walks, test_events;

void kolo__mesh_test_counts(uint64_t out[2])
{
    out[0] = test_walks;
    out[1] = test_events;
}

static int on_tick(build *b, uint64_t now)
{
    test_walks++;
    b->next_due = 0;
    for (size_t i = 0; i < b->nhs; i++) {
        hs *h = &b->hss[i];
        if (h->state == HS_DONE || h->state == HS_FREE) continue;
        if (h->role == 'C' && h->fd < 0 && h->retry_at) {
            if (now < h->retry_at) {
                due_at(b, h->retry_at);
                continue;
            }
            int st = start_connect(b, h);
            if (st != KOLO_OK) return st;
            if (h->fd < 0) due_at(b, h->retry_at); /* refused at once: again shortly */
            else if ((st = hs_watch(b, h, EPOLL_CTL_ADD)) != KOLO_OK) return st;
        }
        if (h->role == 'A' && h->state == HS_WAIT_HELLO_C) {
            if (now <= h->deadline) {
                due_at(b, h->deadline + 1);
                continue;
            }
            char why[64];
            snprintf(why, sizeof(why), "it sent no valid greeting within %g s", (double)b->greet_ns / 1e9);
            refuse(b, h, why);
        }
    }
    return KOLO_OK;
}

/* The handshakes' deadline is KOLO_START_TIMEOUT after the last progress (a peer proving itself,
 * a handshake finishing; at first the rendezvous), not after kolo_init began: a large job on a
 * crowded host, or one whose ranks arrived one by one over a long time, goes on as long as it
 * moves, while a rank that does not answer is named that long after the others are done. A
 * stranger's connection is no progress. (512 ranks on 2 cores: rank 0, which every other rank
 * connects to, finished none of its handshakes in the first 30 s, but heard proofs.) */
static int run_handshakes(build *b, int lfd)
{
    const kolo__world_info *wi = b->wi;
    /* the engine's connections first: in a short /dev/shm the segments go to the pairs' first
     * connections, and the engine's carry every call of the Python bindings (4 ranks in 1 MiB:
     * 1-2 of the 5 pairs' connections left without rings were the engine's, 2-4 with the direct
     * ones made first; 2 ranks with room for one segment: the engine's, 20 of 20) */
    for (int ch = KOLO_NCHANNELS - 1; ch >= 0; ch--) {
        for (int p = 0; p < wi->rank; p++) {
            hs *h = hs_new(b);
            if (!h) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the handshake table");
            h->role = 'C';
            h->peer = p;
            h->channel = ch;
            h->fd = -1;
            h->state = HS_CONNECTING;
            h->retry_at = 1; /* connect at once */
        }
    }
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (b->epfd < 0) return kolo__err_sys(errno, "epoll_create1()");
    struct epoll_event evs[64];
    struct epoll_event lev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    int st = KOLO_OK;
    if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, lfd, &lev) != 0) {
        st = kolo__err_sys(errno, "epoll_ctl() on the listening socket");
        goto out;
    }
    uint64_t next_tick = 0;
    b->next_due = 1; /* the first connections, at once */
    b->progress = kolo__now_ns();
    test_walks = test_events = 0;
    while (b->pending_in > 0 || b->pending_out > 0) {
        if ((st = check_superseded(b)) != KOLO_OK) goto out;
        uint64_t now = kolo__now_ns();
        if (now - b->progress > b->quiet_ns) {
            char missing[512];
            kolo__ranks_text t;
            kolo__ranks_begin(&t, missing, sizeof(missing));
            for (int p = 0; p < wi->size; p++) {
                if (p == wi->rank) continue;
                for (int ch = 0; ch < KOLO_NCHANNELS; ch++)
                    if (!b->ready[ch * wi->size + p]) {
                        kolo__ranks_add(&t, p);
                        break;
                    }
            }
            kolo__ranks_end(&t);
            last_end = KOLO__MESH_DEADLINE;
            st = kolo__err(KOLO_ERR_STARTUP,
                           "rank %d could not connect to rank(s) %s: no connection was made for KOLO_START_TIMEOUT "
                           "(%g s): a firewall, a wrong KOLO_IFACE, or those ranks died during start-up",
                           wi->rank, missing, wi->start_timeout);
            goto out;
        }
        if (now >= next_tick && b->next_due && now >= b->next_due) {
            if ((st = on_tick(b, now)) != KOLO_OK) goto out;
            next_tick = now + TICK_NS;
        }
        if (b->accept_resume && now >= b->accept_resume) {
            if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, lfd, &lev) != 0) {
                st = kolo__err_sys(errno, "epoll_ctl() on the listening socket");
                goto out;
            }
            b->accept_resume = 0;
        }
        /* a wake-up at least every TICK_NS, for the deadline and a superseded round */
        uint64_t wake = KOLO_MAX(next_tick, b->next_due ? b->next_due : now + TICK_NS);
        wake = KOLO_MIN(wake, now + TICK_NS);
        int wait_ms = (int)((wake - KOLO_MIN(wake, now)) / 1000000) + 1;
        int r = epoll_wait(b->epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), wait_ms);
        if (r < 0 && errno != EINTR) {
            st = kolo__err_sys(errno, "epoll_wait()");
            goto out;
        }
        for (int e = 0; e < r; e++) {
            uint64_t d = evs[e].data.u64;
            test_events++;
            if (d == UINT64_MAX) {
                /* every connection waiting, not one an event: with hundreds of ranks connecting
                 * at once the backlog overflowed (a dropped SYN is retried after 1 s, then 3); up to
                 * ACCEPTS_PER_EVENT, as a flood closed for room would otherwise keep the loop here,
                 * away from the handshakes waiting (the listener stays ready: the next event takes
                 * the rest) */
                for (int taken = 0; taken < ACCEPTS_PER_EVENT; taken++) {
                    struct sockaddr_storage sa;
                    socklen_t sl = sizeof(sa);
                    int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
                    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                        if (make_room(b, errno == EMFILE ? "closed for room: this process is out of file descriptors"
                                                         : "closed for room: the system is out of file descriptors"))
                            continue;
                        /* nothing to close: rest the listener a tick rather than spin on it */
                        (void)epoll_ctl(b->epfd, EPOLL_CTL_DEL, lfd, NULL);
                        b->accept_resume = kolo__now_ns() + TICK_NS;
                    }
                    if (fd < 0) break;
                    if ((st = on_accept(b, fd, &sa, sl)) != KOLO_OK) goto out;
                }
                continue;
            }
            size_t i = (size_t)(d & 0xffffffffu);
            hs *h = i < b->nhs ? &b->hss[i] : NULL;
            /* an event of an earlier handshake in this slot (refused in this batch) is stale */
            if (!h || h->gen != (uint32_t)(d >> 32) || h->fd < 0 || h->state == HS_DONE || h->state == HS_FREE)
                continue;
            if (h->state == HS_CONNECTING) st = on_connected(b, h);
            else st = on_readable(b, h);
            if (st != KOLO_OK) goto out;
        }
    }
out:
    report_refusals(b);
    close(b->epfd);
    b->epfd = -1;
    return st;
}

/* The last rank to arrive at the rendezvous: every rank's address record, one per line in rank
 * order, under all_key. Each rank published its record before counting itself in. */
static int join_records(kolo__store *store, const kolo__world_info *wi, int epoch, const char *all_key)
{
    size_t cap = (size_t)wi->size * 512, len = 0;
    char *all = kolo__malloc(cap), key[160];
    if (!all) return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %d address records", wi->size);
    int st = KOLO_OK;
    for (int r = 0; r < wi->size && st == KOLO_OK; r++) {
        snprintf(key, sizeof(key), "%s/%d/peer/%d", wi->job_id, epoch, r);
        void *v = NULL;
        size_t vl = 0;
        if ((st = kolo__store_get(store, key, &v, &vl, 0)) != KOLO_OK) {
            if (st == KOLO_ERR_TIMEOUT)
                st = kolo__err(KOLO_ERR_STARTUP, "rank %d counted itself in at the rendezvous but its address record "
                               "is not there (two ranks of one number?)", r);
            break;
        }
        if (vl >= 512 || memchr(v, '\n', vl))
            st = kolo__err(KOLO_ERR_PROTOCOL, "rank %d published a malformed address record", r);
        else {
            memcpy(all + len, v, vl);
            len += vl;
            all[len++] = '\n';
        }
        kolo__free(v);
    }
    if (st == KOLO_OK) st = kolo__store_set(store, all_key, all, len);
    kolo__free(all);
    return st;
}

/* Whether the job's record of this rank (`rec`, from the joined records) is this process's own
 * (`me`): another process with the same rank variables published it first. A process the rank
 * starts inherits them: Python's multiprocessing with the spawn start method re-runs the main
 * module, whose kolo.init() (outside `if __name__ == "__main__":`) joined the job as a second
 * rank 0, failed to reach the peers' listeners (closed after start-up) and said, after
 * KOLO_START_TIMEOUT, "could not connect to rank(s) 1: ... a firewall, a wrong KOLO_IFACE, or
 * those ranks died". Pid and host key, not the address: the same process publishing again (a
 * retried start-up) stays itself. */
static int not_taken(const kolo__peer_info *me, const kolo__peer_info *rec, int rank)
{
    if (rec->pid == me->pid && strcmp(rec->hostkey, me->hostkey) == 0) return KOLO_OK;
    return kolo__err(KOLO_ERR_STARTUP,
                     "rank %d of this job is already process %d on %s, and this process (pid %d) has the same rank "
                     "variables: a process that a rank starts inherits them (Python's multiprocessing with the spawn "
                     "start method runs the main module again: call init() under `if __name__ == \"__main__\":`); "
                     "only the rank itself may call kolo_init",
                     rank, rec->pid, rec->hostname, me->pid);
}

/* Waits for every rank's record until KOLO_START_TIMEOUT after the last rank arrived (the count
 * in the store is read while it waits, at most every second): ranks that start one by one, over ssh to
 * many hosts or as a cluster manager grants them, may take longer than that in all. */
static int publish_and_learn(build *b, kolo__store *store, const char *addr, int port)
{
    const kolo__world_info *wi = b->wi;
    kolo__peer_info *me = &b->peers[wi->rank];
    snprintf(me->addr, sizeof(me->addr), "%s", addr);
    me->port = port;
    me->pid = (int)getpid();
    kolo__host_key(me->hostkey, sizeof(me->hostkey));
    me->cores = cores_key();
    me->pidns = pid_ns();
    const char *hn = kolo__setting_str(KOLO_SET_HOSTNAME);
    if (*hn) snprintf(me->hostname, sizeof(me->hostname), "%s", hn);
    else if (gethostname(me->hostname, sizeof(me->hostname)) != 0) snprintf(me->hostname, sizeof(me->hostname), "?");
    me->hostname[sizeof(me->hostname) - 1] = '\0';

    /* keys carry the init epoch: a job whose ranks shut down and init again (in lockstep)
     * must not read the addresses of their previous incarnation */
    static int inits;
    inits++;
    int epoch = wi->epoch ? wi->epoch : inits;
    char key[160], val[512];
    snprintf(key, sizeof(key), "%s/%d/peer/%d", wi->job_id, epoch, wi->rank);
    int n = snprintf(val, sizeof(val), "%s %d %d %s %" PRIx64 " %" PRIx64 " %s", me->addr, me->port, me->pid,
                     me->hostkey, me->cores, me->pidns, me->hostname);
    int st = kolo__store_set(store, key, val, (size_t)n);
    if (st != KOLO_OK) return st;
    /* Each rank counts itself in after publishing; the last to arrive joins every record into one
     * value, which each rank fetches in one request: 4n requests to the store in all, where a get
     * per record and rank made n^2 (128 ranks: 16,000, 1.2 s of rank 0's start-up on 2 cores;
     * 4,096 ranks would make 16.8 million). */
    char all_key[160];
    snprintf(key, sizeof(key), "%s/%d/arrived", wi->job_id, epoch);
    snprintf(all_key, sizeof(all_key), "%s/%d/peers", wi->job_id, epoch);
    int64_t arrived = 0;
    if ((st = kolo__store_add(store, key, 1, &arrived)) != KOLO_OK) return st;
    if (arrived == wi->size && (st = join_records(store, wi, epoch, all_key)) != KOLO_OK) return st;
    void *v = NULL;
    size_t len = 0;
    uint64_t deadline = kolo__now_ns() + b->quiet_ns;
    for (;;) {
        double left = (double)(deadline > kolo__now_ns() ? deadline - kolo__now_ns() : 0) * 1e-9;
        /* a count read each slice: a quarter of the timeout, 50 ms to 1 s (0.25 s in elastic rounds) */
        double slice = KOLO_MAX(0.05, KOLO_MIN((double)b->quiet_ns * 0.25e-9, wi->abort_key[0] ? 0.25 : 1.0));
        st = kolo__store_get(store, all_key, &v, &len, KOLO_MIN(left, slice));
        if (st != KOLO_ERR_TIMEOUT) break;
        if ((st = check_superseded(b)) != KOLO_OK) return st;
        int64_t count = 0;
        if ((st = kolo__store_add(store, key, 0, &count)) != KOLO_OK) return st;
        if (count > arrived) { /* more ranks came: the wait starts again */
            arrived = count;
            deadline = kolo__now_ns() + b->quiet_ns;
        }
        if (kolo__now_ns() >= deadline) {
            st = KOLO_ERR_TIMEOUT;
            break;
        }
    }
    if (st == KOLO_ERR_TIMEOUT) {
        /* name every rank that is still missing */
        char missing[512];
        kolo__ranks_text t;
        kolo__ranks_begin(&t, missing, sizeof(missing));
        int count = 0;
        for (int q = 0; q < wi->size; q++) {
            if (q == wi->rank) continue;
            snprintf(key, sizeof(key), "%s/%d/peer/%d", wi->job_id, epoch, q);
            void *v2 = NULL;
            size_t l2;
            if (kolo__store_get(store, key, &v2, &l2, 0) == KOLO_OK) {
                kolo__free(v2);
                continue;
            }
            count++;
            kolo__ranks_add(&t, q);
        }
        last_end = KOLO__MESH_DEADLINE;
        if (count == 0) /* all published: the last to arrive died before joining the records */
            return kolo__err(KOLO_ERR_STARTUP,
                             "rank %d waited %g s (KOLO_START_TIMEOUT): every rank published its address at the "
                             "rendezvous %s:%d, but the records were never joined (the last rank to arrive died "
                             "during start-up?)",
                             wi->rank, wi->start_timeout, wi->rdv_host, wi->rdv_port);
        return kolo__err(KOLO_ERR_STARTUP,
                         "rank %d waited %g s (KOLO_START_TIMEOUT) after the last rank arrived, but %d rank(s) "
                         "never arrived at the rendezvous %s:%d: missing rank(s) %s",
                         wi->rank, wi->start_timeout, count, wi->rdv_host, wi->rdv_port,
                         kolo__ranks_end(&t));
    }
    if (st != KOLO_OK) return st;
    /* one record per line, in rank order */
    const char *at = v, *stop = at + len;
    for (int r = 0; r < wi->size && st == KOLO_OK; r++) {
        const char *nl = memchr(at, '\n', (size_t)(stop - at));
        size_t tl = (size_t)((nl ? nl : stop) - at);
        if (tl >= 512 || (!nl && r < wi->size - 1)) {
            st = kolo__err(KOLO_ERR_PROTOCOL, "the rendezvous's address records end at rank %d of %d", r, wi->size);
            break;
        }
        char text[512];
        memcpy(text, at, tl);
        text[tl] = '\0';
        at += tl + 1;
        kolo__peer_info other, *p = r == wi->rank ? &other : &b->peers[r];
        if (sscanf(text, "%63s %d %d %95s %" SCNx64 " %" SCNx64 " %127s", p->addr, &p->port, &p->pid, p->hostkey,
                   &p->cores, &p->pidns, p->hostname) != 7)
            st = kolo__err(KOLO_ERR_PROTOCOL, "rank %d published a malformed address record '%s'", r, text);
        else if (p == &other)
            st = not_taken(b->peers + r, &other, r);
    }
    kolo__free(v);
    return st;
}

long kolo__host_cpus(void)
{
    cpu_set_t set;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 1) cpus = CPU_COUNT(&set);
    return cpus;
}

static int topology_id(int cpu, const char *what)
{
    char path[96];
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, what);
    FILE *f = fopen(path, "re");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

void kolo__cpu_place(int cpu, int *package, int *core)
{
    int pkg = topology_id(cpu, "physical_package_id"), id = topology_id(cpu, "core_id");
    *package = pkg < 0 ? 0 : pkg; /* without topology files: package 0, a core of its own */
    *core = id < 0 ? cpu : id;
}

typedef struct cpu_place {
    int package, core, cpu;
} cpu_place;

static int cmp_place(const void *a, const void *b)
{
    const cpu_place *x = a, *y = b;
    if (x->package != y->package) return x->package < y->package ? -1 : 1;
    if (x->core != y->core) return x->core < y->core ? -1 : 1;
    return (x->cpu > y->cpu) - (x->cpu < y->cpu);
}

int kolo__cpus_in_core_order(const cpu_set_t *set, int *order)
{
    cpu_place *p = kolo__calloc(CPU_SETSIZE, sizeof(cpu_place));
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set)) continue;
        if (p) {
            p[n].cpu = c;
            kolo__cpu_place(c, &p[n].package, &p[n].core);
        }
        order[n++] = c;
    }
    if (p) {
        qsort(p, (size_t)n, sizeof(cpu_place), cmp_place);
        for (int i = 0; i < n; i++) order[i] = p[i].cpu;
    }
    kolo__free(p);
    return n;
}

bool kolo__host_oversubscribed(size_t local_ranks)
{
    long cpus = kolo__host_cpus();
    return cpus >= 1 && local_ranks > (size_t)cpus;
}

size_t kolo__core_sharers(const kolo__peer_info *peers, int n, int me)
{
    size_t k = 0;
    for (int r = 0; r < n; r++)
        k += r == me || (peers[r].cores == peers[me].cores && same_kernel(&peers[r], &peers[me]));
    return k;
}

size_t kolo__core_crowd(const kolo__peer_info *peers, int n, int me)
{
    long cpus = kolo__host_cpus();
    size_t sharers = peers ? kolo__core_sharers(peers, n, me) : 1;
    return cpus >= 1 && sharers > (size_t)cpus ? (sharers + (size_t)cpus - 1) / (size_t)cpus : 1;
}

/* Each shared-memory ring's size (KOLO_SHM_RING_SIZE unset) on a host with more ranks than cores. */
#define OVERSUBSCRIBED_RING ((size_t)1 << 20)
/* What one rank's rings may take in all (KOLO_SHM_RING_SIZE unset), and the least they shrink to. */
#define RING_BUDGET ((size_t)128 << 20)
#define RING_MIN ((size_t)64 << 10)

/* Shrinks b->ring to /dev/shm; true where the rings still may not fit there (they must be reserved).
 * /dev/shm may be small: 64 MiB in a Docker container or a Kubernetes pod unless made larger,
 * where 8 ranks' 2 MiB rings (28 pairs, 2 channels, 2 rings each: 224 MiB) did not fit and the
 * ranks died of SIGBUS at their first writes. The rings of this host's pairs shrink (unless
 * KOLO_SHM_RING_SIZE is set) until they take at most half of it, the rest left to the program
 * (PyTorch's DataLoader workers hand batches over through it); 8 ranks in 64 MiB get 256 KiB rings.
 * What that costs, 8 ranks on this project's Intel VM (2 vCPUs, so 1 MiB rings by default), allreduce
 * 64 KiB-16 MiB, 3 rounds alternating, us: 256 KiB rings 146-161 / 315-347 / 1109-1147 / 5911-6157 /
 * 31585-32395 against 1 MiB's 202-223 / 322-334 / 1106-1328 / 5366-5909 / 29777-31690: a few per cent
 * from 4 MiB, none below (faster at 64 KiB).
 * Every rank of the host computes the same size from the same figures; a pair's opener takes its
 * creator's size anyway (shm.c). Segments are reserved at creation where their pages are faulted
 * in at start-up anyway (populate), and wherever the rings would not fit even at their least or
 * in what is free at the moment: a full /dev/shm then fails a pair's creation, and that pair goes
 * by TCP, saying why (on_hello_c).
 * Rings mapped in at their first use and known to fit stay unreserved: 64 ranks on one host hold
 * 4 GiB of rings, most of them for pairs that never talk. */
static bool fit_dev_shm(build *b, size_t local)
{
    struct statvfs sv;
    if (b->tcp_only || local == 0 || statvfs("/dev/shm", &sv) != 0 || sv.f_blocks == 0) return false;
    size_t size = (size_t)sv.f_blocks * sv.f_frsize, room = size / 2, pairs = (local + 1) * local / 2;
    size_t want = b->ring;
    if (!kolo__setting_is_set(KOLO_SET_SHM_RING_SIZE))
        while (b->ring > RING_MIN && pairs * KOLO_NCHANNELS * kolo__shm_segment_bytes(b->ring) > room) b->ring >>= 1;
    size_t need = pairs * KOLO_NCHANNELS * kolo__shm_segment_bytes(b->ring);
    if (b->ring != want) {
        /* said once a host: by its lowest rank */
        bool lowest = true;
        for (int r = 0; r < b->wi->rank; r++)
            if (strcmp(b->peers[r].hostkey, b->peers[b->wi->rank].hostkey) == 0) lowest = false;
        if (lowest)
            KOLO_WARN("/dev/shm holds %zu KiB: shared-memory rings of %zu KiB instead of %zu KiB, %s; a larger "
                      "/dev/shm (docker run --shm-size=1g; in Kubernetes an emptyDir volume of medium Memory at "
                      "/dev/shm) lets them keep their size",
                      size >> 10, b->ring >> 10, want >> 10,
                      need <= room ? "so that this host's ranks take at most half of it"
                                   : "the least, and still more than half of it: pairs whose rings find no room go by "
                                     "TCP");
    }
    /* too big for half of it, or for what is free now (another job's segments, a program's) */
    return need > room || need > (size_t)sv.f_bavail * sv.f_frsize;
}

int kolo__mesh_build(kolo__mesh *meshes[KOLO_NCHANNELS], kolo__peer_info **peers_out,
                     const kolo__world_info *wi, kolo__store *store)
{
    build b;
    memset(&b, 0, sizeof(b));
    set_cma_probe();
    b.epfd = -1;
    last_end = 0;
    b.wi = wi;
    b.meshes = meshes;
    b.store = store;
    const char *tp = kolo__setting_str(KOLO_SET_TRANSPORT);
    if (strcmp(tp, "tcp") == 0) b.tcp_only = 1;
    else if (strcmp(tp, "auto") != 0 && strcmp(tp, "shm") != 0 && *tp)
        return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_TRANSPORT='%s' is not one of auto, tcp", tp);
    if (kolo__setting_auto01(KOLO_SET_SHM_CMA, &b.want_cma) != KOLO_OK) return KOLO_ERR_INVALID_ARG; /* 2: auto */
    /* 2 MiB rings by default (4 MiB until 2026-11-29). 2 ranks on the Zen 4 VM, launches shaped
     * like the harness's sweep (20-50 calls per size), alternated with 4 MiB rings for 20-25
     * rounds, us per call with 4 MiB over 2 MiB, median of the paired launches: 1-16 MiB allgather
     * 1.05-1.22, alltoall 1.05-1.16 (4 MiB 1.16), reducescatter 1.05-1.33, allreduce 1.03-1.14
     * but 8 MiB 0.88-0.93 (1.07 in launches of 100 calls), broadcast 0.96-1.13; 128-512 KiB
     * 1.00-1.09; 64 MiB 0.95-1.08; 2-32 KiB 1.05-1.66 (broadcast and allreduce 8 KiB 1.66 and
     * 1.53); the engine's ResNet-50 step 20.9 ms against 21.3. Fewer ring lines to go through
     * cold in a short launch, less cache taken by the rings; which of the two, not measured. 1
     * MiB rings lost allreduce 64 MiB (0.83) and 128 KiB (0.85) and broadcast 2-4 MiB (0.90). */
    b.ring = kolo__setting_bytes(KOLO_SET_SHM_RING_SIZE);
    /* single-copy candidates: from 128 KiB when pinned on; from 32 KiB when picked from timings
     * (and the sends a collective marks `single`, either way: shm.c, SINGLE_MIN).
     * 32 KiB messages (allgather and alltoall of 64 KiB, 2 ranks): with the vCPUs on two CCDs
     * 1.9-2.0x by single-copy (medians of 12 and 4 launches); on one CCD 1.03-1.04x, where the
     * timings keep the ring (36 and 46 launches). From 16 KiB, those messages gained 1.4-2.0x on
     * two CCDs (one launch each) but lost 10-20 % on one (5 launches): timing costs 3 clock
     * reads a message, and probes send some by the slower way. */
    b.cma_threshold = b.want_cma == 2 ? 32 * 1024 : 128 * 1024;
    if (kolo__setting_bytes(KOLO_SET_RING_CHUNK) < b.cma_threshold) /* let tests push chunks through CMA */
        b.cma_threshold = kolo__setting_bytes(KOLO_SET_RING_CHUNK);
    b.quiet_ns = (uint64_t)(wi->start_timeout * 1e9);

    for (int ch = 0; ch < KOLO_NCHANNELS; ch++) meshes[ch] = NULL;
    b.peers = kolo__calloc((size_t)wi->size, sizeof(kolo__peer_info));
    b.ready = kolo__calloc((size_t)wi->size * KOLO_NCHANNELS, 1);
    if (!b.peers || !b.ready) {
        kolo__free(b.peers);
        kolo__free(b.ready);
        return kolo__err(KOLO_ERR_NO_MEMORY, "no memory for %d peers", wi->size);
    }
    int st = KOLO_OK;
    /* a wait without progress this long warns (xfer.c); 0, negative or not finite: never */
    double stall_s = kolo__setting_long(KOLO_SET_STALL_CHECK_DISABLE) > 0
                         ? 0
                         : kolo__setting_double(KOLO_SET_STALL_CHECK_TIME);
    uint64_t stall_ns = stall_s > 0 && stall_s < 1e9 ? (uint64_t)(stall_s * 1e9) : 0;
    /* a wait without progress this long fails (xfer.c); 0, negative or not finite: never, as a
     * wait of 0 s failed every wait at once, and the others converted without a defined value */
    double op_s = kolo__setting_double(KOLO_SET_OP_TIMEOUT);
    uint64_t op_ns = op_s > 0 && op_s < 1e9 ? (uint64_t)(op_s * 1e9) : UINT64_MAX;
    for (int ch = 0; ch < KOLO_NCHANNELS; ch++) {
        kolo__mesh *m = kolo__calloc(1, sizeof(*m));
        if (m) m->conns = kolo__calloc((size_t)wi->size, sizeof(kolo__conn *));
        if (!m || !m->conns) {
            kolo__free(m);
            st = kolo__err(KOLO_ERR_NO_MEMORY, "no memory for the connection table");
            goto err;
        }
        m->rank = wi->rank;
        m->size = wi->size;
        m->channel = ch;
        m->peers = b.peers;
        m->op_timeout_ns = op_ns;
        m->keepalive_ns = (uint64_t)kolo__keepalive_s() * 1000000000u;
        m->stall_ns = stall_ns;
        m->spin_ns = (uint64_t)kolo__setting_long(KOLO_SET_SPIN_US) * 1000u;
        meshes[ch] = m;
    }
    char addr[64];
    st = pick_address(wi, addr, sizeof(addr));
    if (st != KOLO_OK) goto err;
    struct sockaddr_storage sa;
    socklen_t sl = sockaddr_of(addr, 0, &sa);
    int lfd = sl ? socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0) : -1;
    if (lfd < 0) {
        st = sl ? kolo__err_sys(errno, "socket()") : kolo__err(KOLO_ERR_INTERNAL, "'%s' is not an address", addr);
        goto err;
    }
    /* what this machine's peers' connections should run from their start (tcp.c) */
    kolo__tcp_congestion_early(lfd, true);
    if (bind(lfd, (struct sockaddr *)&sa, sl) != 0 || listen(lfd, SOMAXCONN) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        st = kolo__err_sys(errno, "listening on %s:0", addr);
        close(lfd);
        goto err;
    }
    int lport = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                               : ((struct sockaddr_in *)&sa)->sin_port);
    st = publish_and_learn(&b, store, addr, lport);
    if (st == KOLO_OK) {
        /* Fault the rings in now rather than one page per message during the first passes
         * (two faults per 4 KiB, one on each side, made 4 KiB messages ~10x slower until a ring
         * had wrapped once), unless that would fault in more than 128 MiB for this rank's rings
         * (beyond 17 ranks per host at the default 2 MiB; 128 MiB took ~0.4 s of start-up on 2
         * cores); beyond that each ring is mapped in at its first use (shm.c, first_pass). */
        size_t local = 0;
        for (int r = 0; r < wi->size; r++)
            local += r != wi->rank && strcmp(b.peers[r].hostkey, b.peers[wi->rank].hostkey) == 0;
        /* More ranks than cores: smaller rings (the opener of a pair takes the creator's size,
         * shm.c). 16 ranks on 2 cores, allreduce of 64 KiB in launches shaped like the harness's
         * check (10 timed calls): 3.7-4.8 ms with 4 MiB rings, 0.77 with 1 MiB, Open MPI 0.8-1.0; the
         * first passes through 4 MiB rings fault in 16 MiB per rank per partner set and the
         * rings crowd the cache. 4 ranks on 2 cores, 256 KiB-64 MiB: 1 MiB rings as fast or
         * faster for allreduce (64 MiB 50-65 ms against 76-78), broadcast and allgather, alltoall
         * alike. And they are mapped in at their first use, not at start-up: faulting in
         * every pair's rings (16 ranks: 60 MiB a rank, most of it for pairs that never talk)
         * took a 16-rank launch from 0.24-0.28 s to 0.53-0.54, while the first calls of 64 KiB
         * ran alike (0.55-0.72 ms against 0.66-0.76). */
        bool oversubscribed = kolo__host_oversubscribed(local + 1);
        if (oversubscribed && !kolo__setting_is_set(KOLO_SET_SHM_RING_SIZE)) b.ring = OVERSUBSCRIBED_RING;
        /* Many ranks on a host: smaller rings, halved until this rank's (2 per pair and channel)
         * fit in RING_BUDGET. A pair's rings fill in whole at their first use (shm.c, first_pass),
         * and a one-round exchange uses every pair (the engine's negotiation did every cycle up
         * to 64 ranks until 2026-12-03, up to 16 since: negotiate.c, gather()): 64 ranks on 2
         * cores with 1 MiB rings took 8 of their 10 s of start-up filling the engine's, and held
         * 4 GiB of shared memory for them. 17 ranks and fewer keep their size. */
        if (!kolo__setting_is_set(KOLO_SET_SHM_RING_SIZE))
            while (b.ring > RING_MIN && local * KOLO_NCHANNELS * 2 * b.ring > RING_BUDGET) b.ring >>= 1;
        bool tight = fit_dev_shm(&b, local);
        b.populate = !oversubscribed && local * KOLO_NCHANNELS * 2 * b.ring <= ((size_t)128 << 20);
        b.reserve = b.populate || tight;
        /* A connector answers the greeting when its process next runs: 5 s, and as many times
         * that as ranks crowd each of the cores (256 ranks on 2 cores took ~30 s to connect, and
         * a connector given 5 s was refused midway, failing the job). A silent stranger costs
         * only a descriptor until then. */
        b.greet_ns = 5000000000ull * kolo__core_crowd(b.peers, wi->size, wi->rank);
        b.pending_in = (wi->size - 1 - wi->rank) * KOLO_NCHANNELS;
        b.pending_out = wi->rank * KOLO_NCHANNELS;
        st = run_handshakes(&b, lfd);
    }
    close(lfd);
    for (size_t i = 0; i < b.nhs; i++) {
        hs *h = &b.hss[i];
        if (h->fd >= 0 && h->state != HS_DONE && h->state != HS_FREE && !h->conn) close(h->fd);
        if (h->shm_name[0] == '/') kolo__shm_unlink(h->shm_name);
    }
    kolo__free(b.hss);
    kolo__free(b.ready);
    b.ready = NULL;
    if (st != KOLO_OK) goto err;
    *peers_out = b.peers;
    return KOLO_OK;
err:
    for (int ch = 0; ch < KOLO_NCHANNELS; ch++) {
        kolo__mesh_fail(meshes[ch], st); /* the peers connected already learn why */
        kolo__mesh_destroy(meshes[ch]);
        meshes[ch] = NULL;
    }
    kolo__free(b.peers);
    kolo__free(b.ready);
    return st;
}

void kolo__mesh_destroy(kolo__mesh *m)
{
    if (!m) return;
    for (int p = 0; p < m->size; p++) {
        kolo__conn *c = m->conns[p];
        if (!c) continue;
        if (c->tp && !c->error && !m->failed) c->tp->goodbye(c);
        if (c->tp) c->tp->close(c);
        if (c->fd >= 0) close(c->fd);
        kolo__free(c->lost_msg);
        kolo__free(c);
    }
    kolo__free(m->conns);
    for (int i = 0; m->pair_ways && i < m->size; i++) kolo__free(m->pair_ways[i]);
    kolo__free(m->pair_ways);
    kolo__free(m->scratch[0]);
    kolo__free(m->scratch[1]);
    kolo__free(m->scratch[2]);
    kolo__free(m);
}
