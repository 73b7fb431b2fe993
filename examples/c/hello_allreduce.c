/* hello_allreduce.c - the smallest kolo program: every rank contributes its rank, all get the average.
 *
 *   cc hello_allreduce.c $(pkg-config --cflags --libs kolo) -o hello_allreduce
 *   kolorun -np 4 ./hello_allreduce
 */
#include <kolo.h>
#include <stdio.h>

int main(void)
{
    if (kolo_init() != KOLO_OK) {
        fprintf(stderr, "kolo_init: %s\n", kolo_last_error());
        return 1;
    }
    double v[2] = {kolo_rank(), 1.0};
    if (kolo_allreduce(v, v, 2, KOLO_FLOAT64, KOLO_AVERAGE, 1.0, 1.0, KOLO_WORLD) != KOLO_OK) {
        fprintf(stderr, "rank %d: %s\n", kolo_rank(), kolo_last_error());
        return 1;
    }
    printf("rank %d of %d: mean rank %.1f, mean one %.1f\n", kolo_rank(), kolo_size(), v[0], v[1]);
    kolo_shutdown();
    return 0;
}
