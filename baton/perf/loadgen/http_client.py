"""The OpenAI-compatible HTTP client of the load generator (httpx, SSE streaming).

Requests go to ``/v1/completions`` with the prompt as token ids, ``max_tokens = min_tokens =
output_len`` and ``ignore_eos`` (Baton's and vLLM's extensions), greedy sampling, the lane in the
body's ``lane`` field, and ``stream_options.include_usage`` so the last event reports the exact
number of generated tokens. One SSE chunk with text counts as one token arrival: the HTTP API
streams text, not token ids, so a chunk that carried several tokens counts once in the ITL (the
gRPC client sees token ids and splits exactly); TPOT uses the reported token count and is exact.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from baton.perf.loadgen.outgoing import Clock, Outgoing, ServerInfo, new_record, short
from baton.perf.loadgen.records import RequestRecord, chunk_arrived


def _error_fields(rec: RequestRecord, body: bytes | str | dict) -> None:
    """Fill the error type/code/message from an OpenAI error object (or whatever came instead)."""
    obj: Any = body
    if not isinstance(body, dict):
        try:
            obj = json.loads(body)
        except (ValueError, TypeError):
            rec.error_message = short(body.decode(errors="replace") if isinstance(body, bytes) else body)
            return
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        rec.error_type = err.get("type")
        rec.error_code = err.get("code")
        rec.error_message = short(err.get("message", ""))
    else:
        rec.error_message = short(obj)


class HttpClient:
    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout_s: float = 600.0, model: str | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No connection limit: an open-loop client must never queue requests on its own side.
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self.model = model

    async def server_info(self) -> ServerInfo:
        resp = await self._client.get("/v1/models")
        resp.raise_for_status()
        card = (resp.json().get("data") or [{}])[0]
        if self.model is None:
            self.model = card.get("id")
        return ServerInfo(
            model=card.get("id"),
            max_model_len=card.get("max_model_len"),
            vocab_size=card.get("vocab_size"),
            lanes=tuple(card.get("lanes") or ()),
        )

    def _body(self, req: Outgoing) -> dict:
        body: dict[str, Any] = {
            "prompt": list(req.prompt_ids),
            "max_tokens": req.max_tokens,
            "min_tokens": req.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": req.stream,
            "lane": req.lane,
        }
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        if self.model is not None:
            body["model"] = self.model
        return body

    async def send(self, req: Outgoing, clock: Clock) -> RequestRecord:
        rec = new_record(req, clock)
        try:
            if req.stream:
                await self._stream(req, rec, clock)
            else:
                await self._whole(req, rec, clock)
        except httpx.TimeoutException as e:
            rec.status, rec.error_type, rec.error_message = "timeout", type(e).__name__, short(e)
        except httpx.HTTPError as e:
            rec.status, rec.error_type, rec.error_message = "error", type(e).__name__, short(e)
        if rec.status != "ok":
            rec.end_s = rec.end_s if rec.end_s is not None else clock()
        return rec

    async def _stream(self, req: Outgoing, rec: RequestRecord, clock: Clock) -> None:
        async with self._client.stream("POST", "/v1/completions", json=self._body(req)) as resp:
            rec.served_lane = resp.headers.get("x-baton-lane")
            if resp.status_code != 200:
                rec.status, rec.http_status = "rejected", resp.status_code
                _error_fields(rec, await resp.aread())
                return
            last: float | None = None
            usage_tokens: int | None = None
            done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = clock()
                obj = json.loads(data)
                if "error" in obj:  # failed after the stream started: the status code is already sent
                    rec.status = "error"
                    _error_fields(rec, obj)
                    break
                choices = obj.get("choices") or []
                if choices:
                    if choices[0].get("text"):
                        last = chunk_arrived(rec, now, 1, last)
                    rec.end_s = now
                usage = obj.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens")
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if rec.status == "ok" and not done:
                rec.status, rec.error_type = "error", "stream_truncated"
            if usage_tokens is not None:
                rec.output_tokens = usage_tokens
            if rec.status == "ok" and rec.first_token_s is None:  # an answer of no visible text
                rec.first_token_s = rec.end_s if rec.end_s is not None else clock()
            if rec.end_s is None:
                rec.end_s = clock()

    async def _whole(self, req: Outgoing, rec: RequestRecord, clock: Clock) -> None:
        resp = await self._client.post("/v1/completions", json=self._body(req))
        now = clock()
        rec.served_lane = resp.headers.get("x-baton-lane")
        if resp.status_code != 200:
            rec.status, rec.http_status = "rejected", resp.status_code
            _error_fields(rec, resp.content)
            return
        usage = resp.json().get("usage") or {}
        rec.first_token_s = rec.end_s = now  # nothing streams: the first token is the whole answer
        rec.output_tokens = usage.get("completion_tokens", 0)
        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        rec.chunks = 1

    async def aclose(self) -> None:
        await self._client.aclose()
