"""Capacity credits: may the router dispatch one more request to the pools right now? (pure Python)

Credits come from the workers' load reports — free KV blocks and sequence slots on the decode
workers, queued prefill tokens on the prefill workers — minus what this router dispatched since
those reports were taken. A charge covers a request from its reservation until it is placed and
counted by the worker's next report: blocks are reported every decode step, so block charges
expire after ``charge_ttl_s``; prefill workers report every monitor interval, so once placed a
request's prompt tokens are counted on its worker handle (``dispatched_tokens``) until then. (A
1.5 s charge life double-counted everything dispatched in the last 1.5 s and held requests in the
router with the pools idle.) Sequence slots in use are the larger of the reported count and this
router's own unfinished dispatches, which is exact and current for one router.

Keeping the backlog in the router, where lanes are visible, rather than in the workers' queues is
what lets weighted fair sharing and admission work.

The prefill backlog is at most ``prefill_backlog_chunks`` step budgets a worker, and at most what
the pool computes in ``prefill_backlog_s`` at its measured rate: a prompt queued behind more than
the decode workers' transfer deadline allows is taken for a stalled transfer there and computed a
second time, on the decode worker (docs/BENCHMARKS.md, "Lanes under overload"). It limits only
prompts that need the prefill pool: one shorter than
``local_prefill_threshold`` prefills on a decode worker whenever the prefill pool is busy, so it
does not wait for that pool's backlog (``Room.PREFILL_FULL`` tells the lane queues that such
requests may pass a long prompt waiting for it). Holding them too let a burst of long prompts hold
every short one behind them in the router: 20.7 s to a short prompt's first token behind twelve
1,700-token prompts on one prefill worker (docs/BENCHMARKS.md, "Short prompts behind a burst").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from router.lane_queues import Room
from router.worker_pool import WorkerHandle, WorkerPool

# The share of the decode workers' transfer deadline a prompt may wait on a prefill worker for the
# prompts queued ahead of it: its own first chunk takes up to a step more.
PREFILL_BACKLOG_SHARE = 0.5


class Capacity:
    def __init__(
        self,
        pool: WorkerPool,
        *,
        prefill_backlog_chunks: float = 2.0,
        kv_reserve_fraction: float = 0.05,
        charge_ttl_s: float = 0.25,
        local_prefill_threshold: int = 0,
        prefill_backlog_s: float | None = None,
        prefill_rate: Callable[[list[str]], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``prefill_backlog_s`` with ``prefill_rate`` (the pool's measured prompt tokens/s for these
        live prefill workers): the time bound on the prefill backlog (None: step budgets only)."""
        if prefill_backlog_s is not None and (prefill_backlog_s <= 0 or prefill_rate is None):
            raise ValueError(f"prefill_backlog_s must be > 0 and come with a prefill rate, got {prefill_backlog_s!r}")
        self.pool = pool
        self.local_prefill_threshold = local_prefill_threshold  # shorter prompts may prefill on decode workers
        self._clock = clock  # the simulator passes its own
        # Requests this router dispatched (reserve) that have not finished (release): an exact,
        # current lower bound on the decode slots in use, where load reports lag by a polling interval.
        self.in_flight = 0
        self.prefill_backlog_chunks = prefill_backlog_chunks  # queued prefill per worker, in step budgets
        # (seconds, rate): the time bound on the prefill backlog (None: step budgets only)
        self._prefill_backlog_time = (
            (prefill_backlog_s, prefill_rate) if prefill_backlog_s is not None and prefill_rate is not None else None
        )
        self.kv_reserve_fraction = kv_reserve_fraction
        self.charge_ttl_s = charge_ttl_s
        self._charges: deque[tuple[float, int, int]] = deque()  # (time, blocks, prefill tokens)

    def _pending(self, now: float) -> tuple[int, int]:
        while self._charges and now - self._charges[0][0] > self.charge_ttl_s:
            self._charges.popleft()
        return sum(c[1] for c in self._charges), sum(c[2] for c in self._charges)

    def reserve(self, prompt_tokens: int, max_tokens: int, block_size: int) -> Room:
        """Take the credits for one request if there is room (the dispatcher then sends it). Checking
        and charging together matters: one dispatch round may pass many requests, and each must see
        the ones before it."""
        room = self.room(prompt_tokens, max_tokens)
        if room is Room.YES:
            self.charge(prompt_tokens, max_tokens, block_size)
            self.in_flight += 1
        return room

    def release(self) -> None:
        """A reserved request finished (or was aborted)."""
        self.in_flight = max(0, self.in_flight - 1)

    def free_seq_slots(self) -> int:
        """Decode sequence slots not yet taken, counting what was dispatched since the last reports;
        negative when requests wait in the workers' queues for a slot."""
        decode = self.pool.live("decode")
        slots = sum(w.reported_info.max_num_seqs for w in decode)
        reported = sum(w.load.num_running + w.load.num_waiting + w.load.num_reserved for w in decode if w.load)
        return slots - max(reported, self.in_flight)

    def free_places(self, prompt_tokens: int, max_tokens: int) -> int:
        """How many more requests of this size the decode pool can start now: its free sequence
        slots, or fewer where its free KV (less the reserve and recent charges) holds fewer. With a
        small KV pool the blocks, not the slots, bound how many run, and admission's wait for a
        place looked at the slots alone (it admitted requests that then waited 2-4 s for blocks)."""
        slots = self.free_seq_slots()
        decode = self.pool.live("decode")
        if not decode:
            return min(slots, 0)
        p_blocks, _ = self._pending(self._clock())
        free, need, reserve = self._kv(decode, prompt_tokens, max_tokens)
        places = max(0, (free - p_blocks - reserve) // max(need, 1))
        if places == 0 and self._empty(decode, p_blocks):
            places = 1  # a lone request on an empty pool goes (``room``): it waits for nothing
        return min(slots, places)

    def _kv(self, decode: list[WorkerHandle], prompt_tokens: int, max_tokens: int) -> tuple[int, int, int]:
        """(free blocks, blocks the request needs, blocks kept in reserve) over the decode pool, from
        the last reports (the need covers the prompt and the first steps)."""
        free = need = reserve = 0
        for w in decode:
            need = -(-(prompt_tokens + min(max_tokens, 64)) // w.reported_info.block_size)
            free += w.reported_info.num_blocks if w.load is None else w.load.num_free_blocks
            reserve += int(self.kv_reserve_fraction * w.reported_info.num_blocks)
        return free, need, reserve

    def _empty(self, decode: list[WorkerHandle], p_blocks: int) -> bool:
        return (
            self.in_flight == 0
            and p_blocks == 0
            and all(
                w.load is None or w.load.num_running + w.load.num_waiting + w.load.num_reserved == 0 for w in decode
            )
        )

    def has_room(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.room(prompt_tokens, max_tokens) is Room.YES

    def room(self, prompt_tokens: int, max_tokens: int) -> Room:
        p_blocks, p_tokens = self._pending(self._clock())
        decode = self.pool.live("decode")
        if not decode:
            return Room.NO
        free, need, reserve = self._kv(decode, prompt_tokens, max_tokens)
        # A lone request on an empty decode pool goes even past the reserve (or past a worker's whole
        # cache: that worker then refuses it, naming why). Held back, it would head its lane for good.
        empty = self._empty(decode, p_blocks)
        if (not empty and free - p_blocks - need < reserve) or self.free_seq_slots() < 1:
            return Room.NO
        prefill = self.pool.live("prefill")
        if prefill and prompt_tokens >= self.local_prefill_threshold:
            limit = self.prefill_backlog_limit(prefill)
            # dispatched_tokens: placed since that worker's last report (which will include them).
            queued = sum((w.load.queued_prefill_tokens if w.load else 0) + w.dispatched_tokens for w in prefill)
            # A lone prompt bigger than the limit still goes when the pool is empty.
            if queued + p_tokens > 0 and queued + p_tokens + prompt_tokens > limit:
                return Room.PREFILL_FULL
        return Room.YES

    def prefill_backlog_limit(self, prefill: list[WorkerHandle]) -> float:
        """The most prompt tokens queued on these prefill workers that more may join."""
        limit: float = sum(self.prefill_backlog_chunks * w.reported_info.max_num_batched_tokens for w in prefill)
        if self._prefill_backlog_time is not None:
            seconds, rate = self._prefill_backlog_time
            limit = min(limit, seconds * rate([w.worker_id for w in prefill]))
        return limit

    def charge(self, prompt_tokens: int, max_tokens: int, block_size: int) -> None:
        blocks = -(-(prompt_tokens + min(max_tokens, 64)) // block_size)
        # A short prompt is not charged to the prefill backlog: it goes there only when a prefill
        # worker has room for it (placement counts it on that worker's handle then).
        prefill_tokens = prompt_tokens if prompt_tokens >= self.local_prefill_threshold else 0
        self._charges.append((self._clock(), blocks, prefill_tokens))

    def idle(self) -> bool:
        """Spare capacity: under half the sequence slots in use and no prefill backlog."""
        for w in self.pool.live("decode"):
            if w.load and (w.load.num_running + w.load.num_waiting) * 2 > w.reported_info.max_num_seqs:
                return False
        return all((w.load.queued_prefill_tokens if w.load else 0) == 0 for w in self.pool.live("prefill"))
