"""The protocol-neutral request a client sends, and what a client must offer the runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from baton.perf.loadgen.records import RequestRecord

Clock = Callable[[], float]  # seconds since the run started


@dataclass(frozen=True)
class Outgoing:
    index: int
    lane: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    stream: bool = True


@dataclass(frozen=True)
class ServerInfo:
    model: str | None
    max_model_len: int | None
    vocab_size: int | None
    lanes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "max_model_len": self.max_model_len,
            "vocab_size": self.vocab_size,
            "lanes": list(self.lanes),
        }


class Client(Protocol):
    """One streaming client per protocol. ``send`` never raises for a request's failure: every
    outcome is a ``RequestRecord`` (cancellation excepted)."""

    async def server_info(self) -> ServerInfo: ...

    async def send(self, req: Outgoing, clock: Clock) -> RequestRecord: ...

    async def aclose(self) -> None: ...


def new_record(req: Outgoing, clock: Clock) -> RequestRecord:
    return RequestRecord(
        index=req.index,
        lane=req.lane,
        prompt_len=len(req.prompt_ids),
        output_len=req.max_tokens,
        arrival_s=req.arrival_s,
        send_s=clock(),
    )


def short(message: object, limit: int = 200) -> str:
    text = str(message)
    return text if len(text) <= limit else text[: limit - 3] + "..."
