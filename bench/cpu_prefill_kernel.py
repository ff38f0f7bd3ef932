"""The compiled CPU prefill kernel alone against the torch path it replaces, on one paged cache:
every layer of a SmolLM2-shaped block-major cache (30 layers, 9 heads, 3 KV heads, head_dim 64,
16-token blocks scattered at random), one step's prefill chunks of the given lengths, each after
``--prefix`` cached tokens. Reports each arm's best time for all layers and its rate in causal
attention FLOP/s (2 * 2 * head_dim * heads per visible query-key pair).

    python -m bench.cpu_prefill_kernel [--lens 13x64-256 | --lens 2048,160] [--prefix 0] [--threads 2] [--repeats 3]

``--lens NxA-B`` draws N lengths uniform in [A, B] (seed 0): the default is a 2,048-token step of
``baton bench offline``'s anyscale-cpu prompts.
"""

from __future__ import annotations

import argparse
import random

from bench.cpu_decode_kernel import best_over_layers, print_arms


def parse_lens(spec: str) -> list[int]:
    if "x" in spec:
        n, span = spec.split("x")
        lo, hi = (int(v) for v in span.split("-"))
        rng = random.Random(0)
        return [rng.randint(lo, hi) for _ in range(int(n))]
    return [int(v) for v in spec.split(",")]


def main(argv: list[str] | None = None) -> int:
    import torch

    from engine.attention.cpu import CpuPagedAttention
    from engine.native.paged_prefill import NativePagedPrefill

    p = argparse.ArgumentParser(prog="python -m bench.cpu_prefill_kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--lens", default="13x64-256", help="chunk lengths: N,M,... or NxA-B (N drawn in [A, B])")
    p.add_argument("--prefix", type=int, default=0, help="cached tokens before each chunk")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    lens = parse_lens(args.lens)
    if not lens or min(lens) < 1 or args.prefix < 0:
        raise SystemExit(f"--lens needs positive lengths and --prefix a count >= 0, got {args.lens!r}, {args.prefix}")
    torch.set_num_threads(args.threads)
    kernel = NativePagedPrefill.load(require_tuned=False)
    if kernel is None:
        raise SystemExit("the compiled kernel is not available here (see the log: no compiler, or BATON_NATIVE_KERNELS=0)")
    layers, block, kv_heads, head_dim, heads = 30, 16, 3, 64, 9
    ctx = [args.prefix + n for n in lens]
    per_seq = [-(-c // block) for c in ctx]
    num_blocks = sum(per_seq) + 8
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(num_blocks, layers, 2, block, kv_heads, head_dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).int()
    tables = torch.zeros(len(lens), max(per_seq), dtype=torch.int32)
    first = 0
    for s, n in enumerate(per_seq):
        tables[s, :n] = order[first : first + n]
        first += n
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(ctx, dtype=torch.int32)
    q = torch.randn(sum(lens), heads, head_dim, generator=gen)
    pairs = sum(n * args.prefix + n * (n + 1) // 2 for n in lens)
    flop = layers * pairs * 2 * 2 * head_dim * heads
    arms = {"torch path": CpuPagedAttention().prefill, "native": kernel}
    best = best_over_layers(arms, q, kv, (tables, cu, seq_lens, head_dim**-0.5), args.repeats)
    print(f"{len(lens)} chunks, {sum(lens)} tokens (lengths {min(lens)}-{max(lens)}) after {args.prefix} cached, "
          f"{layers} layers, {args.threads} thread(s), best of {args.repeats}")
    print_arms(best, lambda seconds: f"{flop / seconds / 1e9:6.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
