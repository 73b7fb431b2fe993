/* test_launchers.c - kolo workers started by the engines users already run: Open MPI's and MPICH's
 * mpirun and torchrun for real, Slurm's and horovodrun's environments as those launchers set them.
 * The worker is this test binary in worker mode; each checks rank, size and an allreduce. */
#include "kt.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* kolo-tests --worker launched <expected size> [linger]: init, check, allreduce, print one line;
 * with linger, every rank but 0 stays a second longer and says so, while rank 0 has exited */
KT_WORKER(launched)
{
    int want = argc > 1 ? atoi(argv[1]) : -1;
    int st = kolo_init();
    if (st != KOLO_OK) {
        fprintf(stderr, "worker: kolo_init: %s\n", kolo_last_error());
        return 3;
    }
    if (want > 0 && kolo_size() != want) {
        fprintf(stderr, "worker: size %d, expected %d\n", kolo_size(), want);
        return 4;
    }
    int me = kolo_rank(), v = me + 1, sum = 0, n = kolo_size();
    if (kolo_allreduce(&v, &sum, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "worker: allreduce: %s\n", kolo_last_error());
        return 5;
    }
    if (sum != n * (n + 1) / 2) {
        fprintf(stderr, "worker: sum %d\n", sum);
        return 6;
    }
    printf("worker rank %d of %d local %d of %d ok\n", kolo_rank(), n, kolo_local_rank(), kolo_local_size());
    fflush(stdout);
    kolo_shutdown();
    if (argc > 2 && strcmp(argv[2], "linger") == 0 && me != 0) {
        sleep(1);
        printf("worker rank %d outlived rank 0\n", me);
        fflush(stdout);
    }
    return 0;
}

/* Runs argv with a clean launcher environment, captures stdout and stderr into out; returns
 * exit code. */
static int run(char *const argv[], char *out, size_t cap, const char *const *env)
{
    int p[2];
    KT_ASSERT(pipe(p) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        static const char *const drop[] = {"KOLO_RANK", "KOLO_SIZE", "KOLO_RENDEZVOUS", "KOLO_SECRET", "KOLO_JOB_ID",
                                           "RANK", "WORLD_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "SLURM_PROCID"};
        for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) unsetenv(drop[i]);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    out[n] = '\0';
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* argv strings are literals; exec does not modify them */
#define S(x) ((char *)(uintptr_t)(x))

static int have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

KT_TEST(launch_under_openmpi_mpirun, 60)
{
    if (!have("mpirun.openmpi")) {
        printf("  skip: mpirun.openmpi not installed (apt-get install openmpi-bin)\n");
        return;
    }
    static const char *const env[] = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", NULL};
    char out[4096];
    char *argv[] = {S("mpirun.openmpi"), S("-np"), S("3"), S("--oversubscribe"), (char *)kt_self(), S("--worker"), S("launched"), S("3"), NULL};
    int rc = run(argv, out, sizeof(out), env);
    KT_ASSERTF(rc == 0, "mpirun exited %d; output:\n%s", rc, out);
    KT_CONTAINS(out, "worker rank 0 of 3 local 0 of 3 ok");
    KT_CONTAINS(out, "worker rank 2 of 3 local 2 of 3 ok");
}

KT_TEST(launch_under_mpich_mpirun, 60)
{
    if (!have("mpirun.mpich")) {
        printf("  skip: mpirun.mpich not installed (apt-get install mpich)\n");
        return;
    }
    char out[4096];
    char *argv[] = {S("mpirun.mpich"), S("-np"), S("2"), (char *)kt_self(), S("--worker"), S("launched"), S("2"), NULL};
    int rc = run(argv, out, sizeof(out), NULL);
    KT_ASSERTF(rc == 0, "mpirun.mpich exited %d; output:\n%s", rc, out);
    KT_CONTAINS(out, "worker rank 1 of 2 local 1 of 2 ok");
}

/* MPICH's mpirun across "hosts": Hydra's fork launcher starts a proxy per named host here, so
 * the ranks are on two hosts as far as the environment says, and only the PMI connection can
 * tell them where rank 0 serves (src/boot/pmi_rdv.c). Ranks other than 0 outlive rank 0 by a
 * second: Hydra would kill rank 1, on rank 0's proxy, if rank 0 left without PMI's finalize. Then the same
 * under -pmi-port, where rank and size come only through the connection. */
KT_TEST(launch_under_mpich_across_hosts_finds_rank_0_through_pmi, 90)
{
    if (!have("mpirun.mpich")) {
        printf("  skip: mpirun.mpich not installed (apt-get install mpich)\n");
        return;
    }
    static const char *const env[] = {"KOLO_LOG_LEVEL=info", NULL};
    char out[32768];
    char *argv[] = {S("mpirun.mpich"), S("-launcher"), S("fork"), S("-hosts"), S("hosta:2,hostb"), S("-np"), S("3"),
                    (char *)kt_self(), S("--worker"), S("launched"), S("3"), S("linger"), NULL};
    int rc = run(argv, out, sizeof(out), env);
    KT_ASSERTF(rc == 0, "mpirun.mpich exited %d; output:\n%s", rc, out);
    /* two hosts by the environment: the address came through PMI */
    KT_EQ(kt_count(out, "rank 0's address through PMI"), 3);
    KT_EQ(kt_count(out, "job id 'pmi-kvs_"), 3);
    KT_CONTAINS(out, "worker rank 0 of 3 local 0 of 3 ok");
    KT_CONTAINS(out, "worker rank 2 of 3 local 2 of 3 ok");
    /* rank 1 shares rank 0's proxy, which would kill it if rank 0 left without finalize */
    KT_CONTAINS(out, "worker rank 1 outlived rank 0");
    KT_CONTAINS(out, "worker rank 2 outlived rank 0");

    char *port_argv[] = {S("mpirun.mpich"), S("-pmi-port"), S("-launcher"), S("fork"), S("-hosts"), S("hosta:2,hostb"),
                         S("-np"), S("3"), (char *)kt_self(), S("--worker"), S("launched"), S("3"), S("linger"), NULL};
    rc = run(port_argv, out, sizeof(out), env);
    KT_ASSERTF(rc == 0, "mpirun.mpich -pmi-port exited %d; output:\n%s", rc, out);
    KT_EQ(kt_count(out, "rank 0's address through PMI"), 3);
    KT_CONTAINS(out, "worker rank 0 of 3 local 0 of 3 ok");
    KT_CONTAINS(out, "worker rank 2 of 3 local 2 of 3 ok");
    KT_CONTAINS(out, "worker rank 1 outlived rank 0");
    KT_CONTAINS(out, "worker rank 2 outlived rank 0");
}

/* [*first, return): up to 16384 ports just below the kernel's ephemeral range (bind(0) and
 * connect() take theirs from it), or above it where the range starts too low to leave room. */
static int port_window(int *first)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
        fclose(f);
    }
    if (lo - 1024 >= 64) {
        *first = lo - 16384 > 1024 ? lo - 16384 : 1024;
        return lo;
    }
    *first = hi + 1;
    return 65536;
}

static int bound_socket(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

/* A port for a program that binds it later (torchrun's MASTER_PORT, a store's), with its
 * neighbour (port + 1) free too: kolo's rank 0 serves at MASTER_PORT + 1 under torchrun. Taken
 * outside the ephemeral range (port_window): a port found with bind(0) and closed is back in
 * that range, where any socket's bind(0) or connect() could take it before the program binds it
 * (make test runs the Python suites beside these tests). keep: return the port's socket, listening (the caller
 * holds the port), else close it and return 0. Fails the test when none is found. */
static int listen_port_pair(int *port, int keep)
{
    int first, end = port_window(&first);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
    for (int tries = 0; tries < 500 && end - first >= 64; tries++) {
        int p = first + (int)(rand_r(&seed) % (unsigned)(end - 1 - first));
        int a = bound_socket(p), b = a >= 0 ? bound_socket(p + 1) : -1;
        if (b >= 0) close(b);
        if (a >= 0 && b >= 0) {
            *port = p;
            if (!keep) {
                close(a);
                return 0;
            }
            KT_ASSERT(listen(a, 8) == 0);
            return a;
        }
        if (a >= 0) close(a);
    }
    KT_ASSERTF(0, "no free pair of ports outside the ephemeral range (tried %d-%d)", first, end - 1);
    return -1;
}

KT_TEST(launch_under_torchrun, 90)
{
    if (!have("torchrun")) {
        printf("  skip: torchrun not installed (apt-get install python3-torch)\n");
        return;
    }
    /* torchrun serves its own store on MASTER_PORT; kolo must rendezvous elsewhere.
     * "--redirects 1 --tee 1": Debian's torch 1.13 on Python 3.11 cannot parse its own default
     * "0" (Python 3.11's Flag iteration skips the zero member), so we ask for stdout teeing. */
    char out[8192], port[16];
    int p;
    listen_port_pair(&p, 0);
    snprintf(port, sizeof(port), "%d", p);
    char *argv[] = {S("torchrun"), S("--nnodes"), S("1"), S("--nproc_per_node"), S("2"), S("--master_addr"), S("127.0.0.1"),
                    S("--master_port"), port, S("--redirects"), S("1"), S("--tee"), S("1"), S("--no_python"),
                    (char *)kt_self(), S("--worker"), S("launched"), S("2"), NULL};
    setenv("TMPDIR", kt_scratch(), 1); /* torchrun's log directories (torchelastic_*) go there */
    int rc = run(argv, out, sizeof(out), NULL);
    KT_ASSERTF(rc == 0, "torchrun exited %d; output:\n%s", rc, out);
    KT_CONTAINS(out, "]:worker rank 0 of 2 local 0 of 2 ok");
    KT_CONTAINS(out, "]:worker rank 1 of 2 local 1 of 2 ok");
}

/* Environments exactly as the launchers set them, ranks forked here; the store's port as
 * listen_port_pair picks it. */
static int free_port(void)
{
    int p;
    listen_port_pair(&p, 0);
    return p;
}

typedef struct envjob {
    const char *kind;
    int n;
    int port;
} envjob;

static void env_rank(int rank, void *arg)
{
    envjob *j = arg;
    char b[64];
    /* kt_job set KOLO_*: this job must be found through the other launcher's variables only */
    unsetenv("KOLO_RANK");
    unsetenv("KOLO_SIZE");
    unsetenv("KOLO_RENDEZVOUS");
    unsetenv("KOLO_SECRET");
    unsetenv("KOLO_JOB_ID");
    if (!strcmp(j->kind, "slurm")) {
        snprintf(b, sizeof(b), "%d", rank);
        setenv("SLURM_PROCID", b, 1);
        setenv("SLURM_LOCALID", b, 1);
        snprintf(b, sizeof(b), "%d", j->n);
        setenv("SLURM_NTASKS", b, 1);
        setenv("SLURM_TASKS_PER_NODE", b, 1);
        setenv("SLURM_NODEID", "0", 1);
        setenv("SLURM_NNODES", "1", 1);
        setenv("SLURM_STEP_NODELIST", "localhost", 1);
        snprintf(b, sizeof(b), "%d", 40000 + (int)(getppid() % 9000));
        setenv("SLURM_JOB_ID", b, 1);
        setenv("SLURM_STEP_ID", "0", 1);
    } else if (!strcmp(j->kind, "byhand")) { /* kolo's own variables, no launcher: rank 0 serves */
        snprintf(b, sizeof(b), "%d", rank);
        setenv("KOLO_RANK", b, 1);
        snprintf(b, sizeof(b), "%d", j->n);
        setenv("KOLO_SIZE", b, 1);
        snprintf(b, sizeof(b), "127.0.0.1:%d", j->port);
        setenv("KOLO_RENDEZVOUS", b, 1);
        setenv("KOLO_RENDEZVOUS_SERVER", "rank0", 1);
    } else if (!strcmp(j->kind, "horovod")) {
        snprintf(b, sizeof(b), "%d", rank);
        setenv("HOROVOD_RANK", b, 1);
        setenv("HOROVOD_LOCAL_RANK", b, 1);
        snprintf(b, sizeof(b), "%d", j->n);
        setenv("HOROVOD_SIZE", b, 1);
        setenv("HOROVOD_LOCAL_SIZE", b, 1);
        setenv("HOROVOD_CROSS_RANK", "0", 1);
        setenv("HOROVOD_CROSS_SIZE", "1", 1);
        snprintf(b, sizeof(b), "127.0.0.1:%d", j->port);
        setenv("KOLO_RENDEZVOUS", b, 1);
    } else { /* torchrun's variables, with its store really occupying MASTER_PORT */
        snprintf(b, sizeof(b), "%d", rank);
        setenv("RANK", b, 1);
        setenv("LOCAL_RANK", b, 1);
        snprintf(b, sizeof(b), "%d", j->n);
        setenv("WORLD_SIZE", b, 1);
        setenv("LOCAL_WORLD_SIZE", b, 1);
        setenv("GROUP_RANK", "0", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        snprintf(b, sizeof(b), "%d", j->port);
        setenv("MASTER_PORT", b, 1);
        setenv("TORCHELASTIC_RUN_ID", "kt", 1);
        setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
    }
    KT_OK(kolo_init());
    KT_EQ(kolo_rank(), rank);
    KT_EQ(kolo_size(), j->n);
    int v = 1, s = 0;
    KT_OK(kolo_allreduce(&v, &s, 1, KOLO_INT32, KOLO_SUM, 1, 1, KOLO_WORLD));
    KT_EQ(s, j->n);
}

KT_TEST(launch_with_slurm_environment, 30)
{
    envjob j = {"slurm", 3, 0};
    kt_job_opts o = {.no_store = 1};
    KT_EQ(kt_job(3, env_rank, &j, &o, NULL), 0);
}

KT_TEST(launch_with_horovod_environment, 30)
{
    envjob j = {"horovod", 2, free_port()};
    kt_job_opts o = {.no_store = 1};
    KT_EQ(kt_job(2, env_rank, &j, &o, NULL), 0);
}

KT_TEST(launch_by_hand_with_rank_0_serving_the_store, 30)
{
    envjob j = {"byhand", 3, free_port()};
    kt_job_opts o = {.no_store = 1};
    KT_EQ(kt_job(3, env_rank, &j, &o, NULL), 0);
}

KT_TEST(launch_with_torchrun_environment_leaves_master_port_alone, 60)
{
    /* a stand-in for torchrun's TCPStore holds MASTER_PORT for the whole job */
    int port, fd = listen_port_pair(&port, 1);
    KT_ASSERT(fd >= 0);
    envjob j = {"torch", 2, port};
    kt_job_opts o = {.no_store = 1, .env = {"KOLO_START_TIMEOUT=10"}};
    KT_EQ(kt_job(2, env_rank, &j, &o, NULL), 0);
    close(fd);
}
