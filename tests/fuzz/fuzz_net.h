/* fuzz_net.h - what the harnesses that talk to a real server over TCP share (fuzz_store.c,
 * fuzz_mesh.c): writing and reading with a deadline, and a reset.
 *
 * The includer defines, before including this:
 *   static _Noreturn void fail(const char *fmt, ...);   the harness's finding, with its context
 *   #define ANSWER_S seconds                             how long the far end has for an answer
 *   #define FZ_PEER "what the far end is called"         in the findings */
#ifndef KOLO_FUZZ_NET_H
#define KOLO_FUZZ_NET_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { RD_OK, RD_EOF, RD_TIMEOUT };

/* Writes all of buf; a peer that closed (as predicted, or not: the reads find out) ends it early. */
static void send_bytes(int fd, const void *buf, size_t n)
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
static int read_full(int fd, void *buf, size_t n, double timeout_s)
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
static void close_reset(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

#endif
