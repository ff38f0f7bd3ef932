"""The soak's mixed load, as clients send it over HTTP: interactive streams (SSE completions) and
durable batch jobs (non-streaming completions in the ``batch`` lane, each with its own
``X-Request-Id`` so its result can be fetched from ``GET /v1/batches/{id}``), greedy with
``ignore_eos`` over token-id prompts so that any answer can be compared with a fault-free rerun.
Each request leaves a record of how it ended."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from enum import Enum

import httpx


class Ending(Enum):
    FINISHED = "finished"  # a stream's final chunk (finish_reason) and [DONE]; a job's 200
    ERROR_EVENT = "error_event"  # a stream that ended with an SSE error event
    REFUSED = "refused"  # 429/503 before anything ran (the client was told to come back)
    FAILED = "failed"  # another HTTP error, or the connection broke
    HUNG = "hung"  # no end within the client's patience


@dataclass
class Record:
    kind: str  # "stream" | "batch"
    request_id: str
    prompt: list[int]
    max_tokens: int
    start: float  # monotonic
    end: float = 0.0
    ending: Ending = Ending.HUNG
    text: str = ""
    finish_reason: str | None = None
    detail: str = ""


@dataclass
class LoadSpec:
    interactive_rate: float = 2.0  # streams per second (Poisson arrivals)
    batch_rate: float = 0.5  # batch jobs per second
    stream_tokens: tuple[int, int] = (16, 48)
    batch_tokens: tuple[int, int] = (32, 96)
    prompt_tokens: tuple[int, int] = (16, 200)
    token_range: tuple[int, int] = (100, 1000)  # prompt token ids drawn from here
    stream_patience_s: float = 120.0  # a stream with no end by then is hung
    batch_patience_s: float = 900.0
    seed: int = 0


def payload(prompt: list[int], max_tokens: int, lane: str, stream: bool) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "lane": lane,
        "stream": stream,
    }


def _refused(status: int) -> bool:
    return status in (429, 503)


async def run_stream(client: httpx.AsyncClient, rec: Record, patience_s: float) -> None:
    try:
        async with asyncio.timeout(patience_s):
            async with client.stream(
                "POST",
                "/v1/completions",
                json=payload(rec.prompt, rec.max_tokens, "interactive", True),
                headers={"X-Request-Id": rec.request_id},
            ) as r:
                if r.status_code != 200:
                    await r.aread()
                    rec.ending = Ending.REFUSED if _refused(r.status_code) else Ending.FAILED
                    rec.detail = f"{r.status_code} {r.text[:200]}"
                    return
                done = False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        rec.ending, rec.detail = Ending.ERROR_EVENT, json.dumps(event["error"])[:200]
                        return
                    for choice in event.get("choices", []):
                        rec.text += choice.get("text") or ""
                        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
                rec.ending = Ending.FINISHED if done and rec.finish_reason else Ending.FAILED
                if rec.ending is Ending.FAILED:
                    rec.detail = "the stream ended without a final chunk and [DONE]"
    except TimeoutError:
        rec.ending, rec.detail = Ending.HUNG, f"no end within {patience_s:g}s"
    except httpx.HTTPError as e:
        rec.ending, rec.detail = Ending.FAILED, f"{type(e).__name__}: {e}"[:200]
    finally:
        rec.end = time.monotonic()


async def run_batch(client: httpx.AsyncClient, rec: Record, patience_s: float) -> None:
    try:
        r = await client.post(
            "/v1/completions",
            json=payload(rec.prompt, rec.max_tokens, "batch", False),
            headers={"X-Request-Id": rec.request_id},
            timeout=patience_s,
        )
        if r.status_code == 200:
            body = r.json()
            rec.ending, rec.text = Ending.FINISHED, body["choices"][0]["text"]
            rec.finish_reason = body["choices"][0]["finish_reason"]
        else:
            rec.ending = Ending.REFUSED if _refused(r.status_code) else Ending.FAILED
            rec.detail = f"{r.status_code} {r.text[:200]}"
    except httpx.TimeoutException:
        rec.ending, rec.detail = Ending.HUNG, f"no answer within {patience_s:g}s"
    except httpx.HTTPError as e:
        rec.ending, rec.detail = Ending.FAILED, f"{type(e).__name__}: {e}"[:200]
    finally:
        rec.end = time.monotonic()


@dataclass
class MixedLoad:
    """Open-loop arrivals of both kinds until ``stop`` is set; ``records`` holds every request sent."""

    base_url: str
    spec: LoadSpec
    records: list[Record] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        rng = random.Random(self.spec.seed)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(60.0, connect=10.0), limits=limits
        ) as client:
            tasks: set[asyncio.Task[None]] = set()
            kinds = (("stream", self.spec.interactive_rate), ("batch", self.spec.batch_rate))
            rate = sum(r for _, r in kinds)
            n = 0
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
                    break
                except TimeoutError:
                    pass
                kind = "stream" if rng.random() < self.spec.interactive_rate / rate else "batch"
                n += 1
                rec = self._record(rng, kind, f"soak-{self.spec.seed}-{kind[0]}{n}")
                self.records.append(rec)
                if kind == "stream":
                    task = asyncio.create_task(run_stream(client, rec, self.spec.stream_patience_s))
                else:
                    task = asyncio.create_task(run_batch(client, rec, self.spec.batch_patience_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:  # the requests in flight when the load stops run to their end
                await asyncio.gather(*tasks)

    def _record(self, rng: random.Random, kind: str, request_id: str) -> Record:
        lo, hi = self.spec.token_range
        prompt = [rng.randrange(lo, hi) for _ in range(rng.randint(*self.spec.prompt_tokens))]
        out = self.spec.stream_tokens if kind == "stream" else self.spec.batch_tokens
        return Record(kind, request_id, prompt, rng.randint(*out), time.monotonic())
