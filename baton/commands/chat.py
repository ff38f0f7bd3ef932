"""``baton chat``: an interactive chat with the model, streaming tokens as they are generated."""

from __future__ import annotations

import argparse
import sys

from baton.commands.engine_args import add_engine_args, engine_config_from_args, progress_printer
from baton.commands.generate import add_sampling_args, sampling_params_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat in the terminal")
    p.add_argument("--system", default=None, help="a system message")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(run=run, max_tokens=256)


def run(args: argparse.Namespace) -> int:
    from engine.engine import LLMEngine

    params = sampling_params_from_args(args)
    engine = LLMEngine(engine_config_from_args(args), progress=progress_printer(False))
    tok = engine.tokenizer
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("baton chat: type a message, an empty line or Ctrl-D to quit.", flush=True)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        messages.append({"role": "user", "content": line})
        prompt = tok.encode_chat(messages)
        budget = engine.max_model_len - len(prompt)
        if budget <= 0:
            print("(the conversation no longer fits the context; starting over)", flush=True)
            messages = messages[-1:]
            prompt = tok.encode_chat(messages)
            budget = engine.max_model_len - len(prompt)
        rid = engine.add_request(None, prompt, _fit(params, budget))
        print("model> ", end="", flush=True)
        reply = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == rid:
                    sys.stdout.write(out.text_delta)
                    sys.stdout.flush()
                    reply.append(out.text_delta)
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(reply)})


def _fit(params, budget: int):
    from dataclasses import replace

    return params if params.max_tokens <= budget else replace(params, max_tokens=budget)
