/* test_env.c - rank discovery from each launcher's real variables, precedence, malformed values,
 * Slurm lists, derived rendezvous addresses, job ids and secrets. */
#include "kt.h"

#include "../src/boot/env.h"
#include "../src/boot/pmix_rdv.h"
#include "../src/boot/store.h"
#include "../src/core/world.h"
#include "../src/net/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Removes every variable any convention reads, so the runner's own environment (a Slurm
 * job, a kolorun rank) cannot leak into a test. */
static void clear_env(void)
{
    static const char *const prefixes[] = {"KOLO_", "HOROVOD_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL",
                                           "SLURM_", "TORCHELASTIC_", "MV2_", "PET_"};
    static const char *const exact[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                        "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
    char names[512][128];
    int n = 0;
    for (char **e = environ; *e && n < 512; e++) {
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (len >= sizeof(names[0])) continue;
        bool drop = false;
        for (size_t i = 0; i < KOLO_ARRAY_SIZE(prefixes); i++)
            if (strncmp(*e, prefixes[i], strlen(prefixes[i])) == 0) drop = true;
        for (size_t i = 0; i < KOLO_ARRAY_SIZE(exact); i++)
            if (strlen(exact[i]) == len && strncmp(*e, exact[i], len) == 0) drop = true;
        if (!drop) continue;
        memcpy(names[n], *e, len);
        names[n++][len] = '\0';
    }
    for (int i = 0; i < n; i++) unsetenv(names[i]);
}

/* setenv for a list "NAME=VALUE", ..., NULL */
static void set_vars(const char *const *kv)
{
    for (; *kv; kv++) {
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", *kv);
        char *eq = strchr(buf, '=');
        KT_ASSERT(eq);
        *eq = '\0';
        setenv(buf, eq + 1, 1);
    }
}

static kolo__world_info detect_ok(void)
{
    kolo__world_info w;
    memset(&w, 0x5a, sizeof(w));
    KT_OK(kolo__env_detect(&w));
    return w;
}

static void expect_invalid(const char *needle)
{
    kolo__world_info w;
    KT_STATUS(kolo__env_detect(&w), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), needle);
}

#define STR_EQ(a, b) KT_ASSERTF(strcmp((a), (b)) == 0, "%s is '%s', expected '%s'", #a, (a), (b))

KT_TEST(env_nothing_is_world_of_one, 10)
{
    clear_env();
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "none");
    KT_EQ(w.rank, 0);
    KT_EQ(w.size, 1);
    KT_EQ(w.local_rank, 0);
    KT_EQ(w.local_size, 1);
    KT_EQ(w.rdv_port, 0);
    KT_EQ(w.rdv_serve, 0);
    KT_ASSERT(w.job_id[0] != '\0');
    KT_EQ(w.secret_derived, 1);
    KT_EQ(w.secret_len, 64);
}

KT_TEST(env_kolo_launcher, 10)
{
    clear_env();
    static const char *const v[] = {"KOLO_RANK=2", "KOLO_SIZE=4", "KOLO_LOCAL_RANK=0", "KOLO_LOCAL_SIZE=2",
                                    "KOLO_CROSS_RANK=1", "KOLO_CROSS_SIZE=2", "KOLO_RENDEZVOUS=10.0.0.1:1234",
                                    "KOLO_SECRET=abc def", "KOLO_JOB_ID=job-17", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "kolo");
    KT_EQ(w.rank, 2);
    KT_EQ(w.size, 4);
    KT_EQ(w.local_rank, 0);
    KT_EQ(w.local_size, 2);
    KT_EQ(w.cross_rank, 1);
    KT_EQ(w.cross_size, 2);
    STR_EQ(w.rdv_host, "10.0.0.1");
    KT_EQ(w.rdv_port, 1234);
    KT_EQ(w.rdv_serve, 0); /* kolorun serves the store */
    STR_EQ(w.job_id, "job-17");
    KT_EQ(w.secret_len, 7);
    KT_ASSERT(memcmp(w.secret, "abc def", 7) == 0);
    KT_EQ(w.secret_derived, 0);

    /* started without a launcher: rank 0 serves the store */
    setenv("KOLO_RENDEZVOUS_SERVER", "rank0", 1);
    w = detect_ok();
    KT_EQ(w.rdv_serve, 1);
    STR_EQ(w.rdv_host, "10.0.0.1");
    setenv("KOLO_RENDEZVOUS_SERVER", "rank-zero", 1);
    expect_invalid("KOLO_RENDEZVOUS_SERVER='rank-zero' is neither launcher nor rank0");
    unsetenv("KOLO_RENDEZVOUS_SERVER");

    /* hints left out are -1 */
    unsetenv("KOLO_LOCAL_RANK");
    unsetenv("KOLO_CROSS_SIZE");
    w = detect_ok();
    KT_EQ(w.local_rank, -1);
    KT_EQ(w.cross_size, -1);

    /* more than one rank needs a rendezvous address */
    unsetenv("KOLO_RENDEZVOUS");
    expect_invalid("KOLO_RENDEZVOUS");
    setenv("KOLO_SIZE", "1", 1);
    setenv("KOLO_RANK", "0", 1);
    unsetenv("KOLO_LOCAL_SIZE");
    unsetenv("KOLO_CROSS_RANK");
    w = detect_ok();
    KT_EQ(w.rdv_port, 0);
}

KT_TEST(env_malformed_values, 10)
{
    static const struct {
        const char *vars[4];
        const char *needle;
    } cases[] = {
        {{"KOLO_RANK=abc", "KOLO_SIZE=4"}, "KOLO_RANK='abc'"},
        {{"KOLO_RANK=-1", "KOLO_SIZE=4"}, "KOLO_RANK='-1'"},
        {{"KOLO_RANK=1x", "KOLO_SIZE=4"}, "KOLO_RANK='1x'"},
        {{"KOLO_RANK= 1", "KOLO_SIZE=4"}, "KOLO_RANK=' 1'"},
        {{"KOLO_RANK=0", "KOLO_SIZE=99999999999"}, "KOLO_SIZE='99999999999'"},
        {{"KOLO_RANK=4", "KOLO_SIZE=4"}, "KOLO_RANK=4 is not below KOLO_SIZE=4"},
        {{"KOLO_RANK=0", "KOLO_SIZE=0"}, "KOLO_SIZE=0"},
        {{"KOLO_RANK=1"}, "KOLO_SIZE is not set"},
        {{"KOLO_SIZE=2"}, "KOLO_RANK is not set"},
        {{"KOLO_RANK=0", "KOLO_SIZE=4", "KOLO_LOCAL_RANK=2", "KOLO_LOCAL_SIZE=2"}, "KOLO_LOCAL_RANK=2"},
        {{"KOLO_RANK=0", "KOLO_SIZE=4", "KOLO_LOCAL_SIZE=8"}, "KOLO_LOCAL_SIZE=8 exceeds KOLO_SIZE=4"},
        {{"KOLO_RANK=0", "KOLO_SIZE=4", "KOLO_CROSS_RANK=x"}, "KOLO_CROSS_RANK='x'"},
        {{"HOROVOD_RANK=3", "HOROVOD_SIZE=2"}, "HOROVOD_RANK=3 is not below HOROVOD_SIZE=2"},
        {{"HOROVOD_RANK=0", "HOROVOD_SIZE=two"}, "HOROVOD_SIZE='two'"},
        {{"RANK=0", "WORLD_SIZE=-4"}, "WORLD_SIZE='-4'"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=http"}, "MASTER_PORT='http'"},
        {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000"}, "MASTER_PORT='70000'"},
        {{"OMPI_COMM_WORLD_RANK=0"}, "OMPI_COMM_WORLD_SIZE is not set"},
        {{"OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=5"}, "OMPI_COMM_WORLD_RANK=5"},
        {{"PMI_RANK=0", "PMI_SIZE=0"}, "PMI_SIZE=0"},
        {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=node[1-"}, "SLURM_STEP_NODELIST='node[1-'"},
        {{"SLURM_PROCID=x", "SLURM_NTASKS=2"}, "SLURM_PROCID='x'"},
        {{"KOLO_RANK=0", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=nohostport"}, "KOLO_RENDEZVOUS='nohostport'"},
        {{"KOLO_RANK=0", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=h:0"}, "KOLO_RENDEZVOUS='h:0'"},
        /* gave up at once, or converted to whole seconds without a defined value */
        {{"KOLO_START_TIMEOUT=0"}, "KOLO_START_TIMEOUT (or HOROVOD_GLOO_TIMEOUT_SECONDS)='0' is not a number of"},
        {{"KOLO_RANK=0", "KOLO_SIZE=2", "KOLO_START_TIMEOUT=-1"}, "KOLO_START_TIMEOUT (or "},
        {{"HOROVOD_GLOO_TIMEOUT_SECONDS=nan"}, "HOROVOD_GLOO_TIMEOUT_SECONDS)='nan'"},
        {{"KOLO_START_TIMEOUT=inf"}, "='inf' is not a number of seconds above 0 and up to 10000000"},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(cases); i++) {
        clear_env();
        for (int j = 0; j < 4 && cases[i].vars[j]; j++) {
            const char *const one[] = {cases[i].vars[j], NULL};
            set_vars(one);
        }
        kolo__world_info w;
        int s = kolo__env_detect(&w);
        KT_ASSERTF(s == KOLO_ERR_INVALID_ARG, "case %zu (%s): status %d, message '%s'", i, cases[i].needle, s,
                   kolo_last_error());
        KT_ASSERTF(strstr(kolo_last_error(), cases[i].needle), "case %zu: '%s' does not contain '%s'", i,
                   kolo_last_error(), cases[i].needle);
    }
    /* empty counts as unset */
    clear_env();
    setenv("KOLO_RANK", "", 1);
    setenv("KOLO_SIZE", "", 1);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "none");
}

/* Every convention at once, then peeled off one by one: the documented order. */
KT_TEST(env_precedence, 10)
{
    clear_env();
    static const char *const all[] = {
        "KOLO_RANK=0", "KOLO_SIZE=1",
        "HOROVOD_RANK=1", "HOROVOD_SIZE=2", "HOROVOD_LOCAL_SIZE=2", "HOROVOD_GLOO_RENDEZVOUS_ADDR=h", "HOROVOD_GLOO_RENDEZVOUS_PORT=1",
        "RANK=1", "WORLD_SIZE=3", "MASTER_ADDR=m", "MASTER_PORT=29500",
        "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
        "PMI_RANK=3", "PMI_SIZE=5", "MPI_LOCALNRANKS=5",
        "PMIX_RANK=4", "PMIX_SIZE=6",
        "SLURM_PROCID=5", "SLURM_NTASKS=7", "SLURM_STEP_NODELIST=n1", "SLURM_JOB_ID=9", "SLURM_STEP_ID=0",
        "PET_NNODES=8", "PET_NODE_RANK=6", "PET_MASTER_ADDR=m", "PET_MASTER_PORT=29500",
        "KOLO_RENDEZVOUS=head:1", NULL};
    set_vars(all);
    static const struct {
        const char *source;
        int size;
        const char *drop[3];
    } order[] = {
        {"kolo", 1, {"KOLO_RANK", "KOLO_SIZE"}},
        {"horovod", 2, {"HOROVOD_RANK", "HOROVOD_SIZE"}},
        {"torchrun", 3, {"RANK"}},
        {"openmpi", 4, {"OMPI_COMM_WORLD_RANK"}},
        {"pmi", 5, {"PMI_RANK", "PMI_SIZE"}},
        {"pmix", 6, {"PMIX_RANK"}},
        {"slurm", 7, {"SLURM_PROCID"}},
        {"pet", 8, {"PET_NNODES"}},
        {"none", 1, {NULL}},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(order); i++) {
        kolo__world_info w = detect_ok();
        KT_ASSERTF(strcmp(w.source, order[i].source) == 0, "step %zu: source %s, expected %s", i, w.source,
                   order[i].source);
        KT_EQ(w.size, order[i].size);
        for (int j = 0; j < 3 && order[i].drop[j]; j++) unsetenv(order[i].drop[j]);
    }
}

KT_TEST(env_horovod, 10)
{
    clear_env();
    static const char *const v[] = {"HOROVOD_RANK=1", "HOROVOD_SIZE=2", "HOROVOD_LOCAL_RANK=1",
                                    "HOROVOD_LOCAL_SIZE=2", "HOROVOD_CROSS_RANK=0", "HOROVOD_CROSS_SIZE=1",
                                    "HOROVOD_HOSTNAME=box", "HOROVOD_GLOO_RENDEZVOUS_ADDR=10.1.1.1",
                                    "HOROVOD_GLOO_RENDEZVOUS_PORT=4567", "HOROVOD_CONTROLLER=gloo", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "horovod");
    KT_EQ(w.rank, 1);
    KT_EQ(w.local_rank, 1);
    KT_EQ(w.cross_size, 1);
    /* one host: rank 0 serves kolo's store on loopback (horovodrun's HTTP store is not ours) */
    STR_EQ(w.rdv_host, "127.0.0.1");
    KT_EQ(w.rdv_serve, 1);
    KT_CONTAINS(w.job_id, "10.1.1.1:4567");
    KT_EQ(w.rdv_port, kolo__env_port_from(w.job_id));
    KT_ASSERT(w.rdv_port >= 20000 && w.rdv_port <= 32767);
    KT_ASSERT(w.rdv_port != 4567);
    /* rank 0 computes the same address and secret */
    setenv("HOROVOD_RANK", "0", 1);
    setenv("HOROVOD_LOCAL_RANK", "0", 1);
    kolo__world_info w0 = detect_ok();
    KT_EQ(w0.rdv_port, w.rdv_port);
    STR_EQ(w0.job_id, w.job_id);
    KT_ASSERT(w0.secret_len == w.secret_len && memcmp(w0.secret, w.secret, w.secret_len) == 0);
    /* another horovodrun (other rendezvous port) is another job */
    setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "4568", 1);
    kolo__world_info w2 = detect_ok();
    KT_ASSERT(strcmp(w2.job_id, w.job_id) != 0);
    KT_ASSERT(memcmp(w2.secret, w.secret, w.secret_len) != 0);

    /* several hosts: no way to find rank 0 without KOLO_RENDEZVOUS */
    setenv("HOROVOD_SIZE", "4", 1);
    setenv("HOROVOD_CROSS_SIZE", "2", 1);
    expect_invalid("KOLO_RENDEZVOUS=host:port");
    setenv("KOLO_RENDEZVOUS", "trainer-0:5000", 1);
    w = detect_ok();
    STR_EQ(w.source, "horovod");
    STR_EQ(w.rdv_host, "trainer-0");
    KT_EQ(w.rdv_port, 5000);
    KT_EQ(w.rdv_serve, 1);
    /* unknown local size counts as several hosts */
    unsetenv("KOLO_RENDEZVOUS");
    unsetenv("HOROVOD_LOCAL_SIZE");
    unsetenv("HOROVOD_LOCAL_RANK");
    expect_invalid("KOLO_RENDEZVOUS");
}

KT_TEST(env_torchrun, 10)
{
    clear_env();
    static const char *const v[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                                    "GROUP_RANK=1", "GROUP_WORLD_SIZE=2", "ROLE_RANK=3", "MASTER_ADDR=node0",
                                    "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=abc", "TORCHELASTIC_RESTART_COUNT=0",
                                    "TORCHELASTIC_USE_AGENT_STORE=True", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "torchrun");
    KT_EQ(w.rank, 3);
    KT_EQ(w.size, 4);
    KT_EQ(w.local_rank, 1);
    KT_EQ(w.local_size, 2);
    KT_EQ(w.cross_rank, 1);
    KT_EQ(w.cross_size, 2);
    STR_EQ(w.rdv_host, "node0");
    KT_EQ(w.rdv_port, 29501); /* never torchrun's own MASTER_PORT */
    KT_EQ(w.rdv_serve, 1);
    KT_CONTAINS(w.job_id, "abc");

    /* a restart is a new job id and a new secret: stale keys are never seen */
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    kolo__world_info r = detect_ok();
    KT_ASSERT(strcmp(r.job_id, w.job_id) != 0);
    KT_ASSERT(memcmp(r.secret, w.secret, w.secret_len) != 0);

    setenv("MASTER_PORT", "65535", 1);
    w = detect_ok();
    KT_EQ(w.rdv_port, 65534);

    setenv("KOLO_RENDEZVOUS", "[fe80::1]:7000", 1);
    w = detect_ok();
    STR_EQ(w.rdv_host, "fe80::1");
    KT_EQ(w.rdv_port, 7000);
    KT_EQ(w.rdv_serve, 1);
    unsetenv("KOLO_RENDEZVOUS");

    unsetenv("MASTER_PORT");
    expect_invalid("MASTER_PORT");

    /* RANK alone is somebody else's variable */
    clear_env();
    setenv("RANK", "3", 1);
    w = detect_ok();
    STR_EQ(w.source, "none");
}

/* A Kubeflow TrainJob's pod, its program started without torchrun: torchrun's arguments as
 * PET_* variables and nothing else. One rank per pod, rank 0 serving beside PET_MASTER_PORT. */
KT_TEST(env_pet_trainjob_pods, 10)
{
    clear_env();
    static const char *const v[] = {"PET_NNODES=3", "PET_NODE_RANK=2", "PET_NPROC_PER_NODE=1",
                                    "PET_MASTER_ADDR=job-node-0-0.job", "PET_MASTER_PORT=29500", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "pet");
    KT_EQ(w.rank, 2);
    KT_EQ(w.size, 3);
    KT_EQ(w.local_rank, 0);
    KT_EQ(w.local_size, 1);
    KT_EQ(w.cross_rank, 2);
    KT_EQ(w.cross_size, 3);
    STR_EQ(w.rdv_host, "job-node-0-0.job");
    KT_EQ(w.rdv_port, 29501);
    KT_EQ(w.rdv_serve, 1);
    KT_CONTAINS(w.job_id, "job-node-0-0.job:29500");
    /* pods start minutes apart where a node or an image must come first: 10 minutes to assemble
     * unless the job says otherwise (also through Horovod's name for the setting) */
    KT_ASSERTF(w.start_timeout == 600.0, "start timeout %g", w.start_timeout);
    setenv("KOLO_START_TIMEOUT", "45", 1);
    KT_ASSERTF(detect_ok().start_timeout == 45.0, "start timeout %g", detect_ok().start_timeout);
    unsetenv("KOLO_START_TIMEOUT");
    setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "20", 1);
    KT_ASSERTF(detect_ok().start_timeout == 20.0, "start timeout %g", detect_ok().start_timeout);
    unsetenv("HOROVOD_GLOO_TIMEOUT_SECONDS");
    /* every pod computes the same job and secret */
    setenv("PET_NODE_RANK", "0", 1);
    kolo__world_info w0 = detect_ok();
    STR_EQ(w0.job_id, w.job_id);
    KT_ASSERT(w0.secret_len == w.secret_len && memcmp(w0.secret, w.secret, w.secret_len) == 0);
    /* torchrun's N:N is a fixed count; processes per pod other than 1 leave one rank per pod (a
     * warning on rank 0): torchrun, which would start them, is not here */
    setenv("PET_NNODES", "3:3", 1);
    setenv("PET_NPROC_PER_NODE", "auto", 1);
    w = detect_ok();
    KT_EQ(w.size, 3);
    KT_EQ(w.local_size, 1);
    setenv("PET_NPROC_PER_NODE", "4", 1);
    w = detect_ok();
    KT_EQ(w.size, 3);
    /* under torchrun, torchrun's variables win */
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "12", 1);
    setenv("MASTER_ADDR", "job-node-0-0.job", 1);
    setenv("MASTER_PORT", "29500", 1);
    w = detect_ok();
    STR_EQ(w.source, "torchrun");
    KT_EQ(w.size, 12);
    /* torchrun's agents assemble before any worker starts: the workers keep Horovod's 30 s */
    KT_ASSERTF(w.start_timeout == 30.0, "start timeout %g", w.start_timeout);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    /* malformed or incomplete: an error naming the variable */
    setenv("PET_NNODES", "1:4", 1);
    expect_invalid("PET_NNODES=1:4 is an elastic range");
    setenv("PET_NNODES", "4:1", 1);
    expect_invalid("PET_NNODES='4:1'");
    setenv("PET_NNODES", "two", 1);
    expect_invalid("PET_NNODES='two'");
    setenv("PET_NNODES", "3", 1);
    setenv("PET_NODE_RANK", "3", 1);
    expect_invalid("PET_NODE_RANK=3 is not below PET_NNODES=3");
    setenv("PET_NODE_RANK", "1", 1);
    setenv("PET_MASTER_PORT", "http", 1);
    expect_invalid("PET_MASTER_PORT='http'");
    unsetenv("PET_MASTER_PORT");
    expect_invalid("PET_MASTER_PORT is not");
    setenv("KOLO_RENDEZVOUS", "10.0.0.5:7000", 1);
    w = detect_ok();
    STR_EQ(w.rdv_host, "10.0.0.5");
    KT_EQ(w.rdv_port, 7000);
    unsetenv("KOLO_RENDEZVOUS");
    /* one of the pair alone is somebody else's variable */
    unsetenv("PET_NNODES");
    w = detect_ok();
    STR_EQ(w.source, "none");
}

/* torchrun's agent holds MASTER_PORT: kolo's store must come up beside it. */
KT_TEST(env_torchrun_does_not_bind_master_port, 20)
{
    for (int attempt = 0;; attempt++) {
        int agent = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        KT_ASSERT(bind(agent, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(agent, 8) == 0);
        socklen_t al = sizeof(a);
        getsockname(agent, (struct sockaddr *)&a, &al);
        int mport = ntohs(a.sin_port);
        char ps[16];
        snprintf(ps, sizeof(ps), "%d", mport);
        clear_env();
        static const char *const v[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2",
                                        "MASTER_ADDR=127.0.0.1", NULL};
        set_vars(v);
        setenv("MASTER_PORT", ps, 1);
        kolo__world_info w = detect_ok();
        KT_ASSERT(w.rdv_port != mport);
        kolo__store_server *srv = NULL;
        int s = kolo__store_server_start(&srv, NULL, w.rdv_port, w.secret, w.secret_len);
        if (s == KOLO_ERR_SYSTEM && attempt < 5) { /* MASTER_PORT+1 happened to be in use here */
            close(agent);
            continue;
        }
        KT_OK(s);
        kolo__store *c;
        KT_OK(kolo__store_connect(&c, w.rdv_host, w.rdv_port, w.secret, w.secret_len, 5));
        KT_OK(kolo__store_set(c, "k", "v", 1));
        kolo__store_close(c);
        kolo__store_server_stop(srv);
        close(agent);
        break;
    }
}

KT_TEST(env_openmpi, 10)
{
    clear_env();
    static const char *const v[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4",
                                    "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                                    "OMPI_COMM_WORLD_NODE_RANK=7", "OMPI_UNIVERSE_SIZE=8",
                                    "OMPI_MCA_ess_base_jobid=3141", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "openmpi");
    KT_EQ(w.rank, 1);
    KT_EQ(w.local_size, 4);
    KT_EQ(w.cross_rank, -1);
    STR_EQ(w.job_id, "openmpi-3141");
    STR_EQ(w.rdv_host, "127.0.0.1");
    KT_EQ(w.rdv_port, kolo__env_port_from("openmpi-3141"));
    KT_EQ(w.rdv_serve, 1);

    /* Open MPI 5 names the job through PMIx */
    unsetenv("OMPI_MCA_ess_base_jobid");
    setenv("PMIX_NAMESPACE", "prterun-box-4242@1", 1);
    w = detect_ok();
    STR_EQ(w.job_id, "openmpi-prterun-box-4242@1");

    /* several hosts */
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    expect_invalid("KOLO_RENDEZVOUS");
    setenv("KOLO_RENDEZVOUS", "head:29400", 1);
    w = detect_ok();
    STR_EQ(w.rdv_host, "head");
    KT_EQ(w.rdv_port, 29400);
    KT_EQ(w.rdv_serve, 1);
    unsetenv("KOLO_RENDEZVOUS");

    /* mpirun inside a Slurm step whose tasks are these very ranks: Slurm's address */
    static const char *const sl[] = {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_JOB_ID=55", "SLURM_STEP_ID=2",
                                     "SLURM_STEP_NODELIST=cn[07-08]", NULL};
    set_vars(sl);
    w = detect_ok();
    STR_EQ(w.source, "openmpi");
    STR_EQ(w.rdv_host, "cn07");
    KT_EQ(w.rdv_port, kolo__env_port_from("slurm-55.2"));
    /* ... but not a Slurm view of another world (orted's step: one task per node) */
    setenv("SLURM_NTASKS", "2", 1);
    expect_invalid("KOLO_RENDEZVOUS");
}

/* Without a launcher job id, every rank of one mpirun on one host derives the same port
 * from its parent's pid. */
KT_TEST(env_mpi_same_host_fallback, 10)
{
    clear_env();
    static const char *const v[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    set_vars(v);
    int fds[2];
    KT_ASSERT(pipe(fds) == 0);
    fflush(stderr);
    for (int r = 0; r < 2; r++) {
        if (fork() == 0) {
            char rs[16];
            snprintf(rs, sizeof(rs), "%d", r);
            setenv("OMPI_COMM_WORLD_RANK", rs, 1);
            setenv("OMPI_COMM_WORLD_LOCAL_RANK", rs, 1);
            kolo__world_info w;
            int port = kolo__env_detect(&w) == KOLO_OK && strstr(w.job_id, "ppid") ? w.rdv_port : -1;
            ssize_t n = write(fds[1], &port, sizeof(port));
            _exit(n == sizeof(port) ? 0 : 1);
        }
    }
    int p[2];
    for (int r = 0; r < 2; r++) KT_EQ(read(fds[0], &p[r], sizeof(int)), sizeof(int));
    for (int r = 0; r < 2; r++) wait(NULL);
    KT_ASSERT(p[0] >= 20000 && p[0] <= 32767);
    KT_EQ(p[0], p[1]);
}

KT_TEST(env_pmi_and_pmix, 10)
{
    clear_env();
    static const char *const v[] = {"PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=3",
                                    "PMI_FD=5", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "pmi");
    KT_EQ(w.rank, 2);
    KT_EQ(w.local_rank, 2);
    KT_EQ(w.local_size, 3);
    STR_EQ(w.rdv_host, "127.0.0.1");
    KT_EQ(w.rdv_serve, 1);

    /* Cray PMI names the local variables differently */
    clear_env();
    static const char *const cray[] = {"PMI_RANK=0", "PMI_SIZE=4", "PMI_LOCAL_RANK=0", "PMI_LOCAL_SIZE=2", NULL};
    set_vars(cray);
    expect_invalid("KOLO_RENDEZVOUS"); /* 2 hosts, nothing to find rank 0 with */
    setenv("KOLO_RENDEZVOUS", "nid001:9000", 1);
    w = detect_ok();
    KT_EQ(w.local_size, 2);
    STR_EQ(w.rdv_host, "nid001");

    /* PMIx alone gives no size */
    clear_env();
    setenv("PMIX_RANK", "1", 1);
    setenv("PMIX_NAMESPACE", "ns", 1);
    expect_invalid("PMIX_SIZE");
    setenv("PMI_SIZE", "2", 1);
    expect_invalid("KOLO_RENDEZVOUS");
    setenv("KOLO_RENDEZVOUS", "nid001:9000", 1);
    w = detect_ok();
    STR_EQ(w.source, "pmix");
    KT_EQ(w.size, 2);
    STR_EQ(w.job_id, "pmix-ns");
    unsetenv("KOLO_RENDEZVOUS");

    /* srun --mpi=pmix: Slurm describes the same task, and gives the address */
    unsetenv("PMI_SIZE");
    static const char *const sl[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_JOB_ID=8", "SLURM_STEP_ID=0",
                                     "SLURM_STEP_NODELIST=a[1-2]", NULL};
    set_vars(sl);
    w = detect_ok();
    STR_EQ(w.source, "slurm");
    STR_EQ(w.rdv_host, "a1");
    setenv("SLURM_PROCID", "0", 1); /* a stale batch-script value */
    expect_invalid("PMIX_RANK='1'");

    /* srun --mpi=pmix, whose server gave its address: rank 0's address goes through it (the
     * multi-host tests run it for real); one that answers nothing is named, with the remedy */
    setenv("SLURM_PROCID", "1", 1);
    setenv("PMIX_SERVER_URI4", "pmix-server.1;tcp4://127.0.0.1:1", 1);
    setenv("PMIX_SERVER_URI41", "pmix-server.1;tcp4://127.0.0.1:1", 1);
    if (kolo__pmix_built() && kolo__pmix_loadable()) {
        KT_STATUS(kolo__env_detect(&w), KOLO_ERR_STARTUP);
        KT_CONTAINS(kolo_last_error(), "slurm: rank 0's address could not be exchanged through Slurm's PMIx server "
                                       "(PMIx_Init: ");
        KT_CONTAINS(kolo_last_error(), "set KOLO_RENDEZVOUS=host:port to a free port on a1 in every rank's environment");
    } else {
        w = detect_ok(); /* no libpmix: the node list's first host, as before */
        STR_EQ(w.rdv_host, "a1");
    }
}

/* ---- PMI-1 (MPICH's Hydra) against a scripted server ---- */

/* One request the fake server expects (its beginning) and its answer line; answer NULL: the
 * server reads the request and then goes silent; "<hangup>": it closes the connection. */
typedef struct pmi_step {
    const char *expect, *answer;
} pmi_step;

typedef struct pmi_outcome {
    int status;       /* kolo__env_detect's */
    char text[1024];  /* the error, or "<rdv_host>:<rdv_port> <job_id>" */
    int served;       /* steps the server answered */
    bool finalized;   /* the client said "cmd=finalize" before it exited */
} pmi_outcome;

/* Runs kolo__env_detect in a child whose PMI_FD is one end of a socket pair, with the extra
 * variables env, while this process serves steps on the other end; then reads, until the child
 * exits, whether it finalized. */
static pmi_outcome pmi_run(const char *const *env, const pmi_step *steps, int nsteps)
{
    int sv[2], res[2];
    KT_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && pipe(res) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    KT_ASSERT(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        close(res[0]);
        clear_env();
        char fd[16];
        snprintf(fd, sizeof(fd), "%d", sv[1]);
        setenv("PMI_FD", fd, 1);
        set_vars(env);
        pmi_outcome o;
        memset(&o, 0, sizeof(o));
        kolo__world_info w;
        o.status = kolo__env_detect(&w);
        if (o.status == KOLO_OK) snprintf(o.text, sizeof(o.text), "%s:%d %s", w.rdv_host, w.rdv_port, w.job_id);
        else snprintf(o.text, sizeof(o.text), "%s", kolo_last_error());
        ssize_t n = write(res[1], &o, sizeof(o));
        exit(n == sizeof(o) ? 0 : 1); /* exit, not _exit: the PMI goodbye is an exit handler */
    }
    close(sv[1]);
    close(res[1]);
    pmi_outcome o;
    memset(&o, 0, sizeof(o));
    char line[1100];
    size_t n = 0;
    int step = 0;
    bool silent = false;
    char c;
    while (read(sv[0], &c, 1) == 1) {
        if (c != '\n') {
            if (n + 1 < sizeof(line)) line[n++] = c;
            continue;
        }
        line[n] = '\0';
        n = 0;
        if (strcmp(line, "cmd=finalize") == 0) {
            o.finalized = true;
            KT_ASSERT(write(sv[0], "cmd=finalize_ack\n", 17) == 17);
            continue;
        }
        if (silent) continue;
        KT_ASSERTF(step < nsteps && strncmp(line, steps[step].expect, strlen(steps[step].expect)) == 0,
                   "request %d was '%s', expected '%s...'", step, line, step < nsteps ? steps[step].expect : "none");
        if (!steps[step].answer) {
            silent = true;
            continue;
        }
        if (strcmp(steps[step].answer, "<hangup>") == 0) {
            shutdown(sv[0], SHUT_RDWR);
            break;
        }
        char ans[1100];
        int len = snprintf(ans, sizeof(ans), "%s\n", steps[step].answer);
        KT_ASSERT(write(sv[0], ans, (size_t)len) == len);
        o.served = ++step;
    }
    pmi_outcome got;
    KT_EQ(read(res[0], &got, sizeof(got)), sizeof(got));
    int st;
    waitpid(pid, &st, 0);
    KT_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(sv[0]);
    close(res[0]);
    got.served = o.served;
    got.finalized = o.finalized;
    return got;
}

#define PMI_INIT {"cmd=init pmi_version=1 pmi_subversion=1", "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"}
#define PMI_KVS {"cmd=get_my_kvsname", "cmd=my_kvsname kvsname=kvs_42_0"}

KT_TEST(env_pmi_rank_0_address_across_hosts, 20)
{
    /* rank 1 of 2, one rank per host: the job is named by the kvs, rank 0's address comes from
     * the get after the barrier, and the process says goodbye as it exits */
    static const char *const r1[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1", NULL};
    static const pmi_step ok[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", "cmd=barrier_out"},
                                  {"cmd=get kvsname=kvs_42_0 key=kolo.rdv.0", "cmd=get_result rc=0 msg=success value=10.1.2.3:4567"}};
    pmi_outcome o = pmi_run(r1, ok, 4);
    KT_ASSERTF(o.status == KOLO_OK, "%s", o.text);
    STR_EQ(o.text, "10.1.2.3:4567 pmi-kvs_42_0");
    KT_EQ(o.served, 4);
    KT_ASSERT(o.finalized);

    /* rank 0 publishes an address of its own and a port, then reads it back */
    static const char *const r0[] = {"PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1",
                                     "KOLO_IFACE=lo", NULL};
    static const pmi_step zero[] = {PMI_INIT, PMI_KVS, {"cmd=put kvsname=kvs_42_0 key=kolo.rdv.0 value=127.0.0.1:", "cmd=put_result rc=0 msg=success"},
                                    {"cmd=barrier_in", "cmd=barrier_out"},
                                    {"cmd=get kvsname=kvs_42_0 key=kolo.rdv.0", "cmd=get_result rc=0 value=127.0.0.1:29999"}};
    o = pmi_run(r0, zero, 5);
    KT_ASSERTF(o.status == KOLO_OK, "%s", o.text);
    STR_EQ(o.text, "127.0.0.1:29999 pmi-kvs_42_0");
    KT_ASSERT(o.finalized);

    /* rank 0 with nothing to publish: "-" tells the others at once; it names its reason */
    static const char *const bad0[] = {"PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1",
                                       "KOLO_IFACE=nope0", NULL};
    static const pmi_step dash[] = {PMI_INIT, PMI_KVS, {"cmd=put kvsname=kvs_42_0 key=kolo.rdv.0 value=-", "cmd=put_result rc=0"},
                                    {"cmd=barrier_in", "cmd=barrier_out"}, {"cmd=barrier_in", "cmd=barrier_out"}};
    o = pmi_run(bad0, dash, 5);
    KT_EQ(o.status, KOLO_ERR_INVALID_ARG);
    /* the second barrier: no rank leaves (ending the job under mpirun) before every rank said why */
    KT_EQ(o.served, 5);
    KT_CONTAINS(o.text, "pmi: 2 ranks on several hosts, and rank 0's address could not be exchanged through the "
                        "launcher's PMI (rank 0 found no IPv4 address to publish through PMI (KOLO_IFACE='nope0')): "
                        "set KOLO_RENDEZVOUS=host:port");
    KT_CONTAINS(o.text, "(e.g. mpirun -genv KOLO_RENDEZVOUS node1:29400 ...)");
    static const pmi_step got_dash[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", "cmd=barrier_out"},
                                        {"cmd=get ", "cmd=get_result rc=0 value=-"},
                                        {"cmd=barrier_in", "cmd=barrier_out"}};
    o = pmi_run(r1, got_dash, 5);
    KT_CONTAINS(o.text, "(rank 0 published no address through PMI (see rank 0's error))");
    KT_EQ(o.served, 5);
    /* a second barrier that fails leaves the reason as it was */
    static const pmi_step got_dash_hangup[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", "cmd=barrier_out"},
                                               {"cmd=get ", "cmd=get_result rc=0 value=-"},
                                               {"cmd=barrier_in", "<hangup>"}};
    o = pmi_run(r1, got_dash_hangup, 5);
    KT_CONTAINS(o.text, "(rank 0 published no address through PMI (see rank 0's error))");

    /* on one host the connection is not touched: no goodbye owed */
    static const char *const local[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", NULL};
    o = pmi_run(local, NULL, 0);
    KT_ASSERTF(o.status == KOLO_OK && strncmp(o.text, "127.0.0.1:", 10) == 0, "%s", o.text);
    KT_ASSERT(!o.finalized);
}

/* PMI counts whole seconds: a start time-out of half a second is 1 there, not 0 (truncated, every
 * answer had to be there before it was asked for). */
KT_TEST(env_pmi_start_timeout_under_a_second, 20)
{
    static const char *const r1[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1",
                                     "KOLO_START_TIMEOUT=0.5", NULL};
    static const pmi_step ok[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", "cmd=barrier_out"},
                                  {"cmd=get kvsname=kvs_42_0 key=kolo.rdv.0", "cmd=get_result rc=0 msg=success value=10.1.2.3:4567"}};
    pmi_outcome o = pmi_run(r1, ok, 4);
    KT_ASSERTF(o.status == KOLO_OK, "%s", o.text);
    KT_CONTAINS(o.text, "10.1.2.3:4567 ");
    static const pmi_step stuck[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", NULL}};
    o = pmi_run(r1, stuck, 3);
    KT_CONTAINS(o.text, "no answer to barrier_in within 1 s (not every rank reached kolo_init)");
}

KT_TEST(env_pmi_server_faults_are_named, 30)
{
    static const char *const r1[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1",
                                     "KOLO_START_TIMEOUT=1", NULL};
    /* a stranger's protocol */
    static const pmi_step garbled[] = {{"cmd=init", "HTTP/1.1 400 Bad Request"}};
    pmi_outcome o = pmi_run(r1, garbled, 1);
    KT_EQ(o.status, KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(o.text, "the launcher's PMI (PMI (PMI_FD=");
    KT_CONTAINS(o.text, "): the process manager answered 'HTTP/1.1 400 Bad Request' to init (expected "
                        "cmd=response_to_init))");
    KT_ASSERT(o.finalized);
    /* an error the server reports */
    static const pmi_step refused[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", "cmd=barrier_out"},
                                       {"cmd=get ", "cmd=get_result rc=-1 msg=key_kolo.rdv.0_not_found value=unknown"}};
    o = pmi_run(r1, refused, 4);
    KT_CONTAINS(o.text, "get failed: rc=-1 key_kolo.rdv.0_not_found");
    /* a rank that never comes: the barrier is not answered within the start time-out */
    static const pmi_step stuck[] = {PMI_INIT, PMI_KVS, {"cmd=barrier_in", NULL}};
    double t0 = kt_now();
    o = pmi_run(r1, stuck, 3);
    KT_CONTAINS(o.text, "no answer to barrier_in within 1 s (not every rank reached kolo_init)");
    KT_ASSERT(kt_now() - t0 < 15);
    /* an answer without what it should carry */
    static const pmi_step nokvs[] = {PMI_INIT, {"cmd=get_my_kvsname", "cmd=my_kvsname"}};
    o = pmi_run(r1, nokvs, 2);
    KT_CONTAINS(o.text, "the answer 'cmd=my_kvsname' names no kvsname");
    /* the server hangs up */
    static const pmi_step gone[] = {PMI_INIT, {"cmd=get_my_kvsname", "<hangup>"}};
    o = pmi_run(r1, gone, 2);
    KT_CONTAINS(o.text, "the process manager closed the connection while kolo waited for the answer to get_my_kvsname");
    KT_ASSERT(!o.finalized);
    /* no descriptor behind PMI_FD */
    clear_env();
    static const char *const nofd[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1",
                                       "PMI_FD=987", NULL};
    set_vars(nofd);
    expect_invalid("(environment variable PMI_FD='987' is not an open descriptor)");
}

KT_TEST(env_slurm, 10)
{
    clear_env();
    static const char *const v[] = {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=2",
                                    "SLURM_STEP_NUM_NODES=4", "SLURM_NNODES=6",
                                    "SLURM_STEP_NODELIST=gpu[03-05,09],cpu1", "SLURM_JOB_NODELIST=gpu[01-09]",
                                    "SLURM_JOB_ID=777", "SLURM_STEP_ID=0", "SLURM_STEP_TASKS_PER_NODE=2(x4)",
                                    "SLURM_TASKS_PER_NODE=4(x2)", NULL};
    set_vars(v);
    kolo__world_info w = detect_ok();
    STR_EQ(w.source, "slurm");
    KT_EQ(w.rank, 5);
    KT_EQ(w.size, 8);
    KT_EQ(w.local_rank, 1);
    KT_EQ(w.local_size, 2);
    KT_EQ(w.cross_rank, 2);
    KT_EQ(w.cross_size, 4);
    STR_EQ(w.rdv_host, "gpu03");
    KT_EQ(w.rdv_port, kolo__env_port_from("slurm-777.0"));
    KT_ASSERT(w.rdv_port >= 20000 && w.rdv_port <= 32767);
    KT_EQ(w.rdv_serve, 1);
    STR_EQ(w.job_id, "slurm-777.0");
    KT_ASSERT(w.secret_derived);

    /* the next step of the same job: another port and id */
    setenv("SLURM_STEP_ID", "1", 1);
    kolo__world_info w1 = detect_ok();
    KT_ASSERT(w1.rdv_port != w.rdv_port);
    KT_ASSERT(strcmp(w1.job_id, w.job_id) != 0);

    /* job-level lists when the step's are missing */
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    unsetenv("SLURM_STEP_NUM_NODES");
    setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_NODEID", "3", 1);
    setenv("SLURM_LOCALID", "0", 1);
    w = detect_ok();
    STR_EQ(w.rdv_host, "gpu01");
    KT_EQ(w.local_size, 1);
    KT_EQ(w.cross_size, 6);
    setenv("SLURM_TASKS_PER_NODE", "2(x3,1", 1);
    expect_invalid("SLURM_TASKS_PER_NODE='2(x3,1'");
    unsetenv("SLURM_TASKS_PER_NODE");
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    w = detect_ok();
    KT_EQ(w.local_size, 2);
    unsetenv("SLURM_NTASKS_PER_NODE");
    w = detect_ok();
    KT_EQ(w.local_size, -1);

    /* KOLO_RENDEZVOUS overrides the node list */
    setenv("KOLO_RENDEZVOUS", "login1:4000", 1);
    w = detect_ok();
    STR_EQ(w.rdv_host, "login1");
    KT_EQ(w.rdv_port, 4000);
    KT_EQ(w.rdv_serve, 1);
    unsetenv("KOLO_RENDEZVOUS");

    unsetenv("SLURM_JOB_NODELIST");
    expect_invalid("NODELIST");
}

static bool join_host(const char *host, void *arg)
{
    char *all = arg;
    size_t n = strlen(all);
    snprintf(all + n, 256 - n, "%s%s", n ? " " : "", host);
    return true;
}

static bool count_host(const char *host, void *arg)
{
    (void)host, (void)arg;
    return true;
}

KT_TEST(env_slurm_hostlist, 10)
{
    static const struct {
        const char *in, *first;
    } good[] = {
        {"node[01-04,07]", "node01"}, {"gpu[3-5],cpu1", "gpu3"}, {"a-b[1-2]", "a-b1"}, {"host1", "host1"},
        {"h1,h2,h3", "h1"}, {"rack[1-2]-n[08-09]", "rack1-n08"}, {"n[007]", "n007"}, {"n[7,1-3]", "n7"},
        {"x.example.com", "x.example.com"}, {"cn[0010-0012]", "cn0010"}, {"a[1-2],b[3-4]", "a1"},
        {"node-[1-3].dom", "node-1.dom"},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(good); i++) {
        char out[64] = "";
        KT_ASSERTF(kolo__slurm_first_host(good[i].in, out, sizeof(out)), "'%s' rejected", good[i].in);
        KT_ASSERTF(strcmp(out, good[i].first) == 0, "'%s' -> '%s', expected '%s'", good[i].in, out, good[i].first);
    }
    static const char *const bad[] = {"", "node[", "node[1-", "node[2-1]", "node[a]", "node]", ",node", "node,",
                                      "node[1-2", "no de", "node[]", "(null)", "n[1-2]]", "n[[1]]", "n[1,]",
                                      "n[-1]", "a,,b", "n[1-2],x["};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++) {
        char out[64];
        KT_ASSERTF(!kolo__slurm_first_host(bad[i], out, sizeof(out)), "'%s' accepted", bad[i]);
    }
    /* every host, in Slurm's order */
    static const struct {
        const char *in, *all;
    } full[] = {
        {"node[01-03,07],gpu5", "node01 node02 node03 node07 gpu5"},
        {"rack[1-2]-n[08-09]", "rack1-n08 rack1-n09 rack2-n08 rack2-n09"},
        {"n[9-11]", "n9 n10 n11"}, {"cn[098-101]", "cn098 cn099 cn100 cn101"}, {"10.77.0.[1-2]", "10.77.0.1 10.77.0.2"},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(full); i++) {
        char all[256] = "";
        KT_EQ(kolo__slurm_hosts(full[i].in, join_host, all), (long)kt_count(full[i].all, " ") + 1);
        KT_ASSERTF(strcmp(all, full[i].all) == 0, "'%s' -> '%s', expected '%s'", full[i].in, all, full[i].all);
    }
    char none[256] = "";
    KT_EQ(kolo__slurm_hosts("a,b[1-2],c[", join_host, none), -1); /* malformed: nothing given out */
    KT_EQ(none[0], '\0');
    KT_EQ(kolo__slurm_hosts("n[0-999999],m[0-99999]", count_host, NULL), -1); /* over a million */
    char small[5];
    KT_ASSERT(!kolo__slurm_first_host("node1", small, sizeof(small)));
    KT_ASSERT(kolo__slurm_first_host("nod1", small, sizeof(small)));
    KT_ASSERT(!kolo__slurm_first_host("n[00001]", small, sizeof(small)));
}

KT_TEST(env_slurm_tasks_per_node, 10)
{
    static const struct {
        const char *in;
        int node, count;
    } good[] = {
        {"2(x3),1", 0, 2}, {"2(x3),1", 2, 2}, {"2(x3),1", 3, 1}, {"4", 0, 4}, {"1,2,3", 2, 3},
        {"8(x2),4(x2)", 3, 4}, {"1(x1)", 0, 1},
    };
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(good); i++) {
        int c = -7;
        KT_ASSERTF(kolo__slurm_tasks_on_node(good[i].in, good[i].node, &c), "'%s' node %d rejected", good[i].in,
                   good[i].node);
        KT_ASSERTF(c == good[i].count, "'%s' node %d -> %d, expected %d", good[i].in, good[i].node, c, good[i].count);
    }
    int c;
    KT_ASSERT(!kolo__slurm_tasks_on_node("2(x3),1", 4, &c)); /* no such node */
    KT_ASSERT(!kolo__slurm_tasks_on_node("4", 1, &c));
    KT_ASSERT(!kolo__slurm_tasks_on_node("4", -1, &c));
    static const char *const bad[] = {"", "2(x)", "2(3)", "(x2)", "2(x3", "2,,1", "a", "0", "2(x0)", "2(x3)1",
                                      "2,", "-1", "2(y3)"};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++)
        KT_ASSERTF(!kolo__slurm_tasks_on_node(bad[i], 0, &c), "'%s' accepted", bad[i]);
}

KT_TEST(env_parse_hostport, 10)
{
    char h[64];
    int p = 0;
    KT_ASSERT(kolo__parse_hostport("h:1", h, sizeof(h), &p));
    STR_EQ(h, "h");
    KT_EQ(p, 1);
    KT_ASSERT(kolo__parse_hostport("[::1]:29400", h, sizeof(h), &p));
    STR_EQ(h, "::1");
    KT_EQ(p, 29400);
    KT_ASSERT(kolo__parse_hostport("node-1.cluster.local:65535", h, sizeof(h), &p));
    STR_EQ(h, "node-1.cluster.local");
    KT_EQ(p, 65535);
    static const char *const bad[] = {"::1:80", "h:0", "h:65536", "h:", ":80", "h:80x", "h", "[::1]80", "[::1]",
                                      "[]:80", "h:-1", "h: 80", "", "a b:80", "[::1:80"};
    for (size_t i = 0; i < KOLO_ARRAY_SIZE(bad); i++)
        KT_ASSERTF(!kolo__parse_hostport(bad[i], h, sizeof(h), &p), "'%s' accepted", bad[i]);
    char tiny[4];
    KT_ASSERT(!kolo__parse_hostport("host:80", tiny, sizeof(tiny), &p));
    KT_ASSERT(kolo__parse_hostport("hos:80", tiny, sizeof(tiny), &p));
}

KT_TEST(env_secret_and_job_id, 10)
{
    clear_env();
    static const char *const v[] = {"KOLO_RANK=0", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=h:1", NULL};
    set_vars(v);
    setenv("KOLO_JOB_ID", "alpha", 1);
    kolo__world_info a = detect_ok();
    KT_EQ(a.secret_derived, 1);
    KT_EQ(a.secret_len, 64);
    kolo__world_info a2 = detect_ok();
    KT_ASSERT(memcmp(a.secret, a2.secret, 64) == 0);
    setenv("KOLO_JOB_ID", "beta", 1);
    kolo__world_info b = detect_ok();
    KT_ASSERT(memcmp(a.secret, b.secret, 64) != 0);

    /* ids unsafe for shared-memory names, or too long, are cleaned and hashed, still distinct */
    setenv("KOLO_JOB_ID", "a/b c", 1);
    kolo__world_info s1 = detect_ok();
    setenv("KOLO_JOB_ID", "a_b_c", 1);
    kolo__world_info s2 = detect_ok();
    KT_ASSERT(!strchr(s1.job_id, '/') && !strchr(s1.job_id, ' '));
    KT_ASSERT(strcmp(s1.job_id, s2.job_id) != 0);
    char longid[300];
    memset(longid, 'x', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = '\0';
    setenv("KOLO_JOB_ID", longid, 1);
    kolo__world_info l1 = detect_ok();
    KT_ASSERT(strlen(l1.job_id) < sizeof(l1.job_id));
    longid[250] = 'y';
    setenv("KOLO_JOB_ID", longid, 1);
    kolo__world_info l2 = detect_ok();
    KT_ASSERT(strcmp(l1.job_id, l2.job_id) != 0);

    /* an explicit secret is used as given */
    setenv("KOLO_SECRET", "0123456789abcdef", 1);
    kolo__world_info e = detect_ok();
    KT_EQ(e.secret_derived, 0);
    KT_EQ(e.secret_len, 16);
    KT_ASSERT(memcmp(e.secret, "0123456789abcdef", 16) == 0);
    char huge[400];
    memset(huge, 'k', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    setenv("KOLO_SECRET", huge, 1);
    expect_invalid("KOLO_SECRET");
}

KT_TEST(env_port_from, 10)
{
    KT_EQ(kolo__env_port_from("x"), kolo__env_port_from("x"));
    int lo = 70000, hi = 0, distinct = 0, prev = -1;
    for (int i = 0; i < 2000; i++) {
        char k[32];
        snprintf(k, sizeof(k), "slurm-%d.0", 100000 + i);
        int p = kolo__env_port_from(k);
        lo = KOLO_MIN(lo, p);
        hi = KOLO_MAX(hi, p);
        distinct += p != prev;
        prev = p;
    }
    KT_ASSERT(lo >= 20000 && hi <= 32767);
    KT_ASSERT(hi - lo > 12000); /* spread over the range */
    KT_ASSERT(distinct > 1990);
}

/* ---- KOLO_TCP_CONGESTION ---- */

/* The congestion control both ends of a fresh loopback connection end up with after kolo attaches
 * to them under KOLO_TCP_CONGESTION=setting (NULL: unset), having set its choice on the listener
 * and the connecting socket before the connection was made (as mesh.c does) when `early`, the
 * connection taken for one to another machine when `remote`; it must still carry a byte. *late:
 * the connections whose algorithm came after they were established (tcp.c). */
static void cc_after_attach(const char *setting, bool early, bool remote, char *out, size_t cap, uint64_t *late)
{
    if (setting) setenv("KOLO_TCP_CONGESTION", setting, 1);
    else unsetenv("KOLO_TCP_CONGESTION");
    uint64_t late0 = kolo__tcp_congestion_late();
    int ls = socket(AF_INET, SOCK_STREAM, 0), a = socket(AF_INET, SOCK_STREAM, 0);
    if (early) {
        kolo__tcp_congestion_early(ls, true);
        kolo__tcp_congestion_early(a, !remote);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    KT_ASSERT(bind(ls, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(ls, 1) == 0);
    KT_ASSERT(getsockname(ls, (struct sockaddr *)&sa, &sl) == 0);
    KT_ASSERT(connect(a, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    int b = accept(ls, NULL, NULL);
    KT_ASSERT(b >= 0);
    kolo__conn c = {.fd = a, .peer = 1}, d = {.fd = b, .peer = 0};
    kolo__tcp_test_remote(remote);
    KT_OK(kolo__tcp_attach(&c, false));
    KT_OK(kolo__tcp_attach(&d, false));
    kolo__tcp_test_remote(false);
    snprintf(out, cap, "%s", kolo__tcp_congestion(&c));
    KT_ASSERTF(strcmp(out, kolo__tcp_congestion(&d)) == 0, "the connecting end runs %s, the accepting end %s", out,
               kolo__tcp_congestion(&d));
    *late = kolo__tcp_congestion_late() - late0;
    /* within the host, unsent data queued in the kernel is bounded (tcp.c: TCP_LOCAL_UNSENT_MAX) */
    int unsent = 0;
    socklen_t ul = sizeof(unsent);
    KT_ASSERT(getsockopt(a, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &unsent, &ul) == 0);
    if (!remote) KT_ASSERTF(unsent > 0 && unsent <= (1 << 20), "TCP_NOTSENT_LOWAT %d on a loopback connection", unsent);
    KT_ASSERT(send(a, "k", 1, 0) == 1);
    char ch = 0;
    KT_ASSERT(recv(b, &ch, 1, 0) == 1 && ch == 'k');
    close(a);
    close(b);
    close(ls);
}

/* Over loopback, auto (the default) runs a loss-based algorithm whatever the system's default
 * (BBR there halves the speed of 1 MiB messages: tcp.c); system keeps the default; a name is
 * used; a name the kernel lacks leaves the default and the connection working. Under auto,
 * connections to another network namespace of this machine get cubic too (test_multihost checks
 * it); those to other machines keep the default, also when accepted by a listener that chose
 * cubic (mesh.c tells tcp.c which are which by boot id). Set before the connection is made, the
 * algorithm runs from its start (a later one would inherit BBR's pacing: tcp.c): no connection
 * counts as switched late, where attaching alone counts both ends (the system's default being
 * another than cubic or reno). */
KT_TEST(tcp_congestion_control_follows_the_setting, 10)
{
    char sys[32] = "", got[32];
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
    if (!f || !fgets(sys, sizeof(sys), f)) {
        printf("  skip: /proc/sys/net/ipv4/tcp_congestion_control unreadable\n");
        if (f) fclose(f);
        return;
    }
    fclose(f);
    sys[strcspn(sys, "\n")] = '\0';
    bool lossy = strcmp(sys, "cubic") == 0 || strcmp(sys, "reno") == 0;
    uint64_t late;
    cc_after_attach(NULL, true, false, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, "cubic") == 0 || strcmp(got, "reno") == 0, "default on loopback: %s (system: %s)", got, sys);
    KT_EQ(late, 0);
    cc_after_attach("auto", true, false, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, "cubic") == 0 || strcmp(got, "reno") == 0, "auto on loopback: %s (system: %s)", got, sys);
    KT_EQ(late, 0);
    cc_after_attach("auto", false, false, got, sizeof(got), &late); /* set only once established */
    KT_ASSERTF(strcmp(got, "cubic") == 0 || strcmp(got, "reno") == 0, "auto, attached: %s (system: %s)", got, sys);
    KT_EQ(late, lossy ? 0 : 2);
    cc_after_attach("auto", true, true, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, sys) == 0, "auto to another machine: %s, expected %s", got, sys);
    KT_EQ(late, 0);
    cc_after_attach("system", true, false, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, sys) == 0, "system: %s, expected %s", got, sys);
    KT_EQ(late, 0);
    cc_after_attach("reno", true, false, got, sizeof(got), &late); /* reno is built in and always allowed */
    KT_ASSERTF(strcmp(got, "reno") == 0, "reno: %s", got);
    KT_EQ(late, 0);
    cc_after_attach("reno", true, true, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, "reno") == 0, "reno to another machine: %s", got);
    KT_EQ(late, 0);
    cc_after_attach("no-such-algorithm", true, false, got, sizeof(got), &late);
    KT_ASSERTF(strcmp(got, sys) == 0, "an unknown name: %s, expected the default %s", got, sys);
    KT_EQ(late, 0);
    unsetenv("KOLO_TCP_CONGESTION");
}

/* A world over TCP (3 ranks: rank 1 both accepts and connects): every connection on every channel
 * runs the setting's algorithm ("reno", or auto's) from its start, none switched once established
 * (without mesh.c's early setting, every one would be where the system's default is another). */
static void cc_world(int rank, void *arg)
{
    const char *want = arg;
    KT_OK(kolo_init());
    for (int ch = 0; ch < KOLO_NCHANNELS; ch++) {
        kolo__mesh *m = kolo__W.mesh[ch];
        for (int q = 0; q < m->size; q++) {
            if (q == rank) continue;
            const char *got = kolo__tcp_congestion(m->conns[q]);
            KT_ASSERTF(strcmp(got, want) == 0 || (!strcmp(want, "cubic") && !strcmp(got, "reno")),
                       "rank %d, channel %d: the connection to rank %d runs %s, not %s", rank, ch, q, got, want);
        }
    }
    KT_EQ(kolo__tcp_congestion_late(), 0);
}

KT_TEST(tcp_congestion_control_from_the_start_in_a_world, 30)
{
    static char reno[] = "reno", cubic[] = "cubic";
    kt_job_opts o = {.env = {"KOLO_TCP_CONGESTION=reno"}, .tcp_only = 1};
    KT_EQ(kt_job(3, cc_world, reno, &o, NULL), 0);
    kt_job_opts a = {.env = {"KOLO_TCP_CONGESTION=auto"}, .tcp_only = 1};
    KT_EQ(kt_job(3, cc_world, cubic, &a, NULL), 0);
}
