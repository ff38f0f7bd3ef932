"""The scheduler's admission of waiting requests, and shared prefixes in flight (pure Python, no torch).

Transitions: QUEUED or PREEMPTED → PREFILLING (the request joins the running batch). ``Scheduler``
admits once the running requests are served, and only in a step that preempted nothing.

Shared prefixes in flight: a waiting request whose next uncached prompt block is one that a running
request has yet to compute (same chained hash, so the same prefix) is passed over this step, and the
requests behind it are considered; once that block is computed (registered as it is scheduled), the
request is admitted with it as a cache hit. A burst of prompts with a common system prompt computes it
once, not once per request (``SchedulerConfig.defer_for_shared_prefix``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.block_hash import BlockHash
from engine.block_manager import BlockManager
from engine.lane_shares import LanePlan
from engine.request import Request, RequestState
from engine.scheduler_batch import RunningBatch
from engine.scheduler_policies import AdmissionPolicy, WaitingQueue
from engine.scheduler_step import StepPlan


class Admitter:
    def __init__(
        self,
        block_manager: BlockManager,
        waiting: WaitingQueue,
        batch: RunningBatch,
        policy: AdmissionPolicy,
        max_num_seqs: int,
        defer_for_shared_prefix: bool,
        watermark_blocks: int,
        num_reserved: Callable[[], int],
        resumed: Callable[[Request], None] | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.waiting = waiting
        self.batch = batch
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.defer_for_shared_prefix = defer_for_shared_prefix
        self.watermark_blocks = watermark_blocks
        self.num_reserved = num_reserved  # requests holding blocks to join the batch later (decode role)
        self.resumed = resumed  # told of every admission (the lane shares count time out after a preemption)

    def admit(self, budget: int, plan: StepPlan, lanes: LanePlan | None = None) -> None:
        """Waiting requests, in priority order, while ``budget`` tokens, ``max_num_seqs`` and free
        blocks (less the watermark kept for running requests to grow) allow; each takes its longest
        cached prefix first; with ``lanes``, a request of a lane at its cap, or with its lane's prompt
        tokens for this step spent, is passed over, and its first chunk is cut to that share. Added to
        ``plan.chunks``."""
        bm = self.block_manager
        waiting, batch, policy = self.waiting, self.batch, self.policy
        limit = policy.admission_limit(len(batch) + self.num_reserved(), self.max_num_seqs, len(waiting))
        share = bm.enable_prefix_caching and self.defer_for_shared_prefix
        in_flight: set[BlockHash] | None = None  # built on first use: most steps admit nothing or share nothing
        passed_over: list[Request] = []
        while budget > 0 and limit > 0 and len(waiting):
            req = waiting.peek()
            assert req is not None  # (the queue is not empty)
            if not policy.admits(req):  # (static batching: not a member of the running batch)
                passed_over.append(waiting.pop())
                continue
            if lanes is not None and lanes.running.get(req.priority, 0) >= lanes.caps.get(req.priority, limit):
                passed_over.append(waiting.pop())  # its lane is at its share (engine/lane_shares.py)
                continue
            can_hit = req.num_computed_tokens == 0 and not req.needs_prompt_logprobs
            cached = bm.find_cached_prefix(req) if can_hit else []
            # Only a block it could hit (never the one holding its last prompt token) is worth waiting for.
            if share and can_hit and len(cached) < bm.max_hit_blocks(req):
                if in_flight is None:
                    in_flight = self._prompt_blocks_in_flight()
                if req.block_hashes[len(cached)] in in_flight:
                    passed_over.append(waiting.pop())  # back in the queue after this step
                    continue
            n = req.num_tokens - req.num_computed_tokens - len(cached) * bm.block_size
            if n > budget:
                n = budget
            lane_tokens = lanes.tokens if lanes is not None else None
            if lane_tokens is not None and n > lane_tokens.get(req.priority, n):
                if not lane_tokens[req.priority]:
                    passed_over.append(waiting.pop())  # its lane's prompt tokens this step are spent
                    continue
                n = lane_tokens[req.priority]
            need = bm._num_new_blocks(req, n, len(cached))
            if need > bm.num_free_blocks - self.watermark_blocks and len(batch):
                break  # leave room for the running requests to grow
            if not bm.allocate(req, n, cached, leave_passed=True):  # (a hit's blocks behind a window: left)
                break
            waiting.pop()
            if req.first_scheduled_time is None:  # first admission (not a preempted request's return)
                req.first_scheduled_time = time.monotonic()
                req.num_cached_tokens = len(cached) * bm.block_size
            elif req.preempted_at is not None:  # back from a preemption: its time out, for its breakdown
                spans = req.preempted_spans = req.preempted_spans or []
                spans.append((req.preempted_at, time.monotonic()))
                req.preempted_at = None
            req.transition(RequestState.PREFILLING)
            batch.join(req)
            policy.admitted(req)
            if lanes is not None:
                lanes.running[req.priority] = lanes.running.get(req.priority, 0) + 1
                if lane_tokens is not None and req.priority in lane_tokens:
                    lane_tokens[req.priority] -= n
            if self.resumed is not None:
                self.resumed(req)
            plan.chunks.append(req)
            plan.chunk_counts.append(n)
            budget -= n
            limit -= 1
            if in_flight is not None:  # admitted now: the requests behind it wait for its blocks too
                in_flight.update(self._uncomputed_prompt_blocks(req))
        for req in passed_over:
            waiting.push(req)

    def _uncomputed_prompt_blocks(self, req: Request) -> list[BlockHash]:
        """Hashes of ``req``'s full prompt blocks not yet registered (still to be computed)."""
        return req.block_hashes[req.num_registered_blocks : req.num_prompt_tokens // self.block_manager.block_size]

    def _prompt_blocks_in_flight(self) -> set[BlockHash]:
        """Hashes of the full prompt blocks running requests have yet to compute."""
        bs = self.block_manager.block_size
        out: set[BlockHash] = set()
        for r in self.batch.requests:
            if r.num_registered_blocks < r.num_prompt_tokens // bs:
                if len(r.block_hashes) < r.num_prompt_tokens // bs:
                    self.block_manager.update_block_hashes(r)
                out.update(self._uncomputed_prompt_blocks(r))
        return out
