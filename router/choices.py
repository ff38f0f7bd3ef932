"""``n`` choices for one frontend request (HTTP or gRPC): ``n`` router requests started together,
merged into one response (or one interleaved stream) and stopped together.

Choice ``i`` is its own router request (admitted, queued, placed and counted like any other):
its id is ``<id>-<i>`` when the client named the request, its ``Idempotency-Key`` is the
client's key for choice 0 and ``<key>#<i>`` for the others, each fingerprinted with ``n`` (so a key
reused with another ``n`` collides on choice 0 and is refused, 409, before anything runs), and when
the client gave a ``seed`` it samples with ``seed + i``, so the choices differ yet each is
reproducible (greedy choices are all the same answer, as with OpenAI). The tenant's rate limits are
charged for all ``n`` at once, by the first choice admitted (api.ChoiceCharge, carried by each
choice's GenerateRequest): ``n`` beyond a bucket is a 400, never a 429 after some choices started.
If any choice is refused at admission, the ones already started are cancelled (journaled batch jobs
too: a client going away only detaches from those), the charge is given back and the refusal
is the response. A choice that fails after streaming started ends the others too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from router.api import ChoiceCharge, GenerateRequest, GenerationResult, GenerationStream, RouterAPI, StreamEvent

log = logging.getLogger(__name__)

MAX_CHOICES = 16


def choice_request(gen: GenerateRequest, index: int, n: int, charge: ChoiceCharge | None = None) -> GenerateRequest:
    seed = gen.sampling.seed
    key = gen.idempotency_key
    return replace(
        gen,
        request_id=None if gen.request_id is None else f"{gen.request_id}-{index}",
        idempotency_key=key if key is None or index == 0 else f"{key}#{index}",
        sampling=gen.sampling if seed is None else replace(gen.sampling, seed=_choice_seed(seed, index)),
        num_choices=n,
        charge=charge,
    )


def _choice_seed(seed: int, index: int) -> int:
    """Choice ``index``'s seed: ``seed + index``, wrapped within 64 bits (the sampler uses a seed's
    64 bits, so the stream is the one ``seed + index`` names; 2**64 - 2 with n=3 was refused as 2**64)."""
    s = seed + index
    return s - 2**64 if s >= 2**64 else s


class Choices:
    """The streams of one request's choices, in choice order."""

    def __init__(self, streams: list[GenerationStream]) -> None:
        self.streams = streams

    @classmethod
    async def start(cls, router: RouterAPI, gen: GenerateRequest, n: int) -> Choices:
        if n == 1:
            return cls([await router.generate(gen)])
        streams: list[GenerationStream] = []
        charge = ChoiceCharge(n)  # the first choice admitted is charged for all n at once
        try:
            for i in range(n):
                charge.pending = n - i
                streams.append(await router.generate(choice_request(gen, i, n, charge)))
        except BaseException:
            await cls(streams).cancel()  # refused whole: journaled batch choices are cancelled too
            await charge.give_back()  # the request is refused whole: its choices spend no budget
            raise
        return cls(streams)

    @property
    def request_id(self) -> str:
        """The ids of the choices' requests, comma-separated (what ``X-Request-Id`` carries)."""
        return ",".join(s.request_id for s in self.streams)

    @property
    def lane(self) -> str:
        return self.streams[0].lane

    async def abort(self) -> None:
        await self._each("abort")

    async def cancel(self) -> None:
        """Stop every choice, durable batch jobs included (``abort`` leaves those running)."""
        await self._each("cancel")

    async def _each(self, how: str) -> None:
        for s in self.streams:
            try:
                await getattr(s, how)()
            except Exception:
                log.exception("%s of request %s failed", how, s.request_id)

    async def results(self) -> list[GenerationResult]:
        if len(self.streams) == 1:
            return [await self.streams[0].result()]
        tasks = [asyncio.ensure_future(s.result()) for s in self.streams]
        try:
            return list(await asyncio.gather(*tasks))
        finally:  # one failed (or we were cancelled): the others are stopped, not left running
            if not all(t.done() and not t.cancelled() and t.exception() is None for t in tasks):
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self.abort()

    async def events(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        """(choice index, event) as they come; a choice's events stay in order."""
        if len(self.streams) == 1:
            async for ev in self.streams[0]:
                yield 0, ev
            return
        queue: asyncio.Queue[tuple[int, StreamEvent | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, stream: GenerationStream) -> None:
            try:
                async for ev in stream:
                    queue.put_nowait((i, ev))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                queue.put_nowait((i, e))
            finally:
                queue.put_nowait((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            left = len(tasks)
            while left:
                i, item = await queue.get()
                if item is None:
                    left -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    if item.error is not None:
                        await self.abort()  # one choice failed: the response ends here for all
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
