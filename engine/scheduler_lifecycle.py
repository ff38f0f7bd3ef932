"""The scheduler's request lifecycle: requests in (add), out (finish, abort) and pushed back
(preempt), with the request table (pure Python, no torch).

Transitions it makes: (new) → QUEUED on ``add``; PREFILLING/DECODING → FINISHED on ``finish``;
any live state → ABORTED on ``abort`` (or ``end`` with ERROR, for a failed step); PREFILLING/DECODING
→ PREEMPTED (back in the waiting queue) on ``preempt``.

Every way out of the running batch goes through ``RunningBatch.leave`` (the slot freed, the runner
told the row left) and every end through ``_drop`` (blocks freed, the request forgotten), so a
request's blocks are freed exactly once whichever way it ends. A static batch's finished row
(``is_padding``) stays in the batch until its batch ends, and ``release_padding`` drops it then.
"""

from __future__ import annotations

import time

from engine.block_manager import BlockManager
from engine.errors import InvalidParameterError
from engine.request import FinishReason, Request, RequestState
from engine.scheduler_batch import RunningBatch
from engine.scheduler_policies import WaitingQueue

_S = RequestState


class RequestLifecycle:
    def __init__(
        self,
        block_manager: BlockManager,
        waiting: WaitingQueue,
        batch: RunningBatch,
        max_model_len: int,
        hold_finished: bool,
        chunk_tokens: int | None = None,
    ) -> None:
        """``chunk_tokens``: the most tokens one step computes for a request (a windowed model's
        sequences hold that chunk and the window before it, ``BlockManager.blocks_to_finish``)."""
        self.block_manager = block_manager
        self.chunk_tokens = chunk_tokens
        self.waiting = waiting
        self.batch = batch
        self.max_model_len = max_model_len
        self.hold_finished = hold_finished  # static batching: finished rows stay in the batch as padding
        self.requests: dict[str, Request] = {}
        self._arrivals = 0
        self.num_preemptions = 0
        self.preempted_tokens = 0  # computed tokens preemptions threw away (to be computed again)

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.num_prompt_tokens == 0:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        self.check_fits_cache(req)
        self.register(req)
        self.waiting.push(req)

    def check_fits_cache(self, req: Request, holds_prompt: bool | None = None) -> None:
        """A request whose whole sequence needs more blocks than the pool has could never finish: it
        would preempt itself for ever. Refused up front (as ``max_tokens``: the part a client sets;
        a prefill-role prompt, which keeps every block until shipped, as ``prompt``). ``holds_prompt``:
        it holds its whole prompt at once (a decode worker's reservation); by default only a
        prefill-role request does (``BlockManager.blocks_to_finish``)."""
        bm = self.block_manager
        held = req.prefill_only if holds_prompt is None else holds_prompt
        need = bm.blocks_to_finish(
            req.num_prompt_tokens, min(req.max_total_tokens, self.max_model_len), self.chunk_tokens, holds_prompt=held
        )
        if need <= bm.num_blocks:
            return
        if req.prefill_only and bm.blocks_needed(req.num_prompt_tokens) > bm.num_blocks:
            raise InvalidParameterError(
                "prompt",
                f"prompt of {req.num_prompt_tokens} tokens needs {bm.blocks_needed(req.num_prompt_tokens)} KV "
                f"blocks on the prefill worker, whose cache has only {bm.num_blocks} of {bm.block_size} tokens "
                "(it keeps every block of a prompt until the decode side has it)",
            )
        raise InvalidParameterError(
            "max_tokens", f"request {req.request_id!r} needs {need} KV blocks but the cache has only {bm.num_blocks}"
        )

    def register(self, req: Request) -> None:
        req.arrival_seq = self._arrivals
        self._arrivals += 1
        self.requests[req.request_id] = req

    def abort(self, request_id: str) -> Request | None:
        """Stop a request wherever it is; its blocks are freed now. Returns it, or None if unknown or
        already ended."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req.is_finished:  # a static-batching padding row: already ended; it leaves with its batch
            return None
        if req.state in (_S.QUEUED, _S.PREEMPTED):
            self.waiting.remove(req)
        self.end(req, FinishReason.ABORT, _S.ABORTED)
        return req

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Finish a running request (token stop, or a stop string found by the detokenizer)."""
        if req.is_finished:
            return
        self.end(req, reason, _S.FINISHED)

    def end(self, req: Request, reason: FinishReason, state: RequestState) -> None:
        """End ``req`` in ``state`` (FINISHED or ABORTED) with ``reason``."""
        req.finish_reason = reason
        was_running = req.state in (_S.PREFILLING, _S.DECODING)
        req.transition(state)
        if (
            was_running
            and self.hold_finished
            and state is _S.FINISHED
            and req.num_computed_tokens + 1 < self.max_model_len
        ):
            req.is_padding = True  # static baseline: the row keeps computing until the batch ends
            return
        self._drop(req, was_running)

    def release_padding(self, req: Request) -> None:
        req.is_padding = False
        self._drop(req, was_running=True)

    def _drop(self, req: Request, was_running: bool) -> None:
        if was_running:
            self.batch.leave(req)
        self.block_manager.free(req)
        del self.requests[req.request_id]

    def preempt(self, req: Request) -> None:
        req.spec_token_ids = []
        self.batch.leave(req)
        self.block_manager.free(req)
        self.preempted_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.preempted_at = time.monotonic()  # (its time out: engine/scheduler_admission.py, when it rejoins)
        req.transition(_S.PREEMPTED)
        self.waiting.push(req)
        self.num_preemptions += 1
