/* fds.c - room for the file descriptors a job holds.
 *
 * A rank keeps KOLO_NCHANNELS connections to every other rank for the job's life (shared-memory
 * pairs too: their socket carries the peer's liveness and the handshake), rank 0 serving the
 * rendezvous one more per rank while the job assembles, and kolorun two pipes per worker and a
 * store connection per rank. A job of about 500 ranks outgrows the soft limit of 1024 open files
 * most Linux systems set (`ulimit -n`); without this, that surfaced as "socket(): Too many open
 * files" on some ranks halfway through start-up. So before opening them a process raises its
 * soft limit where the hard limit allows (the soft 1024 exists for select(), which kolo never
 * calls: it polls), and otherwise fails at once, saying how many it needs and how to raise the
 * limit. The limit is raised by what kolo needs, so the program keeps the room it had. */
#include "common.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* Descriptors open in this process now (the directory's own not counted); 0 without /proc. */
static size_t open_now(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n ? n - 1 : 0;
}

static void limit_text(rlim_t v, char *out, size_t cap)
{
    if (v == RLIM_INFINITY) snprintf(out, cap, "unlimited");
    else snprintf(out, cap, "%llu", (unsigned long long)v);
}

int kolo__fd_room(size_t need, const char *who)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return KOLO_OK; /* nothing to learn: let the opens speak */
    size_t open = open_now();
    /* some to spare for what opens besides the connections: the shm segments while they are
     * mapped, the listener, a log file, the program's own */
    uint64_t want = (uint64_t)open + need + 32;
    if (rl.rlim_cur == RLIM_INFINITY || want <= (uint64_t)rl.rlim_cur) return KOLO_OK;
    if (rl.rlim_max != RLIM_INFINITY && want > (uint64_t)rl.rlim_max) {
        char hard[32];
        limit_text(rl.rlim_max, hard, sizeof(hard));
        return kolo__err(KOLO_ERR_STARTUP,
                         "%s needs about %zu file descriptors, and %zu are open, but this process may open at most "
                         "%s (the hard limit, `ulimit -Hn`): raise it where the job starts (`ulimit -n` as root, "
                         "LimitNOFILE= in a systemd unit, nofile in /etc/security/limits.conf, `docker run "
                         "--ulimit nofile=N`; Slurm passes the submitting shell's limits), or run fewer ranks",
                         who, need, open, hard);
    }
    rlim_t old = rl.rlim_cur;
    uint64_t to = (uint64_t)rl.rlim_cur + need + 32;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)to : (rlim_t)KOLO_MIN(to, (uint64_t)rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return kolo__err_sys(errno, "%s needs about %zu file descriptors, and %zu are open, more than the limit of "
                             "%llu (`ulimit -n`), which could not be raised",
                             who, need, open, (unsigned long long)old);
    KOLO_INFO("raised the open-file limit (RLIMIT_NOFILE) from %llu to %llu: %s needs about %zu", (unsigned long long)old,
              (unsigned long long)rl.rlim_cur, who, need);
    return KOLO_OK;
}

int kolo__keepalive_s(void)
{
    double s = kolo__setting_double(KOLO_SET_TCP_KEEPALIVE);
    return s >= 1 ? (int)KOLO_MIN(s, 86400.0) : 0;
}

bool kolo__keepalive(int fd, int seconds, bool user_timeout)
{
    if (seconds < 1) return true;
    int on = 1, idle = seconds / 3, intvl = (seconds - idle) / 4, cnt = 4;
    unsigned ms = (unsigned)seconds * 1000u;
    if (idle < 1) idle = 1;
    if (intvl < 1) intvl = 1;
    return setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) == 0 &&
           setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) == 0 &&
           setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) == 0 &&
           setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) == 0 &&
           (!user_timeout || setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms)) == 0);
}
