/* The register tile of the skinny projections (skinny_linear.c, dense weights; quant_linear.c,
 * GGUF blocks dequantized into L1 first): included, so each kernel inlines it. Both kernels run the
 * same tiles over the same K chunks in the same order, so on the same weight values they give the
 * same floats, bit for bit. */
#ifndef BATON_SKINNY_TILE_H
#define BATON_SKINNY_TILE_H
#include <omp.h>
#include <stdint.h>

#include "vec_math.h"

typedef float v16 __attribute__((vector_size(64), aligned(4))); /* (v8: vec_math.h) */

/* The tile: MB rows of x by NB weight rows, MB x NB accumulators of VL partial sums. AVX-512 has
 * 32 vector registers: 3 x 8 accumulators of 16 lanes, 3 rows of x and one weight vector fit. AVX2
 * has 16 of 8 lanes: the tile runs as two passes over K of 4 weight rows each, with 3 x 4
 * accumulators, 3 rows of x and a weight vector in registers, 7 loads for 12 FMAs (one row of x
 * against 8 weight rows in one pass loaded 9 vectors for 8 FMAs: the loads set the pace; 1.2-1.4x
 * slower on dense weights, 1.02-1.04x on GGUF blocks, on Zen 3). A single row of x still takes the
 * 8 weight rows in one pass (4 would leave 4 FMA chains, half the rate). NB = 8 lets the final lane
 * sums run as one shuffle tree per row (hsum8); each column's tree reads that column alone, so two
 * passes of 4 give the floats one pass of 8 gives. Other builds: baton_skinny_linear_tuned says 0,
 * and the kernels are not used. The lane count fixes the order of the additions, so results differ
 * in the last bits between an AVX-512 and an AVX2 build (each agrees with itself across the two
 * kernels). */
#if defined(__AVX512F__)
#define VL 16
#define MB 3
typedef v16 vacc;
#else
#define VL 8
#ifndef MB
#define MB 3 /* -DMB=1: one row of x, one pass of 8 weight rows (as before: A/B runs, bench/avx2_kernels.py) */
#endif
#if MB != 1 && MB != 3
#error "MB is 1 or 3 (any_tile has tiles of 1 row, or of 1 to 3)"
#endif
#define PASS_COLS 4 /* weight rows per pass over K */
typedef v8 vacc;
#endif
#define NB 8
/* K is taken in chunks of KC so that NB weight rows of a chunk (24 KiB) stay in L1 across the row
 * tiles (SmolLM2's down projection has K = 1536: 48 KiB per 8 rows, the whole L1). */
#ifndef KC
#define KC 768
#endif

/* Lane sums of eight vectors: r[j] = sum of a[j]'s 16 lanes, as a tree of shuffles and adds that
 * halves the lanes per column at each level (7 adds where eight separate sums take 32). */
static inline v8 hsum8x16(const v16 a[8]) {
    v16 b[4], c[2];
    for (int j = 0; j < 4; j++) /* b[j]: 8 lanes of column 2j, then 8 of column 2j+1 */
        b[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * j], a[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int j = 0; j < 2; j++) /* c[j]: 4 lanes each of columns 4j .. 4j+3 */
        c[j] = __builtin_shufflevector(b[2 * j], b[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * j], b[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    /* d: 2 lanes each of columns 0 .. 7 */
    const v16 d = __builtin_shufflevector(c[0], c[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                  __builtin_shufflevector(c[0], c[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(d, d, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(d, d, 1, 3, 5, 7, 9, 11, 13, 15);
}

#if VL == 16
#define hsum8 hsum8x16
#else
#define hsum8 hsum8x8
#endif

/* acc += x * w. On AVX2 an explicit FMA: left to the compiler, a Zen tuning (avoid-fma-max-bits)
 * made a one-column tile a multiply and an add while wider ones fused, a choice made per file that
 * the two kernels' bit-for-bit agreement should not rest on. The AVX-512 build is as it was. */
#if VL == 8 && defined(__FMA__)
#include <immintrin.h>
#define MULADD(acc, x, w) ((acc) = (vacc)_mm256_fmadd_ps((__m256)(x), (__m256)(w), (__m256)(acc)))
#else
#define MULADD(acc, x, w) ((acc) += (x) * (w))
#endif

/* A tile's lane sums into out: the first chunk writes them (+ bias), later ones add them. */
static inline __attribute__((always_inline)) void tile_store(const int mb, const int nb, vacc acc[][NB],
                                                             const float *bias, int accumulate, float *out,
                                                             int64_t out_stride) {
    for (int i = 0; i < mb; i++) {
        const v8 sums = hsum8(acc[i]);
        for (int j = 0; j < nb; j++)
            out[i * out_stride + j] = sums[j] + (accumulate ? out[i * out_stride + j] : (bias ? bias[j] : 0.f));
    }
}

#if VL == 8
/* One pass of the AVX2 tile over the K chunk: weight rows [c0, c0 + nc) against mb rows of x, into
 * acc[.][c0 ..]; inlined with constant mb, nc. The next chunk's prefetches are spread over the
 * first pass (a second one starts K again, past them). */
static inline __attribute__((always_inline)) void tile_pass(
    const int mb, const int nc, const int c0, const float *x, int64_t x_stride, const float *w, int64_t w_stride,
    int kc, vacc acc[][NB], const float *next, int next_rows, int64_t next_stride, int *prefetch_line,
    int prefetch_end, int *prefetch_step, int shares) {
    vacc a[MB][NB];
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nc; j++) a[i][j] = (vacc){0};
    for (int k = 0; k < kc; k += VL) {
        vacc xv[MB];
        if (k == *prefetch_step && *prefetch_line < prefetch_end) {
            for (int j = 0; j < next_rows; j++) __builtin_prefetch(next + j * next_stride + 16 * *prefetch_line, 0, 1);
            ++*prefetch_line;
            *prefetch_step += 16 * shares;
        }
        for (int i = 0; i < mb; i++) {
            xv[i] = *(const vacc *)(x + i * x_stride + k);
#ifdef __AVX__
            if (mb > 1) __asm__("" : "+x"(xv[i])); /* loaded once, not folded into each FMA */
#endif
        }
        for (int j = 0; j < nc; j++) {
            vacc wv = *(const vacc *)(w + (c0 + j) * w_stride + k);
#ifdef __AVX__ /* (elsewhere "x" is a 16-byte register: the kernel is not used there, but it builds) */
            if (mb > 1) __asm__("" : "+x"(wv)); /* one load per weight vector, not one folded into each FMA */
#endif
            for (int i = 0; i < mb; i++) MULADD(a[i][j], xv[i], wv);
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nc; j++) acc[i][c0 + j] = a[i][j];
}
#endif

/* One tile over one K chunk [0, kc) of rows w_stride apart; inlined with constant mb, nb so the
 * accumulators stay in registers. Columns past nb are zero vectors in the reduction and are not
 * stored. The first chunk writes out (+ bias), later ones add to it. */
static inline __attribute__((always_inline)) void tile(
    const int mb, const int nb, const float *x, int64_t x_stride, const float *w, int64_t w_stride, int kc,
    const float *bias, int accumulate, float *out, int64_t out_stride, const float *next, int next_rows, int next_len,
    int share, int shares) {
    vacc acc[MB][NB];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NB; j++) acc[i][j] = (vacc){0};
    /* This tile's share of the next chunk: a contiguous run of each row's lines, one line every
     * `shares` steps of K (the tiles of a chunk together cover every line once). */
    const int lines = next_len / 16, run = (lines + shares - 1) / shares;
    int prefetch_line = next ? share * run : lines, prefetch_end = prefetch_line + run, prefetch_step = 0;
    if (prefetch_end > lines) prefetch_end = lines;
#if VL == 8
    if (mb == 1) /* one row of x: 8 weight rows in one pass (4 would leave 4 FMA chains, half the rate) */
        tile_pass(1, nb, 0, x, x_stride, w, w_stride, kc, acc, next, next_rows, w_stride, &prefetch_line,
                  prefetch_end, &prefetch_step, shares);
    else if (nb <= PASS_COLS)
        tile_pass(mb, nb, 0, x, x_stride, w, w_stride, kc, acc, next, next_rows, w_stride, &prefetch_line,
                  prefetch_end, &prefetch_step, shares);
    else {
        tile_pass(mb, PASS_COLS, 0, x, x_stride, w, w_stride, kc, acc, next, next_rows, w_stride, &prefetch_line,
                  prefetch_end, &prefetch_step, shares);
        tile_pass(mb, nb - PASS_COLS, PASS_COLS, x, x_stride, w, w_stride, kc, acc, next, next_rows, w_stride,
                  &prefetch_line, prefetch_end, &prefetch_step, shares);
    }
#else
    for (int k = 0; k < kc; k += VL) {
        vacc xv[MB];
        if (k == prefetch_step && prefetch_line < prefetch_end) {
            for (int j = 0; j < next_rows; j++) __builtin_prefetch(next + j * w_stride + 16 * prefetch_line, 0, 1);
            prefetch_line++;
            prefetch_step += 16 * shares;
        }
        for (int i = 0; i < mb; i++) xv[i] = *(const vacc *)(x + i * x_stride + k);
        for (int j = 0; j < nb; j++) {
            vacc wv = *(const vacc *)(w + j * w_stride + k);
            __asm__("" : "+v"(wv)); /* one load per weight vector, not one folded into each FMA */
            for (int i = 0; i < mb; i++) MULADD(acc[i][j], xv[i], wv);
        }
    }
#endif
    tile_store(mb, nb, acc, bias, accumulate, out, out_stride);
}

#define TILE_CASE(mb_, nb_) \
    case (mb_) * 16 + (nb_):                                                                             \
        tile(mb_, nb_, x, x_stride, w, w_stride, kc, bias, accumulate, out, out_stride, next, next_rows, next_len, \
             share, shares);                                                                              \
        return;
#define TILE_ROW(mb_) \
    TILE_CASE(mb_, 1) TILE_CASE(mb_, 2) TILE_CASE(mb_, 3) TILE_CASE(mb_, 4) \
    TILE_CASE(mb_, 5) TILE_CASE(mb_, 6) TILE_CASE(mb_, 7) TILE_CASE(mb_, 8)

static void any_tile(int mb, int nb, const float *x, int64_t x_stride, const float *w, int64_t w_stride, int kc,
                     const float *bias, int accumulate, float *out, int64_t out_stride, const float *next, int next_rows,
                     int next_len, int share, int shares) {
    switch (mb * 16 + nb) {
        TILE_ROW(1)
#if MB >= 3
        TILE_ROW(2) TILE_ROW(3)
#endif
    }
}

/* The tiles of one K chunk of NB (or fewer) weight rows: rows of x in tiles of near-equal size (4
 * rows: 2 + 2, not 3 + 1: a one-row tile does the same weight loads for a third of the multiplies).
 * ``next`` (or NULL) is the piece to load into L2 meanwhile: each tile prefetches an equal share of
 * its lines, so the memory stream runs all through the compute. */
static inline void chunk_tiles(int M, int nb, const float *x, int64_t x_stride, const float *w, int64_t w_stride,
                               int kc, const float *bias, int accumulate, float *out, int64_t out_stride,
                               const float *next, int next_rows, int next_len) {
    const int tiles = (M + MB - 1) / MB;
    for (int r = 0; r < tiles; r++) {
        const int m0 = (int)((int64_t)M * r / tiles), mb = (int)((int64_t)M * (r + 1) / tiles) - m0;
        any_tile(mb, nb, x + m0 * x_stride, x_stride, w, w_stride, kc, bias, accumulate, out + m0 * out_stride,
                 out_stride, next, next_rows, next_len, r, tiles);
    }
}
/* Threads for `groups` groups of NB weight rows: at most one a group, at least one. */
static inline int threads_for(int groups, int num_threads) {
    if (num_threads > groups) num_threads = groups;
    return num_threads < 1 ? 1 : num_threads;
}

/* The calling OpenMP thread's contiguous range [*g0, *g1) of the groups: each thread streams its
 * own part of the weight once. */
static inline void thread_groups(int groups, int *g0, int *g1) {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    *g0 = (int)((int64_t)groups * t / nt), *g1 = (int)((int64_t)groups * (t + 1) / nt);
}
#endif
