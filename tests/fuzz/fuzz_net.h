/* fuzz_net.h - what the harnesses that talk to a real server over TCP share (fuzz_store.c,
 * fuzz_mesh.c, fuzz_frames.c, fuzz_shm.c): connecting, listening, writing and reading with a
 * deadline, a reset, the host-order integers of kolo's own wire, and the process's descriptors.
 *
 * The includer defines, before including this:
 *   static _Noreturn void fail(const char *fmt, ...);   the harness's finding, with its context
 *   #define ANSWER_S seconds                             how long the far end has for an answer
 *   #define FZ_PEER "what the far end is called"         in the findings */
#ifndef KOLO_FUZZ_NET_H
#define KOLO_FUZZ_NET_H

#include <dirent.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { RD_OK, RD_EOF, RD_TIMEOUT };

/* Connects to 127.0.0.1:port, with TCP_NODELAY. */
static inline int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        /* libFuzzer's SIGALRM (its -timeout) interrupts a blocking connect, which goes on alone */
        if (errno != EINTR) fail("connect to %s on port %d: %s", FZ_PEER, port, strerror(errno));
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        while (poll(&pf, 1, (int)(ANSWER_S * 1000)) < 0 && errno == EINTR) {}
        int err = 0;
        socklen_t el = sizeof(err);
        if (!(pf.revents & POLLOUT) || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err)
            fail("connect to %s on port %d: %s", FZ_PEER, port,
                 err ? strerror(err) : "no connection within the deadline");
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Integers in host order, as the mesh's handshake and the transports' headers carry them. */
static inline void w32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void w64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t r32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t r64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Writes all of buf; a peer that closed (as predicted, or not: the reads find out) ends it early. */
static inline void send_bytes(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    uint64_t deadline = kolo__now_ns() + (uint64_t)(ANSWER_S * 1e9);
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return;
            uint64_t now = kolo__now_ns();
            if (now >= deadline) fail("%s took none of %zu bytes in %g s", FZ_PEER, n, ANSWER_S);
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
            continue;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Reads exactly n bytes: RD_OK, RD_EOF (a close or a reset first) or RD_TIMEOUT. */
static inline int read_full(int fd, void *buf, size_t n, double timeout_s)
{
    uint8_t *p = buf;
    uint64_t deadline = kolo__now_ns() + (uint64_t)(timeout_s * 1e9);
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r == 0) return RD_EOF;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == ECONNRESET) return RD_EOF;
            if (errno != EAGAIN && errno != EWOULDBLOCK) fail("recv: %s", strerror(errno));
            uint64_t now = kolo__now_ns();
            if (now >= deadline) return RD_TIMEOUT;
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
            continue;
        }
        p += r;
        n -= (size_t)r;
    }
    return RD_OK;
}

/* Closes fd with a reset (SO_LINGER 0) instead of a FIN. */
static inline void close_reset(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

/* A socket listening on 127.0.0.1 at a free port, which it gives in *port. */
static inline int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        fail("a listener of the harness: %s", strerror(errno));
    *port = ntohs(a.sin_port);
    return fd;
}

/* The descriptors this process holds (each input must leave as many as it found). */
static inline int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

#endif
