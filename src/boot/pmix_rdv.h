/* pmix_rdv.h - rank 0's rendezvous address through PMIx (pmix_rdv.c). */
#ifndef KOLO_PMIX_RDV_H
#define KOLO_PMIX_RDV_H

#include <stdbool.h>
#include <stddef.h>

/* Collective over the launcher's PMIx namespace: rank 0 publishes "<its address>:<a free port>"
 * (the address of the interface KOLO_IFACE's spec `iface` allows when not empty, else the one
 * towards `towards` when not NULL, else towards mpirun's host when Open MPI names it, else its
 * first interface's but lo and docker); every rank waits up to timeout_s for all, then copies
 * rank 0's text into host. KOLO_ERR_STARTUP with the reason when PMIx is absent (no
 * libpmix.so.2, or not under a PMIx launcher) or the exchange fails. When rank 0 has no address,
 * every rank logs why and meets the others at a second fence before it returns (as
 * kolo__pmi_rendezvous). */
int kolo__pmix_rendezvous(int rank, const char *iface, const char *towards, int timeout_s, char *host, size_t cap);

/* Whether libpmix.so.2 can be loaded here (false in a build without PMIx). */
bool kolo__pmix_loadable(void);

/* 1 when this build can exchange the address through PMIx (pmix.h was found), else 0. */
int kolo__pmix_built(void);

#endif
