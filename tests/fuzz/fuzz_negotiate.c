/* fuzz_negotiate.c - the engine's negotiation messages, as a garbled peer could send them.
 *
 * Every cycle, every member of a process set reads every member's blob (negotiate.c): a fixed
 * part (flags, the length of the variable part, one bit per response-cache slot) and a variable
 * part of records (a request's description, or the coordinator's stall decision). The transport
 * checks a frame's magic and length, not what the frame says, so a peer's memory error, a
 * mismatched kolo or a flipped bit reaches the decoder. Whatever the bytes, a member must answer
 * with a status that names the rank (KOLO_ERR_PROTOCOL), or with error responses naming the
 * tensor, and never crash, read outside its buffers or leak.
 *
 * An input: the set's size (2 to 5), this member's place in it, the cache's capacity (0, 1, 64 or
 * 100: 100 leaves bits in the last word that name no slot), the stall clocks, the number of
 * cycles (1 to 4); then, per cycle and member, the fixed part's flags and cache bits and a
 * variable part of up to 4 KiB. Each cycle decides, checks for stalls, writes the status and
 * finishes as the engine does; the next cycle reads the cache the last one filled.
 *
 * The decoder's functions are static: this file includes negotiate.c itself. */
#include "../../src/engine/negotiate.c"

#include "fuzz.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    kolo__log_level = KOLO_LOG_NONE; /* a stall warning per input would drown the fuzzer's own output */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int caps[4] = {0, 1, 64, 100};
    fz f = {data, size};
    int n = 2 + fz_u8(&f) % 4;
    int me = fz_u8(&f) % n;
    int cap = caps[fz_u8(&f) % 4];
    uint8_t clocks = fz_u8(&f);
    int cycles = 1 + fz_u8(&f) % 4;

    E.stall_disable = 0;
    E.stall_check = clocks & 1 ? 1e-9 : 60;     /* every entry stalled at once, or none */
    E.stall_shutdown = clocks & 2 ? 1e-9 : 0;   /* the coordinator decides stall errors */

    int ranks[5];
    for (int r = 0; r < n; r++) ranks[r] = 3 * r + 1; /* world ranks other than the set's */
    kolo__group g = {.size = n, .rank = me, .ranks = ranks};
    kolo__pset_state *s = kolo__pset_new(1, &g, me, cap);
    if (!s) abort();
    for (int c = 0; c < cycles; c++) {
        size_t total = 0;
        const uint8_t *var[5];
        size_t len[5];
        for (int r = 0; r < n; r++) {
            kolo__fixed_hdr h;
            memset(&h, 0, sizeof(h));
            h.flags = fz_u8(&f) & (KOLO__F_JOINED | KOLO__F_LEAVING | KOLO__F_BUSY);
            unsigned char *fix = s->fix_all + s->fixed_len * (size_t)r;
            fz_bytes(&f, fix + sizeof(h), s->fixed_len - sizeof(h));
            var[r] = fz_span(&f, 4096, &len[r]);
            h.varlen = (uint32_t)len[r];
            memcpy(fix, &h, sizeof(h));
            s->counts[r] = len[r];
            total += len[r];
        }
        /* what kolo__negotiate_decide gathers */
        if (total > s->var_all_cap) {
            kolo__free(s->var_all);
            s->var_all = kolo__malloc(total);
            if (!s->var_all) abort();
            s->var_all_cap = total;
        }
        size_t off = 0;
        for (int r = 0; r < n; r++) {
            if (len[r]) memcpy(s->var_all + off, var[r], len[r]);
            off += len[r];
        }
        int st = decide(s, NULL);
        if (st != KOLO_OK) {
            /* the engine stops on it: the message must say who sent what */
            if (st != KOLO_ERR_PROTOCOL && st != KOLO_ERR_NO_MEMORY) abort();
            if (st == KOLO_ERR_PROTOCOL && !strstr(kolo__errmsg(), "rank ")) abort();
            break;
        }
        for (size_t i = 0; i < s->nresp; i++) /* every error response says what went wrong */
            if (s->resp[i].status != KOLO_OK && (!s->resp[i].err || !s->resp[i].err[0])) abort();
        s->last_stall_check = 0;
        kolo__negotiate_stall_check(s);
        kolo__sbuf b = {0};
        kolo__negotiate_status(s, &b);
        kolo__sb_free(&b);
        if (kolo__negotiate_finish(s) != KOLO_OK) break;
        /* the coordinator's next blob carries its stall decisions */
        if (kolo__negotiate_build(s, 0, NULL) != KOLO_OK) break;
    }
    kolo__pset_free(s);
    return 0;
}
