/* elastic.c - a worker of an elastic kolorun job: joining the newest round, and asking whether
 * kolorun has formed a newer one.
 *
 * kolorun (tools/kolorun/elastic.c) re-forms the job in rounds when workers fail or hosts come
 * and go. For round g of the job whose KOLO_JOB_ID is <base> it writes into its store, in this
 * order:
 *   <base>/elastic/<g>/w/<id>   "rank size local_rank local_size cross_rank cross_size" for each
 *                               worker of the round, or "removed" for one whose host left
 *   <base>/elastic/<g>/kind     "added" (the round has workers new to the job) or "removed"
 *   <base>/elastic/latest       g
 * so a worker that sees `latest` finds its own entry of that round. A worker's id
 * (KOLO_ELASTIC_ID) is fixed for its life; its rank is the round's. Each worker writes
 * <base>/elastic/joined/<id> = g once it has started round g, which tells kolorun, when the job
 * ends, which workers were still waiting for a round that will never start; and
 * <base>/elastic/waiting/<id> = g when it waits for round g, which asks kolorun for one: when
 * every worker asks (a collective failed on all of them) kolorun forms it with the same workers,
 * and when some ask and others do not for a while, those others stopped answering. A worker asks
 * as soon as a collective of its round fails (kolo__elastic_ask), not only once the program has
 * shut kolo down and waits in kolo_init: the shutdown may take seconds (the engine's goodbye to
 * ranks that do not answer), and kolorun, seeing a worker neither ask nor use CPU time for
 * STUCK_GRACE_S (tools/kolorun/elastic.c), takes it for stuck and kills it.
 *
 * The connection to kolorun's store is one request stream; the engine's thread asks too, so every
 * use of it holds estore_lock. */
#include "world.h"

#include <stdio.h>
#include <stdlib.h>

#define W kolo__W

static pthread_mutex_t estore_lock = PTHREAD_MUTEX_INITIALIZER;

static int eset(const char *key, const char *val, size_t len)
{
    pthread_mutex_lock(&estore_lock);
    int st = kolo__store_set(W.estore, key, val, len);
    pthread_mutex_unlock(&estore_lock);
    return st;
}

/* Sets <base>/elastic/waiting/<id> = want, which asks kolorun for round want; with `again` false
 * not when this worker asked for that round already (*sent says whether it did now). */
static int ask_for(int want, bool again, bool *sent)
{
    char key[160], val[16];
    snprintf(key, sizeof(key), "%s/elastic/waiting/%d", W.info.job_id, W.elastic_id);
    int n = snprintf(val, sizeof(val), "%d", want);
    pthread_mutex_lock(&estore_lock);
    *sent = W.estore && (again || W.elastic_asked != want);
    int st = *sent ? kolo__store_set(W.estore, key, val, (size_t)n) : KOLO_OK;
    if (*sent && st == KOLO_OK) W.elastic_asked = want;
    pthread_mutex_unlock(&estore_lock);
    return st;
}

static int fail_store(int st, const char *what)
{
    return kolo__err(st, "worker %d of the elastic job could not %s: %s", W.elastic_id, what, kolo__errmsg());
}

static int get_text(const char *key, char *out, size_t cap, double timeout_s)
{
    void *v = NULL;
    size_t len = 0;
    pthread_mutex_lock(&estore_lock);
    int st = kolo__store_get(W.estore, key, &v, &len, timeout_s);
    pthread_mutex_unlock(&estore_lock);
    if (st != KOLO_OK) return st;
    snprintf(out, cap, "%.*s", (int)KOLO_MIN(len, cap - 1), (const char *)v);
    kolo__free(v);
    return KOLO_OK;
}

static int latest_round(int *g)
{
    char key[160], text[32];
    snprintf(key, sizeof(key), "%s/elastic/latest", W.info.job_id);
    *g = 0;
    int st = get_text(key, text, sizeof(text), 0);
    if (st == KOLO_ERR_TIMEOUT) {
        kolo__err_clear();
        return KOLO_OK;
    }
    if (st != KOLO_OK) return st;
    *g = atoi(text);
    return KOLO_OK;
}

int kolo__elastic_join(void)
{
    const char *id = getenv("KOLO_ELASTIC_ID");
    char *end = NULL;
    long wid = id ? strtol(id, &end, 10) : -1;
    if (!id || *end || wid < 0 || wid > 1000000)
        return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_ELASTIC=1 but KOLO_ELASTIC_ID='%s' is not a worker id (kolorun sets both)",
                         id ? id : "");
    W.elastic_id = (int)wid;
    if (W.info.rdv_port == 0) return kolo__err(KOLO_ERR_INVALID_ARG, "KOLO_ELASTIC=1 but no KOLO_RENDEZVOUS: start elastic jobs with kolorun");
    int st;
    if (!W.estore) {
        /* A worker that has been in a round reconnects (kolo_shutdown closed the connection) to a
         * store that was there a moment ago: where it cannot for KOLO_TCP_KEEPALIVE, kolorun is
         * gone or its machine cut off from this one, and the worker ends. It waited for
         * KOLO_START_TIMEOUT, which kolorun makes its elastic timeout (600 s), and on a host cut
         * off from kolorun's, whose wrapper cannot be told the job ended, outlived the job by
         * that much (tests/test_multihost.c). */
        double connect_s = W.info.start_timeout, ka = kolo__keepalive_s();
        if (W.elastic_round > 0 && ka > 0 && ka < connect_s) connect_s = ka;
        st = kolo__store_connect(&W.estore, W.info.rdv_host, W.info.rdv_port, W.info.secret, W.info.secret_len,
                                 connect_s);
        if (st != KOLO_OK) return fail_store(st, "reach kolorun's store");
    }
    int want = W.elastic_round + 1;
    if (W.elastic_round == 0) {
        const char *r = getenv("KOLO_ELASTIC_ROUND");
        if (r && atoi(r) > 0) want = atoi(r);
    }
    /* wait for kolorun to place this worker in round `want`, then take the newest round */
    double wait_s = kolo__setting_double(KOLO_SET_ELASTIC_TIMEOUT);
    char key[200], text[128];
    bool sent;
    if ((st = ask_for(want, true, &sent)) != KOLO_OK) return fail_store(st, "ask kolorun for a new round");
    snprintf(key, sizeof(key), "%s/elastic/%d/w/%d", W.info.job_id, want, W.elastic_id);
    st = get_text(key, text, sizeof(text), wait_s);
    if (st == KOLO_ERR_TIMEOUT)
        return kolo__err(KOLO_ERR_STARTUP, "worker %d waited %g s (KOLO_ELASTIC_TIMEOUT) for kolorun to form round %d of the elastic job",
                         W.elastic_id, wait_s, want);
    if (st != KOLO_OK) return fail_store(st, "read its place in the next round");
    int g = want, latest = 0;
    if ((st = latest_round(&latest)) != KOLO_OK) return fail_store(st, "read the newest round");
    if (latest > want) {
        g = latest;
        snprintf(key, sizeof(key), "%s/elastic/%d/w/%d", W.info.job_id, g, W.elastic_id);
        st = get_text(key, text, sizeof(text), 0);
        if (st == KOLO_ERR_TIMEOUT) snprintf(text, sizeof(text), "removed"); /* removed in a round between */
        else if (st != KOLO_OK) return fail_store(st, "read its place in the newest round");
    }
    W.elastic_round = g;
    if (strcmp(text, "removed") == 0)
        return kolo__err(KOLO_ERR_REMOVED, "worker %d was removed from the elastic job in round %d: its host left the job",
                         W.elastic_id, g);
    kolo__world_info *wi = &W.info;
    if (sscanf(text, "%d %d %d %d %d %d", &wi->rank, &wi->size, &wi->local_rank, &wi->local_size, &wi->cross_rank,
               &wi->cross_size) != 6 ||
        wi->size < 1 || wi->rank < 0 || wi->rank >= wi->size)
        return kolo__err(KOLO_ERR_PROTOCOL, "kolorun gave worker %d a malformed place in round %d: '%s'", W.elastic_id, g, text);
    wi->epoch = g;
    snprintf(wi->abort_key, sizeof(wi->abort_key), "%s/elastic/%d/w/%d", wi->job_id, g + 1, W.elastic_id);
    return KOLO_OK;
}

void kolo__elastic_started(void)
{
    char key[160], val[16];
    snprintf(key, sizeof(key), "%s/elastic/joined/%d", W.info.job_id, W.elastic_id);
    int n = snprintf(val, sizeof(val), "%d", W.elastic_round);
    if (eset(key, val, (size_t)n) != KOLO_OK)
        KOLO_WARN("worker %d could not tell kolorun it started round %d: %s", W.elastic_id, W.elastic_round, kolo__errmsg());
}

/* A round that could not start is waited out when a member died in it (kolorun forms the next
 * one) or kolorun replaced it; not when its deadline passed with every member alive but not
 * arriving (the old workers of a grown job not reaching a commit within KOLO_START_TIMEOUT):
 * asking for another round then would make kolorun take the late ones for stuck. */
bool kolo__elastic_retry(int st)
{
    /* W.info.epoch is set by a join that succeeded: a failed join's error is final */
    if (!W.elastic || W.info.epoch == 0) return false;
    int end = kolo__mesh_last_end();
    if (end == KOLO__MESH_SUPERSEDED) return true;
    if (end == KOLO__MESH_DEADLINE) return false;
    return st == KOLO_ERR_STARTUP || st == KOLO_ERR_PEER_LOST || st == KOLO_ERR_TIMEOUT || st == KOLO_ERR_SHUT_DOWN;
}

void kolo__elastic_ask(const kolo__mesh *m)
{
    if (!W.elastic || W.elastic_round <= 0 || !m || !m->failed) return;
    int want = W.elastic_round + 1;
    char failure[1024]; /* the caller's error, which the program reads after the failed call */
    snprintf(failure, sizeof(failure), "%s", kolo__errmsg());
    /* once per round: the collective's thread and the engine's may both see the failure */
    bool sent;
    int st = ask_for(want, false, &sent);
    if (sent && st == KOLO_OK)
        KOLO_DEBUG("worker %d asked kolorun for round %d: a collective of round %d failed", W.elastic_id, want, want - 1);
    else if (sent) /* kolo_init asks again (kolo__elastic_join), and says so if it cannot */
        KOLO_DEBUG("worker %d could not ask kolorun for round %d yet: %s", W.elastic_id, want, kolo__errmsg());
    kolo__err(KOLO_OK, "%s", failure);
}

void kolo__elastic_close(void)
{
    pthread_mutex_lock(&estore_lock);
    kolo__store_close(W.estore);
    W.estore = NULL;
    pthread_mutex_unlock(&estore_lock);
}

int kolo_elastic_enabled(void)
{
    const char *e = getenv("KOLO_ELASTIC");
    return e && strcmp(e, "1") == 0;
}

int kolo_elastic_round(void) { return W.initialized && W.elastic ? W.elastic_round : 0; }

/* Rank 0's answer: what the rounds after ours changed. */
static int newer_rounds(int32_t *update)
{
    int latest = 0;
    int st = latest_round(&latest);
    if (st != KOLO_OK) return fail_store(st, "ask kolorun for newer rounds");
    *update = KOLO_ELASTIC_NONE;
    for (int g = W.elastic_round + 1; g <= latest; g++) {
        char key[160], kind[32];
        snprintf(key, sizeof(key), "%s/elastic/%d/kind", W.info.job_id, g);
        st = get_text(key, kind, sizeof(kind), 0);
        if (st != KOLO_OK) return fail_store(st, "read what changed in a newer round");
        if (strcmp(kind, "added") == 0) *update = KOLO_ELASTIC_ADDED;
        else if (*update == KOLO_ELASTIC_NONE) *update = KOLO_ELASTIC_REMOVED;
    }
    return KOLO_OK;
}

int kolo_elastic_check(int *update)
{
    if (!update) return kolo__err(KOLO_ERR_INVALID_ARG, "kolo_elastic_check: update is NULL");
    *update = KOLO_ELASTIC_NONE;
    int forked = kolo__forked_refuse("kolo_elastic_check");
    if (forked) return forked;
    if (!W.initialized) return kolo__err(KOLO_ERR_NOT_INITIALIZED, "kolo is not initialized: call kolo_init() first");
    if (!W.elastic) return KOLO_OK;
    int32_t v = KOLO_ELASTIC_NONE;
    pthread_mutex_lock(&W.direct_lock);
    int st = W.info.rank == 0 ? newer_rounds(&v) : KOLO_OK;
    /* rank 0 failing to ask says so in the answer (-1), so that no rank waits for it */
    if (st != KOLO_OK) v = -1;
    if (W.info.size > 1) {
        int bst = kolo__coll_broadcast(W.mesh[0], W.psets[0], &v, sizeof(v), 0);
        if (bst != KOLO_OK) {
            st = bst;
            kolo__elastic_ask(W.mesh[0]);
        }
    }
    pthread_mutex_unlock(&W.direct_lock);
    if (st == KOLO_OK && v < 0) st = kolo__err(KOLO_ERR_STARTUP, "rank 0 could not ask kolorun for newer rounds of the elastic job");
    if (st == KOLO_OK) *update = v;
    return st;
}
