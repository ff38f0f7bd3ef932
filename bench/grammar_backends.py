"""Grammar backends compared on this machine: xgrammar vs llguidance, compile time per test schema
and the time to fill the token bitmask of one decode step at 1/16/64 constrained rows (each row's
matcher walked through a valid document, a mask per token), on the default model's tokenizer.

The engine arm (``--engine``) runs the default model's decode steps with 1/16/64 rows, all
constrained by a schema whose string keeps them decoding, against the same rows unconstrained,
interleaved in one process: the constrained step's extra cost (the matchers' masks, the full
logits of a row whose argmax its mask forbids). ``--overlap on|off`` computes the masks beside
the forward or after it (default: the engine's, beside it).

    python -m bench.grammar_backends            # needs `pip install xgrammar` for its arm
    python -m bench.grammar_backends --engine   # the engine arm only (--rows 16 for one size)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# The schemas the structured-output tests validate against (nesting, enums, bounded arrays,
# required/optional fields, additionalProperties: false), with a valid document each.
SCHEMAS: dict[str, tuple[dict, dict]] = {
    "flat": (
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada", "age": 36},
    ),
    "enum": (
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
            "required": ["color", "ok"],
            "additionalProperties": False,
        },
        {"color": "green", "ok": True},
    ),
    "array": (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}
            },
            "required": ["tags"],
            "additionalProperties": False,
        },
        {"tags": ["a", "bb"]},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 0},
                        "email": {"type": "string", "maxLength": 20},
                    },
                    "required": ["id"],
                    "additionalProperties": False,
                },
                "items": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {"sku": {"type": "string", "maxLength": 6}, "qty": {"type": "integer"}},
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["user", "items"],
            "additionalProperties": False,
        },
        {"user": {"id": 7}, "items": [{"sku": "x1", "qty": 2}]},
    ),
}
ROWS = (1, 16, 64)


def _tokenizer():
    from engine.model.registry import resolve_model
    from engine.model.tokenizer import Tokenizer

    return Tokenizer.from_dir(resolve_model("default"))


def _doc_tokens(tok, doc: dict) -> list[int]:
    # Keys sorted: a constraint's schema is its sorted JSON text, and the grammar keeps that order.
    return tok.encode(json.dumps(doc, separators=(",", ":"), sort_keys=True), add_special_tokens=False)


def bench_llguidance(tok, repeats: int) -> dict:
    import llguidance
    import llguidance.numpy as lnp

    from engine.structured.compiler import GrammarCompiler
    from engine.structured.constraint import StructuredOutput

    out: dict = {"compile_ms": {}, "mask_ms_per_step": {}}
    vocab = tok.vocab_size
    for name, (schema, _) in SCHEMAS.items():
        times = []
        for _ in range(repeats):
            gc = GrammarCompiler.for_tokenizer(tok)  # a fresh cache: a real compile every time
            t = time.perf_counter()
            gc.compile(StructuredOutput.json_schema(schema))
            times.append(time.perf_counter() - t)
        out["compile_ms"][name] = round(1e3 * statistics.median(times), 3)
    gc = GrammarCompiler.for_tokenizer(tok)
    executor = llguidance.LLExecutor()
    for rows in ROWS:
        names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(rows)]
        matchers = [gc.matcher(StructuredOutput.json_schema(SCHEMAS[n][0])) for n in names]
        docs = [_doc_tokens(tok, SCHEMAS[n][1]) for n in names]
        bitmask = lnp.allocate_token_bitmask(rows, vocab)
        steps = min(len(d) for d in docs)
        t = time.perf_counter()
        for s in range(steps):
            lnp.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
            for m, d in zip(matchers, docs):
                m.consume_token(d[s])
        out["mask_ms_per_step"][rows] = round(1e3 * (time.perf_counter() - t) / steps, 3)
    return out


def bench_xgrammar(tok, repeats: int) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(
        [tok.token_bytes(i) for i in range(tok.vocab_size)],
        xgr.VocabType.RAW,
        vocab_size=tok.vocab_size,
        stop_token_ids=list(tok.eos_token_ids),
    )
    out: dict = {"compile_ms": {}, "mask_ms_per_step": {}}
    for name, (schema, _) in SCHEMAS.items():
        times = []
        for _ in range(repeats):
            compiler = xgr.GrammarCompiler(info, cache_enabled=False)
            t = time.perf_counter()
            compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            times.append(time.perf_counter() - t)
        out["compile_ms"][name] = round(1e3 * statistics.median(times), 3)
    compiler = xgr.GrammarCompiler(info)
    compiled = {n: compiler.compile_json_schema(json.dumps(s), any_whitespace=False) for n, (s, _) in SCHEMAS.items()}
    for rows in ROWS:
        names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(rows)]
        matchers = [xgr.GrammarMatcher(compiled[n]) for n in names]
        docs = [_doc_tokens(tok, SCHEMAS[n][1]) for n in names]
        bitmask = xgr.allocate_token_bitmask(rows, tok.vocab_size)
        steps = min(len(d) for d in docs)
        t = time.perf_counter()
        for s in range(steps):
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)
            for m, d in zip(matchers, docs):
                m.accept_token(d[s])
        out["mask_ms_per_step"][rows] = round(1e3 * (time.perf_counter() - t) / steps, 3)
    return out


def bench_engine(
    steps: int,
    repeats: int = 2,
    rows_set: tuple[int, ...] = ROWS,
    overlap: bool | None = None,
    device: str = "cpu",
    model: str = "default",
) -> dict:
    from engine.config import EngineConfig, SchedulerConfig
    from engine.engine import LLMEngine
    from engine.model.registry import resolve_model
    from engine.sampling_params import SamplingParams
    from engine.structured.constraint import StructuredOutput

    engine = LLMEngine(  # (dtype auto: float32 on a CPU, bfloat16 on a GPU)
        EngineConfig(
            model=str(resolve_model(model)), device=device, scheduler=SchedulerConfig(max_num_seqs=max(rows_set))
        )
    )
    long_text = StructuredOutput.json_schema(
        {"type": "object", "properties": {"text": {"type": "string", "minLength": 4 * steps}}, "required": ["text"]}
    )
    assert engine.tokenizer is not None
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "Write a long story as JSON."}])
    out: dict = {}
    for rows in rows_set:
        arms: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
        for _ in range(repeats):  # the arms interleaved; the fastest run of each (a shared machine's noise is additive)
            for name, structured in (("unconstrained", None), ("constrained", long_text)):
                params = SamplingParams(max_tokens=steps + 1, ignore_eos=True, structured=structured)
                for _ in range(rows):
                    engine.add_request(None, prompt, params)
                engine.step()  # the prompts' step (the first tokens)
                if engine.runner.grammars is not None and overlap is not None:
                    engine.runner.grammars.overlap = overlap
                t = time.perf_counter()
                n = 0
                while engine.has_unfinished_requests():
                    engine.step()
                    n += 1
                arms[name].append(1e3 * (time.perf_counter() - t) / max(n, 1))
        best = {k: min(v) for k, v in arms.items()}
        out[rows] = {k: round(v, 3) for k, v in best.items()}
        out[rows]["mask_ms"] = round(_mask_ms(engine, rows, steps), 3)
        out[rows]["extra"] = f"{100 * (best['constrained'] / best['unconstrained'] - 1):+.1f}%"
        out[rows]["mask_share"] = f"{100 * out[rows]['mask_ms'] / best['unconstrained']:.1f}%"
    return out


def _mask_ms(engine, rows: int, steps: int) -> float:
    """The runner's mask alone (GrammarRows.apply: the matchers' bitmasks, unpacked and applied to
    [rows, vocab] logits) per step, the rows' matchers walking through valid documents."""
    import numpy as np
    import torch

    from engine.sampling_params import SamplingParams
    from engine.structured.constraint import StructuredOutput
    from engine.structured.grammar_rows import GrammarRows

    tok = engine.tokenizer
    vocab = engine.model_config.vocab_size
    grammars = GrammarRows(lambda: engine.runner.grammars.compiler, vocab, overlap=False)
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(rows)]
    docs = [_doc_tokens(tok, SCHEMAS[n][1]) for n in names]
    length = min(min(len(d) for d in docs), steps)
    token_ids = np.zeros((rows, 64 + length), dtype=np.int64)
    for r, (n, d) in enumerate(zip(names, docs)):
        grammars.join(r, SamplingParams(structured=StructuredOutput.json_schema(SCHEMAS[n][0])))
        token_ids[r, 1 : 1 + length] = d[:length]
    prompt_lens = np.ones(rows, dtype=np.int64)
    logits = torch.randn(rows, vocab)
    slots = list(range(rows))
    t = time.perf_counter()
    for s in range(length):
        grammars.mask(logits, slots, None, token_ids, np.full(rows, 1 + s, dtype=np.int64), prompt_lens)
    return 1e3 * (time.perf_counter() - t) / length


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="the engine arm only (decode ms/step)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="the engine arm's batch sizes, comma-separated")
    ap.add_argument(
        "--overlap", choices=("auto", "on", "off"), default="auto", help="the engine arm's masks beside the forward"
    )
    ap.add_argument("--device", default="cpu", help="the engine arm's device (cpu, cuda: bench.gpu_check's step)")
    ap.add_argument("--model", default="default", help="the engine arm's model (default, tiny or a directory)")
    args = ap.parse_args(argv)
    if args.engine:
        rows = tuple(int(r) for r in args.rows.split(","))
        result = bench_engine(
            args.steps,
            min(args.repeats, 3),
            rows,
            overlap=None if args.overlap == "auto" else args.overlap == "on",
            device=args.device,
            model=args.model,
        )
        print(json.dumps({"device": args.device, "decode_ms_per_step": result}, indent=1))
        return
    tok = _tokenizer()
    result = {"vocab": tok.vocab_size, "llguidance": bench_llguidance(tok, args.repeats)}
    try:
        result["xgrammar"] = bench_xgrammar(tok, args.repeats)
    except ImportError as e:
        result["xgrammar"] = f"not installed ({e})"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
