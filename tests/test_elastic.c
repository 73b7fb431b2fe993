/* test_elastic.c - the core's side of elastic jobs: a worker re-joins the job in the round kolorun
 * forms after a death, when workers are added, when a round is superseded before it starts, and
 * is told when it was removed. The test process plays kolorun: it writes the rounds into a store
 * (the keys of src/core/elastic.c) and forks the workers. kolorun's own elastic driver is tested
 * in test_kolorun.c. */
#include "kt.h"

#include "../src/boot/auth.h"
#include "../src/boot/store.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct driver {
    kolo__store *c;
    char job[64], secret[80];
    int port;
} driver;

/* places: for each worker id, "rank size" or "removed"; NULL ends */
static void write_round(driver *d, int g, const char *kind, const char *const *places)
{
    char key[160], val[64];
    for (int id = 0; places[id]; id++) {
        if (!*places[id]) continue; /* not in this round */
        int rank = 0, size = 0;
        if (strcmp(places[id], "removed") == 0) snprintf(val, sizeof(val), "removed");
        else {
            KT_EQ(sscanf(places[id], "%d %d", &rank, &size), 2);
            snprintf(val, sizeof(val), "%d %d %d %d 0 1", rank, size, rank, size);
        }
        snprintf(key, sizeof(key), "%s/elastic/%d/w/%d", d->job, g, id);
        KT_OK(kolo__store_set(d->c, key, val, strlen(val)));
    }
    snprintf(key, sizeof(key), "%s/elastic/%d/kind", d->job, g);
    KT_OK(kolo__store_set(d->c, key, kind, strlen(kind)));
    snprintf(key, sizeof(key), "%s/elastic/latest", d->job);
    snprintf(val, sizeof(val), "%d", g);
    KT_OK(kolo__store_set(d->c, key, val, strlen(val)));
}

/* waits until worker id reports it started round g */
static void wait_joined(driver *d, int id, int g)
{
    char key[160];
    snprintf(key, sizeof(key), "%s/elastic/joined/%d", d->job, id);
    for (int i = 0; i < 2000; i++) {
        void *v = NULL;
        size_t len = 0;
        if (kolo__store_get(d->c, key, &v, &len, 0) == KOLO_OK) {
            int got = atoi(v);
            kolo__free(v);
            if (got == g) return;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kt_fail(__FILE__, __LINE__, "worker %d never started round %d", id, g);
}

static int sum_of_ones(void)
{
    int one = 1, out = 0;
    KT_OK(kolo_allreduce(&one, &out, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD));
    return out;
}

/* every rank calls kolo_elastic_check until kolorun has formed a newer round */
static int await_update(void)
{
    for (int i = 0; i < 3000; i++) {
        int u = -1;
        KT_OK(kolo_elastic_check(&u));
        if (u != KOLO_ELASTIC_NONE) return u;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kt_fail(__FILE__, __LINE__, "no newer round appeared");
}

static void rejoin(void)
{
    KT_OK(kolo_shutdown());
    KT_OK(kolo_init());
}

static void worker(int id)
{
    KT_ASSERT(kolo_elastic_enabled());
    if (id == 3) { /* added in round 3, which never starts: joins round 4 */
        KT_OK(kolo_init());
        KT_EQ(kolo_elastic_round(), 4);
        KT_EQ(kolo_rank(), 2);
        KT_EQ(kolo_size(), 3);
        KT_EQ(sum_of_ones(), 3);
    } else {
        KT_OK(kolo_init());
        KT_EQ(kolo_elastic_round(), 1);
        KT_EQ(kolo_rank(), id);
        KT_EQ(kolo_size(), 3);
        KT_EQ(sum_of_ones(), 3);
        if (id == 2) raise(SIGKILL);
        /* round 1 loses worker 2: the collectives say so, and the survivors re-join */
        int st, one = 1, out;
        while ((st = kolo_allreduce(&one, &out, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD)) == KOLO_OK) {}
        KT_EQ(st, KOLO_ERR_PEER_LOST);
        rejoin();
        KT_EQ(kolo_elastic_round(), 2);
        KT_EQ(kolo_rank(), id);
        KT_EQ(kolo_size(), 2);
        KT_EQ(sum_of_ones(), 2);
        int u = -1;
        KT_OK(kolo_elastic_check(&u));
        KT_EQ(u, KOLO_ELASTIC_NONE);
        /* a worker is added (round 3, superseded by round 4 before it could start) */
        KT_EQ(await_update(), KOLO_ELASTIC_ADDED);
        rejoin();
        KT_EQ(kolo_elastic_round(), 4);
        KT_EQ(kolo_rank(), id);
        KT_EQ(kolo_size(), 3);
        KT_EQ(sum_of_ones(), 3);
    }
    /* round 5 removes worker 1 */
    KT_EQ(await_update(), KOLO_ELASTIC_REMOVED);
    KT_OK(kolo_shutdown());
    int st = kolo_init();
    if (id == 1) {
        KT_EQ(st, KOLO_ERR_REMOVED);
        KT_CONTAINS(kolo_last_error(), "worker 1 was removed from the elastic job in round 5");
        KT_EQ(kolo_is_initialized(), 0);
        return;
    }
    KT_OK(st);
    KT_EQ(kolo_rank(), id == 0 ? 0 : 1);
    KT_EQ(kolo_size(), 2);
    KT_EQ(sum_of_ones(), 2);
}

static pid_t start_worker(driver *d, int id, int round)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid > 0) return pid;
    char buf[64];
    static const char *const drop[] = {"HOROVOD_RANK", "HOROVOD_SIZE", "RANK", "WORLD_SIZE", "KOLO_TRANSPORT"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) unsetenv(drop[i]);
    setenv("KOLO_ELASTIC", "1", 1);
    snprintf(buf, sizeof(buf), "%d", id);
    setenv("KOLO_ELASTIC_ID", buf, 1);
    snprintf(buf, sizeof(buf), "%d", round);
    setenv("KOLO_ELASTIC_ROUND", buf, 1);
    /* the launcher's rank variables describe the round it was started for; the store's win */
    setenv("KOLO_RANK", "0", 1);
    setenv("KOLO_SIZE", "1", 1);
    snprintf(buf, sizeof(buf), "127.0.0.1:%d", d->port);
    setenv("KOLO_RENDEZVOUS", buf, 1);
    setenv("KOLO_SECRET", d->secret, 1);
    setenv("KOLO_JOB_ID", d->job, 1);
    setenv("KOLO_ELASTIC_TIMEOUT", "30", 1);
    setenv("KOLO_OP_TIMEOUT", "30", 1);
    worker(id);
    kolo_shutdown();
    fflush(stdout);
    fflush(stderr);
    _exit(0);
}

static int reap_ok(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return st;
}

KT_TEST(elastic_rounds_after_death_growth_and_removal, 60)
{
    driver d;
    memset(&d, 0, sizeof(d));
    KT_OK(kolo__secret_make(d.secret, sizeof(d.secret)));
    snprintf(d.job, sizeof(d.job), "ktel%d", (int)getpid());
    pid_t store = kt_spawn_store(d.secret, &d.port);
    KT_OK(kolo__store_connect(&d.c, "127.0.0.1", d.port, d.secret, strlen(d.secret), 10));

    write_round(&d, 1, "added", (const char *const[]){"0 3", "1 3", "2 3", NULL});
    pid_t w[4];
    for (int id = 0; id < 3; id++) w[id] = start_worker(&d, id, 1);
    int st = reap_ok(w[2]);
    KT_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    write_round(&d, 2, "removed", (const char *const[]){"0 2", "1 2", NULL});
    wait_joined(&d, 0, 2);
    wait_joined(&d, 1, 2);
    /* round 3 names a worker 4 that never comes: the others must not wait for it past round 4 */
    write_round(&d, 3, "added", (const char *const[]){"0 4", "1 4", "", "2 4", "3 4", NULL});
    w[3] = start_worker(&d, 3, 3);
    struct timespec ts = {0, 500 * 1000 * 1000};
    nanosleep(&ts, NULL);
    write_round(&d, 4, "added", (const char *const[]){"0 3", "1 3", "", "2 3", NULL});
    wait_joined(&d, 0, 4);
    wait_joined(&d, 1, 4);
    wait_joined(&d, 3, 4);
    write_round(&d, 5, "removed", (const char *const[]){"0 2", "removed", "", "1 2", NULL});
    for (int id = 0; id < 4; id++) {
        if (id == 2) continue;
        st = reap_ok(w[id]);
        KT_ASSERTF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d ended with status 0x%x", id, st);
    }
    kolo__store_close(d.c);
    kill(store, SIGKILL);
    waitpid(store, NULL, 0);
}

/* A worker that never gets a place fails with a message naming the round, after
 * KOLO_ELASTIC_TIMEOUT; a malformed id is refused at once. */
static void never_placed(int rank, void *arg)
{
    (void)rank;
    (void)arg;
    setenv("KOLO_ELASTIC", "1", 1);
    setenv("KOLO_ELASTIC_ID", "7", 1);
    setenv("KOLO_ELASTIC_ROUND", "2", 1);
    setenv("KOLO_ELASTIC_TIMEOUT", "0.3", 1);
    KT_STATUS(kolo_init(), KOLO_ERR_STARTUP);
    KT_CONTAINS(kolo_last_error(), "worker 7 waited 0.3 s (KOLO_ELASTIC_TIMEOUT) for kolorun to form round 2");
    KT_EQ(kolo_elastic_round(), 0);
    setenv("KOLO_ELASTIC_ID", "x1", 1);
    KT_STATUS(kolo_init(), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), "KOLO_ELASTIC_ID='x1'");
    /* outside elastic jobs the check changes nothing */
    unsetenv("KOLO_ELASTIC");
    KT_OK(kolo_init());
    int u = -1;
    KT_OK(kolo_elastic_check(&u));
    KT_EQ(u, KOLO_ELASTIC_NONE);
    KT_EQ(kolo_elastic_round(), 0);
    KT_STATUS(kolo_elastic_check(NULL), KOLO_ERR_INVALID_ARG);
}

KT_TEST(elastic_worker_without_a_place_is_told, 30) { KT_EQ(kt_job(1, never_placed, NULL, NULL, NULL), 0); }

