"""Kept for GPU issues (gpu_check runs it): Triton decode attention with the model's whole context as
the block-table width (what CUDA graphs pass), at batch 1 and batch 64, split-K by the sequences'
own lengths against the earlier split of the table's width, each as time and as a fraction of a
device-to-device copy's bandwidth; the two agree with each other, and growing contexts compile no
new kernel variant.

    python -m bench.gpu_check_decode_split --json      # CUDA only; says so and exits 0 elsewhere
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch

# The earlier split rule (before splits followed the lengths): partitions of 512 keys over the
# table's whole width where (seqs x kv heads) < 256, else one partition as wide as the table.
_OLD_MIN_PROGRAMS, _OLD_PARTITION = 256, 512


@dataclass(frozen=True)
class Geometry:
    """Llama-3.1-8B's attention: 32 query heads over 8 KV heads of 128, bf16, a 131,072-token context."""

    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    max_context: int = 131072
    dtype: str = "bfloat16"


def old_partition_size(num_seqs: int, kv_heads: int, table_tokens: int) -> int:
    """The partition length the width-based split chose for this batch."""
    small = num_seqs * kv_heads < _OLD_MIN_PROGRAMS
    return _OLD_PARTITION if small and table_tokens > _OLD_PARTITION else table_tokens


def kv_bytes_read(g: Geometry, contexts: list[int]) -> int:
    """K and V bytes one decode step must read: every context token's rows, once."""
    return sum(contexts) * g.kv_heads * g.head_dim * 2 * torch.empty((), dtype=getattr(torch, g.dtype)).element_size()


def _inputs(g: Geometry, contexts: list[int], device: str):
    dtype = getattr(torch, g.dtype)
    width = g.max_context // g.block_size
    blocks_each = [-(-n // g.block_size) for n in contexts]
    num_blocks = sum(blocks_each) + 1
    gen = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(num_blocks, g.block_size, g.kv_heads, g.head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(num_blocks, g.block_size, g.kv_heads, g.head_dim, generator=gen, device=device).to(dtype)
    tables = torch.zeros(len(contexts), width, dtype=torch.int32, device=device)
    first = 0
    for s, nb in enumerate(blocks_each):
        tables[s, :nb] = torch.arange(first, first + nb, dtype=torch.int32, device=device)
        first += nb
    q = torch.randn(len(contexts), g.heads, g.head_dim, generator=gen, device=device).to(dtype)
    lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    return q, k, v, tables, lens, g.head_dim**-0.5


def _time_ms(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _variants(decode) -> int | None:
    """Compiled variants of the decode kernel so far (None where this Triton hides them)."""
    try:
        return sum(len(c[0]) for c in decode._decode_kernel.device_caches.values())
    except (AttributeError, TypeError, IndexError):
        return None


def run(g: Geometry, batches: tuple[int, ...] = (1, 64), context: int = 4096, iters: int = 50) -> dict:
    from engine.attention import triton_decode as decode
    from engine.attention.triton_common import device_sm_count

    report: dict = {"geometry": asdict(g), "context": context, "batches": {}}
    for batch in batches:
        contexts = [context] * batch
        args = _inputs(g, contexts, "cuda")
        nbytes = kv_bytes_read(g, contexts)
        table_tokens = args[3].shape[1] * g.block_size
        before = lambda: decode.paged_decode_attention(  # noqa: E731
            *args, partition_size=old_partition_size(batch, g.kv_heads, table_tokens)
        )
        after = lambda: decode.paged_decode_attention(*args)  # noqa: E731
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = _time_ms(lambda: dst.copy_(src), iters)
        row = {
            "kv_bytes": nbytes,
            "copy_ms": round(copy_ms, 4),
            "splits_after": decode.decode_num_splits(batch, g.kv_heads, device_sm_count(args[0].device)),
        }
        for name, fn in (("before", before), ("after", after)):
            ms = _time_ms(fn, iters)
            row[f"{name}_ms"] = round(ms, 4)
            row[f"{name}_of_copy_bandwidth"] = round(copy_ms / ms, 3)
        row["max_abs_diff"] = float((before().float() - after().float()).abs().max())
        report["batches"][str(batch)] = row
    # Contexts that grow past powers of two: the same compiled variants serve them all.
    seen = _variants(decode)
    for n in (1000, 5000, 20000):
        decode.paged_decode_attention(*_inputs(g, [n], "cuda"))
    now = _variants(decode)
    report["new_variants_as_contexts_grew"] = None if seen is None or now is None else now - seen
    torch.cuda.synchronize()
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="every sequence's actual context")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_check_decode_split: CUDA is not available; nothing to measure here.")
        return 0
    report = run(Geometry(), context=a.context, iters=a.iters)
    ok = all(r["max_abs_diff"] < 3e-2 for r in report["batches"].values()) and report[
        "new_variants_as_contexts_grew"
    ] in (0, None)
    report["ok"] = ok
    print(json.dumps(report, indent=2) if a.json else report)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
