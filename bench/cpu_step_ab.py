"""Same-run A/B of a CPU step change: engine steps with the change off and on, alternating in one
process on the same engine (decode steps of B sequences at context L, prefill steps of T tokens).

Changes:
  packed-weights   projections packed for oneDNN (engine/model/linear.py) vs dense F.linear
  skinny-linear    the compiled skinny kernel for <= 64 rows, MKL above (engine/native) vs packed
  skinny-vs-mkl    the same vs MKL's F.linear at every row count (dense weights both)
  quantized        a GGUF model's own Q4_1/Q8_0 blocks for <= 64 rows (engine/native/quant_linear.c) vs skinny
  quantized-vs-packed  the same vs packed weights at every row count (AMD's default before blocks ran there)
  q4-groups        those Q4_1 blocks in the kernel's 8-row layout (QuantizedWeight.regroup) vs the file's layout
  quant-avx2-rows  the quantized kernel's AVX2 build taking one row straight from the registers and
                   broadcasting a group's scales from memory vs neither (-DDIRECT_ROW=0 -DSCALES_FROM_REGISTER=1)
  cpu-attention    the CPU attention path (engine/attention/cpu.py) vs the torch reference
  native-decode    the CPU path's compiled decode kernel (engine/native) vs its torch path
  decode-split     that kernel attending contexts past 1,024 tokens in pieces vs whole
  decode-heads     that kernel running a sequence's KV heads on one thread vs one head a task
  decode-read-ahead  that kernel's AVX2 build reading a piece's K and V rows ahead with plain loads vs not
  native-prefill   the CPU path's compiled prefill kernel (engine/native/paged_prefill.c) vs its torch path
  sampled-rows     the last layer's output projection and MLP for the sampling rows only vs every row
  prefix-flash     (torch path) a chunk after a cached prefix as two flash calls merged by log-sum-exp vs one masked SDPA
  native-layers    a decode step's layer loop in one C call (engine/native/decode_layers.c) vs one call per kernel from Python
  layer-ops        fused residual-add + RMSNorm, rotary embedding and SiLU * up in C (engine/native) vs torch
  amx              the layers' larger products (prefill) on AMX bf16 tiles, six exact products of three-piece
                   splits (engine/native/amx_linear.c) vs the mode's own path (MKL)
  greedy-head      greedy rows' tokens from the screened Q8_0 head (engine/native/greedy_head.c) vs every
                   logit and an argmax

    python -m bench.cpu_step_ab --change packed-weights [--model default] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    from bench.profile.measure import Grid, StepTimer, engine_for_grid

    p = argparse.ArgumentParser(prog="python -m bench.cpu_step_ab", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--change", required=True, choices=("packed-weights", "skinny-linear", "skinny-vs-mkl", "quantized", "quantized-vs-packed", "q4-groups", "quant-avx2-rows", "native-layers", "amx",
                                                       "cpu-attention", "native-decode", "native-prefill", "sampled-rows", "decode-split", "decode-heads",
                                                       "decode-read-ahead",
                                                       "prefix-flash",
                                                       "layer-ops", "greedy-head"))
    p.add_argument("--model", default="default")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,2,3,4,8,16,32")
    p.add_argument("--contexts", default="80,1040")
    p.add_argument("--prompts", default="64,256,1024", help="T or T:C (T new tokens after C cached ones),...")
    p.add_argument("--ragged", default="16:64:1024", help="B:short:long,...: B - 1 short rows and one long")
    args = p.parse_args(argv)

    rows = [int(r) for r in args.rows.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    prompts = [tuple(int(x) for x in (t.split(":") + ["0"])[:2]) for t in args.prompts.split(",")]
    ragged = tuple(tuple(int(x) for x in r.split(":")) for r in args.ragged.split(",") if r)
    grid = Grid(decode=tuple((b, n) for b in rows for n in contexts), ragged=ragged,
                prefill=tuple(prompts), mixed=(), repeats=2, max_point_s=30.0)
    engine = engine_for_grid(args.model, grid, args.threads)
    switch, names = _switch(engine, args.change)
    timer = StepTimer(engine, grid)
    print(f"{args.change}: model {args.model}, {args.threads} thread(s), median of {args.rounds} rounds x {grid.repeats} steps")
    print(f"| step | {names[0]} ms | {names[1]} ms | speed-up |")
    print("| --- | ---: | ---: | ---: |")

    def ab(label: str, timed) -> None:
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for on in (False, True):
                switch(on)
                times[on] += [s.seconds for s in timed()]
        a, b = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {label} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f}x |", flush=True)

    for b, n in grid.decode:
        ab(f"decode {b} x {n}", lambda: timer.decode([n] * b))
    for b, short, long in ragged:
        ab(f"decode {b - 1} x {short} + 1 x {long}", lambda: timer.decode([short] * (b - 1) + [long]))
    for tokens, cached in prompts:
        ab(f"prefill {tokens}" + (f" after {cached} cached" if cached else ""), lambda: timer.prefill(tokens, cached))
    switch(True)
    return 0


def _projections(model) -> list:
    return [model.lm_head, *(p for layer in model.layers for p in layer.projections())]


def _file_layout(grouped):
    """Q4_1x8 blocks back in the GGUF file's row-by-row Q4_1 layout (QuantizedWeight.regroup inverted)."""
    import torch

    from engine.native.quant_linear import GROUP_ROWS, QuantizedWeight

    n, row_bytes = grouped.blocks.shape
    cols = row_bytes // 20
    g = grouped.blocks.view(n // GROUP_ROWS, cols, 160)
    d, m = g[..., 0:16].reshape(-1, cols, GROUP_ROWS, 2), g[..., 16:32].reshape(-1, cols, GROUP_ROWS, 2)
    nibbles = g[..., 32:].reshape(-1, cols, GROUP_ROWS, 4, 4).transpose(3, 4).reshape(-1, cols, GROUP_ROWS, 16)
    rows = torch.cat([d, m, nibbles], dim=3).transpose(1, 2)  # [groups, 8, cols, 20]
    return QuantizedWeight(rows.reshape(n, row_bytes).contiguous(), "Q4_1")


def _switch(engine, change: str):
    """A function turning the change off (False) or on (True) in place, and the two arms' names."""
    model = engine.runner.model
    if change == "packed-weights":
        return lambda on: model.set_projections("packed" if on else "dense"), ("F.linear", "packed")
    if change in ("skinny-linear", "skinny-vs-mkl"):
        if model.skinny_kernel is None:
            raise SystemExit(f"{change}: the compiled kernel is not loaded here (AVX-512 or AVX2 with FMA, "
                             "BATON_NATIVE_KERNELS, CC)")
        base = "packed" if change == "skinny-linear" else "dense"
        return lambda on: model.set_projections("skinny" if on else base), (base if base == "packed" else "MKL", "skinny")
    if change in ("quantized", "quantized-vs-packed"):
        if model.quant_kernel is None:
            raise SystemExit(f"{change}: no GGUF blocks attached here (a GGUF model, AVX-512 or AVX2 with F16C, "
                             "BATON_NATIVE_KERNELS, CC)")
        base = "skinny" if change == "quantized" else "packed"
        return lambda on: model.set_projections("quantized" if on else base), (base, "quantized")
    if change == "q4-groups":
        grouped = {proj: proj.quantized for proj in _projections(model) if proj.quantized is not None
                   and proj.quantized.qtype == "Q4_1x8"}
        if not grouped:
            raise SystemExit("q4-groups: no Q4_1 blocks in the 8-row layout here (a Q4_1 GGUF model, quantized mode)")
        in_file_layout = {proj: _file_layout(q) for proj, q in grouped.items()}

        def use_groups(on: bool) -> None:
            for proj in grouped:
                proj.quantized = (grouped if on else in_file_layout)[proj]
            model.invalidate_decode_plan()

        return use_groups, ("file layout", "8-row groups")
    if change == "quant-avx2-rows":
        from engine.native.quant_linear import NativeQuantLinear

        current = model.quant_kernel
        before = NativeQuantLinear.load(("-DDIRECT_ROW=0", "-DSCALES_FROM_REGISTER=1"))
        takers = [proj for proj in _projections(model) if proj.quant is not None]
        if current is None or before is None or not takers:
            raise SystemExit("quant-avx2-rows: the quantized kernel is not in use here (a GGUF model, AVX2 with FMA "
                             "and F16C, BATON_NATIVE_KERNELS, CC)")

        def use_build(on: bool) -> None:
            for proj in takers:
                proj.quant = current if on else before
            model.quant_kernel = current if on else before
            model.invalidate_decode_plan()

        return use_build, ("before", "direct row + scales")
    if change == "native-layers":
        loop = model.native_layers
        if loop is None:
            raise SystemExit("native-layers: the compiled layer loop is not in use here (see BATON_NATIVE_KERNELS, CC)")

        def use_loop(on: bool) -> None:
            model.native_layers = loop if on else None

        return use_loop, ("Python loop", "C loop")
    if change == "layer-ops":
        from engine.native.layer_ops import NativeLayerOps, TorchLayerOps

        native = model.ops
        if not isinstance(native, NativeLayerOps):
            raise SystemExit("layer-ops: the compiled kernels are not in use here (see BATON_NATIVE_KERNELS, CC)")

        def use_layer_ops(on: bool) -> None:
            model.ops = native if on else TorchLayerOps()

        return use_layer_ops, ("torch ops", "fused")
    if change == "amx":
        if model.amx_kernel is None:
            raise SystemExit("amx: not in use here (Intel AMX-BF16, Linux's tile permission, BATON_AMX, CC)")
        return model.set_amx, ("no AMX", "AMX")
    if change == "greedy-head":
        if model.greedy_head is None:
            raise SystemExit("greedy-head: not in use here (a GGUF Q8_0 head, AVX-512 VNNI, BATON_NATIVE_KERNELS, CC)")

        def use_greedy_head(on: bool) -> None:
            model.greedy_head_enabled = on

        return use_greedy_head, ("every logit", "greedy head")
    if change in ("decode-split", "decode-heads", "decode-read-ahead"):
        from engine.native.paged_decode import NativePagedDecode

        cpu = engine.runner.attn.decode.__self__
        variant = {"decode-split": {"split_tokens": 1 << 30}, "decode-heads": {"heads_together": False},
                   "decode-read-ahead": {"read_ahead": False}}[change]
        current, before = cpu.native_decode, NativePagedDecode.load(**variant)
        if current is None or before is None:
            raise SystemExit(f"{change}: the compiled kernel is not in use here (see BATON_NATIVE_KERNELS, CC; "
                             "the prefill kernel only on AVX-512 builds)")

        def use_variant(on: bool) -> None:
            cpu.native_decode = current if on else before

        return use_variant, {"decode-split": ("whole", "pieces"), "decode-heads": ("one head a task", "heads together"),
                             "decode-read-ahead": ("no read-ahead", "read-ahead")}[change]
    if change == "prefix-flash":
        import engine.attention.cpu as cpu_attention

        flash = cpu_attention._FLASH_WITH_LSE
        if flash is None:
            raise SystemExit("prefix-flash: this torch has no CPU flash attention op with log-sum-exp")
        engine.runner.attn.prefill.__self__.native_prefill = None  # the torch path is what is compared

        def use_flash(on: bool) -> None:
            cpu_attention._FLASH_WITH_LSE = flash if on else None

        return use_flash, ("masked SDPA", "two flash calls")
    if change == "sampled-rows":
        model = engine.runner.model
        keeping = model.forward

        def every_row(*args, keep=None, **kwargs):
            hidden = keeping(*args, **kwargs)
            return hidden if keep is None else hidden[keep]

        def use_keep(on: bool) -> None:
            model.forward = keeping if on else every_row

        return use_keep, ("every row", "sampled rows")
    if change in ("native-prefill", "native-decode"):
        attr = change.replace("-", "_")  # the CPU attention path's kernel attribute
        cpu = engine.runner.attn.decode.__self__
        kernel = getattr(cpu, attr)
        if kernel is None:
            raise SystemExit(f"{change}: the compiled kernel is not in use here (see BATON_NATIVE_KERNELS, CC; "
                             "the prefill kernel only on AVX-512 builds)")

        def use_kernel(on: bool) -> None:
            setattr(cpu, attr, kernel if on else None)

        return use_kernel, ("torch path", "native")
    from engine.attention import reference
    from engine.attention.backend import AttentionBackend

    on_backend = engine.runner.attn
    off_backend = AttentionBackend("torch-reference", reference.write_kv, reference.paged_decode_attention,
                                   reference.paged_prefill_attention)

    def switch(on: bool) -> None:
        engine.runner.attn = on_backend if on else off_backend

    return switch, ("reference", "cpu path")


if __name__ == "__main__":
    raise SystemExit(main())
