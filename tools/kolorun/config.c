/* config.c - reads horovodrun's --config-file: YAML, of the one shape Horovod's files have,
 *
 *     controller: gloo            # a top-level scalar
 *     params:                     # a section ...
 *       fusion_threshold_mb: 32   # ... of scalars, indented
 *
 * Comments (#), blank lines, quoted scalars ('..' and ".."), any consistent indentation, CRLF
 * line ends and a byte-order mark. Other
 * YAML (lists, flow maps, anchors, multi-line scalars, tabs) is refused with the file and line,
 * as is a key given twice; what the keys mean is the caller's (cli.c). */
#include "kolorun.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *trim(char *s)
{
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = '\0';
    return s;
}

/* Cuts a comment off (a '#' at the start or after a space, outside quotes). */
static void uncomment(char *s)
{
    char q = 0;
    for (char *p = s; *p; p++) {
        if (q) {
            if (*p == q) q = 0;
        } else if (*p == '\'' || *p == '"') {
            q = *p;
        } else if (*p == '#' && (p == s || p[-1] == ' ')) {
            *p = '\0';
            return;
        }
    }
}

/* A scalar without its quotes; NULL for what this reader does not take. */
static const char *scalar(char *v)
{
    size_t n = strlen(v);
    if (n >= 2 && (v[0] == '\'' || v[0] == '"') && v[n - 1] == v[0]) {
        v[n - 1] = '\0';
        return v + 1;
    }
    if (strchr("[{&*!|>'\"", v[0]) || !strncmp(v, "- ", 2) || !strcmp(v, "-")) return NULL;
    return v;
}

/* fgets handed the rest of a long line over as a line of its own (in a hostfile, the tail of a
 * long comment read as a host) and cut a line at a NUL byte silently. */
long kr_read_line(FILE *f, char *line, size_t cap)
{
    size_t n = 0;
    bool nul = false;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (n + 1 == cap) return -2;
        nul |= c == '\0';
        line[n++] = (char)c;
    }
    line[n] = '\0';
    if (c == EOF && n == 0) return -1;
    return nul ? -3 : (long)n;
}

const char *kr_read_line_problem(long got, size_t cap)
{
    static char text[48];
    if (got != -2) return "a NUL byte (not a text file?)";
    snprintf(text, sizeof(text), "line longer than %zu bytes", cap - 1);
    return text;
}

int kr_config_read(const char *path, kr_config_fn fn, void *ctx)
{
    FILE *f = fopen(path, "r");
    if (!f) return kr_usage_error("--config-file: cannot read '%s': %s", path, strerror(errno));
    char line[4096], section[128] = "";
    char seen[64][160]; /* the keys read: every key accepted is one of cli.c's 23, so 64 hold them all */
    int nseen = 0, lineno = 0, indent = -1, rc = -1;
    for (long got; rc == -1 && (got = kr_read_line(f, line, sizeof(line))) != -1;) {
        lineno++;
        if (got < 0) {
            rc = kr_usage_error("%s:%d: %s", path, lineno, kr_read_line_problem(got, sizeof(line)));
            break;
        }
        if (strchr(line, '\t')) {
            rc = kr_usage_error("%s:%d: a tab (YAML indents with spaces)", path, lineno);
            break;
        }
        if (lineno == 1 && !memcmp(line, "\xEF\xBB\xBF", 3)) memmove(line, line + 3, strlen(line + 3) + 1); /* a BOM */
        uncomment(line);
        int ind = 0;
        while (line[ind] == ' ') ind++;
        char *s = trim(line);
        if (!*s || !strcmp(s, "---")) continue;
        char *colon = strstr(s, ": ");
        if (!colon && s[strlen(s) - 1] == ':') colon = s + strlen(s) - 1;
        if (!colon || colon == s) {
            rc = kr_usage_error("%s:%d: expected 'key: value' or 'section:', got '%s'", path, lineno, s);
            break;
        }
        *colon = '\0';
        char *key = trim(s), *val = trim(colon + 1);
        for (char *k = key; *k; k++)
            if (!isalnum((unsigned char)*k) && *k != '_') {
                rc = kr_usage_error("%s:%d: '%s' is not a key of a Horovod config file", path, lineno, key);
                break;
            }
        if (rc != -1) break;
        if (ind == 0) {
            indent = -1;
            section[0] = '\0';
            if (!*val) { /* a section starts */
                snprintf(section, sizeof(section), "%s", key);
                continue;
            }
        } else {
            if (!section[0]) {
                rc = kr_usage_error("%s:%d: '%s' is indented but no section starts above it", path, lineno, key);
                break;
            }
            if (indent < 0) indent = ind;
            if (ind != indent) {
                rc = kr_usage_error("%s:%d: '%s' is indented by %d, the section's keys above by %d", path, lineno,
                                    key, ind, indent);
                break;
            }
            if (!*val) {
                rc = kr_usage_error("%s:%d: '%s' has no value (sections do not nest)", path, lineno, key);
                break;
            }
        }
        const char *v = scalar(val);
        if (!v) {
            rc = kr_usage_error("%s:%d: '%s: %s': only plain or quoted single-line values are read", path, lineno,
                                key, val);
            break;
        }
        char full[160];
        snprintf(full, sizeof(full), "%s%s%s", ind ? section : "", ind ? "." : "", key);
        for (int i = 0; i < nseen; i++)
            if (!strcmp(seen[i], full)) rc = kr_usage_error("%s:%d: '%s' is given twice", path, lineno, full);
        if (rc != -1) break;
        if (nseen < 64) snprintf(seen[nseen++], sizeof(seen[0]), "%s", full);
        rc = fn(ctx, ind ? section : "", key, v, path, lineno);
    }
    if (rc == -1 && ferror(f)) /* a directory opens, and reads as nothing but this */
        rc = kr_usage_error("--config-file: cannot read '%s': %s", path, strerror(errno));
    fclose(f);
    return rc;
}
