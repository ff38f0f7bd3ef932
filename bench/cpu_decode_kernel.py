"""The compiled CPU decode kernel alone against the torch path it replaces, on one paged cache:
every layer of a SmolLM2-shaped block-major cache (30 layers, 9 heads, 3 KV heads, head_dim 64,
16-token blocks scattered at random), B sequences of L tokens. Reports each arm's best time for
all layers and the KV bytes it had to read per second. The ``per-head`` arm is the same kernel
built to give each KV head its own task, as it did before a sequence's heads went to one thread;
``no read-ahead``, the same kernel built without reading a piece's rows before attending it.

    python -m bench.cpu_decode_kernel [--seqs 64] [--context 1040] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable


def main(argv: list[str] | None = None) -> int:
    import torch

    from engine.attention.cpu import CpuPagedAttention
    from engine.native.paged_decode import NativePagedDecode

    p = argparse.ArgumentParser(prog="python -m bench.cpu_decode_kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--context", type=int, default=1040)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernel = NativePagedDecode.load()
    if kernel is None:
        raise SystemExit("the compiled kernel is not available here (see the log: no compiler, or BATON_NATIVE_KERNELS=0)")
    q, kv, tables, seq_lens = smollm2_decode_inputs(args.seqs, args.context)
    layers, kv_heads, head_dim = kv.shape[1], kv.shape[4], kv.shape[5]
    kv_bytes = args.seqs * args.context * layers * 2 * kv_heads * head_dim * 4
    arms = {"torch path": CpuPagedAttention().decode, "native": kernel}
    per_head = NativePagedDecode.load(heads_together=False)
    if per_head is not None:
        arms["per-head"] = per_head
    no_read_ahead = NativePagedDecode.load(read_ahead=False)
    if no_read_ahead is not None:
        arms["no read-ahead"] = no_read_ahead
    best = best_over_layers(arms, q, kv, (tables, seq_lens, head_dim**-0.5), args.repeats)
    print(f"{args.seqs} sequences x {args.context} tokens, {layers} layers ({kv_bytes / 1e9:.2f} GB of KV), "
          f"{args.threads} thread(s), best of {args.repeats}")
    print_arms(best, lambda seconds: f"{kv_bytes / seconds / 1e9:5.1f} GB/s")
    return 0


def smollm2_decode_inputs(seqs: int, context: int):
    """A SmolLM2-shaped block-major cache (30 layers, 3 KV heads, head_dim 64, 16-token blocks
    scattered at random, seed 0) holding ``seqs`` sequences of ``context`` tokens, and their 9-head
    queries: ``(q, kv, tables, seq_lens)``."""
    import torch

    layers, block, kv_heads, head_dim, heads = 30, 16, 3, 64, 9
    per_seq = -(-context // block)
    num_blocks = seqs * per_seq + 8
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(num_blocks, layers, 2, block, kv_heads, head_dim, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen)[: seqs * per_seq].view(seqs, per_seq).int()
    seq_lens = torch.full((seqs,), context, dtype=torch.int32)
    q = torch.randn(seqs, heads, head_dim, generator=gen)
    return q, kv, tables, seq_lens


def best_over_layers(arms: dict[str, Callable], q, kv, rest: tuple, repeats: int) -> dict[str, float]:
    """Each attention arm's fastest of ``repeats`` runs over every layer of the block-major cache
    ``kv`` (called as ``attend(q, k, v, *rest)``), in seconds. The arms alternate, so a slow spell of
    the machine falls on both."""
    best = {name: float("inf") for name in arms}
    for _ in range(repeats):
        for name, attend in arms.items():
            t = time.perf_counter()
            for n in range(kv.shape[1]):
                attend(q, kv[:, n, 0], kv[:, n, 1], *rest)
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def print_arms(best: dict[str, float], rate: Callable[[float], str]) -> None:
    for name, seconds in best.items():
        print(f"  {name:13s} {seconds * 1e3:8.1f} ms  {rate(seconds)}")
    print(f"  speed-up {best['torch path'] / best['native']:.2f}x")
    if "per-head" in best:
        print(f"  native over per-head tasks {best['per-head'] / best['native']:.2f}x")
    if "no read-ahead" in best:
        print(f"  native over no read-ahead {best['no read-ahead'] / best['native']:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
