/* test_store.c - the rendezvous store: set/get/add from many clients and processes, waiting gets,
 * timeouts, wrong secrets, strangers sending garbage or nothing, taken ports, stopping under load. */
#include "kt.h"

#include <signal.h>

#include "../src/boot/auth.h"
#include "../src/boot/env.h"
#include "../src/boot/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char SECRET[] = "test-secret-0123456789";

static double now_s(void) { return kolo__now_s(); }

static kolo__store_server *start_server(int *port)
{
    kolo__store_server *s = NULL;
    KT_OK(kolo__store_server_start(&s, "127.0.0.1", 0, SECRET, strlen(SECRET)));
    *port = kolo__store_server_port(s);
    KT_ASSERT(*port > 0);
    return s;
}

static kolo__store *client(int port)
{
    kolo__store *c = NULL;
    KT_OK(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5));
    return c;
}

static void expect_value(kolo__store *c, const char *key, const char *want)
{
    void *v = NULL;
    size_t n = 0;
    KT_OK(kolo__store_get(c, key, &v, &n, 5));
    KT_ASSERTF(n == strlen(want) && memcmp(v, want, n) == 0, "%s = '%.*s', expected '%s'", key, (int)n,
               (const char *)v, want);
    kolo__free(v);
}

/* A good client still gets served: the check after every hostile act. */
static void still_serves(int port)
{
    kolo__store *c = client(port);
    char key[32];
    snprintf(key, sizeof(key), "alive-%d", (int)getpid());
    KT_OK(kolo__store_set(c, key, "yes", 3));
    expect_value(c, key, "yes");
    kolo__store_close(c);
}

/* ---- stderr capture, to check the server's warnings ---- */

static int saved_stderr = -1;
static char cap_path[64];

static void capture_begin(void)
{
    snprintf(cap_path, sizeof(cap_path), "/tmp/kolo-test-store-%d.log", (int)getpid());
    int fd = open(cap_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    KT_ASSERT(fd >= 0);
    fflush(stderr);
    saved_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
}

/* Waits (up to 3 s) until the captured text contains needle; returns the text (static). */
static const char *capture_wait(const char *needle)
{
    static char buf[16384];
    for (int i = 0; i < 300; i++) {
        int fd = open(cap_path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : 0;
        if (fd >= 0) close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (strstr(buf, needle)) break;
        usleep(10000);
    }
    return buf;
}

static void capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    unlink(cap_path);
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* ---- raw sockets: strangers and hand-made protocol ---- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    KT_ASSERT(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    return fd;
}

/* true when the server closes fd within `secs` (reads and discards whatever it sends first) */
static bool closed_within(int fd, double secs)
{
    double end = now_s() + secs;
    char buf[256];
    while (now_s() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
}

static void send_raw(int fd, const void *p, size_t n)
{
    KT_EQ(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void recv_raw(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        KT_ASSERTF(r > 0, "recv: %zd", r);
        got += (size_t)r;
    }
}

/* The client side of the handshake, by hand (mirrors the protocol comment in store.c): the
 * greeting and the server's challenge, then the proof and the server's answer. */
static void raw_greet(int fd, uint8_t hello[40], uint8_t ch[72])
{
    memcpy(hello, "KOLOSTv1", 8);
    KT_OK(kolo__random_bytes(hello + 8, 32));
    send_raw(fd, hello, 40);
    recv_raw(fd, ch, 72);
    KT_ASSERT(memcmp(ch, "KOLOSTv1", 8) == 0);
}

static void raw_prove(int fd, const uint8_t hello[40], const uint8_t ch[72], const char *secret, uint8_t ack[4])
{
    uint8_t msg[64], mac[32];
    memcpy(msg, hello + 8, 32);
    memcpy(msg + 32, ch + 8, 32);
    KT_OK(kolo__hmac(mac, secret, strlen(secret), "kolo-store-v1 client", msg, sizeof(msg)));
    send_raw(fd, mac, sizeof(mac));
    recv_raw(fd, ack, 4);
}

static int raw_authenticated(int port, const char *secret)
{
    int fd = raw_connect(port);
    uint8_t hello[40], ch[72], ack[4];
    raw_greet(fd, hello, ch);
    raw_prove(fd, hello, ch, secret, ack);
    KT_ASSERT(memcmp(ack, "KSOK", 4) == 0);
    return fd;
}

/* ==================================================================== basics */

KT_TEST(store_set_get_add, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    kolo__store *c = client(port);

    KT_OK(kolo__store_set(c, "greeting", "hello", 5));
    void *v = NULL;
    size_t n = 0;
    KT_OK(kolo__store_get(c, "greeting", &v, &n, 0));
    KT_EQ(n, 5);
    KT_ASSERT(memcmp(v, "hello", 5) == 0 && ((char *)v)[5] == '\0');
    kolo__free(v);

    KT_OK(kolo__store_set(c, "greeting", "bye", 3)); /* overwrite */
    expect_value(c, "greeting", "bye");

    KT_OK(kolo__store_set(c, "empty", NULL, 0));
    KT_OK(kolo__store_get(c, "empty", &v, &n, 0));
    KT_EQ(n, 0);
    kolo__free(v);

    static const uint8_t bin[] = {0, 1, 0, 255, 0};
    KT_OK(kolo__store_set(c, "binary", bin, sizeof(bin)));
    KT_OK(kolo__store_get(c, "binary", &v, &n, 0));
    KT_ASSERT(n == sizeof(bin) && memcmp(v, bin, n) == 0);
    kolo__free(v);

    int64_t r = 0;
    KT_OK(kolo__store_add(c, "counter", 5, &r));
    KT_EQ(r, 5);
    KT_OK(kolo__store_add(c, "counter", -7, &r));
    KT_EQ(r, -2);
    KT_OK(kolo__store_add(c, "counter", 0, NULL));
    expect_value(c, "counter", "-2");
    KT_OK(kolo__store_set(c, "counter", "40", 2));
    KT_OK(kolo__store_add(c, "counter", 2, &r));
    KT_EQ(r, 42);
    KT_STATUS(kolo__store_add(c, "greeting", 1, &r), KOLO_ERR_INVALID_ARG);
    KT_OK(kolo__store_set(c, "big", "9223372036854775807", 19));
    KT_STATUS(kolo__store_add(c, "big", 1, &r), KOLO_ERR_INVALID_ARG);
    KT_OK(kolo__store_add(c, "counter", 1, &r)); /* still in step after refusals */
    KT_EQ(r, 43);

    /* keys: 1 to 255 bytes */
    char key[300];
    memset(key, 'k', sizeof(key));
    key[255] = '\0';
    KT_OK(kolo__store_set(c, key, "x", 1));
    expect_value(c, key, "x");
    key[255] = 'k';
    key[256] = '\0';
    KT_STATUS(kolo__store_set(c, key, "x", 1), KOLO_ERR_INVALID_ARG);
    KT_STATUS(kolo__store_set(c, "", "x", 1), KOLO_ERR_INVALID_ARG);
    KT_STATUS(kolo__store_get(c, "greeting", &v, &n, -1), KOLO_ERR_INVALID_ARG);

    /* values: up to 16 MiB */
    size_t big = 16u << 20;
    uint8_t *bv = kolo__malloc(big + 1);
    KT_ASSERT(bv);
    for (size_t i = 0; i < big + 1; i++) bv[i] = (uint8_t)(i * 131 + 7);
    KT_OK(kolo__store_set(c, "huge", bv, big));
    KT_OK(kolo__store_get(c, "huge", &v, &n, 0));
    KT_ASSERT(n == big && memcmp(v, bv, big) == 0);
    kolo__free(v);
    KT_STATUS(kolo__store_set(c, "huge", bv, big + 1), KOLO_ERR_INVALID_ARG);
    kolo__free(bv);

    /* absent key, just looking */
    double t0 = now_s();
    KT_STATUS(kolo__store_get(c, "absent", &v, &n, 0), KOLO_ERR_TIMEOUT);
    KT_ASSERT(now_s() - t0 < 1.0);
    KT_CONTAINS(kolo_last_error(), "absent");

    kolo__store_close(c);
    kolo__store_close(NULL);
    kolo__store_server_stop(s);
    kolo__store_server_stop(NULL);
}

KT_TEST(store_many_keys, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    kolo__store *c = client(port);
    char k[32], val[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof(k), "key/%d", i);
        snprintf(val, sizeof(val), "v%d", i * 7);
        KT_OK(kolo__store_set(c, k, val, strlen(val)));
    }
    for (int i = 0; i < 3000; i += 7) {
        snprintf(k, sizeof(k), "key/%d", i);
        snprintf(val, sizeof(val), "v%d", i * 7);
        expect_value(c, k, val);
    }
    kolo__store_close(c);
    kolo__store_server_stop(s);
}

/* Ranks in separate processes: each publishes its address, counts itself in, and reads every
 * other rank's entry (waiting for the late ones). */
KT_TEST(store_forked_clients, 60)
{
    enum { N = 8 };
    int port;
    /* the server lives in its own process: forking clients from a process that runs the
     * server thread could hand a child a lock that thread holds */
    pid_t server = kt_spawn_store(SECRET, &port);
    pid_t pids[N];
    fflush(stderr);
    for (int r = 0; r < N; r++) {
        pids[r] = fork();
        KT_ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            usleep((useconds_t)(r * 20000)); /* staggered arrivals */
            kolo__store *c = client(port);
            char key[32], val[32];
            snprintf(key, sizeof(key), "addr/%d", r);
            snprintf(val, sizeof(val), "host%d:%d", r, 1000 + r);
            KT_OK(kolo__store_set(c, key, val, strlen(val)));
            int64_t arrived;
            KT_OK(kolo__store_add(c, "arrived", 1, &arrived));
            KT_ASSERT(arrived >= 1 && arrived <= N);
            for (int p = 0; p < N; p++) {
                snprintf(key, sizeof(key), "addr/%d", p);
                snprintf(val, sizeof(val), "host%d:%d", p, 1000 + p);
                expect_value(c, key, val);
            }
            kolo__store_close(c);
            _exit(0);
        }
    }
    for (int r = 0; r < N; r++) {
        int st;
        KT_EQ(waitpid(pids[r], &st, 0), pids[r]);
        KT_ASSERTF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client %d failed (status 0x%x)", r, st);
    }
    kolo__store *c = client(port);
    expect_value(c, "arrived", "8");
    kolo__store_close(c);
    kill(server, SIGKILL);
    waitpid(server, NULL, 0);
}

/* A get parks until a later set, and does not hold up anyone else meanwhile. */
KT_TEST(store_get_waits_for_set, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    int ready[2];
    KT_ASSERT(pipe(ready) == 0);
    fflush(stderr);
    pid_t waiter = fork();
    if (waiter == 0) {
        kolo__store *c = client(port);
        char b = 1;
        KT_EQ(write(ready[1], &b, 1), 1);
        double t0 = now_s();
        void *v;
        size_t n;
        KT_OK(kolo__store_get(c, "late", &v, &n, 20));
        KT_ASSERT(n == 4 && memcmp(v, "here", 4) == 0);
        KT_ASSERT(now_s() - t0 >= 0.2);
        kolo__free(v);
        kolo__store_close(c);
        _exit(0);
    }
    char b;
    KT_EQ(read(ready[0], &b, 1), 1);
    usleep(50000); /* let the waiter park its get */
    kolo__store *c = client(port);
    double t0 = now_s();
    for (int i = 0; i < 20; i++) {
        KT_OK(kolo__store_set(c, "other", "x", 1));
        expect_value(c, "other", "x");
    }
    KT_ASSERTF(now_s() - t0 < 1.0, "others were held up: %.3f s", now_s() - t0);
    usleep(250000);
    KT_OK(kolo__store_set(c, "late", "here", 4));
    int st;
    KT_EQ(waitpid(waiter, &st, 0), waiter);
    KT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    kolo__store_close(c);
    kolo__store_server_stop(s);
}

static void *get_counter_thread(void *p)
{
    int port = *(int *)p;
    kolo__store *c = NULL;
    if (kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5)) return (void *)1;
    void *v;
    size_t n;
    int st = kolo__store_get(c, "ctr", &v, &n, 10);
    intptr_t bad = st != KOLO_OK || n != 1 || memcmp(v, "3", 1) != 0;
    if (st == KOLO_OK) kolo__free(v);
    kolo__store_close(c);
    return (void *)bad;
}

KT_TEST(store_add_wakes_waiters, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) KT_ASSERT(pthread_create(&th[i], NULL, get_counter_thread, &port) == 0);
    usleep(100000);
    kolo__store *c = client(port);
    KT_OK(kolo__store_add(c, "ctr", 3, NULL));
    for (int i = 0; i < 3; i++) {
        void *r;
        pthread_join(th[i], &r);
        KT_ASSERT(r == NULL);
    }
    kolo__store_close(c);
    kolo__store_server_stop(s);
}

KT_TEST(store_get_timeout, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    kolo__store *c = client(port);
    void *v;
    size_t n;
    double t0 = now_s();
    KT_STATUS(kolo__store_get(c, "never", &v, &n, 0.3), KOLO_ERR_TIMEOUT);
    double dt = now_s() - t0;
    KT_ASSERTF(dt >= 0.28 && dt < 2.0, "timed out after %.3f s", dt);
    KT_CONTAINS(kolo_last_error(), "never");
    KT_CONTAINS(kolo_last_error(), "127.0.0.1:");
    /* the connection is still in step */
    KT_OK(kolo__store_set(c, "never", "now", 3));
    expect_value(c, "never", "now");
    kolo__store_close(c);
    kolo__store_server_stop(s);
}

/* kt_job's store with the environment it gives each rank: detection plus rendezvous. */
static void rank_rendezvous(int rank, void *arg)
{
    (void)arg;
    kolo__world_info w;
    KT_OK(kolo__env_detect(&w));
    KT_ASSERT(strcmp(w.source, "kolo") == 0 && w.rank == rank && w.rdv_serve == 0 && !w.secret_derived);
    kolo__store *c;
    KT_OK(kolo__store_connect(&c, w.rdv_host, w.rdv_port, w.secret, w.secret_len, 10));
    char key[160], val[32];
    snprintf(key, sizeof(key), "%s/rank/%d", w.job_id, rank);
    snprintf(val, sizeof(val), "%d", rank * rank);
    KT_OK(kolo__store_set(c, key, val, strlen(val)));
    for (int p = 0; p < w.size; p++) {
        snprintf(key, sizeof(key), "%s/rank/%d", w.job_id, p);
        snprintf(val, sizeof(val), "%d", p * p);
        expect_value(c, key, val);
    }
    kolo__store_close(c);
}

KT_TEST(store_kt_job_rendezvous, 60)
{
    int bad = kt_job(4, rank_rendezvous, NULL, NULL, NULL);
    KT_EQ(bad, 0);
}

/* ==================================================================== security */

KT_TEST(store_wrong_secret, 30)
{
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    kolo__store *c = NULL;
    int st = kolo__store_connect(&c, "127.0.0.1", port, "not-the-secret", 14, 5);
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", kolo_last_error());
    const char *log = capture_wait("wrong secret");
    char logcopy[16384];
    snprintf(logcopy, sizeof(logcopy), "%s", log);
    still_serves(port);
    kolo__store_server_stop(s);
    capture_end();
    KT_STATUS(st, KOLO_ERR_AUTH);
    KT_ASSERT(c == NULL);
    KT_ASSERTF(strstr(msg, "127.0.0.1:"), "message '%s'", msg);
    KT_ASSERTF(count_lines_with(logcopy, "wrong secret") == 1, "log: %s", logcopy);
    KT_ASSERTF(strstr(logcopy, "from 127.0.0.1:"), "log: %s", logcopy);
    KT_EQ(count_lines_with(logcopy, "\n"), 1); /* one line in all */
}

/* A client speaking to an impostor (right protocol, wrong secret) learns it. */
static void *impostor(void *p)
{
    int lfd = *(int *)p;
    int fd = accept(lfd, NULL, NULL);
    uint8_t hello[40], ch[72];
    recv_raw(fd, hello, sizeof(hello));
    memcpy(ch, "KOLOSTv1", 8);
    memset(ch + 8, 7, 64);
    send_raw(fd, ch, sizeof(ch));
    uint8_t mac[32];
    recv_raw(fd, mac, sizeof(mac));
    send_raw(fd, "KSOK", 4);
    usleep(200000);
    close(fd);
    return NULL;
}

/* The server's side of the handshake by hand, after the client's greeting: the challenge with a
 * right MAC; then the client's proof is read (and not checked). */
static void prove_and_read_proof(int fd, const uint8_t hello[40])
{
    uint8_t ch[72], msg[64], mac[32];
    memcpy(ch, "KOLOSTv1", 8);
    KT_OK(kolo__random_bytes(ch + 8, 32));
    memcpy(msg, hello + 8, 32);
    memcpy(msg + 32, ch + 8, 32);
    KT_OK(kolo__hmac(ch + 40, SECRET, strlen(SECRET), "kolo-store-v1 server", msg, sizeof(msg)));
    send_raw(fd, ch, sizeof(ch));
    recv_raw(fd, mac, sizeof(mac));
}

/* A store that proves the secret, then closes instead of accepting the client's proof (as one
 * that gave up waiting for it does). */
static void *gives_up(void *p)
{
    int fd = accept(*(int *)p, NULL, NULL);
    uint8_t hello[40];
    recv_raw(fd, hello, sizeof(hello));
    prove_and_read_proof(fd, hello);
    close(fd);
    return NULL;
}

/* Fake servers: garbage, silence, immediate close. */
static void *fake_server(void *p)
{
    int *a = p; /* a[0] listening fd, a[1] mode */
    int fd = accept(a[0], NULL, NULL);
    if (a[1] == 0) send_raw(fd, "HTTP/1.1 400 Bad Request\r\n\r\n" "0123456789012345678901234567890123456789012345678901234567890123456789", 98);
    if (a[1] == 1) usleep(1500000);
    close(fd);
    return NULL;
}

static int listen_any(int *port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); /* a store may take the port after it */
    KT_ASSERT(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(l, 8) == 0);
    socklen_t al = sizeof(a);
    getsockname(l, (struct sockaddr *)&a, &al);
    *port = ntohs(a.sin_port);
    return l;
}

KT_TEST(store_client_against_bad_servers, 30)
{
    int port, l = listen_any(&port);
    pthread_t th;
    KT_ASSERT(pthread_create(&th, NULL, impostor, &l) == 0);
    kolo__store *c = NULL;
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5), KOLO_ERR_AUTH);
    pthread_join(th, NULL);

    /* not called a wrong secret (the store proved the same one), and when each step ended */
    KT_ASSERT(pthread_create(&th, NULL, gives_up, &l) == 0);
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5), KOLO_ERR_PEER_LOST);
    pthread_join(th, NULL);
    KT_CONTAINS(kolo_last_error(), "closed the connection instead of accepting our proof of the secret (its "
                                   "challenge came ");
    KT_CONTAINS(kolo_last_error(), " s after our greeting, our proof went ");

    int a[2] = {l, 0};
    KT_ASSERT(pthread_create(&th, NULL, fake_server, a) == 0);
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5), KOLO_ERR_PROTOCOL);
    KT_CONTAINS(kolo_last_error(), "127.0.0.1:");
    pthread_join(th, NULL);

    a[1] = 2;
    KT_ASSERT(pthread_create(&th, NULL, fake_server, a) == 0);
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5), KOLO_ERR_PEER_LOST);
    pthread_join(th, NULL);
    close(l);
}

KT_TEST(store_stranger_garbage, 30)
{
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    int fd = raw_connect(port);
    send_raw(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    bool closed = closed_within(fd, 3);
    close(fd);
    /* bytes that look like a huge length before any greeting */
    fd = raw_connect(port);
    send_raw(fd, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
    bool closed2 = closed_within(fd, 3);
    close(fd);
    const char *log = capture_wait("wrong magic (not a kolo store client)\n[");
    int lines = count_lines_with(log, "wrong magic");
    still_serves(port);
    kolo__store_server_stop(s);
    capture_end();
    KT_ASSERT(closed);
    KT_ASSERT(closed2);
    KT_EQ(lines, 2);
}

/* Silent strangers are closed: one that never greets, or stops in the middle of the greeting,
 * when the greeting's time is up; one that greeted and never proves the secret, when the proof's
 * time is up (longer: a worker starting on a crowded CPU can be slow to compute its proof;
 * store.c says why), each with a line saying how far it got. */
KT_TEST(store_stranger_silent, 30)
{
    kolo__store_test_handshake_timeout(0.5, 1.5);
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    int fd = raw_connect(port);
    int half = raw_connect(port);
    int greeted = raw_connect(port);
    send_raw(half, "KOLO", 4); /* a greeting cut short */
    uint8_t hello[40];
    memcpy(hello, "KOLOSTv1", 8);
    KT_OK(kolo__random_bytes(hello + 8, 32));
    send_raw(greeted, hello, sizeof(hello));
    send_raw(greeted, "proo", 4); /* a proof cut short */
    double t0 = now_s();
    still_serves(port); /* while the strangers hang around */
    double served = now_s() - t0;
    bool closed = closed_within(fd, 5);
    bool closed_half = closed_within(half, 5);
    double dt = now_s() - t0;
    bool closed_greeted = closed_within(greeted, 5); /* reads the challenge, then the close */
    double dt_greeted = now_s() - t0;
    const char *log = capture_wait("no proof of the secret");
    char copy[16384];
    snprintf(copy, sizeof(copy), "%s", log);
    close(fd);
    close(half);
    close(greeted);
    kolo__store_server_stop(s);
    kolo__store_test_handshake_timeout(0, 0);
    capture_end();
    KT_ASSERTF(served < 0.4, "a good client waited %.3f s behind silent strangers", served);
    KT_ASSERT(closed && closed_half && closed_greeted);
    KT_ASSERTF(dt >= 0.4 && dt < 1.4, "closed after %.3f s", dt);
    KT_ASSERTF(dt_greeted >= 1.4 && dt_greeted < 4.0, "the one that greeted closed after %.3f s", dt_greeted);
    KT_ASSERTF(count_lines_with(copy, "no complete greeting within 0.5 s") == 2, "log: %s", copy);
    KT_ASSERTF(count_lines_with(copy, "no complete greeting within 0.5 s (4 of 40 bytes)") == 1, "log: %s", copy);
    KT_ASSERTF(count_lines_with(copy, "greeted, but no proof of the secret within 1.5 s (4 of 32 bytes)") == 1,
               "log: %s", copy);
}

/* ---- strangers that hold handshakes open: a flood, the descriptor limit, BUSY ---- */

/* A connection from `from` (a loopback address: 127.0.0.2 stands in for another machine) that
 * greets and then says nothing more: it holds a handshake for the proof's 60 s. */
static int greeter_from(int port, const char *from)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET}, a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    KT_ASSERT(inet_pton(AF_INET, from, &src.sin_addr) == 1);
    KT_ASSERTF(fd >= 0 && bind(fd, (struct sockaddr *)&src, sizeof(src)) == 0, "bind %s: %s", from, strerror(errno));
    KT_ASSERTF(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect: %s", strerror(errno));
    uint8_t hello[40];
    memcpy(hello, "KOLOSTv1", 8);
    KT_OK(kolo__random_bytes(hello + 8, 32));
    send_raw(fd, hello, sizeof(hello));
    return fd;
}

/* What a greeter got before the server closed it: 1 BUSY, after the challenge where the server
 * had read the greeting (closed in the round that accepted it, before reading, only BUSY: CI,
 * once), 0 still open after `secs`, -1 anything else. */
static int busy_then_closed(int fd, double secs)
{
    uint8_t got[80];
    size_t n = 0;
    double end = now_s() + secs;
    while (now_s() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t r = recv(fd, got + n, sizeof(got) - n, 0);
        if (r > 0 && (n += (size_t)r) < sizeof(got)) continue;
        bool challenged = n == 76 && memcmp(got, "KOLOSTv1", 8) == 0 && memcmp(got + 72, "KBSY", 4) == 0;
        return r == 0 && (challenged || (n == 4 && memcmp(got, "KBSY", 4) == 0)) ? 1 : -1;
    }
    return 0;
}

/* 300 connections from "another machine" greet and go silent (before, each held its slot for 60 s:
 * 4,096 of them locked the job out). The server holds 256 handshakes: the oldest of the address
 * holding the most are told BUSY and closed, a worker's slow handshake from its own address left
 * alone; workers still get in at once, and the log says what happens in a few lines, not 300. */
KT_TEST(store_strangers_cannot_hold_the_door, 60)
{
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    int early[8];
    for (int i = 0; i < 8; i++) early[i] = greeter_from(port, "127.0.0.2");
    /* a worker slow to prove the secret, from the job's own address */
    int worker = raw_connect(port);
    uint8_t hello[40], ch[72], ack[4];
    raw_greet(worker, hello, ch);
    int flood[300];
    for (int i = 0; i < 300; i++) flood[i] = greeter_from(port, "127.0.0.2");
    double t0 = now_s();
    still_serves(port);
    double served = now_s() - t0;
    int busy[8];
    for (int i = 0; i < 8; i++) busy[i] = busy_then_closed(early[i], 3);
    raw_prove(worker, hello, ch, SECRET, ack);
    int newest = busy_then_closed(flood[299], 0.2);
    kolo__store_server_stop(s); /* says how many it did not log */
    const char *log = capture_wait("handshakes closed for room in");
    char copy[16384];
    snprintf(copy, sizeof(copy), "%s", log);
    capture_end();
    for (int i = 0; i < 8; i++) close(early[i]);
    for (int i = 0; i < 300; i++) close(flood[i]);
    close(worker);
    KT_ASSERTF(served < 3, "a good client waited %.3f s behind 308 silent greetings", served);
    for (int i = 0; i < 8; i++)
        KT_ASSERTF(busy[i] == 1, "greeter %d: %d (1: told BUSY and closed, 0: still open)", i, busy[i]);
    KT_ASSERTF(memcmp(ack, "KSOK", 4) == 0, "the worker's slow handshake got '%.4s'", (const char *)ack);
    KT_EQ(newest, 0);
    KT_ASSERTF(count_lines_with(copy, "\n") <= 4, "%d lines: %s", count_lines_with(copy, "\n"), copy);
    KT_CONTAINS(copy, "unauthenticated connections open, 255 of them from 127.0.0.2: closing the oldest handshakes "
                      "from there (the store holds at most 256; a port scan or a flood?)");
    KT_CONTAINS(copy, " handshakes closed for room in ");
    KT_CONTAINS(copy, " s (the latest from 127.0.0.2:");
}

/* Out of descriptors (a process's soft limit, here 64, before the table's 4,096: before, the
 * server then stopped accepting, and a worker's connection sat in the backlog unanswered): the
 * server closes the oldest handshake of the busiest address to take the next connection. */
KT_TEST(store_out_of_descriptors_closes_a_handshake, 60)
{
    int ports[2];
    KT_ASSERT(pipe(ports) == 0);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid == 0) {
        close(ports[0]);
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 64;
        setrlimit(RLIMIT_NOFILE, &rl);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2); /* the server's warning, which the test above checks */
        kolo__store_server *s = NULL;
        if (kolo__store_server_start(&s, "127.0.0.1", 0, SECRET, strlen(SECRET)) != KOLO_OK) _exit(3);
        int port = kolo__store_server_port(s);
        if (write(ports[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) _exit(4);
        char c;
        while (read(ports[1], &c, 1) < 0 && errno == EINTR) {}
        pause(); /* until the parent kills it */
        _exit(0);
    }
    close(ports[1]);
    int port = 0;
    KT_EQ(read(ports[0], &port, sizeof(port)), (ssize_t)sizeof(port));
    int greeters[100];
    for (int i = 0; i < 100; i++) greeters[i] = greeter_from(port, "127.0.0.2");
    kolo__store *c = NULL;
    int st = kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 5);
    char err[512];
    snprintf(err, sizeof(err), "%s", st ? kolo_last_error() : "");
    if (st == KOLO_OK) {
        KT_OK(kolo__store_set(c, "k", "v", 1));
        expect_value(c, "k", "v");
        kolo__store_close(c);
    }
    int first = busy_then_closed(greeters[0], 3);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int i = 0; i < 100; i++) close(greeters[i]);
    close(ports[0]);
    KT_ASSERTF(st == KOLO_OK, "a worker behind 100 silent greetings, the server out of descriptors: %s", err);
    KT_EQ(first, 1);
}

/* The client, told BUSY in place of the challenge or of the acceptance, connects again (here to
 * the real store, started on the same port once the busy one has answered). */
static void *busy_once(void *p)
{
    int *a = p; /* a[0] listening fd, a[1] 0: BUSY for a challenge, 1: for the acceptance; a[2] port */
    int fd = accept(a[0], NULL, NULL);
    uint8_t hello[40];
    recv_raw(fd, hello, sizeof(hello));
    if (a[1] == 1) prove_and_read_proof(fd, hello);
    send_raw(fd, "KBSY", 4);
    close(fd);
    close(a[0]);
    kolo__store_server *s = NULL;
    KT_OK(kolo__store_server_start(&s, "127.0.0.1", a[2], SECRET, strlen(SECRET)));
    return s;
}

/* Told BUSY every time: the client gives up at its deadline, saying so. */
static void *always_busy(void *p)
{
    int l = *(int *)p, n = 0;
    for (;;) {
        int fd = accept(l, NULL, NULL);
        if (fd < 0) break;
        uint8_t hello[40];
        recv_raw(fd, hello, sizeof(hello));
        send_raw(fd, "KBSY", 4);
        close(fd);
        n++;
    }
    return (void *)(intptr_t)n;
}

KT_TEST(store_client_connects_again_when_busy, 30)
{
    for (int how = 0; how < 2; how++) {
        int port, l = listen_any(&port);
        int a[3] = {l, how, port};
        pthread_t th;
        KT_ASSERT(pthread_create(&th, NULL, busy_once, a) == 0);
        kolo__store *c = NULL;
        int st = kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 10);
        void *s = NULL;
        pthread_join(th, &s);
        KT_ASSERTF(st == KOLO_OK, "BUSY in place of the %s: %s", how ? "acceptance" : "challenge", kolo_last_error());
        KT_OK(kolo__store_set(c, "after", "busy", 4));
        expect_value(c, "after", "busy");
        kolo__store_close(c);
        kolo__store_server_stop(s);
    }
    int port, l = listen_any(&port);
    pthread_t th;
    KT_ASSERT(pthread_create(&th, NULL, always_busy, &l) == 0);
    kolo__store *c = NULL;
    double t0 = now_s();
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 1), KOLO_ERR_TIMEOUT);
    double dt = now_s() - t0;
    KT_CONTAINS(kolo_last_error(), "the store at 127.0.0.1:");
    KT_CONTAINS(kolo_last_error(), " was too busy with other handshakes to take ours");
    KT_CONTAINS(kolo_last_error(), " connections tried in 1 s");
    shutdown(l, SHUT_RDWR);
    void *n = NULL;
    pthread_join(th, &n);
    close(l);
    KT_ASSERTF(dt >= 0.9 && dt < 5, "gave up after %.2f s", dt);
    KT_ASSERTF((intptr_t)n >= 3, "%d connections", (int)(intptr_t)n);
}

/* Authenticated connections that then break the framing rules are closed one by one. */
KT_TEST(store_bad_frames_after_auth, 30)
{
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    static const struct {
        uint8_t bytes[16];
        size_t n;
        const char *why;
    } cases[] = {
        {{0xff, 0xff, 0xff, 0xff}, 4, "request frame of 4294967295 bytes"},
        {{0x01, 0x00, 0x01, 0x03}, 4, "request frame of 16777475 bytes"}, /* 16 MiB + 259 */
        {{0, 0, 0, 1, 1}, 5, "request frame of 1 bytes"},
        {{0, 0, 0, 3, 9, 1, 'k'}, 7, "unknown request op 9"},
        {{0, 0, 0, 3, 1, 0, 'k'}, 7, "malformed request"},   /* empty key */
        {{0, 0, 0, 3, 1, 5, 'k'}, 7, "malformed request"},   /* key longer than the frame */
        {{0, 0, 0, 4, 2, 1, 'k', 0}, 8, "malformed request"}, /* GET without its timeout */
        {{0, 0, 0, 5, 3, 1, 'k', 0, 0}, 9, "malformed request"}, /* ADD with a short delta */
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(cases); i++) {
        int fd = raw_authenticated(port, SECRET);
        send_raw(fd, cases[i].bytes, cases[i].n);
        KT_ASSERTF(closed_within(fd, 3), "case %zu not closed", i);
        close(fd);
        const char *log = capture_wait(cases[i].why);
        KT_ASSERTF(strstr(log, cases[i].why), "case %zu: '%s' not logged", i, cases[i].why);
    }
    /* a value over 16 MiB under a key short enough for its frame to pass the frame's limit: once
     * stored, no client could have read it back (the answer would be over the client's limit) */
    size_t vlen = (16u << 20) + 1, flen = 2 + 1 + vlen;
    uint8_t *big = kolo__calloc(1, 4 + flen);
    KT_ASSERT(big);
    big[0] = (uint8_t)(flen >> 24);
    big[1] = (uint8_t)(flen >> 16);
    big[2] = (uint8_t)(flen >> 8);
    big[3] = (uint8_t)flen;
    big[4] = 1; /* SET */
    big[5] = 1;
    big[6] = 'v';
    int fd = raw_authenticated(port, SECRET);
    send_raw(fd, big, 4 + flen);
    kolo__free(big);
    KT_ASSERT(closed_within(fd, 3));
    close(fd);
    KT_CONTAINS(capture_wait("value of 16777217 bytes"), "value of 16777217 bytes (allowed: at most 16777216)");
    kolo__store *c = client(port);
    void *v = NULL;
    size_t n = 0;
    KT_STATUS(kolo__store_get(c, "v", &v, &n, 0), KOLO_ERR_TIMEOUT); /* not stored */
    kolo__store_close(c);
    /* a valid frame through the raw path works, and the half-sent request is dropped quietly */
    fd = raw_authenticated(port, SECRET);
    uint8_t req[] = {0, 0, 0, 6, 1, 1, 'r', 'a', 'w', '!'};
    send_raw(fd, req, sizeof(req));
    uint8_t resp[5];
    recv_raw(fd, resp, sizeof(resp));
    KT_ASSERT(resp[3] == 1 && resp[4] == 0);
    close(fd);
    still_serves(port);
    c = client(port);
    expect_value(c, "r", "aw!");
    kolo__store_close(c);
    kolo__store_server_stop(s);
    capture_end();
}

/* Random bytes from many strangers and from authenticated clients: no crash, no leak. */
KT_TEST(store_fuzz, 60)
{
    int port;
    capture_begin();
    kolo__store_server *s = start_server(&port);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    uint8_t buf[512];
    for (int i = 0; i < 300; i++) {
        bool auth = i % 3 == 0;
        int fd = auth ? raw_authenticated(port, SECRET) : raw_connect(port);
        size_t n = 1 + (size_t)(i * 37 % (int)sizeof(buf));
        for (size_t j = 0; j < n; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[j] = (uint8_t)x;
        }
        if (i % 5 == 0 && !auth) memcpy(buf, "KOLOSTv1", KOLO_MIN(n, (size_t)8)); /* right magic, then junk */
        if (auth && i % 2 == 0 && n >= 6) { /* plausible header, random content */
            buf[0] = 0;
            buf[1] = 0;
            buf[2] = 0;
            buf[3] = (uint8_t)(n - 4);
        }
        send(fd, buf, n, MSG_NOSIGNAL);
        if (i % 4 == 0) shutdown(fd, SHUT_WR);
        close(fd);
    }
    still_serves(port);
    kolo__store_server_stop(s);
    capture_end();
}

/* ==================================================================== lifecycle */

KT_TEST(store_taken_port, 10)
{
    int port;
    kolo__store_server *s = start_server(&port);
    kolo__store_server *t = NULL;
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    KT_STATUS(kolo__store_server_start(&t, "127.0.0.1", port, SECRET, strlen(SECRET)), KOLO_ERR_SYSTEM);
    KT_CONTAINS(kolo_last_error(), want);
    KT_CONTAINS(kolo_last_error(), "in use");
    KT_ASSERT(t == NULL);
    snprintf(want, sizeof(want), ":%d", port);
    KT_STATUS(kolo__store_server_start(&t, NULL, port, SECRET, strlen(SECRET)), KOLO_ERR_SYSTEM);
    KT_CONTAINS(kolo_last_error(), want);
    KT_STATUS(kolo__store_server_start(&t, "127.0.0.1", 0, SECRET, 0), KOLO_ERR_INVALID_ARG);
    KT_STATUS(kolo__store_server_start(&t, "127.0.0.1", 70000, SECRET, 3), KOLO_ERR_INVALID_ARG);
    still_serves(port);
    kolo__store_server_stop(s);
    /* the port is free again once stopped (SO_REUSEADDR) */
    KT_OK(kolo__store_server_start(&t, "127.0.0.1", port, SECRET, strlen(SECRET)));
    kolo__store_server_stop(t);
}

KT_TEST(store_all_interfaces, 10)
{
    kolo__store_server *s = NULL;
    KT_OK(kolo__store_server_start(&s, NULL, 0, SECRET, strlen(SECRET)));
    int port = kolo__store_server_port(s);
    still_serves(port);
    kolo__store *c = NULL;
    KT_OK(kolo__store_connect(&c, "localhost", port, SECRET, strlen(SECRET), 5));
    kolo__store_close(c);
    int v6 = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    bool have_v6 = v6 >= 0 && bind(v6, (struct sockaddr *)&a6, sizeof(a6)) == 0;
    if (v6 >= 0) close(v6);
    if (have_v6) {
        KT_OK(kolo__store_connect(&c, "::1", port, SECRET, strlen(SECRET), 5));
        KT_OK(kolo__store_set(c, "v6", "y", 1));
        kolo__store_close(c);
    }
    kolo__store_server_stop(s);
}

static void *parked_get(void *p)
{
    kolo__store *c = p;
    void *v;
    size_t n;
    intptr_t st = kolo__store_get(c, "never", &v, &n, 30);
    return (void *)st;
}

KT_TEST(store_stop_with_clients, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    kolo__store *idle = client(port), *waiting = client(port);
    int stranger = raw_connect(port);
    pthread_t th;
    KT_ASSERT(pthread_create(&th, NULL, parked_get, waiting) == 0);
    usleep(100000);
    double t0 = now_s();
    kolo__store_server_stop(s);
    KT_ASSERTF(now_s() - t0 < 0.5, "stop took %.3f s", now_s() - t0);
    void *r;
    pthread_join(th, &r);
    KT_ASSERTF(now_s() - t0 < 2.0, "the parked get noticed after %.3f s", now_s() - t0);
    KT_EQ((intptr_t)r, KOLO_ERR_PEER_LOST);
    KT_STATUS(kolo__store_set(idle, "k", "v", 1), KOLO_ERR_PEER_LOST);
    KT_STATUS(kolo__store_set(idle, "k", "v", 1), KOLO_ERR_PEER_LOST); /* and stays so */
    KT_ASSERT(closed_within(stranger, 2));
    close(stranger);
    kolo__store_close(idle);
    kolo__store_close(waiting);
    /* nobody listens any more: a bounded wait naming the address */
    kolo__store *c = NULL;
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    t0 = now_s();
    KT_STATUS(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 0.3), KOLO_ERR_TIMEOUT);
    KT_ASSERT(now_s() - t0 >= 0.25 && now_s() - t0 < 2.0);
    KT_CONTAINS(kolo_last_error(), want);
}

/* Clients may start before the server: connection refused is retried. */
KT_TEST(store_connect_before_server, 30)
{
    int port, l = listen_any(&port);
    close(l); /* a port that was free a moment ago */
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        kolo__store *c = NULL;
        KT_OK(kolo__store_connect(&c, "127.0.0.1", port, SECRET, strlen(SECRET), 10));
        KT_OK(kolo__store_set(c, "early", "bird", 4));
        kolo__store_close(c);
        _exit(0);
    }
    usleep(300000);
    kolo__store_server *s = NULL;
    KT_OK(kolo__store_server_start(&s, "127.0.0.1", port, SECRET, strlen(SECRET)));
    int st;
    KT_EQ(waitpid(pid, &st, 0), pid);
    KT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    kolo__store *c = client(port);
    expect_value(c, "early", "bird");
    kolo__store_close(c);
    kolo__store_server_stop(s);
}

KT_TEST(store_connect_is_fast, 30)
{
    int port;
    kolo__store_server *s = start_server(&port);
    double t0 = now_s();
    for (int i = 0; i < 50; i++) kolo__store_close(client(port));
    double per = (now_s() - t0) / 50;
    kolo__store_server_stop(s);
    KT_ASSERTF(per < 0.02, "connect + handshake took %.2f ms", per * 1e3);
}

/* Start and stop from several threads at once: servers share nothing. */
static void *start_stop(void *p)
{
    (void)p;
    for (int i = 0; i < 20; i++) {
        kolo__store_server *s = NULL;
        if (kolo__store_server_start(&s, "127.0.0.1", 0, SECRET, strlen(SECRET))) return (void *)1;
        kolo__store *c = NULL;
        int st = kolo__store_connect(&c, "127.0.0.1", kolo__store_server_port(s), SECRET, strlen(SECRET), 5);
        if (st == KOLO_OK) st = kolo__store_add(c, "n", 1, NULL);
        kolo__store_close(c);
        kolo__store_server_stop(s);
        if (st) return (void *)2;
    }
    return NULL;
}

KT_TEST(store_threads_start_stop, 60)
{
    pthread_t th[4];
    for (int i = 0; i < 4; i++) KT_ASSERT(pthread_create(&th[i], NULL, start_stop, NULL) == 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        KT_ASSERTF(r == NULL, "thread %d: %ld (%s)", i, (long)(intptr_t)r, kolo_last_error());
    }
}

/* Forking while the server thread is busy: fork waits until the thread is parked in poll(),
 * so no child inherits a lock held inside malloc or libcrypto (it would hang at once). */
KT_TEST(store_fork_while_serving, 60)
{
    enum { N = 24 };
    int port;
    kolo__store_server *s = start_server(&port);
    pid_t pids[N];
    fflush(stderr);
    for (int r = 0; r < N; r++) {
        pids[r] = fork();
        KT_ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            for (int i = 0; i < 5; i++) { /* keep the server thread busy while siblings fork */
                kolo__store *c = client(port);
                KT_OK(kolo__store_add(c, "n", 1, NULL));
                kolo__store_close(c);
            }
            _exit(0);
        }
    }
    for (int r = 0; r < N; r++) {
        int st;
        KT_EQ(waitpid(pids[r], &st, 0), pids[r]);
        KT_ASSERTF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed (status 0x%x)", r, st);
    }
    kolo__store *c = client(port);
    expect_value(c, "n", "120");
    kolo__store_close(c);
    kolo__store_server_stop(s);
}
