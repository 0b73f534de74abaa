#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void veil_ntt_table(uint64_t *tab, const uint64_t *w, const uint64_t *winv, int64_t n, uint64_t q, uint64_t lo, uint64_t hi);
void veil_ntt_rows(int64_t *out, const int64_t *x, int64_t x_stride, int64_t rows, int64_t limbs, int64_t n,
                   const uint64_t *qs, const uint64_t *const *tabs, int inverse, int bcast, const int64_t *same, int centre);
int main(int argc, char **argv) {
    const int64_t n = 16384; const int inverse = atoi(argv[1]); const int wide = atoi(argv[2]); const int reps = atoi(argv[3]);
    uint64_t q = wide ? 144115188075855873ULL /* not used for math validity */ : 68719403009ULL;
    /* arbitrary twiddles < q: timing only */
    uint64_t *w = malloc(n * 8), *wi = malloc(n * 8), *tab = malloc((6 * n + 6) * 8);
    for (int64_t i = 0; i < n; i++) { w[i] = (i * 2654435761ULL) % q; wi[i] = (i * 40503ULL + 7) % q; }
    veil_ntt_table(tab, w, wi, n, q, 3, 5);
    int64_t rows = 64; int64_t *x = malloc(rows * n * 8), *out = malloc(rows * n * 8);
    for (int64_t i = 0; i < rows * n; i++) x[i] = (i * 11400714819323198485ULL) % q;
    const uint64_t *tabs[1] = {tab}; uint64_t qs[1] = {q};
    struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < reps; r++) veil_ntt_rows(out, x, n, rows, 1, n, qs, tabs, inverse, 0, NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%s %s: %.1f us per limb\n", inverse ? "inv" : "fwd", wide ? "wide" : "ifma",
           ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / reps / rows);
    return (int)out[5] & 0;
}
