"""What the load generator measured for one request.

Times are seconds on the client's monotonic clock relative to the run's start. ``arrival_s`` is
when the plan wanted the request sent and ``send_s`` when it was (their difference is client lag,
reported so an overloaded client is visible); latencies count from ``send_s``.

Status:
- ``ok``: the request finished normally;
- ``rejected``: refused before any output (an HTTP error status, or a gRPC status with no message);
- ``error``: failed after output started (an in-band SSE error, a gRPC status mid-stream), or the
  connection failed;
- ``timeout``: the client's own per-request timeout passed, or the request was still running when
  the run's drain time after the last arrival ran out (``error_type`` tells which).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "rejected", "error", "timeout"]
REQUEST_TIMEOUT = "request_timeout"  # error_type of a request over its own timeout
UNFINISHED = "unfinished_at_end"  # error_type of one still running when the run's drain time ran out


@dataclass
class RequestRecord:
    index: int
    lane: str  # the lane the client asked for
    prompt_len: int  # tokens sent
    output_len: int  # max_tokens sent (with ignore_eos: the tokens expected)
    arrival_s: float
    send_s: float
    status: Status = "ok"
    served_lane: str | None = None  # the lane the server reports (X-Baton-Lane / GenerateResponse.lane)
    first_token_s: float | None = None  # absolute (run clock)
    end_s: float | None = None  # absolute (run clock)
    output_tokens: int = 0
    cached_tokens: int = 0
    chunks: int = 0
    # Inter-token latencies: each gap between streamed chunks, split evenly over the tokens the chunk
    # carried (gRPC reports them; an SSE chunk counts as one token). Kept out of the JSON records.
    itl_s: list[float] = field(default_factory=list)
    http_status: int | None = None
    grpc_code: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (tokens - 1): the mean time per output token after the first."""
        if self.status != "ok" or self.output_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def reason(self) -> str | None:
        """A rejection or failure reason: ``HTTP 429 queue_full``, ``gRPC UNAVAILABLE overloaded``, ..."""
        if self.status == "ok":
            return None
        if self.status == "timeout":
            return "unfinished at end of run" if self.error_type == UNFINISHED else "client timeout"
        what = self.error_code or self.error_type
        if self.http_status is not None:
            where = f"HTTP {self.http_status}"
        elif self.grpc_code is not None:
            where = f"gRPC {self.grpc_code}"
        else:  # an in-band stream error or a connection failure
            where = self.status
        return f"{where} {what}" if what else where

    def to_dict(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731 - microseconds are plenty
        return {
            "index": self.index,
            "lane": self.lane,
            "served_lane": self.served_lane,
            "status": self.status,
            "reason": self.reason,
            "arrival_s": r(self.arrival_s),
            "send_s": r(self.send_s),
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "chunks": self.chunks,
            "ttft_s": r(self.ttft_s),
            "tpot_s": r(self.tpot_s),
            "e2e_s": r(self.e2e_s),
            "http_status": self.http_status,
            "grpc_code": self.grpc_code,
            "error_type": self.error_type,
            "error_code": self.error_code,
            "error_message": self.error_message,
        }


def chunk_arrived(rec: RequestRecord, now: float, tokens: int, last_chunk_s: float | None) -> float:
    """Account for one streamed chunk carrying ``tokens`` tokens at ``now``; returns ``now`` (the
    new last-chunk time). The first chunk sets the TTFT; later ones add ITL samples."""
    tokens = max(tokens, 1)
    if rec.first_token_s is None:
        rec.first_token_s = now
        # Tokens that came with the first one arrived at the same instant: zero gaps.
        rec.itl_s.extend([0.0] * (tokens - 1))
    elif last_chunk_s is not None:
        rec.itl_s.extend([(now - last_chunk_s) / tokens] * tokens)
    rec.chunks += 1
    rec.output_tokens += tokens
    return now
