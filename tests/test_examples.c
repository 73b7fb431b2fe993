/* test_examples.c - the examples in examples/c, run as their headers say to run them.
 *
 * train_digits trains a small network data-parallel under kolorun; the test holds it to what its
 * header promises: it learns (the final test accuracy above a floor it exits non-zero below), the
 * ranks end with bit-identical parameters (it checks and says so), and splitting each batch
 * among 2 ranks follows the path of 1 process on whole batches (the final test loss the same to
 * within rounding: the average of equal shares' mean gradients is the batch's mean gradient). A
 * batch that does not split evenly is refused with the reason. */
#include "kt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *build_path(const char *rel, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", kt_build_dir(), rel);
    return buf;
}

/* The final test loss train_digits printed ("... loss X; ..."), or -1. */
static double final_loss(const char *out)
{
    const char *p = strstr(out, "parameters identical on all");
    if (!p || !(p = strstr(p, ", loss "))) return -1;
    return atof(p + 7);
}

static int run_train(kt_proc *p, int np, const char *batch)
{
    char kolorun[4096], prog[4096];
    build_path("bin/kolorun", kolorun, sizeof(kolorun));
    build_path("examples/train_digits", prog, sizeof(prog));
    const char *np_s = np == 2 ? "2" : "1";
    const char *with[] = {kolorun, "-np", np_s, prog, "--epochs", "2", "--train", "4000", "--test", "1000",
                          "--batch", batch, "--min-accuracy", "0.6", NULL};
    const char *alone[] = {prog, "--epochs", "2", "--train", "4000", "--test", "1000", "--batch", batch,
                           "--min-accuracy", "0.6", NULL};
    kt_proc_opts o = {.own_group = 1};
    kt_proc_start(p, np > 1 ? with : alone, &o);
    return kt_proc_finish(p, 240);
}

KT_TEST(example_c_trains_digits_data_parallel, 300)
{
    kt_proc one, two, odd;
    memset(&one, 0, sizeof(one));
    memset(&two, 0, sizeof(two));
    memset(&odd, 0, sizeof(odd));
    int rc2 = run_train(&two, 2, "64");
    KT_ASSERTF(rc2 == 0, "2 ranks: exit %d\n%s%s", rc2, two.obuf, two.ebuf);
    KT_CONTAINS(two.obuf, "parameters identical on all 2 rank(s)");
    KT_CONTAINS(two.obuf, "[0]<stdout>:epoch 2: training loss");
    int rc1 = run_train(&one, 1, "64");
    KT_ASSERTF(rc1 == 0, "1 rank: exit %d\n%s%s", rc1, one.obuf, one.ebuf);
    double l1 = final_loss(one.obuf), l2 = final_loss(two.obuf);
    KT_ASSERTF(l1 > 0 && l2 > 0 && l1 < 1.5, "final test losses %g and %g\n%s\n%s", l1, l2, one.obuf, two.obuf);
    KT_ASSERTF(l2 > l1 * 0.999 && l2 < l1 * 1.001, "1 rank ended at loss %.6f, 2 ranks at %.6f", l1, l2);
    /* 63 samples do not split between 2 ranks */
    int rc = run_train(&odd, 2, "63");
    KT_ASSERTF(rc == 2, "a batch of 63 on 2 ranks: exit %d\n%s", rc, odd.ebuf);
    KT_CONTAINS(odd.ebuf, "--batch 63 does not split evenly among 2 ranks");
    kt_proc_free(&one);
    kt_proc_free(&two);
    kt_proc_free(&odd);
}
