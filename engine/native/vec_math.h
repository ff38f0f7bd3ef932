/* Vectorisable float math shared by the kernels (included, so each kernel inlines it). */
#ifndef BATON_VEC_MATH_H
#define BATON_VEC_MATH_H
#include <stdint.h>

/* exp_poly's steps after the clamp, on x of any float type (float, or v8 below), defining n (the
 * power of 2) and y (the polynomial): one copy of the constants for the scalar and the 8-lane form.
 * ZERO is that type's 0, so p starts from the constant itself (0 + c is c: the same floats). */
#define EXP_POLY_STEPS(x, ZERO, n, y)                                                          \
    /* n = round(x / ln 2) by the add-and-subtract trick (|x / ln 2| < 2^22 here). */          \
    const __typeof__(x) n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;          \
    __typeof__(x) r_ = x - n * 0.693359375f;                                                   \
    r_ = r_ - n * -2.12194440e-4f;                                                             \
    __typeof__(x) p_ = (ZERO) + 1.9875691500e-4f;                                              \
    p_ = p_ * r_ + 1.3981999507e-3f;                                                           \
    p_ = p_ * r_ + 8.3334519073e-3f;                                                           \
    p_ = p_ * r_ + 4.1665795894e-2f;                                                           \
    p_ = p_ * r_ + 1.6666665459e-1f;                                                           \
    p_ = p_ * r_ + 5.0000001201e-1f;                                                           \
    const __typeof__(x) y = p_ * (r_ * r_) + r_ + 1.0f

/* exp(x): Cephes' single-precision range reduction and polynomial (within 2 ulp of expf over
 * [-87, 88], clamped outside), written so that the compiler vectorises it: glibc's expf is a scalar
 * call per element, which made a fused SiLU slower than torch's two vectorised ops and was the
 * costliest step of the decode kernel's softmax. */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    EXP_POLY_STEPS(x, 0.0f, n, y);
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return y * scale.f;
}

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t vi8 __attribute__((vector_size(32), aligned(4)));

static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }

/* exp_poly on 8 lanes, the same operations in the same order (so the same floats, NaN and the
 * clamped ends included), written with vector types: in a loop that also divides and multiplies
 * (the fused SiLU), GCC's vectorisation of the scalar version if-converted the clamp into blends
 * around the division and ran 2.6x slower than this (AMD Zen 3, docs/BENCHMARKS.md). */
static inline v8 exp_poly8(v8 x) {
    const vi8 below = x < splat8(-87.0f), above = x > splat8(88.0f); /* false for NaN, as above */
    x = (v8)((below & (vi8)splat8(-87.0f)) | (~below & (vi8)x));
    x = (v8)((above & (vi8)splat8(88.0f)) | (~above & (vi8)x));
    EXP_POLY_STEPS(x, (v8){0}, n, y);
    return y * (v8)((__builtin_convertvector(n, vi8) + 127) << 23);
}

/* Lane sums of eight 8-lane vectors: r[j] = sum of a[j]'s lanes, as a tree of shuffles and adds that
 * halves the lanes per column at each level (the AVX2 tile of skinny_tile.h, the AVX2 decode scores). */
static inline v8 hsum8x8(const v8 a[8]) {
    v8 b[4], c[2];
    for (int j = 0; j < 4; j++) /* b[j]: 4 lanes of column 2j, then 4 of column 2j+1 */
        b[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(a[2 * j], a[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int j = 0; j < 2; j++) /* c[j]: 2 lanes each of columns 4j .. 4j+3 */
        c[j] = __builtin_shufflevector(b[2 * j], b[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               __builtin_shufflevector(b[2 * j], b[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

#endif
