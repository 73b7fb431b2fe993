/* cli.c - kolorun's command line: options, their checks, and the usage text. */
#include "kolorun.h"

#include "../../src/boot/pmix_rdv.h"
#include "../../src/common/common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char usage_text[] =
    "usage: kolorun -np N [-H host1:slots,host2:slots | --hostfile FILE] [options] [--] command [args...]\n"
    "\n"
    "Starts N copies of command as one kolo job: rank, size and the rendezvous address in each\n"
    "worker's environment, output tagged per rank, every worker stopped when one fails.\n"
    "\n"
    "Hosts\n"
    "  -np, -n, --num-proc N         number of workers (default: the slots of -H/--hostfile/allocation)\n"
    "  -H, --hosts h1:s1,h2:s2       hosts and their slots (default: the hosts of the Slurm, PBS or LSF\n"
    "                                allocation kolorun runs in when it spans several, else localhost:N)\n"
    "  --hostfile FILE               lines 'host slots=N' or 'host:N' ('#' starts a comment)\n"
    "  -p, --ssh-port PORT           ssh port for remote hosts\n"
    "  -i, --ssh-identity-file FILE  ssh identity for remote hosts\n"
    "  --ssh COMMAND                 ssh program and options (default: ssh)\n"
    "  --launcher ssh|srun           how workers on remote hosts start (default: srun, a step each,\n"
    "                                when the hosts come from a Slurm allocation and no ssh option\n"
    "                                is given; else ssh)\n"
    "  --local-address ADDR          this machine's address as remote hosts reach it (its workers and\n"
    "                                the store use it; default: the route's towards them)\n"
    "  --start-timeout S             seconds for remote workers to start, and for kolo_init (30)\n"
    "                                (--gloo-timeout-seconds: the same)\n"
    "Elastic jobs (see docs/kolorun.md): the job goes on when workers fail or hosts change\n"
    "  --min-np N                    fewest workers the job may run with (default -np)\n"
    "  --max-np N                    most workers kolorun keeps running (default -np)\n"
    "  --host-discovery-script S     prints the usable hosts, 'host[:slots]' per line; run every second\n"
    "  --slots-per-host N            slots of a discovered host that names none (default 1)\n"
    "  --elastic-timeout S           seconds to wait for --min-np slots (600; KOLO_ELASTIC_TIMEOUT)\n"
    "  --reset-limit N               end the job after N re-formations\n"
    "  --blacklist-cooldown-range MIN MAX  a failed host gets workers again after MIN*2^k s, at most MAX\n"
    "Environment\n"
    "  -x NAME[=VALUE]               set NAME in every worker (no VALUE: this process's value)\n"
    "Output and failure\n"
    "  --tag-output=rank|none        prefix lines with [rank]<stdout>: (default rank)\n"
    "  --prefix-timestamp            prefix lines with the wall-clock time\n"
    "  --output-filename DIR         also write DIR/rank.N/stdout and DIR/rank.N/stderr\n"
    "  --output-ranks LIST           print only these ranks' lines, e.g. 0 or 0,4-7 (the files\n"
    "                                and failure reports still get every rank's)\n"
    "  --merge-output S              print a line that several ranks write within S seconds once,\n"
    "                                tagged with all of them: [0-3,5]<stdout>:... (lines wait S s)\n"
    "  --grace-seconds S             after SIGTERM, wait S seconds before SIGKILL (default 5)\n"
    "  --timeout S                   stop the job when it has run S seconds (exit code 124)\n"
    "  --status-file FILE            keep the job's state in FILE as JSON (workers, pids, states,\n"
    "                                exit codes, output idle times), rewritten at each change\n"
    "  --get-stack-traces            at --timeout, first print every worker's stacks\n"
    "                                (gdb's native ones; Python's, for workers that import kolo)\n"
    "                                and each rank's kolo status (KOLO_STATUS_SIGNAL=USR1)\n"
    "CPU binding of local workers\n"
    "  --bind-to auto|none|core|socket|numa  (default auto: none, but where a host has more\n"
    "                                workers than CPUs, neighbouring ranks in blocks on one CPU each)\n"
    "  --map-by slot|core|socket|numa    (default slot)\n"
    "  --report-bindings             print each rank's CPU set at start\n"
    "Engine settings (exported as KOLO_* variables)\n"
    "  --fusion-threshold-mb N       KOLO_FUSION_THRESHOLD = N MiB; 0 disables fusion\n"
    "  --cycle-time-ms MS            KOLO_CYCLE_TIME\n"
    "  --cache-capacity N            KOLO_CACHE_CAPACITY; 0 disables the response cache\n"
    "  --timeline-filename FILE      KOLO_TIMELINE\n"
    "  --timeline-mark-cycles        KOLO_TIMELINE_MARK_CYCLES=1\n"
    "  --no-stall-check              KOLO_STALL_CHECK_DISABLE=1\n"
    "  --stall-check-warning-time-seconds S   KOLO_STALL_CHECK_TIME\n"
    "  --stall-check-shutdown-time-seconds S  KOLO_STALL_SHUTDOWN_TIME\n"
    "  --log-level LEVEL             KOLO_LOG_LEVEL: trace, debug, info, warning, error, none\n"
    "  --network-interface(s) IFS    KOLO_IFACE, e.g. eth0 or eth0,eth1\n"
    "  --tcp                         KOLO_TRANSPORT=tcp (no shared memory)\n"
    "  --hierarchical-allreduce      KOLO_HIERARCHICAL_ALLREDUCE=1: allreduces across hosts from\n"
    "                                256 KiB in three stages, reducescatters from 256 KiB in two\n"
    "                                (default auto: allreduces from 1 MiB)\n"
    "  --no-hierarchical-allreduce   KOLO_HIERARCHICAL_ALLREDUCE=0: never in stages\n"
    "  --hierarchical-allgather      KOLO_HIERARCHICAL_ALLGATHER=1: allgathers across hosts from\n"
    "                                256 KiB across the hosts first (default auto: from 1 MiB)\n"
    "  --no-hierarchical-allgather   KOLO_HIERARCHICAL_ALLGATHER=0\n"
    "  --config-file FILE            horovodrun's YAML config (params, autotune, timeline,\n"
    "                                stall_check, library_options, logging); options win\n"
    "  --log-with-timestamp, --log-without-timestamp   KOLO_LOG_TIME=1 / 0\n"
    "  --autotune                    KOLO_AUTOTUNE=1: tune fusion and cycle time while the job runs\n"
    "  --autotune-log-file FILE      KOLO_AUTOTUNE_LOG (CSV of the samples)\n"
    "  --autotune-warmup-samples N   KOLO_AUTOTUNE_WARMUP_SAMPLES (3)\n"
    "  --autotune-steps-per-sample N KOLO_AUTOTUNE_STEPS_PER_SAMPLE (10)\n"
    "  --autotune-bayes-opt-max-samples N     KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (20)\n"
    "  --autotune-gaussian-process-noise X    KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (0.8)\n"
    "horovodrun's --gloo, --disable-cache and --no-torus-allreduce are accepted and change nothing;\n"
    "its --mpi, --torus-allreduce, --num-nccl-streams ... are refused, saying why.\n"
    "Information\n"
    "  -h, --help                    this text\n"
    "  -v, --version                 the version\n"
    "  --help-env                    every KOLO_* setting with its aliases, default and meaning\n"
    "  -cb, --check-build            what this build supports\n"
    "  --verbose                     print what kolorun does\n"
    "\n"
    "Exit code: 0 when every worker exits 0; else the failing worker's code (the lowest rank's\n"
    "when several fail together; 128+N for a worker killed by signal N); 128+N when kolorun\n"
    "itself got signal N; 124 after --timeout; 2 for a usage error; 127/126 for a command that\n"
    "cannot be run.\n";

int kr_usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kr_say("error: %s (see kolorun --help)", msg);
    return KR_EXIT_USAGE;
}

/* Prints a setting's help indented by 4 and folded at HELP_WIDTH columns: each of its lines (a
 * '\n' in the table starts one) a paragraph of its own, folded under its first word when that
 * is a value ("auto:") or a dash, so that the values and the cases of a long setting stand out. */
#define HELP_WIDTH 96

static void print_help_text(const char *s)
{
    while (*s) {
        size_t len = strcspn(s, "\n");
        size_t hang = 0; /* where the folded lines of this paragraph start, after the indent */
        size_t first = strcspn(s, " \n"); /* the first word's length */
        bool value = first > 0 && first <= 8 && s[first - 1] == ':', dash = first == 1 && s[0] == '-';
        if (first < len && (value || dash)) hang = first + 1;
        size_t col = 0, at = 0; /* col: the output line's width after the indent */
        bool words = false;     /* whether the output line holds a word yet (a longer word stays whole) */
        printf("    ");
        while (at < len) {
            size_t w = strcspn(s + at, " \n"); /* (stops at the paragraph's end, '\n' or NUL) */
            if (words && 4 + col + 1 + w > HELP_WIDTH) {
                printf("\n    %*s", (int)hang, "");
                col = hang;
            } else if (words) {
                putchar(' ');
                col++;
            }
            fwrite(s + at, 1, w, stdout);
            col += w;
            words = w > 0;
            at += w;
            while (at < len && s[at] == ' ') at++;
        }
        putchar('\n');
        s += len + (s[len] == '\n');
    }
}

static int print_help_env(void)
{
    size_t n;
    const kolo__setting_info *t = kolo__setting_table(&n);
    printf("kolo settings: each is read from the environment of every worker; kolorun's options set\n"
           "some of them, -x NAME=VALUE sets any. Horovod's names are accepted as aliases.\n\n");
    for (size_t i = 0; i < n; i++) {
        printf("%s\n", t[i].name);
        if (t[i].aliases[0]) printf("    aliases: %s\n", t[i].aliases);
        printf("    default: %s\n", t[i].def[0] ? t[i].def : "(unset)");
        print_help_text(t[i].help);
    }
    return 0;
}

static int print_check_build(void)
{
    printf("kolo v%s:\n\n", KOLO_VERSION_STRING);
    printf("Available transports:\n"
           "    [X] shm  (shared memory between ranks of one host; large messages single-copy (CMA) or\n"
           "             through the ring, whichever each pair measures faster: KOLO_SHM_CMA)\n"
           "    [X] tcp  (between hosts; also on one host with KOLO_TRANSPORT=tcp)\n\n");
    /* The bindings are pure Python over libkolo.so (python/kolo): nothing here is compiled
     * against a framework, so what a given interpreter can import is its own business. */
    printf("Available frameworks (python/kolo over libkolo.so, pure Python, nothing compiled):\n"
           "    [X] NumPy        [X] PyTorch        [X] TensorFlow/Keras\n"
           "    (check an interpreter with: python3 -c 'import kolo.torch')\n\n");
    printf("Engine: named asynchronous requests, negotiation, response cache, fusion, timeline\n\n");
    printf("Launchers kolo workers start under (environment detection, no MPI library linked):\n"
           "    [X] kolorun      (KOLO_*)\n"
           "    [X] horovodrun --gloo (HOROVOD_* + HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT)\n"
           "    [X] torchrun     (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)\n"
           "    [X] mpirun       (Open MPI OMPI_COMM_WORLD_*, MPICH/Hydra PMI_*, PMIx)\n"
           "                     across hosts: %s\n"
           "    [X] srun         (SLURM_PROCID, SLURM_NTASKS, first host of the node list)\n"
           "    [X] Kubernetes   (MPIJob: mpirun; PyTorchJob: RANK, WORLD_SIZE, MASTER_ADDR/PORT;\n"
           "                     TrainJob without torchrun: PET_NNODES, PET_NODE_RANK, one rank per pod)\n"
           "    [X] Spark        (kolo.spark.run: a barrier stage, one rank per task)\n"
           "    [X] Ray          (kolo.ray.RayExecutor: one rank per actor, a placement group)\n"
           "    [X] by hand      (KOLO_RANK, KOLO_SIZE, KOLO_RENDEZVOUS, KOLO_RENDEZVOUS_SERVER=rank0)\n\n",
           kolo__pmix_built() ? "rank 0's address through mpirun's PMIx (libpmix.so.2, opened at run time)"
                              : "KOLO_RENDEZVOUS (built without pmix.h: no PMIx rendezvous)");
    printf("kolorun: local workers with fork/exec, remote ones over ssh; CPU binding %s\n",
           "from /sys (core, socket, numa)");
    return 0;
}

/* ---- value parsing ---- */

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* Setting strings are made once per run and live until exit. */
static int add_setting(kr_opts *o, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int add_setting(kr_opts *o, const char *name, const char *fmt, ...)
{
    char val[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof(val), fmt, ap);
    va_end(ap);
    size_t len = strlen(name) + strlen(val) + 2;
    char *kv = malloc(len);
    const char **grown = realloc(o->setenv, (size_t)(o->nsetenv + 1) * sizeof(*grown));
    if (!kv || !grown) {
        free(kv);
        if (grown) o->setenv = grown;
        kr_say("error: out of memory");
        return KR_EXIT_LAUNCH;
    }
    snprintf(kv, len, "%s=%s", name, val);
    o->setenv = grown;
    o->setenv[o->nsetenv++] = kv;
    return -1;
}

static int parse_enum(const char *opt, const char *v, const char *const *names, int count, int *out)
{
    for (int i = 0; i < count; i++)
        if (strcasecmp(v, names[i]) == 0) {
            *out = i;
            return -1;
        }
    char list[256] = "";
    for (int i = 0; i < count; i++) {
        strncat(list, names[i], sizeof(list) - strlen(list) - 1);
        if (i + 1 < count) strncat(list, "|", sizeof(list) - strlen(list) - 1);
    }
    return kr_usage_error("%s: '%s' is not one of %s", opt, v, list);
}

/* Options that take a value. `names` lists every spelling, separated by spaces. */
typedef enum {
    O_NP, O_HOSTS, O_HOSTFILE, O_X, O_SSH_PORT, O_SSH_ID, O_SSH, O_START_TIMEOUT, O_GRACE,
    O_TAG_OUTPUT, O_OUTPUT_FILENAME, O_BIND_TO, O_MAP_BY, O_FUSION, O_CYCLE, O_CACHE, O_TIMELINE,
    O_STALL_WARN, O_STALL_SHUTDOWN, O_LOG_LEVEL, O_IFACE, O_MIN_NP, O_MAX_NP, O_DISCOVERY, O_SLOTS_PER_HOST,
    O_ELASTIC_TIMEOUT, O_RESET_LIMIT, O_COOLDOWN, O_TIMEOUT, O_GLOO_TIMEOUT, O_HVD_VALUE, O_CONFIG, O_STATUS,
    O_OUT_RANKS, O_LOCAL_ADDR, O_LAUNCHER, O_MERGE, O_AT_LOG, O_AT_WARMUP, O_AT_STEPS, O_AT_MAX, O_AT_NOISE,
    /* flags (no value) from here */
    O_FLAGS_START,
    O_PREFIX_TS = O_FLAGS_START, O_REPORT_BINDINGS, O_MARK_CYCLES, O_NO_STALL, O_AUTOTUNE, O_STACKS, O_TCP,
    O_GLOO, O_NO_CACHE, O_LOG_TS, O_LOG_NO_TS, O_HIER, O_NO_HIER, O_HIER_AG, O_NO_HIER_AG, O_HVD_OFF, O_HVD_FLAG, O_HELP, O_VERSION,
    O_HELP_ENV, O_CHECK_BUILD, O_VERBOSE, O_COUNT
} opt_id;

static const struct {
    opt_id id;
    const char *names;
} options[] = {
    {O_NP, "-np -n --num-proc -N"},
    {O_HOSTS, "-H --hosts --host -host"},
    {O_HOSTFILE, "--hostfile -hostfile"},
    {O_X, "-x"},
    {O_SSH_PORT, "-p --ssh-port"},
    {O_SSH_ID, "-i --ssh-identity-file"},
    {O_SSH, "--ssh"},
    {O_LOCAL_ADDR, "--local-address"},
    {O_LAUNCHER, "--launcher"},
    {O_START_TIMEOUT, "--start-timeout"},
    {O_GRACE, "--grace-seconds"},
    {O_TAG_OUTPUT, "--tag-output"},
    {O_OUTPUT_FILENAME, "--output-filename"},
    {O_BIND_TO, "--bind-to -bind-to"},
    {O_MAP_BY, "--map-by -map-by"},
    {O_FUSION, "--fusion-threshold-mb"},
    {O_CYCLE, "--cycle-time-ms"},
    {O_CACHE, "--cache-capacity"},
    {O_TIMELINE, "--timeline-filename"},
    {O_STALL_WARN, "--stall-check-warning-time-seconds"},
    {O_STALL_SHUTDOWN, "--stall-check-shutdown-time-seconds"},
    {O_LOG_LEVEL, "--log-level"},
    {O_IFACE, "--network-interface --network-interfaces"},
    {O_MIN_NP, "--min-np --min-num-proc"},
    {O_MAX_NP, "--max-np --max-num-proc"},
    {O_DISCOVERY, "--host-discovery-script"},
    {O_SLOTS_PER_HOST, "--slots-per-host --slots"},
    {O_ELASTIC_TIMEOUT, "--elastic-timeout"},
    {O_RESET_LIMIT, "--reset-limit"},
    {O_COOLDOWN, "--blacklist-cooldown-range"},
    {O_TIMEOUT, "--timeout -timeout"},
    {O_GLOO_TIMEOUT, "--gloo-timeout-seconds"},
    {O_HVD_VALUE, "--mpi-args --binding-args --num-nccl-streams --thread-affinity"},
    {O_CONFIG, "--config-file"},
    {O_STATUS, "--status-file"},
    {O_OUT_RANKS, "--output-ranks"},
    {O_MERGE, "--merge-output"},
    {O_AT_LOG, "--autotune-log-file"},
    {O_AT_WARMUP, "--autotune-warmup-samples"},
    {O_AT_STEPS, "--autotune-steps-per-sample"},
    {O_AT_MAX, "--autotune-bayes-opt-max-samples"},
    {O_AT_NOISE, "--autotune-gaussian-process-noise"},
    {O_PREFIX_TS, "--prefix-timestamp -prefix-timestamp --prefix-output-with-timestamp"},
    {O_REPORT_BINDINGS, "--report-bindings"},
    {O_MARK_CYCLES, "--timeline-mark-cycles"},
    {O_NO_STALL, "--no-stall-check"},
    {O_AUTOTUNE, "--autotune"},
    {O_STACKS, "--get-stack-traces -get-stack-traces"},
    {O_TCP, "--tcp"},
    {O_GLOO, "--gloo"},
    {O_NO_CACHE, "--disable-cache"},
    {O_LOG_TS, "--log-with-timestamp"},
    {O_LOG_NO_TS, "--log-without-timestamp --log-hide-timestamp"},
    {O_HIER, "--hierarchical-allreduce"},
    {O_NO_HIER, "--no-hierarchical-allreduce"},
    {O_HIER_AG, "--hierarchical-allgather"},
    {O_NO_HIER_AG, "--no-hierarchical-allgather"},
    {O_HVD_OFF, "--no-torus-allreduce"},
    {O_HVD_FLAG, "--mpi --jsrun --torus-allreduce "
                 "--mpi-threads-disable"},
    {O_HELP, "-h --help"},
    {O_VERSION, "-v --version"},
    {O_HELP_ENV, "--help-env"},
    {O_CHECK_BUILD, "-cb --check-build"},
    {O_VERBOSE, "--verbose"},
};

/* Finds the option named by arg (up to '=' for long options). */
static int lookup(const char *arg, size_t len)
{
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(options); i++) {
        const char *p = options[i].names;
        while (*p) {
            size_t n = strcspn(p, " ");
            if (n == len && strncmp(p, arg, len) == 0) return (int)options[i].id;
            p += n;
            while (*p == ' ') p++;
        }
    }
    return -1;
}

/* --output-ranks "0,2,4-7": ranges of ranks. */
static int parse_ranks(kr_opts *o, const char *opt, const char *v)
{
    free(o->out_ranks);
    o->out_ranks = NULL;
    o->n_out_ranks = 0;
    size_t items = 1;
    for (const char *p = v; *p; p++) items += *p == ',';
    o->out_ranks = calloc(items, sizeof(*o->out_ranks));
    if (!o->out_ranks) return kr_usage_error("out of memory");
    const char *p = v;
    for (size_t i = 0; i < items; i++) {
        char *end;
        errno = 0;
        /* digits only: strtol would take "1- 5" (a space, or a sign, before a number) */
        long a = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1, b = a;
        if (a < 0 || a > (1L << 30) || errno)
            return kr_usage_error("%s: item %zu of '%s' is not a rank or a range like 4-7", opt, i + 1, v);
        if (*end == '-') {
            const char *q = end + 1;
            b = isdigit((unsigned char)*q) ? strtol(q, &end, 10) : -1;
            if (b < a || b > (1L << 30))
                return kr_usage_error("%s: item %zu of '%s' is not a range like 4-7", opt, i + 1, v);
        }
        if (*end != ',' && *end != '\0')
            return kr_usage_error("%s: item %zu of '%s' is not a rank or a range like 4-7", opt, i + 1, v);
        o->out_ranks[i][0] = (int)a;
        o->out_ranks[i][1] = (int)b;
        p = end + 1;
    }
    o->n_out_ranks = (int)items;
    return -1;
}

/* horovodrun's options that have no meaning for kolorun: why, and what to do instead. */
static int horovod_only(const char *opt, const char *where)
{
    static const struct {
        const char *opt, *why;
    } why[] = {
        {"--mpi", "kolorun starts the workers itself (as horovodrun --gloo); to start them with mpirun, run "
                  "mpirun directly (kolo reads its ranks)"},
        {"--jsrun", "kolorun starts the workers itself; to start them with jsrun, run jsrun directly"},
        {"--mpi-args", "kolorun does not run mpirun (binding: --bind-to, --map-by)"},
        {"--binding-args", "kolorun does not run mpirun: use --bind-to and --map-by"},
        {"--mpi-threads-disable", "kolo does not use MPI"},
        {"--num-nccl-streams", "this kolo has no NCCL (no GPU collectives yet)"},
        {"--thread-affinity", "kolo has no setting to pin its engine thread: --bind-to pins the whole worker"},
        {"--torus-allreduce", "kolo has no torus allreduce (Horovod's needs NCCL)"},
        {"--ccl-bgt-affinity", "kolo has no oneCCL"},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(why); i++)
        if (!strcmp(opt, why[i].opt))
            return kr_usage_error("%s%s%s is horovodrun's: %s", where ? where : "", where ? ": " : "", opt, why[i].why);
    return kr_usage_error("%s is horovodrun's and means nothing to kolorun", opt);
}

static int apply(kr_opts *o, opt_id id, const char *opt, const char *v)
{
    long l;
    double d;
    switch (id) {
    case O_NP:
        if (!parse_int(v, 1, 1 << 20, &l)) return kr_usage_error("%s: '%s' is not a positive integer", opt, v);
        o->np = (int)l;
        return -1;
    case O_HOSTS:
        if (o->hostfile) return kr_usage_error("%s: give -H or --hostfile, not both", opt);
        o->hosts_arg = v;
        return -1;
    case O_HOSTFILE:
        if (o->hosts_arg) return kr_usage_error("%s: give -H or --hostfile, not both", opt);
        o->hostfile = v;
        return -1;
    case O_X: {
        size_t n = strcspn(v, "=");
        if (n == 0) return kr_usage_error("-x '%s': expected NAME or NAME=VALUE", v);
        for (size_t i = 0; i < n; i++)
            if (!(isalnum((unsigned char)v[i]) || v[i] == '_') || (i == 0 && isdigit((unsigned char)v[0])))
                return kr_usage_error("-x '%s': '%.*s' is not a variable name", v, (int)n, v);
        const char **grown = realloc(o->xenv, (size_t)(o->nxenv + 1) * sizeof(*grown));
        if (!grown) return kr_usage_error("out of memory");
        o->xenv = grown;
        o->xenv[o->nxenv++] = v;
        return -1;
    }
    case O_SSH_PORT:
        if (!parse_int(v, 1, 65535, &l)) return kr_usage_error("%s: '%s' is not a port (1-65535)", opt, v);
        o->ssh_port = (int)l;
        o->ssh_given = true;
        return -1;
    case O_SSH_ID:
        o->ssh_identity = v;
        o->ssh_given = true;
        return -1;
    case O_SSH:
        if (!*v) return kr_usage_error("%s: empty command", opt);
        o->ssh_cmd = v;
        o->ssh_given = true;
        return -1;
    case O_LAUNCHER:
        if (strcmp(v, "ssh") == 0) o->launcher = KR_LAUNCH_SSH;
        else if (strcmp(v, "srun") == 0) o->launcher = KR_LAUNCH_SRUN;
        else return kr_usage_error("%s: '%s' is neither ssh nor srun", opt, v);
        return -1;
    case O_LOCAL_ADDR:
        if (!*v || strlen(v) + 2 >= KR_ADDR_MAX || !kr_host_is_local(v) || !strcmp(v, "localhost") ||
            !strncmp(v, "127.", 4) || !strcmp(v, "::1"))
            return kr_usage_error("%s: '%s' is not a non-loopback address of this machine", opt, v);
        snprintf(o->local_addr, sizeof(o->local_addr), strchr(v, ':') && v[0] != '[' ? "[%s]" : "%s", v);
        return -1;
    case O_START_TIMEOUT:
        if (!parse_num(v, 0.001, 1e7, &d)) return kr_usage_error("%s: '%s' is not a positive number of seconds", opt, v);
        o->start_timeout = d;
        o->start_timeout_given = true;
        return add_setting(o, "KOLO_START_TIMEOUT", "%s", v);
    case O_GRACE:
        if (!parse_num(v, 0, 1e6, &d)) return kr_usage_error("%s: '%s' is not a number of seconds >= 0", opt, v);
        o->grace = d;
        return -1;
    case O_TAG_OUTPUT: {
        static const char *const names[] = {"none", "rank"};
        int t = 1;
        int r = parse_enum(opt, v, names, 2, &t);
        o->tag_output = t == 1;
        return r;
    }
    case O_OUTPUT_FILENAME:
        if (!*v) return kr_usage_error("%s: empty directory name", opt);
        o->output_dir = v;
        return -1;
    case O_BIND_TO: {
        static const char *const names[] = {"auto", "none", "core", "socket", "numa"};
        int t = 0;
        int r = parse_enum(opt, v, names, 5, &t);
        o->bind_to = (enum kr_bind)t;
        return r;
    }
    case O_MAP_BY: {
        static const char *const names[] = {"slot", "core", "socket", "numa"};
        int t = 0;
        int r = parse_enum(opt, v, names, 4, &t);
        o->map_by = (enum kr_map)t;
        return r;
    }
    case O_FUSION:
        if (!parse_num(v, 0, 1 << 20, &d)) return kr_usage_error("%s: '%s' is not a number of MiB >= 0", opt, v);
        return add_setting(o, "KOLO_FUSION_THRESHOLD", "%llu", (unsigned long long)llround(d * 1048576.0));
    case O_CYCLE:
        if (!parse_num(v, 0.001, 1e6, &d)) return kr_usage_error("%s: '%s' is not a positive number of ms", opt, v);
        return add_setting(o, "KOLO_CYCLE_TIME", "%s", v);
    case O_CACHE:
        if (!parse_int(v, 0, 1L << 30, &l)) return kr_usage_error("%s: '%s' is not an integer >= 0", opt, v);
        return add_setting(o, "KOLO_CACHE_CAPACITY", "%ld", l);
    case O_TIMELINE:
        if (!*v) return kr_usage_error("%s: empty file name", opt);
        return add_setting(o, "KOLO_TIMELINE", "%s", v);
    case O_STALL_WARN:
        if (!parse_num(v, 0, 1e7, &d)) return kr_usage_error("%s: '%s' is not a number of seconds >= 0", opt, v);
        return add_setting(o, "KOLO_STALL_CHECK_TIME", "%s", v);
    case O_STALL_SHUTDOWN:
        if (!parse_num(v, 0, 1e7, &d)) return kr_usage_error("%s: '%s' is not a number of seconds >= 0", opt, v);
        return add_setting(o, "KOLO_STALL_SHUTDOWN_TIME", "%s", v);
    case O_TIMEOUT:
        if (!parse_num(v, 0.001, 1e9, &d)) return kr_usage_error("%s: '%s' is not a positive number of seconds", opt, v);
        o->timeout = d;
        return -1;
    case O_GLOO_TIMEOUT: /* horovodrun's name for the rendezvous wait (HOROVOD_GLOO_TIMEOUT_SECONDS) */
        return apply(o, O_START_TIMEOUT, opt, v);
    case O_HVD_VALUE:
    case O_HVD_FLAG: return horovod_only(opt, NULL);
    case O_OUT_RANKS: return parse_ranks(o, opt, v);
    case O_MERGE:
        if (!parse_num(v, 0.001, 3600, &d))
            return kr_usage_error("%s: '%s' is not a number of seconds between 0.001 and 3600", opt, v);
        o->merge_window = d;
        return -1;
    case O_STATUS:
        if (!*v) return kr_usage_error("%s: empty file name", opt);
        o->status_file = v;
        return -1;
    case O_CONFIG:
        if (!*v) return kr_usage_error("%s: empty file name", opt);
        o->config_file = v;
        return -1;
    case O_AT_LOG:
        if (!*v) return kr_usage_error("%s: empty file name", opt);
        return add_setting(o, "KOLO_AUTOTUNE_LOG", "%s", v);
    case O_AT_WARMUP:
        if (!parse_int(v, 0, 1000000, &l)) return kr_usage_error("%s: '%s' is not an integer >= 0", opt, v);
        return add_setting(o, "KOLO_AUTOTUNE_WARMUP_SAMPLES", "%ld", l);
    case O_AT_STEPS:
        if (!parse_int(v, 1, 1000000, &l)) return kr_usage_error("%s: '%s' is not a positive integer", opt, v);
        return add_setting(o, "KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "%ld", l);
    case O_AT_MAX:
        if (!parse_int(v, 1, 64, &l)) return kr_usage_error("%s: '%s' is not an integer in 1..64", opt, v);
        return add_setting(o, "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "%ld", l);
    case O_AT_NOISE:
        if (!parse_num(v, 1e-6, 1e6, &d)) return kr_usage_error("%s: '%s' is not a number > 0", opt, v);
        return add_setting(o, "KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "%s", v);
    case O_LOG_LEVEL: {
        /* Horovod spells them in capitals and has FATAL; kolo's table has none instead. */
        static const char *const names[] = {"trace", "debug", "info", "warning", "error", "fatal", "none", "warn"};
        int t = 0;
        int r = parse_enum(opt, v, names, 8, &t);
        if (r != -1) return r;
        static const char *const canon[] = {"trace", "debug", "info", "warning", "error", "error", "none", "warning"};
        return add_setting(o, "KOLO_LOG_LEVEL", "%s", canon[t]);
    }
    case O_IFACE:
        if (!*v) return kr_usage_error("%s: empty interface list", opt);
        return add_setting(o, "KOLO_IFACE", "%s", v);
    case O_MIN_NP:
    case O_MAX_NP:
        if (!parse_int(v, 1, 1 << 20, &l)) return kr_usage_error("%s: '%s' is not a positive integer", opt, v);
        *(id == O_MIN_NP ? &o->min_np : &o->max_np) = (int)l;
        o->elastic = true;
        return -1;
    case O_DISCOVERY:
        if (!*v) return kr_usage_error("%s: empty command", opt);
        o->discovery = v;
        o->elastic = true;
        return -1;
    case O_SLOTS_PER_HOST:
        if (!parse_int(v, 1, 1 << 20, &l)) return kr_usage_error("%s: '%s' is not a positive integer", opt, v);
        o->slots_per_host = (int)l;
        return -1;
    case O_ELASTIC_TIMEOUT:
        if (!parse_num(v, 0.001, 1e7, &d)) return kr_usage_error("%s: '%s' is not a positive number of seconds", opt, v);
        o->elastic_timeout = d;
        return add_setting(o, "KOLO_ELASTIC_TIMEOUT", "%s", v);
    case O_RESET_LIMIT:
        if (!parse_int(v, 0, 1L << 30, &l)) return kr_usage_error("%s: '%s' is not an integer >= 0", opt, v);
        o->reset_limit = (int)l;
        return -1;
    case O_COOLDOWN: {
        double lo, hi;
        char extra;
        /* Horovod's two words, or one "MIN,MAX" / "MIN MAX" */
        if (sscanf(v, "%lf%*[ ,]%lf %c", &lo, &hi, &extra) != 2 || !(lo >= 1 && hi >= lo && hi <= 3600))
            return kr_usage_error("%s '%s': expected MIN MAX, seconds with 1 <= MIN <= MAX <= 3600", opt, v);
        o->cooldown_min = lo;
        o->cooldown_max = hi;
        return -1;
    }
    case O_PREFIX_TS: o->prefix_timestamp = true; return -1;
    case O_REPORT_BINDINGS: o->report_bindings = true; return -1;
    case O_MARK_CYCLES: return add_setting(o, "KOLO_TIMELINE_MARK_CYCLES", "1");
    case O_NO_STALL: return add_setting(o, "KOLO_STALL_CHECK_DISABLE", "1");
    case O_AUTOTUNE: return add_setting(o, "KOLO_AUTOTUNE", "1");
    case O_TCP: return add_setting(o, "KOLO_TRANSPORT", "tcp");
    case O_HIER: return add_setting(o, "KOLO_HIERARCHICAL_ALLREDUCE", "1");
    case O_NO_HIER: return add_setting(o, "KOLO_HIERARCHICAL_ALLREDUCE", "0");
    case O_HIER_AG: return add_setting(o, "KOLO_HIERARCHICAL_ALLGATHER", "1");
    case O_NO_HIER_AG: return add_setting(o, "KOLO_HIERARCHICAL_ALLGATHER", "0");
    case O_GLOO: return -1;     /* horovodrun's controller choice: kolorun's own is Gloo mode's */
    case O_NO_CACHE: return -1; /* horovodrun caches its ssh checks for an hour; kolorun caches nothing */
    case O_HVD_OFF: return -1;  /* kolo has none of them to turn off */
    case O_LOG_TS: return add_setting(o, "KOLO_LOG_TIME", "1");
    case O_LOG_NO_TS: return add_setting(o, "KOLO_LOG_TIME", "0");
    case O_STACKS:
        o->stack_traces = true;
        /* every rank prints its kolo status on SIGUSR1 (kolo_status_json), unless the user chose */
        if (!getenv("KOLO_STATUS_SIGNAL") && add_setting(o, "KOLO_STATUS_SIGNAL", "USR1") != -1) return KR_EXIT_LAUNCH;
        return add_setting(o, "KOLO_STACK_TRACES", "1"); /* Python workers print their stacks on SIGUSR2 */
    case O_HELP: fputs(usage_text, stdout); return 0;
    case O_VERSION: printf("kolorun (kolo) %s\n", KOLO_VERSION_STRING); return 0;
    case O_HELP_ENV: return print_help_env();
    case O_CHECK_BUILD: return print_check_build();
    case O_VERBOSE: o->verbose = true; return -1;
    case O_COUNT: break;
    }
    return kr_usage_error("internal: option %s", opt);
}

void kr_opts_free(kr_opts *o)
{
    for (int i = 0; i < o->nsetenv; i++) free((void *)(uintptr_t)o->setenv[i]);
    free(o->setenv);
    free(o->xenv);
    free(o->hosts);
    free(o->out_ranks);
    o->out_ranks = NULL;
    o->n_out_ranks = 0;
    o->setenv = o->xenv = NULL;
    o->hosts = NULL;
    o->nsetenv = o->nxenv = o->nhosts = 0;
}

/* ---- --config-file: horovodrun's YAML keys, as the options they stand for ---- */

enum { CK_VALUE, CK_IF_TRUE, CK_BOOL_PAIR };
static const struct {
    const char *section, *key;
    int kind;
    opt_id id, id_false; /* CK_IF_TRUE: id when true, nothing when false; CK_BOOL_PAIR: id or id_false */
    const char *refused;  /* horovodrun's option that kolorun refuses, for a value that asks for it */
} config_keys[] = {
    {"params", "fusion_threshold_mb", CK_VALUE, O_FUSION, 0, NULL},
    {"params", "cycle_time_ms", CK_VALUE, O_CYCLE, 0, NULL},
    {"params", "cache_capacity", CK_VALUE, O_CACHE, 0, NULL},
    {"params", "hierarchical_allreduce", CK_BOOL_PAIR, O_HIER, O_NO_HIER, NULL},
    {"params", "hierarchical_allgather", CK_BOOL_PAIR, O_HIER_AG, O_NO_HIER_AG, NULL},
    {"autotune", "enabled", CK_IF_TRUE, O_AUTOTUNE, 0, NULL},
    {"autotune", "log_file", CK_VALUE, O_AT_LOG, 0, NULL},
    {"autotune", "warmup_samples", CK_VALUE, O_AT_WARMUP, 0, NULL},
    {"autotune", "steps_per_sample", CK_VALUE, O_AT_STEPS, 0, NULL},
    {"autotune", "bayes_opt_max_samples", CK_VALUE, O_AT_MAX, 0, NULL},
    {"autotune", "gaussian_process_noise", CK_VALUE, O_AT_NOISE, 0, NULL},
    {"timeline", "filename", CK_VALUE, O_TIMELINE, 0, NULL},
    {"timeline", "mark_cycles", CK_IF_TRUE, O_MARK_CYCLES, 0, NULL},
    {"stall_check", "enabled", CK_BOOL_PAIR, O_COUNT, O_NO_STALL, NULL}, /* true: the default */
    {"stall_check", "warning_time_seconds", CK_VALUE, O_STALL_WARN, 0, NULL},
    {"stall_check", "shutdown_time_seconds", CK_VALUE, O_STALL_SHUTDOWN, 0, NULL},
    {"library_options", "gloo_timeout_seconds", CK_VALUE, O_GLOO_TIMEOUT, 0, NULL},
    {"library_options", "mpi_threads_disable", CK_IF_TRUE, O_HVD_FLAG, 0, "--mpi-threads-disable"},
    {"library_options", "num_nccl_streams", CK_VALUE, O_HVD_VALUE, 0, "--num-nccl-streams"},
    {"library_options", "ccl_bgt_affinity", CK_VALUE, O_HVD_VALUE, 0, "--ccl-bgt-affinity"},
    {"logging", "level", CK_VALUE, O_LOG_LEVEL, 0, NULL},
    {"logging", "with_timestamp", CK_BOOL_PAIR, O_LOG_TS, O_LOG_NO_TS, NULL},
};

typedef struct {
    kr_opts *o;
    const bool *given; /* [O_COUNT]: options of the command line, which win over the file */
} config_ctx;

static int parse_bool(const char *v, bool *out)
{
    static const char *const t[] = {"true", "yes", "on", "1"}, *const f[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) return *out = true, 1;
        if (!strcasecmp(v, f[i])) return *out = false, 1;
    }
    return 0;
}

static int config_value(void *ctxp, const char *section, const char *key, const char *v, const char *path, int line)
{
    config_ctx *c = ctxp;
    char where[512];
    snprintf(where, sizeof(where), "%s:%d: %s%s%s", path, line, section, *section ? "." : "", key);
    if (!*section && !strcmp(key, "controller")) {
        if (!strcasecmp(v, "gloo")) return -1;
        if (!strcasecmp(v, "mpi")) return horovod_only("--mpi", where);
        return kr_usage_error("%s: '%s' is not a controller (gloo)", where, v);
    }
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(config_keys); i++) {
        if (strcmp(config_keys[i].section, section) || strcmp(config_keys[i].key, key)) continue;
        opt_id id = config_keys[i].id, idf = config_keys[i].id_false;
        bool b = false;
        if (config_keys[i].kind != CK_VALUE && !parse_bool(v, &b))
            return kr_usage_error("%s: '%s' is not true or false", where, v);
        /* the command line wins, whatever the order (as horovodrun) */
        bool start = id == O_START_TIMEOUT || id == O_GLOO_TIMEOUT;
        if ((id < O_COUNT && c->given[id]) || (config_keys[i].kind == CK_BOOL_PAIR && c->given[idf]) ||
            (start && (c->given[O_START_TIMEOUT] || c->given[O_GLOO_TIMEOUT])))
            return -1;
        if (config_keys[i].refused && (config_keys[i].kind == CK_VALUE || b))
            return horovod_only(config_keys[i].refused, where);
        switch (config_keys[i].kind) {
        case CK_VALUE: return apply(c->o, id, where, v);
        case CK_IF_TRUE: return b ? apply(c->o, id, where, NULL) : -1;
        default: {
            opt_id use = b ? id : idf;
            return use < O_COUNT ? apply(c->o, use, where, NULL) : -1;
        }
        }
    }
    char known[1024] = "";
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(config_keys); i++)
        if (!strcmp(config_keys[i].section, section)) {
            strncat(known, *known ? ", " : "", sizeof(known) - strlen(known) - 1);
            strncat(known, config_keys[i].key, sizeof(known) - strlen(known) - 1);
        }
    if (!*known)
        return kr_usage_error("%s: not a section of a Horovod config file (controller, params, autotune, timeline, "
                              "stall_check, library_options, logging)",
                              where);
    return kr_usage_error("%s: not a key of section %s (%s)", where, section, known);
}

int kr_cli_parse(int argc, char **argv, kr_opts *o)
{
    bool given[O_COUNT] = {false};
    o->tag_output = true;
    o->grace = 5.0;
    o->start_timeout = 30.0;
    o->ssh_cmd = "ssh";
    o->slots_per_host = 1;
    o->reset_limit = -1;
    o->elastic_timeout = 600.0;
    const char *env_et = getenv("KOLO_ELASTIC_TIMEOUT");
    double d0;
    if (env_et && parse_num(env_et, 0.001, 1e7, &d0)) o->elastic_timeout = d0;
    const char *env_st = getenv("KOLO_START_TIMEOUT");
    double d;
    if (env_st && parse_num(env_st, 0.001, 1e7, &d)) o->start_timeout = d;

    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') break; /* the command starts here */
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        int id = lookup(a, len);
        if (id < 0) {
            if (eq) return kr_usage_error("unknown option '%.*s' (argument %d)", (int)len, a, i);
            return kr_usage_error("unknown option '%s' (argument %d)", a, i);
        }
        char opt[64];
        snprintf(opt, sizeof(opt), "%.*s", (int)KOLO_MIN(len, sizeof(opt) - 1), a);
        const char *val = NULL;
        if (id < O_FLAGS_START) {
            if (eq) val = eq + 1;
            else if (i + 1 < argc) val = argv[++i];
            else return kr_usage_error("%s needs a value", opt);
        } else if (eq) {
            return kr_usage_error("%s takes no value (got '%s')", opt, eq + 1);
        }
        static char pair[128];
        if (id == O_COOLDOWN && !strpbrk(val, ", ") && i + 1 < argc) { /* MIN MAX as two words */
            snprintf(pair, sizeof(pair), "%.60s %.60s", val, argv[++i]);
            val = pair;
        }
        int r = apply(o, (opt_id)id, opt, val);
        if (r != -1) return r;
        given[id] = true;
    }
    if (o->config_file) {
        config_ctx c = {o, given};
        int r = kr_config_read(o->config_file, config_value, &c);
        if (r != -1) return r;
    }
    if (i >= argc) return kr_usage_error("no command given (e.g. kolorun -np 2 python train.py)");
    o->cmd = argv + i;
    o->ncmd = argc - i;
    if (o->stack_traces && o->timeout <= 0)
        return kr_usage_error("--get-stack-traces prints the stacks when --timeout expires: give --timeout too");
    if (o->discovery && (o->hosts_arg || o->hostfile))
        return kr_usage_error("--host-discovery-script finds the hosts: give it or -H/--hostfile, not both");
    if (!o->np && o->elastic && o->discovery) o->np = o->min_np ? o->min_np : o->max_np;
    if (!o->np && !o->hosts_arg && !o->hostfile && !kr_allocation())
        return kr_usage_error("-np is required when no -H, --hostfile or batch allocation (Slurm, PBS, LSF) "
                              "gives the slots");
    if (o->elastic) {
        if (!o->min_np) o->min_np = o->np ? o->np : 1;
        if (o->np && o->min_np > o->np) return kr_usage_error("--min-np %d is more than -np %d", o->min_np, o->np);
        if (o->max_np && o->np > o->max_np) return kr_usage_error("-np %d is more than --max-np %d", o->np, o->max_np);
    }
    return -1;
}
