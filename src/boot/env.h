/* env.h - who am I: rank, size and the rendezvous address, read from whichever launcher started us. */
#ifndef KOLO_ENV_H
#define KOLO_ENV_H

#include "../common/common.h"

typedef struct kolo__world_info {
    int rank, size;
    /* From the environment when the launcher says (-1 when it does not). The
     * core recomputes them from the hosts that actually connect; these are hints. */
    int local_rank, local_size, cross_rank, cross_size;
    /* Rendezvous store address. port 0: none known (a world of one needs none). */
    char rdv_host[256];
    int rdv_port;
    /* 1: world rank 0 must serve the store itself at rdv_host:rdv_port (binding
     * rdv_port on all interfaces) because no launcher serves one (mpirun, srun,
     * torchrun, a bare KOLO_RENDEZVOUS without KOLO_RANK from kolorun). */
    int rdv_serve;
    /* Which convention was found: "kolo", "horovod", "torchrun", "openmpi", "pmi", "pmix",
     * "slurm" or "none". */
    char source[16];
    /* A string every rank of this job computes identically and other jobs on the same
     * host do not: namespaces store keys and shared-memory names. */
    char job_id[96];
    /* Job secret bytes (KOLO_SECRET). When no secret is given, one is derived from job_id
     * and secret_derived is 1: that guards against accidents (another job's ranks), not
     * against an attacker who can read the environment. */
    char secret[256];
    size_t secret_len;
    int secret_derived;
    /* Elastic jobs (core/elastic.c): the round, which names the store keys of the start-up
     * (0: count this process's inits instead), and a store key whose appearance means kolorun
     * formed a newer round while this one was starting ("": none). */
    int epoch;
    char abort_key[224];
    /* Seconds kolo_init waits without progress (a rank arriving, a connection made) before
     * naming the ranks missing: KOLO_START_TIMEOUT where set, else its default, 30, but for a
     * TrainJob's pods (source "pet"), 600 (see env.c, from_pet). */
    double start_timeout;
} kolo__world_info;

/* Fills *out from the environment, in the order of DESIGN.md:
 *   KOLO_RANK/KOLO_SIZE (+ KOLO_LOCAL_RANK ..., KOLO_RENDEZVOUS, KOLO_SECRET, KOLO_JOB_ID);
 *   HOROVOD_RANK/HOROVOD_SIZE (+ HOROVOD_LOCAL_RANK ..., HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT);
 *   torchrun RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK/MASTER_ADDR/MASTER_PORT;
 *   OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/NODE_RANK;
 *   PMI_RANK/PMI_SIZE (+ MPI_LOCALRANKID/MPI_LOCALNRANKS), PMIX_RANK;
 *   SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID + first host of SLURM_STEP_NODELIST
 *   (or SLURM_JOB_NODELIST), expanded;
 *   PET_NNODES/PET_NODE_RANK/PET_MASTER_ADDR/PET_MASTER_PORT (a Kubeflow TrainJob's pods, no torchrun);
 *   nothing: rank 0 of 1.
 * KOLO_RENDEZVOUS=host:port overrides the address of any convention.
 * Returns KOLO_ERR_INVALID_ARG with a message naming the variable when a value is malformed
 * (non-numeric, rank >= size, ...) or when the convention gives no way to find rank 0
 * (e.g. mpirun across several hosts without KOLO_RENDEZVOUS). */
int kolo__env_detect(kolo__world_info *out);

/* Expands the first host of a Slurm hostlist ("node[01-04,07],gpu5" -> "node01").
 * Returns false if the list is malformed. */
bool kolo__slurm_first_host(const char *nodelist, char *out, size_t cap);

/* Calls each(host, arg) for every host of a Slurm hostlist, in order ("rack[1-2]-n[08-09]" ->
 * rack1-n08, rack1-n09, rack2-n08, rack2-n09), until it returns false. Returns how many hosts were
 * given out, or -1 when the list is malformed (nothing given out then), a host is longer than 255
 * bytes or the list expands to over a million hosts. */
long kolo__slurm_hosts(const char *nodelist, bool (*each)(const char *host, void *arg), void *arg);

/* Splits "host:port" or "[v6addr]:port". Returns false if malformed. */
bool kolo__parse_hostport(const char *s, char *host, size_t cap, int *port);

/* Tasks on node `node` (0-based) from a Slurm tasks-per-node list ("2(x3),1": nodes 0-2 run 2,
 * node 3 runs 1). Returns false if the list is malformed or has no such node. */
bool kolo__slurm_tasks_on_node(const char *tasks_per_node, int node, int *count);

/* The port every rank derives from the same text (a job id) when no launcher gives one:
 * a hash of `key` mapped into [20000, 32767] (below the kernel's ephemeral ports). */
int kolo__env_port_from(const char *key);

#endif
