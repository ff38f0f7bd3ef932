"""Tool calls parsed while the output streams: each new piece of text yields the content that is
surely not markup and the calls' deltas as OpenAI streams them -- a call's first delta carries its
index, id and name, later ones pieces of its arguments -- with partial markup held back, never sent
as content (pure Python). The text so far is rescanned at each piece (tool-call outputs are short)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from router.tool_calls.parsers import ToolFormat, scan


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None  # the first delta of a call: its id and name
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = field(default=())


class ToolCallStream:
    def __init__(self, fmt: ToolFormat, new_id: Callable[[], str]) -> None:
        self.fmt = fmt
        self.new_id = new_id
        self.text = ""
        self._content_sent = 0
        self._named: list[bool] = []
        self._args_sent: list[int] = []

    @property
    def num_calls(self) -> int:
        """Calls begun so far (their id and name sent)."""
        return sum(self._named)

    def feed(self, piece: str) -> StreamDelta:
        self.text += piece
        return self._delta(final=False)

    def finish(self) -> StreamDelta:
        """The rest, at the end of the output (held-back text that turned out not to be markup)."""
        return self._delta(final=True)

    def _delta(self, final: bool) -> StreamDelta:
        snap = scan(self.fmt, self.text, final)
        content = snap.content[self._content_sent :] if len(snap.content) > self._content_sent else ""
        self._content_sent = max(self._content_sent, len(snap.content))
        deltas = []
        for i, call in enumerate(snap.calls):
            if i == len(self._named):
                if call.name is None:
                    break  # (calls are begun in order)
                self._named.append(True)
                self._args_sent.append(0)
                deltas.append(ToolCallDelta(i, self.new_id(), call.name, ""))
            sent = self._args_sent[i]
            if len(call.arguments) > sent:
                deltas.append(ToolCallDelta(i, arguments=call.arguments[sent:]))
                self._args_sent[i] = len(call.arguments)
        return StreamDelta(content, tuple(_merge(deltas)))


def _merge(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """A call's name delta and its first arguments piece in one delta (as OpenAI sends them)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and d.id is None:
            prev = out[-1]
            out[-1] = ToolCallDelta(prev.index, prev.id, prev.name, prev.arguments + d.arguments)
        else:
            out.append(d)
    return out
