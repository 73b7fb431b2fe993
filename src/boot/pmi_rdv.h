/* pmi_rdv.h - rank 0's rendezvous address through the PMI-1 wire protocol of MPICH's Hydra
 * (pmi_rdv.c), and the address rank 0 publishes through any launcher (also pmix_rdv.c's). */
#ifndef KOLO_PMI_RDV_H
#define KOLO_PMI_RDV_H

#include <stdbool.h>
#include <stddef.h>

/* Whether this process was given a PMI-1 connection: PMI_FD, or PMI_PORT with PMI_ID
 * (mpiexec -pmi-port). */
bool kolo__pmi_available(void);

/* Under PMI_PORT/PMI_ID, where the environment has no rank: connects (once per process) and
 * reads rank and size from the server's answer. KOLO_ERR_STARTUP with the reason otherwise. */
int kolo__pmi_identity(int *rank, int *size, int timeout_s);

/* The job's key-value space name, identical on every rank ("kvs_4242_0_..."): the job id.
 * Connects once per process. */
int kolo__pmi_kvsname(char *out, size_t cap, int timeout_s);

/* Collective over the job: rank 0 puts "<its address>:<a free port>" (kolo__rdv_endpoint,
 * towards no host in particular), every rank enters the barrier (within timeout_s) and reads
 * rank 0's value into host. The process finalizes its PMI connection when it exits normally
 * (Hydra ends the whole job when a process that spoke PMI closes it without doing so), unless
 * MPI in the same process finalized it already. KOLO_ERR_STARTUP naming what went wrong
 * (what the server answered, a closed connection, the barrier's time limit). When rank 0 has no
 * address, every rank logs why and enters a second barrier (kolo__rdv_parting_s) before it
 * returns: the launcher ends the job at the first rank's exit, which must not cut off another's
 * reason. */
int kolo__pmi_rendezvous(int rank, const char *iface, int timeout_s, char *host, size_t cap);

/* Seconds the second meeting above (and pmix_rdv.c's) waits at most: the start time-out, up to
 * 10 s, since it only keeps ranks from leaving before the others have said why. */
int kolo__rdv_parting_s(int timeout_s);

/* "<address>:<port>" for rank 0 to publish: the address of the interface the KOLO_IFACE spec
 * `iface` allows when not empty, else the one towards `towards` (a launcher's host) when given
 * and not loopback, else the first up interface's but lo and docker; the port is free now on
 * all interfaces (the store binds it a moment later). KOLO_ERR_STARTUP saying which is missing. */
int kolo__rdv_endpoint(const char *iface, const char *towards, const char *via, char *out, size_t cap);

#endif
