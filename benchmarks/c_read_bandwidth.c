/* Independent read-bandwidth measurement for tern's probe (issue 3).
 *
 * Sums a double array (the decode roof: read-only traffic), the repetition loop inside
 * each thread's chunk, warm-up first, passes chosen so each timed run lasts >= min_time_s,
 * best and median of `repeats` runs. Bytes counted = array bytes x passes (GB = 1e9 B).
 *
 * Build: gcc -O3 -march=native -fopenmp c_read_bandwidth.c -o c_read_bandwidth
 *        (without -fopenmp it runs one thread; the `omp simd` pragma then is ignored and
 *         the reduction below still vectorizes because it keeps 8 x 8 independent lanes)
 * Run:   ./c_read_bandwidth WORKING_SET_BYTES [THREADS=1] [MIN_TIME_S=0.1] [REPEATS=5]
 * Prints one JSON object on stdout (GB/s of every run, best, median).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 64 /* 8 independent accumulators of 8 doubles: no add-latency bound */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double chunk_sum(const double *restrict a, long n, long passes) {
    /* the lane accumulators live across passes: the 64-lane horizontal sum happens once,
     * so small (L1-resident) chunks are not dominated by it */
    double acc[LANES], tail = 0.0;
    long nb = n / LANES * LANES;
    for (int j = 0; j < LANES; j++) acc[j] = 0.0;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < nb; i += LANES) {
#pragma omp simd
            for (int j = 0; j < LANES; j++) acc[j] += a[i + j];
        }
        for (long i = nb; i < n; i++) tail += a[i];
    }
    for (int j = 0; j < LANES; j++) tail += acc[j];
    return tail;
}

static double run(const double *a, long n, int threads, long passes) {
    double total = 0.0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static, 1)
#endif
    for (int t = 0; t < threads; t++) {
        /* chunks aligned to 8 doubles (one 64-byte line) */
        long per = (n / threads) / 8 * 8;
        long lo = t * per, hi = (t == threads - 1) ? n : lo + per;
        total += chunk_sum(a + lo, hi - lo, passes);
    }
    return total;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s WORKING_SET_BYTES [THREADS] [MIN_TIME_S] [REPEATS]\n", argv[0]);
        return 2;
    }
    long ws = atol(argv[1]);
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    double min_time = argc > 3 ? atof(argv[3]) : 0.1;
    int repeats = argc > 4 ? atoi(argv[4]) : 5;
    if (ws < 4096 || threads < 1 || min_time <= 0 || repeats < 1 || repeats > 1000) {
        fprintf(stderr, "bad arguments: working set >= 4096 bytes, threads >= 1, "
                        "min_time > 0, 1 <= repeats <= 1000\n");
        return 2;
    }
#ifndef _OPENMP
    threads = 1;
#endif
    long n = ws / 8;
    double *a = NULL;
    if (posix_memalign((void **)&a, 2 * 1024 * 1024, n * sizeof(double)) != 0) {
        fprintf(stderr, "cannot allocate %ld bytes\n", ws);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    madvise(a, n * sizeof(double), MADV_HUGEPAGE);
#endif
    for (long i = 0; i < n; i++) a[i] = (double)(i % 7); /* touch every page */

    /* warm-up and calibration: double the passes until a run lasts >= min_time / 8 */
    long passes = 1;
    double dt = 0.0, sink = 0.0;
    for (;;) {
        double t0 = now_s();
        sink += run(a, n, threads, passes);
        dt = now_s() - t0;
        if (dt >= min_time / 8) break;
        passes *= 2;
    }
    passes = (long)(passes * (1.1 * min_time / dt)) + 1;

    double *gbps = malloc(sizeof(double) * repeats);
    double *secs = malloc(sizeof(double) * repeats);
    for (int r = 0; r < repeats; r++) {
        /* a run shorter than min_time (the machine sped up) is redone with more passes */
        for (int attempt = 0; attempt < 8; attempt++) {
            double t0 = now_s();
            sink += run(a, n, threads, passes);
            secs[r] = now_s() - t0;
            gbps[r] = (double)n * 8.0 * passes / secs[r] / 1e9;
            if (secs[r] >= min_time) break;
            passes = (long)(passes * (1.1 * min_time / secs[r])) + 1;
        }
    }
    printf("{\"gbps_runs\": [");
    for (int r = 0; r < repeats; r++) printf("%s%.3f", r ? ", " : "", gbps[r]);
    printf("], ");
    double min_s = secs[0];
    for (int r = 1; r < repeats; r++) min_s = secs[r] < min_s ? secs[r] : min_s;
    qsort(gbps, repeats, sizeof(double), cmp);
    double median = repeats % 2 ? gbps[repeats / 2] : 0.5 * (gbps[repeats / 2 - 1] + gbps[repeats / 2]);
    printf("\"working_set_bytes\": %ld, \"threads\": %d, \"passes\": %ld, \"repeats\": %d, "
           "\"min_run_s\": %.4f, \"gbps_best\": %.3f, \"gbps_median\": %.3f, \"checksum\": %.6g}\n",
           n * 8, threads, passes, repeats, min_s, gbps[repeats - 1], median, sink);
    free(gbps);
    free(secs);
    free(a);
    return 0;
}
