"""Rope scaling in a GGUF file, as transformers' ``rope_scaling`` (pure Python, no torch).

llama.cpp's converter keeps Llama 3.x's ``llama3`` scaling only as the tensor ``rope_freqs.weight``:
one divisor per rotary frequency (1 for the high frequencies, ``factor`` for the low ones, a smooth
ramp between), with no metadata key. Dropping it (as transformers' own GGUF loader does) runs a
Llama 3.1/3.2 with plain RoPE: wrong tokens from the first one. So the importer rebuilds the
``llama3`` parameters from the divisors and checks that they give the same divisors back; any
other scaling type named in the metadata is refused rather than ignored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.errors import ModelLoadError

# How closely the rebuilt parameters must give the stored divisors back (llama.cpp computes them in
# float64 and stores float32).
_REL_TOL = 1e-4


def llama3_divisors(theta: float, head_dim: int, factor: float, low_wavelen: float, high_wavelen: float) -> list[float]:
    """Each rotary frequency's divisor under ``llama3`` scaling (transformers' formula)."""
    out = []
    for i in range(head_dim // 2):
        inv = 1.0 / theta ** (2 * i / head_dim)
        wavelen = 2 * math.pi / inv
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (1 / wavelen - 1 / low_wavelen) / (1 / high_wavelen - 1 / low_wavelen)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


def llama3_from_divisors(
    divisors: Sequence[float], theta: float, head_dim: int, source: str
) -> dict[str, float | str] | None:
    """transformers' ``rope_scaling`` for ``rope_freqs.weight``'s divisors (None: all 1, no scaling)."""
    divisors = [float(d) for d in divisors]
    if len(divisors) != head_dim // 2:
        raise ModelLoadError(
            f"{source}: rope_freqs.weight has {len(divisors)} values, expected {head_dim // 2} "
            f"(one per rotary frequency of head_dim {head_dim})"
        )
    if all(abs(d - 1.0) <= _REL_TOL for d in divisors):
        return None
    factor = max(divisors)
    # x = 1 / wavelength; between the bands, s = (1/d - 1/factor) / (1 - 1/factor) is linear in x:
    # s = (x - 1/low_wavelen) / (1/high_wavelen - 1/low_wavelen).
    xs = [1.0 / theta ** (2 * i / head_dim) / (2 * math.pi) for i in range(head_dim // 2)]
    high = [x for x, d in zip(xs, divisors) if abs(d - 1.0) <= _REL_TOL * factor]
    low = [x for x, d in zip(xs, divisors) if abs(d - factor) <= _REL_TOL * factor]
    ramp = [
        (x, (1 / d - 1 / factor) / (1 - 1 / factor))
        for x, d in zip(xs, divisors)
        if abs(d - 1.0) > _REL_TOL * factor and abs(d - factor) > _REL_TOL * factor
    ]
    try:
        if len(ramp) >= 2:  # the ramp's two ends fix the line
            (x1, s1), (x2, s2) = ramp[0], ramp[-1]
            span = (x2 - x1) / (s2 - s1)
            lo_x = x1 - s1 * span
            hi_x = lo_x + span
        elif len(ramp) == 1:  # one point on the line: any edges that keep the neighbours in their bands
            ((x1, s1),) = ramp
            # lo_x = (x1 - s1 * hi_x) / (1 - s1) falls as hi_x rises; it must stay above the low band.
            upper = (x1 - (1 - s1) * max(low)) / s1 if low else float("inf")
            hi_x = (x1 + min(min(high) if high else float("inf"), upper, 2 * x1)) / 2
            lo_x = (x1 - s1 * hi_x) / (1 - s1)
        else:  # no frequency in between: the edges at the bands' nearest frequencies
            hi_x = min(high) if high else max(xs) * 2
            lo_x = max(low) if low else min(xs) / 2
        low_wavelen, high_wavelen = 1 / lo_x, 1 / hi_x
    except (ZeroDivisionError, ValueError):
        low_wavelen = high_wavelen = float("nan")
    ok = math.isfinite(low_wavelen) and math.isfinite(high_wavelen) and 0 < high_wavelen <= low_wavelen
    if ok:
        back = llama3_divisors(theta, head_dim, factor, low_wavelen, high_wavelen)
        ok = all(abs(a - b) <= _REL_TOL * max(a, b) for a, b in zip(back, divisors))
    if not ok:
        raise ModelLoadError(
            f"{source}: rope_freqs.weight holds per-frequency rope divisors that are not Llama 3's "
            "llama3 scaling; this rope scaling is not supported"
        )
    # transformers' parameters: low_wavelen = original / low_freq_factor, high_wavelen = original /
    # high_freq_factor. Any original context gives the same divisors; the nearest whole one keeps
    # the published values (8192, 1, 4) where they apply.
    original = max(1, round(low_wavelen))
    return {
        "rope_type": "llama3",
        "factor": factor,
        "original_max_position_embeddings": original,
        "low_freq_factor": original / low_wavelen,
        "high_freq_factor": original / high_wavelen,
    }


def rope_scaling(
    scaling_type: str | None,
    factor: float | None,
    divisors: Sequence[float] | None,
    theta: float,
    head_dim: int,
    source: str,
) -> dict[str, float | str] | None:
    """``rope_scaling`` for config.json from a GGUF's ``rope.scaling.*`` keys and ``rope_freqs``."""
    if divisors is not None:
        return llama3_from_divisors(divisors, theta, head_dim, source)
    if scaling_type in (None, "", "none"):
        return None
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": float(factor)} if factor else None
    raise ModelLoadError(
        f"{source}: rope.scaling.type {scaling_type!r} is not supported (only linear and Llama 3's rope_freqs)"
    )
