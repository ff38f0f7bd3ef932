/* Vectorisable float math shared by the kernels (included, so each kernel inlines it). */
#ifndef BATON_VEC_MATH_H
#define BATON_VEC_MATH_H
#include <stdint.h>

/* exp(x): Cephes' single-precision range reduction and polynomial (within 2 ulp of expf over
 * [-87, 88], clamped outside), written so that the compiler vectorises it: glibc's expf is a scalar
 * call per element, which made a fused SiLU slower than torch's two vectorised ops and was the
 * costliest step of the decode kernel's softmax. */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* n = round(x / ln 2) by the add-and-subtract trick (|x / ln 2| < 2^22 here). */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return y * scale.f;
}

#endif
