/* bench_mem.h - benchmark buffers backed by transparent huge pages, for kolo-bench --mem thp and
 * the MPI peers' benchmark (-H 1), so that both can be measured on the memory a framework hands
 * them when it asks the kernel for huge pages: NumPy does for arrays from 4 MiB (Linux 4.6 on),
 * PyTorch 2.2 and later for CPU tensors from 2 MiB when THP_MEM_ALLOC_ENABLE is set.
 *
 * A single-copy read (process_vm_readv) pins and copies the other process's pages one at a time,
 * so 2 MiB pages mean 512 times fewer to look up and pin. Whether the kernel gives them depends on
 * /sys/kernel/mm/transparent_hugepage/enabled ("always" or "madvise" here; "never" refuses) and
 * on finding free 2 MiB frames, so the benchmarks print how much of their memory it did back with
 * them (AnonHugePages). Header-only, like perf_ctl.h. */
#ifndef KOLO_BENCH_MEM_H
#define KOLO_BENCH_MEM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BENCH_HUGE ((size_t)2 << 20)

/* n bytes (rounded up to whole 2 MiB pages), 2 MiB-aligned, marked for huge pages before their
 * first touch (which is when the kernel picks the page size); NULL when out of memory. */
static void *bench_alloc_huge(size_t n)
{
    size_t len = (n + BENCH_HUGE - 1) / BENCH_HUGE * BENCH_HUGE;
    void *p = aligned_alloc(BENCH_HUGE, len ? len : BENCH_HUGE);
    if (p) (void)madvise(p, len, MADV_HUGEPAGE); /* only advice: a kernel that refuses it keeps 4 KiB pages */
    return p;
}

/* This process's anonymous memory in huge pages, in KiB; -1 when /proc does not say. */
static long bench_huge_kib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* The kernel's transparent-huge-page mode (the bracketed word of .../enabled) into buf, or "?". */
static const char *bench_thp_mode(char *buf, size_t cap)
{
    snprintf(buf, cap, "?");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return buf;
    char line[128];
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b) snprintf(buf, cap, "%.*s", (int)(b - a - 1), a + 1);
    }
    fclose(f);
    return buf;
}

/* The line both benchmarks print (rank 0) after touching their buffers: the kernel's THP mode and
 * how much of this process's memory it gave in huge pages. bench/compare.py reads it (HUGE_LINE),
 * and the Python peers print the same words (benchcommon.py, huge_line). `which` goes after
 * "buffers" (kolo-bench --vs mem: " of the thp side"). */
static void bench_huge_report(const char *which)
{
    char mode[32];
    long kib = bench_huge_kib();
    printf("# buffers%s in transparent huge pages, asked for with madvise (the kernel's mode: %s): ", which,
           bench_thp_mode(mode, sizeof mode));
    if (kib < 0)
        printf("how much it gave is unknown\n");
    else
        printf("%ld MiB of rank 0's memory is in them\n", kib >> 10);
}

#endif
