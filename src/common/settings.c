/* settings.c - the one table of every KOLO_* setting, its Horovod aliases, default and meaning. */
#include "common.h"

#include <ctype.h>
#include <stdlib.h>

/* Order must follow enum kolo_setting in common.h. `kolorun --help-env` prints
 * this table, and docs/environment.md is written from it. */
static const kolo__setting_info table[KOLO_SET_COUNT] = {
    [KOLO_SET_LOG_LEVEL] = {"KOLO_LOG_LEVEL", "HOROVOD_LOG_LEVEL", "warning",
                            "trace, debug, info, warning, error or none; info prints the transport chosen per peer"},
    [KOLO_SET_LOG_TIME] = {"KOLO_LOG_TIME", "", "0",
                           "1: kolo's log lines start with the wall-clock time (kolorun --log-with-timestamp)"},
    [KOLO_SET_START_TIMEOUT] = {"KOLO_START_TIMEOUT", "HOROVOD_GLOO_TIMEOUT_SECONDS", "30",
                                "seconds kolo_init() waits without progress (no rank arriving at the rendezvous, no "
                                "connection made) before naming the ranks missing; unset, 600 for a Kubeflow "
                                "TrainJob's pods (PET_*), which start as nodes and images come"},
    [KOLO_SET_OP_TIMEOUT] = {"KOLO_OP_TIMEOUT", "", "300",
                             "seconds a collective waits for a silent (not dead) peer before failing; 0: never"},
    [KOLO_SET_TRANSPORT] = {"KOLO_TRANSPORT", "", "auto",
                            "auto (shared memory on one host, TCP between hosts) or tcp (TCP for every pair this "
                            "rank is in; set on all ranks, TCP everywhere)"},
    [KOLO_SET_IFACE] = {"KOLO_IFACE", "HOROVOD_GLOO_IFACE NCCL_SOCKET_IFNAME", "",
                        "network interfaces for TCP: 'eth0,eth1' to use, '^lo,docker' to avoid, '=eth0' exact; "
                        "default: the one that reaches the rendezvous host. Its IPv4 address, else a global IPv6 "
                        "one (a rendezvous host reached over IPv6 alone makes the job IPv6)"},
    [KOLO_SET_TCP_CONGESTION] = {"KOLO_TCP_CONGESTION", "", "auto",
                                 "TCP congestion control of kolo's connections, set before each connection is made "
                                 "(set later, it would keep the pacing BBR turns on)\n"
                                 "auto: connections that stay on this machine, over loopback or to another network "
                                 "namespace or container on it, use cubic, or reno where cubic is not allowed (BBR, "
                                 "the default on some systems, keeps them to about a megabyte in flight and halves "
                                 "their speed); connections to other machines keep the system's choice\n"
                                 "system: leave every connection alone\n"
                                 "or a name from /proc/sys/net/ipv4/tcp_allowed_congestion_control for every "
                                 "connection"},
    [KOLO_SET_TCP_KEEPALIVE] = {"KOLO_TCP_KEEPALIVE", "", "60",
                                "whole seconds a TCP connection may go without an answer from the peer's machine "
                                "before the peer is lost, its machine down or the network to it cut: keepalive probes "
                                "while the connection is idle, and bytes sent but not acknowledged, both of which a "
                                "live machine answers within a round trip even while its rank is stopped or busy "
                                "outside kolo (without them such a loss waited out KOLO_OP_TIMEOUT); 0: off"},
    [KOLO_SET_RENDEZVOUS] = {"KOLO_RENDEZVOUS", "", "",
                             "host:port of the rendezvous store (set by kolorun; under mpirun/srun rank 0 serves it)"},
    [KOLO_SET_RENDEZVOUS_SERVER] = {"KOLO_RENDEZVOUS_SERVER", "", "launcher",
                                    "who serves the store at KOLO_RENDEZVOUS for ranks that KOLO_RANK and KOLO_SIZE "
                                    "describe: launcher (kolorun does) or rank0 (rank 0 does, in its own process: "
                                    "for ranks started by hand or by another program, as kolo.spark does)"},
    [KOLO_SET_SECRET] = {"KOLO_SECRET", "", "",
                         "the job secret every connection must prove (set by kolorun; hex or text)"},
    [KOLO_SET_JOB_ID] = {"KOLO_JOB_ID", "", "",
                         "a name every rank of this job shares and no other job on these hosts uses (set by kolorun; "
                         "otherwise derived from the launcher's job ids)"},
    [KOLO_SET_HOSTNAME] = {"KOLO_HOSTNAME", "HOROVOD_HOSTNAME", "",
                           "the name this host reports in messages (default: gethostname)"},
    [KOLO_SET_SHM_CMA] = {"KOLO_SHM_CMA", "", "auto",
                          "how large messages between ranks of one host travel: copied through the shared ring "
                          "(ring copies; a sender whose copies crawl, because the reader's cache sits on another "
                          "CCD or socket, writes them around the cache), or single-copy, one rank reading or "
                          "writing the other's memory (process_vm_readv/writev)\n"
                          "0: ring copies only, and no collective reads or writes another rank's buffers; 0 on "
                          "either rank of a pair keeps the pair on ring copies\n"
                          "1: messages read single-copy from the sender's memory from 128 KiB; allreduces of "
                          "256 KiB and more always direct (below)\n"
                          "auto: from 32 KiB the receiver of each pair times both ways on the messages "
                          "themselves, per size class, and keeps the faster (ring copies win while two cores "
                          "share a cache, single-copy across CCDs or sockets and, on some CPUs, for messages of "
                          "256 KiB and more), except on a host with more ranks than cores, which keeps the ring\n"
                          "With 1 and auto, collectives take single-copy ways of their own:\n"
                          "- the messages the receiver keeps and nobody forwards (alltoall's, allgather's and "
                          "reducescatter's exchanges, and broadcasts of up to 1 MiB, 512 KiB on 4 ranks, on a "
                          "host with more ranks than cores, up to 16 MiB where its ranks are bound in blocks) go "
                          "single-copy from 32 KiB; with auto, 2 ranks on a host with no more ranks than cores "
                          "send their alltoalls and allgathers from 64 KiB by ring copies or single-copy as rank "
                          "0's timings of whole calls choose, and so do the allgathers and alltoalls of a world "
                          "of 3 or more ranks on a host with more ranks than cores\n"
                          "- broadcasts between 2 ranks from 64 KiB are split: the receiver reads half, the root "
                          "writes the other half into the receiver (process_vm_writev); with auto, below 2 MiB, "
                          "the root's timings of whole calls choose between that and both halves by ring copies\n"
                          "- single-copy allgathers from 1 MiB between 2 ranks (with auto up to 16 MiB, where the "
                          "calls' timings choose that over exchanging), from 128 KiB on a host with more ranks "
                          "than cores, are pushed, each rank writing its block into the others\n"
                          "- reducescatters from 256 KiB between 2 ranks, from 128 KiB on a host with more ranks "
                          "than cores, go direct, each rank reading its block of the others' inputs (with auto, "
                          "on a host with no more ranks than cores, where rank 0's timings of whole calls choose "
                          "that over the ring)\n"
                          "- allreduces of 256 KiB and more among ranks of one host go by the ring or direct, "
                          "each rank reading and writing the others' buffers (1: always direct; auto: as rank "
                          "0's timings of whole calls choose, starting direct or as the sizes next to it "
                          "settled, in place and out of place chosen apart; a host with more ranks than cores "
                          "chooses too, and goes direct from above KOLO_SMALL_ALLREDUCE_MAX to 256 KiB)\n"
                          "docs/performance.md has the measurements behind each rule"},
    [KOLO_SET_SHM_RING_SIZE] = {"KOLO_SHM_RING_SIZE", "", "2M",
                                "bytes of each shared-memory ring (one per direction per peer); unset, 1M on a host with "
                                "more ranks than cores, and on a host of more than 17 ranks halved (down to 64K) until "
                                "a rank's rings fit in 128M, and the host's in half of /dev/shm (64M in a container "
                                "unless made larger); a pair whose rings find no room there goes by TCP"},
    [KOLO_SET_SMALL_ALLREDUCE_MAX] = {"KOLO_SMALL_ALLREDUCE_MAX", "", "64K",
                                      "allreduces up to this many bytes use the latency-optimal algorithm (Adasum "
                                      "too, on at most 8 ranks), larger ones the ring (or, from 64K, when every "
                                      "rank of one host passes kolo_mem_alloc buffers, each rank reading and "
                                      "writing the others' directly); left unset, 2-rank allreduces out of place "
                                      "below 256K may run the one-round exchange too, as rank 0's timings choose "
                                      "(over TCP always); on 4 or more ranks spread over 2 or more hosts, "
                                      "allreduces from 32K go by recursive halving and doubling where the "
                                      "hierarchical allreduce does not run. Every rank follows rank 0's (set "
                                      "or not; a rank with another warns)"},
    [KOLO_SET_RING_CHUNK] = {"KOLO_RING_CHUNK", "", "128K",
                             "bytes per pipelined chunk in ring algorithms; every rank follows rank 0's (a rank "
                             "with another warns)"},
    [KOLO_SET_HIERARCHICAL_ALLREDUCE] = {"KOLO_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "auto",
                                         "1: allreduces of 256K and more (and above KOLO_SMALL_ALLREDUCE_MAX), on "
                                         "ranks spread over 2 or more hosts with the same number (2 or more) on "
                                         "each, run in three stages: reduce-scatter within each host, allreduce of "
                                         "each block among the ranks of the same local rank across the hosts, "
                                         "allgather within each host; the network then carries 2(h-1)/h of the "
                                         "buffer per host (h hosts) where the flat ring's link between two hosts "
                                         "carries 2(n-1)/n (n ranks): with 2 hosts of 8 ranks, about half. With 1, "
                                         "reducescatters of 256K and more in all too (within each host first, then "
                                         "across the hosts; not with auto)\n"
                                         "0: never (4 or more ranks then run recursive halving and doubling from "
                                         "32K, whose rounds between hosts carry the smallest parts)\n"
                                         "auto: as 1 from 1M (kolorun --hierarchical-allreduce sets 1; any rank's 0 "
                                         "turns it off for all)"},
    [KOLO_SET_HIERARCHICAL_ALLGATHER] = {"KOLO_HIERARCHICAL_ALLGATHER", "HOROVOD_HIERARCHICAL_ALLGATHER", "auto",
                                         "1: allgathers of 256K and more in all, on ranks spread as for "
                                         "KOLO_HIERARCHICAL_ALLREDUCE, exchange each rank's block with the ranks of "
                                         "the same local rank on the other hosts first, then the blocks gathered so "
                                         "within each host, so that each block crosses the network once per other "
                                         "host\n"
                                         "0: never\n"
                                         "auto: as 1 from 1M (kolorun --hierarchical-allgather sets 1; any rank's 0 "
                                         "turns it off for all)"},
    [KOLO_SET_STREAM_MIN] = {"KOLO_STREAM_MIN", "", "",
                             "rings of this many bytes or more (allreduce and the engine's fused allreduces; "
                             "reducescatter and allgather where they take the ring) write their results around the "
                             "cache (non-temporal stores), and allreduce's overlap their two phases; unset: 16M, or "
                             "an eighth of the last-level cache where that is more; every rank takes the smallest of "
                             "all ranks' values"},
    [KOLO_SET_SPIN_US] = {"KOLO_SPIN_US", "", "50",
                          "microseconds a waiting rank busy-polls before it starts yielding its core (0 when "
                          "more ranks than cores run on the machine, counted across network namespaces and "
                          "containers); unset, the engine's waits spin at most 10 and then "
                          "sleep until the peer moves, without yielding, while no thread waits for the engine; "
                          "once one has waited over 5 ms they sleep after the full spin (the world exchange "
                          "after 10)"},
    [KOLO_SET_BIND] = {"KOLO_BIND", "", "none",
                       "none (the process keeps the CPUs it was started with) or auto: where a host has more "
                       "ranks than the CPUs they may use, each rank binds itself and its threads at init to one "
                       "CPU, neighbouring local ranks together, as kolorun --bind-to auto does (for ranks that "
                       "mpirun, srun or torchrun start unbound); only if every rank of the host sets it, none is "
                       "bound already and all may use the same CPUs"},
    [KOLO_SET_FUSION_THRESHOLD] = {"KOLO_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "64M",
                                   "bytes of tensors fused into one collective; 0 disables fusion"},
    [KOLO_SET_CYCLE_TIME] = {"KOLO_CYCLE_TIME", "HOROVOD_CYCLE_TIME", "1",
                             "milliseconds between engine cycles while requests are pending (sooner when work "
                             "reaches an idle engine or a thread waits for a request)"},
    [KOLO_SET_CACHE_CAPACITY] = {"KOLO_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "1024",
                                 "negotiated tensor names remembered as a bit; 0 disables the cache"},
    [KOLO_SET_TIMELINE] = {"KOLO_TIMELINE", "HOROVOD_TIMELINE", "",
                           "path of a Chrome-trace timeline; each rank writes PATH (rank 0) or PATH.<rank>"},
    [KOLO_SET_TIMELINE_MARK_CYCLES] = {"KOLO_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", "0",
                                       "1: mark every engine cycle in the timeline"},
    [KOLO_SET_STALL_CHECK_DISABLE] = {"KOLO_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE", "0",
                                      "1: never warn about tensors some ranks have not submitted, nor about "
                                      "collectives waiting on ranks"},
    [KOLO_SET_STALL_CHECK_TIME] = {"KOLO_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS", "60",
                                   "seconds before a tensor submitted by some ranks only is reported, "
                                   "with the missing ranks, and before a collective (or the engine's "
                                   "exchange) that has made no progress names the ranks it waits for"},
    [KOLO_SET_STALL_SHUTDOWN_TIME] = {"KOLO_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0",
                                      "seconds after which a stall becomes an error on every rank; 0 never"},
    [KOLO_SET_STATUS_SIGNAL] = {"KOLO_STATUS_SIGNAL", "", "",
                                "USR1 or USR2: on that signal each rank writes its status (kolo_status_json: the "
                                "collective it is in, the ranks it waits for, the tensors some ranks have "
                                "submitted and others not) to stderr as one line; kolorun passes both signals to "
                                "its local workers. Unset: kolo leaves both signals alone"},
    [KOLO_SET_ELASTIC_TIMEOUT] = {"KOLO_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT", "600",
                                  "elastic jobs: seconds a worker waits for kolorun to form the next round, and "
                                  "(kolorun --elastic-timeout) kolorun waits for --min-np slots"},
    [KOLO_SET_AUTOTUNE] = {"KOLO_AUTOTUNE", "HOROVOD_AUTOTUNE", "0",
                           "1: rank 0 tunes the fusion threshold and the cycle time while the job runs (those not "
                           "set by the user), scoring each by the engine's bytes per second over a few steps, "
                           "and keeps the best (docs/engine.md, Autotune)"},
    [KOLO_SET_AUTOTUNE_LOG] = {"KOLO_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", "",
                               "CSV file rank 0 writes with every autotune sample and the chosen values"},
    [KOLO_SET_AUTOTUNE_WARMUP_SAMPLES] = {"KOLO_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3",
                                          "autotune: samples at the start values not scored"},
    [KOLO_SET_AUTOTUNE_STEPS_PER_SAMPLE] = {"KOLO_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
                                            "10", "autotune: training steps (a tensor name's repeats) per sample"},
    [KOLO_SET_AUTOTUNE_BAYES_OPT_MAX_SAMPLES] = {"KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                                                 "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20",
                                                 "autotune: configurations scored before the best is kept (1-64)"},
    [KOLO_SET_AUTOTUNE_GAUSSIAN_PROCESS_NOISE] = {"KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
                                                  "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8",
                                                  "autotune: the Gaussian process's noise, as a share of the "
                                                  "scores' variance (more: trusts single samples less)"},
};

const kolo__setting_info *kolo__setting_table(size_t *n)
{
    *n = KOLO_SET_COUNT;
    return table;
}

const char *kolo__setting_str(kolo_setting_t s)
{
    const kolo__setting_info *info = &table[s];
    const char *v = getenv(info->name);
    if (v) return v;
    const char *a = info->aliases;
    while (*a) {
        char name[64];
        size_t n = strcspn(a, " ");
        if (n < sizeof(name)) {
            memcpy(name, a, n);
            name[n] = '\0';
            v = getenv(name);
            if (v) return v;
        }
        a += n;
        while (*a == ' ') a++;
    }
    return info->def;
}

bool kolo__setting_is_set(kolo_setting_t s)
{
    return kolo__setting_str(s) != table[s].def;
}

long kolo__setting_long(kolo_setting_t s)
{
    const char *v = kolo__setting_str(s);
    char *end;
    errno = 0;
    long r = strtol(v, &end, 10);
    if (errno || end == v || *end) {
        long d = strtol(table[s].def, NULL, 10);
        KOLO_WARN("%s='%s' is not an integer; using %ld", table[s].name, v, d);
        return d;
    }
    return r;
}

double kolo__setting_double(kolo_setting_t s)
{
    const char *v = kolo__setting_str(s);
    char *end;
    errno = 0;
    double r = strtod(v, &end);
    if (errno || end == v || *end) {
        double d = strtod(table[s].def, NULL);
        KOLO_WARN("%s='%s' is not a number; using %g", table[s].name, v, d);
        return d;
    }
    return r;
}

bool kolo__parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    if (!s || !isdigit((unsigned char)*s)) return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b') end++; /* "64MiB", "64MB" */
    if (*end == 'B') end++;
    if (*end) return false;
    if (mul > 1 && v > (unsigned long long)SIZE_MAX / mul) return false;
    *out = (size_t)(v * mul);
    return true;
}

int kolo__setting_auto01(kolo_setting_t s, int *out)
{
    const char *v = kolo__setting_str(s);
    if (!*v || strcmp(v, "auto") == 0) *out = KOLO_SETTING_AUTO;
    else if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) *out = v[0] == '1' ? KOLO_SETTING_ON : KOLO_SETTING_OFF;
    else return kolo__err(KOLO_ERR_INVALID_ARG, "%s='%s' is not one of auto, 0, 1", table[s].name, v);
    return KOLO_OK;
}

size_t kolo__setting_bytes(kolo_setting_t s)
{
    const char *v = kolo__setting_str(s);
    size_t r;
    if (kolo__parse_bytes(v, &r)) return r;
    size_t d = 0;
    kolo__parse_bytes(table[s].def, &d);
    KOLO_WARN("%s='%s' is not a byte size (e.g. 65536, 64K, 64M); using %zu", table[s].name, v, d);
    return d;
}
