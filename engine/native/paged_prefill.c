/* Paged prefill attention on CPU: every prefill chunk of a step in one call, each causal over its
 * cached prefix and itself, reading K and V where they lie in the block-major cache.
 *
 * The torch path (engine/attention/cpu.py) gathers each sequence's blocks and calls SDPA once per
 * sequence per layer: a 160-token prompt costs ~0.5 ms a layer there, mostly fixed cost (a thread
 * pool dispatch, the gather, transposes), about 30 GFLOP/s; a chunk after a cached prefix takes two
 * calls merged by their log-sum-exps. Here one parallel region runs all of a step's tiles.
 *
 * A task is (sequence, KV head, tile of LANES query positions: 16, 8 on AVX2): the G query heads sharing the KV head
 * are done together, so each K/V element is loaded once for G * LANES queries. Queries sit in vector
 * lanes (Q is transposed once per task, pre-scaled): a score vector is LANES queries against one key,
 * K and V are read as scalars broadcast from the cache where they lie, and the online softmax
 * (running max and sum per query, float32, flash attention's) is lane-wise, with no horizontal sums.
 * The output accumulates transposed ([head_dim][G][LANES queries]) and is written back at the end.
 * Causality: query lane i of a tile at position first_pos + i sees keys up to it; only the blocks
 * that reach past first_pos are masked (probabilities set to 0 after the exp).
 *
 * Layout: k/v point at one layer's view [num_blocks, block_size, kv_heads, head_dim] with element
 * strides (block_stride, token_stride, head_dim, 1). q is [T, heads, head_dim], rows q_stride apart
 * (a view of the fused qkv rows), heads contiguous; out is contiguous [T, heads, head_dim].
 * block_tables [S, bt_stride] int32; cu_seqlens_q [S + 1] int32 offsets of each sequence's query rows;
 * seq_lens [S] int32 context lengths including the chunk (its queries are the last q_len positions).
 * Limits (checked by the caller, paged_prefill.py): head_dim a multiple of 16 up to 128, at most 8
 * query heads per KV head, block_size at most 64.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec_math.h"

#define MAX_GROUP 8
#define MAX_HEAD_DIM 128
#define MAX_BLOCK 64

/* A vector of query lanes: 16 on AVX-512 (32 registers), 8 on AVX2 (16 registers). Each lane is
 * one query, taken through the same operations in the same order in either build. */
#if defined(__AVX512F__)
#define LANES 16
typedef float vq __attribute__((vector_size(64), aligned(64)));
#else
#define LANES 8
typedef float vq __attribute__((vector_size(32), aligned(32)));
#endif

/* 1 where the build has vectors the register blocks below are sized for: AVX-512, or AVX2 with FMA
 * (the blocks of 8-lane vectors halved for its 16 registers; the AVX-512 blocks compiled for AVX2
 * spilled, and on a Zen 3 host SmolLM2's offline run then spent 39 s in its prefill steps against
 * 23 s on the torch path). */
int baton_paged_prefill_tuned(void) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return 1;
#else
    return 0;
#endif
}

/* Keys (in the score product) or head dims (in the value product) per register block, so that
 * the block's accumulators (this times G vectors), the G query or probability vectors and a
 * broadcast stay within the registers (32 on AVX-512, 16 on AVX2). */
#if LANES == 16
#define REG_BLOCK(G) ((G) <= 1 ? 16 : (G) <= 3 ? 8 : (G) <= 6 ? 4 : 2)
#else
#define REG_BLOCK(G) ((G) <= 1 ? 8 : (G) <= 3 ? 4 : (G) <= 4 ? 2 : 1)
#endif

/* The buffers of one thread, reused by its tasks. */
typedef struct {
    vq *qt; /* [head_dim][G]: the tile's queries, transposed and scaled */
    vq *ot; /* [head_dim][G]: the output, transposed, unnormalised */
    vq *pt; /* [block_size][G]: one block's scores, then probabilities */
} Scratch;

static inline __attribute__((always_inline)) void prefill_tile(
    const int G, const int D, const int KB, const float *q, int64_t q_stride, const float *k, const float *v,
    int64_t block_stride, int64_t token_stride, const int32_t *table, int rows, int first_pos, int block_size,
    float scale, float *out, int64_t out_stride, Scratch s) {
    vq *restrict qt = s.qt, *restrict ot = s.ot, *restrict pt = s.pt;
    float *qf = (float *)qt;
    memset(qt, 0, sizeof(vq) * D * G);
    memset(ot, 0, sizeof(vq) * D * G);
    for (int i = 0; i < rows; i++)
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) qf[((int64_t)d * G + g) * LANES + i] = q[i * q_stride + g * D + d] * scale;
    float m[MAX_GROUP][LANES], l[MAX_GROUP][LANES];
    float alpha[MAX_GROUP][LANES] __attribute__((aligned(64))); /* read back as vectors */
    for (int g = 0; g < G; g++)
        for (int i = 0; i < LANES; i++) m[g][i] = -INFINITY, l[g][i] = 0.f;
    const int nkeys = first_pos + rows; /* the tile's last query sees keys 0 .. nkeys - 1 */
    for (int k0 = 0, b = 0; k0 < nkeys; k0 += block_size, b++) {
        const int64_t at = (int64_t)table[b] * block_stride;
        const float *kb = k + at, *vb = v + at;
        const int n = nkeys - k0 < block_size ? nkeys - k0 : block_size;
        /* scores: pt[j][g] = sum_d K[j][d] * qt[d][g], KB keys at a time (the last block's tail
         * re-reads its last key rather than reading past it; those scores are never used) */
        for (int j = 0; j < n; j += KB) {
            const float *kr[16];
            for (int kk = 0; kk < KB; kk++) kr[kk] = kb + (int64_t)(j + kk < n ? j + kk : n - 1) * token_stride;
            vq acc[16][MAX_GROUP];
            for (int kk = 0; kk < KB; kk++)
                for (int g = 0; g < G; g++) acc[kk][g] = (vq){0};
            for (int d = 0; d < D; d++) {
                vq qd[MAX_GROUP];
                for (int g = 0; g < G; g++) qd[g] = qt[d * G + g];
                for (int kk = 0; kk < KB; kk++) {
                    const float kv = kr[kk][d];
                    for (int g = 0; g < G; g++) acc[kk][g] += kv * qd[g];
                }
            }
            for (int kk = 0; kk < KB && j + kk < n; kk++)
                for (int g = 0; g < G; g++) pt[(j + kk) * G + g] = acc[kk][g];
        }
        /* online softmax, lane-wise; keys past a lane's position (only in blocks reaching past
         * first_pos) get probability 0 and do not move its max */
        const int masked = k0 + n - 1 > first_pos;
        for (int g = 0; g < G; g++) {
            float mx[LANES], sum[LANES];
            for (int i = 0; i < LANES; i++) mx[i] = m[g][i], sum[i] = 0.f;
            for (int j = 0; j < n; j++) {
                const float *sj = (const float *)&pt[j * G + g];
                const int first_lane = k0 + j - first_pos; /* lanes below this do not see key k0 + j */
#pragma omp simd
                for (int i = 0; i < LANES; i++) {
                    const float x = masked && i < first_lane ? -INFINITY : sj[i];
                    mx[i] = x > mx[i] ? x : mx[i];
                }
            }
#pragma omp simd
            for (int i = 0; i < LANES; i++) {
                /* lane i's first block always holds key 0, which it sees: mx is finite from there on */
                alpha[g][i] = exp_poly(m[g][i] - mx[i]);
                m[g][i] = mx[i];
            }
            for (int j = 0; j < n; j++) {
                float *sj = (float *)&pt[j * G + g];
                const int first_lane = k0 + j - first_pos;
#pragma omp simd
                for (int i = 0; i < LANES; i++) {
                    const float p = exp_poly(sj[i] - mx[i]);
                    sj[i] = masked && i < first_lane ? 0.f : p;
                    sum[i] += sj[i];
                }
            }
#pragma omp simd
            for (int i = 0; i < LANES; i++) l[g][i] = l[g][i] * alpha[g][i] + sum[i];
        }
        /* values: ot[d][g] = ot[d][g] * alpha[g] + sum_j V[j][d] * pt[j][g], KB head dims at a time */
        vq al[MAX_GROUP];
        for (int g = 0; g < G; g++) al[g] = *(const vq *)alpha[g];
        for (int d0 = 0; d0 < D; d0 += KB) {
            vq acc[16][MAX_GROUP];
            for (int dd = 0; dd < KB; dd++)
                for (int g = 0; g < G; g++) acc[dd][g] = ot[(d0 + dd) * G + g] * al[g];
            for (int j = 0; j < n; j++) {
                const float *vr = vb + (int64_t)j * token_stride + d0;
                vq p[MAX_GROUP];
                for (int g = 0; g < G; g++) p[g] = pt[j * G + g];
                for (int dd = 0; dd < KB; dd++) {
                    const float vv = vr[dd];
                    for (int g = 0; g < G; g++) acc[dd][g] += vv * p[g];
                }
            }
            for (int dd = 0; dd < KB; dd++)
                for (int g = 0; g < G; g++) ot[(d0 + dd) * G + g] = acc[dd][g];
        }
    }
    const float *of = (const float *)ot;
    for (int i = 0; i < rows; i++)
        for (int g = 0; g < G; g++) {
            const float inv = 1.f / l[g][i];
            for (int d = 0; d < D; d++) out[i * out_stride + g * D + d] = of[((int64_t)d * G + g) * LANES + i] * inv;
        }
}

static void prefill_tile_any(int G, int D, const float *q, int64_t q_stride, const float *k, const float *v,
                             int64_t block_stride, int64_t token_stride, const int32_t *table, int rows, int first_pos,
                             int block_size, float scale, float *out, int64_t out_stride, Scratch s) {
    prefill_tile(G, D, 2, q, q_stride, k, v, block_stride, token_stride, table, rows, first_pos, block_size, scale, out,
                 out_stride, s);
}

int baton_paged_prefill_f32(const float *q, int64_t q_stride, const float *k, const float *v, int64_t block_stride,
                            int64_t token_stride, const int32_t *block_tables, int64_t bt_stride,
                            const int32_t *cu_seqlens_q, const int32_t *seq_lens, int num_seqs, int num_heads,
                            int kv_heads, int head_dim, int block_size, float scale, float *out, int num_threads) {
    const int group = num_heads / kv_heads;
    if (num_heads % kv_heads || group > MAX_GROUP || head_dim % 16 || head_dim > MAX_HEAD_DIM ||
        block_size > MAX_BLOCK || block_size < 1)
        return 1;
    /* tiles per sequence, as prefix sums: task t is (tile, KV head) */
    int *first_tile = malloc(sizeof(int) * (num_seqs + 1));
    if (!first_tile) return 2;
    first_tile[0] = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s];
        if (q_len < 0 || q_len > seq_lens[s]) {
            free(first_tile);
            return 3;
        }
        first_tile[s + 1] = first_tile[s] + (q_len + LANES - 1) / LANES;
    }
    const int tasks = first_tile[num_seqs] * kv_heads;
    const int64_t out_stride = (int64_t)num_heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        const size_t per = sizeof(vq) * (size_t)group;
        /* aligned_alloc takes sizes that are multiples of the alignment (8 lanes x an odd G x an odd block is not) */
        const size_t rows_bytes = (per * block_size + 63) / 64 * 64;
        Scratch scratch = {aligned_alloc(64, per * head_dim), aligned_alloc(64, per * head_dim),
                           aligned_alloc(64, rows_bytes)};
        failed = !scratch.qt || !scratch.ot || !scratch.pt;
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tasks; task++) {
            if (failed) continue;
            const int tile = task / kv_heads, h = task % kv_heads;
            int s = 0; /* the tile's sequence: first_tile is sorted */
            for (int lo = 0, hi = num_seqs - 1; lo <= hi;) {
                const int mid = (lo + hi) / 2;
                if (first_tile[mid] <= tile) s = mid, lo = mid + 1; else hi = mid - 1;
            }
            /* a sequence's last tiles see the most keys: run them first, so the short ones fill in at the end */
            const int ntiles = first_tile[s + 1] - first_tile[s], t = ntiles - 1 - (tile - first_tile[s]);
            const int q_len = cu_seqlens_q[s + 1] - cu_seqlens_q[s], prefix = seq_lens[s] - q_len;
            const int i0 = t * LANES, rows = q_len - i0 < LANES ? q_len - i0 : LANES;
            const int64_t row = cu_seqlens_q[s] + i0, first = (int64_t)h * group * head_dim;
            const float *qs = q + row * q_stride + first, *kh = k + (int64_t)h * head_dim, *vh = v + (int64_t)h * head_dim;
            float *o = out + row * out_stride + first;
            const int32_t *table = block_tables + (int64_t)s * bt_stride;
#define TILE(G, D) prefill_tile(G, D, REG_BLOCK(G), qs, q_stride, kh, vh, block_stride, token_stride, table, rows, \
                                prefix + i0, block_size, scale, o, out_stride, scratch)
            switch (group * 1000 + head_dim) {
            case 1 * 1000 + 64: TILE(1, 64); break;
            case 2 * 1000 + 64: TILE(2, 64); break;
            case 3 * 1000 + 64: TILE(3, 64); break;
            case 4 * 1000 + 64: TILE(4, 64); break;
            case 7 * 1000 + 64: TILE(7, 64); break;
            case 2 * 1000 + 32: TILE(2, 32); break;
            case 4 * 1000 + 128: TILE(4, 128); break;
            case 8 * 1000 + 128: TILE(8, 128); break;
            default:
                prefill_tile_any(group, head_dim, qs, q_stride, kh, vh, block_stride, token_stride, table, rows,
                                 prefix + i0, block_size, scale, o, out_stride, scratch);
            }
        }
        free(scratch.qt), free(scratch.ot), free(scratch.pt);
    }
    free(first_tile);
    return failed ? 2 : 0;
}
