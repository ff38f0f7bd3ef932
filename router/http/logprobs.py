"""OpenAI's logprobs objects for one request's tokens, in the two shapes the API uses.

- ``/v1/completions`` (legacy): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
  where each ``top_logprobs`` entry maps token text to logprob for the requested alternatives *and*
  the sampled token (so up to ``logprobs + 1`` entries, as OpenAI documents). With ``echo`` the
  prompt's tokens come first, the very first with ``null`` (nothing precedes it). ``text_offset``
  indexes the returned text (the echoed prompt, then the completion). The prompt's tokens are
  placed so that they end where the echoed prompt ends: a BOS token the tokenizer added (not in
  the prompt's text) or sentencepiece's leading space would otherwise shift every later offset.
  Tokens before the text's start (BOS) get offset 0.
- ``/v1/chat/completions``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
  "refusal": null}``.

A token is named by its bytes decoded as UTF-8; a token that holds only part of a character is
named ``bytes:\\xNN...`` (OpenAI's spelling) and its exact bytes are in ``bytes``. Logprobs are
clamped at -9999.0 (vLLM's floor) so that JSON never carries -Infinity.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any

from engine.logprobs import TokenLogprob

_FLOOR = -9999.0


def token_name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _lp(value: float) -> float:
    return value if value >= _FLOOR else _FLOOR


class LogprobsFormatter:
    """Formats one request's logprobs, in order, chunk by chunk (it keeps the completions text
    offset between chunks)."""

    def __init__(
        self, token_bytes: Callable[[Sequence[int]], list[bytes]], *, chat: bool, echo_text: str | None = None
    ) -> None:
        """echo_text: the prompt's text as the completion returns it (``echo``), which the prompt's
        tokens are aligned to."""
        self._token_bytes = token_bytes
        self.chat = chat
        self._echo_text = echo_text
        self._offset = 0  # characters of text before the next token (completions)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # across split characters

    def format(self, logprobs: Sequence[TokenLogprob], prompt: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        """The next tokens' logprobs; ``prompt``: the prompt's tokens (``echo``), which come first."""
        entries = (*prompt, *logprobs)
        ids = [lp.token_id for lp in entries]
        for lp in entries:
            ids.extend(t for t, _ in lp.top)
        names = dict(zip(ids, self._token_bytes(ids)))
        if self.chat:
            return self._chat(entries, names)
        offsets = [*self._prompt_offsets(prompt, names), *self._offsets(logprobs, names)]
        return self._completion(entries, names, offsets)

    def _prompt_offsets(self, prompt: Sequence[TokenLogprob], raw: dict[int, bytes]) -> list[int]:
        if not prompt:
            return []
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        lengths = [len(utf8.decode(raw[lp.token_id])) for lp in prompt]
        total = sum(lengths) + len(utf8.decode(b"", final=True))
        start = self._offset if self._echo_text is None else len(self._echo_text) - total
        offsets = []
        for length in lengths:
            offsets.append(max(0, start))
            start += length
        self._offset = self._offset + total if self._echo_text is None else len(self._echo_text)
        return offsets

    def _offsets(self, logprobs: Sequence[TokenLogprob], raw: dict[int, bytes]) -> list[int]:
        offsets = []
        for lp in logprobs:
            offsets.append(self._offset)
            self._offset += len(self._utf8.decode(raw[lp.token_id]))
        return offsets

    def _chat(self, logprobs: Sequence[TokenLogprob], raw: dict[int, bytes]) -> dict[str, Any]:
        def entry(token_id: int, value: float) -> dict[str, Any]:
            return {"token": token_name(raw[token_id]), "logprob": _lp(value), "bytes": list(raw[token_id])}

        content = [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in logprobs
            if lp.logprob is not None
        ]
        return {"content": content, "refusal": None}

    @staticmethod
    def _completion(logprobs: Sequence[TokenLogprob], raw: dict[int, bytes], offsets: list[int]) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for lp in logprobs:
            name = token_name(raw[lp.token_id])
            tokens.append(name)
            if lp.logprob is None:  # a prompt's first token: nothing precedes it (OpenAI: null)
                values.append(None)
                tops.append(None)
            else:
                top = {token_name(raw[t]): _lp(v) for t, v in lp.top}
                top.setdefault(name, _lp(lp.logprob))
                values.append(_lp(lp.logprob))
                tops.append(top)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
