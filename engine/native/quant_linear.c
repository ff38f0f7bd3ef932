/* y = x @ w.T + bias for a few rows of x, with w held as the GGUF file's quantized blocks.
 *
 * A model imported from GGUF (the default SmolLM2 is Q4_1, its embedding Q8_0) keeps each
 * projection's blocks as they were stored, next to the fp32 weights they dequantize to. A decode
 * step's product is bound by reading the weight, and the blocks are 5 bits (Q4_1) or 8.5 bits (Q8_0)
 * a weight instead of 32. Each thread takes a contiguous range of weight rows; for NB rows and one
 * K chunk at a time it dequantizes the blocks into an L1 buffer of floats and runs the skinny
 * kernel's tiles (skinny_tile.h) against it, exactly as skinny_linear.c runs them against the dense
 * weight in memory.
 *
 * Exactness: the dequantized floats are the ones gguf's numpy dequantization gives (and so the ones
 * the fp32 weights hold): d and m widened from fp16, q widened to float, then (d * q) + m rounded
 * once per operation, never fused into one FMA. The tiles then see the same values in the same
 * order as skinny_linear.c, so the two kernels agree bit for bit (tests/engine/native).
 *
 * Block formats (ggml): Q4_1 (type 3): fp16 d, fp16 m, 16 bytes of nibbles, the low nibbles weights
 * 0..15 and the high ones 16..31, w = d * q + m. Q8_0 (type 8): fp16 d, 32 int8, w = d * q.
 * The model multiplies Q4_1 regrouped by 8 rows (Q4_1x8, below: the same bytes, the same floats,
 * 1.16-1.47x faster at 1-8 rows: docs/BENCHMARKS.md). One row of x (a decode step of one
 * sequence) takes Q4_1x8 without the L1 buffer: there is no other row to share the dequantized
 * weights with, so each is multiplied straight from the register it was made in, saving a store and
 * a load per weight vector (direct_row_q4_1x8; the same floats again; SmolLM2's 30 layers' products
 * 1.29x faster on the Zen 5 host: docs/BENCHMARKS.md). Limits (the caller checks them:
 * quant_linear.py): K a multiple of 32, one of those types, and N a multiple of 8 for Q4_1x8.
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "skinny_tile.h"

#define QK 32
#define GGML_Q4_1 3
#define GGML_Q8_0 8
/* Not a ggml type: Q4_1 blocks regrouped by 8 rows (quant_linear.py, ``regroup``). For each 8 rows and
 * block column, 160 bytes: the 8 blocks' d (fp16), their 8 m (fp16), then their 8 x 16 bytes of
 * nibbles. One conversion widens all 16 scales, so building a block's table costs two broadcast
 * loads instead of two scalar conversions and broadcasts on the shuffle port, which the permutes
 * also need: at 1-8 rows that port, not memory, bounded the GGUF layout. */
#define BATON_Q4_1X8 1003
#define GROUP_BYTES (NB * 20)

#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define QUANT_TUNED 1

static inline __m512 half_to_v16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_set1_ps(_cvtsh_ss(h));
}

/* The two products stay separate instructions: an FMA would round once where numpy rounds twice. */
#define ROUNDED(v) __asm__("" : "+v"(v))

/* Q4_1: the block's 16 possible weights, (d * q) + m for q = 0 .. 15, are computed once into a
 * register (the same two roundings as for each weight alone), and each quant picks its weight with
 * one permute (vpermps reads only an index's low 4 bits: the low nibble needs no mask). */
static inline void dequant_q4_1(const uint8_t *block, float *dst) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = _mm512_mul_ps(half_to_v16(block), iota);
    ROUNDED(table);
    table = _mm512_add_ps(table, half_to_v16(block + 2));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(block + 4)));
    _mm512_storeu_ps(dst, _mm512_permutexvar_ps(q, table));
    _mm512_storeu_ps(dst + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table));
}

/* The 8 rows of one block column of a Q4_1x8 group into dst, dst_stride floats apart: the same
 * floats as dequant_q4_1 on each row's own block (fp16 -> fp32 is exact either way). Everything but
 * the two table lookups stays off the shuffle port: the scales are broadcast from memory, and a row's
 * nibble bytes, stored so that lane i of their 128-bit broadcast holds byte i at bit 8 * (i / 4)
 * (regroup's byte order), reach the low 4 bits of lane i by a variable shift. */
#define Q4_1X8_SHIFT_LO _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24)
#define Q4_1X8_SHIFT_HI _mm512_setr_epi32(4, 4, 4, 4, 12, 12, 12, 12, 20, 20, 20, 20, 28, 28, 28, 28)

/* The group's 16 scales (d of rows 0..7, then m of rows 0..7) as floats in dm. */
static inline void q4_1x8_scales(const uint8_t *group, float dm[16]) {
    _mm512_store_ps(dm, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)group)));
    /* Broadcast each scale from memory, not by a permute of the register: dm "changes" here. Only dm:
     * a clobber of all memory would also flush direct_row_q4_1x8's accumulators out of registers. */
    __asm__ volatile("" : "+m"(*(float(*)[16])dm));
}

/* Row j's table of 16 weights, (d * q) + m for q = 0 .. 15, and its nibble bytes broadcast. */
static inline __m512 q4_1x8_table(const float dm[16], int j) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = _mm512_mul_ps(_mm512_set1_ps(dm[j]), iota);
    ROUNDED(table);
    return _mm512_add_ps(table, _mm512_set1_ps(dm[NB + j]));
}
static inline __m512i q4_1x8_quants(const uint8_t *group, int j) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(group + 2 * 2 * NB + 16 * j)));
}

static inline void dequant_q4_1x8(const uint8_t *group, float *dst, int64_t dst_stride) {
    float dm[16] __attribute__((aligned(64)));
    q4_1x8_scales(group, dm);
    for (int j = 0; j < NB; j++) {
        const __m512 table = q4_1x8_table(dm, j);
        const __m512i q = q4_1x8_quants(group, j);
        _mm512_storeu_ps(dst + j * dst_stride, _mm512_permutexvar_ps(_mm512_srlv_epi32(q, Q4_1X8_SHIFT_LO), table));
        _mm512_storeu_ps(dst + j * dst_stride + 16, _mm512_permutexvar_ps(_mm512_srlv_epi32(q, Q4_1X8_SHIFT_HI), table));
    }
}

/* One row of x against one group's K chunk of Q4_1x8 (`blocks` block columns from src), each
 * weight vector multiplied in the register dequant_q4_1x8 would have stored it from. Every
 * accumulator gets the same products in the same K order as tile() over the buffer, so the floats
 * are the same. `next`: the next group's chunk, prefetched meanwhile. (Two rows this way measured
 * no faster than through the buffer: their multiplies, not the round trip, bound them.) */
static inline void direct_row_q4_1x8(const float *x, const uint8_t *src, int blocks, const uint8_t *next,
                                     const float *bias, int accumulate, float *out) {
    v16 acc[1][NB];
    for (int j = 0; j < NB; j++) acc[0][j] = (v16){0};
    for (int b = 0; b < blocks; b++) {
        const uint8_t *group = src + b * GROUP_BYTES;
        for (int line = 0; line < GROUP_BYTES; line += 64) __builtin_prefetch(next + b * GROUP_BYTES + line, 0, 1);
        float dm[16] __attribute__((aligned(64)));
        q4_1x8_scales(group, dm);
        const v16 lo = *(const v16 *)(x + b * QK), hi = *(const v16 *)(x + b * QK + 16);
        for (int j = 0; j < NB; j++) {
            const __m512 table = q4_1x8_table(dm, j);
            const __m512i q = q4_1x8_quants(group, j);
            acc[0][j] += lo * (v16)_mm512_permutexvar_ps(_mm512_srlv_epi32(q, Q4_1X8_SHIFT_LO), table);
            acc[0][j] += hi * (v16)_mm512_permutexvar_ps(_mm512_srlv_epi32(q, Q4_1X8_SHIFT_HI), table);
        }
    }
    tile_store(1, NB, acc, bias, accumulate, out, 0);
}

static inline void dequant_q8_0(const uint8_t *block, float *dst) {
    const __m512 d = half_to_v16(block);
    const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 2)));
    const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 18)));
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
}
static inline void dequant_block(int qtype, const uint8_t *block, float *dst) {
    if (qtype == GGML_Q4_1)
        dequant_q4_1(block, dst);
    else
        dequant_q8_0(block, dst);
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The AVX2 build: the same floats, made 8 at a time by a conversion, a multiply and an add (no
 * 16-entry table: AVX2's permute takes 8), and the 8-lane tile (skinny_tile.h). One row of x takes
 * Q4_1x8 straight from the registers, as on AVX-512 (direct_row_q4_1x8, below). */
#include <immintrin.h>
#define QUANT_TUNED 1

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* A Q4_1x8 group's 16 scales, converted into dm, are broadcast from memory, not by two shuffles each
 * of the register GCC keeps them in: the nibbles need the shuffle ports. */
#define SCALES_FROM_MEMORY(dm) __asm__ volatile("" : "+m"(*(float(*)[16])(dm)))

/* (d * q) + m for 8 quants, rounded twice as numpy does (no FMA). */
static inline __m256 q4_values(__m256i q, __m256 d, __m256 m) {
    __m256 prod = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    __asm__("" : "+x"(prod));
    return _mm256_add_ps(prod, m);
}

/* 16 nibble bytes in a block's order (byte i: weights i and i + 16) as its 32 floats, w[i] holding
 * weights 8i .. 8i + 7 (the K order the tile multiplies them in). */
static inline void q4_1_weights(__m128i bytes, __m256 d, __m256 m, __m256 w[4]) {
    const __m256i lo = _mm256_cvtepu8_epi32(bytes), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
    const __m256i mask = _mm256_set1_epi32(15);
    w[0] = q4_values(_mm256_and_si256(lo, mask), d, m);
    w[1] = q4_values(_mm256_and_si256(hi, mask), d, m);
    w[2] = q4_values(_mm256_srli_epi32(lo, 4), d, m);
    w[3] = q4_values(_mm256_srli_epi32(hi, 4), d, m);
}

static inline void q4_1_nibbles(__m128i bytes, __m256 d, __m256 m, float *dst) {
    __m256 w[4];
    q4_1_weights(bytes, d, m, w);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + 8 * i, w[i]);
}

static inline void dequant_q4_1(const uint8_t *block, float *dst) {
    q4_1_nibbles(_mm_loadu_si128((const __m128i *)(block + 4)), _mm256_set1_ps(half_to_float(block)),
                 _mm256_set1_ps(half_to_float(block + 2)), dst);
}

/* Q4_1x8: a group's 16 scales (d of rows 0..7, then m of rows 0..7) as floats in dm. */
static inline void q4_1x8_scales(const uint8_t *group, float dm[16]) {
    _mm256_storeu_ps(dm, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group)));
    _mm256_storeu_ps(dm + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16))));
    SCALES_FROM_MEMORY(dm);
}

/* Row j's nibble bytes, back in the block's order with one byte shuffle (regroup put byte i at
 * 4 * (i % 4) + i / 4). */
static inline __m128i q4_1x8_bytes(const uint8_t *group, int j) {
    const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(group + 2 * 2 * NB + 16 * j)), order);
}

static inline void dequant_q4_1x8(const uint8_t *group, float *dst, int64_t dst_stride) {
    float dm[16];
    q4_1x8_scales(group, dm);
    for (int j = 0; j < NB; j++)
        q4_1_nibbles(q4_1x8_bytes(group, j), _mm256_set1_ps(dm[j]), _mm256_set1_ps(dm[NB + j]), dst + j * dst_stride);
}

/* One row of x against one group's K chunk of Q4_1x8, each weight vector multiplied in the register
 * q4_1_nibbles would have stored it from (the AVX-512 build's direct_row_q4_1x8 in 8 lanes): per
 * weight row, the FMAs tile_pass(1, 8) runs over the buffer, in the same K order, so the same
 * floats. */
static inline void direct_row_q4_1x8(const float *x, const uint8_t *src, int blocks, const uint8_t *next,
                                     const float *bias, int accumulate, float *out) {
    vacc acc[1][NB];
    for (int j = 0; j < NB; j++) acc[0][j] = (vacc){0};
    for (int b = 0; b < blocks; b++) {
        const uint8_t *group = src + b * GROUP_BYTES;
        for (int line = 0; line < GROUP_BYTES; line += 64) __builtin_prefetch(next + b * GROUP_BYTES + line, 0, 1);
        float dm[16];
        q4_1x8_scales(group, dm);
        const float *xb = x + b * QK;
        for (int j = 0; j < NB; j++) {
            __m256 w[4];
            q4_1_weights(q4_1x8_bytes(group, j), _mm256_set1_ps(dm[j]), _mm256_set1_ps(dm[NB + j]), w);
            for (int i = 0; i < 4; i++) MULADD(acc[0][j], *(const vacc *)(xb + 8 * i), w[i]);
        }
    }
    tile_store(1, NB, acc, bias, accumulate, out, 0);
}

static inline void dequant_q8_0(const uint8_t *block, float *dst) {
    const __m256 d = _mm256_set1_ps(half_to_float(block));
    for (int i = 0; i < QK; i += 8) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(block + 2 + i)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
    }
}
static inline void dequant_block(int qtype, const uint8_t *block, float *dst) {
    if (qtype == GGML_Q4_1)
        dequant_q4_1(block, dst);
    else
        dequant_q8_0(block, dst);
}
#else
#define QUANT_TUNED 0
#endif

static int block_bytes(int qtype) {
    return qtype == GGML_Q4_1 || qtype == BATON_Q4_1X8 ? 20 : qtype == GGML_Q8_0 ? 34 : 0;
}

/* Q4_1x8 takes whole groups of 8 rows only. */
static int shape_ok(int qtype, int N, int K) {
    return block_bytes(qtype) && K % QK == 0 && (qtype != BATON_Q4_1X8 || N % NB == 0);
}

/* 1 where this build has both a tile (AVX-512 or AVX2 with FMA) and the conversions (F16C) it was written for. */
int baton_quant_linear_tuned(void) { return QUANT_TUNED; }

/* Floats w's blocks hold (n rows of K, row-major): what the kernel multiplies, for the tests. */
int baton_quant_dequantize(const uint8_t *wq, int qtype, float *out, int N, int K) {
#if QUANT_TUNED
    const int bb = block_bytes(qtype), blocks = K / QK;
    if (!shape_ok(qtype, N, K)) return 1;
    if (qtype == BATON_Q4_1X8) {
        for (int64_t g = 0; g < N / NB; g++)
            for (int b = 0; b < blocks; b++)
                dequant_q4_1x8(wq + (g * blocks + b) * GROUP_BYTES, out + g * NB * K + b * QK, K);
        return 0;
    }
    for (int64_t b = 0; b < (int64_t)N * blocks; b++) {
        dequant_block(qtype, wq + b * bb, out + b * QK);
    }
    return 0;
#else
    (void)wq, (void)qtype, (void)out, (void)N, (void)K;
    return 1;
#endif
}

/* Returns 0, or 1 for a shape or type the kernel does not take (the caller checked: a bug there). */
int baton_quant_linear_f32(const float *x, int64_t x_stride, const uint8_t *wq, int qtype, const float *bias,
                           float *out, int64_t out_stride, int M, int N, int K, int num_threads) {
#if QUANT_TUNED
    const int bb = block_bytes(qtype);
    if (!shape_ok(qtype, N, K) || M < 1 || N < 1) return 1;
    const int64_t row_bytes = (int64_t)(K / QK) * bb; /* Q4_1x8: a group is NB rows' worth of bytes too */
    const int groups = (N + NB - 1) / NB, chunks = (K + KC - 1) / KC;
#pragma omp parallel num_threads(threads_for(groups, num_threads))
    {
        float buf[NB * KC] __attribute__((aligned(64))); /* NB rows of one chunk, KC apart: 24 KiB of L1 */
        int g0, g1;
        thread_groups(groups, &g0, &g1);
        for (int g = g0; g < g1; g++) {
            const int n0 = g * NB, nb = N - n0 < NB ? N - n0 : NB;
            for (int c = 0; c < chunks; c++) {
                const int k0 = c * KC, kc = K - k0 < KC ? K - k0 : KC;
                if (qtype == BATON_Q4_1X8 && M == 1) {
                    const uint8_t *src = wq + (int64_t)g * NB * row_bytes + (int64_t)(k0 / QK) * GROUP_BYTES;
                    direct_row_q4_1x8(x + k0, src, kc / QK, src + NB * row_bytes, bias ? bias + n0 : 0, c > 0,
                                      out + n0);
                    continue;
                }
                if (qtype == BATON_Q4_1X8) {
                    /* The group's chunk is contiguous, 160 bytes a block column; the next group's
                     * chunk, NB rows' bytes on, is prefetched meanwhile. */
                    const uint8_t *src = wq + (int64_t)g * NB * row_bytes + (int64_t)(k0 / QK) * GROUP_BYTES;
                    for (int b = 0; b < kc / QK; b++) {
                        const uint8_t *next = src + b * GROUP_BYTES + NB * row_bytes;
                        for (int line = 0; line < GROUP_BYTES; line += 64) __builtin_prefetch(next + line, 0, 1);
                        dequant_q4_1x8(src + b * GROUP_BYTES, buf + b * QK, KC);
                    }
                } else {
                    for (int j = 0; j < nb; j++) {
                        const uint8_t *src = wq + (int64_t)(n0 + j) * row_bytes + (int64_t)(k0 / QK) * bb;
                        __builtin_prefetch(src + NB * row_bytes, 0, 1); /* the next group's rows, same chunk */
                        for (int b = 0; b < kc / QK; b++) {
                            dequant_block(qtype, src + b * bb, buf + j * KC + b * QK);
                            if ((b * bb) % 64 < bb) __builtin_prefetch(src + b * bb + NB * row_bytes + 64, 0, 1);
                        }
                    }
                }
                chunk_tiles(M, nb, x + k0, x_stride, buf, KC, kc, bias ? bias + n0 : 0, c > 0, out + n0, out_stride,
                            0, 0, 0);
            }
        }
    }
    return 0;
#else
    (void)x, (void)x_stride, (void)wq, (void)qtype, (void)bias, (void)out, (void)out_stride, (void)M, (void)N, (void)K,
        (void)num_threads;
    return 1;
#endif
}
