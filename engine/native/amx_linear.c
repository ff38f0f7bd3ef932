/* y = x @ w.T + b for fp32 x and w, on Intel AMX's bf16 tiles, to fp32 accuracy (prefill-sized products).
 *
 * A float splits exactly into three bfloat16s: x = x1 + x2 + x3 (x1 = bf16(x), x2 = bf16(x - x1),
 * x3 = x - x1 - x2; each residual is exact in fp32 and the last has at most 8 significant bits).
 * The weight is split the same way once (baton_amx_pack_weight), and x at every call. A bf16 product
 * is exact in fp32 (8 x 8 significant bits), and the tiles accumulate in fp32, so
 *     x . w = sum over the pairs (i, j) of xi . wj
 * costs one tile product a pair. Six pairs are kept: (1,1) (1,2) (2,1) (1,3) (2,2) (3,1). The three
 * left out, x2.w3 + x3.w2 + x3.w3, are below 2^-25 |x||w| a product (each residual is at most 2^-9 of
 * what it follows), under the 2^-24 rounding an fp32 multiply-add makes on every product: this is the
 * known "bf16x6" scheme, fp32-class results from AMX (Henry, Tang, Heinecke, ARITH 2019). A weight
 * with at most 16 significant bits (GGUF Q4_1's d * q, for one) has no third piece, and then every
 * product is exact. Denormal pieces flush to zero (AMX and the bf16 converts treat them so): at most
 * 2^-126 apiece, far under the rounding.
 *
 * Six bf16 tile products against one fp32 multiply-add stream still win where AMX runs: 16 x 16 x 32
 * multiply-adds a tile product, about 16 cycles, against 512 AVX-512 FMAs.
 *
 * Layouts (uint16 bf16), 1 KiB tiles:
 *   weight: [N / 16][K / 32][3 pieces][16 k-pairs][16 outputs][2]  (AMX's B operand, "VNNI" pairs)
 *   x:      [M / 16][K / 32][3 pieces][16 rows][32]                (the A operand), split per call
 * N, K and M are padded to the tiles with zeros. C tiles: 2 x 2 of 16 x 16 fp32 (32 rows x 32
 * outputs a block), with 2 A and 2 B tiles: AMX's 8 tile registers.
 *
 * Threads: the caller's OpenMP runtime (torch's libgomp, loaded first: build.py). Each thread takes a
 * share of the 32-output blocks, so it reads its own part of the weight; rows go in chunks that keep
 * their split x in L2 while the thread's blocks pass over them, and a long K in blocks that keep the
 * chunks long (k_block_tiles).
 *
 * Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM), once per
 * process: baton_amx_available asks. Built without AMX (-march=native on another CPU) every entry
 * point says "unavailable".
 */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <omp.h>

#define TILE_ROWS 16
#define TILE_K 32
#define PIECES 3
#define TILE_ELEMS 512 /* bf16 in a 1 KiB tile */

int baton_amx_tile_elems(void) { return TILE_ELEMS; }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

int baton_amx_available(void) {
    /* Granted once per process; asking again is harmless. */
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = TILE_ROWS;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Three bf16 pieces of 16 floats (round to nearest even; the residuals are exact in fp32). */
static inline void split16(__m512 x, __m256i *p1, __m256i *p2, __m256i *p3) {
    __m256bh h1 = _mm512_cvtneps_pbh(x);
    __m512 r1 = _mm512_sub_ps(x, _mm512_cvtpbh_ps(h1));
    __m256bh h2 = _mm512_cvtneps_pbh(r1);
    __m512 r2 = _mm512_sub_ps(r1, _mm512_cvtpbh_ps(h2));
    __m256bh h3 = _mm512_cvtneps_pbh(r2);
    *p1 = (__m256i)h1;
    *p2 = (__m256i)h2;
    *p3 = (__m256i)h3;
}

static inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

int64_t baton_amx_packed_weight_elems(int64_t n, int64_t k) {
    return round_up(n, 32) * round_up(k, TILE_K) * PIECES;
}

/* w [n, k] fp32 (row stride ldw) -> out, baton_amx_packed_weight_elems(n, k) bf16. */
int baton_amx_pack_weight(const float *w, int64_t ldw, int64_t n, int64_t k, uint16_t *out, int num_threads) {
    if (n <= 0 || k <= 0 || ldw < k) return 1;
    const int64_t nt_count = round_up(n, 32) / TILE_ROWS, kt_count = round_up(k, TILE_K) / TILE_K;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t nt = 0; nt < nt_count; nt++) {
        for (int64_t kt = 0; kt < kt_count; kt++) {
            uint16_t *tile = out + ((nt * kt_count + kt) * PIECES) * TILE_ELEMS;
            for (int j = 0; j < TILE_ROWS; j++) { /* output j of this tile: column j of B */
                int64_t row = nt * TILE_ROWS + j;
                float vals[TILE_K];
                for (int c = 0; c < TILE_K; c++) {
                    int64_t col = kt * TILE_K + c;
                    vals[c] = (row < n && col < k) ? w[row * ldw + col] : 0.0f;
                }
                __m256i p[PIECES][2];
                split16(_mm512_loadu_ps(vals), &p[0][0], &p[1][0], &p[2][0]);
                split16(_mm512_loadu_ps(vals + 16), &p[0][1], &p[1][1], &p[2][1]);
                for (int piece = 0; piece < PIECES; piece++) {
                    uint16_t h[TILE_K];
                    _mm256_storeu_si256((__m256i *)h, p[piece][0]);
                    _mm256_storeu_si256((__m256i *)(h + 16), p[piece][1]);
                    uint16_t *dst = tile + piece * TILE_ELEMS;
                    for (int c = 0; c < TILE_K; c++) /* k-pair c / 2, output j, half c % 2 */
                        dst[(c / 2) * 32 + j * 2 + (c % 2)] = h[c];
                }
            }
        }
    }
    return 0;
}

/* x rows [m0, m0 + rows) -> tiles of their three pieces (rows padded with zeros to 32). */
static void split_rows(const float *x, int64_t ldx, int64_t m, int64_t k, int64_t m0, int64_t rows,
                       int64_t kt_count, uint16_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = m0 + r;
        const int64_t mt = r / TILE_ROWS, in_tile = r % TILE_ROWS;
        for (int64_t kt = 0; kt < kt_count; kt++) {
            uint16_t *tile = out + ((mt * kt_count + kt) * PIECES) * TILE_ELEMS + in_tile * TILE_K;
            __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
            if (row < m) {
                const float *src = x + row * ldx + kt * TILE_K;
                int64_t left = k - kt * TILE_K;
                __mmask16 mlo = left >= 16 ? 0xFFFF : (__mmask16)((1u << (left > 0 ? left : 0)) - 1);
                __mmask16 mhi = left >= 32 ? 0xFFFF : (left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0);
                lo = _mm512_maskz_loadu_ps(mlo, src);
                hi = _mm512_maskz_loadu_ps(mhi, src + 16);
            }
            __m256i a[PIECES], b[PIECES];
            split16(lo, &a[0], &a[1], &a[2]);
            split16(hi, &b[0], &b[1], &b[2]);
            for (int piece = 0; piece < PIECES; piece++) {
                _mm256_storeu_si256((__m256i *)(tile + piece * TILE_ELEMS), a[piece]);
                _mm256_storeu_si256((__m256i *)(tile + piece * TILE_ELEMS + 16), b[piece]);
            }
        }
    }
}

/* The four accumulators (0-3) += the A tiles (4, 5) times the B tiles (6, 7). */
static inline void products_2x2(void) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

/* The same four products, each B tile refilled (with w's next piece, b0 and b1) right after its
 * last reader, so the load overlaps the products still running. */
static inline void products_then_next_w(const uint16_t *b0, const uint16_t *b1) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(6, b0, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(7, b1, 64);
}

/* The same with the A tiles refilled (x's next piece). */
static inline void products_then_next_x(const uint16_t *a0, const uint16_t *a1) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(4, a0, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(5, a1, 64);
}

/* One 32 x 32 block of y: rows (m-tiles mt, mt + 1 of the chunk), outputs (n-tiles nt, nt + 1).
 * The six pairs (x piece, w piece) of a k-tile go in the order 13 12 22 21 11 31, where each step
 * changes only x's piece or only w's: 14 tile loads a k-tile for 24 products (18 in the plain
 * order), each issued right after the last product reading the tile it refills. Measured 1.05-1.09x
 * the plain order on SmolLM2's shapes (BENCHMARKS, "Engine: AMX for prefill"). */
static inline void block(const uint16_t *a0, const uint16_t *a1, const uint16_t *b0, const uint16_t *b1,
                         int64_t kt_count, float *c /* [32][32] */, int resume) {
    const int64_t step = PIECES * TILE_ELEMS; /* one k-tile's three pieces */
    const int64_t p2 = TILE_ELEMS, p3 = 2 * TILE_ELEMS;
    if (resume) {
        _tile_loadd(0, c, 32 * 4);
        _tile_loadd(1, c + 16, 32 * 4);
        _tile_loadd(2, c + 16 * 32, 32 * 4);
        _tile_loadd(3, c + 16 * 32 + 16, 32 * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    _tile_loadd(4, a0, 64);
    _tile_loadd(5, a1, 64);
    _tile_loadd(6, b0 + p3, 64);
    _tile_loadd(7, b1 + p3, 64);
    for (int64_t kt = 0; kt < kt_count; kt++, a0 += step, a1 += step, b0 += step, b1 += step) {
        products_then_next_w(b0 + p2, b1 + p2);  /* x1 w3, then w2 */
        products_then_next_x(a0 + p2, a1 + p2);  /* x1 w2, then x2 */
        products_then_next_w(b0, b1);            /* x2 w2, then w1 */
        products_then_next_x(a0, a1);            /* x2 w1, then x1 */
        products_then_next_x(a0 + p3, a1 + p3);  /* x1 w1, then x3 */
        if (kt + 1 < kt_count) {                 /* x3 w1, then the next k-tile's x1 and w3 */
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(4, a0 + step, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_loadd(6, b0 + step + p3, 64);
            _tile_dpbf16ps(3, 5, 7);
            _tile_loadd(5, a1 + step, 64);
            _tile_loadd(7, b1 + step + p3, 64);
        } else {
            products_2x2();
        }
    }
    _tile_stored(0, c, 32 * 4);
    _tile_stored(1, c + 16, 32 * 4);
    _tile_stored(2, c + 16 * 32, 32 * 4);
    _tile_stored(3, c + 16 * 32 + 16, 32 * 4);
}

/* K goes in even blocks of k-tiles, as few as keep a chunk of at least MIN_CHUNK_ROWS rows of split x
 * in about 1 MiB: each 32-output block of the weight is then used on that many rows before the next
 * chunk reads it again. Whole K, a long one (8192: Llama-3.2-1B's down projection) left chunks of 32
 * rows, the weight read from memory again every 32 rows: 1.2-1.7x slower at K 4864-8192, 1.06-1.12x
 * at 1536 (BENCHMARKS, "Engine: AMX for prefill"). The sums go on between K blocks in a per-thread
 * buffer (tile stores and loads: exact). */
#define MIN_CHUNK_ROWS 128
static int64_t k_block_tiles(int64_t kt_count) {
    int64_t most = ((int64_t)1 << 20) / (MIN_CHUNK_ROWS * TILE_K * PIECES * 2);
    if (most < 1) most = 1;
    int64_t blocks = (kt_count + most - 1) / most;
    return (kt_count + blocks - 1) / blocks;
}

/* Rows a chunk holds: its split x (rows x the K block x 3 bf16) about 1 MiB, whole 32-row blocks. */
static int64_t chunk_rows(int64_t kc_tiles) {
    int64_t rows = ((int64_t)1 << 20) / (kc_tiles * TILE_K * PIECES * 2) / 32 * 32;
    return rows < 32 ? 32 : rows;
}

int64_t baton_amx_scratch_elems(int64_t m, int64_t k) {
    (void)m;
    int64_t kc = k_block_tiles(round_up(k, TILE_K) / TILE_K);
    return chunk_rows(kc) * kc * TILE_K * PIECES;
}

int baton_amx_linear(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y, int64_t ldy,
                     int64_t m, int64_t n, int64_t k, uint16_t *scratch, int num_threads) {
    if (m <= 0 || n <= 0 || k <= 0 || ldx < k || ldy < n) return 1;
    const int64_t kp = round_up(k, TILE_K), kt_count = kp / TILE_K;
    const int64_t kc = k_block_tiles(kt_count);
    const int64_t n_blocks = round_up(n, 32) / 32, rows_per_chunk = chunk_rows(kc);
    const int64_t w_step = kt_count * PIECES * TILE_ELEMS; /* one n-tile's span in the weight */
    const int64_t x_step = kc * PIECES * TILE_ELEMS;       /* one m-tile's span in the scratch */
    int failed = 0;
    for (int64_t m0 = 0; m0 < m; m0 += rows_per_chunk) {
        const int64_t rows = m - m0 < rows_per_chunk ? m - m0 : rows_per_chunk;
        const int64_t row_blocks = round_up(rows, 32) / 32;
#pragma omp parallel num_threads(num_threads)
        {
            const int threads = omp_get_num_threads(), t = omp_get_thread_num();
            const int64_t m_tiles = row_blocks * 2;
            const int64_t t0 = m_tiles * t / threads, t1 = m_tiles * (t + 1) / threads;
            const int64_t b0 = n_blocks * t / threads, b1 = n_blocks * (t + 1) / threads;
            /* The sums between K blocks: one 32 x 32 block for each of this thread's output blocks and row blocks. */
            float *acc = NULL;
            if (kc < kt_count) {
                acc = aligned_alloc(64, (size_t)((b1 - b0) * row_blocks + 1) * 1024 * sizeof(float));
                if (acc == NULL) {
#pragma omp atomic write
                    failed = 1;
                }
            }
#pragma omp barrier
            float c_local[32 * 32] __attribute__((aligned(64)));  /* whole K in one block: each block's sums */
            for (int64_t kb = 0; kb < kt_count && !failed; kb += kc) {
                const int64_t kts = kt_count - kb < kc ? kt_count - kb : kc;
                /* Split this K block of the chunk's x: each thread a share of its 16-row tiles (padding too). */
                for (int64_t mt = t0; mt < t1; mt++)
                    split_rows(x + kb * TILE_K, ldx, m, k - kb * TILE_K, m0 + mt * TILE_ROWS, TILE_ROWS, kts,
                               scratch + mt * x_step);
#pragma omp barrier
                configure_tiles();
                const int last = kb + kts >= kt_count;
                for (int64_t nb = b0; nb < b1; nb++) {
                    const uint16_t *w0 = w + (2 * nb) * w_step + kb * PIECES * TILE_ELEMS, *w1 = w0 + w_step;
                    for (int64_t rb = 0; rb < row_blocks; rb++) {
                        const uint16_t *x0 = scratch + (2 * rb) * x_step, *x1 = x0 + x_step;
                        float *c = acc ? acc + ((nb - b0) * row_blocks + rb) * 1024 : c_local;
                        block(x0, x1, w0, w1, kts, c, kb > 0);
                        if (!last) continue;
                        const int64_t cols = n - nb * 32 < 32 ? n - nb * 32 : 32;
                        const int64_t live = rows - rb * 32 < 32 ? rows - rb * 32 : 32;
                        const __mmask16 mlo = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
                        const __mmask16 mhi = cols >= 32 ? 0xFFFF : (cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0);
                        __m512 blo = _mm512_setzero_ps(), bhi = _mm512_setzero_ps();
                        if (bias) {
                            blo = _mm512_maskz_loadu_ps(mlo, bias + nb * 32);
                            bhi = _mm512_maskz_loadu_ps(mhi, bias + nb * 32 + 16);
                        }
                        for (int64_t r = 0; r < live; r++) {
                            float *dst = y + (m0 + rb * 32 + r) * ldy + nb * 32;
                            _mm512_mask_storeu_ps(dst, mlo, _mm512_add_ps(_mm512_load_ps(c + r * 32), blo));
                            _mm512_mask_storeu_ps(dst + 16, mhi, _mm512_add_ps(_mm512_load_ps(c + r * 32 + 16), bhi));
                        }
                    }
                }
                _tile_release();
                if (!last) { /* the next K block's split overwrites the scratch the other threads read */
#pragma omp barrier
                }
            }
            free(acc);
        }
        if (failed) return 2; /* out of memory */
    }
    return 0;
}

#else /* built without AMX */

int baton_amx_available(void) { return 0; }
int64_t baton_amx_packed_weight_elems(int64_t n, int64_t k) { (void)n; (void)k; return 0; }
int baton_amx_pack_weight(const float *w, int64_t ldw, int64_t n, int64_t k, uint16_t *out, int num_threads) {
    (void)w; (void)ldw; (void)n; (void)k; (void)out; (void)num_threads;
    return 1;
}
int64_t baton_amx_scratch_elems(int64_t m, int64_t k) { (void)m; (void)k; return 0; }
int baton_amx_linear(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y, int64_t ldy,
                     int64_t m, int64_t n, int64_t k, uint16_t *scratch, int num_threads) {
    (void)x; (void)ldx; (void)w; (void)bias; (void)y; (void)ldy; (void)m; (void)n; (void)k; (void)scratch;
    (void)num_threads;
    return 1;
}

#endif
