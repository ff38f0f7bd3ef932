/* Paged decode attention on CPU, reading K and V where they lie in the block-major cache.
 *
 * The torch path (engine/attention/cpu.py) gathers every sequence's blocks into a dense buffer per layer and
 * runs SDPA over it padded to the longest row: the KV is read, written and read again, and short
 * rows pay for long ones. Here each (sequence, KV head) task walks its own blocks once, with the
 * blocks two ahead prefetched, and keeps an online softmax (running max and sum, float32, as flash
 * decoding does) so K and V are each read exactly once and nothing is written but the output.
 * The G query heads that share a KV head are done together, so each K/V row is loaded once for
 * all of them. A context longer than SPLIT_TOKENS is cut into pieces attended as separate tasks and
 * merged after (flash decoding's split-K): one long sequence has only kv_heads tasks, 3 for
 * SmolLM2, which 2 threads run as 2 + 1. The cut depends on the sequence's length alone, so its
 * result is the same floats in any batch and with any thread count; shorter ones are unchanged. Tasks run on the caller's OpenMP runtime (torch's libgomp, loaded before this
 * library: build.py), at most `num_threads` at once.
 *
 * The prefetches of the blocks two ahead are spread over the rows attended, a row for a row: issued
 * a block at a time (128 lines), they filled the line-fill buffers and stalled the loop (the hottest
 * instructions by perf), 1.11-1.22x slower. The scores of 16 keys (8 on AVX2) come out of one shuffle tree.
 *
 * Layout: k/v point at one layer's view [num_blocks, block_size, kv_heads, head_dim] with element
 * strides (block_stride, token_stride, head_dim, 1). q is [B, heads, head_dim] with rows q_stride
 * apart (a view of the fused qkv rows) and heads contiguous; out is contiguous [B, heads, head_dim];
 * block_tables is [B, bt_stride] int32, seq_lens [B] int32 (the context including the new token).
 * Limits (the caller checks them: paged_decode.py): head_dim a multiple of 16 up to 128,
 * at most 8 query heads per KV head, block_size at most 64.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec_math.h"

#define MAX_GROUP 8
#define MAX_DV 8 /* head_dim / 16 */
#define MAX_BLOCK 64
/* Contexts past this many tokens are split into pieces attended in parallel (see below). */
#ifndef SPLIT_TOKENS
#define SPLIT_TOKENS 1024
#endif
#define MAX_PIECES 64
#ifndef AHEAD
#define AHEAD 2 /* blocks prefetched ahead */
#endif
/* Pieces whose K and V rows (all heads) take at most this many bytes are read ahead by
 * touch_piece; 0 turns it off (A/B runs). The piece then waits in the caches for its heads: 200
 * tokens of SmolLM2 take 300 KiB (Zen 3's L2: 512 KiB; Zen 4's: 1 MiB), 680 take 1 MiB (partly in
 * L3, still 1.18x at 400 tokens on Zen 3); at 1,000 tokens (1.5 MiB) it gained 1.05x and is left
 * out. On a Zen 4 host (AVX-512) the kernel read 12-15 GB/s without it and 1.12-1.23x faster with
 * it (docs/BENCHMARKS.md). */
#ifndef TOUCH_BYTES
#define TOUCH_BYTES (1 << 20)
#endif

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v4 __attribute__((vector_size(16), aligned(4)));

static inline __attribute__((always_inline)) void prefetch_block(const float *b, int rows, int64_t token_stride, int dv) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < dv; j++) __builtin_prefetch(b + (int64_t)i * token_stride + 16 * j);
}

/* The shared steps of a task, used by both builds of `attend` below. */

/* Prefetches the first AHEAD blocks of a task's K and V. */
static inline __attribute__((always_inline)) void prefetch_first_blocks(
    const float *k, const float *v, const int32_t *table, int b0, int nblocks, int64_t block_stride, int block_size,
    int64_t token_stride, int dv) {
    for (int b = b0; b < b0 + AHEAD && b < nblocks; b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        prefetch_block(k + at, block_size, token_stride, dv);
        prefetch_block(v + at, block_size, token_stride, dv);
    }
}

/* How many of block b's rows hold the context's first `len` tokens. */
static inline int block_rows(int len, int b, int block_size) {
    return len - b * block_size < block_size ? len - b * block_size : block_size;
}

/* The block AHEAD of block b in `base` (K or V), or NULL past the task's last block: blocks lie
 * anywhere in memory, so it is loaded a row at a time while this block's rows are attended (in one
 * burst, the prefetches filled the line-fill buffers and stalled the loop). */
static inline const float *block_ahead(const float *base, const int32_t *table, int b, int nblocks,
                                       int64_t block_stride) {
    return b + AHEAD < nblocks ? base + (int64_t)table[b + AHEAD] * block_stride : 0;
}

/* Reads every line of a piece's K and V rows (all KV heads') with plain loads, before its heads
 * are attended: where the software prefetches of the blocks ahead do not keep enough lines in
 * flight (AMD Zen 3: the kernel read 7-8 GB/s from memory while plain loads of the same rows
 * stream at ~14; Zen 4: 12-15 against ~24), a tight loop of independent loads brings the piece
 * into L2 at streaming rate and the heads then read it from there. Where a block's rows are
 * contiguous (the block-major cache: a token's row is all its heads), its K and its V are each read
 * as one run, and the next block's lines are prefetched into L2 first, so two blocks are in flight
 * (Zen 4: 1.04-1.08x over row by row). Nothing computed changes. */
static void touch_piece(const float *k, const float *v, const int32_t *table, int b0, int b1, int len,
                        int block_size, int64_t block_stride, int64_t token_stride, int row_floats) {
    v8 sum0 = {0}, sum1 = {0}, sum2 = {0}, sum3 = {0};
    if (token_stride != row_floats) {
        for (int b = b0; b < b1; b++) {
            const int n = block_rows(len, b, block_size);
            const float *kb = k + (int64_t)table[b] * block_stride, *vb = v + (int64_t)table[b] * block_stride;
            for (int i = 0; i < n; i++)
                for (int d = 0; d < row_floats; d += 16) { /* one load a 64-byte line */
                    sum0 += *(const v8 *)(kb + i * token_stride + d);
                    sum1 += *(const v8 *)(vb + i * token_stride + d);
                }
        }
    } else {
        const int64_t block_floats = (int64_t)block_size * row_floats;
        for (int b = b0; b < b1; b++) {
            if (b + 1 < b1) {
                const float *nk = k + (int64_t)table[b + 1] * block_stride, *nv = v + (int64_t)table[b + 1] * block_stride;
                for (int64_t d = 0; d < block_floats; d += 16) {
                    __builtin_prefetch(nk + d, 0, 2);
                    __builtin_prefetch(nv + d, 0, 2);
                }
            }
            const float *kb = k + (int64_t)table[b] * block_stride, *vb = v + (int64_t)table[b] * block_stride;
            const int64_t total = (int64_t)block_rows(len, b, block_size) * row_floats;
            int64_t d = 0;
            for (; d + 64 <= total; d += 64) { /* four lines of K and four of V, four chains */
                sum0 += *(const v8 *)(kb + d), sum1 += *(const v8 *)(kb + d + 16);
                sum2 += *(const v8 *)(kb + d + 32), sum3 += *(const v8 *)(kb + d + 48);
                sum0 += *(const v8 *)(vb + d), sum1 += *(const v8 *)(vb + d + 16);
                sum2 += *(const v8 *)(vb + d + 32), sum3 += *(const v8 *)(vb + d + 48);
            }
            for (; d < total; d += 16) sum0 += *(const v8 *)(kb + d), sum1 += *(const v8 *)(vb + d);
        }
    }
    volatile float keep = (sum0 + sum1 + sum2 + sum3)[0]; /* the loads are the point: keep them */
    (void)keep;
}

#if defined(__AVX512F__) /* (the 16-lane task's lane sums) */
static inline float hsum16(v16 x) {
    v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* r[t] = sum of a[t]'s 16 lanes, t = 0 .. 15, as one tree of shuffles and adds. */
static inline v16 hsum16x16(const v16 a[16]) {
    v16 b[8], c[4], d[2];
    for (int j = 0; j < 8; j++)
        b[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * j], a[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int j = 0; j < 4; j++)
        c[j] = __builtin_shufflevector(b[2 * j], b[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * j], b[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int j = 0; j < 2; j++)
        d[j] = __builtin_shufflevector(c[2 * j], c[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(c[2 * j], c[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#endif


#if defined(__AVX512F__)
/* One (sequence, KV head) task: G query heads of head_dim 16 * DV. Inlined with constant G and DV
 * for the common shapes (the accumulators then live in registers), called as is for the rest. */
static inline __attribute__((always_inline)) void attend(
    const int G, const int DV, const float *q, const float *k, const float *v, int64_t block_stride,
    int64_t token_stride, const int32_t *table, int b0, int b1, int len, int block_size, float scale, float *out,
    float *partial_ml) {
    v16 qv[MAX_GROUP][MAX_DV], acc[MAX_GROUP][MAX_DV];
    float m[MAX_GROUP], l[MAX_GROUP], p[MAX_GROUP][MAX_BLOCK + 16];
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (int j = 0; j < DV; j++) {
            qv[g][j] = *(const v16 *)(q + (g * DV + j) * 16) * scale;
            acc[g][j] = (v16){0};
        }
    }
    const int nblocks = b1;
    prefetch_first_blocks(k, v, table, b0, nblocks, block_stride, block_size, token_stride, DV);
    for (int b = b0; b < nblocks; b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        const float *kb = k + at, *vb = v + at;
        const int n = block_rows(len, b, block_size);
        const float *next_k = block_ahead(k, table, b, nblocks, block_stride);
        const float *next_v = block_ahead(v, table, b, nblocks, block_stride);
        for (int i0 = 0; i0 < n; i0 += 16) { /* 16 keys' scores at once: one lane-sum tree */
            const int cnt = n - i0 < 16 ? n - i0 : 16;
            for (int g = 0; g < G; g++) {
                v16 dots[16];
                for (int t = 0; t < 16; t++) {
                    const float *kr = kb + (int64_t)(i0 + (t < cnt ? t : cnt - 1)) * token_stride;
                    v16 dot = qv[g][0] * *(const v16 *)kr;
                    for (int j = 1; j < DV; j++) dot += qv[g][j] * *(const v16 *)(kr + 16 * j);
                    dots[t] = dot;
                }
                *(v16 *)&p[g][i0] = hsum16x16(dots);
            }
        }
        for (int g = 0; g < G; g++) { /* online softmax: rescale what came before to the new max */
            float mx = m[g];
#pragma omp simd reduction(max : mx)
            for (int i = 0; i < n; i++) mx = p[g][i] > mx ? p[g][i] : mx;
            const float rescale = expf(m[g] - mx);
            m[g] = mx;
            l[g] *= rescale;
            for (int j = 0; j < DV; j++) acc[g][j] *= rescale;
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < n; i++) {
                p[g][i] = exp_poly(p[g][i] - mx);
                sum += p[g][i];
            }
            l[g] += sum;
        }
        for (int i = 0; i < n; i++) {
            v16 vr[MAX_DV];
            if (next_k) {
                prefetch_block(next_k + i * token_stride, 1, token_stride, DV);
                prefetch_block(next_v + i * token_stride, 1, token_stride, DV);
            }
            for (int j = 0; j < DV; j++) vr[j] = *(const v16 *)(vb + i * token_stride + 16 * j);
            for (int g = 0; g < G; g++)
                for (int j = 0; j < DV; j++) acc[g][j] += p[g][i] * vr[j];
        }
    }
    if (partial_ml) { /* one piece of a split sequence: unnormalised, with its max and sum */
        for (int g = 0; g < G; g++) {
            partial_ml[2 * g] = m[g], partial_ml[2 * g + 1] = l[g];
            for (int j = 0; j < DV; j++) *(v16 *)(out + (g * DV + j) * 16) = acc[g][j];
        }
        return;
    }
    for (int g = 0; g < G; g++) {
        const float inv = len > 0 ? 1.f / l[g] : 0.f;
        for (int j = 0; j < DV; j++) *(v16 *)(out + (g * DV + j) * 16) = acc[g][j] * inv;
    }
}

#else
/* The AVX2 build of a task (16 registers of 8 lanes: the AVX-512 tile above, its query and
 * accumulator vectors held in registers, would take 48 here and spill on every key; it ran 3-4x
 * slower than this). The scaled queries and the output sums live in L1 arrays instead:
 * - scores: for one query head, 8 keys at a time, 8 partial dot products in registers, the query's
 *   vector loaded once for the 8 keys, then one lane-sum tree (hsum8x8);
 * - values: per query head, up to 8 vectors of its output sums in registers (rescaled to the new
 *   max as they are loaded) across the block's keys, then stored back.
 * Each output element adds its keys' p * v in the same order as the AVX-512 build; the dot products'
 * lanes differ (8 against 16), so the two builds differ in the last bits. */
static inline __attribute__((always_inline)) void attend(
    const int G, const int DV, const float *q, const float *k, const float *v, int64_t block_stride,
    int64_t token_stride, const int32_t *table, int b0, int b1, int len, int block_size, float scale, float *out,
    float *partial_ml) {
    const int D8 = 2 * DV; /* 8-lane vectors per head */
    v8 qs[MAX_GROUP][2 * MAX_DV], acc[MAX_GROUP][2 * MAX_DV];
    float m[MAX_GROUP], l[MAX_GROUP], rescale[MAX_GROUP], p[MAX_GROUP][MAX_BLOCK + 16];
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (int j = 0; j < D8; j++) {
            qs[g][j] = *(const v8 *)(q + (g * D8 + j) * 8) * scale;
            acc[g][j] = (v8){0};
        }
    }
    const int nblocks = b1;
    prefetch_first_blocks(k, v, table, b0, nblocks, block_stride, block_size, token_stride, DV);
    for (int b = b0; b < nblocks; b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        const float *kb = k + at, *vb = v + at;
        const int n = block_rows(len, b, block_size);
        const float *next_k = block_ahead(k, table, b, nblocks, block_stride);
        const float *next_v = block_ahead(v, table, b, nblocks, block_stride);
        for (int i0 = 0; i0 < n; i0 += 8) { /* 8 keys' scores at once: one lane-sum tree */
            const int cnt = n - i0 < 8 ? n - i0 : 8;
            const float *kr[8];
            for (int t = 0; t < 8; t++) kr[t] = kb + (int64_t)(i0 + (t < cnt ? t : cnt - 1)) * token_stride;
            for (int g = 0; g < G; g++) {
                v8 dots[8];
                for (int t = 0; t < 8; t++) dots[t] = qs[g][0] * *(const v8 *)kr[t];
                for (int j = 1; j < D8; j++) {
                    const v8 qj = qs[g][j];
                    for (int t = 0; t < 8; t++) dots[t] += qj * *(const v8 *)(kr[t] + 8 * j);
                }
                *(v8 *)&p[g][i0] = hsum8x8(dots);
            }
        }
        for (int g = 0; g < G; g++) { /* online softmax: what came before is rescaled to the new max */
            float mx = m[g];
#pragma omp simd reduction(max : mx)
            for (int i = 0; i < n; i++) mx = p[g][i] > mx ? p[g][i] : mx;
            rescale[g] = expf(m[g] - mx);
            m[g] = mx;
            l[g] *= rescale[g];
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < n; i++) {
                p[g][i] = exp_poly(p[g][i] - mx);
                sum += p[g][i];
            }
            l[g] += sum;
        }
        for (int g = 0; g < G; g++)
            for (int j0 = 0; j0 < D8; j0 += 8) {
                const int w = D8 - j0 < 8 ? D8 - j0 : 8;
                v8 a[8];
                for (int j = 0; j < w; j++) a[j] = acc[g][j0 + j] * rescale[g];
                for (int i = 0; i < n; i++) {
                    if (g == 0 && j0 == 0 && next_k) { /* the block two ahead, a row for a row */
                        prefetch_block(next_k + i * token_stride, 1, token_stride, DV);
                        prefetch_block(next_v + i * token_stride, 1, token_stride, DV);
                    }
                    const float pi = p[g][i];
                    const float *vr = vb + i * token_stride + 8 * j0;
                    for (int j = 0; j < w; j++) a[j] += pi * *(const v8 *)(vr + 8 * j);
                }
                for (int j = 0; j < w; j++) acc[g][j0 + j] = a[j];
            }
    }
    if (partial_ml) { /* one piece of a split sequence: unnormalised, with its max and sum */
        for (int g = 0; g < G; g++) {
            partial_ml[2 * g] = m[g], partial_ml[2 * g + 1] = l[g];
            for (int j = 0; j < D8; j++) *(v8 *)(out + (g * D8 + j) * 8) = acc[g][j];
        }
        return;
    }
    for (int g = 0; g < G; g++) {
        const float inv = len > 0 ? 1.f / l[g] : 0.f;
        for (int j = 0; j < D8; j++) *(v8 *)(out + (g * D8 + j) * 8) = acc[g][j] * inv;
    }
}
#endif

static void attend_any(int G, int DV, const float *q, const float *k, const float *v, int64_t block_stride,
                       int64_t token_stride, const int32_t *table, int b0, int b1, int len, int block_size, float scale,
                       float *out, float *partial_ml) {
    attend(G, DV, q, k, v, block_stride, token_stride, table, b0, b1, len, block_size, scale, out, partial_ml);
}

/* The pieces of a split sequence, in order, into one result: each piece's sums rescaled to the
 * common max (flash decoding's reduction). acc and ml point at the first piece's values for this
 * head group; the next piece's are `stride` heads further on. */
static void merge_pieces(int G, int head_dim, int pieces, const float *acc, const float *ml, int64_t stride,
                         float *out) {
    for (int g = 0; g < G; g++) {
        float mx = -INFINITY, sum = 0.f, w[MAX_PIECES];
        for (int p = 0; p < pieces; p++) mx = ml[p * stride * 2 + 2 * g] > mx ? ml[p * stride * 2 + 2 * g] : mx;
        for (int p = 0; p < pieces; p++) {
            w[p] = expf(ml[p * stride * 2 + 2 * g] - mx);
            sum += w[p] * ml[p * stride * 2 + 2 * g + 1];
        }
        const float inv = sum > 0 ? 1.f / sum : 0.f;
        for (int d = 0; d < head_dim; d++) {
            float o = 0.f;
            for (int p = 0; p < pieces; p++) o += w[p] * acc[p * stride * head_dim + (int64_t)g * head_dim + d];
            out[g * head_dim + d] = o * inv;
        }
    }
}

int baton_paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t block_stride,
                           int64_t token_stride, const int32_t *block_tables, int64_t bt_stride,
                           const int32_t *seq_lens, int num_seqs, int num_heads, int kv_heads,
                           int head_dim, int block_size, float scale, float *out, int num_threads) {
    const int group = num_heads / kv_heads, dv = head_dim / 16;
    if (num_heads % kv_heads || group > MAX_GROUP || head_dim % 16 || dv > MAX_DV || block_size > MAX_BLOCK ||
        block_size < 1)
        return 1;
    /* Long contexts are cut into pieces of SPLIT_TOKENS (by length alone: a sequence gets the same
     * floats whatever its batch-mates and the thread count), so one long sequence keeps every
     * thread busy; its pieces are merged after. A sequence of one piece is attended as a whole. */
    const int piece_blocks = SPLIT_TOKENS / block_size > 0 ? SPLIT_TOKENS / block_size : 1;
    int *first_piece = malloc(sizeof(int) * (num_seqs + 1));
    if (!first_piece) return 2;
    first_piece[0] = 0;
    int split = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int nblocks = (seq_lens[s] + block_size - 1) / block_size;
        int pieces = (nblocks + piece_blocks - 1) / piece_blocks;
        if (pieces < 1) pieces = 1;
        if (pieces > MAX_PIECES) pieces = MAX_PIECES; /* very long: fewer, longer pieces */
        first_piece[s + 1] = first_piece[s] + pieces;
        split |= pieces > 1;
    }
    const int total = first_piece[num_seqs];
    float *piece_acc = 0, *piece_ml = 0; /* [piece][kv head][group][head_dim], [piece][kv head][group][2] */
    if (split) {
        piece_acc = malloc(sizeof(float) * (size_t)total * num_heads * head_dim);
        piece_ml = malloc(sizeof(float) * (size_t)total * num_heads * 2);
        if (!piece_acc || !piece_ml) {
            free(first_piece), free(piece_acc), free(piece_ml);
            return 2;
        }
    }
    const int tasks = total * kv_heads;
    /* A piece's KV heads go to one thread, one after another, wherever there are pieces enough to
     * keep every thread busy: the heads' rows interleave in memory, so the lines the hardware
     * prefetcher brings in beside one head's are the next head's, read from this core's L2. One
     * head a task spreads them over both cores' caches. The floats are the same either way. */
    const int chunk = total >= 2 * num_threads ? kv_heads : 1;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(dynamic, chunk)
        for (int task = 0; task < tasks; task++) {
            const int piece = task / kv_heads, h = task % kv_heads;
            int s = 0; /* the piece's sequence: first_piece is sorted */
            for (int lo = 0, hi = num_seqs - 1; lo <= hi;) {
                const int mid = (lo + hi) / 2;
                if (first_piece[mid] <= piece) s = mid, lo = mid + 1; else hi = mid - 1;
            }
            const int pieces = first_piece[s + 1] - first_piece[s], p = piece - first_piece[s];
            const int len = seq_lens[s], nblocks = (len + block_size - 1) / block_size;
            const int b0 = (int)((int64_t)nblocks * p / pieces), b1 = (int)((int64_t)nblocks * (p + 1) / pieces);
            const int64_t first = (int64_t)h * group * head_dim; /* the group's first query head */
            const float *qs = q + s * q_stride + first, *kh = k + (int64_t)h * head_dim, *vh = v + (int64_t)h * head_dim;
            float *o = pieces > 1 ? piece_acc + ((int64_t)piece * num_heads) * head_dim + first
                                  : out + (int64_t)s * num_heads * head_dim + first;
            float *ml = pieces > 1 ? piece_ml + ((int64_t)piece * num_heads + h * group) * 2 : 0;
            const int32_t *table = block_tables + (int64_t)s * bt_stride;
            if (TOUCH_BYTES && h == 0 && chunk == kv_heads && /* heads together: this thread attends them all next */
                (int64_t)(b1 - b0) * block_size * kv_heads * head_dim * 2 * (int64_t)sizeof(float) <= TOUCH_BYTES)
                touch_piece(k, v, table, b0, b1, len, block_size, block_stride, token_stride, kv_heads * head_dim);
#define ATTEND(G, DV) attend(G, DV, qs, kh, vh, block_stride, token_stride, table, b0, b1, len, block_size, scale, o, ml)
            switch (group * 16 + dv) {
            case 1 * 16 + 4: ATTEND(1, 4); break;
            case 2 * 16 + 4: ATTEND(2, 4); break;
            case 3 * 16 + 4: ATTEND(3, 4); break;
            case 4 * 16 + 4: ATTEND(4, 4); break;
            case 7 * 16 + 4: ATTEND(7, 4); break;
            case 2 * 16 + 2: ATTEND(2, 2); break;
            case 4 * 16 + 8: ATTEND(4, 8); break;
            case 8 * 16 + 8: ATTEND(8, 8); break;
            default: attend_any(group, dv, qs, kh, vh, block_stride, token_stride, table, b0, b1, len, block_size, scale, o, ml);
            }
        }
        if (split) {
#pragma omp for schedule(dynamic, 1)
            for (int task = 0; task < num_seqs * kv_heads; task++) {
                const int s = task / kv_heads, h = task % kv_heads, p0 = first_piece[s];
                const int pieces = first_piece[s + 1] - p0;
                if (pieces < 2) continue;
                merge_pieces(group, head_dim, pieces, piece_acc + ((int64_t)p0 * num_heads + h * group) * head_dim,
                             piece_ml + ((int64_t)p0 * num_heads + h * group) * 2, num_heads,
                             out + ((int64_t)s * num_heads + h * group) * head_dim);
            }
        }
    }
    free(first_piece), free(piece_acc), free(piece_ml);
    return 0;
}
