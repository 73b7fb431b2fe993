/* test_adasum.c - KOLO_ADASUM against a reference of the same tree computed here in double, on
 * 1 to 5 forked ranks over shared memory and TCP; the properties that hold exactly (orthogonal
 * vectors sum, equal ones stay, a zero vector is neutral); each tensor of a fused request its own
 * vector; process sets, joined ranks and the errors. */
#include "kt.h"

#include "../src/reduce/reduce.h"

#include <math.h>
#include <stdint.h>

#define WAIT_S 60.0

/* Checks got (dtype d, `total` elements) against the reference of the members' inputs made by
 * kt_fill(seed + member) over the given tensors, relative to each tensor's largest value. */
static void check_against_tree(const void *got, int n, unsigned seed, const size_t *start, size_t nt, kolo_dtype_t d,
                               double pre, double post, const char *what)
{
    size_t total = start[nt], es = kolo_dtype_size(d);
    double *x[64];
    char *in = malloc(total * es + 8);
    for (int r = 0; r < n; r++) {
        x[r] = malloc(total * sizeof(double) + 8);
        kt_fill(in, total, d, seed + (unsigned)r);
        for (size_t i = 0; i < total; i++) x[r][i] = kt_get(in, i, d) * pre;
    }
    kt_adasum_tree(x, n, start, nt);
    for (size_t t = 0; t < nt; t++) {
        double scale = 0;
        for (size_t i = start[t]; i < start[t + 1]; i++) scale = fmax(scale, fabs(x[0][i] * post));
        for (size_t i = start[t]; i < start[t + 1]; i++) {
            double want = x[0][i] * post, g = kt_get(got, i, d);
            KT_ASSERTF(fabs(g - want) <= kt_adasum_tolerance(d) * fmax(scale, 1e-30), "%s: %s on %d ranks, tensor %zu element %zu is %.9g, expected %.9g",
                       what, kolo_dtype_name(d), n, t, i - start[t], g, want);
        }
    }
    for (int r = 0; r < n; r++) free(x[r]);
    free(in);
}

/* every rank of the set holds the same bits */
static void check_same_everywhere(const void *buf, size_t bytes, int n, int pset)
{
    char *all = malloc(bytes * (size_t)n + 1);
    KT_OK(kolo_allgather(buf, bytes, all, NULL, KOLO_UINT8, pset));
    for (int r = 1; r < n; r++)
        KT_ASSERTF(memcmp(all, all + bytes * (size_t)r, bytes) == 0, "rank %d's adasum result differs from rank 0's", r);
    free(all);
}

static const kolo_dtype_t float_types[] = {KOLO_FLOAT32, KOLO_FLOAT64, KOLO_FLOAT16, KOLO_BFLOAT16};

static void direct_cases(int rank, void *arg)
{
    (void)arg;
    KT_OK(kolo_init());
    int n = kolo_size();
    static const size_t counts[] = {0, 1, 7, 1003, 40000};
    for (size_t di = 0; di < 4; di++)
        for (size_t ci = 0; ci < 5; ci++) {
            kolo_dtype_t d = float_types[di];
            size_t count = counts[ci], es = kolo_dtype_size(d);
            if (count > 1003 && d != KOLO_FLOAT32 && d != KOLO_FLOAT16) continue;
            unsigned seed = (unsigned)(count * 13 + di);
            int inplace = (int)(ci % 2);
            double pre = ci == 3 ? 0.5 : 1.0, post = ci == 3 ? 3.0 : 1.0;
            char *send = malloc(count * es + 8), *recv = malloc(count * es + 8);
            kt_fill(send, count, d, seed + (unsigned)rank);
            if (inplace) memcpy(recv, send, count * es);
            KT_OK(kolo_allreduce(inplace ? recv : send, recv, count, d, KOLO_ADASUM, pre, post, KOLO_WORLD));
            size_t start[2] = {0, count};
            check_against_tree(recv, n, seed, start, 1, d, pre, post, inplace ? "allreduce in place" : "allreduce");
            check_same_everywhere(recv, count * es, n, KOLO_WORLD);
            free(send);
            free(recv);
        }
    if (n >= 4) { /* a process set of three: the pairing step inside a set, by set ranks */
        int ranks[3] = {1, 2, 3}, id, srank;
        KT_OK(kolo_process_set_add(ranks, 3, &id));
        float v[100], out[100];
        kt_fill(v, 100, KOLO_FLOAT32, 7u + (unsigned)(rank - 1));
        if (rank == 0 || rank > 3) {
            KT_STATUS(kolo_allreduce(v, out, 100, KOLO_FLOAT32, KOLO_ADASUM, 1, 1, id), KOLO_ERR_NOT_MEMBER);
        } else {
            KT_OK(kolo_process_set_rank(id, &srank));
            KT_EQ(srank, rank - 1);
            KT_OK(kolo_allreduce(v, out, 100, KOLO_FLOAT32, KOLO_ADASUM, 1, 1, id));
            size_t start[2] = {0, 100};
            check_against_tree(out, 3, 7u, start, 1, KOLO_FLOAT32, 1, 1, "process set {1,2,3}");
        }
        KT_OK(kolo_process_set_remove(id));
    }
}

/* Small buffers take the one-round exchange (every member runs the whole tree) on at most 8
 * members; KOLO_SMALL_ALLREDUCE_MAX=0 sends every size through the vector-halving tree. */
static void both_algorithms(int n, void (*fn)(int, void *))
{
    kt_job_both(n, fn, NULL);
    setenv("KOLO_SMALL_ALLREDUCE_MAX", "0", 1);
    kt_job_both(n, fn, NULL);
    unsetenv("KOLO_SMALL_ALLREDUCE_MAX");
}

KT_TEST(adasum_matches_the_tree, 300)
{
    for (int n = 1; n <= 5; n++) both_algorithms(n, direct_cases);
    kt_job(9, direct_cases, NULL, NULL, NULL); /* more members than the exchange takes */
}

/* What holds exactly, in every dtype: orthogonal vectors add up, equal ones come out unchanged
 * (an average), a zero vector changes nothing. */
static void exact_cases(int rank, void *arg)
{
    (void)arg;
    KT_OK(kolo_init());
    int n = kolo_size();
    enum { N = 999 };
    for (size_t di = 0; di < 4; di++) {
        kolo_dtype_t d = float_types[di];
        size_t es = kolo_dtype_size(d);
        char *all = malloc(N * es), *mine = malloc(N * es), *got = malloc(N * es);
        kt_fill(all, N, d, 99);
        /* orthogonal: rank r holds the elements i with i % n == r, zeros elsewhere */
        memset(mine, 0, N * es);
        for (size_t i = (size_t)rank; i < N; i += (size_t)n) memcpy(mine + i * es, all + i * es, es);
        KT_OK(kolo_allreduce(mine, got, N, d, KOLO_ADASUM, 1, 1, KOLO_WORLD));
        KT_ASSERTF(memcmp(got, all, N * es) == 0, "%s on %d ranks: orthogonal vectors did not add up", kolo_dtype_name(d), n);
        /* equal: the result is the vector itself */
        KT_OK(kolo_allreduce(all, got, N, d, KOLO_ADASUM, 1, 1, KOLO_WORLD));
        KT_ASSERTF(memcmp(got, all, N * es) == 0, "%s on %d ranks: equal vectors changed", kolo_dtype_name(d), n);
        /* zero on every rank but the last: the last one's vector */
        if (rank == n - 1) memcpy(mine, all, N * es);
        else memset(mine, 0, N * es);
        KT_OK(kolo_allreduce(mine, got, N, d, KOLO_ADASUM, 1, 1, KOLO_WORLD));
        KT_ASSERTF(memcmp(got, all, N * es) == 0, "%s on %d ranks: zero vectors were not neutral", kolo_dtype_name(d), n);
        free(all);
        free(mine);
        free(got);
    }
    /* two ranks, hand-made: a = (1, 0), b = (1, 1): a.b = 1, |a|^2 = 1, |b|^2 = 2, so
     * 0.5 a + 0.75 b = (1.25, 0.75) */
    if (n == 2) {
        double v[2] = {1, rank == 0 ? 0 : 1}, out[2];
        KT_OK(kolo_allreduce(v, out, 2, KOLO_FLOAT64, KOLO_ADASUM, 1, 1, KOLO_WORLD));
        KT_ASSERTF(out[0] == 1.25 && out[1] == 0.75, "(1,0) adasum (1,1) = (%g, %g), expected (1.25, 0.75)", out[0], out[1]);
    }
}

KT_TEST(adasum_exact_properties, 120)
{
    for (int n = 2; n <= 4; n++) both_algorithms(n, exact_cases);
}

static void engine_cases(int rank, void *arg)
{
    (void)arg;
    KT_OK(kolo_init());
    int n = kolo_size();
    /* a group of three tensors: the two small ones run as one fused collective, the one above
     * 256 KiB alone on its buffers (execute.c); each is its own vector */
    enum { NT = 3 };
    size_t counts[NT] = {5, 70000, 3000}, start[NT + 1] = {0};
    for (int t = 0; t < NT; t++) start[t + 1] = start[t] + counts[t];
    float *in = malloc(start[NT] * sizeof(float)), *out = malloc(start[NT] * sizeof(float));
    kt_fill(in, start[NT], KOLO_FLOAT32, 500u + (unsigned)rank);
    /* scale tensor 1 per rank, so that whole-buffer coefficients would differ from per-tensor ones */
    for (size_t i = start[1]; i < start[2]; i++) in[i] *= (float)(rank + 1);
    const void *sends[NT];
    void *recvs[NT];
    kolo_shape_t shapes[NT];
    const char *names[NT] = {"ada.a", "ada.b", "ada.c"};
    for (int t = 0; t < NT; t++) {
        sends[t] = in + start[t];
        recvs[t] = out + start[t];
        shapes[t] = (kolo_shape_t){1, {(int64_t)counts[t]}};
    }
    kolo_engine_stats_t before, after;
    KT_OK(kolo_engine_stats(&before));
    kolo_request_t *reqs[NT];
    KT_OK(kolo_igrouped_allreduce(NT, names, sends, recvs, KOLO_FLOAT32, shapes, KOLO_ADASUM, 1, 1, NULL, reqs));
    for (int t = 0; t < NT; t++) {
        KT_OK(kolo_request_wait(reqs[t], WAIT_S));
        kolo_request_release(reqs[t]);
    }
    KT_OK(kolo_engine_stats(&after));
    KT_ASSERT(after.fused_collectives > before.fused_collectives);
    /* the reference, with tensor 1 scaled as above */
    double *x[64];
    for (int r = 0; r < n; r++) {
        x[r] = malloc(start[NT] * sizeof(double));
        float *tmp = malloc(start[NT] * sizeof(float));
        kt_fill(tmp, start[NT], KOLO_FLOAT32, 500u + (unsigned)r);
        for (size_t i = 0; i < start[NT]; i++) x[r][i] = (double)tmp[i] * (start[1] <= i && i < start[2] ? r + 1 : 1);
        free(tmp);
    }
    double *whole[64];
    size_t one[2] = {0, start[NT]};
    for (int r = 0; r < n; r++) {
        whole[r] = malloc(start[NT] * sizeof(double));
        memcpy(whole[r], x[r], start[NT] * sizeof(double));
    }
    kt_adasum_tree(x, n, start, NT);
    kt_adasum_tree(whole, n, one, 1);
    double worst = 0, apart = 0;
    for (size_t i = 0; i < start[NT]; i++) {
        worst = fmax(worst, fabs(out[i] - x[0][i]) / fmax(1, fabs(x[0][i])));
        apart = fmax(apart, fabs(whole[0][i] - x[0][i]));
    }
    KT_ASSERTF(worst < 1e-5, "fused adasum on %d ranks is off the per-tensor reference by %g", n, worst);
    if (n > 1) KT_ASSERTF(apart > 1e-3, "the test does not tell per-tensor from whole-buffer adasum (%g)", apart);
    check_same_everywhere(out, start[NT] * sizeof(float), n, KOLO_WORLD);
    for (int r = 0; r < n; r++) {
        free(x[r]);
        free(whole[r]);
    }

    /* one float16 tensor with scale factors */
    uint16_t h[777], hout[777];
    kt_fill(h, 777, KOLO_FLOAT16, 40u + (unsigned)rank);
    kolo_shape_t sh = {2, {7, 111}};
    kolo_request_t *r1;
    KT_OK(kolo_iallreduce("ada.half", h, hout, KOLO_FLOAT16, &sh, KOLO_ADASUM, 2.0, 0.25, NULL, &r1));
    KT_OK(kolo_request_wait(r1, WAIT_S));
    kolo_request_release(r1);
    size_t hs[2] = {0, 777};
    check_against_tree(hout, n, 40u, hs, 1, KOLO_FLOAT16, 2.0, 0.25, "engine float16");

    /* a joined rank contributes zeros, which adasum leaves out */
    if (n >= 2) {
        float v[64], w[64];
        kt_fill(v, 64, KOLO_FLOAT32, 70u + (unsigned)rank);
        kolo_request_t *j, *r2 = NULL;
        kolo_shape_t s64 = {1, {64}};
        if (rank == n - 1) {
            KT_OK(kolo_ijoin(NULL, &j));
        } else {
            KT_OK(kolo_iallreduce("ada.joined", v, w, KOLO_FLOAT32, &s64, KOLO_ADASUM, 1, 1, NULL, &r2));
            KT_OK(kolo_request_wait(r2, WAIT_S));
            kolo_request_release(r2);
            KT_OK(kolo_ijoin(NULL, &j));
            size_t s[2] = {0, 64};
            check_against_tree(w, n - 1, 70u, s, 1, KOLO_FLOAT32, 1, 1, "with the last rank joined");
        }
        KT_OK(kolo_request_wait(j, WAIT_S));
        kolo_request_release(j);
    }
    free(in);
    free(out);
}

KT_TEST(adasum_engine_fuses_per_tensor, 180)
{
    both_algorithms(2, engine_cases);
    both_algorithms(3, engine_cases);
}

/* The kernels' AVX2 build and their plain one give the same bits (adasum.c), so ranks on hosts
 * with different vector units still agree: the same job, each size once with the kernels this
 * CPU picks and once with the plain ones. */
static void isa_cases(int rank, void *arg)
{
    (void)arg;
    KT_OK(kolo_init());
    static const size_t counts[] = {1003, 40001};
    static const kolo_dtype_t types[] = {KOLO_FLOAT32, KOLO_FLOAT64};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < 2; ci++) {
            size_t count = counts[ci], bytes = count * kolo_dtype_size(types[ti]);
            char *in = malloc(bytes), *own = malloc(bytes), *best = malloc(bytes), *plain = malloc(bytes);
            /* vectors that nearly agree, so that the coefficients (about 1/2) depend on the dot
             * products' last bits; not small integers, so that rounding shows */
            kt_fill(in, count, types[ti], 300u);
            kt_fill(own, count, types[ti], 400u + (unsigned)rank);
            for (size_t i = 0; i < count; i++) {
                double f = 1.0 + 0.1234567 * (double)(i % 7);
                if (types[ti] == KOLO_FLOAT32) {
                    float *x = (float *)(void *)in, *y = (float *)(void *)own;
                    x[i] = (float)(((double)x[i] + 0.01 * (double)y[i]) * f);
                } else {
                    double *x = (double *)(void *)in, *y = (double *)(void *)own;
                    x[i] = (x[i] + 0.01 * y[i]) * f;
                }
            }
            KT_ASSERT(kolo__reduce_set_isa(NULL));
            const char *isa = kolo__reduce_isa();
            KT_OK(kolo_allreduce(in, best, count, types[ti], KOLO_ADASUM, 1, 1, KOLO_WORLD));
            KT_ASSERT(kolo__reduce_set_isa("generic"));
            KT_OK(kolo_allreduce(in, plain, count, types[ti], KOLO_ADASUM, 1, 1, KOLO_WORLD));
            KT_ASSERTF(memcmp(best, plain, bytes) == 0, "%s x %zu: the %s kernels and the generic ones differ",
                       kolo_dtype_name(types[ti]), count, isa);
            free(in);
            free(own);
            free(best);
            free(plain);
        }
    KT_ASSERT(kolo__reduce_set_isa(NULL));
}

KT_TEST(adasum_kernels_agree_across_isas, 60) { KT_EQ(kt_job(3, isa_cases, NULL, NULL, NULL), 0); }

static void error_cases(int rank, void *arg)
{
    (void)arg;
    KT_OK(kolo_init());
    int32_t iv[4] = {1, 2, 3, 4}, io[4];
    float fv[4] = {1, 2, 3, 4}, fo[4];
    KT_STATUS(kolo_allreduce(iv, io, 4, KOLO_INT32, KOLO_ADASUM, 1, 1, KOLO_WORLD), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), "op adasum is not defined for dtype int32");
    KT_STATUS(kolo_reducescatter(fv, fo, 4, 1, KOLO_FLOAT32, KOLO_ADASUM, 1, 1, KOLO_WORLD), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), "allreduce only");
    kolo_shape_t sh = {1, {4}};
    kolo_request_t *r;
    KT_STATUS(kolo_iallreduce("bad.int", iv, io, KOLO_INT32, &sh, KOLO_ADASUM, 1, 1, NULL, &r), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), "op adasum is not defined for dtype int32");
    KT_STATUS(kolo_ireducescatter("bad.rs", fv, KOLO_FLOAT32, &sh, KOLO_ADASUM, 1, 1, NULL, &r), KOLO_ERR_INVALID_ARG);
    KT_CONTAINS(kolo_last_error(), "allreduce only");
    KT_EQ(strcmp(kolo_op_name(KOLO_ADASUM), "adasum"), 0);
    /* ranks that disagree on the op: a mismatch on both, naming it */
    KT_OK(kolo_iallreduce("op.differs", fv, fo, KOLO_FLOAT32, &sh, rank == 0 ? KOLO_ADASUM : KOLO_SUM, 1, 1, NULL, &r));
    KT_STATUS(kolo_request_wait(r, WAIT_S), KOLO_ERR_MISMATCH);
    KT_CONTAINS(kolo_request_error(r), "adasum");
    kolo_request_release(r);
    /* and the job goes on */
    KT_OK(kolo_allreduce(fv, fo, 4, KOLO_FLOAT32, KOLO_ADASUM, 1, 1, KOLO_WORLD));
    KT_ASSERT(fo[0] == 1 && fo[3] == 4);
}

KT_TEST(adasum_errors, 60) { KT_EQ(kt_job(2, error_cases, NULL, NULL, NULL), 0); }
