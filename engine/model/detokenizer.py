"""Incremental detokenization: generated ids to streamed text deltas (vLLM's prefix/read offsets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    """What the detokenizer needs of a tokenizer (``engine.model.tokenizer.Tokenizer``)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


# Prompt tokens kept as left context for the first decoded token (vLLM uses the same 5): enough
# for decoders that treat the first token specially (sentencepiece's leading-space strip).
_DETOKENIZER_CONTEXT = 5
# Tokens held back while the text ends in U+FFFD before the detokenizer looks for a point to emit
# up to: a UTF-8 sequence is at most 4 bytes, so past a few tokens the run is no UTF-8 at all (a
# model emitting stray byte tokens), and holding all of it made every token re-decode the whole
# run (quadratic in the run's length, on every step of the batch it was in).
_MAX_HELD_TOKENS = 8
_KEEP_HELD_TOKENS = 4  # the tail still held: bytes the next tokens may complete


class IncrementalDetokenizer:
    """Turns generated ids into text deltas for streaming, vLLM style (prefix/read offsets).

    Each step decodes two short windows, ``ids[prefix:read]`` (already emitted) and ``ids[prefix:]``,
    and emits the difference. Text that ends in U+FFFD is held back, because with byte-level BPE
    that usually means an incomplete UTF-8 sequence that the next token completes. Decoding windows
    rather than single tokens also gets leading spaces right for decoders that strip them from the
    first token. Past ``_MAX_HELD_TOKENS`` held tokens, all but the last few go out as they decode
    (invalid bytes as U+FFFD, as the final decode has them), where the text cuts cleanly there.
    ``finish()`` flushes whatever is held back when generation stops, after which the
    concatenated deltas equal ``tokenizer.decode(generated_ids)`` for byte-level BPE tokenizers
    (sentencepiece-style decoders keep the first token's leading space, as vLLM does, where
    decoding the generated ids alone strips it).
    """

    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        context = [int(i) for i in prompt_token_ids[-_DETOKENIZER_CONTEXT:]] if prompt_token_ids else []
        if context and self._decode(context).endswith("\ufffd"):
            # The prompt ends inside a UTF-8 sequence: as context it would absorb the first generated
            # bytes and make the stream differ from decode(generated ids), so do without it.
            context = []
        self._ids = context
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append generated ids; return the newly decodable text (possibly empty)."""
        out: list[str] = []
        for token_id in token_ids:
            self._ids.append(int(token_id))
            prefix_text = self._decode(self._ids[self._prefix : self._read])
            new_text = self._decode(self._ids[self._prefix :])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                out.append(new_text[len(prefix_text) :])
                # Drop ids left of the new prefix so the windows (and memory) stay small.
                self._ids = self._ids[self._read :]
                self._prefix, self._read = 0, len(self._ids)
            elif len(self._ids) - self._read > _MAX_HELD_TOKENS:
                self._emit_held_run(prefix_text, new_text, out)
        delta = "".join(out)
        self.text += delta
        return delta

    def _emit_held_run(self, prefix_text: str, new_text: str, out: list[str]) -> None:
        """Emit a long held run up to a cut that leaves the last few tokens held, at the first cut
        (from the end) where the text splits cleanly (decoding the two sides apart gives the whole)
        and at least 3 characters follow it: no later byte can then complete a sequence before it
        (a lead byte's continuation is at most 3 bytes on, and skipped special tokens have none)."""
        last = len(self._ids) - _KEEP_HELD_TOKENS
        for cut in range(last, max(self._read, last - _KEEP_HELD_TOKENS), -1):  # a few tries: bounded cost
            head, tail = self._decode(self._ids[self._prefix : cut]), self._decode(self._ids[cut:])
            if (
                len(head) > len(prefix_text)
                and len(tail) >= 3
                and head.startswith(prefix_text)
                and head + tail == new_text
            ):
                out.append(head[len(prefix_text) :])
                self._ids = self._ids[self._read :]
                self._prefix, self._read = 0, cut - self._read
                return

    def finish(self) -> str:
        """Flush held-back text (an incomplete/invalid byte sequence at the very end)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self._ids = self._ids[self._read :]
        self._prefix, self._read = 0, len(self._ids)
        self.text += delta
        return delta
