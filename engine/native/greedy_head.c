/* Greedy tokens from a Q8_0 head (the default SmolLM2's tied embedding) without computing every
 * logit in fp32: an int8 screen of the whole vocabulary with a proven error bound, then the exact
 * fp32 logits of the few tokens the bound cannot rule out.
 *
 * Why: a decode step's head is 49,152 x 576 multiply-adds a row, a fifth of the row's work, and a
 * greedy row needs only the index of its largest logit. The screen multiplies the file's int8
 * quants with the row quantized to int8 (AVX-512 VNNI: 64 multiply-adds an instruction against 16
 * for fp32 FMAs) and bounds, for every token, how far its screened logit A can be from the logit the
 * fp32 head computes, L. Only tokens whose bound reaches the best lower bound can be the argmax:
 * their L is computed as the fp32 head (quant_linear.c) computes it, by the same tile code over the
 * same dequantized floats in the same order, so the token is the one the fp32 head's argmax gives,
 * bit for bit, ties (first index) included.
 *
 * The bound, for token n with quants q (w = d * q, exact in fp32) and the row x:
 * - x is quantized per 32-element block b: s_b = max|x_b| / 127, xq = round(x / s_b) in [-127, 127];
 *   |x_i - s_b * xq_i| <= 0.5001 * s_b (the float rounding of s_b, 1 / s_b and x / s_b included).
 *   So |A_exact - E| <= sum_b 0.5001 * s_b * W1[n][b], W1 = |d_b| * sum_i |q_i|, E the real dot.
 * - A is sum_b d_b * s_b * I_b with I_b the exact integer dot; its float evaluation (B + 1 roundings
 *   in a chain) is within (B + 2) * u * sum_b |d_b s_b I_b| <= (B + 2) * u * 1.01 * max|x| * W1sum[n].
 * - The fp32 head's L is within K * u * 1.01 * max|x| * W1sum[n] of E (any order of K additions).
 * So M_n = sum_b 0.5001 s_b W1[n][b] + (K + B + 2) * u * 1.02 * max|x| * W1sum[n], taken 1.001x and
 * plus 4u|A_n| for the float arithmetic of the bound itself. Token n is a candidate when
 * A_n + M_n >= T = max_m (A_m - M_m): the argmax of L (and every token tying with it) always is.
 *
 * Layouts (greedy_head.py prepares them once): wu8 [N/16][K/4][16][4] = q + 128 (vpdpbusd takes
 * one unsigned operand: sum (q + 128) * xq = sum q * xq + 128 * sum xq, so each block's integer
 * accumulator starts at -128 * sum xq); d and w1 [N/16][B][16] floats; w1sum [N]; blocks: the Q8_0
 * rows as the file has them (fp16 d, 32 int8), for the exact logits.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "skinny_tile.h"

#define QK 32
#define Q8_0_BYTES 34
#define MR 4 /* rows of x a screening tile takes */
#define U 0x1p-24f

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define GREEDY_TUNED 1
#else
#define GREEDY_TUNED 0
#endif

int baton_greedy_head_tuned(void) { return GREEDY_TUNED; }

#if GREEDY_TUNED
/* The floats a Q8_0 block holds, d * q: exact in fp32 (11 by 8 significant bits), so the same floats
 * as quant_linear.c's dequantization whatever the instructions. */
static inline void q8_0_floats(const uint8_t *block, float *dst) {
    uint16_t h;
    memcpy(&h, block, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 2)));
    const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 18)));
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
}

/* One screening tile: mr rows of x against the 16 tokens of vector o; their screened logits' upper
 * bounds go to hi (row stride N) and each row's largest lower bound into lo_max. */
static inline __attribute__((always_inline)) void screen_tile(
    const int mr, int o, int B, int K, int N, const int8_t *xq, const float *s, const float *hs,
    const int32_t *init, const float *c, const uint8_t *wu8, const float *dvec, const float *w1,
    const float *w1sum, float *hi, float *lo_max) {
    __m512 f[MR], m[MR];
    for (int r = 0; r < mr; r++) f[r] = m[r] = _mm512_setzero_ps();
    const uint8_t *w = wu8 + (int64_t)o * (K / 4) * 64;
    for (int b = 0; b < B; b++) {
        __m512i acc[MR];
        for (int r = 0; r < mr; r++) acc[r] = _mm512_set1_epi32(init[r * B + b]);
        for (int j = 0; j < QK / 4; j++) {
            const __m512i wv = _mm512_loadu_si512((const void *)(w + (int64_t)(b * (QK / 4) + j) * 64));
            for (int r = 0; r < mr; r++) {
                int32_t four;
                memcpy(&four, xq + (int64_t)r * K + b * QK + 4 * j, 4);
                acc[r] = _mm512_dpbusd_epi32(acc[r], wv, _mm512_set1_epi32(four));
            }
        }
        const __m512 dv = _mm512_loadu_ps(dvec + ((int64_t)o * B + b) * 16);
        const __m512 wb = _mm512_loadu_ps(w1 + ((int64_t)o * B + b) * 16);
        for (int r = 0; r < mr; r++) {
            const __m512 g = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(s[r * B + b]));
            f[r] = _mm512_fmadd_ps(g, dv, f[r]);
            m[r] = _mm512_fmadd_ps(wb, _mm512_set1_ps(hs[r * B + b]), m[r]);
        }
    }
    const __m512 ws = _mm512_loadu_ps(w1sum + (int64_t)o * 16);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int r = 0; r < mr; r++) {
        __m512 bound = _mm512_fmadd_ps(ws, _mm512_set1_ps(c[r]), m[r]);
        bound = _mm512_fmadd_ps(_mm512_and_ps(f[r], abs_mask), _mm512_set1_ps(4 * U), _mm512_mul_ps(bound, _mm512_set1_ps(1.001f)));
        _mm512_storeu_ps(hi + (int64_t)r * N + (int64_t)o * 16, _mm512_add_ps(f[r], bound));
        const float lo = _mm512_reduce_max_ps(_mm512_sub_ps(f[r], bound));
        if (lo > lo_max[r]) lo_max[r] = lo;
    }
}

static void screen_any(int mr, int o, int B, int K, int N, const int8_t *xq, const float *s, const float *hs,
                       const int32_t *init, const float *c, const uint8_t *wu8, const float *dvec, const float *w1,
                       const float *w1sum, float *hi, float *lo_max) {
    switch (mr) {
    case 4: screen_tile(4, o, B, K, N, xq, s, hs, init, c, wu8, dvec, w1, w1sum, hi, lo_max); break;
    case 3: screen_tile(3, o, B, K, N, xq, s, hs, init, c, wu8, dvec, w1, w1sum, hi, lo_max); break;
    case 2: screen_tile(2, o, B, K, N, xq, s, hs, init, c, wu8, dvec, w1, w1sum, hi, lo_max); break;
    default: screen_tile(1, o, B, K, N, xq, s, hs, init, c, wu8, dvec, w1, w1sum, hi, lo_max);
    }
}

/* Row r's int8 copy and its per-block scales; 0 where the row is not finite (the caller then
 * computes every logit). */
static int quantize_row(const float *x, int K, int B, int8_t *xq, float *s, float *hs, int32_t *init, float *c) {
    float amax_row = 0.f;
    for (int b = 0; b < B; b++) {
        float amax = 0.f;
        for (int i = 0; i < QK; i++) {
            const float a = fabsf(x[b * QK + i]);
            if (!(a <= 3.0e38f)) return 0; /* NaN or infinite */
            amax = a > amax ? a : amax;
        }
        amax_row = amax > amax_row ? amax : amax_row;
        const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int i = 0; i < QK; i++) {
            long v = lrintf(x[b * QK + i] * inv);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            xq[b * QK + i] = (int8_t)v;
            sum += (int32_t)v;
        }
        s[b] = scale;
        hs[b] = 0.5001f * scale;
        init[b] = -128 * sum;
    }
    *c = (float)(K + B + 2) * U * 1.02f * amax_row;
    return 1;
}

/* Row r's exact logits of the candidate tokens ids[0 .. n), as quant_linear.c computes them (NB rows
 * of floats per K chunk in an L1 buffer, the same tiles), and the first of the largest. */
static int64_t exact_argmax(const float *x, const uint8_t *blocks, int K, const int32_t *ids, int n) {
    const int B = K / QK, chunks = (K + KC - 1) / KC;
    const int64_t row_bytes = (int64_t)B * Q8_0_BYTES;
    float buf[NB * KC] __attribute__((aligned(64)));
    float best = -INFINITY;
    int64_t best_id = ids[0];
    for (int g = 0; g < n; g += NB) {
        const int nb = n - g < NB ? n - g : NB;
        float out[NB];
        for (int ch = 0; ch < chunks; ch++) {
            const int k0 = ch * KC, kc = K - k0 < KC ? K - k0 : KC;
            for (int j = 0; j < nb; j++)
                for (int b = 0; b < kc / QK; b++)
                    q8_0_floats(blocks + ids[g + j] * row_bytes + (int64_t)(k0 / QK + b) * Q8_0_BYTES, buf + j * KC + b * QK);
            chunk_tiles(1, nb, x + k0, K, buf, KC, kc, 0, ch > 0, out, 0, 0, 0, 0);
        }
        for (int j = 0; j < nb; j++) {
            if (out[j] != out[j]) return -1; /* NaN: argmax's rules for it are the full head's business */
            if (out[j] > best) best = out[j], best_id = ids[g + j]; /* strictly larger: the first of equals */
        }
    }
    return best_id;
}
#endif

/* tokens[r] = the fp32 head's argmax for each of the M rows of x (x_stride floats apart); hi: room for
 * M x N floats (the screened upper bounds: the caller keeps it, as a fresh 12 MiB allocation a call
 * would cost page faults). Returns 0,
 * 1 for a shape it does not take (N a multiple of 32, K of 32, M >= 1: the caller checks), 2 where a
 * row is not finite (nothing written: the caller computes every logit), 3 out of memory.
 * *candidates: how many exact logits were computed, all rows together. */
int baton_greedy_head_q8_0(const float *x, int64_t x_stride, int M, int N, int K, const uint8_t *wu8,
                           const float *dvec, const float *w1, const float *w1sum, const uint8_t *blocks,
                           float *hi, int64_t *tokens, int64_t *candidates, int num_threads) {
#if GREEDY_TUNED
    if (M < 1 || N < 32 || N % 32 || K < QK || K % QK) return 1;
    const int B = K / QK, vectors = N / 16;
    int8_t *xq = malloc((size_t)M * K);
    float *s = malloc(sizeof(float) * (size_t)M * B * 2 + sizeof(float) * (size_t)M);
    int32_t *init = malloc(sizeof(int32_t) * (size_t)M * B);
    float *lo_max = malloc(sizeof(float) * (size_t)M * (num_threads > 0 ? num_threads : 1));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)N * (num_threads > 0 ? num_threads : 1));
    int status = 0;
    if (!xq || !s || !init || !lo_max || !ids) status = 3;
    float *hs = s ? s + (size_t)M * B : 0, *c = s ? s + (size_t)M * B * 2 : 0;
    for (int r = 0; r < M && !status; r++)
        if (!quantize_row(x + r * x_stride, K, B, xq + (int64_t)r * K, s + r * B, hs + r * B, init + r * B, c + r))
            status = 2;
    int64_t total = 0;
    if (!status) {
        const int threads = num_threads < 1 ? 1 : num_threads;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            float *my_lo = lo_max + (int64_t)t * M;
            for (int r = 0; r < M; r++) my_lo[r] = -INFINITY;
            /* The screen: each thread a contiguous range of the token vectors, pairs of them sharing x. */
            const int v0 = (int)((int64_t)vectors * t / nt), v1 = (int)((int64_t)vectors * (t + 1) / nt);
            for (int o = v0; o < v1; o++)
                for (int r0 = 0; r0 < M; r0 += MR) {
                    const int mr = M - r0 < MR ? M - r0 : MR;
                    screen_any(mr, o, B, K, N, xq + (int64_t)r0 * K, s + r0 * B, hs + r0 * B, init + r0 * B, c + r0,
                               wu8, dvec, w1, w1sum, hi + (int64_t)r0 * N, my_lo + r0);
                }
#pragma omp barrier
            int32_t *my_ids = ids + (int64_t)t * N;
#pragma omp for schedule(dynamic, 1)
            for (int r = 0; r < M; r++) {
                float threshold = -INFINITY;
                for (int u = 0; u < nt; u++) threshold = lo_max[(int64_t)u * M + r] > threshold ? lo_max[(int64_t)u * M + r] : threshold;
                const float *h = hi + (int64_t)r * N;
                const __m512 tv = _mm512_set1_ps(threshold);
                int n = 0;
                for (int i = 0; i < N; i += 16) {
                    const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_loadu_ps(h + i), tv, _CMP_GE_OQ);
                    if (keep) {
                        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(i),
                                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
                        _mm512_mask_compressstoreu_epi32(my_ids + n, keep, idx);
                        n += __builtin_popcount(keep);
                    }
                }
                /* n >= 1 (the token of the largest lower bound has its upper bound above it) unless the
                 * bounds overflowed (rows near the float range: inf - inf); then the full head decides. */
                tokens[r] = n ? exact_argmax(x + r * x_stride, blocks, K, my_ids, n) : -1;
                if (tokens[r] < 0) status = 2; /* (any thread may set it: the same value) */
                total += n;
            }
        }
    }
    *candidates = total;
    free(xq), free(s), free(init), free(lo_max), free(ids);
    return status;
#else
    (void)x, (void)x_stride, (void)M, (void)N, (void)K, (void)wu8, (void)dvec, (void)w1, (void)w1sum, (void)blocks,
        (void)hi, (void)tokens, (void)candidates, (void)num_threads;
    return 1;
#endif
}
