/* output.c - workers' output: whole lines, tagged [rank]<stdout>: / [rank]<stderr>:, copied to per-rank files.
 *
 * Each worker stream is a pipe read by the one poll() loop. Bytes collect in the stream's
 * buffer until a newline; each complete line leaves in a single write() of prefix + line +
 * newline, so lines of different ranks never mix mid-line (kolorun is single-threaded and
 * writes each line whole, retrying partial writes). A line longer than KR_LINE_MAX goes out
 * in KR_LINE_MAX pieces, each tagged; the partial line left at end of file goes out with a
 * newline added. Per-rank files (--output-filename) get the raw lines, without tag. */
#include "kolorun.h"

#include "../../src/common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The remote wrapper's first stdout line; swallowed, it tells us the command started. */
extern const char kr_start_marker[];

static bool broken[3]; /* our stdout/stderr gave EPIPE or another error: stop writing there */

bool kr_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { /* someone made our stdout non-blocking: wait for room */
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
                continue;
            }
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

void kr_say(const char *fmt, ...)
{
    char line[4096];
    int n = snprintf(line, sizeof(line), "kolorun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t room = sizeof(line) - (size_t)n - 2, len = (size_t)n;
    if (m > 0) len += (size_t)m < room ? (size_t)m : room;
    line[len++] = '\n';
    if (!broken[2]) broken[2] = !kr_write_all(2, line, len);
}

static int mkdir_p(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        *p = '/';
        if (r != 0 && errno != EEXIST) return -1;
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* DIR/<name>/stdout and DIR/<name>/stderr for one worker. */
static int open_pair(const kr_opts *o, kr_rank *r, const char *name)
{
    char dir[4096], path[4200];
    int dl = snprintf(dir, sizeof(dir), "%s/%s", o->output_dir, name);
    if (dl < 0 || (size_t)dl >= sizeof(dir)) {
        kr_say("error: --output-filename: directory name too long");
        return KR_EXIT_LAUNCH;
    }
    if (mkdir_p(dir) != 0) {
        kr_say("error: --output-filename: cannot create %s: %s", dir, strerror(errno));
        return KR_EXIT_LAUNCH;
    }
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof(path), "%s/%s", dir, k ? "stderr" : "stdout");
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            kr_say("error: --output-filename: cannot create %s: %s", path, strerror(errno));
            return KR_EXIT_LAUNCH;
        }
        if (k) r->err.file_fd = fd;
        else r->out.file_fd = fd;
    }
    return 0;
}

int kr_output_open_files(const kr_opts *o, kr_rank *ranks, int n)
{
    for (int i = 0; i < n; i++) ranks[i].out.file_fd = ranks[i].err.file_fd = -1;
    if (!o->output_dir) return 0;
    /* rank.N with N zero-padded to the width of size-1 (at least one digit): rank.0..rank.9,
     * rank.00..rank.15 - the names sort in rank order, as horovodrun's do. */
    int width = 1;
    for (int v = n - 1; v >= 10; v /= 10) width++;
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof(name), "rank.%0*d", width < 12 ? width : 12, i);
        int code = open_pair(o, &ranks[i], name);
        if (code) return code;
    }
    return 0;
}

int kr_output_open_worker(const kr_opts *o, kr_rank *r)
{
    if (!o->output_dir) return 0;
    char name[64];
    snprintf(name, sizeof(name), "worker.%d", r->id);
    return open_pair(o, r, name);
}

bool kr_rank_shown(const kr_opts *o, int rank)
{
    if (!o->out_ranks) return true;
    for (int i = 0; i < o->n_out_ranks; i++)
        if (rank >= o->out_ranks[i][0] && rank <= o->out_ranks[i][1]) return true;
    return false;
}

static void remember(kr_rank *r, const char *line, size_t len)
{
    if (!r->tail) return;
    size_t n = len < KR_TAIL_COLS - 1 ? len : KR_TAIL_COLS - 1;
    memcpy(r->tail[r->tail_next], line, n);
    r->tail[r->tail_next][n] = '\0';
    r->tail_next = (r->tail_next + 1) % KR_TAIL_LINES;
    if (r->tail_count < KR_TAIL_LINES) r->tail_count++;
}

static void emit(const kr_opts *o, kr_rank *r, kr_stream *s, const char *line, size_t len)
{
    if (!s->is_err && !s->marker_seen && r->host >= 0 && !o->hosts[r->host].local) {
        size_t ml = strlen(kr_start_marker);
        if (len >= ml && len < ml + 12 && memcmp(line, kr_start_marker, ml) == 0) { /* and the pid there */
            s->marker_seen = true;
            r->started = true;
            char pid[16];
            snprintf(pid, sizeof(pid), "%.*s", (int)(len - ml), line + ml);
            r->remote_pid = atoi(pid);
            return;
        }
    }
    if (s->file_fd >= 0) {
        if (!kr_write_all(s->file_fd, line, len) || !kr_write_all(s->file_fd, "\n", 1)) {
            kr_say("warning: rank %d: writing its %s file failed: %s; no more lines go there", r->rank,
                   s->is_err ? "stderr" : "stdout", strerror(errno));
            close(s->file_fd);
            s->file_fd = -1;
        }
    }
    if (s->is_err) remember(r, line, len);
    int fd = s->is_err ? 2 : 1;
    if (broken[fd] || !kr_rank_shown(o, r->rank)) return;

    char prefix[96];
    size_t pl = 0;
    if (o->prefix_timestamp) {
        pl = kolo__wall_time(prefix, 40);
        prefix[pl++] = ' ';
    }
    if (o->tag_output)
        pl += (size_t)snprintf(prefix + pl, sizeof(prefix) - pl, "[%d]<%s>:", r->rank, s->is_err ? "stderr" : "stdout");

    /* one write per line: prefix, line and newline together */
    char stackbuf[8192];
    size_t total = pl + len + 1;
    char *out = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
    if (!out) { /* no memory for the joined line: three writes still keep the line whole here */
        broken[fd] = !(kr_write_all(fd, prefix, pl) && kr_write_all(fd, line, len) && kr_write_all(fd, "\n", 1));
        return;
    }
    memcpy(out, prefix, pl);
    memcpy(out + pl, line, len);
    out[pl + len] = '\n';
    if (!kr_write_all(fd, out, total)) broken[fd] = true;
    if (out != stackbuf) free(out);
}

bool kr_output_read(const kr_opts *o, kr_rank *r, kr_stream *s)
{
    if (s->fd < 0) return false;
    ssize_t n;
    do {
        n = read(s->fd, s->buf + s->len, KR_LINE_MAX - s->len);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) { /* EOF, or an error that ends the stream all the same */
        kr_output_flush(o, r, s);
        return false;
    }
    s->len += (size_t)n;
    r->last_output = kr_now();
    size_t start = 0;
    for (size_t i = s->len - (size_t)n; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        emit(o, r, s, s->buf + start, i - start);
        start = i + 1;
    }
    if (start == 0 && s->len == KR_LINE_MAX) { /* a line longer than the buffer: send this piece */
        emit(o, r, s, s->buf, s->len);
        s->len = 0;
    } else if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    return true;
}

void kr_output_flush(const kr_opts *o, kr_rank *r, kr_stream *s)
{
    if (s->len) emit(o, r, s, s->buf, s->len);
    s->len = 0;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->file_fd >= 0) close(s->file_fd);
    s->file_fd = -1;
}
