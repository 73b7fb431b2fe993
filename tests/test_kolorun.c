/* test_kolorun.c - the launcher, run as a user runs it: arguments, worker environment, output, exit codes, teardown.
 *
 * Each test starts build/bin/kolorun with `sh -c` workers and checks what comes out. Tests
 * that check "nothing is left" make the test process a child subreaper first: every process
 * kolorun started (and their children) then becomes ours when orphaned, so "waitpid(-1)
 * says ECHILD" proves that no descendant is alive and none is an unreaped zombie. */
#include "kt.h"

#include "../src/boot/store.h"
#include "../src/common/common.h"
#include "../src/net/transport.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- running kolorun ---- */

typedef kt_proc kproc;

static double now_s(void) { return kt_now(); }

static const char *kolorun_path(void)
{
    static char path[4096];
    snprintf(path, sizeof(path), "%s/bin/kolorun", kt_build_dir());
    return path;
}

static void subreaper(void) { KT_ASSERT(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }

/* Starts kolorun with args (NULL-terminated, without the program name). */
static void kp_start(kproc *p, const char *const *args, bool stdin_pipe)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = kolorun_path();
    for (int k = 0; args[k] && n < 63; k++) argv[n++] = args[k];
    argv[n] = NULL;
    kt_proc_opts o = {.stdin_pipe = stdin_pipe};
    kt_proc_start(p, argv, &o);
}

static int run(kproc *p, const char *const *args, double timeout)
{
    kp_start(p, args, false);
    return kt_proc_finish(p, timeout);
}

/* With the test as subreaper: waits until no descendant is left at all. */
static void assert_no_descendants(double timeout)
{
    double end = now_s() + timeout;
    for (;;) {
        int st;
        pid_t r = waitpid(-1, &st, WNOHANG);
        if (r < 0 && errno == ECHILD) return;
        if (r > 0) continue;
        if (now_s() > end) {
            char cmd[128];
            snprintf(cmd, sizeof(cmd), "ps -o pid,ppid,pgid,stat,args --ppid %d >&2", (int)getpid());
            if (system(cmd)) {}
            kt_fail(__FILE__, __LINE__, "processes left %.1f s after kolorun ended", timeout);
        }
        usleep(10000);
    }
}

/* Collects "name=value" out of lines "[rank]<stdout>:name=value" for one rank. */
static bool rank_var(const char *out, int rank, const char *name, char *val, size_t cap)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "[%d]<stdout>:%s=", rank, name);
    for (const char *s = out; (s = strstr(s, pat)); s++) {
        if (s != out && s[-1] != '\n') continue;
        s += strlen(pat);
        size_t n = strcspn(s, "\n");
        snprintf(val, cap, "%.*s", (int)n, s);
        return true;
    }
    return false;
}

static void expect_var(const char *out, int rank, const char *name, const char *want)
{
    char v[4096];
    if (!rank_var(out, rank, name, v, sizeof(v))) kt_fail(__FILE__, __LINE__, "rank %d has no %s", rank, name);
    if (strcmp(v, want) != 0) kt_fail(__FILE__, __LINE__, "rank %d: %s='%s', expected '%s'", rank, name, v, want);
}

static void expect_vari(const char *out, int rank, const char *name, int want)
{
    char w[32];
    snprintf(w, sizeof(w), "%d", want);
    expect_var(out, rank, name, w);
}

static char *tmpdir(void)
{
    static char d[4200];
    snprintf(d, sizeof(d), "%s/kolorun-XXXXXX", kt_scratch());
    KT_ASSERT(mkdtemp(d) != NULL);
    return d;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    KT_ASSERT(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

/* ---- command line ---- */

KT_TEST(kolorun_usage_errors_exit_2_and_start_nothing, 20)
{
    char *d = tmpdir();
    char marker[128], worker[256], hf[128];
    snprintf(marker, sizeof(marker), "%s/started", d);
    snprintf(worker, sizeof(worker), "touch %s", marker);
    snprintf(hf, sizeof(hf), "%s/hosts", d);
    write_file(hf, "# two hosts\nlocalhost slots=2\nnode2 slots=two\n", 0644);
    /* a comment longer than a line may be: its tail was once read as a host of its own */
    char longhf[128], longline[4200];
    snprintf(longhf, sizeof(longhf), "%s/long", d);
    memset(longline, 'x', 4095);
    longline[0] = '#';
    snprintf(longline + 4095, sizeof(longline) - 4095, "evil slots=9\nlocalhost slots=1\n");
    write_file(longhf, longline, 0644);
    struct {
        const char *args[12];
        const char *says;
    } cases[] = {
        {{NULL}, "no command"},
        {{"-np", "2", NULL}, "no command"},
        {{"-np", "0", "sh", "-c", worker, NULL}, "-np"},
        {{"-np", "abc", "sh", "-c", worker, NULL}, "'abc'"},
        {{"--bogus", "sh", "-c", worker, NULL}, "unknown option '--bogus'"},
        {{"sh", "-c", worker, NULL}, "-np is required"},
        {{"-np", "3", "-H", "localhost:1,127.0.0.1:1", "sh", "-c", worker, NULL}, "-np 3 is more than the 2 slots"},
        {{"-np", "1", "-H", "localhost:x", "sh", "-c", worker, NULL}, "item 1"},
        {{"-np", "1", "-H", "localhost:1,,b:1", "sh", "-c", worker, NULL}, "item 2"},
        {{"-np", "1", "-H", "a:1,a:2", "sh", "-c", worker, NULL}, "listed twice"},
        {{"-np", "1", "--hostfile", hf, "sh", "-c", worker, NULL}, "hosts:3"},
        {{"-np", "1", "--hostfile", "/nonexistent/hosts", "sh", "-c", worker, NULL}, "/nonexistent/hosts"},
        {{"-np", "1", "--hostfile", longhf, "sh", "-c", worker, NULL}, "long:1: line longer than 4095 bytes"},
        {{"-np", "1", "-H", "localhost:1", "--hostfile", hf, "sh", "-c", worker, NULL}, "not both"},
        {{"-np", "1", "-x", "1BAD=2", "sh", "-c", worker, NULL}, "not a variable name"},
        {{"-np", "1", "--bind-to", "cache", "sh", "-c", worker, NULL}, "auto|none|core|socket|numa"},
        {{"-np", "1", "--tag-output=loud", "sh", "-c", worker, NULL}, "none|rank"},
        {{"-np", "1", "--fusion-threshold-mb", "-1", "sh", "-c", worker, NULL}, "--fusion-threshold-mb"},
        {{"-np", "1", "--log-level", "chatty", "sh", "-c", worker, NULL}, "--log-level"},
        {{"-np", "1", "--autotune-bayes-opt-max-samples", "65", "sh", "-c", worker, NULL}, "1..64"},
        {{"-np", "1", "--autotune-steps-per-sample", "0", "sh", "-c", worker, NULL}, "--autotune-steps-per-sample"},
        {{"-np", "1", "--get-stack-traces", "sh", "-c", worker, NULL}, "give --timeout too"},
        {{"-np", "1", "--timeout", "0", "sh", "-c", worker, NULL}, "--timeout"},
        {{"-np", "1", "--mpi", "sh", "-c", worker, NULL}, "run mpirun directly"},
        {{"-np", "1", "--output-ranks", "0,x", "sh", "-c", worker, NULL}, "item 2 of '0,x'"},
        {{"-np", "1", "--output-ranks", "3-1", "sh", "-c", worker, NULL}, "not a range"},
        {{"-np", "1", "--output-ranks", "1- 5", "sh", "-c", worker, NULL}, "item 1 of '1- 5' is not a range"},
        {{"-np", "1", "--output-ranks", " 1", "sh", "-c", worker, NULL}, "item 1 of ' 1' is not a rank"},
        {{"-np", "1", "--output-ranks", "0,+2", "sh", "-c", worker, NULL}, "item 2 of '0,+2' is not a rank"},
        {{"-np", "1", "--torus-allreduce", "sh", "-c", worker, NULL}, "no torus allreduce"},
        {{"-np", "1", "--num-nccl-streams", "2", "sh", "-c", worker, NULL}, "no NCCL"},
        {{"-np", "1", "--start-timeout", NULL}, "needs a value"},
        {{"-np", "1", "--no-stall-check=1", "true", NULL}, "takes no value"},
        {{"-np", "1", "--local-address", "127.0.0.1", "true", NULL}, "not a non-loopback address of this machine"},
        {{"-np", "1", "--local-address", "192.0.2.254", "true", NULL}, "'192.0.2.254'"},
        {{"-np", "1", "--launcher", "rsh", "true", NULL}, "--launcher: 'rsh' is neither ssh nor srun"},
        {{"-np", "1", "--launcher", "srun", "true", NULL}, "--launcher srun starts workers as steps of a Slurm job"},
    };
    for (size_t c = 0; c < KOLO_ARRAY_SIZE(cases); c++) {
        kproc p;
        int code = run(&p, cases[c].args, 10);
        KT_ASSERTF(code == 2, "case %zu: exit %d, expected 2; stderr: %s", c, code, p.ebuf);
        KT_ASSERTF(kt_count(p.ebuf, "\n") == 1, "case %zu: expected one line on stderr, got: %s", c, p.ebuf);
        KT_ASSERTF(strncmp(p.ebuf, "kolorun: error: ", 16) == 0, "case %zu: %s", c, p.ebuf);
        KT_ASSERTF(strstr(p.ebuf, cases[c].says), "case %zu: '%s' does not say '%s'", c, p.ebuf, cases[c].says);
        KT_EQ(p.olen, 0);
        KT_ASSERTF(access(marker, F_OK) != 0, "case %zu started a worker", c);
    }
}

/* Inside a batch job's allocation (Slurm, PBS, LSF) kolorun takes its hosts and slots when no -H
 * or --hostfile is given (the allocation on two hosts runs in test_multihost.c); one of this
 * host alone changes nothing (-np may still exceed its slots); what cannot be read is named. */
KT_TEST(kolorun_reads_batch_allocations, 30)
{
    char *d = tmpdir(), nodefile[128], badfile[128];
    snprintf(nodefile, sizeof(nodefile), "%s/nodefile", d);
    snprintf(badfile, sizeof(badfile), "%s/badfile", d);
    write_file(nodefile, "nodeA\nnodeA\nnodeB\n", 0644);
    write_file(badfile, "nodeA\n-oProxyCommand=x\n", 0644);
    static const char *const vars[] = {"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
                                       "SLURM_JOB_CPUS_PER_NODE", "PBS_NODEFILE", "LSB_MCPU_HOSTS"};
    struct {
        const char *env[3]; /* NAME=VALUE */
        const char *np;
        const char *says;
    } bad[] = {
        {{"SLURM_JOB_NODELIST=node[1-2]", "SLURM_TASKS_PER_NODE=2(x2)"}, "5",
         "-np 5 is more than the 4 slots of the Slurm allocation (SLURM_JOB_NODELIST=node[1-2], "
         "SLURM_TASKS_PER_NODE=2(x2)): give -H to place the workers yourself"},
        {{"SLURM_JOB_NODELIST=node[1-2]", "SLURM_JOB_CPUS_PER_NODE=4"}, "2",
         "SLURM_JOB_CPUS_PER_NODE='4' gives no count for node 1 (node2) of node[1-2]"},
        {{"SLURM_NODELIST=node[1-"}, "2", "neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE is set"},
        {{"SLURM_JOB_NODELIST=node[1-", "SLURM_TASKS_PER_NODE=2"}, "2", "SLURM_JOB_NODELIST='node[1-' is not a Slurm host list"},
        {{"PBS_NODEFILE=/nonexistent/nodes"}, "2", "PBS_NODEFILE=/nonexistent/nodes: No such file"},
        {{NULL}, "2", "badfile:2: '-oProxyCommand=x' is not a host name"},
        {{NULL}, "4", "-np 4 is more than the 3 slots of the PBS allocation"},
        {{"LSB_MCPU_HOSTS=nodeA 2 nodeB"}, "2", "LSB_MCPU_HOSTS='nodeA 2 nodeB' is not 'host slots host slots ...'"},
        /* a name Slurm would not make reached ssh as an option; a long range took minutes */
        {{"SLURM_JOB_NODELIST=-oops[1-2]", "SLURM_TASKS_PER_NODE=1(x2)"}, "2", "node 0 '-oops1' is not a host name"},
        {{"SLURM_JOB_NODELIST=n[1-100000]", "SLURM_TASKS_PER_NODE=1(x100000)"}, "100001",
         "-np 100001 is more than the 100000 slots of the Slurm allocation"},
    };
    for (size_t c = 0; c < KOLO_ARRAY_SIZE(bad); c++) {
        for (size_t v = 0; v < KOLO_ARRAY_SIZE(vars); v++) unsetenv(vars[v]);
        for (int e = 0; e < 3 && bad[c].env[e]; e++) putenv((char *)(uintptr_t)bad[c].env[e]);
        if (c == 5) setenv("PBS_NODEFILE", badfile, 1);
        if (c == 6) setenv("PBS_NODEFILE", nodefile, 1);
        const char *args[] = {"-np", bad[c].np, "true", NULL};
        kproc p;
        int code = run(&p, args, 10);
        KT_ASSERTF(code == 2, "case %zu: exit %d, expected 2; stderr: %s", c, code, p.ebuf);
        KT_ASSERTF(strstr(p.ebuf, bad[c].says), "case %zu: '%s' does not say '%s'", c, p.ebuf, bad[c].says);
    }
    for (size_t v = 0; v < KOLO_ARRAY_SIZE(vars); v++) unsetenv(vars[v]);

    /* this host alone: the default placement, oversubscribed if asked; without -np, its slots */
    setenv("SLURM_JOB_NODELIST", "localhost", 1);
    setenv("SLURM_TASKS_PER_NODE", "2", 1);
    const char *three[] = {"-np", "3", "sh", "-c", "echo size=$KOLO_SIZE", NULL};
    kproc p;
    KT_EQ(run(&p, three, 10), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:size=3\n"), 3);
    KT_ASSERTF(!strstr(p.ebuf, "hosts from"), "%s", p.ebuf);
    const char *all[] = {"sh", "-c", "echo size=$KOLO_SIZE", NULL};
    KT_EQ(run(&p, all, 10), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:size=2\n"), 2);

    /* -H wins over an allocation of other hosts */
    setenv("SLURM_JOB_NODELIST", "node[1-2]", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
    const char *h[] = {"-H", "localhost:2", "sh", "-c", "echo size=$KOLO_SIZE", NULL};
    KT_EQ(run(&p, h, 10), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:size=2\n"), 2);
    KT_ASSERTF(!strstr(p.ebuf, "hosts from"), "%s", p.ebuf);
}

/* --local-address: this machine's workers reach the store there (a driver whose remote hosts
 * come later, and no default route to guess from: kolo.ray's elastic executor) */
KT_TEST(kolorun_local_address_is_where_local_workers_reach_the_store, 20)
{
    char addr[64] = "";
    if (kolo__iface_address("", addr, sizeof(addr)) != KOLO_OK) { /* the first up IPv4 but lo, docker */
        fprintf(stderr, "  no non-loopback IPv4 address here: nothing to check\n");
        return;
    }
    for (int elastic = 0; elastic < 2; elastic++) {
        const char *plain[] = {"--local-address", addr, "-np", "2", "sh", "-c", "echo at $KOLO_RENDEZVOUS", NULL};
        const char *el[] = {"--local-address", addr, "-np", "2", "--min-np", "2", "sh", "-c",
                            "echo at $KOLO_RENDEZVOUS", NULL};
        kproc p;
        KT_EQ(run(&p, elastic ? el : plain, 10), 0);
        char want[96];
        snprintf(want, sizeof(want), "<stdout>:at %s:", addr);
        KT_ASSERTF(kt_count(p.obuf, want) == 2, "elastic %d: %s", elastic, p.obuf);
    }
}

KT_TEST(kolorun_command_not_found_127_not_executable_126, 10)
{
    kproc p;
    const char *a1[] = {"-np", "2", "kolo-no-such-command-xyz", NULL};
    KT_EQ(run(&p, a1, 5), 127);
    KT_CONTAINS(p.ebuf, "kolo-no-such-command-xyz");
    KT_EQ(kt_count(p.ebuf, "\n"), 1);
    const char *a2[] = {"-np", "1", "./no/such/path", NULL};
    KT_EQ(run(&p, a2, 5), 127);
    char *d = tmpdir(), f[128];
    snprintf(f, sizeof(f), "%s/notexec", d);
    write_file(f, "#!/bin/sh\necho hi\n", 0644);
    const char *a3[] = {"-np", "1", f, NULL};
    KT_EQ(run(&p, a3, 5), 126);
    KT_CONTAINS(p.ebuf, "not an executable");
}

/* s with every run of white space (newlines and the indents of folded lines too) one space */
static char *squeezed(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    KT_ASSERT(out);
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) *o++ = *s;
        else if (o > out && o[-1] != ' ') *o++ = ' ';
    *o = 0;
    return out;
}

KT_TEST(kolorun_help_env_check_build_version, 10)
{
    kproc p;
    const char *a1[] = {"--help-env", NULL};
    KT_EQ(run(&p, a1, 5), 0);
    size_t n;
    const kolo__setting_info *t = kolo__setting_table(&n);
    char *all = squeezed(p.obuf);
    for (size_t i = 0; i < n; i++) {
        KT_CONTAINS(p.obuf, t[i].name);
        char *help = squeezed(t[i].help); /* every word of it, folded to the terminal's width */
        KT_CONTAINS(all, help);
        free(help);
        if (t[i].aliases[0]) KT_CONTAINS(p.obuf, t[i].aliases);
    }
    free(all);
    for (const char *l = p.obuf; *l;) { /* no line wider than the fold (96) */
        size_t len = strcspn(l, "\n");
        KT_ASSERTF(len <= 96, "a line of %zu characters: %.*s", len, (int)len, l);
        l += len + (l[len] == '\n');
    }
    KT_CONTAINS(p.obuf, "    auto: from 32 KiB the receiver of each pair times both ways");
    KT_CONTAINS(p.obuf, "default: 64M");
    const char *a2[] = {"--check-build", NULL};
    KT_EQ(run(&p, a2, 5), 0);
    KT_CONTAINS(p.obuf, KOLO_VERSION_STRING);
    KT_CONTAINS(p.obuf, "[X] shm");
    KT_CONTAINS(p.obuf, "[X] tcp");
    KT_CONTAINS(p.obuf, "mpirun");
    KT_CONTAINS(p.obuf, "[X] PyTorch");
    KT_CONTAINS(p.obuf, "[X] TensorFlow/Keras");
    KT_CONTAINS(p.obuf, "[X] Spark");
    const char *a3[] = {"--help", NULL};
    KT_EQ(run(&p, a3, 5), 0);
    KT_CONTAINS(p.obuf, "usage: kolorun -np N");
    const char *a4[] = {"--version", NULL};
    KT_EQ(run(&p, a4, 5), 0);
    KT_CONTAINS(p.obuf, KOLO_VERSION_STRING);
}

/* ---- the workers' environment ---- */

static const char print_env[] =
    "for v in KOLO_RANK KOLO_SIZE KOLO_LOCAL_RANK KOLO_LOCAL_SIZE KOLO_CROSS_RANK KOLO_CROSS_SIZE KOLO_HOSTNAME "
    "KOLO_RENDEZVOUS KOLO_SECRET KOLO_JOB_ID HOROVOD_RANK HOROVOD_SIZE HOROVOD_LOCAL_RANK HOROVOD_LOCAL_SIZE "
    "HOROVOD_CROSS_RANK HOROVOD_CROSS_SIZE HOROVOD_HOSTNAME RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK "
    "KOLO_FUSION_THRESHOLD KOLO_CYCLE_TIME KOLO_CACHE_CAPACITY KOLO_TIMELINE KOLO_TIMELINE_MARK_CYCLES "
    "KOLO_STALL_CHECK_DISABLE KOLO_STALL_CHECK_TIME KOLO_STALL_SHUTDOWN_TIME KOLO_LOG_LEVEL KOLO_IFACE "
    "KOLO_START_TIMEOUT KOLO_AUTOTUNE KOLO_AUTOTUNE_LOG KOLO_AUTOTUNE_WARMUP_SAMPLES KOLO_AUTOTUNE_STEPS_PER_SAMPLE "
    "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE KOLO_TRANSPORT KOLO_LOG_TIME "
    "KOLO_HIERARCHICAL_ALLREDUCE KOLO_HIERARCHICAL_ALLGATHER KOLO_STACK_TRACES KT_PASSED KT_X1 KT_X2 KT_OVERRIDE MASTER_ADDR MASTER_PORT; do "
    "eval \"[ -n \\\"\\${$v+x}\\\" ] && echo $v=\\$$v\"; done; true; ";

KT_TEST(kolorun_worker_environment, 20)
{
    char *d = tmpdir(), done[128], script[8192];
    snprintf(done, sizeof(done), "%s/done", d);
    /* the workers wait, so that the test can talk to the store they were given */
    snprintf(script, sizeof(script), "%s echo ready; while [ ! -e %s ]; do sleep 0.02; done", print_env, done);
    setenv("KT_PASSED", "from-user-env", 1);
    setenv("KT_X2", "from-x-without-value", 1);
    setenv("KT_OVERRIDE", "old", 1);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    const char *args[] = {"-np", "3", "-x", "KT_X1=one=1", "-x", "KT_X2", "-x", "KT_OVERRIDE=new",
                          "--fusion-threshold-mb", "2", "--cycle-time-ms", "3.5", "--cache-capacity", "7",
                          "--timeline-filename", "/tmp/kt-tl.json", "--timeline-mark-cycles", "--no-stall-check",
                          "--stall-check-warning-time-seconds", "9", "--stall-check-shutdown-time-seconds", "11",
                          "--log-level", "DEBUG", "--network-interface", "lo", "--start-timeout", "12",
                          "--autotune", "--autotune-log-file", "/tmp/kt-at.csv", "--autotune-warmup-samples", "0",
                          "--autotune-steps-per-sample", "4", "--autotune-bayes-opt-max-samples", "9",
                          "--autotune-gaussian-process-noise", "0.5", "--tcp", "--gloo", "--disable-cache",
                          "--no-hierarchical-allreduce", "--hierarchical-allgather", "--log-with-timestamp", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "<stdout>:ready", 3, 10);

    char secret[256], job[256], rdv[256];
    KT_ASSERT(rank_var(p.obuf, 0, "KOLO_SECRET", secret, sizeof(secret)));
    KT_ASSERT(rank_var(p.obuf, 0, "KOLO_JOB_ID", job, sizeof(job)));
    KT_ASSERT(rank_var(p.obuf, 0, "KOLO_RENDEZVOUS", rdv, sizeof(rdv)));
    KT_EQ(strlen(secret), 64);
    KT_ASSERT(strspn(secret, "0123456789abcdef") == 64);
    KT_ASSERT(strlen(job) > 8);
    for (int r = 0; r < 3; r++) {
        static const char *const pre[] = {"KOLO_", "HOROVOD_"};
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof(name), "%sRANK", pre[k]);
            expect_vari(p.obuf, r, name, r);
            snprintf(name, sizeof(name), "%sSIZE", pre[k]);
            expect_vari(p.obuf, r, name, 3);
            snprintf(name, sizeof(name), "%sLOCAL_RANK", pre[k]);
            expect_vari(p.obuf, r, name, r);
            snprintf(name, sizeof(name), "%sLOCAL_SIZE", pre[k]);
            expect_vari(p.obuf, r, name, 3);
            snprintf(name, sizeof(name), "%sCROSS_RANK", pre[k]);
            expect_vari(p.obuf, r, name, 0);
            snprintf(name, sizeof(name), "%sCROSS_SIZE", pre[k]);
            expect_vari(p.obuf, r, name, 1);
            char host[256];
            snprintf(name, sizeof(name), "%sHOSTNAME", pre[k]);
            KT_ASSERT(gethostname(host, sizeof(host)) == 0);
            expect_var(p.obuf, r, name, host);
        }
        expect_vari(p.obuf, r, "RANK", r);
        expect_vari(p.obuf, r, "WORLD_SIZE", 3);
        expect_vari(p.obuf, r, "LOCAL_RANK", r);
        expect_vari(p.obuf, r, "LOCAL_WORLD_SIZE", 3);
        expect_vari(p.obuf, r, "GROUP_RANK", 0);
        expect_var(p.obuf, r, "KOLO_SECRET", secret);
        expect_var(p.obuf, r, "KOLO_JOB_ID", job);
        expect_var(p.obuf, r, "KOLO_RENDEZVOUS", rdv);
        expect_var(p.obuf, r, "KOLO_FUSION_THRESHOLD", "2097152");
        expect_var(p.obuf, r, "KOLO_CYCLE_TIME", "3.5");
        expect_var(p.obuf, r, "KOLO_CACHE_CAPACITY", "7");
        expect_var(p.obuf, r, "KOLO_TIMELINE", "/tmp/kt-tl.json");
        expect_var(p.obuf, r, "KOLO_TIMELINE_MARK_CYCLES", "1");
        expect_var(p.obuf, r, "KOLO_STALL_CHECK_DISABLE", "1");
        expect_var(p.obuf, r, "KOLO_STALL_CHECK_TIME", "9");
        expect_var(p.obuf, r, "KOLO_STALL_SHUTDOWN_TIME", "11");
        expect_var(p.obuf, r, "KOLO_LOG_LEVEL", "debug");
        expect_var(p.obuf, r, "KOLO_IFACE", "lo");
        expect_var(p.obuf, r, "KOLO_START_TIMEOUT", "12");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE", "1");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE_LOG", "/tmp/kt-at.csv");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE_WARMUP_SAMPLES", "0");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "4");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "9");
        expect_var(p.obuf, r, "KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.5");
        expect_var(p.obuf, r, "KOLO_TRANSPORT", "tcp");
        expect_var(p.obuf, r, "KOLO_LOG_TIME", "1");
        expect_var(p.obuf, r, "KOLO_HIERARCHICAL_ALLREDUCE", "0");
        expect_var(p.obuf, r, "KOLO_HIERARCHICAL_ALLGATHER", "1");
        char st[16];
        KT_ASSERTF(!rank_var(p.obuf, r, "KOLO_STACK_TRACES", st, sizeof(st)), "KOLO_STACK_TRACES without the option");
        expect_var(p.obuf, r, "KT_PASSED", "from-user-env");
        expect_var(p.obuf, r, "KT_X1", "one=1");
        expect_var(p.obuf, r, "KT_X2", "from-x-without-value");
        expect_var(p.obuf, r, "KT_OVERRIDE", "new");
        char v[64];
        KT_ASSERTF(!rank_var(p.obuf, r, "MASTER_ADDR", v, sizeof(v)), "MASTER_ADDR must not be set");
        KT_ASSERTF(!rank_var(p.obuf, r, "MASTER_PORT", v, sizeof(v)), "MASTER_PORT must not be set");
    }
    /* the rendezvous address is a live store that knows the secret */
    char host[128];
    int port = 0;
    KT_ASSERTF(sscanf(rdv, "%127[^:]:%d", host, &port) == 2 && port > 0, "KOLO_RENDEZVOUS=%s", rdv);
    KT_EQ(strcmp(host, "127.0.0.1"), 0);
    kolo__store *c = NULL;
    KT_OK(kolo__store_connect(&c, host, port, secret, strlen(secret), 5));
    KT_OK(kolo__store_set(c, "kt-key", "v", 1));
    void *val = NULL;
    size_t len = 0;
    KT_OK(kolo__store_get(c, "kt-key", &val, &len, 1));
    KT_EQ(len, 1);
    kolo__free(val);
    kolo__store_close(c);
    kolo__store *bad = NULL;
    KT_ASSERT(kolo__store_connect(&bad, host, port, "wrong", 5, 2) != 0);

    write_file(done, "", 0644);
    KT_EQ(kt_proc_finish(&p, 10), 0);

    /* a second job gets its own secret and id (and the hierarchical allreduce on, allgather off) */
    unlink(done);
    write_file(done, "", 0644);
    kproc q;
    const char *args2[] = {"-np", "1", "--hierarchical-allreduce", "--no-hierarchical-allgather", "sh", "-c",
                           print_env, NULL};
    KT_EQ(run(&q, args2, 10), 0);
    expect_var(q.obuf, 0, "KOLO_HIERARCHICAL_ALLREDUCE", "1");
    expect_var(q.obuf, 0, "KOLO_HIERARCHICAL_ALLGATHER", "0");
    char secret2[256], job2[256];
    KT_ASSERT(rank_var(q.obuf, 0, "KOLO_SECRET", secret2, sizeof(secret2)));
    KT_ASSERT(rank_var(q.obuf, 0, "KOLO_JOB_ID", job2, sizeof(job2)));
    KT_ASSERT(strcmp(secret, secret2) != 0);
    KT_ASSERT(strcmp(job, job2) != 0);
}

KT_TEST(kolorun_hostfile_places_ranks_host_major, 15)
{
    /* two names of this machine: both local, placed as two hosts */
    char *d = tmpdir(), hf[128];
    snprintf(hf, sizeof(hf), "%s/hosts", d);
    write_file(hf, "# the first host\n  localhost slots=2   # comment\n\n127.0.0.1:2\n", 0644);
    const char *args[] = {"-np", "3", "--hostfile", hf, "sh", "-c", print_env, NULL};
    kproc p;
    KT_EQ(run(&p, args, 10), 0);
    int lr[] = {0, 1, 0}, ls[] = {2, 2, 1}, cr[] = {0, 0, 1}, cs[] = {2, 1, 2}, gr[] = {0, 0, 1};
    const char *hn[] = {"localhost", "localhost", "127.0.0.1"};
    for (int r = 0; r < 3; r++) {
        expect_vari(p.obuf, r, "KOLO_LOCAL_RANK", lr[r]);
        expect_vari(p.obuf, r, "KOLO_LOCAL_SIZE", ls[r]);
        expect_vari(p.obuf, r, "KOLO_CROSS_RANK", cr[r]);
        expect_vari(p.obuf, r, "KOLO_CROSS_SIZE", cs[r]);
        expect_vari(p.obuf, r, "GROUP_RANK", gr[r]);
        expect_var(p.obuf, r, "KOLO_HOSTNAME", hn[r]);
    }
    /* -H with the other syntax, and no -np: every slot */
    const char *args2[] = {"-H", "localhost:1,127.0.0.1:1", "sh", "-c", "echo size=$KOLO_SIZE", NULL};
    KT_EQ(run(&p, args2, 10), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:size=2\n"), 2);
}

/* ---- output ---- */

KT_TEST(kolorun_output_whole_lines_tagged_per_stream, 20)
{
    /* 3 ranks x 400 lines on each stream, written while the others write; lines split over
     * two writes; a last line without newline */
    char x[101], script[1024];
    memset(x, 'x', 100);
    x[100] = '\0';
    snprintf(script, sizeof(script),
             "i=0; x=%s; "
             "while [ $i -lt 400 ]; do echo \"r$KOLO_RANK out $i $x$x$x\"; echo \"r$KOLO_RANK err $i $x\" >&2; "
             "i=$((i+1)); done; printf 'split-'; sleep 0.05; printf 'line-%%s\\n' $KOLO_RANK; "
             "printf 'no-newline-%%s' $KOLO_RANK; printf 'err-tail-%%s' $KOLO_RANK >&2",
             x);
    const char *args[] = {"-np", "3", "sh", "-c", script, NULL};
    kproc p;
    KT_EQ(run(&p, args, 15), 0);
    for (int r = 0; r < 3; r++) {
        char w[64];
        snprintf(w, sizeof(w), "[%d]<stdout>:split-line-%d\n", r, r);
        KT_EQ(kt_count(p.obuf, w), 1);
        snprintf(w, sizeof(w), "[%d]<stdout>:no-newline-%d\n", r, r);
        KT_EQ(kt_count(p.obuf, w), 1);
    }
    /* then every line, in place (the buffers are cut into strings) */
    int next[2][3] = {{0}};
    for (int k = 0; k < 2; k++) {
        char *buf = k ? p.ebuf : p.obuf;
        const char *tag = k ? "err" : "out";
        for (char *line = buf; *line;) {
            char *nl = strchr(line, '\n');
            KT_ASSERTF(nl, "output does not end with a newline: '%s'", line);
            *nl = '\0';
            int r = -1, i = -1, r2 = -1;
            char stream[8], what[8];
            if (sscanf(line, "[%d]<%7[a-z]>:r%d %7s %d", &r, stream, &r2, what, &i) == 5) {
                KT_ASSERTF(r == r2 && strcmp(what, tag) == 0 && strncmp(stream, k ? "stderr" : "stdout", 6) == 0,
                           "mixed line: '%s'", line);
                KT_ASSERTF(i == next[k][r], "rank %d %s line %d came after %d: '%s'", r, tag, i, next[k][r] - 1, line);
                const char *xs = strrchr(line, ' ') + 1;
                KT_EQ(strlen(xs), k ? 100 : 300);
                KT_EQ(strspn(xs, "x"), strlen(xs));
                next[k][r]++;
            } else if (!k) {
                KT_ASSERTF(sscanf(line, "[%d]<stdout>:split-line-%d", &r, &r2) == 2 ||
                               sscanf(line, "[%d]<stdout>:no-newline-%d", &r, &r2) == 2,
                           "unexpected stdout line '%s'", line);
                KT_EQ(r, r2);
            } else {
                KT_ASSERTF(sscanf(line, "[%d]<stderr>:err-tail-%d", &r, &r2) == 2 && r == r2,
                           "unexpected stderr line '%s'", line);
            }
            line = nl + 1;
        }
    }
    for (int r = 0; r < 3; r++) {
        KT_EQ(next[0][r], 400);
        KT_EQ(next[1][r], 400);
    }
}

KT_TEST(kolorun_tag_none_timestamps_and_output_files, 20)
{
    char *d = tmpdir(), dir[128];
    snprintf(dir, sizeof(dir), "%s/logs", d);
    const char *script = "echo \"hello $KOLO_RANK\"; echo \"oops $KOLO_RANK\" >&2; printf 'last'";
    const char *args[] = {"-np", "11", "--tag-output=none", "--output-filename", dir, "sh", "-c", script, NULL};
    kproc p;
    KT_EQ(run(&p, args, 15), 0);
    for (int r = 0; r < 11; r++) {
        char line[64], path[256];
        snprintf(line, sizeof(line), "hello %d\n", r);
        KT_EQ(kt_count(p.obuf, line), 1);
        snprintf(path, sizeof(path), "%s/rank.%02d/stdout", dir, r);
        FILE *f = fopen(path, "r");
        KT_ASSERTF(f, "no %s", path);
        char buf[256] = "";
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
        snprintf(line, sizeof(line), "hello %d\nlast\n", r);
        KT_ASSERTF(strcmp(buf, line) == 0, "%s holds '%s'", path, buf);
        snprintf(path, sizeof(path), "%s/rank.%02d/stderr", dir, r);
        f = fopen(path, "r");
        KT_ASSERTF(f, "no %s", path);
        n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = '\0';
        fclose(f);
        snprintf(line, sizeof(line), "oops %d\n", r);
        KT_ASSERTF(strcmp(buf, line) == 0, "%s holds '%s'", path, buf);
    }
    KT_ASSERT(strstr(p.obuf, "<stdout>") == NULL);
    KT_EQ(kt_count(p.obuf, "last\n"), 11);

    const char *args2[] = {"-np", "1", "--prefix-timestamp", "sh", "-c", "echo stamped", NULL};
    KT_EQ(run(&p, args2, 10), 0);
    int y, mo, da, h, mi, s, ms;
    char rest[64];
    KT_ASSERTF(sscanf(p.obuf, "%4d-%2d-%2dT%2d:%2d:%2d.%3d %63s", &y, &mo, &da, &h, &mi, &s, &ms, rest) == 8,
               "'%s'", p.obuf);
    KT_EQ(strcmp(rest, "[0]<stdout>:stamped"), 0);
}

KT_TEST(kolorun_stdin_goes_to_rank_0_only, 10)
{
    const char *script = "read a; read b; echo \"r$KOLO_RANK:$a,$b\"";
    const char *args[] = {"-np", "2", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, true);
    KT_ASSERT(write(p.in, "hello\nworld\n", 12) == 12);
    close(p.in);
    p.in = -1;
    KT_EQ(kt_proc_finish(&p, 8), 0);
    KT_CONTAINS(p.obuf, "[0]<stdout>:r0:hello,world\n");
    KT_CONTAINS(p.obuf, "[1]<stdout>:r1:,\n");
}

/* ---- exit codes and teardown ---- */

KT_TEST(kolorun_exit_codes, 20)
{
    kproc p;
    const char *ok[] = {"-np", "3", "sh", "-c", "exit 0", NULL};
    KT_EQ(run(&p, ok, 10), 0);
    KT_EQ(p.elen, 0);

    const char *one[] = {"-np", "3", "sh", "-c", "[ $KOLO_RANK = 2 ] && exit 7; exit 0", NULL};
    KT_EQ(run(&p, one, 10), 7);
    KT_CONTAINS(p.ebuf, "rank 2 on host localhost exited with code 7");

    /* ranks 1 and 2 fail together: the lowest rank's code. Rank 2 goes first and rank 1 (spinning
     * on the file rank 2 leaves) right after, so both fall in kolorun's window however the CPUs are
     * shared: released together by one file, rank 1 could end first and a rank 2 that waited for
     * a crowded CPU come after the window (CI, ASan lane beside the Python suites: 2.3 s of CPU
     * waits in the test's 3.2). */
    char *d = tmpdir(), go[128], script[512];
    snprintf(go, sizeof(go), "%s/go", d);
    snprintf(script, sizeof(script),
             "[ $KOLO_RANK = 0 ] && sleep 30; [ $KOLO_RANK = 2 ] && { sleep 0.3; touch %s; exit 4; }; "
             "while [ ! -e %s ]; do :; done; exit 3", go, go);
    const char *two[] = {"-np", "3", "sh", "-c", script, NULL};
    KT_EQ(run(&p, two, 10), 3);
    KT_CONTAINS(p.ebuf, "rank 1 on host localhost exited with code 3");
    KT_CONTAINS(p.ebuf, "rank 2 on host localhost also failed at the same time: it exited with code 4");
    KT_CONTAINS(p.ebuf, "rank 0: terminated by kolorun after rank 1 failed");

    /* the same, but rank 1's error blames rank 2 in kolo's words: rank 2 is the cause */
    snprintf(go, sizeof(go), "%s/go2", d);
    snprintf(script, sizeof(script),
             "[ $KOLO_RANK = 0 ] && sleep 30; [ $KOLO_RANK = 2 ] && { sleep 0.3; echo 'bad input' >&2; touch %s; exit 4; "
             "}; while [ ! -e %s ]; do :; done; echo 'lost rank 2 on h (10.0.0.2): its connection closed' >&2; exit 3",
             go, go);
    const char *blamed[] = {"-np", "3", "sh", "-c", script, NULL};
    KT_EQ(run(&p, blamed, 10), 4);
    KT_CONTAINS(p.ebuf, "rank 2 on host localhost exited with code 4");
    KT_CONTAINS(p.ebuf, "the first failure of this job\nkolorun:   last 1 line of rank 2's stderr:\nkolorun:   | bad input");
    KT_CONTAINS(p.ebuf, "rank 1 on host localhost also failed at the same time: it exited with code 3");

    const char *sig[] = {"-np", "2", "sh", "-c", "[ $KOLO_RANK = 1 ] && kill -KILL $$; sleep 30", NULL};
    KT_EQ(run(&p, sig, 10), 128 + SIGKILL);
    KT_CONTAINS(p.ebuf, "rank 1 on host localhost was killed by SIGKILL");
}

/* The pids ranks 0..n-1 printed as "<word><pid>" lines. */
static void rank_pids(const char *out, const char *word, pid_t *pids, int n)
{
    for (int r = 0; r < n; r++) {
        char pat[64];
        snprintf(pat, sizeof(pat), "[%d]<stdout>:%s", r, word);
        const char *at = strstr(out, pat);
        KT_ASSERTF(at, "no \"%s\" line from rank %d", word, r);
        pids[r] = (pid_t)atoi(at + strlen(pat));
        KT_ASSERT(pids[r] > 0);
    }
}

KT_TEST(kolorun_one_failure_stops_all_within_grace, 20)
{
    subreaper();
    const char *script = "echo \"pid $$\"; if [ $KOLO_RANK = 2 ]; then sleep 0.3; echo 'it broke here' >&2; "
                         "echo 'bad thing' >&2; exit 9; fi; sleep 30";
    const char *args[] = {"-np", "4", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 4, 10);
    pid_t pids[4];
    rank_pids(p.obuf, "pid ", pids, 4);
    KT_EQ(kt_proc_finish(&p, 15), 9);
    double took = p.t_end - p.t0;
    KT_ASSERTF(took < 3.0, "kolorun took %.2f s", took);
    KT_CONTAINS(p.ebuf, "rank 2 on host localhost exited with code 9");
    KT_CONTAINS(p.ebuf, "| it broke here\n");
    KT_CONTAINS(p.ebuf, "| bad thing\n");
    KT_CONTAINS(p.ebuf, "ranks 0-1,3: terminated by kolorun after rank 2 failed (not a failure of their own)");
    KT_ASSERT(strstr(p.ebuf, "rank 0 on host") == NULL);
    assert_no_descendants(3);
    for (int r = 0; r < 4; r++) KT_ASSERTF(kill(pids[r], 0) != 0 && errno == ESRCH, "rank %d pid %d alive", r, pids[r]);
}

/* A worker killed in kolo's shared-memory handshake leaves its segment named in /dev/shm; kolorun
 * removes a reaped worker's segments (names of kolo's form with its pid) and nothing else. */
KT_TEST(kolorun_removes_shm_segments_of_reaped_workers, 15)
{
    subreaper();
    const char *script = "s=/dev/shm/kolo-$$-0-$KOLO_RANK; touch $s-0123456789abcdef $s-notanonce && echo \"made $$\"; "
                         "if [ $KOLO_RANK = 0 ]; then sleep 0.3; kill -9 $$; fi; exec sleep 30";
    const char *args[] = {"-np", "2", "--verbose", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "made ", 2, 10);
    pid_t pids[2];
    rank_pids(p.obuf, "made ", pids, 2);
    int code = kt_proc_finish(&p, 10);
    bool gone[2], kept[2];
    for (int r = 0; r < 2; r++) {
        char seg[96], other[96];
        snprintf(seg, sizeof(seg), "/dev/shm/kolo-%d-0-%d-0123456789abcdef", (int)pids[r], r);
        snprintf(other, sizeof(other), "/dev/shm/kolo-%d-0-%d-notanonce", (int)pids[r], r);
        gone[r] = access(seg, F_OK) != 0 && errno == ENOENT;
        kept[r] = access(other, F_OK) == 0;
        unlink(seg);
        unlink(other);
    }
    KT_EQ(code, 128 + SIGKILL);
    KT_ASSERTF(gone[0] && gone[1], "segments left: rank 0 %s, rank 1 %s", gone[0] ? "no" : "yes",
               gone[1] ? "no" : "yes");
    KT_ASSERT(kept[0] && kept[1]);
    char want[128];
    snprintf(want, sizeof(want), "rank 0 (pid %d) left 1 shared-memory segment in /dev/shm (0 bytes): removed",
             (int)pids[0]);
    KT_CONTAINS(p.ebuf, want);
    assert_no_descendants(3);
}

KT_TEST(kolorun_sigterm_ignoring_worker_is_killed_after_grace, 15)
{
    subreaper();
    const char *script = "if [ $KOLO_RANK = 0 ]; then sleep 0.3; exit 1; fi; trap '' TERM; sleep 30";
    const char *args[] = {"-np", "2", "--grace-seconds", "1", "sh", "-c", script, NULL};
    kproc p;
    KT_EQ(run(&p, args, 10), 1);
    double took = p.t_end - p.t0;
    KT_ASSERTF(took > 1.2 && took < 4, "took %.2f s with a 1 s grace", took);
    KT_CONTAINS(p.ebuf, "rank 1: still running 1 s after SIGTERM (--grace-seconds), killed with SIGKILL");
    assert_no_descendants(3);
}

/* A worker's process in a session of its own (setsid, a daemon, a server started with
 * start_new_session) escapes the signals kolorun sends the worker's group: kolorun, the
 * subreaper of whatever its workers start, ends it with the job, failed or not, and says so. */
KT_TEST(kolorun_ends_what_workers_left_in_sessions_of_their_own, 45)
{
    subreaper();
    const char *done = "setsid sleep 60 & setsid sh -c 'trap \"\" TERM; sleep 60' & sleep 0.3; echo started";
    const char *args[] = {"-np", "2", "--grace-seconds", "1", "sh", "-c", done, NULL};
    kproc p;
    KT_EQ(run(&p, args, 20), 0);
    KT_CONTAINS(p.ebuf, "kolorun: the workers left 4 processes running in a session or group of their own: ");
    KT_CONTAINS(p.ebuf, "sleep (pid ");
    KT_CONTAINS(p.ebuf, "killed (SIGTERM, then SIGKILL after the grace period), as the job is over");
    assert_no_descendants(3);

    const char *failed = "setsid sleep 60 & sleep 0.3; if [ $KOLO_RANK = 1 ]; then exit 3; fi; sleep 60";
    const char *args2[] = {"-np", "2", "sh", "-c", failed, NULL};
    KT_EQ(run(&p, args2, 20), 3);
    KT_CONTAINS(p.ebuf, "kolorun: the workers left 2 processes running in a session or group of their own: sleep "
                        "(pid ");
    KT_CONTAINS(p.ebuf, "; terminated, as the job is over");
    assert_no_descendants(3);

    /* what a script started before it exec'd kolorun is kolorun's child too, but not the job's */
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "sleep 7.77 >/dev/null 2>&1 & echo \"mine $!\"; exec %s -np 1 true", kolorun_path());
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    kt_proc_start(&p, argv, NULL);
    KT_EQ(kt_proc_finish(&p, 10), 0);
    KT_ASSERTF(!strstr(p.ebuf, "left"), "kolorun took the script's own child for the job's:\n%s", p.ebuf);
    int mine = 0;
    const char *at = strstr(p.obuf, "mine ");
    KT_ASSERT(at && sscanf(at + 5, "%d", &mine) == 1 && mine > 0);
    KT_ASSERTF(kill(mine, 0) == 0, "the script's own sleep (pid %d) is gone", mine);
    kill(mine, SIGKILL);
    assert_no_descendants(3);

    /* A leftover's group is counted once: here its leader ends at SIGTERM while the rest of its
     * group ignores it and comes to kolorun as orphans. (The same happens by chance when a SIGKILLed
     * group's leader exits before its members: a CI run counted 5 of 4.) */
    const char *group = "setsid sh -c 'sh -c \"trap \\\"\\\" TERM; sleep 60\"; :' & sleep 0.3";
    const char *args4[] = {"-np", "1", "--grace-seconds", "1", "sh", "-c", group, NULL};
    KT_EQ(run(&p, args4, 20), 0);
    KT_CONTAINS(p.ebuf, "kolorun: the workers left 1 process running in a session or group of its own: sh (pid ");
    KT_CONTAINS(p.ebuf, "killed (SIGTERM, then SIGKILL after the grace period)");
    assert_no_descendants(3);

    /* Each is named once however long the sweep runs: a leftover that ignores SIGTERM for the
     * grace period (its sleep inherits the ignored signal; the worker ends once it ignores it) and,
     * after 300 polls of the sweep, hands over to a second one in a session of its own and exits
     * (half a second after, when the second has its session: until then it is in the first's group).
     * f4659dd added every known leftover to the list of those met at every poll, which filled it
     * after 64, and the second was then named at every poll until the SIGKILL. */
    const char *late = "f=$(mktemp); setsid sh -c 'trap \"\" TERM; : > \"$0.ok\"; sleep 3; setsid sh -c \"sleep 60\" & "
                       "sleep 0.5; exit' \"$f\" & while [ ! -e \"$f.ok\" ]; do sleep 0.05; done; rm -f \"$f\" \"$f.ok\"";
    const char *args5[] = {"-np", "1", "--grace-seconds", "5", "sh", "-c", late, NULL};
    KT_EQ(run(&p, args5, 25), 0);
    KT_CONTAINS(p.ebuf, "kolorun: the workers left 2 processes running in a session or group of their own: sh (pid ");
    assert_no_descendants(3);

    /* an environment of 120 KB before kolorun's variables (module systems' tables) */
    static char big[60001];
    memset(big, 'x', sizeof(big) - 1);
    KT_ASSERT(setenv("KT_BIG_1", big, 1) == 0 && setenv("KT_BIG_2", big, 1) == 0);
    const char *args3[] = {"-np", "1", "sh", "-c", "setsid sleep 60 & sleep 0.3", NULL};
    KT_EQ(run(&p, args3, 20), 0);
    KT_CONTAINS(p.ebuf, "kolorun: the workers left 1 process running in a session or group of its own: sleep (pid ");
    assert_no_descendants(3);
}

KT_TEST(kolorun_forwards_sigterm_to_workers, 15)
{
    subreaper();
    const char *script = "trap 'echo got-term-$KOLO_RANK; exit 0' TERM; echo ready; sleep 30 & wait";
    const char *args[] = {"-np", "2", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "<stdout>:ready", 2, 10);
    usleep(100000); /* the shells reach `wait` */
    kill(p.pid, SIGTERM);
    KT_EQ(kt_proc_finish(&p, 10), 128 + SIGTERM);
    KT_CONTAINS(p.obuf, "[0]<stdout>:got-term-0\n");
    KT_CONTAINS(p.obuf, "[1]<stdout>:got-term-1\n");
    KT_CONTAINS(p.ebuf, "got SIGTERM: passing it to 2 workers");
    assert_no_descendants(3);
}

/* A process's state letter from /proc/PID/stat ('T' stopped), or '?' when it is gone. */
static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    const char *q = strrchr(buf, ')');
    return q && q[1] == ' ' ? q[2] : '?';
}

/* Waits up to 5 s for pid to be in (want 'T') or out of (want 'R') a stopped state. */
static void wait_state(int pid, char want)
{
    double end = now_s() + 5 * kt_timeout_scale();
    char st;
    while (((st = proc_state(pid)) == 'T') != (want == 'T') && now_s() < end) usleep(10000);
    KT_ASSERTF((st == 'T') == (want == 'T'), "pid %d is in state %c, not %s", pid, st,
               want == 'T' ? "stopped" : "running");
}

/* A worker that sleeps 3 s in 30 naps without forking: a shell's `sleep` would leave the shell
 * in the vfork wait (state D, not T) while its stopped child has not yet exec'd. */
#define CTRL_Z_WORKER \
    "import os, time\nprint('pid', os.getpid(), flush=True)\nfor _ in range(30): time.sleep(0.1)\nprint('finished')"

/* Ctrl-Z (SIGTSTP to kolorun, the terminal's foreground group) stops the workers with kolorun;
 * SIGCONT (fg, bg) starts them again, and the job goes on. */
KT_TEST(kolorun_ctrl_z_stops_the_workers_and_fg_resumes_them, 30)
{
    subreaper();

    const char *args[] = {"-np", "2", "/usr/bin/python3", "-c", CTRL_Z_WORKER, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 2, 10);
    int pids[2];
    for (int r = 0; r < 2; r++) {
        char pat[32];
        snprintf(pat, sizeof(pat), "[%d]<stdout>:pid ", r);
        const char *at = strstr(p.obuf, pat);
        KT_ASSERT(at && sscanf(at + strlen(pat), "%d", &pids[r]) == 1);
    }
    kill(p.pid, SIGTSTP);
    wait_state(p.pid, 'T');
    for (int r = 0; r < 2; r++) wait_state(pids[r], 'T');
    usleep(500000);
    for (int r = 0; r < 2; r++) KT_ASSERT(proc_state(pids[r]) == 'T'); /* still stopped */
    kill(p.pid, SIGCONT);
    for (int r = 0; r < 2; r++) wait_state(pids[r], 'R');
    KT_EQ(kt_proc_finish(&p, 20), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:finished\n"), 2);
    KT_CONTAINS(p.ebuf, "kolorun: got SIGTSTP: stopping 2 workers with kolorun (fg or bg resumes them)");
    assert_no_descendants(3);
}

KT_TEST(kolorun_second_sigint_kills_at_once, 15)
{
    subreaper();
    const char *script = "trap '' INT TERM; echo ready; sleep 30";
    const char *args[] = {"-np", "2", "--grace-seconds", "20", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "<stdout>:ready", 2, 10);
    kill(p.pid, SIGINT);
    usleep(200000);
    double t = now_s();
    kill(p.pid, SIGINT);
    KT_EQ(kt_proc_finish(&p, 10), 128 + SIGINT);
    KT_ASSERTF(p.t_end - t < 2, "took %.2f s after the second SIGINT", p.t_end - t);
    KT_CONTAINS(p.ebuf, "second SIGINT");
    assert_no_descendants(3);
}

KT_TEST(kolorun_killed_launcher_takes_workers_along, 15)
{
    subreaper();
    /* the shell's child (sleep) is not reached by PDEATHSIG: the guard must kill it */
    const char *script = "echo \"pid $$\"; sleep 30; echo never";
    const char *args[] = {"-np", "3", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 3, 10);
    kill(p.pid, SIGKILL);
    kt_proc_finish(&p, 10);
    KT_EQ(p.status, SIGKILL);
    assert_no_descendants(3);
    KT_ASSERT(strstr(p.obuf, "never") == NULL);
}

/* ---- remote hosts, through a stand-in for ssh that runs the command here ---- */

/* Like the real thing, the "remote" side runs apart from the local ssh process (here: in a
 * session of its own, out of reach of kolorun's process-group signals), and its stdin is
 * kolorun's end of the connection, so it sees end of file when kolorun goes away. */
static const char fake_ssh[] =
    "#!/bin/sh\n"
    "echo \"$@\" >> \"$(dirname \"$0\")/ssh.log\"\n"
    "while [ $# -gt 0 ]; do case \"$1\" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac; done\n"
    "host=$1; shift\n"
    "case $host in\n"
    "  unreachable*) echo \"ssh: connect to host $host port 22: No route to host\" >&2; exit 255;;\n"
    "  hanging*) exec sleep 30;;\n"
    "esac\n"
    "exec 3<&0\n"
    "setsid sh -c \"$*\" <&3 3<&- &\n"
    "wait $!\n";

static char *make_fake_ssh(void)
{
    static char path[160];
    char *d = tmpdir();
    snprintf(path, sizeof(path), "%s/fakessh", d);
    write_file(path, fake_ssh, 0755);
    return path;
}

KT_TEST(kolorun_remote_workers_over_ssh, 20)
{
    subreaper();
    char *ssh = make_fake_ssh();
    const char *script = "echo \"on $KOLO_HOSTNAME rank $KOLO_RANK local $KOLO_LOCAL_RANK dir $(pwd)\"; "
                         "echo \"rdv=$KOLO_RENDEZVOUS\"; [ $KOLO_RANK = 3 ] && { sleep 0.5; exit 5; }; exit 0";
    const char *args[] = {"-H", "localhost:1,kt-remote-a:2,kt-remote-b:1", "--ssh", ssh, "-p", "2222",
                          "-i", "/tmp/id_kt", "sh", "-c", script, NULL};
    kproc p;
    KT_EQ(run(&p, args, 15), 5);
    char cwd[1024], w[1200];
    KT_ASSERT(getcwd(cwd, sizeof(cwd)));
    snprintf(w, sizeof(w), "[1]<stdout>:on kt-remote-a rank 1 local 0 dir %s\n", cwd);
    KT_CONTAINS(p.obuf, w);
    snprintf(w, sizeof(w), "[2]<stdout>:on kt-remote-a rank 2 local 1 dir %s\n", cwd);
    KT_CONTAINS(p.obuf, w);
    KT_CONTAINS(p.obuf, "[0]<stdout>:rdv=127.0.0.1:");
    KT_ASSERT(strstr(p.obuf, "kolorun-remote-started") == NULL);
    KT_CONTAINS(p.ebuf, "rank 3 on host kt-remote-b exited with code 5");
    char log[200], buf[8192] = "";
    snprintf(log, sizeof(log), "%.*s/ssh.log", (int)(strrchr(ssh, '/') - ssh), ssh);
    FILE *f = fopen(log, "r");
    KT_ASSERT(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    KT_CONTAINS(buf, "-p 2222 -i /tmp/id_kt kt-remote-a ");
    KT_CONTAINS(buf, "BatchMode=yes");
    assert_no_descendants(3);
}

KT_TEST(kolorun_remote_ssh_failure_and_start_timeout, 20)
{
    subreaper();
    char *ssh = make_fake_ssh();
    const char *args[] = {"-H", "localhost:1,unreachable-host:1", "--ssh", ssh, "sh", "-c", "sleep 30", NULL};
    kproc p;
    KT_EQ(run(&p, args, 10), 255);
    KT_CONTAINS(p.ebuf, "rank 1 on host unreachable-host could not be started over ssh");
    KT_CONTAINS(p.ebuf, "| ssh: connect to host unreachable-host port 22: No route to host");
    assert_no_descendants(3);

    const char *args2[] = {"-H", "localhost:1,hanging-host:1", "--ssh", ssh, "--start-timeout", "1",
                           "sh", "-c", "sleep 30", NULL};
    KT_EQ(run(&p, args2, 10), 1);
    KT_ASSERTF(p.t_end - p.t0 < 4, "took %.2f s", p.t_end - p.t0);
    KT_CONTAINS(p.ebuf, "rank 1 on host hanging-host did not start within 1 s (--start-timeout)");
    assert_no_descendants(3);
}

/* A SIGKILLed kolorun cannot end what its workers started in sessions of their own: its guard
 * finds those by the job id in their environment. */
KT_TEST(kolorun_killed_launcher_takes_what_workers_left_along, 15)
{
    subreaper();
    const char *script = "setsid sleep 30 & setsid sh -c 'trap \"\" TERM; sleep 30' & sleep 0.3; echo \"pid $$\"; "
                         "sleep 30";
    const char *args[] = {"-np", "2", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 2, 10);
    kill(p.pid, SIGKILL);
    kt_proc_finish(&p, 10);
    KT_EQ(p.status, SIGKILL);
    assert_no_descendants(3);
}

KT_TEST(kolorun_killed_launcher_stops_remote_workers, 20)
{
    subreaper();
    char *ssh = make_fake_ssh();
    /* the remote command runs in a session of its own: only the wrapper's watcher, which sees
     * the connection (its stdin) close, can stop it */
    const char *args[] = {"-H", "kt-remote-c:2", "--ssh", ssh, "--grace-seconds", "1", "sh", "-c",
                          "echo \"pid $$\"; sleep 30", NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 2, 10);
    kill(p.pid, SIGKILL);
    kt_proc_finish(&p, 10);
    assert_no_descendants(5);
}

/* A remote worker's process in a session of its own: kolorun is not its subreaper there, so
 * the wrapper ends it, by the mark in its environment, and says so on the rank's stderr (here
 * the fake ssh runs the wrapper under kolorun, whose own sweep must then find nothing left). */
KT_TEST(kolorun_remote_wrapper_ends_what_the_worker_left, 20)
{
    subreaper();
    char *ssh = make_fake_ssh();
    const char *args[] = {"-H", "kt-remote-d:1", "--ssh", ssh, "--grace-seconds", "1", "sh", "-c",
                          "setsid sleep 60 & setsid sh -c 'trap \"\" TERM; sleep 60' & sleep 0.3; echo done", NULL};
    kproc p;
    KT_EQ(run(&p, args, 15), 0);
    KT_CONTAINS(p.obuf, "[0]<stdout>:done\n");
    KT_CONTAINS(p.ebuf, "[0]<stderr>:kolorun: the worker left processes running in a session or group of their "
                        "own on ");
    KT_CONTAINS(p.ebuf, "; terminating them, as the worker is over\n");
    KT_ASSERTF(!strstr(p.ebuf, "kolorun: the workers left"), "kolorun found leftovers:\n%s", p.ebuf);
    assert_no_descendants(3);
}

/* The same for a remote worker: kolorun tells its wrapper on the connection ("stop", "cont"). */
KT_TEST(kolorun_ctrl_z_stops_remote_workers_too, 30)
{
    subreaper();
    char *ssh = make_fake_ssh();

    const char *args[] = {"-H", "localhost:1,kt-remote-e:1", "--ssh", ssh, "/usr/bin/python3", "-c", CTRL_Z_WORKER,
                          NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "pid ", 2, 10);
    int pid = 0;
    const char *at = strstr(p.obuf, "[1]<stdout>:pid ");
    KT_ASSERT(at && sscanf(at + 16, "%d", &pid) == 1);
    kill(p.pid, SIGTSTP);
    wait_state(p.pid, 'T');
    wait_state(pid, 'T');
    usleep(300000);
    KT_ASSERT(proc_state(pid) == 'T');
    kill(p.pid, SIGCONT);
    wait_state(pid, 'R');
    KT_EQ(kt_proc_finish(&p, 20), 0);
    KT_EQ(kt_count(p.obuf, "<stdout>:finished\n"), 2);
    assert_no_descendants(3);
}

/* ---- CPU binding ---- */

/* Rank r's CPUs as its worker printed them (Cpus_allowed_list) into got; checks that kolorun
 * reported them, as bound or not as `bound` says. */
static void worker_cpus(const kproc *p, int r, bool bound, char got[64])
{
    char pat[96], want[64] = "";
    snprintf(pat, sizeof(pat), "[%d]<stdout>:Cpus_allowed_list:", r);
    const char *s = strstr(p->obuf, pat);
    KT_ASSERTF(s, "no affinity line for rank %d: %s", r, p->obuf);
    KT_ASSERT(sscanf(s + strlen(pat), " %63s", got) == 1);
    snprintf(pat, sizeof(pat), "kolorun: rank %d on localhost: %s ", r, bound ? "bound to cpus" : "not bound; may use cpus");
    s = strstr(p->ebuf, pat);
    KT_ASSERTF(s, "no report '%s' for rank %d: %s", pat, r, p->ebuf);
    KT_ASSERT(sscanf(s + strlen(pat), "%63s", want) == 1);
    KT_ASSERTF(strcmp(got, want) == 0, "rank %d runs on %s, reported %s", r, got, want);
}

KT_TEST(kolorun_bind_to_core_sets_affinity, 10)
{
    const char *args[] = {"-np", "2", "--bind-to", "core", "--map-by", "core", "--report-bindings", "sh", "-c",
                          "grep Cpus_allowed_list /proc/self/status", NULL};
    kproc p;
    KT_EQ(run(&p, args, 10), 0);
    char got[64];
    for (int r = 0; r < 2; r++) worker_cpus(&p, r, true, got);
}

/* The default, --bind-to auto: workers unbound while they fit the CPUs kolorun may use, and once
 * there are more, each on one CPU, in blocks of neighbouring ranks (5 on 2 CPUs: 3 and 2). The
 * test (a process of its own) first keeps itself, and so kolorun, to two CPUs, or one. */
KT_TEST(kolorun_bind_auto_binds_a_crowded_host_in_blocks, 20)
{
    cpu_set_t all, two;
    KT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    CPU_ZERO(&two);
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &all)) CPU_SET(c, &two), k++;
    KT_EQ(sched_setaffinity(0, sizeof(two), &two), 0);
    const char *cmd = "grep Cpus_allowed_list /proc/self/status";
    char np[16], got[8][64];
    kproc p;
    snprintf(np, sizeof(np), "%d", k);
    const char *fit[] = {"-np", np, "--report-bindings", "sh", "-c", cmd, NULL};
    KT_EQ(run(&p, fit, 10), 0);
    for (int r = 0; r < k; r++) {
        worker_cpus(&p, r, false, got[r]);
        KT_ASSERTF(k == 1 || strpbrk(got[r], ",-"), "rank %d of %d on %d CPUs runs on %s alone", r, k, k, got[r]);
    }
    int n = 2 * k + 1;
    snprintf(np, sizeof(np), "%d", n);
    const char *crowded[] = {"-np", np, "--report-bindings", "sh", "-c", cmd, NULL};
    KT_EQ(run(&p, crowded, 10), 0);
    for (int r = 0; r < n; r++) {
        worker_cpus(&p, r, true, got[r]);
        int cpu = -1;
        KT_ASSERTF(sscanf(got[r], "%d", &cpu) == 1 && !strpbrk(got[r], ",-") && CPU_ISSET(cpu, &two),
                   "rank %d of %d on %d CPUs runs on %s", r, n, k, got[r]);
        if (r == 0) continue;
        bool same = r * k / n == (r - 1) * k / n;
        KT_ASSERTF((strcmp(got[r], got[r - 1]) == 0) == same, "ranks %d and %d of %d on %d CPUs: %s and %s", r - 1, r,
                   n, k, got[r - 1], got[r]);
    }
}

/* Where other processes are bound to one CPU each (another crowded job's workers), the larger
 * block goes to the CPU with fewer of them: 8 sleepers bound to the first of two CPUs, then 3
 * workers on the two put ranks 0 and 1 on the second. (Other jobs on the machine bind a few at
 * most: 8 outweighs them.) */
KT_TEST(kolorun_bind_auto_puts_larger_blocks_where_fewer_are_bound, 20)
{
    cpu_set_t all, two, first;
    KT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
    if (CPU_COUNT(&all) < 2) {
        fprintf(stderr, "# one CPU here: nothing to place\n");
        return;
    }
    CPU_ZERO(&two);
    CPU_ZERO(&first);
    int cpu[2], k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &all)) CPU_SET(c, &two), cpu[k++] = c;
    CPU_SET(cpu[0], &first);
    KT_EQ(sched_setaffinity(0, sizeof(two), &two), 0);
    pid_t sleepers[8];
    for (int i = 0; i < 8; i++) {
        sleepers[i] = fork();
        KT_ASSERT(sleepers[i] >= 0);
        if (sleepers[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even one that fails below */
            for (;;) pause();
        }
        KT_EQ(sched_setaffinity(sleepers[i], sizeof(first), &first), 0); /* before kolorun looks */
    }
    const char *args[] = {"-np", "3", "--report-bindings", "sh", "-c", "grep Cpus_allowed_list /proc/self/status", NULL};
    kproc p;
    int code = run(&p, args, 10);
    for (int i = 0; i < 8; i++) {
        kill(sleepers[i], SIGKILL);
        waitpid(sleepers[i], NULL, 0);
    }
    KT_EQ(code, 0);
    char got[3][64], want[2][16];
    snprintf(want[0], sizeof(want[0]), "%d", cpu[0]);
    snprintf(want[1], sizeof(want[1]), "%d", cpu[1]);
    for (int r = 0; r < 3; r++) worker_cpus(&p, r, true, got[r]);
    KT_ASSERTF(strcmp(got[0], want[1]) == 0 && strcmp(got[1], want[1]) == 0 && strcmp(got[2], want[0]) == 0,
               "ranks 0-2 on cpus %s, %s, %s; want %s, %s, %s:\n%s", got[0], got[1], got[2], want[1], want[1], want[0],
               p.ebuf);
    char said[96];
    snprintf(said, sizeof(said), "kolorun: other processes bound to one CPU here (cpu %d: ", cpu[0]);
    KT_CONTAINS(p.ebuf, said);
    KT_CONTAINS(p.ebuf, "the larger blocks of workers go to the CPUs with fewer");
}

/* ---- a real kolo job ---- */

KT_WORKER(kolorun_init)
{
    (void)argc;
    (void)argv;
    int s = kolo_init();
    if (s != 0) {
        fprintf(stderr, "kolo_init: %s\n", kolo_last_error());
        return 1;
    }
    printf("rank %d of %d initialized\n", kolo_rank(), kolo_size());
    fflush(stdout);
    return kolo_shutdown() == 0 ? 0 : 1;
}

KT_TEST(kolorun_starts_a_kolo_job_that_initializes, 20)
{
    subreaper();
    const char *args[] = {"-np", "3", kt_self(), "--worker", "kolorun_init", NULL};
    kproc p;
    int code = run(&p, args, 15);
    KT_ASSERTF(code == 0, "exit %d; stderr:\n%s", code, p.ebuf);
    for (int r = 0; r < 3; r++) {
        char w[64];
        snprintf(w, sizeof(w), "[%d]<stdout>:rank %d of 3 initialized\n", r, r);
        KT_CONTAINS(p.obuf, w);
    }
    assert_no_descendants(3);
}

/* kolorun holds pipes and a store connection per worker: where the soft open-file limit is
 * short it raises it (the workers inherit that), and where the hard limit is, it says so before
 * starting anything (src/common/fds.c). */
static int low_files(void *arg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
    rl.rlim_cur = 24;
    if (arg) rl.rlim_max = 24;
    return setrlimit(RLIMIT_NOFILE, &rl);
}

KT_TEST(kolorun_open_file_limits, 30)
{
    subreaper();
    const char *argv[] = {kolorun_path(), "-np", "12", kt_self(), "--worker", "kolorun_init", NULL};
    kproc p;
    kt_proc_opts o = {.child_setup = low_files};
    kt_proc_start(&p, argv, &o);
    int code = kt_proc_finish(&p, 25);
    KT_ASSERTF(code == 0, "exit %d; stderr:\n%s", code, p.ebuf);
    for (int r = 0; r < 12; r++) {
        char w[64];
        snprintf(w, sizeof(w), "[%d]<stdout>:rank %d of 12 initialized\n", r, r);
        KT_CONTAINS(p.obuf, w);
    }
    kt_proc_free(&p);

    o.arg = &o; /* the hard limit too */
    kt_proc_start(&p, argv, &o);
    code = kt_proc_finish(&p, 25);
    KT_EQ(code, 1);
    KT_CONTAINS(p.ebuf, "kolorun, for 12 workers");
    KT_CONTAINS(p.ebuf, "may open at most 24 (the hard limit, `ulimit -Hn`)");
    KT_ASSERTF(!strstr(p.obuf, "initialized") && !strstr(p.ebuf, "]<stderr>"), "workers started:\n%s%s", p.obuf,
               p.ebuf);
    kt_proc_free(&p);
    assert_no_descendants(3);
}

/* ---- --timeout and --get-stack-traces ---- */

/* A hang: the last rank sleeps and never joins. Without an argument rank 0 waits in a direct
 * allreduce (2 ranks); with "engine" the other ranks wait for "grad.7", which the last never
 * submits; with "roots" no rank sleeps: each names another root of one broadcast and waits to
 * receive. Every rank prints its kolo status when kolorun asks (--get-stack-traces). */
KT_WORKER(kolorun_hang)
{
    bool engine = argc > 1 && !strcmp(argv[1], "engine"), roots = argc > 1 && !strcmp(argv[1], "roots");
    if (kolo_init() != 0) {
        fprintf(stderr, "kolo_init: %s\n", kolo_last_error());
        return 1;
    }
    printf("rank %d waits\n", kolo_rank());
    fflush(stdout);
    if (roots) {
        int x = 1;
        return kolo_broadcast(&x, 1, KOLO_INT32, (kolo_rank() + 1) % kolo_size(), KOLO_WORLD) != 0;
    }
    if (kolo_rank() == kolo_size() - 1) {
        for (;;) sleep(100);
    }
    float x[4] = {1, 2, 3, 4}, y[4];
    if (!engine) return kolo_allreduce(x, y, 1, KOLO_FLOAT32, KOLO_SUM, 1, 1, KOLO_WORLD) != 0;
    kolo_shape_t sh = {.ndim = 1, .dims = {4}};
    kolo_request_t *r;
    if (kolo_iallreduce("grad.7", x, y, KOLO_FLOAT32, &sh, KOLO_SUM, 1, 1, NULL, &r) != 0) return 1;
    kolo_request_wait(r, 100);
    return 0;
}

static bool have_gdb(void) { return system("command -v gdb >/dev/null 2>&1") == 0; }

/* kolorun_hang's job of NP ranks in MODE (NULL: the direct allreduce), stopped at --timeout 2 s
 * after the dump; kolorun's exit code */
static int run_hang(kproc *p, const char *np, const char *mode)
{
    const char *args[] = {"-np", np, "--timeout", "2", "--get-stack-traces", "--grace-seconds", "1",
                          kt_self(), "--worker", "kolorun_hang", mode, NULL};
    return run(p, args, 80);
}

KT_TEST(kolorun_timeout_names_the_rank_the_job_waits_for, 90)
{
    subreaper();
    kproc p;
    int code = run_hang(&p, "3", "engine");
    KT_ASSERTF(code == 124, "exit %d; stderr:\n%s", code, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 0 waits for rank 2 (to submit \"grad.7\")\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 1 waits for rank 2 (to submit \"grad.7\")\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: the job waits for rank 2: it waits for no rank in kolo");
    assert_no_descendants(5);
}

/* Ranks that wait for each other in a broadcast whose root they disagree on: no rank waits for
 * none, and kolorun says what the two calls differ in, from the calls' numbers and arguments. */
KT_TEST(kolorun_timeout_names_what_ranks_that_wait_on_each_other_differ_in, 90)
{
    subreaper();
    kproc p;
    int code = run_hang(&p, "2", "roots");
    KT_ASSERTF(code == 124, "exit %d; stderr:\n%s", code, p.ebuf);
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 0 waits for rank 1 (in kolo_broadcast (int32, root 1), call 1 on "
                        "process set 0)\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 1 waits for rank 0 (in kolo_broadcast (int32, root 0), call 1 on "
                        "process set 0)\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 0 called kolo_broadcast (int32, root 1) where rank 1 called "
                        "kolo_broadcast (int32, root 0), both call 1 on process set 0: the ranks passed different "
                        "roots\n");
    assert_no_descendants(5);
}

KT_TEST(kolorun_timeout_prints_where_each_rank_waits, 90)
{
    subreaper();
    kproc p;
    double t0 = now_s();
    int code = run_hang(&p, "2", NULL);
    KT_ASSERTF(code == 124, "exit %d; stderr:\n%s", code, p.ebuf);
    KT_CONTAINS(p.obuf, "[0]<stdout>:rank 0 waits");
    KT_CONTAINS(p.obuf, "[1]<stdout>:rank 1 waits");
    KT_CONTAINS(p.ebuf, "kolorun: the job ran past --timeout 2 s with 2 ranks still running");
    KT_CONTAINS(p.ebuf, "stacks of the 2 ranks still running");
    /* kolo's status of each (KOLO_STATUS_SIGNAL=USR1): rank 0 in the allreduce, waiting for rank 1 */
    KT_CONTAINS(p.ebuf, "kolorun: kolo status of the 2 processes that use kolo, on their stderr:");
    const char *st0 = strstr(p.ebuf, "[0]<stderr>:[kolo 0 status] {\"rank\":0,");
    KT_ASSERTF(st0, "no status of rank 0:\n%s", p.ebuf);
    KT_CONTAINS(st0, "\"direct\":{\"call\":\"kolo_allreduce\",\"process_set\":0,");
    KT_CONTAINS(st0, "\"waiting_for\":{\"ranks\":[1],");
    const char *st1 = strstr(p.ebuf, "[1]<stderr>:[kolo 1 status] {\"rank\":1,");
    KT_ASSERTF(st1, "no status of rank 1:\n%s", p.ebuf);
    KT_CONTAINS(st1, "\"direct\":null");
    /* and kolorun's reading of them: who waits for whom, and the rank the job waits on */
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: rank 0 waits for rank 1 (in kolo_allreduce (float32, sum), call 1 on "
                        "process set 0)\n");
    KT_CONTAINS(p.ebuf, "kolorun: kolo status: the job waits for rank 1: it waits for no rank in kolo");
    if (have_gdb()) {
        /* where each waits, from gdb: rank 0 inside the allreduce, rank 1 asleep */
        const char *s0 = strstr(p.ebuf, "[0]<stack "), *s1 = strstr(p.ebuf, "[1]<stack ");
        KT_ASSERTF(s0 && s1, "no stacks:\n%s", p.ebuf);
        const char *a = strstr(s0, "kolo_allreduce");
        KT_ASSERTF(a && a < s1, "rank 0's stack does not show kolo_allreduce:\n%s", p.ebuf);
        KT_ASSERTF(strstr(s1, "sleep"), "rank 1's stack does not show its sleep:\n%s", p.ebuf);
    } else {
        KT_CONTAINS(p.ebuf, "gdb is not installed");
    }
    KT_CONTAINS(p.ebuf, "terminated by kolorun at --timeout 2 s");
    KT_CONTAINS(p.ebuf, "exit code 124");
    KT_ASSERTF(now_s() - t0 < 60, "took %.1f s", now_s() - t0);
    assert_no_descendants(5);
}

/* Creates the flag file `name` in the test's scratch directory. */
static void raise_flag(const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", kt_scratch(), name);
    KT_ASSERT(close(open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) == 0);
}

/* A progress bar (tqdm's: '\r' rewrites, a newline when done) shows as it comes, each rewrite
 * with its tag, where whole lines alone would hold it back until its end (minutes, and the job
 * looks hung); another rank's line in the middle starts on a line of its own, while a line on the
 * other stream (here another pipe, as stdout sent to a log while the bar is watched) leaves it. */
KT_TEST(kolorun_shows_progress_bars_as_they_come, 30)
{
    char script[1024];
    snprintf(script, sizeof(script),
             "d=%s; w() { while [ ! -e $d/$1 ]; do sleep 0.02; done; }; if [ $KOLO_RANK = 0 ]; then "
             "printf '\\r 50%%%%|##'; w one; printf '\\r 75%%%%|###'; w two; printf '\\r100%%%%|####\\n'; "
             "else w err; echo err >&2; w line; echo line; fi",
             kt_scratch());
    const char *args[] = {"-np", "2", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "\r[0]<stdout>: 50%|##", 1, 10); /* before its newline */
    KT_ASSERT(strstr(p.obuf, "[0]<stdout>:\r") == NULL);
    raise_flag("err");
    double end = now_s() + 10 * kt_timeout_scale();
    while (!strstr(p.ebuf, "[1]<stderr>:err\n") && now_s() < end) kt_proc_pump(&p, 20);
    KT_CONTAINS(p.ebuf, "[1]<stderr>:err\n");
    raise_flag("one");
    kt_proc_wait_for(&p, "\r[0]<stdout>: 75%|###", 1, 10);
    raise_flag("line");
    kt_proc_wait_for(&p, "[1]<stdout>:line\n", 1, 10);
    raise_flag("two");
    KT_EQ(kt_proc_finish(&p, 20), 0);
    KT_CONTAINS(p.obuf, "\r[0]<stdout>: 50%|##\r[0]<stdout>: 75%|###\n[1]<stdout>:line\n\r[0]<stdout>:100%|####\n");
}

/* A bar's character split across two writes (tqdm draws 3-byte blocks, and a pipe may split them)
 * was shown in halves, and another rank's line between them broke both halves; now the first
 * half waits for the rest. */
KT_TEST(kolorun_progress_bar_characters_stay_whole, 30)
{
    char script[1024];
    snprintf(script, sizeof(script),
             "d=%s; w() { while [ ! -e $d/$1 ]; do sleep 0.02; done; }; if [ $KOLO_RANK = 0 ]; then "
             "printf '\\r 50%%%%|\\342\\226\\210\\342\\226'; w rest; printf '\\210\\n'; "
             "else w line; echo line; fi",
             kt_scratch());
    const char *args[] = {"-np", "2", "sh", "-c", script, NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "\r[0]<stdout>: 50%|\xe2\x96\x88", 1, 10);
    kt_proc_pump(&p, 200); /* the half character would follow now */
    raise_flag("line");
    kt_proc_wait_for(&p, "[1]<stdout>:line\n", 1, 10);
    raise_flag("rest");
    KT_EQ(kt_proc_finish(&p, 20), 0);
    KT_CONTAINS(p.obuf, "\r[0]<stdout>: 50%|\xe2\x96\x88\n[1]<stdout>:line\n[0]<stdout>:\xe2\x96\x88\n");

    /* a line longer than KR_LINE_MAX goes in pieces: one never ends inside a character */
    const char *longer[] = {"-np", "1", "sh", "-c",
                            "head -c 65535 /dev/zero | tr '\\0' a; printf '\\342\\226\\210\\n'", NULL};
    KT_EQ(run(&p, longer, 20), 0);
    KT_EQ(p.olen, 12 + 65535 + 1 + 12 + 4);
    KT_CONTAINS(p.obuf, "aaa\n[0]<stdout>:\xe2\x96\x88\n");
}

/* A Python worker that imported kolo prints its Python stacks (faulthandler on SIGUSR2); a job
 * that ends in time is not touched. */
KT_TEST(kolorun_timeout_python_stacks_and_a_job_in_time, 90)
{
    /* kolo's Python package needs NumPy, which `make deps` installs for /usr/bin/python3 */
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("  skip: /usr/bin/python3 has no numpy (apt-get install python3-numpy)\n");
        return;
    }
    subreaper();
    char root[4096], pp[4200];
    snprintf(root, sizeof(root), "%s", kt_build_dir());
    char *b = strstr(root, "/build");
    KT_ASSERT(b);
    *b = '\0';
    snprintf(pp, sizeof(pp), "PYTHONPATH=%s/python", root);
    const char *args[] = {"-np", "1", "--timeout", "3", "--get-stack-traces", "-x", pp, "/usr/bin/python3", "-c",
                          "import kolo, sys, time\nprint('imported', flush=True)\ndef waiting_here():\n"
                          "    time.sleep(60)\nwaiting_here()\n",
                          NULL};
    kproc p;
    int code = run(&p, args, 80);
    KT_ASSERTF(code == 124, "exit %d; stdout:\n%s\nstderr:\n%s", code, p.obuf, p.ebuf);
    KT_CONTAINS(p.obuf, "[0]<stdout>:imported");
    KT_CONTAINS(p.ebuf, "(Python workers that import kolo print theirs on their stderr)");
    KT_CONTAINS(p.ebuf, "[0]<stderr>:");
    KT_CONTAINS(p.ebuf, "(most recent call first)");
    KT_CONTAINS(p.ebuf, "in waiting_here");
    assert_no_descendants(5);

    const char *fast[] = {"-np", "2", "--timeout", "30", "--get-stack-traces", "sh", "-c", "echo done", NULL};
    code = run(&p, fast, 20);
    KT_ASSERTF(code == 0, "exit %d; stderr:\n%s", code, p.ebuf);
    KT_EQ(p.elen, 0);
}

/* horovodrun's --gloo-timeout-seconds is the start-up wait; --log-with-timestamp dates kolo's lines. */
KT_TEST(kolorun_horovodrun_options, 30)
{
    const char *args[] = {"-np", "2", "--gloo-timeout-seconds", "7", "--log-with-timestamp", "--log-level", "info",
                          kt_self(), "--worker", "kolorun_init", NULL};
    kproc p;
    int code = run(&p, args, 20);
    KT_ASSERTF(code == 0, "exit %d; stderr:\n%s", code, p.ebuf);
    KT_CONTAINS(p.obuf, "[1]<stdout>:rank 1 of 2 initialized");
    /* "[0]<stderr>:2026-11-27T17:14:11.435 [kolo 0 info] ..." (the format of --prefix-timestamp) */
    const char *l = strstr(p.ebuf, "[0]<stderr>:");
    KT_ASSERTF(l, "no log lines: %s", p.ebuf);
    int y, mo, d, h, mi, sec, ms;
    KT_ASSERTF(sscanf(l + 12, "%4d-%2d-%2dT%2d:%2d:%2d.%3d [kolo 0 info]", &y, &mo, &d, &h, &mi, &sec, &ms) == 7 &&
                   y >= 2024,
               "not a dated line: %.120s", l);
    const char *a2[] = {"-np", "1", "--gloo-timeout-seconds", "9", "sh", "-c", "echo $KOLO_START_TIMEOUT", NULL};
    KT_EQ(run(&p, a2, 10), 0);
    KT_CONTAINS(p.obuf, "[0]<stdout>:9\n");
}

/* horovodrun's --config-file: its keys become the options they stand for, the command line wins
 * whatever the order, and every problem names the file and line. */
KT_TEST(kolorun_config_file, 30)
{
    char *d = tmpdir(), cfg[4300], bad[4300];
    snprintf(cfg, sizeof(cfg), "%s/hvd.yaml", d);
    write_file(cfg,
               "# Horovod's example, with kolo's values\n"
               "controller: gloo\n"
               "params:\n"
               "    fusion_threshold_mb: 32\n"
               "    cycle_time_ms: 10   # overridden below\n"
               "    hierarchical_allreduce: false\n"
               "autotune:\n"
               "    enabled: true\n"
               "    log_file: '/tmp/at log.csv'\n"
               "timeline:\n"
               "    mark_cycles: yes\n"
               "stall_check:\n"
               "    enabled: false\n"
               "    warning_time_seconds: 120\n"
               "library_options:\n"
               "    gloo_timeout_seconds: 60\n"
               "logging:\n"
               "    level: DEBUG\n"
               "    with_timestamp: false\n",
               0644);
    const char *show = "for v in KOLO_FUSION_THRESHOLD KOLO_CYCLE_TIME KOLO_AUTOTUNE KOLO_AUTOTUNE_LOG "
                       "KOLO_TIMELINE_MARK_CYCLES KOLO_STALL_CHECK_DISABLE KOLO_STALL_CHECK_TIME KOLO_START_TIMEOUT "
                       "KOLO_LOG_LEVEL KOLO_LOG_TIME KOLO_HIERARCHICAL_ALLREDUCE; do eval \"echo $v=\\$$v\"; done";
    const char *args[] = {"-np", "1", "--config-file", cfg, "--cycle-time-ms", "3", "sh", "-c", show, NULL};
    kproc p;
    int code = run(&p, args, 10);
    KT_ASSERTF(code == 0, "exit %d: %s", code, p.ebuf);
    static const char *const want[] = {"KOLO_FUSION_THRESHOLD=33554432", "KOLO_CYCLE_TIME=3", "KOLO_AUTOTUNE=1",
                                       "KOLO_AUTOTUNE_LOG=/tmp/at log.csv", "KOLO_TIMELINE_MARK_CYCLES=1",
                                       "KOLO_STALL_CHECK_DISABLE=1", "KOLO_STALL_CHECK_TIME=120",
                                       "KOLO_START_TIMEOUT=60", "KOLO_LOG_LEVEL=debug", "KOLO_LOG_TIME=0",
                                       "KOLO_HIERARCHICAL_ALLREDUCE=0"};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(want); i++) {
        char line[256];
        snprintf(line, sizeof(line), "[0]<stdout>:%s\n", want[i]);
        KT_CONTAINS(p.obuf, line);
    }
    struct {
        const char *text, *says;
    } cases[] = {
        {"params:\n  fusion_threshold_mb: lots\n", ":2: params.fusion_threshold_mb: 'lots' is not a number"},
        {"params:\n  fusion_mb: 3\n", ":2: params.fusion_mb: not a key of section params (fusion_threshold_mb"},
        {"paramz:\n  cycle_time_ms: 3\n", ":2: paramz.cycle_time_ms: not a section"},
        {"library_options:\n  mpi_threads_disable: true\n", ":2: library_options.mpi_threads_disable: "
                                                             "--mpi-threads-disable is horovodrun's"},
        {"params:\n  hierarchical_allgather: maybe\n", "'maybe' is not true or false"},
        {"params:\n  - 3\n", ":2: expected 'key: value'"},
        {"params:\n  cycle_time_ms: 3\n  cycle_time_ms: 4\n", ":3: 'params.cycle_time_ms' is given twice"},
        {"params:\n  cycle_time_ms: 3\n    cache_capacity: 4\n", ":3: 'cache_capacity' is indented by 4"},
        {"params:\n\tcycle_time_ms: 3\n", ":2: a tab"},
        {"controller: mpi\n", "run mpirun directly"},
        {"  cycle_time_ms: 3\n", ":1: 'cycle_time_ms' is indented but no section"},
        {"params:\n  cycle_time_ms: 3\0 # x\n", ":2: a NUL byte (not a text file?)"},
    };
    for (size_t c = 0; c < KOLO_ARRAY_SIZE(cases); c++) {
        snprintf(bad, sizeof(bad), "%s/bad%zu.yaml", d, c);
        FILE *f = fopen(bad, "w"); /* write_file stops at a NUL */
        KT_ASSERT(f);
        const char *t = cases[c].text;
        size_t tl = strlen(t);
        if (strstr(cases[c].says, "NUL")) tl += 1 + strlen(t + tl + 1);
        KT_EQ(fwrite(t, 1, tl, f), tl);
        fclose(f);
        const char *a[] = {"-np", "1", "--config-file", bad, "true", NULL};
        code = run(&p, a, 10);
        KT_ASSERTF(code == 2, "case %zu: exit %d: %s", c, code, p.ebuf);
        KT_ASSERTF(kt_count(p.ebuf, "\n") == 1, "case %zu: %s", c, p.ebuf);
        KT_ASSERTF(strstr(p.ebuf, cases[c].says), "case %zu: '%s' does not say '%s'", c, p.ebuf, cases[c].says);
    }
    /* a file saved on Windows: a byte-order mark and CRLF line ends */
    snprintf(bad, sizeof(bad), "%s/crlf.yaml", d);
    write_file(bad, "\xEF\xBB\xBFparams:\r\n  cycle_time_ms: 4\r\n", 0644);
    const char *crlf[] = {"-np", "1", "--config-file", bad, "sh", "-c", "echo $KOLO_CYCLE_TIME", NULL};
    code = run(&p, crlf, 10);
    KT_ASSERTF(code == 0, "exit %d: %s", code, p.ebuf);
    KT_CONTAINS(p.obuf, "[0]<stdout>:4\n");
    const char *missing[] = {"-np", "1", "--config-file", "/nonexistent/hvd.yaml", "true", NULL};
    KT_EQ(run(&p, missing, 10), 2);
    KT_CONTAINS(p.ebuf, "cannot read '/nonexistent/hvd.yaml'");
    /* a directory opens like a file and reads as nothing: it was taken for an empty config */
    const char *dir[] = {"-np", "1", "--config-file", d, "true", NULL};
    KT_EQ(run(&p, dir, 10), 2);
    KT_CONTAINS(p.ebuf, "Is a directory");
}

/* --status-file: the job's state as JSON, while it runs and after. */
KT_TEST(kolorun_status_file, 30)
{
    subreaper();
    char *d = tmpdir(), path[4300], check[9000];
    snprintf(path, sizeof(path), "%s/status.json", d);
    const char *args[] = {"-np", "2", "--status-file", path, "sh", "-c",
                          "echo up; if [ $KOLO_RANK = 1 ]; then sleep 1.5; exit 3; fi; sleep 30", NULL};
    kproc p;
    kp_start(&p, args, false);
    kt_proc_wait_for(&p, "<stdout>:up", 2, 10);
    /* while it runs: both workers running, with their real pids */
    char *text = NULL;
    for (double end = now_s() + 5; now_s() < end; usleep(50000)) {
        free(text);
        FILE *f = fopen(path, "r");
        text = f ? calloc(1, 65536) : NULL;
        if (f) {
            size_t n = fread(text, 1, 65535, f);
            text[n] = '\0';
            fclose(f);
        }
        if (text && kt_count(text, "\"state\": \"running\"") == 3) break;
    }
    KT_ASSERTF(text && kt_count(text, "\"state\": \"running\"") == 3, "status while running: %s", text ? text : "(none)");
    const char *q = text;
    for (int r = 0; r < 2; r++) {
        q = strstr(q, "\"pid\": ");
        KT_ASSERT(q);
        int pid = atoi(q + 7);
        KT_ASSERTF(pid > 0 && kill(pid, 0) == 0, "rank %d's pid %d is not alive", r, pid);
        q++;
    }
    free(text);
    int code = kt_proc_finish(&p, 20);
    KT_EQ(code, 3);
    /* the last write: done, its code, who failed and who was terminated; valid JSON */
    snprintf(check, sizeof(check),
             "python3 -c \"import json,sys; s=json.load(open(sys.argv[1])); w=s['workers']; "
             "assert s['state']=='done' and s['exit_code']==3 and s['workers_running']==0, s; "
             "assert 'rank 1' in s['reason'] and 'code 3' in s['reason'], s; "
             "assert w[1]['state']=='failed' and w[1]['exit_code']==3, w; "
             "assert w[0]['state']=='terminated' and w[0]['signal']=='SIGTERM', w\" %s",
             path);
    KT_ASSERTF(system(check) == 0, "final status wrong: see above");
    KT_ASSERT(access(path, F_OK) == 0);
    char tmp[4400];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    KT_ASSERT(access(tmp, F_OK) != 0);
    assert_no_descendants(5);

    /* a file that cannot be written: one warning, the job is not affected */
    const char *a2[] = {"-np", "1", "--status-file", "/nonexistent/dir/status.json", "true", NULL};
    KT_EQ(run(&p, a2, 10), 0);
    KT_EQ(kt_count(p.ebuf, "--status-file: cannot write"), 1);
}

/* --output-ranks: only those ranks' lines reach the console; the files and the failure report
 * still get everyone's. */
KT_TEST(kolorun_output_ranks, 30)
{
    char *d = tmpdir();
    const char *args[] = {"-np", "4", "--output-ranks", "0,2-3", "--output-filename", d, "sh", "-c",
                          "echo out $KOLO_RANK; echo err $KOLO_RANK >&2; [ $KOLO_RANK != 1 ] || { sleep 0.3; exit 5; }",
                          NULL};
    kproc p;
    int code = run(&p, args, 20);
    KT_EQ(code, 5);
    for (int r = 0; r < 4; r++) {
        char o[64], e[64];
        snprintf(o, sizeof(o), "[%d]<stdout>:out %d\n", r, r);
        snprintf(e, sizeof(e), "[%d]<stderr>:err %d\n", r, r);
        KT_ASSERTF((strstr(p.obuf, o) != NULL) == (r != 1), "rank %d's stdout line: %s", r, p.obuf);
        KT_ASSERTF((strstr(p.ebuf, e) != NULL) == (r != 1), "rank %d's stderr line: %s", r, p.ebuf);
    }
    /* rank 1 failed: the report quotes its stderr even though the console did not show it */
    KT_CONTAINS(p.ebuf, "kolorun: rank 1 on host localhost exited with code 5");
    KT_CONTAINS(p.ebuf, "err 1");
    char path[4400], text[256] = "";
    snprintf(path, sizeof(path), "%s/rank.1/stdout", d);
    FILE *f = fopen(path, "r");
    KT_ASSERTF(f, "no %s", path);
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    KT_CONTAINS(text, "out 1");
}

/* --merge-output: a line every rank writes goes out once, tagged with all of them; lines that
 * differ stay per rank; each rank's lines keep their order; with --output-ranks only the shown
 * ranks are named; kolorun's own report of a failure comes after the lines it concerns. */
KT_TEST(kolorun_merge_output, 30)
{
    const char *args[] = {"-np", "4", "--merge-output", "5", "sh", "-c",
                          "echo same line; echo rank $KOLO_RANK alone; echo same end; echo to stderr >&2; "
                          "[ $KOLO_RANK = 2 ] && echo only two >&2; exit 0",
                          NULL};
    kproc p;
    KT_EQ(run(&p, args, 20), 0);
    KT_EQ(kt_count(p.obuf, "same line"), 1);
    KT_CONTAINS(p.obuf, "[0-3]<stdout>:same line\n");
    KT_CONTAINS(p.obuf, "[0-3]<stdout>:same end\n");
    KT_CONTAINS(p.ebuf, "[0-3]<stderr>:to stderr\n");
    KT_CONTAINS(p.ebuf, "[2]<stderr>:only two\n");
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof(want), "[%d]<stdout>:rank %d alone\n", r, r);
        const char *at = strstr(p.obuf, want);
        KT_ASSERTF(at && at > strstr(p.obuf, "same line") && at < strstr(p.obuf, "same end"),
                   "rank %d's own line not between the merged ones:\n%s", r, p.obuf);
    }
    kt_proc_free(&p);

    const char *shown[] = {"-np", "4", "--merge-output", "5", "--output-ranks", "0,2-3", "--tag-output=rank", "sh",
                           "-c", "echo hello; [ $KOLO_RANK = 3 ] && { sleep 0.2; exit 4; }; exit 0", NULL};
    KT_EQ(run(&p, shown, 20), 4);
    KT_CONTAINS(p.obuf, "[0,2-3]<stdout>:hello\n");
    KT_EQ(kt_count(p.obuf, "hello"), 1);
    KT_CONTAINS(p.ebuf, "kolorun: rank 3 on host localhost exited with code 4");
    kt_proc_free(&p);

    const char *bad[] = {"-np", "1", "--merge-output", "0", "true", NULL};
    KT_EQ(run(&p, bad, 10), 2);
    KT_CONTAINS(p.ebuf, "--merge-output: '0' is not a number of seconds between 0.001 and 3600");
    kt_proc_free(&p);
}
