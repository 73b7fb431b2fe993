/* test_elastic.c - the core's side of elastic jobs: a worker re-joins the job in the round kolorun
 * forms after a death, when workers are added, when a round is superseded before it starts, and
 * is told when it was removed. The test process plays kolorun: it writes the rounds into a store
 * (the keys of src/core/elastic.c) and forks the workers. kolorun's own elastic driver is tested
 * in test_kolorun.c. */
#include "kt.h"

#include "../src/boot/auth.h"
#include "../src/boot/store.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct driver {
    kolo__store *c;
    char job[64], secret[80];
    int port;
    pid_t store;
} driver;

/* A store (in a child: the test forks workers) and a connection to it, as kolorun has. */
static void driver_start(driver *d, const char *job)
{
    memset(d, 0, sizeof(*d));
    KT_OK(kolo__secret_make(d->secret, sizeof(d->secret)));
    snprintf(d->job, sizeof(d->job), "%s%d", job, (int)getpid());
    d->store = kt_spawn_store(d->secret, &d->port);
    KT_OK(kolo__store_connect(&d->c, "127.0.0.1", d->port, d->secret, strlen(d->secret), 10));
}

static void driver_stop(driver *d)
{
    kolo__store_close(d->c);
    kill(d->store, SIGKILL);
    waitpid(d->store, NULL, 0);
}

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

/* The survivors of round 1 tell the driver, through this pipe, that they have checked round 2
 * for a newer round, so that it writes round 3 only after that (under ASan the driver once wrote
 * it between a worker's start of round 2 and its check, which then saw round 3). */
static int checked_pipe[2] = {-1, -1};

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
        /* worker 2 dies as soon as its first allreduce returned, maybe before the others' have:
         * theirs still succeed (every byte they need from it was sent; xfer.c, keep_loss) */
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
        KT_ASSERT(write(checked_pipe[1], "c", 1) == 1);
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
    driver_start(&d, "ktel");

    write_round(&d, 1, "added", (const char *const[]){"0 3", "1 3", "2 3", NULL});
    KT_ASSERT(pipe(checked_pipe) == 0);
    pid_t w[4];
    for (int id = 0; id < 3; id++) w[id] = start_worker(&d, id, 1);
    int st = reap_ok(w[2]);
    KT_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    write_round(&d, 2, "removed", (const char *const[]){"0 2", "1 2", NULL});
    wait_joined(&d, 0, 2);
    wait_joined(&d, 1, 2);
    for (int got = 0; got < 2;) { /* both checked round 2 (a worker that failed never says so) */
        struct pollfd p = {checked_pipe[0], POLLIN, 0};
        KT_ASSERTF(poll(&p, 1, 30000) == 1, "the workers of round 2 did not check it within 30 s");
        char c[2];
        ssize_t k = read(checked_pipe[0], c, (size_t)(2 - got));
        KT_ASSERT(k > 0);
        got += (int)k;
    }
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
    driver_stop(&d);
}

/* A round whose other member is alive but never arrives (no newer round replaces it) fails at
 * KOLO_START_TIMEOUT, as outside elastic jobs: it is not waited out as a dead member's round. */
KT_TEST(elastic_round_past_its_deadline_is_an_error, 30)
{
    driver d;
    driver_start(&d, "ktdl");
    write_round(&d, 1, "added", (const char *const[]){"0 2", "1 2", NULL});
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid == 0) {
        char buf[64];
        snprintf(buf, sizeof(buf), "127.0.0.1:%d", d.port);
        setenv("KOLO_RENDEZVOUS", buf, 1);
        setenv("KOLO_SECRET", d.secret, 1);
        setenv("KOLO_JOB_ID", d.job, 1);
        setenv("KOLO_RANK", "0", 1);
        setenv("KOLO_SIZE", "2", 1);
        setenv("KOLO_ELASTIC", "1", 1);
        setenv("KOLO_ELASTIC_ID", "0", 1);
        setenv("KOLO_ELASTIC_ROUND", "1", 1);
        setenv("KOLO_START_TIMEOUT", "0.5", 1);
        setenv("KOLO_ELASTIC_TIMEOUT", "20", 1);
        double t0 = kt_now();
        KT_STATUS(kolo_init(), KOLO_ERR_STARTUP);
        KT_CONTAINS(kolo_last_error(), "never arrived at the rendezvous");
        KT_ASSERTF(kt_now() - t0 < 5, "kolo_init took %.1f s", kt_now() - t0);
        _exit(0);
    }
    int st = reap_ok(pid);
    KT_ASSERTF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker ended with status 0x%x", st);
    driver_stop(&d);
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

/* ---- kolorun's elastic driver ---- */

#include <stdio.h>

/* A training loop as elastic.run drives one: state (the step) committed every few steps and
 * synced from rank 0 at each (re)start; a failing collective rolls back to the last commit, a
 * newer round at a commit re-joins without rolling back. Args: steps, then "die=ID:STEP" (the
 * worker with that id kills itself on reaching that step), "stop=ID:STEP" (stops itself there),
 * "busy=ID:STEP:MS" (in round 1, spins that many milliseconds there, outside kolo), "impatient=S" (every worker
 * but the busy one waits S seconds for a silent peer: KOLO_OP_TIMEOUT in its own environment, whatever
 * kolorun passed), "mismatch=STEP" (in round 1, the ranks disagree on a count there), "hold=MS" (waits that long
 * before exiting), "linger=ID:MS" (after a failed collective, sleeps that long before it shuts
 * kolo down). Rank 0 prints "round G size S from
 * step N" at each start and "step N" at each commit; every worker prints "done: worker W rank R
 * size S round G step N" at the end. Also run on several hosts by test_multihost.c. */
KT_WORKER(elastic_train)
{
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    int die_id = -1, die_step = -1, stop_id = -1, stop_step = -1, mismatch_step = -1, hold_ms = 0;
    int busy_id = -1, busy_step = -1, busy_ms = 0, linger_id = -1, linger_ms = 0;
    char impatient[32] = "";
    for (int a = 2; a < argc; a++) {
        sscanf(argv[a], "impatient=%31s", impatient);
        sscanf(argv[a], "linger=%d:%d", &linger_id, &linger_ms);
        sscanf(argv[a], "busy=%d:%d:%d", &busy_id, &busy_step, &busy_ms);
        sscanf(argv[a], "hold=%d", &hold_ms);
        sscanf(argv[a], "die=%d:%d", &die_id, &die_step);
        sscanf(argv[a], "stop=%d:%d", &stop_id, &stop_step);
        sscanf(argv[a], "mismatch=%d", &mismatch_step);
    }
    const char *idv = getenv("KOLO_ELASTIC_ID");
    int me = idv ? atoi(idv) : -1;
    if (impatient[0] && me != busy_id) setenv("KOLO_OP_TIMEOUT", impatient, 1);
    int step = 0, committed = 0;
    for (;;) {
        int st = kolo_init();
        if (st == KOLO_ERR_REMOVED) return 0;
        if (st != KOLO_OK) {
            fprintf(stderr, "init: %s\n", kolo_last_error());
            return 3;
        }
        int32_t s = step; /* sync: rank 0 holds the state */
        if (kolo_broadcast(&s, 1, KOLO_INT32, 0, KOLO_WORLD) != KOLO_OK) goto lost;
        step = committed = s;
        if (kolo_rank() == 0) printf("round %d size %d from step %d\n", kolo_elastic_round(), kolo_size(), step);
        while (step < steps) {
            if (me == die_id && step >= die_step) raise(SIGKILL);
            if (me == stop_id && step >= stop_step) raise(SIGSTOP);
            if (me == busy_id && step == busy_step && kolo_elastic_round() == 1) {
                double until = kt_now() + busy_ms / 1000.0, next = 0;
                for (double t = kt_now(); t < until; t = kt_now())
                    if (t >= next) { /* kolorun forwards these while it reads the worker's CPU time */
                        printf("worker %d spinning\n", me);
                        fflush(stdout);
                        next = t + 0.25;
                    }
            }
            int one[4] = {1, 1, 1, 1}, sum[4] = {0};
            /* in round 1 only, the ranks disagree on a count: a mismatch on every rank */
            size_t count = step == mismatch_step && kolo_elastic_round() == 1 ? 1 + (size_t)kolo_rank() : 1;
            if (kolo_allreduce(one, sum, count, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) goto lost;
            if (sum[0] != kolo_size()) {
                fprintf(stderr, "sum %d with size %d\n", sum[0], kolo_size());
                return 4;
            }
            step++;
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            if (step % 5 == 0) { /* commit */
                committed = step;
                if (kolo_rank() == 0) printf("step %d\n", step);
                fflush(stdout);
                int u = 0;
                if (kolo_elastic_check(&u) != KOLO_OK) goto lost;
                if (u != KOLO_ELASTIC_NONE) goto reset;
            }
        }
        printf("done: worker %d rank %d size %d round %d step %d\n", me, kolo_rank(), kolo_size(), kolo_elastic_round(),
               step);
        fflush(stdout);
        kolo_shutdown();
        struct timespec hold = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
        nanosleep(&hold, NULL);
        return 0;
    lost:
        step = committed; /* restore */
        if (me == linger_id) {
            struct timespec linger = {linger_ms / 1000, (linger_ms % 1000) * 1000000L};
            nanosleep(&linger, NULL);
        }
    reset:
        kolo_shutdown();
    }
}

static int run_kolorun(kt_proc *p, const char *const *args, double timeout)
{
    const char *argv[48];
    int n = 0;
    static char path[4096];
    snprintf(path, sizeof(path), "%s/bin/kolorun", kt_build_dir());
    argv[n++] = path;
    for (int k = 0; args[k] && n < 47; k++) argv[n++] = args[k];
    argv[n] = NULL;
    kt_proc_start(p, argv, NULL);
    return kt_proc_finish(p, timeout);
}

KT_TEST(kolorun_elastic_goes_on_without_a_dead_worker, 60)
{
    kt_proc p;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/out", kt_scratch());
    char tl[600];
    snprintf(tl, sizeof(tl), "%s/tl.json", kt_scratch());
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "2", "--output-filename", dir,
                                                     "--timeline-filename", tl, kt_self(), "--worker", "elastic_train",
                                                     "40", "die=2:12", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: worker 2 (rank 2 of round 1) on host localhost was killed by SIGKILL");
    KT_CONTAINS(p.ebuf, "the job goes on without it");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 2 workers (after losing worker 2; 0 new, 0 removed)");
    KT_CONTAINS(p.ebuf, "kolorun: elastic job: 2 rounds, 1 worker lost on the way");
    KT_CONTAINS(p.obuf, "done: worker 0 rank 0 size 2 round 2 step 40");
    KT_CONTAINS(p.obuf, "done: worker 1 rank 1 size 2 round 2 step 40");
    KT_EQ(kt_count(p.obuf, "done:"), 2);
    /* --output-filename: a directory per worker id, as ranks change between rounds */
    for (int w = 0; w < 3; w++) {
        char path[600], text[4096] = "";
        snprintf(path, sizeof(path), "%s/worker.%d/stdout", dir, w);
        FILE *f = fopen(path, "r");
        KT_ASSERTF(f, "no %s", path);
        size_t n = fread(text, 1, sizeof(text) - 1, f);
        text[n] = '\0';
        fclose(f);
        if (w < 2) KT_CONTAINS(text, w ? "done: worker 1 rank 1" : "done: worker 0 rank 0");
        else KT_EQ(strstr(text, "done:") == NULL, 1);
    }
    /* the timeline: round 1's files (3 ranks) kept beside round 2's (2 ranks), each valid JSON */
    static const char *const files[] = {"", ".1", ".2", ".round2", ".round2.1"};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(files); i++) {
        char cmd[1400];
        snprintf(cmd, sizeof(cmd), "python3 -c \"import json,sys; json.load(open(sys.argv[1]))\" %s%s", tl, files[i]);
        KT_ASSERTF(system(cmd) == 0, "timeline %s%s missing or not JSON", tl, files[i]);
    }
    kt_proc_free(&p);
}

/* The engine's random mix through a death and into the next round (tests/test_engine.c,
 * engine_mix_elastic): round 1's survivors are told, naming the dead rank, and round 2 runs a
 * whole new plan on the 2 left, every element right. KT_MIX_SEED picks other plans. */
KT_TEST(kolorun_elastic_engine_mix_goes_on_after_a_death, 90)
{
    kt_proc p;
    const char *seed = getenv("KT_MIX_SEED");
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "2", kt_self(), "--worker",
                                                     "engine_mix_elastic", seed ? seed : NULL, NULL},
                           80);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.ebuf, "was killed by SIGKILL");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 2 workers (after losing worker ");
    KT_EQ(kt_count(p.obuf, ", round 2: "), 2);
    KT_EQ(kt_count(p.obuf, "every element right"), 2);
    KT_ASSERTF(strstr(p.ebuf, "FAIL") == NULL, "%s", p.ebuf);
    kt_proc_free(&p);
}

KT_TEST(kolorun_elastic_ends_below_min_np, 60)
{
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "2", "--min-np", "2", kt_self(), "--worker", "elastic_train",
                                                     "400", "die=1:3", NULL},
                           50);
    KT_ASSERTF(code == 128 + SIGKILL, "kolorun exited %d\n%s", code, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: 1 worker left, fewer than --min-np 2, and no usable slot to start more on: ending the job");
    KT_CONTAINS(p.ebuf, "kolorun: worker 1 (rank 1) on host localhost was killed by SIGKILL");
    KT_CONTAINS(p.ebuf, "the first failure of this job");
    KT_EQ(kt_count(p.obuf, "done:"), 0);
    kt_proc_free(&p);
    /* the reset limit ends the job the same way */
    code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "1", "--reset-limit", "0", kt_self(), "--worker",
                                                 "elastic_train", "400", "die=2:3", NULL},
                       50);
    KT_ASSERTF(code == 128 + SIGKILL, "kolorun exited %d\n%s", code, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: the job was re-formed 0 times, the --reset-limit: ending it");
    kt_proc_free(&p);
}

/* A discovery script's new slot gets a worker, which the others take in at their next commit
 * and bring up to date; the new worker's rank follows the older ones'. */
KT_TEST(kolorun_elastic_grows_with_discovered_slots, 90)
{
    char hosts[512], script[600];
    snprintf(hosts, sizeof(hosts), "%s/hosts", kt_scratch());
    FILE *f = fopen(hosts, "w");
    KT_ASSERT(f);
    fprintf(f, "# slots for the test\nlocalhost:2\n");
    fclose(f);
    snprintf(script, sizeof(script), "cat %s", hosts);
    const char *argv[] = {NULL, "-np", "2", "--max-np", "3", "--host-discovery-script", script, kt_self(), "--worker",
                          "elastic_train", "150", NULL};
    static char path[4096];
    snprintf(path, sizeof(path), "%s/bin/kolorun", kt_build_dir());
    argv[0] = path;
    kt_proc p;
    kt_proc_start(&p, argv, NULL);
    kt_proc_wait_for(&p, "step 10", 1, 30);
    f = fopen(hosts, "w");
    KT_ASSERT(f);
    fprintf(f, "localhost:3\n");
    fclose(f);
    int code = kt_proc_finish(&p, 60);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 3 workers (1 new, 0 removed)");
    KT_CONTAINS(p.obuf, "done: worker 0 rank 0 size 3 round 2 step 150");
    KT_CONTAINS(p.obuf, "done: worker 1 rank 1 size 3 round 2 step 150");
    KT_CONTAINS(p.obuf, "done: worker 2 rank 2 size 3 round 2 step 150");
    kt_proc_free(&p);
}

/* worker W's "done:" line in out says it ended as rank W of `size` in round 2 or a later one, at
 * step `steps` */
static void finished_after_round_1(const char *out, int w, int size, int steps)
{
    char head[64];
    snprintf(head, sizeof(head), "done: worker %d rank %d size %d round ", w, w, size);
    const char *d = strstr(out, head);
    KT_ASSERTF(d, "no '%s' in\n%s", head, out);
    int round = 0, step = 0;
    KT_EQ(sscanf(d + strlen(head), "%d step %d", &round, &step), 2);
    KT_ASSERTF(round >= 2 && step == steps, "worker %d finished in round %d at step %d", w, round, step);
}

/* A worker that stops answering (SIGSTOP) without dying: the others time out on it and ask for a
 * new round; kolorun kills the silent one and forms the round without it. The timeout is 2 s,
 * not 1: CI once ran this beside the Python suites and a survivor was timed out on in round 2
 * (most likely kept off the CPU: stalls by hand did not reproduce the job's end; since then
 * kolorun also spares a silent worker that uses CPU time, kolorun_elastic_waits_for_a_busy_worker).
 * A stall makes a further round with the same two workers (every worker asks), which is right, so
 * the survivors may finish in round 2 or later. */
KT_TEST(kolorun_elastic_kills_a_worker_the_others_gave_up_on, 60)
{
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "2", "-x", "KOLO_OP_TIMEOUT=2", kt_self(),
                                                     "--worker", "elastic_train", "60", "stop=2:12", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    /* "... 5 s ago, and it used no CPU time in the last 5 s; killing it ...": the seconds are
     * measured, 6 on a slow tick */
    KT_CONTAINS(p.ebuf, "kolorun: worker 2 (rank 2) on host localhost stopped answering: 2 workers gave up on it and "
                        "asked for a new round ");
    KT_CONTAINS(p.ebuf, " s ago, and it used no CPU time in the last ");
    /* where its threads sat: it stopped itself (SIGSTOP), so all of them (main and engine, and
     * whatever a sanitizer runs) */
    KT_CONTAINS(p.ebuf, " s (its threads: ");
    KT_CONTAINS(p.ebuf, " stopped); killing it, the job goes on without it");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 2 workers (after losing worker 2; 0 new, 0 removed)");
    finished_after_round_1(p.obuf, 0, 2, 60);
    finished_after_round_1(p.obuf, 1, 2, 60);
    kt_proc_free(&p);
}

/* A worker busy outside kolo (a long step) when the others give up on it is not stuck: it uses
 * CPU time, so kolorun waits for it (KOLO_OP_TIMEOUT, at least 30 s) instead of killing it, and
 * its next collective fails at once (its peers left) and asks too: the new round keeps all three
 * (--min-np 3: a kill would end the job). The others give up after 2 s, kolorun reads the busy
 * one's CPU time 5 s later, 3 s before its 10 s step ends. A host busy enough to keep a worker
 * off its core 2 s makes more rounds, of the same three, so the workers may finish after round 2.
 * The busy worker's engine thread still runs: mostly it hears the others' goodbye and goes down
 * without asking, but when the abort reaches it first its failed cycle asks for the new round
 * itself (engine.c), and kolorun then has no silent worker to wait for (CI's ASan lane, once in
 * 2026-12-06's runs). Either way the worker is not killed and all three go on. */
static void spared_busy_worker_told(const char *ebuf, const char *told)
{
    KT_ASSERTF(!strstr(ebuf, "killing it"), "%s", ebuf);
    if (strstr(ebuf, "kolorun: worker 2 (rank 2) has not asked for the new round "))
        KT_CONTAINS(ebuf, told);
    else
        printf("  (worker 2's engine asked for the new round itself: kolorun had no busy worker to wait for)\n");
}

void kt_spared_busy_worker(const char *ebuf)
{
    spared_busy_worker_told(ebuf, "but it is running (it used CPU time): waiting up to 30 s for it (KOLO_OP_TIMEOUT, "
                                  "at least 30 s)");
}

KT_TEST(kolorun_elastic_waits_for_a_busy_worker, 60)
{
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "3", "-x", "KOLO_OP_TIMEOUT=2", kt_self(),
                                                     "--worker", "elastic_train", "40", "busy=2:12:10000", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    kt_spared_busy_worker(p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: every worker asked for a new round (a collective failed on all of them): forming it");
    for (int w = 0; w < 3; w++) finished_after_round_1(p.obuf, w, 3, 40);
    kt_proc_free(&p);
}

/* Under KOLO_OP_TIMEOUT=0 the workers wait for a silent peer without end, and kolorun waits for a
 * busy one as long as it runs (it gave it 30 s, then killed it: an evaluation longer than that
 * ended the worker). The two others give up on the busy one after 2 s all the same (their own
 * KOLO_OP_TIMEOUT, "impatient"), which under 0 only a failure elsewhere would make them do. */
KT_TEST(kolorun_elastic_waits_without_end_for_a_busy_worker_under_op_timeout_0, 60)
{
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "3", "-x", "KOLO_OP_TIMEOUT=0", kt_self(),
                                                     "--worker", "elastic_train", "40", "busy=2:12:10000",
                                                     "impatient=2", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    spared_busy_worker_told(p.ebuf, "but it is running (it used CPU time): waiting for it while it runs "
                                    "(KOLO_OP_TIMEOUT=0: no limit)");
    for (int w = 0; w < 3; w++) finished_after_round_1(p.obuf, w, 3, 40);
    kt_proc_free(&p);
}

/* A collective that fails on every worker (here a mismatch) makes them all ask for a new round:
 * kolorun forms it with the same workers, who roll back to their last commit and go on. A worker
 * asks from the collective that failed, not once its program has shut kolo down: a shutdown may
 * take seconds (the engine's goodbye to ranks that do not answer), and kolorun takes a worker
 * that neither asks nor uses CPU time for 5 s for stuck. Here worker 2 sleeps 7 s between its
 * failed collective and kolo_shutdown; asking only from kolo_init, it was killed and the job
 * (--min-np 3) ended with 137. */
KT_TEST(kolorun_elastic_resets_when_every_worker_asks, 60)
{
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "3", "--min-np", "3", kt_self(), "--worker", "elastic_train",
                                                 "30", "mismatch=12", "linger=2:7000", NULL},
                       50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_ASSERTF(!strstr(p.ebuf, "killing it"), "%s", p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: every worker asked for a new round (a collective failed on all of them): forming it");
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 3 workers (0 new, 0 removed)");
    KT_CONTAINS(p.obuf, "round 2 size 3 from step 10");
    for (int w = 0; w < 3; w++) {
        char want[96];
        snprintf(want, sizeof(want), "done: worker %d rank %d size 3 round 2 step 30", w, w);
        KT_CONTAINS(p.obuf, want);
    }
    kt_proc_free(&p);
}

/* A worker added after the others' last commit waits for them in vain: when they finish, kolorun
 * stops it instead of letting it wait out the elastic timeout, and the job succeeds. */
KT_TEST(kolorun_elastic_stops_a_worker_that_never_joined, 60)
{
    char script[700];
    /* the first two runs (before round 1, then a second later) find 2 slots, every later one 3: the
     * others are done with their steps (and their last commit) long before */
    snprintf(script, sizeof(script),
             "n=$(cat %s/runs 2>/dev/null || echo 0); echo $((n+1)) > %s/runs; "
             "if [ $n -lt 2 ]; then echo localhost:2; else echo localhost:3; fi",
             kt_scratch(), kt_scratch());
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "2", "--max-np", "3", "--host-discovery-script", script,
                                                     kt_self(), "--worker", "elastic_train", "5", "hold=3500", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 3 workers (1 new, 0 removed)");
    KT_CONTAINS(p.ebuf, "kolorun: the job finished in round 1, which worker 2 (started for round 2) never joined: "
                        "stopping it");
    KT_EQ(kt_count(p.obuf, "done:"), 2);
    KT_CONTAINS(p.obuf, "done: worker 1 rank 1 size 2 round 1 step 5");
    kt_proc_free(&p);
}

/* The discovery script stops listing the job's only host: no round can keep --min-np workers, so
 * after --elastic-timeout the job ends, with no worker named as a failure. */
KT_TEST(kolorun_elastic_ends_when_its_hosts_leave, 60)
{
    char script[700];
    snprintf(script, sizeof(script),
             "n=$(cat %s/runs 2>/dev/null || echo 0); echo $((n+1)) > %s/runs; if [ $n -lt 2 ]; then echo localhost:2; fi",
             kt_scratch(), kt_scratch());
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "2", "--elastic-timeout", "1", "--host-discovery-script",
                                                     script, kt_self(), "--worker", "elastic_train", "2000", NULL},
                           50);
    KT_ASSERTF(code == 1, "kolorun exited %d\n%s", code, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: 0 workers left, fewer than --min-np 2: waiting up to 1 s (--elastic-timeout) for hosts");
    KT_CONTAINS(p.ebuf, "kolorun: no hosts came within 1 s (--elastic-timeout): ending the job");
    KT_CONTAINS(p.ebuf, "kolorun: workers 0-1: terminated by kolorun because the elastic job could not go on");
    KT_EQ(kt_count(p.ebuf, "first failure"), 0);
    kt_proc_free(&p);
}

/* --bind-to core: each worker binds by a slot of its host that no live worker holds; a failed
 * host gets workers again after its cooldown, and the new one takes the dead one's core. */
KT_TEST(kolorun_elastic_binds_by_free_slot_and_refills_after_cooldown, 60)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("  skipped: needs 2 CPUs\n");
        return;
    }
    kt_proc p;
    int code = run_kolorun(&p, (const char *const[]){"-np", "2", "--min-np", "1", "--bind-to", "core", "--report-bindings",
                                                     "--blacklist-cooldown-range", "1", "1", kt_self(), "--worker",
                                                     "elastic_train", "150", "die=1:10", NULL},
                           50);
    KT_ASSERTF(code == 0, "kolorun exited %d\n%s\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: worker 0 on localhost: bound to cpus ");
    const char *w1 = strstr(p.ebuf, "kolorun: worker 1 on localhost: bound to cpus ");
    const char *w2 = strstr(p.ebuf, "kolorun: worker 2 on localhost: bound to cpus ");
    KT_ASSERTF(w1 && w2, "no binding lines for workers 1 and 2:\n%s", p.ebuf);
    /* the same cpu list: worker 2 took worker 1's slot */
    size_t skip = strlen("kolorun: worker 1 on localhost: bound to cpus ");
    KT_ASSERTF(strncmp(w1 + skip, w2 + skip, strcspn(w1 + skip, "\n")) == 0, "worker 2 not on worker 1's core:\n%s", p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: round 2: 1 worker (after losing worker 1; 0 new, 0 removed)");
    KT_CONTAINS(p.ebuf, "kolorun: round 3: 2 workers (1 new, 0 removed)");
    KT_CONTAINS(p.obuf, "done: worker 2 rank 1 size 2 round 3 step 150");
    KT_EQ(kt_count(p.ebuf, "rank 0 on localhost: bound"), 0); /* no plan by ranks in elastic jobs */
    kt_proc_free(&p);
}

KT_TEST(kolorun_elastic_usage_errors, 30)
{
    kt_proc p;
    KT_EQ(run_kolorun(&p, (const char *const[]){"-np", "2", "--min-np", "3", "true", NULL}, 10), 2);
    KT_CONTAINS(p.ebuf, "--min-np 3 is more than -np 2");
    kt_proc_free(&p);
    KT_EQ(run_kolorun(&p, (const char *const[]){"-H", "localhost:2", "--host-discovery-script", "echo x", "true", NULL}, 10), 2);
    KT_CONTAINS(p.ebuf, "give it or -H/--hostfile, not both");
    kt_proc_free(&p);
    KT_EQ(run_kolorun(&p, (const char *const[]){"-np", "2", "--blacklist-cooldown-range", "5", "2", "true", NULL}, 10), 2);
    KT_CONTAINS(p.ebuf, "expected MIN MAX");
    kt_proc_free(&p);
    /* a discovery script that never finds enough slots: the job does not start */
    KT_EQ(run_kolorun(&p, (const char *const[]){"--min-np", "2", "--elastic-timeout", "1.5", "--host-discovery-script",
                                               "echo localhost:1", "true", NULL},
                      20),
          1);
    KT_CONTAINS(p.ebuf, "found 1 slot, fewer than --min-np 2, within 1.5 s (--elastic-timeout)");
    kt_proc_free(&p);
    /* a line that is no host name (an ssh option, say) is refused as -H would refuse it */
    KT_EQ(run_kolorun(&p, (const char *const[]){"--min-np", "1", "--elastic-timeout", "0.5", "--host-discovery-script",
                                               "echo -oProxyCommand=x:1", "true", NULL},
                      20),
          1);
    KT_CONTAINS(p.ebuf, "host discovery script failed: it printed '-oProxyCommand=x:1', not 'host' or 'host:slots'");
    kt_proc_free(&p);
    /* a command missing here may exist on the remote hosts a script finds: said, not fatal; a
     * worker started here then cannot start, and the job ends for want of workers */
    KT_EQ(run_kolorun(&p, (const char *const[]){"--min-np", "1", "--elastic-timeout", "5", "--host-discovery-script",
                                               "echo localhost:1", "kolo-no-such-command-xyz", NULL},
                      20),
          127);
    KT_CONTAINS(p.ebuf, "warning: command not found here: 'kolo-no-such-command-xyz'; workers on remote hosts are "
                        "not affected, a worker on this host cannot start");
    KT_CONTAINS(p.ebuf, "cannot run 'kolo-no-such-command-xyz'");
    kt_proc_free(&p);
}
