"""``baton generate``: run prompts through the engine and print the completions."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from baton.commands.engine_args import add_engine_args, engine_config_from_args, progress_printer
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the CLI builds its parser without loading the tokenizer's dependencies
    from engine.model.tokenizer import Tokenizer


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate completions for prompts")
    p.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    add_sampling_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per prompt")
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="with --json: each token's logprob and its N most likely alternatives (0-20)",
    )
    p.add_argument(
        "--prompt-logprobs",
        type=int,
        default=None,
        metavar="N",
        help="with --json: the same for the prompt's tokens (0-20)",
    )
    g = p.add_argument_group("disaggregated serving (runs through a local Ray cluster when either is set)")
    g.add_argument("--prefill-workers", type=int, default=None, help="prefill pool size")
    g.add_argument("--decode-workers", type=int, default=None, help="decode pool size")
    add_engine_args(p)
    p.set_defaults(run=run)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0, help="[0, 1]: drop tokens below min_p x the most likely one")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="[-2, 2]: once per generated token (OpenAI)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="[-2, 2]: per occurrence (OpenAI)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="(0, 10], 1 is off: over prompt and output")


def sampling_params_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        logprobs=getattr(args, "logprobs", None),
        prompt_logprobs=getattr(args, "prompt_logprobs", None),
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
    )


def run(args: argparse.Namespace) -> int:
    params = sampling_params_from_args(args)  # validate before loading anything
    if not args.json and (args.logprobs is not None or args.prompt_logprobs is not None):
        raise ValueError("--logprobs and --prompt-logprobs are printed only with --json")
    if args.prefill_workers is not None or args.decode_workers is not None:
        outputs = _generate_on_cluster(args, params)
    else:
        from engine.engine import LLMEngine

        engine = LLMEngine(engine_config_from_args(args), progress=progress_printer(args.json))
        try:
            outputs = engine.generate(_encode(engine.tokenizer, args), params)
        finally:
            engine.close()  # (its tensor-parallel ranks, if any)
    for text, out in zip(args.prompt, outputs):
        if args.json:
            record = {
                "prompt": text,
                "text": out.text,
                "token_ids": out.token_ids,
                "finish_reason": out.finish_reason,
                "num_prompt_tokens": out.num_prompt_tokens,
            }
            for key in ("logprobs", "prompt_logprobs"):
                values = getattr(out, key)
                if values is not None:
                    record[key] = [
                        {"token_id": lp.token_id, "logprob": lp.logprob, "top": [[t, v] for t, v in lp.top]}
                        for lp in values
                    ]
            print(json.dumps(record), flush=True)
        else:
            print(f"=== {text}\n{out.text}\n", flush=True)
    return 0


def require_chat_template(tok: Tokenizer | None, model: object, command: str) -> Tokenizer:
    """Fail before any prompt is read when ``command`` cannot render chat messages for ``model``;
    return the tokenizer that can.

    Checked here because the tokenizer's own message speaks to HTTP clients (the completions API).
    """
    if tok is None:
        raise ValueError(f"{command}: model {str(model)!r} has no tokenizer (tokenizer.json); it needs one")
    if not tok.has_chat_template:
        raise ValueError(
            f"{command}: model {str(model)!r} has no chat template (none in tokenizer_config.json "
            "or chat_template.jinja); use `baton generate --prompt TEXT` without --chat for raw text"
        )
    return tok


def _encode(tok: Tokenizer | None, args: argparse.Namespace) -> list[list[int]]:
    if args.chat:
        require_chat_template(tok, args.model, "baton generate --chat")
    if tok is None:
        raise ValueError(f"model {args.model!r} has no tokenizer; text prompts need one")
    return [tok.encode_chat([{"role": "user", "content": p}]) if args.chat else tok.encode(p) for p in args.prompt]


def _generate_on_cluster(args: argparse.Namespace, params):
    from baton.cluster import ClusterConfig, LocalCluster

    p = 1 if args.prefill_workers is None else args.prefill_workers
    d = 1 if args.decode_workers is None else args.decode_workers
    if p < 0 or d < 1:
        raise ValueError("--prefill-workers must be >= 0 and --decode-workers >= 1")
    threads = (
        {}
        if args.threads is None
        else dict(  # per worker (the pools' own default is 1)
            torch_threads_per_worker=args.threads, cpus_per_worker=float(args.threads)
        )
    )
    cfg = ClusterConfig(prefill_workers=p, decode_workers=d, engine=engine_config_from_args(args), **threads)
    with LocalCluster(cfg, progress=progress_printer(args.json)) as cluster:
        return cluster.generate(_encode(cluster.tokenizer, args), params)
