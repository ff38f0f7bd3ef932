/* Fused per-token operations of a Llama-family layer on CPU (fp32), replacing chains of small torch
 * ops: each chain was one pass over memory and one dispatch per op, 8 for an RMSNorm and a dozen
 * for the rotary embedding, 30 layers deep. Compiled with -ffp-contract=off (build.py) so the rotary
 * arithmetic rounds exactly like transformers' (products, then the sum; no fused multiply-add).
 * Rows run on the caller's OpenMP runtime (torch's), at most `num_threads` at once.
 */
#include <math.h>
#include <stdint.h>

#include "vec_math.h"

/* h += delta (when delta is given), then out = weight * (h * rsqrt(mean(h^2) + eps)), row by row:
 * the residual add and the next RMSNorm, in transformers' order of operations, in one pass. */
void baton_add_rms_norm_f32(float *h, const float *delta, const float *weight, float *out, int64_t rows,
                            int64_t dim, float eps, int num_threads) {
#pragma omp parallel for num_threads(rows > 1 ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *hr = h + r * dim;
        float *o = out + r * dim;
        if (delta) {
            const float *dr = delta + r * dim;
#pragma omp simd
            for (int64_t i = 0; i < dim; i++) hr[i] = hr[i] + dr[i];
        }
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < dim; i++) ss += hr[i] * hr[i];
        const float inv = 1.f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) o[i] = weight[i] * (hr[i] * inv);
    }
}

/* Rotary embedding (rotate-half layout) in place on the q and k heads of each token's fused qkv row:
 * x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, with cos/sin rows [max_positions, head_dim / 2]. */
void baton_rope_qk_f32(float *qkv, int64_t row_stride, const int64_t *positions, int64_t rows,
                       const float *cos_table, const float *sin_table, int heads, int head_dim,
                       int num_threads) {
    const int half = head_dim / 2;
#pragma omp parallel for num_threads(rows > 1 ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_table + positions[r] * half, *s = sin_table + positions[r] * half;
        float *row = qkv + r * row_stride;
        for (int hd = 0; hd < heads; hd++) {
            float *x1 = row + (int64_t)hd * head_dim, *x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
}

/* out = silu(gate) * up for gate_up rows [gate | up] of 2 * dim: one pass instead of three. */
void baton_silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t dim, int num_threads) {
#pragma omp parallel for num_threads(rows > 1 ? num_threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * dim, *u = g + dim;
        float *o = out + r * dim;
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8) { /* 8 lanes written out: exp_poly8 says why */
            const v8 gv = *(const v8 *)(g + i);
            *(v8 *)(o + i) = gv / (1.0f + exp_poly8(-gv)) * *(const v8 *)(u + i);
        }
#pragma omp simd
        for (int64_t j = i; j < dim; j++) o[j] = g[j] / (1.0f + exp_poly(-g[j])) * u[j];
    }
}
