/* train_digits.c - data-parallel training from plain C: a small neural network learns to read
 * digits, every rank on its share of each batch, the gradients averaged by kolo's engine.
 *
 *   cc -O2 train_digits.c $(pkg-config --cflags --libs kolo) -lm -o train_digits
 *   kolorun -np 2 ./train_digits                 # or mpirun, srun, torchrun --no-python ...
 *   ./train_digits --help
 *
 * The digits are generated (no download): 16x16 grey images of seven-segment glyphs at a random
 * place, size and stroke, with a stray stroke now and then and pixel noise. Sample i depends only
 * on the seed and i, so each rank makes just the samples it needs and all ranks agree on them.
 * The network is a multilayer perceptron (256 inputs, one hidden layer of ReLUs, 10 outputs,
 * softmax and cross-entropy), trained by SGD with momentum.
 *
 * What makes it data-parallel is Horovod's recipe in C:
 *   1. every rank starts from rank 0's parameters (kolo_broadcast; each rank initialises its own
 *      differently on purpose, so a missing broadcast would show);
 *   2. each global batch of --batch samples is split among the ranks; each computes the mean
 *      gradient over its share;
 *   3. the gradients are averaged across the ranks by named asynchronous allreduces
 *      (kolo_iallreduce), submitted as back-propagation produces them, the output layer's first:
 *      kolo's engine negotiates them, fuses them into one collective and runs it while this rank
 *      goes on computing the first layer's gradients;
 *   4. every rank applies the same averaged gradient, so the models stay identical.
 * Because the shares are equal, the average of the ranks' means is the whole batch's mean: the
 * job follows the same path as one process training on whole batches, only sooner. At the end
 * every rank checks that all ranks hold bit-identical parameters.
 *
 * Exit status: 0; 1 on an error (named on stderr); 2 for bad arguments; 3 when the final test
 * accuracy is below --min-accuracy. */
#include <kolo.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIDE 16
#define IN (SIDE * SIDE)
#define OUT 10

typedef struct options {
    int epochs, batch, hidden, train, test;
    double lr, momentum, min_accuracy;
    uint64_t seed;
} options;

/* The parameters (or their gradients, or the momentum): w1 [hidden][IN], b1 [hidden], w2
 * [OUT][hidden], b2 [OUT], one after another in one allocation. */
typedef struct params {
    float *w1, *b1, *w2, *b2;
    size_t count;
    int hidden;
} params;

static int params_alloc(params *p, int hidden)
{
    size_t n1 = (size_t)hidden * IN, n2 = (size_t)OUT * (size_t)hidden;
    p->count = n1 + (size_t)hidden + n2 + OUT;
    p->hidden = hidden;
    p->w1 = calloc(p->count, sizeof(float));
    if (!p->w1) return -1;
    p->b1 = p->w1 + n1;
    p->w2 = p->b1 + hidden;
    p->b2 = p->w2 + n2;
    return 0;
}

/* ---- random numbers: splitmix64, one stream per sample ---- */

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(mix(s) >> 11) * (1.0 / 9007199254740992.0); }

static int below(uint64_t *s, int n) { return (int)(uniform(s) * n); }

/* ---- the digits ---- */

/* Segments a..g of a seven-segment glyph in a box 1 wide and 2 high: x0 y0 x1 y1. */
static const float SEG[7][4] = {{0, 0, 1, 0}, {1, 0, 1, 1}, {1, 1, 1, 2}, {0, 2, 1, 2},
                                {0, 1, 0, 2}, {0, 0, 0, 1}, {0, 1, 1, 1}};
static const char *const DIGIT[10] = {"abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg",
                                      "abcdfg"};

static void stroke(float *img, double x0, double y0, double x1, double y1, int width)
{
    for (int k = 0; k <= 24; k++) {
        double t = k / 24.0, x = x0 + (x1 - x0) * t, y = y0 + (y1 - y0) * t;
        for (int dy = 0; dy < width; dy++)
            for (int dx = 0; dx < width; dx++) {
                int px = (int)lround(x) + dx, py = (int)lround(y) + dy;
                if (px >= 0 && px < SIDE && py >= 0 && py < SIDE) img[py * SIDE + px] = 1.0f;
            }
    }
}

/* Sample i of the data set named by seed: its image into img, its label returned. */
static int make_sample(uint64_t seed, uint64_t i, float *img)
{
    uint64_t s = seed * 0x100000001b3ull ^ (i + 1) * 0xd6e8feb86659fd93ull;
    int label = below(&s, 10), width = 1 + below(&s, 2);
    double w = 4 + uniform(&s) * 4, h = 4.5 + uniform(&s) * 2.5; /* half the glyph's height */
    double x = 1 + uniform(&s) * (SIDE - 3 - w), y = 0.5 + uniform(&s) * (SIDE - 2.5 - 2 * h);
    double slant = (uniform(&s) - 0.5) * 0.5;
    memset(img, 0, IN * sizeof(float));
    for (const char *c = DIGIT[label]; *c; c++) {
        const float *g = SEG[*c - 'a'];
        stroke(img, x + g[0] * w + (2 - g[1]) * h * slant, y + g[1] * h, x + g[2] * w + (2 - g[3]) * h * slant,
               y + g[3] * h, width);
    }
    if (below(&s, 4) == 0) /* a stray stroke */
        stroke(img, uniform(&s) * SIDE, uniform(&s) * SIDE, uniform(&s) * SIDE, uniform(&s) * SIDE, 1);
    for (int p = 0; p < IN; p++) img[p] = (float)(img[p] * (0.7 + 0.3 * uniform(&s)) + 0.25 * uniform(&s));
    return label;
}

/* ---- the network ---- */

/* Forward pass of one image: hidden activations into h, probabilities into prob; the loss. */
static double forward(const params *p, const float *x, int label, float *h, float *prob)
{
    int H = p->hidden;
    for (int j = 0; j < H; j++) {
        const float *w = p->w1 + (size_t)j * IN;
        float a = p->b1[j];
        for (int k = 0; k < IN; k++) a += w[k] * x[k];
        h[j] = a > 0 ? a : 0;
    }
    float top = -INFINITY;
    for (int o = 0; o < OUT; o++) {
        const float *w = p->w2 + (size_t)o * H;
        float a = p->b2[o];
        for (int j = 0; j < H; j++) a += w[j] * h[j];
        prob[o] = a;
        top = a > top ? a : top;
    }
    double sum = 0;
    for (int o = 0; o < OUT; o++) sum += prob[o] = expf(prob[o] - top);
    for (int o = 0; o < OUT; o++) prob[o] = (float)(prob[o] / sum);
    return -log(fmax(prob[label], 1e-30));
}

static int argmax(const float *v)
{
    int best = 0;
    for (int o = 1; o < OUT; o++)
        if (v[o] > v[best]) best = o;
    return best;
}

/* The gradients are averaged as soon as each layer's are complete: the output layer's are
 * submitted while the first layer's are still being computed (kolo_iallreduce returns at once;
 * the engine fuses the requests of one cycle into one collective). */
typedef struct averaging {
    kolo_request_t *req[4];
    int n;
} averaging;

static int submit(averaging *a, const char *name, float *grad, int rows, int cols)
{
    kolo_shape_t shape = {.ndim = 2, .dims = {rows, cols}};
    int st = kolo_iallreduce(name, grad, grad, KOLO_FLOAT32, &shape, KOLO_AVERAGE, 1.0, 1.0, NULL, &a->req[a->n]);
    if (st == KOLO_OK) a->n++;
    else fprintf(stderr, "train_digits: rank %d: averaging %s: %s\n", kolo_rank(), name, kolo_last_error());
    return st;
}

static int finish(averaging *a)
{
    int bad = KOLO_OK;
    for (int i = 0; i < a->n; i++) {
        int st = kolo_request_wait(a->req[i], -1);
        if (st != KOLO_OK && bad == KOLO_OK) {
            fprintf(stderr, "train_digits: rank %d: %s\n", kolo_rank(), kolo_request_error(a->req[i]));
            bad = st;
        }
        kolo_request_release(a->req[i]);
    }
    a->n = 0;
    return bad;
}

/* One step on this rank's share (xs, ys: n samples) of a global batch: the mean gradient over the
 * share into g, averaged across the ranks; the share's summed loss into *loss. d1: room for n
 * hidden layers' activations and n output gradients. */
static int step_gradients(const params *p, params *g, const float *xs, const int *ys, int n, float *d1,
                          double *loss)
{
    int H = p->hidden;
    float prob[OUT];
    memset(g->w1, 0, g->count * sizeof(float));
    *loss = 0;
    /* output layer first, as back-propagation goes */
    float *hs = d1; /* [n][H]: hidden activations, then their gradients */
    float *ds = d1 + (size_t)n * H;
    for (int i = 0; i < n; i++) {
        const float *x = xs + (size_t)i * IN;
        float *hi = hs + (size_t)i * H, *di = ds + (size_t)i * OUT;
        *loss += forward(p, x, ys[i], hi, prob);
        for (int o = 0; o < OUT; o++) di[o] = (prob[o] - (o == ys[i])) / (float)n; /* dloss/dlogit, mean */
        for (int o = 0; o < OUT; o++) {
            float *gw = g->w2 + (size_t)o * H;
            for (int j = 0; j < H; j++) gw[j] += di[o] * hi[j];
            g->b2[o] += di[o];
        }
    }
    averaging a = {.n = 0};
    if (submit(&a, "grad.w2", g->w2, OUT, H) != KOLO_OK || submit(&a, "grad.b2", g->b2, 1, OUT) != KOLO_OK) {
        finish(&a);
        return 1;
    }
    /* the first layer's while the engine averages the second's */
    for (int i = 0; i < n; i++) {
        const float *x = xs + (size_t)i * IN, *di = ds + (size_t)i * OUT;
        float *hi = hs + (size_t)i * H;
        for (int j = 0; j < H; j++) {
            if (hi[j] <= 0) continue; /* ReLU passes no gradient */
            float dh = 0;
            for (int o = 0; o < OUT; o++) dh += p->w2[(size_t)o * H + j] * di[o];
            float *gw = g->w1 + (size_t)j * IN;
            for (int k = 0; k < IN; k++) gw[k] += dh * x[k];
            g->b1[j] += dh;
        }
    }
    if (submit(&a, "grad.w1", g->w1, H, IN) != KOLO_OK || submit(&a, "grad.b1", g->b1, 1, H) != KOLO_OK) {
        finish(&a);
        return 1;
    }
    return finish(&a) == KOLO_OK ? 0 : 1;
}

/* ---- the program ---- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int usage(FILE *f)
{
    fprintf(f, "usage: train_digits [--epochs N] [--batch N] [--lr X] [--momentum X] [--hidden N] [--train N]\n"
               "                    [--test N] [--seed N] [--min-accuracy X]\n"
               "  --batch is the global batch (default 128), split evenly among the ranks: a multiple of\n"
               "  their number. --min-accuracy (0 to 1): exit 3 if the final test accuracy is below it.\n");
    return 2;
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.epochs = 4, .batch = 128, .hidden = 64, .train = 16000, .test = 2000, .lr = 0.05,
                   .momentum = 0.9, .min_accuracy = 0, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!v) return usage(stderr);
        double x = strtod(v, &end);
        if (end == v || *end || !(fabs(x) < 1e9)) {
            fprintf(stderr, "train_digits: %s wants a number (below 1e9), not '%s'\n", a, v);
            return 2;
        }
        i++;
        if (!strcmp(a, "--epochs")) o->epochs = (int)x;
        else if (!strcmp(a, "--batch")) o->batch = (int)x;
        else if (!strcmp(a, "--lr")) o->lr = x;
        else if (!strcmp(a, "--momentum")) o->momentum = x;
        else if (!strcmp(a, "--hidden")) o->hidden = (int)x;
        else if (!strcmp(a, "--train")) o->train = (int)x;
        else if (!strcmp(a, "--test")) o->test = (int)x;
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)x;
        else if (!strcmp(a, "--min-accuracy")) o->min_accuracy = x;
        else return usage(stderr);
    }
    if (o->epochs < 1 || o->batch < 1 || o->hidden < 1 || o->hidden > 4096 || o->train < o->batch || o->test < 1 ||
        o->lr <= 0 || o->momentum < 0 || o->momentum >= 1) {
        fprintf(stderr, "train_digits: need epochs, batch, hidden (up to 4096), test >= 1, train >= batch, lr > 0, "
                        "0 <= momentum < 1\n");
        return 2;
    }
    return 0;
}

/* FNV-1a over the parameters' bytes: equal on every rank when the models are identical. */
static int64_t checksum(const params *p)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)p->w1;
    for (size_t i = 0; i < p->count * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return (int64_t)(h >> 1);
}

/* Test accuracy and mean loss over the test samples, each rank taking every size-th. */
static int evaluate(const params *p, const options *o, float *x, float *h, double *acc, double *loss)
{
    int me = kolo_rank(), n = kolo_size();
    float prob[OUT];
    double mine[3] = {0, 0, 0}, all[3];
    for (int i = me; i < o->test; i += n) {
        int y = make_sample(o->seed, (uint64_t)o->train + (uint64_t)i, x);
        mine[1] += forward(p, x, y, h, prob);
        mine[0] += argmax(prob) == y;
        mine[2] += 1;
    }
    if (kolo_allreduce(mine, all, 3, KOLO_FLOAT64, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK) return 1;
    *acc = all[0] / all[2];
    *loss = all[1] / all[2];
    return 0;
}

static int fail(const char *what)
{
    fprintf(stderr, "train_digits: rank %d: %s: %s\n", kolo_rank(), what, kolo_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    options o;
    int bad = parse(argc, argv, &o);
    if (bad) return bad;
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "train_digits: kolo_init: %s\n", kolo_last_error());
        return 1;
    }
    int me = kolo_rank(), n = kolo_size();
    if (o.batch % n != 0) {
        if (me == 0)
            fprintf(stderr, "train_digits: --batch %d does not split evenly among %d ranks: use a multiple of %d\n",
                    o.batch, n, n);
        kolo_shutdown();
        return 2;
    }
    int share = o.batch / n, H = o.hidden;
    params p, g, v;
    float *xs = malloc((size_t)share * IN * sizeof(float)), *work = malloc((size_t)share * (size_t)(H + OUT) * sizeof(float));
    float *h = malloc((size_t)H * sizeof(float));
    int *ys = malloc((size_t)share * sizeof(int)), *order = malloc((size_t)o.train * sizeof(int));
    if (params_alloc(&p, H) || params_alloc(&g, H) || params_alloc(&v, H) || !xs || !work || !h || !ys || !order) {
        fprintf(stderr, "train_digits: rank %d: out of memory\n", me);
        return 1;
    }
    /* 1. rank 0's initial parameters everywhere (He initialisation, this rank's own seed first) */
    uint64_t s = o.seed * 7919 + (uint64_t)me + 1;
    for (size_t i = 0; i < (size_t)H * IN; i++) p.w1[i] = (float)((uniform(&s) * 2 - 1) * sqrt(6.0 / IN));
    for (size_t i = 0; i < (size_t)OUT * H; i++) p.w2[i] = (float)((uniform(&s) * 2 - 1) * sqrt(6.0 / H));
    if (kolo_broadcast(p.w1, p.count, KOLO_FLOAT32, 0, KOLO_WORLD) != KOLO_OK) return fail("kolo_broadcast");
    if (me == 0)
        printf("train_digits: %d rank(s), %d training and %d test digits of %dx%d, batch %d (%d a rank), "
               "MLP %d-%d-%d (%zu parameters), %d epoch(s)\n",
               n, o.train, o.test, SIDE, SIDE, o.batch, share, IN, H, OUT, p.count, o.epochs);
    double acc = 0, tloss = 0, total_time = 0;
    long long samples = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        /* the same shuffle on every rank */
        uint64_t es = o.seed * 1000003 + (uint64_t)epoch;
        for (int i = 0; i < o.train; i++) order[i] = i;
        for (int i = o.train - 1; i > 0; i--) {
            int j = below(&es, i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double t0 = now_s(), loss_sum = 0;
        int steps = o.train / o.batch;
        for (int b = 0; b < steps; b++) {
            /* 2. this rank's share of the global batch */
            for (int i = 0; i < share; i++)
                ys[i] = make_sample(o.seed, (uint64_t)order[b * o.batch + me * share + i], xs + (size_t)i * IN);
            double loss = 0;
            /* 3. the share's mean gradient, averaged across the ranks as it is produced */
            if (step_gradients(&p, &g, xs, ys, share, work, &loss)) return 1;
            loss_sum += loss;
            /* 4. the same update on every rank */
            for (size_t i = 0; i < p.count; i++) {
                v.w1[i] = (float)o.momentum * v.w1[i] + g.w1[i];
                p.w1[i] -= (float)o.lr * v.w1[i];
            }
        }
        double mine[2] = {now_s() - t0, loss_sum}, all[2];
        if (kolo_allreduce(&mine[0], &all[0], 1, KOLO_FLOAT64, KOLO_MAX, 1, 1, KOLO_WORLD) != KOLO_OK ||
            kolo_allreduce(&mine[1], &all[1], 1, KOLO_FLOAT64, KOLO_SUM, 1, 1, KOLO_WORLD) != KOLO_OK)
            return fail("kolo_allreduce");
        total_time += all[0];
        samples += (long long)steps * o.batch;
        if (evaluate(&p, &o, xs, h, &acc, &tloss)) return fail("evaluating");
        if (me == 0)
            printf("epoch %d: training loss %.4f, test loss %.4f, test accuracy %.1f %%, %.0f samples/s\n", epoch,
                   all[1] / ((double)steps * o.batch), tloss, 100 * acc, (double)steps * o.batch / all[0]);
        fflush(stdout);
    }
    /* the models must be identical: every rank applied the same averaged gradients */
    int64_t sum = checksum(&p), lo = 0, hi = 0;
    if (kolo_allreduce(&sum, &lo, 1, KOLO_INT64, KOLO_MIN, 1, 1, KOLO_WORLD) != KOLO_OK ||
        kolo_allreduce(&sum, &hi, 1, KOLO_INT64, KOLO_MAX, 1, 1, KOLO_WORLD) != KOLO_OK)
        return fail("kolo_allreduce");
    int status = 0;
    if (lo != hi) {
        fprintf(stderr, "train_digits: rank %d: the ranks' parameters differ (checksums %llx to %llx)\n", me,
                (unsigned long long)lo, (unsigned long long)hi);
        status = 1;
    } else if (me == 0) {
        printf("parameters identical on all %d rank(s) (checksum %016llx); final test accuracy %.1f %%, loss "
               "%.6f; %.0f samples/s over %d epoch(s)\n",
               n, (unsigned long long)lo, 100 * acc, tloss, (double)samples / total_time, o.epochs);
    }
    if (status == 0 && acc < o.min_accuracy) {
        if (me == 0)
            fprintf(stderr, "train_digits: final test accuracy %.1f %% is below --min-accuracy %.1f %%\n", 100 * acc,
                    100 * o.min_accuracy);
        status = 3;
    }
    kolo_shutdown();
    free(p.w1);
    free(g.w1);
    free(v.w1);
    free(xs);
    free(work);
    free(h);
    free(ys);
    free(order);
    return status;
}
