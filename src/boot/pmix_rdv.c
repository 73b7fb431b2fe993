/* pmix_rdv.c - rank 0's address through PMIx, for launchers that give none across hosts (mpirun of
 * Open MPI 2 and later, which runs a PMIx server in every host's daemon).
 *
 * Rank 0 puts "kolo.rendezvous" = "<address>:<port>" (PMIX_GLOBAL), every rank commits and
 * fences with data collection (so the key reaches every host's server, under a time limit), and
 * every rank gets rank 0's value. The address: the one KOLO_IFACE names (its syntax as for kolo's
 * own connections, net/mesh.c), else the one rank 0 would use towards the launcher's own host
 * (Open MPI names it in OMPI_MCA_orte_hnp_uri: it is where the daemons reach each other, so the
 * other hosts reach rank 0 there too), else the first up interface's but lo and docker.
 * Rank 0 with no address says why and puts an empty value: every rank learns of it at the fence,
 * says so, and all meet at a second, short fence before any returns, since the launcher ends the
 * job at the first rank's exit and a reason not yet written would be lost (pmi_rdv.c alike).
 *
 * libpmix is opened at run time (dlopen "libpmix.so.2"): libkolo needs nothing more to link, and
 * a host without PMIx gets kolo's error asking for KOLO_RENDEZVOUS, as before. Built only where
 * pmix.h is found (Debian: libpmix-dev, which libopenmpi-dev brings). */
#include "pmix_rdv.h"

#include "pmi_rdv.h"

#include "../common/common.h"
#include "../net/transport.h"

#include <stdio.h>
#include <string.h>

#if defined(KOLO_HAVE_PMIX)
#include <dlfcn.h>
#include <pmix.h>
#include <stdlib.h>

#define KEY "kolo.rendezvous"

typedef pmix_status_t (*init_fn)(pmix_proc_t *, pmix_info_t *, size_t);
typedef pmix_status_t (*finalize_fn)(const pmix_info_t *, size_t);
typedef pmix_status_t (*put_fn)(pmix_scope_t, const pmix_key_t, pmix_value_t *);
typedef pmix_status_t (*commit_fn)(void);
typedef pmix_status_t (*fence_fn)(const pmix_proc_t *, size_t, const pmix_info_t *, size_t);
typedef pmix_status_t (*get_fn)(const pmix_proc_t *, const pmix_key_t, const pmix_info_t *, size_t, pmix_value_t **);
typedef const char *(*error_fn)(pmix_status_t);

/* The launcher's host in OMPI_MCA_orte_hnp_uri ("jobid.0;tcp://10.0.0.1,10.1.0.1:port;..."). */
static bool launcher_host(char *host, size_t cap)
{
    const char *uri = getenv("OMPI_MCA_orte_hnp_uri");
    const char *p = uri ? strstr(uri, "tcp://") : NULL;
    if (!p) return false;
    p += 6;
    size_t n = strcspn(p, ",:;");
    if (n == 0 || n >= cap) return false;
    memcpy(host, p, n);
    host[n] = '\0';
    return true;
}

int kolo__pmix_rendezvous(int rank, const char *iface, const char *towards, int timeout_s, char *host, size_t cap)
{
    void *lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return kolo__err(KOLO_ERR_STARTUP, "PMIx is not available here (%s)", dlerror());
    init_fn init = (init_fn)dlsym(lib, "PMIx_Init");
    finalize_fn fin = (finalize_fn)dlsym(lib, "PMIx_Finalize");
    put_fn put = (put_fn)dlsym(lib, "PMIx_Put");
    commit_fn commit = (commit_fn)dlsym(lib, "PMIx_Commit");
    fence_fn fence = (fence_fn)dlsym(lib, "PMIx_Fence");
    get_fn get = (get_fn)dlsym(lib, "PMIx_Get");
    error_fn errstr = (error_fn)dlsym(lib, "PMIx_Error_string");
    if (!init || !fin || !put || !commit || !fence || !get || !errstr) {
        dlclose(lib);
        return kolo__err(KOLO_ERR_STARTUP, "libpmix.so.2 lacks PMIx_Init, _Put, _Commit, _Fence or _Get");
    }
    int st = KOLO_OK;
    pmix_proc_t me;
    memset(&me, 0, sizeof(me));
    pmix_status_t rc = init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        st = kolo__err(KOLO_ERR_STARTUP, "PMIx_Init: %s", errstr(rc));
        goto out;
    }
    char mine[300] = "";
    bool published_nothing = false; /* rank 0 had no address: every rank knows after the fence */
    if (rank == 0) {
        /* towards the caller's host, else mpirun's: where the daemons reach each other, so the
         * other hosts reach rank 0 there too */
        char hnp[256];
        if (!towards && launcher_host(hnp, sizeof(hnp))) towards = hnp;
        st = kolo__rdv_endpoint(iface, towards, "PMIx", mine, sizeof(mine));
        /* said now, before the fence through which the others learn of it: they fail at once
         * then, and under mpirun the first rank to exit ends the job, so a reason rank 0 gave
         * only with kolo_init's error after the fence could be cut off (seen once in a CI run of
         * multihost_mpirun_finds_rank_0_through_pmix: every rank's "published no address", not
         * rank 0's own) */
        if (st != KOLO_OK) KOLO_ERROR("%s; the other ranks learn of it now", kolo__errmsg());
        /* publish even an empty value: the others learn of the failure at once, not by timeout */
        pmix_value_t v;
        memset(&v, 0, sizeof(v));
        v.type = PMIX_STRING;
        v.data.string = mine;
        rc = put(PMIX_GLOBAL, KEY, &v);
        if (rc == PMIX_SUCCESS) rc = commit();
        if (rc != PMIX_SUCCESS && st == KOLO_OK) st = kolo__err(KOLO_ERR_STARTUP, "PMIx_Put of %s: %s", KEY, errstr(rc));
        published_nothing = rc == PMIX_SUCCESS && !*mine;
    }
    /* every rank: the fence, under the start time-out (a rank that never arrives is an error) */
    pmix_info_t info[2];
    memset(info, 0, sizeof(info));
    snprintf(info[0].key, sizeof(info[0].key), "%s", PMIX_COLLECT_DATA);
    info[0].value.type = PMIX_BOOL;
    info[0].value.data.flag = true;
    snprintf(info[1].key, sizeof(info[1].key), "%s", PMIX_TIMEOUT);
    info[1].value.type = PMIX_INT;
    info[1].value.data.integer = timeout_s > 0 ? timeout_s : 30;
    pmix_proc_t all;
    memset(&all, 0, sizeof(all));
    memcpy(all.nspace, me.nspace, sizeof(all.nspace));
    all.rank = PMIX_RANK_WILDCARD;
    rc = fence(&all, 1, info, 2);
    if (rc != PMIX_SUCCESS) {
        if (st == KOLO_OK)
            st = kolo__err(KOLO_ERR_STARTUP, "PMIx_Fence (every rank's kolo_init, within %d s): %s", timeout_s,
                           errstr(rc));
        goto out_fin;
    }
    if (st == KOLO_OK) {
        pmix_proc_t zero = all;
        zero.rank = 0;
        pmix_value_t *got = NULL;
        rc = get(&zero, KEY, NULL, 0, &got);
        if (rc != PMIX_SUCCESS || !got || got->type != PMIX_STRING || !got->data.string) {
            st = kolo__err(KOLO_ERR_STARTUP, "PMIx_Get of rank 0's %s: %s", KEY,
                           rc != PMIX_SUCCESS ? errstr(rc) : "not a string");
        } else if (!*got->data.string) {
            st = kolo__err(KOLO_ERR_STARTUP, "rank 0 published no address through PMIx (see rank 0's error)");
            published_nothing = true;
            KOLO_ERROR("%s", kolo__errmsg());
        } else {
            snprintf(host, cap, "%s", got->data.string);
        }
        /* the value is ours to release, as PMIX_VALUE_RELEASE does: its contents, then itself */
        void (*destruct)(pmix_value_t *) = (void (*)(pmix_value_t *))dlsym(lib, "PMIx_Value_destruct");
        if (got && destruct) destruct(got);
        free(got);
    }
    /* every rank has said why now; a second, short fence keeps any from leaving before the
     * rest have: under mpirun the first rank to exit ends the job, and a reason not yet written
     * is lost (seen in CI: rank 0's reason, none of the others') */
    if (published_nothing) {
        info[1].value.data.integer = kolo__rdv_parting_s(timeout_s);
        (void)fence(&all, 1, &info[1], 1);
    }
out_fin:
    fin(NULL, 0);
out:
    /* libpmix stays loaded: its threads may outlive PMIx_Finalize by a moment */
    return st;
}

int kolo__pmix_built(void) { return 1; }

bool kolo__pmix_loadable(void)
{
    void *lib = dlopen("libpmix.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib) dlclose(lib);
    return lib != NULL;
}

#else

int kolo__pmix_built(void) { return 0; }

bool kolo__pmix_loadable(void) { return false; }

int kolo__pmix_rendezvous(int rank, const char *iface, const char *towards, int timeout_s, char *host, size_t cap)
{
    (void)rank, (void)iface, (void)towards, (void)timeout_s, (void)host, (void)cap;
    return kolo__err(KOLO_ERR_STARTUP, "this libkolo was built without PMIx (no pmix.h: apt-get install libpmix-dev)");
}

#endif
