/* output.c - workers' output: whole lines, tagged [rank]<stdout>: / [rank]<stderr>:, copied to per-rank files.
 *
 * Each worker stream is a pipe read by the one poll() loop. Bytes collect in the stream's
 * buffer until a newline; each complete line leaves in a single write() of prefix + line +
 * newline, so lines of different ranks never mix mid-line (kolorun is single-threaded and
 * writes each line whole, retrying partial writes). A line longer than KR_LINE_MAX goes out
 * in pieces of up to KR_LINE_MAX, each tagged, none ending inside a UTF-8 character; the
 * partial line left at end of file goes out with a newline added. Per-rank files
 * (--output-filename) get the raw lines, without tag.
 *
 * --merge-output S holds each printed line for S seconds: the same text on the same stream from
 * other ranks in that time joins it, and it goes out once, tagged with every rank that wrote it
 * ("[0-3,5]<stdout>:"). Lines leave in the order they are held, and each rank's lines keep their
 * order: a rank's line joins a twin held after that rank's last held line, or one held before it
 * that can move behind it (none of the twin's ranks has a line held after the twin).
 * kolorun's own messages (kr_say) print whatever is held first; files and failure tails get
 * every rank's lines as written.
 *
 * Progress bars (tqdm's, download meters) rewrite one line with carriage returns and end it
 * with a newline only when they finish, minutes later: held whole, such a line showed nothing
 * until then (the job looked hung) and its first '\r' sent the cursor back over the tag. A
 * partial line with a '\r' in it is shown as it comes instead, each '\r' going out as '\r'
 * and the tag, so that every rewrite keeps it; the stream remembers how much it has shown.
 * Such a line is open on the terminal (the cursor after it): any other output first ends it
 * with a newline, and its next bytes start with the tag again. Its file gets the raw bytes. */
#include "kolorun.h"

#include "../../src/common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
static kr_stream *open_line; /* the stream whose partial line was shown last, the cursor after it */
static int open_fd;

/* Whether our stdout and stderr are one file (a terminal, both redirected to one log): output
 * on one then lands beside a progress line open on the other. */
static bool one_destination(void)
{
    static int same = -1;
    if (same < 0) {
        struct stat a, b;
        same = fstat(1, &a) == 0 && fstat(2, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    }
    return same;
}

/* Before other output to fd: ends a progress line left open where it lands (stream `s` itself may
 * go on; a bar on a terminal's stderr is not cut by lines that go to a file on stdout). */
static void close_open_line(const kr_stream *s, int fd)
{
    if (!open_line || open_line == s || (fd != open_fd && !one_destination())) return;
    if (!broken[open_fd]) broken[open_fd] = !kr_write_all(open_fd, "\n", 1);
    open_line->reprefix = true;
    open_line = NULL;
}

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

/* ---- --merge-output ---- */

typedef struct held {
    struct held *next;
    int fd;                  /* 1 or 2 */
    double deadline;         /* when it goes out */
    char ts[96];             /* the wall-clock prefix of its first arrival, "" without --prefix-timestamp */
    int *ranks, nr, cap;     /* ranks that wrote it, increasing */
    bool tag;
    size_t len;
    char text[];
} held;

static held *held_head, *held_tail;

static bool held_has(const held *h, int rank)
{
    for (int i = 0; i < h->nr; i++)
        if (h->ranks[i] == rank) return true;
    return false;
}

static bool held_add_rank(held *h, int rank)
{
    if (h->nr == h->cap) {
        int cap = h->cap ? 2 * h->cap : 4;
        int *g = realloc(h->ranks, (size_t)cap * sizeof(int));
        if (!g) return false;
        h->ranks = g;
        h->cap = cap;
    }
    int i = h->nr++;
    for (; i > 0 && h->ranks[i - 1] > rank; i--) h->ranks[i] = h->ranks[i - 1];
    h->ranks[i] = rank;
    return true;
}

/* "0-3,5,7-8" */
static size_t rank_ranges(const held *h, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < h->nr && n < cap; i++) {
        int j = i;
        while (j + 1 < h->nr && h->ranks[j + 1] == h->ranks[j] + 1) j++;
        int w = j > i ? snprintf(out + n, cap - n, "%s%d-%d", n ? "," : "", h->ranks[i], h->ranks[j])
                      : snprintf(out + n, cap - n, "%s%d", n ? "," : "", h->ranks[i]);
        n += w > 0 ? (size_t)w : 0;
        i = j;
    }
    return n < cap ? n : cap - 1;
}

static void held_print(const held *h)
{
    if (broken[h->fd]) return;
    close_open_line(NULL, h->fd);
    size_t cap = strlen(h->ts) + 64 + 12 * (size_t)h->nr + h->len + 2;
    char *out = malloc(cap);
    if (!out) {
        broken[h->fd] = !(kr_write_all(h->fd, h->text, h->len) && kr_write_all(h->fd, "\n", 1));
        return;
    }
    size_t n = (size_t)snprintf(out, cap, "%s", h->ts);
    if (h->tag) {
        out[n++] = '[';
        n += rank_ranges(h, out + n, cap - n - h->len - 16);
        n += (size_t)snprintf(out + n, cap - n, "]<%s>:", h->fd == 2 ? "stderr" : "stdout");
    }
    memcpy(out + n, h->text, h->len);
    n += h->len;
    out[n++] = '\n';
    if (!kr_write_all(h->fd, out, n)) broken[h->fd] = true;
    free(out);
}

void kr_output_merge_flush(double now)
{
    while (held_head && (now < 0 || held_head->deadline <= now)) {
        held *h = held_head;
        held_head = h->next;
        if (!held_head) held_tail = NULL;
        held_print(h);
        free(h->ranks);
        free(h);
    }
}

double kr_output_merge_wake(void) { return held_head ? held_head->deadline : INFINITY; }

/* Holds a line for --merge-output; false when it could not be held (no memory): print it now. */
static bool hold(const kr_opts *o, int fd, int rank, const char *line, size_t len, const char *ts)
{
    held *match = NULL;
    for (held *h = held_head; h; h = h->next) { /* a stream's order is its own: the other is another pipe */
        if (h->fd != fd) continue;
        if (held_has(h, rank)) match = NULL; /* not before this rank's own newest held line */
        else if (!match && h->len == len && memcmp(h->text, line, len) == 0) match = h;
    }
    if (match) return held_add_rank(match, rank);
    /* A twin held before this rank's own newest line can still take it if it moves behind that
     * line: allowed when none of the twin's ranks has a line held after the twin. */
    held *prev = NULL;
    for (held *h = held_head; h; prev = h, h = h->next) {
        if (h->fd != fd || h->len != len || memcmp(h->text, line, len) != 0 || held_has(h, rank)) continue;
        bool later = false;
        for (held *k = h->next; k && !later; k = k->next)
            for (int i = 0; i < h->nr && !later && k->fd == fd; i++) later = held_has(k, h->ranks[i]);
        if (later || !held_add_rank(h, rank)) continue;
        if (h != held_tail) { /* to the end: after every line held so far */
            if (prev) prev->next = h->next;
            else held_head = h->next;
            h->next = NULL;
            held_tail->next = h;
            held_tail = h;
        }
        return true;
    }
    held *h = calloc(1, sizeof(*h) + len);
    if (!h) return false;
    h->fd = fd;
    h->deadline = kr_now() + o->merge_window;
    snprintf(h->ts, sizeof(h->ts), "%s", ts);
    h->tag = o->tag_output;
    h->len = len;
    memcpy(h->text, line, len);
    if (!held_add_rank(h, rank)) {
        free(h);
        return false;
    }
    if (held_tail) held_tail->next = h;
    else held_head = h;
    held_tail = h;
    return true;
}

void kr_say(const char *fmt, ...)
{
    kr_output_merge_flush(-1); /* the workers' lines before kolorun's word on them */
    char line[4096];
    int n = snprintf(line, sizeof(line), "kolorun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t room = sizeof(line) - (size_t)n - 2, len = (size_t)n;
    if (m > 0) len += (size_t)m < room ? (size_t)m : room;
    line[len++] = '\n';
    close_open_line(NULL, 2);
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

/* A line "[kolo R status] {...}" (kolo's KOLO_STATUS_SIGNAL) of rank R, the rank's own: its JSON
 * for kr_dump_stacks's summary. */
static void keep_status(kr_rank *r, const char *line, size_t len)
{
    char head[48];
    int hl = snprintf(head, sizeof(head), "[kolo %d status] {", r->rank);
    if (hl <= 0 || len < (size_t)hl || memcmp(line, head, (size_t)hl) != 0) return;
    char *copy = malloc(len - (size_t)hl + 2);
    if (!copy) return;
    memcpy(copy, line + hl - 1, len - (size_t)hl + 1);
    copy[len - (size_t)hl + 1] = '\0';
    free(r->status);
    r->status = copy;
    r->want_status = false;
}

/* The timestamp (--prefix-timestamp) and the tag (--tag-output) a stream's output starts with,
 * into prefix (96 bytes); *ts_len gets the timestamp's part. */
static size_t make_prefix(const kr_opts *o, const kr_rank *r, const kr_stream *s, char *prefix, size_t *ts_len)
{
    size_t pl = 0;
    if (o->prefix_timestamp) {
        pl = kolo__wall_time(prefix, 40);
        prefix[pl++] = ' ';
    }
    prefix[pl] = '\0';
    *ts_len = pl;
    if (o->tag_output)
        pl += (size_t)snprintf(prefix + pl, 96 - pl, "[%d]<%s>:", r->rank, s->is_err ? "stderr" : "stdout");
    return pl;
}

/* Writes text to fd in one write: the prefix first when `start`, the prefix again after each
 * '\r' that is not text's last byte (a progress bar's rewrite keeps its tag; a CRLF line's '\r'
 * gets none), a newline when `end`. */
static void show(int fd, const char *prefix, size_t pl, const char *text, size_t len, bool start, bool end)
{
    size_t crs = 0;
    for (size_t i = 0; i + 1 < len; i++) crs += text[i] == '\r';
    char stackbuf[8192];
    size_t total = (start ? pl : 0) + len + crs * pl + (end ? 1 : 0);
    char *out = total <= sizeof(stackbuf) ? stackbuf : malloc(total);
    if (!out) { /* no memory for the joined text: several writes still keep it whole here */
        broken[fd] = !((!start || kr_write_all(fd, prefix, pl)) && kr_write_all(fd, text, len) &&
                       (!end || kr_write_all(fd, "\n", 1)));
        return;
    }
    size_t n = 0;
    if (start && !(len > 1 && text[0] == '\r')) { /* (a leading '\r' brings the prefix itself) */
        memcpy(out, prefix, pl);
        n = pl;
    }
    for (size_t i = 0; i < len; i++) {
        out[n++] = text[i];
        if (text[i] == '\r' && i + 1 < len) {
            memcpy(out + n, prefix, pl);
            n += pl;
        }
    }
    if (end) out[n++] = '\n';
    if (!kr_write_all(fd, out, n)) broken[fd] = true;
    if (out != stackbuf) free(out);
}

/* A whole line of stream s (its newline, or the end of the stream, reached), of which the first
 * `shown` bytes are on our terminal already when s->begun (a progress bar's earlier rewrites). */
static void emit(const kr_opts *o, kr_rank *r, kr_stream *s, const char *line, size_t len, size_t shown, bool begun)
{
    if (!begun && !s->is_err && !s->marker_seen && r->host >= 0 && !o->hosts[r->host].local) {
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
    /* what a terminal shows of the line: its text after the last rewrite */
    size_t vis = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (line[i] == '\r') vis = i + 1;
    if (s->is_err) remember(r, line + vis, len - vis);
    if (s->is_err && r->want_status) keep_status(r, line, len);
    int fd = s->is_err ? 2 : 1;
    bool was_open = open_line == s;
    if (was_open) open_line = NULL;
    bool reprefix = s->reprefix;
    s->reprefix = false;
    if (broken[fd] || !kr_rank_shown(o, r->rank)) return;

    char prefix[96];
    size_t ts_len, pl = make_prefix(o, r, s, prefix, &ts_len);
    if (begun) { /* the rest of a progress line; nothing when other output has ended it already */
        if (shown < len || !reprefix)
            show(fd, prefix, pl, line + shown, len - shown, reprefix && line[shown] != '\r', true);
        return;
    }
    if (o->merge_window > 0 && vis == 0) {
        char ts[96];
        snprintf(ts, sizeof(ts), "%.*s", (int)ts_len, prefix);
        if (hold(o, fd, r->rank, line, len, ts)) return;
    }
    close_open_line(s, fd);
    show(fd, prefix, pl, line, len, true, true);
}

/* How many of the n bytes at p are a UTF-8 character not yet whole (0-3). Shown as it came, a
 * character split across two reads (tqdm's bars are 3-byte blocks, and pipes split them) went out
 * in halves, and another rank's line could fall between the two, leaving both broken. */
static size_t utf8_unfinished(const char *p, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)p[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: its lead is further back */
        size_t want = c >= 0xF8 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > k ? k : 0;
    }
    return 0;
}

/* Shows what has come of s's partial line, when it is a progress line (it holds a '\r', or its
 * start is shown already); a last '\r' waits for the next byte (a CRLF's newline, or the rewrite),
 * and so does a character not yet whole. */
static void show_partial(const kr_opts *o, kr_rank *r, kr_stream *s)
{
    size_t upto = s->len;
    if (upto && s->buf[upto - 1] == '\r') upto--;
    else if (upto > s->shown) upto -= utf8_unfinished(s->buf + s->shown, upto - s->shown);
    if (upto <= s->shown || (!s->begun && !memchr(s->buf + s->shown, '\r', upto - s->shown))) return;
    int fd = s->is_err ? 2 : 1;
    if (!broken[fd] && kr_rank_shown(o, r->rank)) {
        close_open_line(s, fd);
        char prefix[96];
        size_t ts_len, pl = make_prefix(o, r, s, prefix, &ts_len);
        bool start = !s->begun || (s->reprefix && s->buf[s->shown] != '\r');
        show(fd, prefix, pl, s->buf + s->shown, upto - s->shown, start, false);
        open_line = s;
        open_fd = fd;
    }
    s->reprefix = false;
    s->shown = upto;
    s->begun = true;
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
        bool first = start == 0 && s->begun;
        emit(o, r, s, s->buf + start, i - start, first ? s->shown : 0, first);
        if (first) s->shown = 0, s->begun = false;
        start = i + 1;
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    show_partial(o, r, s);
    if (s->len == KR_LINE_MAX && s->begun && s->shown > 0) {
        /* a progress line longer than the buffer: what is shown goes to the file, raw, and leaves */
        if (s->file_fd >= 0 && !kr_write_all(s->file_fd, s->buf, s->shown)) {
            close(s->file_fd);
            s->file_fd = -1;
        }
        memmove(s->buf, s->buf + s->shown, s->len - s->shown);
        s->len -= s->shown;
        s->shown = 0;
    } else if (s->len == KR_LINE_MAX) { /* a line longer than the buffer: send this piece */
        size_t rest = utf8_unfinished(s->buf, s->len); /* a character cut here goes with the next piece */
        emit(o, r, s, s->buf, s->len - rest, s->shown, s->begun);
        memmove(s->buf, s->buf + s->len - rest, rest);
        s->len = rest;
        s->shown = 0;
        s->begun = false;
    }
    return true;
}

void kr_output_flush(const kr_opts *o, kr_rank *r, kr_stream *s)
{
    if (s->len) emit(o, r, s, s->buf, s->len, s->shown, s->begun);
    if (open_line == s) open_line = NULL;
    s->len = s->shown = 0;
    s->begun = s->reprefix = false;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    if (s->file_fd >= 0) close(s->file_fd);
    s->file_fd = -1;
}
