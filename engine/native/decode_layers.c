/* A decode step's decoder layers in one call: the same kernels, in the same order, as the Python
 * forward (engine/model/llama.py) runs one call at a time, so the floats are the same bit for bit.
 *
 * A decode step of SmolLM2 makes ~300 kernel calls (10 a layer, 30 layers). From Python each costs
 * ~6-10 us of wrapper, tensor allocation and ctypes conversion on top of its work: ~2-3 ms a step,
 * a quarter of a single stream's 8.5 ms step, all of it on one core while the other waits. Here the
 * layer loop runs in C; the kernels still open their own OpenMP regions.
 *
 * The kernels live in their own libraries (quant_linear.c, skinny_linear.c, layer_ops.c,
 * paged_decode.c); decode_layers.py passes their addresses in `Kernels`, so there is one copy of
 * each and this file only sequences them. Per layer:
 *   x = add_rms_norm(h += delta, ln1); qkv = x @ Wqkv (+ b); rope(q, k); write k, v to the cache;
 *   a = attention(q, cache); delta = a @ Wo; x = add_rms_norm(h += delta, ln2);
 *   delta = silu(x @ Wg) * (x @ Wu) @ Wd
 * then out = add_rms_norm(h += delta, final norm). h (the residual stream) is updated in place.
 */
#include <stdint.h>
#include <string.h>

typedef int (*quant_linear_fn)(const float *x, int64_t x_stride, const uint8_t *wq, int qtype, const float *bias,
                               float *out, int64_t out_stride, int M, int N, int K, int num_threads);
typedef int (*skinny_linear_fn)(const float *x, int64_t x_stride, const float *w, const float *bias, float *out,
                                int64_t out_stride, int M, int N, int K, int num_threads);
typedef void (*add_rms_norm_fn)(float *h, const float *delta, const float *weight, float *out, int64_t rows,
                                int64_t dim, float eps, int num_threads);
typedef void (*rope_fn)(float *qkv, int64_t row_stride, const int64_t *positions, int64_t rows, const float *cos_table,
                        const float *sin_table, int heads, int head_dim, int num_threads);
typedef void (*silu_mul_fn)(const float *gate_up, float *out, int64_t rows, int64_t dim, int num_threads);
typedef int (*paged_decode_fn)(const float *q, int64_t q_stride, const float *k, const float *v, int64_t block_stride,
                               int64_t token_stride, const int32_t *block_tables, int64_t bt_stride,
                               const int32_t *seq_lens, int num_seqs, int num_heads, int kv_heads, int head_dim,
                               int block_size, float scale, float *out, int num_threads);

typedef struct {
    quant_linear_fn quant_linear;
    skinny_linear_fn skinny_linear;
    add_rms_norm_fn add_rms_norm;
    rope_fn rope;
    silu_mul_fn silu_mul;
    paged_decode_fn paged_decode;
} Kernels;

/* One projection: the GGUF blocks (qtype > 0) or the dense fp32 weight (qtype 0), [n, k]. */
typedef struct {
    const void *weight;
    const float *bias;
    int64_t qtype, n, k;
} Projection;

typedef struct {
    Projection qkv, o, gate_up, down;
    const float *ln1, *ln2;
} Layer;

/* The model's fixed shape and the KV cache ([blocks, layers, 2, block, kv_heads, head_dim] strides). */
typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    const float *final_norm, *cos_table, *sin_table;
    float *kv_cache;
    int64_t block_stride, layer_stride, kv_stride, token_stride;
} Model;

/* One step: `rows` decode tokens; `work` holds rows x (hidden + qkv + heads*head_dim + hidden +
 * 2 intermediate + intermediate) floats of scratch. */
typedef struct {
    int64_t rows;
    float *h, *out, *work;
    const int64_t *positions, *slot_block, *slot_offset;
    const int32_t *block_tables, *seq_lens;
    int64_t bt_stride;
    int64_t num_threads;
} Step;

static int project(const Kernels *kn, const Projection *p, const float *x, float *out, int rows, int threads) {
    if (p->qtype > 0)
        return kn->quant_linear(x, p->k, (const uint8_t *)p->weight, (int)p->qtype, p->bias, out, p->n, rows,
                                (int)p->n, (int)p->k, threads);
    return kn->skinny_linear(x, p->k, (const float *)p->weight, p->bias, out, p->n, rows, (int)p->n, (int)p->k, threads);
}

/* Returns 0, or the 1-based index of the layer whose kernel refused its shapes (decode_layers.py
 * builds only what the kernels take: a refusal is a bug there). */
int baton_decode_layers_f32(const Kernels *kn, const Layer *layers, const Model *m, const Step *s) {
    const int rows = (int)s->rows, threads = (int)s->num_threads;
    const int64_t hidden = m->hidden, q_size = m->heads * m->head_dim, kv_size = m->kv_heads * m->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size, inter = m->intermediate;
    float *x = s->work, *qkv = x + rows * hidden, *attn = qkv + rows * qkv_size, *delta = attn + rows * q_size;
    float *gate_up = delta + rows * hidden, *act = gate_up + rows * 2 * inter;
    const float *residual = 0; /* the previous block's output, added into h by the next norm */
    for (int64_t n = 0; n < m->num_layers; n++) {
        const Layer *layer = &layers[n];
        float *k_cache = m->kv_cache + n * m->layer_stride, *v_cache = k_cache + m->kv_stride;
        kn->add_rms_norm(s->h, residual, layer->ln1, x, rows, hidden, m->eps, threads);
        if (project(kn, &layer->qkv, x, qkv, rows, threads)) return (int)n + 1;
        kn->rope(qkv, qkv_size, s->positions, rows, m->cos_table, m->sin_table, (int)(m->heads + m->kv_heads),
                 (int)m->head_dim, threads);
        for (int r = 0; r < rows; r++) { /* k and v into their slots: what write_kv does */
            const int64_t slot = s->slot_block[r] * m->block_stride + s->slot_offset[r] * m->token_stride;
            memcpy(k_cache + slot, qkv + r * qkv_size + q_size, kv_size * sizeof(float));
            memcpy(v_cache + slot, qkv + r * qkv_size + q_size + kv_size, kv_size * sizeof(float));
        }
        if (kn->paged_decode(qkv, qkv_size, k_cache, v_cache, m->block_stride, m->token_stride, s->block_tables,
                             s->bt_stride, s->seq_lens, rows, (int)m->heads, (int)m->kv_heads, (int)m->head_dim,
                             (int)m->block_size, m->scale, attn, threads))
            return (int)n + 1;
        if (project(kn, &layer->o, attn, delta, rows, threads)) return (int)n + 1;
        kn->add_rms_norm(s->h, delta, layer->ln2, x, rows, hidden, m->eps, threads);
        if (project(kn, &layer->gate_up, x, gate_up, rows, threads)) return (int)n + 1;
        kn->silu_mul(gate_up, act, rows, inter, threads);
        if (project(kn, &layer->down, act, delta, rows, threads)) return (int)n + 1;
        residual = delta;
    }
    kn->add_rms_norm(s->h, residual, m->final_norm, s->out, rows, hidden, m->eps, threads);
    return 0;
}
