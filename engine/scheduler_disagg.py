"""The scheduler's prefill and decode roles in a disaggregated cluster (pure Python, no torch).

``Handoffs`` owns the requests whose blocks are held for KV in flight. Prefill role: a request
stops after its first token and holds its blocks (PREFILLING → TRANSFERRING, in ``transferring``)
until the decode side has the KV (→ FINISHED). Decode role: blocks are reserved for a prompt a
prefill worker computes (QUEUED → RESERVED, in ``reserved``); when its KV and first token arrive
the request joins the decode batch (→ DECODING), or, if they do not come, it prefills here after
all (→ PREFILLING, or → PREEMPTED to be admitted afresh).
"""

from __future__ import annotations

import time

from engine.block_manager import BlockManager
from engine.logprobs import TokenLogprob
from engine.request import FinishReason, Request, RequestState, check_stop
from engine.scheduler_batch import RunningBatch
from engine.scheduler_lifecycle import RequestLifecycle
from engine.scheduler_policies import WaitingQueue

_S = RequestState


class Handoffs:
    def __init__(
        self,
        lifecycle: RequestLifecycle,
        block_manager: BlockManager,
        waiting: WaitingQueue,
        batch: RunningBatch,
        max_num_seqs: int,
        watermark_blocks: int,
    ) -> None:
        self.lifecycle = lifecycle
        self.block_manager = block_manager
        self.waiting = waiting
        self.batch = batch
        self.max_num_seqs = max_num_seqs
        self.watermark_blocks = watermark_blocks
        self.reserved: dict[str, Request] = {}  # decode role: blocks held for KV on its way here
        self.transferring: dict[str, Request] = {}  # prefill role: blocks held until the KV is acknowledged

    def forget(self, request_id: str) -> None:
        """``request_id`` ended (finished or aborted) wherever it was."""
        self.reserved.pop(request_id, None)
        self.transferring.pop(request_id, None)

    def hand_off(self, req: Request) -> None:
        """Prefill role: the first token is sampled; keep the blocks until the decode side has the KV."""
        req.transition(_S.TRANSFERRING)
        self.batch.leave(req)
        self.transferring[req.request_id] = req

    def release_transferred(self, request_id: str) -> Request | None:
        """Prefill role: the decode side acknowledged (or gave up on) the KV; free the blocks.
        They stay in the prefix cache for later hits."""
        req = self.transferring.pop(request_id, None)
        if req is not None:
            self.lifecycle.end(req, FinishReason.LENGTH, _S.FINISHED)
        return req

    def reserve(self, req: Request) -> bool:
        """Decode role: allocate blocks for ``req``'s known tokens, to be filled by a prefill worker.

        Blocks this worker already caches are reused, so only the rest needs to be shipped
        (``req.num_cached_tokens`` says how many tokens). False if the pool cannot hold it now, or
        not beside the waiting requests more important than it: those are admitted first, and a
        reservation taking their blocks would invert the lanes' order (a batch prompt reserved
        while a preempted interactive one waited). Refused, it waits here in priority order.
        """
        if req.request_id in self.lifecycle.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        # (As add_request: else it decodes until it preempts itself for good. It holds its whole prompt.)
        self.lifecycle.check_fits_cache(req, holds_prompt=True)
        if len(self.batch) + len(self.reserved) >= self.max_num_seqs:
            return False  # it could not join the batch when its KV arrives
        bm = self.block_manager
        cached = bm.find_cached_prefix(req, max_tokens=req.num_tokens)
        need = bm._num_new_blocks(req, req.num_tokens - len(cached) * bm.block_size, len(cached))
        ahead = sum(bm.free_blocks_to_admit(r) for r in self.waiting.more_important_than(req.priority))
        if need + ahead > bm.num_free_blocks - self.watermark_blocks and (len(self.batch) or ahead):
            return False
        if not bm.allocate(req, req.num_tokens - len(cached) * bm.block_size, cached):
            return False
        req.num_cached_tokens = len(cached) * bm.block_size
        req.first_scheduled_time = time.monotonic()
        self.lifecycle.register(req)
        req.transition(_S.RESERVED)
        self.reserved[req.request_id] = req
        return True

    def kv_arrived(
        self, request_id: str, first_token: int, first_logprob: TokenLogprob | None = None
    ) -> Request | None:
        """Decode role: the prompt's KV and the first token (with its logprob, if asked for) are
        here; join the decode batch."""
        req = self.reserved.pop(request_id, None)
        if req is None:
            return None
        req.num_computed_tokens = req.num_tokens
        self.block_manager.register_full_blocks(req, req.num_tokens)
        req.transition(_S.DECODING)
        req.first_token_time = time.monotonic()
        req.all_token_ids.append(first_token)
        if first_logprob is not None:
            req.pending_logprobs.append(first_logprob)
        self.batch.join(req)
        reason = check_stop(req, first_token, self.lifecycle.max_model_len)
        if reason is not None:
            self.lifecycle.finish(req, reason)
        return req

    def fallback_to_local_prefill(self, request_id: str) -> Request | None:
        """Decode role: the KV did not come in time; compute the prompt here instead.

        Only the locally cached prefix is trusted; whatever part of the transfer arrived is recomputed.
        """
        req = self.reserved.pop(request_id, None)
        if req is None:
            return None
        if req.num_cached_tokens >= req.num_tokens:
            # The whole (block-aligned) prompt was a local hit, which reserve() may take since the
            # first token comes from the prefill side. Here the last prompt token must be computed
            # for that token's logits, and not into a shared cached block: queue the request afresh,
            # and admission takes the hit short of the last token. (Scheduled with 0 tokens, it
            # stalled alone and broke a batch's logits rows.)
            self.block_manager.free(req)
            req.num_computed_tokens = req.num_cached_tokens = 0
            req.transition(_S.PREEMPTED)
            self.waiting.push(req)
            return req
        req.num_computed_tokens = req.num_cached_tokens
        req.transition(_S.PREFILLING)
        self.batch.join(req)
        return req
