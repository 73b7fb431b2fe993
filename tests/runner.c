/* runner.c - runs every KT_TEST (or those whose name contains an argument) each in its own
 * process group under its timeout, and prints one line per test and "N passed, N failed". */
#include "kt.h"

#include "../src/boot/auth.h"
#include "../src/boot/store.h"

#include <errno.h>
#include <stdint.h>
#include <poll.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static kt_test *tests;
static kt_test **tail = &tests;

void kt_register(kt_test *t)
{
    *tail = t; /* keep file order: constructors run in definition order within a file */
    tail = &t->next;
}

static kt_worker *workers;
void kt_register_worker(kt_worker *w)
{
    w->next = workers;
    workers = w;
}

static char self_path[4096], build_dir[4096], scratch[4096];
const char *kt_self(void) { return self_path; }
const char *kt_build_dir(void) { return build_dir; }

/* self_path = /proc/self/exe; build_dir = its directory's parent (<build>/tests/kolo-tests) */
static void find_paths(void)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    if (n <= 0) return;
    self_path[n] = '\0';
    snprintf(build_dir, sizeof(build_dir), "%s", self_path);
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(build_dir, '/');
        if (slash) *slash = '\0';
    }
    setenv("KT_BUILD_DIR", build_dir, 1);
}

void kt_fail(const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "  FAIL %s:%d [pid %d]: %s\n", file, line, (int)getpid(), msg);
    fflush(stderr);
    _exit(1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Each test gets a fresh scratch directory, removed with everything in it when the test ends
 * however it ends (KT_KEEP_SCRATCH=1 keeps it for a post-mortem). */
const char *kt_scratch(void)
{
    KT_ASSERTF(scratch[0], "kt_scratch() outside a test");
    return scratch;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (type == FTW_DP) rmdir(path);
    else unlink(path);
    return 0;
}

static void scratch_make(const kt_test *t)
{
    const char *base = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/kt-%.40s-XXXXXX", base && *base ? base : "/tmp", t->name);
    if (!mkdtemp(scratch)) {
        fprintf(stderr, "kolo-tests: mkdtemp %s: %s\n", scratch, strerror(errno));
        scratch[0] = '\0';
    }
}

static void scratch_remove(void)
{
    if (!scratch[0]) return;
    const char *keep = getenv("KT_KEEP_SCRATCH");
    if (keep && *keep && strcmp(keep, "0") != 0) printf("# kept %s\n", scratch);
    else nftw(scratch, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    scratch[0] = '\0';
}

/* What the machine went through while a test ran, printed beside its failure to tell a stalled
 * machine from a slow path: how long some task waited for a CPU, for IO and for memory (Linux's
 * pressure stall information, /proc/pressure), and how long the hypervisor ran others on our CPUs
 * (steal, /proc/stat). Waiting for a CPU is normal when tests fork more ranks than cores; IO,
 * memory and steal are not. A missing file reads as -1. */
typedef struct machine_sample {
    double t;
    long long psi_us[3]; /* cpu, io, memory: "some" total, microseconds */
    long long steal;     /* clock ticks, every CPU together */
} machine_sample;

static long long psi_some_total(const char *what)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/pressure/%s", what);
    FILE *f = fopen(path, "r");
    long long total = -1;
    if (!f) return -1;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "total=");
        if (strncmp(line, "some ", 5) == 0 && p) total = atoll(p + 6);
    }
    fclose(f);
    return total;
}

static void machine_sample_take(machine_sample *m)
{
    static const char *const what[3] = {"cpu", "io", "memory"};
    m->t = now();
    for (int i = 0; i < 3; i++) m->psi_us[i] = psi_some_total(what[i]);
    m->steal = -1;
    FILE *f = fopen("/proc/stat", "r");
    long long v[8];
    if (f && fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                    &v[6], &v[7]) == 8)
        m->steal = v[7];
    if (f) fclose(f);
}

static void machine_report(const machine_sample *a, const char *name)
{
    machine_sample b;
    machine_sample_take(&b);
    double hz = (double)sysconf(_SC_CLK_TCK), secs[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 3; i++)
        if (a->psi_us[i] >= 0 && b.psi_us[i] >= 0) secs[i] = (double)(b.psi_us[i] - a->psi_us[i]) / 1e6;
    if (a->steal >= 0 && b.steal >= 0 && hz > 0) secs[3] = (double)(b.steal - a->steal) / hz;
    printf("# the machine during %s (%.1f s): some task waited for a CPU %.1f s, for IO %.1f s, for memory "
           "%.1f s; steal %.1f s (-1: not known)\n",
           name, b.t - a->t, secs[0], secs[1], secs[2], secs[3]);
}

/* Runs one test in a child that leads its own process group, so that on timeout the
 * whole group (the test and every rank it forked) is killed. */
static int run_child(kt_test *t, double scale)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 0;
    }
    if (pid == 0) {
        setpgid(0, 0);
        t->fn();
        fflush(stdout);
        _exit(0);
    }
    setpgid(pid, pid);
    machine_sample m0;
    machine_sample_take(&m0);
    double t0 = now(), limit = t->timeout_s * scale;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (now() - t0 > limit) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            printf("not ok - %s (timed out after %.0f s)\n", t->name, limit);
            machine_report(&m0, t->name);
            return 0;
        }
        usleep(2000);
    }
    kill(-pid, SIGKILL); /* leftovers of the test's own process group, if any */
    double dt = now() - t0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        printf("ok - %s (%.2f s)\n", t->name, dt);
        return 1;
    }
    if (WIFSIGNALED(st))
        printf("not ok - %s (killed by signal %d: %s)\n", t->name, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        printf("not ok - %s (exit %d)\n", t->name, WEXITSTATUS(st));
    machine_report(&m0, t->name);
    return 0;
}

static int run_one(kt_test *t, double scale)
{
    scratch_make(t);
    int ok = run_child(t, scale);
    scratch_remove();
    return ok;
}

int main(int argc, char **argv)
{
    /* KT_TIMEOUT_SCALE stretches every timeout (sanitizer builds run slower). */
    double scale = kt_timeout_scale();
    find_paths();
    if (argc > 2 && strcmp(argv[1], "--worker") == 0) {
        for (kt_worker *w = workers; w; w = w->next)
            if (strcmp(w->name, argv[2]) == 0) return w->fn(argc - 2, argv + 2);
        fprintf(stderr, "kolo-tests: no worker named '%s'\n", argv[2]);
        return 2;
    }
    int list = argc > 1 && strcmp(argv[1], "--list") == 0;
    int passed = 0, failed = 0;
    const char *failed_names[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* arguments: substrings of the names to run (none: every test); "!substring" leaves out the
     * tests whose name contains it */
    int positive = 0;
    for (int i = 1 + list; i < argc; i++)
        if (argv[i][0] != '!') positive = 1;
    for (kt_test *t = tests; t; t = t->next) {
        int selected = !positive;
        for (int i = 1 + list; i < argc; i++) {
            if (argv[i][0] == '!') {
                if (strstr(t->name, argv[i] + 1)) {
                    selected = 0;
                    break;
                }
            } else if (strstr(t->name, argv[i])) {
                selected = 1;
            }
        }
        if (!selected) continue;
        if (list) {
            printf("%s\n", t->name);
            continue;
        }
        if (run_one(t, scale)) {
            passed++;
        } else {
            if (failed < 64) failed_names[failed] = t->name;
            failed++;
        }
    }
    /* CI keeps the end of the log: name the failures there too */
    for (int i = 0; i < failed && i < 64; i++) printf("failed: %s\n", failed_names[i]);
    if (!list) printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* ---- multi-rank jobs ---- */

static void child_env(int rank, int n, int port, const char *secret, const char *jobid,
                      const kt_job_opts *o)
{
    char buf[64];
    /* remove what another launcher convention might have left in our environment */
    static const char *const drop[] = {"HOROVOD_RANK", "HOROVOD_SIZE", "RANK", "WORLD_SIZE",
                                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                                       "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                                       "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE", "KOLO_TRANSPORT"};
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) unsetenv(drop[i]);
    snprintf(buf, sizeof(buf), "%d", rank);
    setenv("KOLO_RANK", buf, 1);
    snprintf(buf, sizeof(buf), "%d", n);
    setenv("KOLO_SIZE", buf, 1);
    if (port > 0) {
        snprintf(buf, sizeof(buf), "127.0.0.1:%d", port);
        setenv("KOLO_RENDEZVOUS", buf, 1);
    }
    setenv("KOLO_SECRET", secret, 1);
    setenv("KOLO_JOB_ID", jobid, 1);
    if (o && o->tcp_only) setenv("KOLO_TRANSPORT", "tcp", 1);
    for (int i = 0; o && i < 16 && o->env[i]; i++) {
        char kv[512];
        snprintf(kv, sizeof(kv), "%s", o->env[i]);
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = '\0';
        setenv(kv, eq + 1, 1);
    }
}

/* The store runs in a child process of its own: forking ranks from a process that has a server
 * thread could copy a lock that thread holds (OpenSSL's, for instance) into the rank, which
 * would then deadlock on it. The parent stays single-threaded. */
pid_t kt_spawn_store(const char *secret, int *port)
{
    int p[2];
    if (pipe(p) != 0) kt_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) kt_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        kolo__store_server *srv = NULL;
        int prt = -1;
        if (kolo__store_server_start(&srv, "127.0.0.1", 0, secret, strlen(secret)) == 0) prt = kolo__store_server_port(srv);
        else fprintf(stderr, "store server: %s\n", kolo_last_error());
        if (write(p[1], &prt, sizeof(prt)) != (ssize_t)sizeof(prt)) _exit(1);
        close(p[1]);
        for (;;) pause(); /* killed by kt_job */
    }
    close(p[1]);
    if (read(p[0], port, sizeof(*port)) != (ssize_t)sizeof(*port) || *port <= 0)
        kt_fail(__FILE__, __LINE__, "the store server did not start");
    close(p[0]);
    return pid;
}

int kt_job(int n, void (*fn)(int rank, void *arg), void *arg, const kt_job_opts *opts, int *status)
{
    char secret[80], jobid[64];
    if (kolo__secret_make(secret, sizeof(secret)) != 0) kt_fail(__FILE__, __LINE__, "secret");
    snprintf(jobid, sizeof(jobid), "kt%d-%ld", (int)getpid(), (long)(now() * 1e6));
    pid_t store = -1;
    int port = 0;
    if (!(opts && opts->no_store)) store = kt_spawn_store(secret, &port);
    pid_t pids[128];
    if (n > 128) kt_fail(__FILE__, __LINE__, "too many ranks");
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) kt_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
        if (pids[r] == 0) {
            child_env(r, n, port, secret, jobid, opts);
            fn(r, arg);
            kolo_shutdown();
            fflush(stdout);
            fflush(stderr);
            _exit(0);
        }
    }
    if (opts && opts->parent) opts->parent(pids, n, arg);
    int bad = 0;
    for (int r = 0; r < n; r++) {
        int st;
        while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {}
        if (status) status[r] = st;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) bad++;
    }
    if (store > 0) {
        kill(store, SIGKILL);
        waitpid(store, NULL, 0);
    }
    return bad;
}

void kt_job_both(int n, void (*fn)(int rank, void *arg), void *arg)
{
    kt_job_opts tcp = {.tcp_only = 1};
    int bad = kt_job(n, fn, arg, NULL, NULL);
    if (bad) kt_fail(__FILE__, __LINE__, "%d of %d ranks failed (shared memory)", bad, n);
    bad = kt_job(n, fn, arg, &tcp, NULL);
    if (bad) kt_fail(__FILE__, __LINE__, "%d of %d ranks failed (tcp)", bad, n);
}

/* Decoded and encoded here, not by kolo's conversions, which the tests check. */
static float half_to_float(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? INFINITY : ldexpf(1.0f + (float)m / 1024.0f, e - 15);
    return (h & 0x8000) ? -v : v;
}

static uint16_t float_to_half(float f) /* f: 0, or normal in float16 and exact there */
{
    if (f == 0) return 0;
    int sign = f < 0, e = 0;
    float a = sign ? -f : f;
    while (a >= 2.0f) {
        a /= 2;
        e++;
    }
    while (a < 1.0f) {
        a *= 2;
        e--;
    }
    return (uint16_t)((sign << 15) | ((e + 15) << 10) | (int)((a - 1.0f) * 1024));
}

double kt_get(const void *buf, size_t i, kolo_dtype_t d)
{
    switch (d) {
    case KOLO_UINT8: return ((const uint8_t *)buf)[i];
    case KOLO_INT8: return ((const int8_t *)buf)[i];
    case KOLO_UINT16: return ((const uint16_t *)buf)[i];
    case KOLO_INT16: return ((const int16_t *)buf)[i];
    case KOLO_INT32: return ((const int32_t *)buf)[i];
    case KOLO_INT64: return (double)((const int64_t *)buf)[i];
    case KOLO_FLOAT16: return half_to_float(((const uint16_t *)buf)[i]);
    case KOLO_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case KOLO_FLOAT32: return ((const float *)buf)[i];
    case KOLO_FLOAT64: return ((const double *)buf)[i];
    case KOLO_BOOL: return ((const uint8_t *)buf)[i] != 0;
    default: return NAN;
    }
}

/* a = a (+) b, tensor by tensor */
static void adasum_combine(double *a, const double *b, const size_t *start, size_t nt)
{
    for (size_t t = 0; t < nt; t++) {
        double ab = 0, aa = 0, bb = 0;
        for (size_t i = start[t]; i < start[t + 1]; i++) {
            ab += a[i] * b[i];
            aa += a[i] * a[i];
            bb += b[i] * b[i];
        }
        double ca = aa > 0 ? 1 - ab / (2 * aa) : 1, cb = bb > 0 ? 1 - ab / (2 * bb) : 1;
        for (size_t i = start[t]; i < start[t + 1]; i++) a[i] = ca * a[i] + cb * b[i];
    }
}

double kt_adasum_tolerance(kolo_dtype_t d)
{
    return d == KOLO_FLOAT64 ? 1e-12 : d == KOLO_FLOAT32 ? 1e-5 : d == KOLO_FLOAT16 ? 4e-3 : 2e-2;
}

void kt_adasum_tree(double **x, int n, const size_t *start, size_t nt)
{
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    int extra = n - p2;
    double *y[64];
    KT_ASSERT(p2 <= 64);
    for (int v = 0; v < p2; v++) {
        if (v < extra) {
            adasum_combine(x[2 * v], x[2 * v + 1], start, nt);
            y[v] = x[2 * v];
        } else {
            y[v] = x[v + extra];
        }
    }
    for (int w = p2; w > 1; w /= 2)
        for (int k = 0; k < w / 2; k++) {
            adasum_combine(y[2 * k], y[2 * k + 1], start, nt);
            y[k] = y[2 * k];
        }
    if (y[0] != x[0]) memcpy(x[0], y[0], start[nt] * sizeof(double));
}

void kt_put(void *buf, size_t i, kolo_dtype_t d, double v)
{
    switch (d) {
    case KOLO_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case KOLO_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case KOLO_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case KOLO_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case KOLO_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case KOLO_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case KOLO_FLOAT16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
    case KOLO_BFLOAT16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        break;
    }
    case KOLO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case KOLO_FLOAT64: ((double *)buf)[i] = v; break;
    case KOLO_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    default: break;
    }
}

void kt_fill(void *buf, size_t count, kolo_dtype_t dtype, unsigned seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    bool floating = kt_is_float(dtype);
    bool unsig = dtype == KOLO_UINT8 || dtype == KOLO_UINT16;
    for (size_t i = 0; i < count; i++) {
        int v = (int)(kt_rand(&x) % 17) - 8; /* small values: sums stay exact in every dtype */
        kt_put(buf, i, dtype, dtype == KOLO_BOOL ? v > 0 : floating ? v * 0.5 : unsig ? v + 8 : v);
    }
}

/* ---- child processes with captured output ---- */

double kt_now(void) { return now(); }

uint64_t kt_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int kt_count(const char *hay, const char *needle)
{
    int c = 0;
    for (const char *q = hay; (q = strstr(q, needle)); q++) c++;
    return c;
}

void kt_proc_start(kt_proc *p, const char *const *argv, const kt_proc_opts *o)
{
    kt_proc_opts none = {0};
    if (!o) o = &none;
    memset(p, 0, sizeof(*p));
    p->cap = o->cap ? o->cap : (size_t)4 << 20;
    p->own_group = o->own_group;
    p->obuf = calloc(1, p->cap + 1);
    p->ebuf = calloc(1, p->cap + 1);
    if (!p->obuf || !p->ebuf) kt_fail(__FILE__, __LINE__, "no memory for output buffers");
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || (o->stdin_pipe && pipe2(in, O_CLOEXEC) != 0))
        kt_fail(__FILE__, __LINE__, "pipe2: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    p->t0 = now();
    p->pid = fork();
    if (p->pid < 0) kt_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (p->pid == 0) {
        if (o->own_group) setpgid(0, 0);
        int stdin_fd = o->stdin_pipe ? in[0] : open("/dev/null", O_RDONLY);
        dup2(stdin_fd, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        if (o->child_setup && o->child_setup(o->arg) != 0) {
            fprintf(stderr, "child set-up for %s failed: %s\n", argv[0], strerror(errno));
            _exit(98);
        }
        execv(argv[0], (char *const *)(uintptr_t)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(99);
    }
    if (o->own_group) setpgid(p->pid, p->pid);
    close(out[1]);
    close(err[1]);
    p->out = out[0];
    p->err = err[0];
    p->in = -1;
    if (o->stdin_pipe) {
        close(in[0]);
        p->in = in[1];
    }
}

void kt_proc_pump(kt_proc *p, int timeout_ms)
{
    struct pollfd f[2] = {{.fd = p->out, .events = POLLIN}, {.fd = p->err, .events = POLLIN}};
    if (p->out < 0 && p->err < 0) {
        usleep((useconds_t)timeout_ms * 1000);
        return;
    }
    if (poll(f, 2, timeout_ms) <= 0) return;
    for (int k = 0; k < 2; k++) {
        int *fd = k ? &p->err : &p->out;
        if (*fd < 0 || !f[k].revents) continue;
        char *buf = k ? p->ebuf : p->obuf;
        size_t *len = k ? &p->elen : &p->olen;
        ssize_t r = read(*fd, buf + *len, p->cap - *len);
        if (r <= 0) {
            close(*fd);
            *fd = -1;
        } else {
            *len += (size_t)r;
            buf[*len] = '\0';
        }
    }
}

static void reap(kt_proc *p)
{
    if (!p->done && waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
        p->done = 1;
        p->t_end = now();
    }
}

double kt_timeout_scale(void)
{
    const char *v = getenv("KT_TIMEOUT_SCALE");
    double scale = v ? atof(v) : 1.0;
    return scale > 1 ? scale : 1.0;
}

void kt_proc_wait_for(kt_proc *p, const char *needle, int count, double timeout)
{
    timeout *= kt_timeout_scale();
    double end = now() + timeout;
    while (kt_count(p->obuf, needle) < count) {
        if (now() > end)
            kt_fail(__FILE__, __LINE__, "no %d x '%s' within %.0f s; stdout:\n%s\nstderr:\n%s", count, needle, timeout,
                    p->obuf, p->ebuf);
        reap(p);
        if (p->done && p->out < 0 && p->err < 0)
            kt_fail(__FILE__, __LINE__, "ended (status 0x%x) before %d x '%s'; stdout:\n%s\nstderr:\n%s", p->status,
                    count, needle, p->obuf, p->ebuf);
        kt_proc_pump(p, 50);
    }
}

int kt_proc_finish(kt_proc *p, double timeout)
{
    timeout *= kt_timeout_scale();
    double end = now() + timeout;
    while (!p->done || p->out >= 0 || p->err >= 0) {
        if (now() > end) {
            kill(p->own_group ? -p->pid : p->pid, SIGKILL);
            kt_fail(__FILE__, __LINE__, "%s did not finish within %.0f s; stdout:\n%s\nstderr:\n%s",
                    p->done ? "its output" : "the process", timeout, p->obuf, p->ebuf);
        }
        kt_proc_pump(p, 20);
        reap(p);
    }
    if (p->in >= 0) {
        close(p->in);
        p->in = -1;
    }
    return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

void kt_proc_free(kt_proc *p)
{
    free(p->obuf);
    free(p->ebuf);
    p->obuf = p->ebuf = NULL;
}
