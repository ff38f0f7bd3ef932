"""``baton chat``: an interactive chat with the model, streaming tokens as they are generated.

A turn that cannot be sent (a message longer than the context, a line that is not UTF-8, a message
the chat template rejects) is reported and skipped; the session goes on. Ctrl-C while a reply streams
stops that reply and keeps what was shown of it in the history (the model "said" it, and the chat
template still sees alternating user/assistant turns); Ctrl-C at the prompt ends the session.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from baton.commands.engine_args import add_engine_args, engine_config_from_args, progress_printer
from baton.commands.generate import add_sampling_args, require_chat_template, sampling_params_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="interactive chat in the terminal")
    p.add_argument("--system", default=None, help="a system message")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(run=run, max_tokens=256)


def run(args: argparse.Namespace) -> int:
    from engine.engine import LLMEngine
    from engine.errors import InvalidParameterError

    params = sampling_params_from_args(args)
    engine = LLMEngine(engine_config_from_args(args), progress=progress_printer(False))
    tok = require_chat_template(engine.tokenizer, engine.model_dir, "baton chat")
    if params.max_tokens >= engine.max_model_len:  # (a turn's reply is cut to what its history leaves)
        raise ValueError(
            f"--max-tokens {params.max_tokens}: this model's context length is {engine.max_model_len} "
            "tokens, prompt included"
        )
    system = [{"role": "system", "content": args.system}] if args.system else []
    # Render once before the first input, so a template that cannot be used at all (several
    # templates and no default, a syntax error) ends the session now, not on every turn.
    tok.encode_chat([*system, {"role": "user", "content": "hi"}])
    _undecodable_bytes_as_surrogates(sys.stdin)
    messages = list(system)
    print("baton chat: type a message, an empty line or Ctrl-D to quit.", flush=True)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        if not _is_utf8(line):
            _skip("the line is not valid UTF-8 text")
            continue
        user = {"role": "user", "content": line}
        try:
            turn = [*messages, user]
            prompt = tok.encode_chat(turn)
            if len(prompt) >= engine.max_model_len:
                turn = [*system, user]  # the --system message stays when the history goes
                prompt = tok.encode_chat(turn)
                if len(prompt) >= engine.max_model_len:  # not even one token would be left for the reply
                    _skip(f"message too long ({len(prompt)} tokens, context {engine.max_model_len})")
                    continue
                print("(the conversation no longer fits the context; starting over)", flush=True)
            rid = engine.add_request(None, prompt, _fit(params, engine.max_model_len - len(prompt)))
        except InvalidParameterError as e:
            _skip(f"{e.param}: {e.message}")
            continue
        print("model> ", end="", flush=True)
        reply = _stream(engine, rid)
        print(flush=True)
        messages = [*turn, {"role": "assistant", "content": reply}]


def _stream(engine, rid: str) -> str:
    """Run the engine until ``rid`` finishes or Ctrl-C aborts it; print and return its text."""
    reply = []

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        reply.append(text)

    with _StopAtStepBoundary() as ctrl_c:
        while engine.has_unfinished_requests():
            if ctrl_c.pressed:
                out = engine.abort(rid)
                if out is not None:
                    show(out.text_delta)  # what the detokenizer held back
                break
            for out in engine.step():
                if out.request_id == rid:
                    show(out.text_delta)
    return "".join(reply)


class _StopAtStepBoundary:
    """While a reply streams, the first SIGINT only sets ``pressed``: the loop aborts the request
    between steps, because a KeyboardInterrupt raised inside ``engine.step()`` would leave the
    scheduler and the runner out of step. A second SIGINT raises as usual (a stuck step)."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None

    def __enter__(self) -> _StopAtStepBoundary:
        try:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread, where no SIGINT is delivered anyway
            self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum, frame) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True


def _undecodable_bytes_as_surrogates(stream) -> None:
    # A UTF-8 locale reads stdin strictly, and one bad byte would end the session with a
    # UnicodeDecodeError; as surrogates the line arrives and _is_utf8 rejects just that line.
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")


def _is_utf8(line: str) -> bool:
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the bytes that did not decode
        return False
    return True


def _skip(reason: str) -> None:
    print(f"baton: {reason}; not sent", file=sys.stderr, flush=True)


def _fit(params, budget: int):
    from dataclasses import replace

    return params if params.max_tokens <= budget else replace(params, max_tokens=budget)
