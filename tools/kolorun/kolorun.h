/* kolorun.h - the launcher's shared types: options, hosts, ranks and the functions each file provides. */
#ifndef KOLORUN_H
#define KOLORUN_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* Exit codes of kolorun itself (a worker's failure is reported with the worker's own code). */
#define KR_EXIT_USAGE 2        /* bad command line, host list or hostfile: nothing was started */
#define KR_EXIT_LAUNCH 1       /* the job could not be started (store, fork, ssh start-up) */
#define KR_EXIT_TIMEOUT 124    /* the job ran past --timeout (as timeout(1)) */
#define KR_EXIT_NOEXEC 126     /* the command exists but cannot be executed (like a shell) */
#define KR_EXIT_NOTFOUND 127   /* the command does not exist (like a shell) */

#define KR_HOST_MAX 256        /* bytes of a host name, NUL included */
#define KR_ADDR_MAX 64         /* bytes of an address as workers get it ("[v6]" included) */
#define KR_TAIL_LINES 10       /* last stderr lines kept per rank for the failure summary */
#define KR_TAIL_COLS 400       /* bytes kept of each of those lines */
#define KR_LINE_MAX 65536      /* a longer line is forwarded in pieces of this size */

/* AUTO, the default: NONE, but on a host with more workers than CPUs one CPU each, in blocks
 * (bind.c) */
enum kr_bind { KR_BIND_AUTO, KR_BIND_NONE, KR_BIND_CORE, KR_BIND_SOCKET, KR_BIND_NUMA };
enum kr_map { KR_MAP_SLOT, KR_MAP_CORE, KR_MAP_SOCKET, KR_MAP_NUMA };

typedef struct kr_host {
    char name[KR_HOST_MAX];
    int slots;
    bool local;               /* started with fork/exec here rather than over ssh */
    char rdv_addr[KR_ADDR_MAX]; /* the address of this machine that the host can reach */
    /* elastic jobs */
    bool present;             /* listed by the last discovery (always, without a script) */
    int failures;             /* workers of it that failed */
    double blocked_until;     /* no new workers here before this time (kr_now()) */
} kr_host;

/* Everything the command line says. Strings point into argv or into memory that lives
 * until exit. */
typedef struct kr_opts {
    int np;                   /* 0: not given */
    const char *hosts_arg;    /* -H value, or NULL */
    const char *hostfile;     /* --hostfile value, or NULL */
    kr_host *hosts;           /* resolved host list (hosts.c) */
    int nhosts;

    char **cmd;               /* the command and its arguments, NULL-terminated */
    int ncmd;

    const char **xenv;        /* -x NAME[=VALUE] as given */
    int nxenv;
    const char **setenv;      /* engine settings from options, "NAME=VALUE" */
    int nsetenv;

    enum kr_launcher { KR_LAUNCH_AUTO, KR_LAUNCH_SSH, KR_LAUNCH_SRUN } launcher; /* --launcher */
    bool ssh_given;           /* --ssh, -p or -i: ssh was asked for */
    bool use_srun;            /* remote workers start as Slurm steps (hosts.c decides) */
    int ssh_port;             /* 0: ssh's default */
    const char *ssh_identity;
    const char *ssh_cmd;      /* default "ssh" */

    double start_timeout;     /* seconds; also exported as KOLO_START_TIMEOUT when given */
    bool start_timeout_given;
    double grace;             /* seconds between SIGTERM and SIGKILL */
    double timeout;           /* --timeout: seconds the job may run, 0 none */
    bool stack_traces;        /* --get-stack-traces: print the workers' stacks at the timeout */
    const char *config_file;  /* --config-file (horovodrun's YAML), read after the command line */
    const char *status_file;  /* --status-file: the job's state as JSON (status.c) */
    char local_addr[KR_ADDR_MAX]; /* --local-address, "[...]" around IPv6; "" when not given */
    int (*out_ranks)[2];      /* --output-ranks: [first, last] ranges of ranks printed; NULL: all */
    int n_out_ranks;

    bool tag_output;          /* [rank]<stdout>: prefix */
    bool prefix_timestamp;
    double merge_window;      /* --merge-output S: identical lines of several ranks within S s go out once; 0 off */
    const char *output_dir;   /* --output-filename */

    enum kr_bind bind_to;
    enum kr_map map_by;
    bool report_bindings;
    bool verbose;
    double t_launch;          /* kr_now() when the first worker was started */

    /* elastic jobs (elastic.c): set by --min-np, --max-np or --host-discovery-script */
    bool elastic;
    int min_np, max_np;       /* max_np 0: -np */
    const char *discovery;    /* --host-discovery-script, or NULL (the hosts of -H/--hostfile) */
    int slots_per_host;       /* of a discovered host that names none (1) */
    double elastic_timeout;   /* seconds to wait for --min-np slots (600) */
    int reset_limit;          /* -1: none */
    double cooldown_min, cooldown_max; /* 0: a failed host gets no workers again */
} kr_opts;

/* One line stream (a worker's stdout or stderr) on its way to our stdout/stderr and files. */
typedef struct kr_stream {
    int fd;                   /* read end of the worker's pipe; -1 once closed */
    bool is_err;
    char *buf;                /* partial line, KR_LINE_MAX bytes */
    size_t len;
    int file_fd;              /* --output-filename file, or -1 */
    bool marker_seen;         /* remote stdout: the wrapper's start marker has arrived */
    /* a partial line that rewrites itself with '\r' (a progress bar) is shown as it comes: */
    size_t shown;             /* bytes of buf already written to our stdout/stderr */
    bool begun;               /* the partial line is on our terminal already (its tag too) */
    bool reprefix;            /* other output closed it there: its next bytes need the tag again */
} kr_stream;

typedef struct kr_rank {
    int rank, local_rank, local_size, cross_rank, cross_size;
    int host;                 /* index into opts.hosts */

    pid_t pid;                /* worker (or its ssh); also its process group id; 0: not started */
    bool running;             /* not yet reaped */
    bool started;             /* remote: the wrapper said it started the command */
    int remote_pid;           /* remote: the command's pid (and process group) on its host, 0 unknown */
    int wstatus;              /* raw wait status once reaped */
    double end_time;          /* when reaped, seconds since launch */
    bool failed;              /* ended badly on its own (not because kolorun terminated it) */
    bool terminated;          /* kolorun sent it SIGTERM/SIGKILL (or forwarded a signal) first */
    bool killed;              /* kolorun had to SIGKILL it */

    kr_stream out, err;
    int stdin_fd;             /* write end of rank 0's stdin pipe, or -1 */
    char (*tail)[KR_TAIL_COLS]; /* ring of the last KR_TAIL_LINES stderr lines */
    int tail_next, tail_count;
    double last_output;       /* kr_now() of its last output (or its start) */
    bool want_status;         /* kr_dump_stacks: keep its next kolo status line in `status` */
    char *status;             /* that line's JSON (malloc'd), or NULL */

    /* elastic jobs: the index in the job's array is the worker id */
    int id;                   /* worker id: its index in the job's array */
    int round;                /* the round it was started for; 0 outside elastic jobs */
    bool removed;             /* its host left: its end is not a failure */
    bool lost;                /* failed, and the job went on without it */
    bool asking;              /* asks for a new round (elastic.c, check_asked) */
    bool said_busy;           /* check_asked said it waits for this silent but busy worker */
    long long cpu_seen;       /* check_asked: its CPU ticks when last read; -1 unknown */
    int slot;                 /* its slot on a local host, the local rank --bind-to binds by */

    cpu_set_t cpus;           /* binding (bind.c); valid when bound */
    bool bound;
    char bind_desc[256];
} kr_rank;

/* The job: its workers and what starting one more takes (main.c). An elastic job adds workers
 * while it runs (elastic.c); the index into ranks is then the worker id. */
typedef struct kr_job {
    kr_opts *o;
    kr_rank *ranks;
    int n, cap;               /* workers started (or being started); entries allocated */
    int port;                 /* the rendezvous store's */
    char secret[80], job_id[96];
    const char *exec_path, *ssh_path;
    int guard_fd;
    struct kr_elastic *el;    /* NULL unless elastic */
} kr_job;

/* ---- main.c ---- */
/* Makes room for n workers (new entries ready to start). Returns 0, or -1 out of memory. */
int kr_job_grow(kr_job *j, int n);
/* Starts worker i (its rank fields set) as a worker of a job of `size`. Returns 0 or an exit code. */
int kr_start_worker(kr_job *j, int i, int size);

/* ---- elastic.c ---- */
/* Connects to the store, finds the hosts (the discovery script, or -H), waits for --min-np
 * slots (reading sigfd: a terminating signal ends the wait) and starts round 1. Returns 0 or
 * kolorun's exit code. */
int kr_elastic_setup(kr_job *j, int sigfd);
/* A worker ended (reaped). Returns true when the elastic driver took care of it (a worker
 * removed with its host, or a failure the job survives); false for the usual handling. */
bool kr_elastic_on_exit(kr_job *j, int i);
/* Discovery, cooldowns, pending re-formations. Returns the worker id to report as the job's
 * failure when the job cannot go on, KR_ELASTIC_END when it cannot go on without any worker
 * having failed (hosts left), else -1. */
#define KR_ELASTIC_END (-2)
int kr_elastic_tick(kr_job *j, double now);
/* When kr_elastic_tick wants to run next (absolute, kr_now()). */
double kr_elastic_wake(const kr_job *j);
/* The current round, 0 outside elastic jobs. */
int kr_elastic_round(const kr_job *j);
/* A child the loop reaped that is no worker: the CPU reading's ssh, maybe (not to be killed now). */
void kr_elastic_reaped(kr_job *j, pid_t pid);
/* The end: the lines about rounds and lost workers; closes the store connection. */
void kr_elastic_finish(kr_job *j, bool print);

/* ---- cli.c ---- */
/* Parses argv into *o. On a usage error prints one line to stderr and returns
 * KR_EXIT_USAGE; returns -1 to go on, or 0 when it already did what was asked
 * (--help, --version, --help-env, --check-build). */
int kr_cli_parse(int argc, char **argv, kr_opts *o);
/* Frees what parsing and host resolution allocated. */
void kr_opts_free(kr_opts *o);
/* Prints "kolorun: error: <fmt>" and a hint on one line; returns KR_EXIT_USAGE. */
int kr_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- config.c ---- */
/* Called for each value of a --config-file: section ("" at the top level), key, value. Returns
 * -1 to go on, or an exit code (after printing why). */
typedef int (*kr_config_fn)(void *ctx, const char *section, const char *key, const char *value, const char *path,
                            int line);
/* Reads horovodrun's YAML config file. Returns -1 when every value was taken, or the exit code
 * of the first problem (one line printed, naming the file and line). */
int kr_config_read(const char *path, kr_config_fn fn, void *ctx);
/* Reads one line of f, without its '\n', into line (cap bytes, NUL-terminated), for the text files
 * kolorun reads (config file, hostfile, PBS's node file). Returns its length, -1 at the end of
 * the file, -2 when the line does not fit (not read further: an endless one would never end),
 * -3 when it holds a NUL byte. */
long kr_read_line(FILE *f, char *line, size_t cap);
/* What a line kr_read_line refused (got, -2 or -3) has: "line longer than 4095 bytes" for cap 4096. */
const char *kr_read_line_problem(long got, size_t cap);

/* ---- hosts.c ---- */
/* Fills o->hosts from -H, --hostfile, the batch system's allocation kolorun runs in (when it has
 * other hosts than this one: Slurm, PBS, LSF; one line says so) or the default (np local slots),
 * and checks np against the slots. Usage errors print one line and return KR_EXIT_USAGE; 0 on
 * success. */
int kr_hosts_resolve(kr_opts *o);
/* "Slurm", "PBS" or "LSF" when kolorun runs inside that batch system's allocation, else NULL. */
const char *kr_allocation(void);
/* Assigns rank, local and cross ranks host-major (Horovod's rule). ranks has o->np entries. */
void kr_hosts_assign(const kr_opts *o, kr_rank *ranks);
/* True when the name is this machine (localhost, 127.x, ::1, our host name or one of our addresses). */
bool kr_host_is_local(const char *name);
/* Writes into out the local address a packet to `host` would leave from ("127.0.0.1" for
 * local hosts). Returns false when the host cannot be resolved or routed. */
bool kr_route_source(const char *host, char *out, size_t cap);
/* A host name kolorun accepts (-H, hostfile, discovery): letters, digits, '.', '-', '_'. */
bool kr_valid_host_name(const char *s, size_t n);
/* This machine's host name. */
const char *kr_hostname(void);

/* ---- workerenv.c ---- */
/* Builds the NULL-terminated environment of one worker: the user's environment, then
 * kolo's, Horovod's and torch's rank variables, the settings from options, then -x. */
char **kr_env_build(const kr_opts *o, const kr_rank *r, int size, const char *rdv, const char *secret,
                    const char *job_id);
void kr_env_free(char **env);
/* The value of setting `name` that kr_env_build gives a local worker (-x, then the settings
 * from options, then kolorun's environment); NULL when unset. */
const char *kr_worker_setting(const kr_opts *o, const char *name);
/* Seconds a remote worker's wrapper waits for a line from kolorun before it takes kolorun for gone
 * and ends the worker (spawn.c, the remote wrapper; kolorun writes "beat" every quarter of it):
 * KOLO_TCP_KEEPALIVE as the workers read it, at least 4; 0 where that is 0 (no heartbeat). */
int kr_beat_timeout(const kr_opts *o);
/* Looks for the executable `cmd` in PATH (taken from env) the way execvp would. Writes the
 * path in out. Returns 0, or KR_EXIT_NOTFOUND / KR_EXIT_NOEXEC with errno-like reason. */
int kr_find_exec(const char *cmd, char *const *env, char *out, size_t cap);
/* Shell-quotes s into a freshly allocated string ('...' with ' as '\''). */
char *kr_shell_quote(const char *s);

/* ---- bind.c ---- */
/* Computes the CPU set of every local rank for --bind-to/--map-by. Returns 0, or prints an
 * error and returns KR_EXIT_LAUNCH when the topology cannot be read. */
int kr_bind_plan(const kr_opts *o, kr_rank *ranks, int n);

/* ---- spawn.c ---- */
/* Starts the guard process that kills every worker group if kolorun dies without saying
 * goodbye, and then every process whose environment holds KOLO_JOB_ID=job_id (what workers
 * started in sessions of their own). Returns the write end of its pipe (O_CLOEXEC), or -1. */
int kr_guard_start(const char *job_id);
void kr_guard_add(int guard_fd, pid_t pgid);
/* Tells the guard the job ended cleanly; it exits without killing anything. */
void kr_guard_done(int guard_fd);
/* Starts rank r (locally or over ssh). Sets r->pid and the pipes. Returns 0, or an exit code
 * (KR_EXIT_NOTFOUND, KR_EXIT_NOEXEC, KR_EXIT_LAUNCH) after printing why. */
int kr_spawn(const kr_opts *o, kr_rank *r, char **env, const char *exec_path, bool give_stdin);

/* Runs argv (argv[0] looked up in PATH) in a process group of its own with stdin /dev/null and
 * its stdout (and stderr, with_stderr) read into out (NUL-terminated, at most cap-1 bytes), for
 * at most timeout_s: past that its group is SIGKILLed and *timed_out set. Returns the bytes read
 * and the wait status in *status (exit 127: it could not be run), or -1 when it could not be
 * started at all. */
ssize_t kr_run_capture(const char *const *argv, bool with_stderr, double timeout_s, char *out, size_t cap,
                       int *status, bool *timed_out);
/* The same in steps, for a caller that goes on meanwhile: kr_capture_start runs c->argv as above,
 * its output into a pipe whose read end (non-blocking) it returns in *fd, and returns its pid
 * (-1, and c->len -1, when it could not be started); kr_capture_read reads what the pipe holds
 * into c->out (NUL-terminated) and returns false at its end, or when c->out is full. The caller
 * closes fd and reaps the pid. */
typedef struct kr_capture {
    const char *const *argv;
    bool with_stderr;
    char *out;
    size_t cap;
    ssize_t len;
} kr_capture;
pid_t kr_capture_start(kr_capture *c, int *fd);
bool kr_capture_read(kr_capture *c, int fd);

/* ssh's argv (the options kolorun's workers get) running remote_cmd on host; NULL out of memory. */
char **kr_ssh_argv(const kr_opts *o, int host, const char *remote_cmd);
void kr_argv_free(char **argv);

/* ---- output.c ---- */
int kr_output_open_files(const kr_opts *o, kr_rank *ranks, int n);
/* An elastic job's worker: DIR/worker.ID/stdout and stderr (ranks change between rounds). */
int kr_output_open_worker(const kr_opts *o, kr_rank *r);
/* Whether --output-ranks lets this rank's lines through to kolorun's stdout and stderr. */
bool kr_rank_shown(const kr_opts *o, int rank);
/* Reads what is available on s; forwards complete lines. Returns false at EOF (fd closed). */
bool kr_output_read(const kr_opts *o, kr_rank *r, kr_stream *s);

/* --merge-output: prints the merged lines whose window has passed (now < 0: all of them), and
 * the time the next one's window ends (INFINITY: none waiting). kr_say prints them all first. */
void kr_output_merge_flush(double now);
double kr_output_merge_wake(void);
/* Forwards the partial line left at EOF and closes the stream. */
void kr_output_flush(const kr_opts *o, kr_rank *r, kr_stream *s);
/* Prints one launcher line on stderr, "kolorun: ..." (whole line in one write). */
void kr_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Writes all of buf, retrying on EINTR and partial writes. Returns false on error. */
bool kr_write_all(int fd, const void *buf, size_t n);

/* ---- stacks.c ---- */
/* --get-stack-traces: Python and native stacks of every running local worker (stderr). */
void kr_dump_stacks(const kr_opts *o, kr_rank *ranks, int n, const char *unit);

/* ---- proc.c ---- */
/* The live processes of a local worker's process group pgid, its leader first (listed even when
 * gone), up to cap. */
int kr_group_members(pid_t pgid, pid_t *out, int cap);
/* The CPU time (user + system, with that of reaped children) the live processes of group pgid
 * have used, in clock ticks; -1 when none is alive. */
long long kr_group_cpu_ticks(pid_t pgid);
/* At the end of a job: terminates what the workers left running outside their process groups
 * (kolorun's remaining children, as their subreaper, that carry KOLO_JOB_ID=job_id), SIGKILL
 * after grace seconds, reaps everything, and says what it ended. */
void kr_end_leftovers(double grace, const char *job_id);
/* Whether process pid's environment holds the entry `want` ("NAME=value"). */
bool kr_environ_has(long pid, const char *want);
/* Where the threads of group pgid's live processes wait, as the kernel says (their state and
 * wait channel, /proc/PID/task/TID/{stat,wchan}), counted: "3 in futex_wait_queue, 1 in
 * do_sys_poll, 1 running". Says where a worker taken for stuck sat; "" when none is alive. */
void kr_group_waits(pid_t pgid, char *out, size_t cap);
/* The same for the process groups of remote workers, by one ssh to each host named, all hosts at
 * once, while kolorun's loop goes on: kr_remote_cpu_start sets every ask's ticks to -1 and starts
 * the ssh commands (NULL out of memory); kr_remote_cpu_poll reads what they said so far, without
 * waiting, and returns true when all have ended or REMOTE_CPU_S has passed; kr_remote_cpu_end (at that point, or to give up early) stops what
 * still runs and fills ticks[i] for pgids[i] from the hosts that answered in whole, -1 where the
 * group has no live process or its host did not answer. The caller's loop reaps children: it
 * passes on the pids it does not know (kr_remote_cpu_reaped), so that none is killed after. */
#define REMOTE_CPU_S 5.0
typedef struct kr_cpu_ask {
    int host;
    const pid_t *pgids;
    int n;
    long long *ticks;
} kr_cpu_ask;
typedef struct kr_cpu_read kr_cpu_read;
kr_cpu_read *kr_remote_cpu_start(const kr_opts *o, const kr_cpu_ask *asks, int nasks);
bool kr_remote_cpu_poll(kr_cpu_read *r);
void kr_remote_cpu_reaped(kr_cpu_read *r, pid_t pid);
void kr_remote_cpu_end(kr_cpu_read *r);

/* ---- status.c ---- */
/* --status-file: writes the job's state (running, stopping, done), exit_code (-1: none yet)
 * and why it stops or stopped (NULL: nothing to say), atomically. */
void kr_status_write(const kr_job *j, const char *state, int exit_code, const char *reason, double elapsed);

/* ---- supervise.c ---- */
/* Runs the job until every worker has ended; returns kolorun's exit code. A non-zero
 * launch_code (a rank could not be started) terminates the ranks already running at once
 * and becomes the exit code. */
int kr_supervise(kr_job *j, int sigfd, int launch_code);
/* "exited with code 3", "was killed by SIGKILL (Killed)", ... of a reaped worker. */
void kr_describe(const kr_rank *r, const kr_opts *o, char *out, size_t cap);
/* The last lines of a worker's stderr, as "kolorun:   | line". */
void kr_print_tail(const kr_rank *r, const char *unit);
/* The time base of the job (seconds, monotonic). */
double kr_now(void);

#endif
