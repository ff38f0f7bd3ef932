/* Paged decode attention on CPU, reading K and V where they lie in the block-major cache.
 *
 * The torch path (engine/attention/cpu.py) gathers every sequence's blocks into a dense buffer per layer and
 * runs SDPA over it padded to the longest row: the KV is read, written and read again, and short
 * rows pay for long ones. Here each (sequence, KV head) task walks its own blocks once, with the
 * blocks two ahead prefetched, and keeps an online softmax (running max and sum, float32, as flash
 * decoding does) so K and V are each read exactly once and nothing is written but the output.
 * The G query heads that share a KV head are done together, so each K/V row is loaded once for
 * all of them. Tasks run on the caller's OpenMP runtime (torch's libgomp, loaded before this
 * library: build.py), at most `num_threads` at once.
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

#include "vec_math.h"

#define MAX_GROUP 8
#define MAX_DV 8 /* head_dim / 16 */
#define MAX_BLOCK 64

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef float v4 __attribute__((vector_size(16), aligned(4)));

static inline float hsum16(v16 x) {
    v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline __attribute__((always_inline)) void prefetch_block(const float *b, int rows, int64_t token_stride, int dv) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < dv; j++) __builtin_prefetch(b + (int64_t)i * token_stride + 16 * j);
}

/* One (sequence, KV head) task: G query heads of head_dim 16 * DV. Inlined with constant G and DV
 * for the common shapes (the accumulators then live in registers), called as is for the rest. */
static inline __attribute__((always_inline)) void attend(
    const int G, const int DV, const float *q, const float *k, const float *v, int64_t block_stride,
    int64_t token_stride, const int32_t *table, int len, int block_size, float scale, float *out) {
    v16 qv[MAX_GROUP][MAX_DV], acc[MAX_GROUP][MAX_DV];
    float m[MAX_GROUP], l[MAX_GROUP], p[MAX_GROUP][MAX_BLOCK];
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        for (int j = 0; j < DV; j++) {
            qv[g][j] = *(const v16 *)(q + (g * DV + j) * 16) * scale;
            acc[g][j] = (v16){0};
        }
    }
    const int nblocks = (len + block_size - 1) / block_size;
    for (int b = 0; b < 2 && b < nblocks; b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        prefetch_block(k + at, block_size, token_stride, DV);
        prefetch_block(v + at, block_size, token_stride, DV);
    }
    for (int b = 0; b < nblocks; b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        const float *kb = k + at, *vb = v + at;
        const int n = len - b * block_size < block_size ? len - b * block_size : block_size;
        if (b + 2 < nblocks) { /* blocks lie anywhere in memory: start loading two ahead */
            const int64_t next = (int64_t)table[b + 2] * block_stride;
            prefetch_block(k + next, block_size, token_stride, DV);
            prefetch_block(v + next, block_size, token_stride, DV);
        }
        for (int i = 0; i < n; i++) {
            v16 kr[MAX_DV];
            for (int j = 0; j < DV; j++) kr[j] = *(const v16 *)(kb + i * token_stride + 16 * j);
            for (int g = 0; g < G; g++) {
                v16 dot = qv[g][0] * kr[0];
                for (int j = 1; j < DV; j++) dot += qv[g][j] * kr[j];
                p[g][i] = hsum16(dot);
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
            for (int j = 0; j < DV; j++) vr[j] = *(const v16 *)(vb + i * token_stride + 16 * j);
            for (int g = 0; g < G; g++)
                for (int j = 0; j < DV; j++) acc[g][j] += p[g][i] * vr[j];
        }
    }
    for (int g = 0; g < G; g++) {
        const float inv = len > 0 ? 1.f / l[g] : 0.f;
        for (int j = 0; j < DV; j++) *(v16 *)(out + (g * DV + j) * 16) = acc[g][j] * inv;
    }
}

static void attend_any(int G, int DV, const float *q, const float *k, const float *v, int64_t block_stride,
                       int64_t token_stride, const int32_t *table, int len, int block_size, float scale, float *out) {
    attend(G, DV, q, k, v, block_stride, token_stride, table, len, block_size, scale, out);
}

int baton_paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t block_stride,
                           int64_t token_stride, const int32_t *block_tables, int64_t bt_stride,
                           const int32_t *seq_lens, int num_seqs, int num_heads, int kv_heads,
                           int head_dim, int block_size, float scale, float *out, int num_threads) {
    const int group = num_heads / kv_heads, dv = head_dim / 16;
    if (num_heads % kv_heads || group > MAX_GROUP || head_dim % 16 || dv > MAX_DV || block_size > MAX_BLOCK)
        return 1;
    const int tasks = num_seqs * kv_heads;
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
    for (int task = 0; task < tasks; task++) {
        const int s = task / kv_heads, h = task % kv_heads;
        const int64_t first = (int64_t)h * group * head_dim; /* the group's first query head */
        const float *qs = q + s * q_stride + first, *kh = k + (int64_t)h * head_dim, *vh = v + (int64_t)h * head_dim;
        float *o = out + (int64_t)s * num_heads * head_dim + first;
        const int32_t *table = block_tables + (int64_t)s * bt_stride;
        const int len = seq_lens[s];
#define ATTEND(G, DV) attend(G, DV, qs, kh, vh, block_stride, token_stride, table, len, block_size, scale, o)
        switch (group * 16 + dv) {
        case 1 * 16 + 4: ATTEND(1, 4); break;
        case 2 * 16 + 4: ATTEND(2, 4); break;
        case 3 * 16 + 4: ATTEND(3, 4); break;
        case 4 * 16 + 4: ATTEND(4, 4); break;
        case 7 * 16 + 4: ATTEND(7, 4); break;
        case 2 * 16 + 2: ATTEND(2, 2); break;
        case 4 * 16 + 8: ATTEND(4, 8); break;
        case 8 * 16 + 8: ATTEND(8, 8); break;
        default: attend_any(group, dv, qs, kh, vh, block_stride, token_stride, table, len, block_size, scale, o);
        }
    }
    return 0;
}
