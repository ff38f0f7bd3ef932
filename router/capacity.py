"""Capacity credits: may the router dispatch one more request to the pools right now? (pure Python)

Credits come from the workers' load reports — free KV blocks and sequence slots on the decode
workers, queued prefill tokens on the prefill workers — minus what this router dispatched since
those reports were taken (charges expire after ``charge_ttl_s``, by when a fresh report includes
them). Keeping the backlog in the router, where lanes are visible, rather than in the workers'
queues is what lets weighted fair sharing and admission work.
"""

from __future__ import annotations

import time
from collections import deque

from router.worker_pool import WorkerPool


class Capacity:
    def __init__(
        self,
        pool: WorkerPool,
        *,
        prefill_backlog_chunks: float = 2.0,
        kv_reserve_fraction: float = 0.05,
        charge_ttl_s: float = 1.5,
    ) -> None:
        self.pool = pool
        self.prefill_backlog_chunks = prefill_backlog_chunks  # queued prefill per worker, in step budgets
        self.kv_reserve_fraction = kv_reserve_fraction
        self.charge_ttl_s = charge_ttl_s
        self._charges: deque[tuple[float, int, int, int]] = deque()  # (time, blocks, seqs, prefill tokens)

    def _pending(self, now: float) -> tuple[int, int, int]:
        while self._charges and now - self._charges[0][0] > self.charge_ttl_s:
            self._charges.popleft()
        blocks = sum(c[1] for c in self._charges)
        seqs = sum(c[2] for c in self._charges)
        tokens = sum(c[3] for c in self._charges)
        return blocks, seqs, tokens

    def has_room(self, prompt_tokens: int, max_tokens: int) -> bool:
        now = time.monotonic()
        p_blocks, p_seqs, p_tokens = self._pending(now)
        decode = self.pool.live("decode")
        if not decode:
            return False
        free = seqs_left = 0
        need = 0
        reserve = 0
        for w in decode:
            bs = w.info.block_size
            need = -(-(prompt_tokens + min(max_tokens, 64)) // bs)  # the prompt and the first steps
            if w.load is None:
                free += w.info.num_blocks
                seqs_left += w.info.max_num_seqs
            else:
                free += w.load.num_free_blocks
                seqs_left += w.info.max_num_seqs - (w.load.num_running + w.load.num_waiting + w.load.num_reserved)
            reserve += int(self.kv_reserve_fraction * w.info.num_blocks)
        if free - p_blocks - need < reserve or seqs_left - p_seqs < 1:
            return False
        prefill = self.pool.live("prefill")
        if prefill:
            limit = sum(self.prefill_backlog_chunks * w.info.max_num_batched_tokens for w in prefill)
            queued = sum(w.load.queued_prefill_tokens if w.load else 0 for w in prefill)
            # A lone prompt bigger than the limit still goes when the pool is empty.
            if queued + p_tokens > 0 and queued + p_tokens + prompt_tokens > limit:
                return False
        return True

    def charge(self, prompt_tokens: int, max_tokens: int, block_size: int) -> None:
        blocks = -(-(prompt_tokens + min(max_tokens, 64)) // block_size)
        self._charges.append((time.monotonic(), blocks, 1, prompt_tokens))

    def idle(self) -> bool:
        """Spare capacity: under half the sequence slots in use and no prefill backlog."""
        for w in self.pool.live("decode"):
            if w.load and (w.load.num_running + w.load.num_waiting) * 2 > w.info.max_num_seqs:
                return False
        return all((w.load.queued_prefill_tokens if w.load else 0) == 0 for w in self.pool.live("prefill"))
