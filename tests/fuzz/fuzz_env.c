/* fuzz_env.c - who a rank is, as every launcher's environment may say it (src/boot/env.c).
 *
 * kolo_init reads its rank, size, local and cross ranks, the rendezvous address, the job id and
 * secret from whichever launcher started it: kolorun's KOLO_*, horovodrun's HOROVOD_*, torchrun's
 * RANK/WORLD_SIZE/MASTER_*, Open MPI's OMPI_COMM_WORLD_*, MPICH's and Cray's PMI_*, PMIx's,
 * Slurm's SLURM_* (node lists expanded), a Kubeflow TrainJob's PET_*. Users set these by hand
 * too, and launchers differ by version. Whatever the values, kolo__env_detect must end in a
 * message naming a variable (KOLO_ERR_INVALID_ARG or KOLO_ERR_STARTUP) or in an identity that holds
 * together: 0 <= rank < size, local and cross ranks within their sizes (or -1, unknown), a port in
 * range, a job id and a secret within their buffers.
 *
 * An input: pairs of a byte (which variable, from the table below, mod its size) and a span (its
 * value, up to 300 bytes, cut at a NUL), until the input ends; every variable of the table is
 * unset before each input. Then kolo__env_detect, and the parsers it uses one by one on the
 * last value (Slurm host lists and task counts, host:port, byte sizes).
 *
 * KOLO_FUZZ_VERBOSE=1 prints what each input was found to be (a launcher, or the error).
 *
 * Nothing here waits on a network: the variables that would make kolo__env_detect talk to a
 * process manager (PMI_FD, PMI_PORT, PMIX_SERVER_URI*) are not in the table. */
#include "../../src/boot/env.h"
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char *const vars[] = {
    "KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE", "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE",
    "KOLO_RENDEZVOUS", "KOLO_RENDEZVOUS_SERVER", "KOLO_JOB_ID", "KOLO_SECRET", "KOLO_EPOCH", "KOLO_START_TIMEOUT",
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "PMI_ID", "PMI_JOBID", "PMI_KVSNAME", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_SIZE", "PMIX_NAMESPACE",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NUM_NODES",
    "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_JOBID",
    "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_LAUNCH_NODE_IPADDR",
    "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT",
};
#define NVARS (sizeof(vars) / sizeof(vars[0]))

static bool verbose; /* KOLO_FUZZ_VERBOSE=1: what each input was found to be */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    verbose = getenv("KOLO_FUZZ_VERBOSE") != NULL;
    kolo__log_level = KOLO_LOG_NONE; /* the detection's info lines, one per input */
    unsetenv("PMI_FD");
    unsetenv("PMI_PORT");
    extern char **environ;
    for (char **e = environ; e && *e;) { /* PMIX_SERVER_URI2, URI21, ...: any of them */
        if (strncmp(*e, "PMIX_SERVER_URI", 15) == 0) {
            char name[64];
            size_t n = strcspn(*e, "=");
            snprintf(name, sizeof(name), "%.*s", (int)n, *e);
            unsetenv(name);
            continue;
        }
        e++;
    }
    return 0;
}

static bool count_host(const char *h, void *arg)
{
    if (!*h) abort(); /* a list gives out names, never empty ones */
    (*(long *)arg)++;
    return true;
}

static void check_identity(const kolo__world_info *w)
{
    if (w->size < 1 || w->rank < 0 || w->rank >= w->size) abort();
    if (w->local_size >= 0 && w->local_rank >= 0 && w->local_rank >= w->local_size) abort();
    if (w->cross_size >= 0 && w->cross_rank >= 0 && w->cross_rank >= w->cross_size) abort();
    if (w->rdv_port < 0 || w->rdv_port > 65535) abort();
    if (w->rdv_port && !w->rdv_host[0]) abort();
    if (strnlen(w->rdv_host, sizeof(w->rdv_host)) == sizeof(w->rdv_host)) abort();
    if (strnlen(w->source, sizeof(w->source)) == sizeof(w->source) || !w->source[0]) abort();
    if (strnlen(w->job_id, sizeof(w->job_id)) == sizeof(w->job_id)) abort();
    if (w->secret_len > sizeof(w->secret)) abort();
    if (!(w->start_timeout > 0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    for (size_t i = 0; i < NVARS; i++) unsetenv(vars[i]);
    char last[301] = "";
    int lastvar = 0;
    while (f.n) {
        lastvar = fz_u8(&f) % (int)NVARS;
        size_t n;
        const uint8_t *v = fz_span(&f, 300, &n);
        memcpy(last, v, n);
        last[n] = '\0'; /* cut at a NUL, as the environment would */
        setenv(vars[lastvar], last, 1);
    }
    kolo__world_info w;
    memset(&w, 0x5a, sizeof(w));
    int st = kolo__env_detect(&w);
    if (verbose) fprintf(stderr, "fuzz_env: %s\n", st ? kolo_last_error() : w.source);
    if (st == KOLO_OK) check_identity(&w);
    else if ((st != KOLO_ERR_INVALID_ARG && st != KOLO_ERR_STARTUP) || !kolo_last_error()[0]) abort();

    /* the parsers on the last value, whatever variable it was for */
    long hosts = 0;
    long given = kolo__slurm_hosts(last, count_host, &hosts);
    if (given != (given < 0 ? -1 : hosts)) abort();
    char host[256];
    if (kolo__slurm_first_host(last, host, sizeof(host)) && !host[0]) abort();
    int port, count;
    if (kolo__parse_hostport(last, host, sizeof(host), &port) && (port < 1 || port > 65535 || !host[0])) abort();
    if (kolo__slurm_tasks_on_node(last, lastvar % 7, &count) && count < 0) abort();
    size_t bytes;
    (void)kolo__parse_bytes(last, &bytes);
    int derived = kolo__env_port_from(last);
    if (derived < 20000 || derived > 32767) abort();
    return 0;
}
