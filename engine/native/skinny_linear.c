/* y = x @ w.T + bias for a few rows of x (a decode step's batch), reading the weight as stored.
 *
 * w is the dense [N, K] fp32 weight (row-major, as loaded); x is [M, K] with rows x_stride apart;
 * out is [M, N] with rows out_stride apart. With few rows the product is bound by reading w from
 * memory once, so the kernel is built around that stream: each thread takes a contiguous range of
 * weight rows, and for NB of them at a time runs every row tile of x against them while they sit
 * in L1, accumulating dot products along K in vector registers (an MB x NB tile of 16-float partial
 * sums, added across lanes once at the end). MKL's sgemm re-reads the weight once per row at 1-2
 * rows and repacks it on every call beyond; oneDNN's packed kernel streams it but reaches only
 * half the machine's multiply rate at 16-64 rows.
 *
 * Threads: the caller's OpenMP runtime (torch's libgomp, loaded first: build.py), num_threads at most.
 * Limits (the caller checks them: linear.py): K a multiple of 16.
 */
#include <omp.h>
#include <stdint.h>

#include "skinny_tile.h"

/* The tile's lanes where this build has the registers it was written for (16: AVX-512; 8: AVX2 with
 * FMA), else 0; skinny_linear.py uses the kernel only where it is not 0. */
int baton_skinny_linear_tuned(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 0;
#endif
}

/* Returns 0, or 1 for a shape the kernel does not take (the caller checked: a bug there). */
int baton_skinny_linear_f32(const float *x, int64_t x_stride, const float *w, const float *bias, float *out,
                            int64_t out_stride, int M, int N, int K, int num_threads) {
    if (K % 16 != 0 || M < 1 || N < 1) return 1;
    const int groups = (N + NB - 1) / NB, chunks = (K + KC - 1) / KC;
#pragma omp parallel num_threads(threads_for(groups, num_threads))
    {
        int g0, g1;
        thread_groups(groups, &g0, &g1);
        for (int g = g0; g < g1; g++) {
            const int n0 = g * NB, nb = N - n0 < NB ? N - n0 : NB;
            for (int c = 0; c < chunks; c++) {
                const int k0 = c * KC, kc = K - k0 < KC ? K - k0 : KC;
                /* The piece to load next: this group's next chunk, else the next group's first. */
                const float *next = 0;
                int next_rows = 0, next_len = 0;
                if (c + 1 < chunks) {
                    next = w + (int64_t)n0 * K + k0 + KC, next_rows = nb, next_len = K - k0 - KC < KC ? K - k0 - KC : KC;
                } else if (g + 1 < g1) {
                    next = w + (int64_t)(n0 + NB) * K, next_rows = N - n0 - NB < NB ? N - n0 - NB : NB;
                    next_len = K < KC ? K : KC;
                }
                chunk_tiles(M, nb, x + k0, x_stride, w + (int64_t)n0 * K + k0, K, kc, bias ? bias + n0 : 0, c > 0,
                            out + n0, out_stride, next, next_rows, next_len);
            }
        }
    }
    return 0;
}
