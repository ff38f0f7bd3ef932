"""What the Triton attention kernels share: the host-side input checks, tl.dot operand padding, launch
options, and the score arithmetic (the softmax in base 2, Gemma's soft-capping, sliding windows).

Scores go through the softmax in base 2 (``exp2``), so the scale folds in log2(e). With soft-capping
(``cap * tanh(s / cap)``) the kernel multiplies by ``scale / cap`` first, takes tanh, then by
``cap * log2(e)``: ``score_scales`` gives that pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# The SM count the interpreter (CPU tests) is sized for: small, so that small batches split.
_INTERPRETER_SMS = 4
# tl.dot on NVIDIA GPUs needs every operand dimension >= 16 (the interpreter does not check).
_MIN_DOT_DIM = 16


def check_attention_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_seqs: int,
) -> None:
    """What the kernels assume of their inputs, checked on the host without reading device memory
    (ValueError naming the mismatch: a wrong shape or dtype computed garbage, or read out of bounds)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    problems = [
        (num_heads % kv_heads != 0, f"{num_heads} query heads are not a multiple of {kv_heads} KV heads"),
        (k_cache.shape != v_cache.shape, f"K cache {tuple(k_cache.shape)} and V cache {tuple(v_cache.shape)} differ"),
        (k_cache.shape[3] != head_dim, f"head size {head_dim} of q, {k_cache.shape[3]} of the cache"),
        (
            q.dtype != k_cache.dtype or k_cache.dtype != v_cache.dtype,
            f"dtypes differ: q {q.dtype}, K cache {k_cache.dtype}, V cache {v_cache.dtype}",
        ),
        (
            seq_lens.dtype != torch.int32 or block_tables.dtype != torch.int32,
            f"seq_lens and block_tables must be int32, got {seq_lens.dtype} and {block_tables.dtype}",
        ),
        (tuple(seq_lens.shape) != (num_seqs,), f"seq_lens has shape {tuple(seq_lens.shape)}, want ({num_seqs},)"),
        (
            block_tables.dim() != 2 or block_tables.shape[0] != num_seqs,
            f"block_tables has shape {tuple(block_tables.shape)}, want ({num_seqs}, blocks per sequence)",
        ),
    ]
    for bad, what in problems:
        if bad:
            raise ValueError(f"attention inputs: {what}")


def device_shared_memory(device: torch.device) -> int | None:
    """The most shared memory one block may use on ``device`` (opt-in), or None off CUDA."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0)) or None


def device_sm_count(device: torch.device) -> int:
    """The SMs decode's splits are sized for: the device's count on CUDA, a nominal few under the interpreter."""
    if device.type != "cuda":
        return _INTERPRETER_SMS
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def check_window_and_cap(window: int | None, softcap: float | None) -> None:
    """A window is a positive number of keys, a cap a positive number (ValueError naming it)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"attention inputs: window must be a positive integer or None, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"attention inputs: softcap must be positive or None, got {softcap!r}")


def score_scales(scale: float, softcap: float | None) -> tuple[float, float]:
    """(what q.k is multiplied by in the kernel, what tanh of that is multiplied by: 0 without a cap)."""
    if softcap is None:
        return scale * LOG2E, 0.0
    return scale / softcap, softcap * LOG2E


def launch_options(num_warps: int, num_stages: int | None) -> dict[str, int]:
    """A kernel launch's warp and pipeline-stage counts (Triton's default stages when None)."""
    return {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})


def dot_pad(n: int) -> int:
    """The padded size of a tl.dot operand dimension of real size ``n``: a power of two, >= 16."""
    return max(_MIN_DOT_DIM, int(triton.next_power_of_2(n)))


@triton.jit
def capped_scores(s, cap_log2e, SOFTCAP: tl.constexpr):
    """Scores ``s`` (q.k times ``score_scales``' first factor) in base-2 softmax units, soft-capped
    when SOFTCAP. tanh from exp2 (the interpreter has no tanh), in the form without overflow."""
    if SOFTCAP:
        e = tl.exp2(-2.8853900817779268 * tl.abs(s))  # exp(-2|s|)
        t = (1.0 - e) / (1.0 + e)
        return tl.where(s < 0, -t, t) * cap_log2e
    else:
        return s


@triton.jit
def online_softmax_step(s, m_i, WINDOWED: tl.constexpr):
    """(p, alpha, m_new) of one key tile's scores ``s`` (base 2) against the running maxima ``m_i``.
    With windows a row can see no key of a tile before it has seen any (all -inf): its maximum
    stays -inf and exp2(-inf - -inf) would be NaN, so the exponent's offset is 0 there."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if WINDOWED:  # noqa: SIM108 - a constexpr branch: the plain kernel compiles without it
        m_off = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_off = m_new
    return tl.exp2(s - m_off[:, None]), tl.exp2(m_i - m_off), m_new
