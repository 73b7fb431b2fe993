/* fuzz_kolorun_args.c - what a user hands kolorun: its command line, a --config-file, a hostfile
 * and the environment of a batch allocation.
 *
 * kolorun reads all of it before it starts anything (main.c): kr_cli_parse (cli.c: the options,
 * their values, the YAML config file through kr_config_read in config.c), then kr_hosts_resolve
 * (hosts.c: -H, --hostfile, Slurm's node list and tasks per node, PBS's node file, LSF's host list)
 * and kr_hosts_assign. Whatever the bytes, each must end in a usage error that says what is wrong
 * (one line, "error: ...", exit code 2) or in an answer that holds together, and never crash,
 * read or write outside its buffers, leak, hang or exit.
 *
 * An input: a byte of batch-system choices, then five spans (two bytes of length each, fuzz.h):
 *
 *   sys      bits 0-1: the allocation kolorun runs in (0 none, 1 Slurm, 2 PBS, 3 LSF);
 *            bit 2: the Slurm node list in SLURM_NODELIST rather than SLURM_JOB_NODELIST;
 *            bit 3: the Slurm counts in SLURM_JOB_CPUS_PER_NODE rather than SLURM_TASKS_PER_NODE;
 *            bit 4: SLURM_JOB_ID set (--launcher srun needs it); bit 5: KOLO_STATUS_SIGNAL set
 *   argv     the words after "kolorun", each ended by a NUL; a word ending in @CONFIG@ or @HOSTFILE@
 *            has that replaced by the path of the config file or the hostfile below
 *   config   the config file's text (up to 8 KiB)
 *   hostfile the hostfile's text (up to 8 KiB)
 *   alloc    Slurm's node list ("node[01-04,07]"), the PBS node file's text or LSB_MCPU_HOSTS
 *   counts   Slurm's tasks per node ("4(x2),2"); when not empty also KOLO_START_TIMEOUT and
 *            KOLO_ELASTIC_TIMEOUT, which kr_cli_parse reads
 *
 * The files live in a directory of the fuzzer's own, made once. What the checks rely on:
 *   - kr_cli_parse returns -1 (go on), 0 (--help and the like did what was asked, saying nothing
 *     on stderr) or KR_EXIT_USAGE after exactly one message, "error: ..."; on -1 the command is
 *     the tail of argv, NULL-terminated, and -np agrees with --min-np/--max-np;
 *   - kr_hosts_resolve (skipped, as main.c skips it, under --host-discovery-script) returns 0 or
 *     KR_EXIT_USAGE after one error message; on 0 every host has a name kolorun accepts and at
 *     least one slot, and -np is within the slots; at most one other line ("hosts from ...");
 *   - kr_hosts_assign (for up to 65536 ranks) places every rank on a host, host-major, its local
 *     rank within that host's slots and its cross rank within its cross size.
 *
 * Nothing here runs a program or waits on the network: kolorun's parsers only name a
 * --host-discovery-script (elastic.c runs it, not reached: main.c resolves no hosts then),
 * --help, --version, --help-env and --check-build only print (stdout goes to /dev/null), and the
 * one lookup of a name (kr_host_is_local, for --local-address and every host) gets a getaddrinfo
 * that takes numeric addresses only, never asking DNS: this file includes hosts.c for that. An
 * input naming a path under /dev, /proc or /sys (a FIFO, a terminal, an endless file) is skipped;
 * stdin is /dev/null. kolorun's messages (kr_say) are counted and kept here rather than written:
 * KOLO_FUZZ_VERBOSE=1 prints them. */
#include <netdb.h>
#include <sys/socket.h>

static int fz_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                          struct addrinfo **res);
#define getaddrinfo fz_getaddrinfo
#include "../../tools/kolorun/hosts.c"
#undef getaddrinfo

#include "../../src/common/common.h"
#include "fuzz.h"

#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Numeric addresses only: a name would go to DNS and wait on the network. */
static int fz_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                          struct addrinfo **res)
{
    struct addrinfo h = *hints;
    h.ai_flags |= AI_NUMERICHOST | AI_NUMERICSERV;
    return getaddrinfo(node, service, &h, res);
}

static int said;             /* kr_say's lines during this call */
static char said_last[4096]; /* the last of them, without "kolorun: " */
static bool show;            /* KOLO_FUZZ_VERBOSE */

/* kolorun's one way to say something (output.c's, which this replaces, writes it to fd 2). */
void kr_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(said_last, sizeof(said_last), fmt, ap);
    va_end(ap);
    said++;
    if (show) fprintf(stderr, "kolorun: %s\n", said_last);
}

static char dir[64], config_path[96], hostfile_path[96], nodefile_path[96];

static void cleanup(void)
{
    unlink(config_path);
    unlink(hostfile_path);
    unlink(nodefile_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    show = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    snprintf(dir, sizeof(dir), "/tmp/fuzz_kolorun_args.XXXXXX");
    if (!mkdtemp(dir)) abort();
    snprintf(config_path, sizeof(config_path), "%s/config.yaml", dir);
    snprintf(hostfile_path, sizeof(hostfile_path), "%s/hostfile", dir);
    snprintf(nodefile_path, sizeof(nodefile_path), "%s/nodefile", dir);
    atexit(cleanup);
    int null = open("/dev/null", O_RDWR);
    if (null < 0) abort();
    dup2(null, 0);
    if (!show) dup2(null, 1); /* --help and --help-env print pages */
    close(null);
    return 0;
}

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) abort();
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) abort();
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* A span as a NUL-terminated string (cut at its first NUL, as the environment would). */
static char *span_str(fz *f, size_t max)
{
    size_t n;
    const uint8_t *p = fz_span(f, max, &n);
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* A word ending in @CONFIG@ or @HOSTFILE@ with that replaced by the file's path. */
static char *word(const uint8_t *p, size_t n)
{
    static const struct {
        const char *mark, *path;
    } marks[] = {{"@CONFIG@", config_path}, {"@HOSTFILE@", hostfile_path}};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(marks); i++) {
        size_t m = strlen(marks[i].mark);
        if (n >= m && memcmp(p + n - m, marks[i].mark, m) == 0) {
            size_t len = n - m + strlen(marks[i].path);
            char *w = malloc(len + 1);
            if (!w) abort();
            memcpy(w, p, n - m);
            memcpy(w + n - m, marks[i].path, strlen(marks[i].path) + 1);
            return w;
        }
    }
    char *w = malloc(n + 1);
    if (!w) abort();
    memcpy(w, p, n);
    w[n] = '\0';
    return w;
}

static const char *const batch_vars[] = {"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
                                         "SLURM_JOB_CPUS_PER_NODE", "SLURM_JOB_ID", "PBS_NODEFILE",
                                         "LSB_MCPU_HOSTS", "KOLO_START_TIMEOUT", "KOLO_ELASTIC_TIMEOUT",
                                         "KOLO_STATUS_SIGNAL"};

/* A usage error: one line, saying what is wrong. */
static void check_usage_error(void)
{
    if (said != 1 || strncmp(said_last, "error: ", 7) != 0 || strlen(said_last) < 20) abort();
}

static void check_ranks(const kr_opts *o)
{
    kr_rank *ranks = calloc((size_t)o->np, sizeof(*ranks));
    if (!ranks) abort();
    kr_hosts_assign(o, ranks);
    for (int r = 0; r < o->np; r++) {
        const kr_rank *k = &ranks[r];
        if (k->rank != r || k->host < 0 || k->host >= o->nhosts) abort();
        if (k->local_rank < 0 || k->local_rank >= o->hosts[k->host].slots) abort();
        if (k->local_size < 1 || k->local_size > o->hosts[k->host].slots || k->local_rank >= k->local_size) abort();
        if (k->cross_rank < 0 || k->cross_rank >= k->cross_size || k->cross_size > o->nhosts) abort();
        /* host-major: a host's ranks together, in order, a host's slots filled before the next's */
        const kr_rank *prev = r ? &ranks[r - 1] : NULL;
        if (!prev ? k->host != 0 || k->local_rank != 0
                  : k->host == prev->host ? k->local_rank != prev->local_rank + 1
                                          : k->local_rank != 0 || prev->local_rank + 1 != o->hosts[prev->host].slots)
            abort();
    }
    free(ranks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint8_t sys = fz_u8(&f);
    size_t argn;
    const uint8_t *args = fz_span(&f, 4096, &argn);
    size_t confn, hostn;
    const uint8_t *conf = fz_span(&f, 8192, &confn);
    const uint8_t *hostf = fz_span(&f, 8192, &hostn);
    char *alloc = span_str(&f, 2048);
    char *counts = span_str(&f, 256);

    /* argv: "kolorun" and the words */
    char *argv[258];
    int argc = 0;
    argv[argc++] = word((const uint8_t *)"kolorun", 7);
    for (size_t at = 0; at < argn && argc < 257;) {
        const uint8_t *end = memchr(args + at, 0, argn - at);
        size_t n = end ? (size_t)(end - (args + at)) : argn - at;
        argv[argc++] = word(args + at, n);
        at += n + 1;
    }
    argv[argc] = NULL;
    bool skip = false;
    for (int i = 0; i < argc; i++)
        if (strstr(argv[i], "/dev") || strstr(argv[i], "/proc") || strstr(argv[i], "/sys")) skip = true;

    for (size_t i = 0; i < KOLO_ARRAY_SIZE(batch_vars); i++) unsetenv(batch_vars[i]);
    if (!skip) {
        write_file(config_path, conf, confn);
        write_file(hostfile_path, hostf, hostn);
        switch (sys & 3) {
        case 1:
            setenv(sys & 4 ? "SLURM_NODELIST" : "SLURM_JOB_NODELIST", alloc, 1);
            setenv(sys & 8 ? "SLURM_JOB_CPUS_PER_NODE" : "SLURM_TASKS_PER_NODE", counts, 1);
            break;
        case 2:
            write_file(nodefile_path, (const uint8_t *)alloc, strlen(alloc));
            setenv("PBS_NODEFILE", nodefile_path, 1);
            break;
        case 3: setenv("LSB_MCPU_HOSTS", alloc, 1); break;
        default: break;
        }
        if (sys & 16) setenv("SLURM_JOB_ID", "4242", 1);
        if (sys & 32) setenv("KOLO_STATUS_SIGNAL", "USR2", 1);
        if (*counts) {
            setenv("KOLO_START_TIMEOUT", counts, 1);
            setenv("KOLO_ELASTIC_TIMEOUT", counts, 1);
        }

        kr_opts o;
        memset(&o, 0, sizeof(o));
        said = 0;
        int r = kr_cli_parse(argc, argv, &o);
        if (r == KR_EXIT_USAGE) {
            check_usage_error();
        } else if (r == 0) {
            if (said) abort(); /* --help and the like print on stdout */
        } else if (r == -1) {
            if (said || !o.cmd || o.ncmd < 1 || o.cmd + o.ncmd != argv + argc || o.cmd[o.ncmd]) abort();
            if (o.np < 0 || o.np > 1 << 20) abort();
            if (o.elastic && o.np && (o.min_np > o.np || (o.max_np && o.np > o.max_np))) abort();
            if (!o.discovery) { /* main.c: a discovery script names the hosts later */
                r = kr_hosts_resolve(&o);
                if (r == KR_EXIT_USAGE) {
                    check_usage_error();
                } else if (r == 0) {
                    if (said > 1 || (said && strncmp(said_last, "hosts from ", 11) != 0)) abort();
                    long total = 0;
                    if (o.nhosts < 1 || o.np < 1) abort();
                    for (int h = 0; h < o.nhosts; h++) {
                        if (!kr_valid_host_name(o.hosts[h].name, strlen(o.hosts[h].name))) abort();
                        if (o.hosts[h].slots < 1) abort();
                        total += o.hosts[h].slots;
                    }
                    if (o.np > total) abort();
                    if (o.np <= 1 << 16) check_ranks(&o);
                } else {
                    abort();
                }
            }
        } else {
            abort(); /* KR_EXIT_LAUNCH: out of memory, which the fuzzer's malloc never is */
        }
        kr_opts_free(&o);
    }
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(batch_vars); i++) unsetenv(batch_vars[i]);
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(alloc);
    free(counts);
    return 0;
}
