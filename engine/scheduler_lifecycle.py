"""The scheduler's request lifecycle: requests in (add), out (finish, abort, a failed step) and
pushed back (preempt), with the running batch's slots (pure Python, no torch).

``Scheduler`` mixes this in. Every way out of ``running`` goes through ``_leave_running`` (the slot is
freed and the runner told the row left) and every end through ``_drop`` (blocks freed, the request
forgotten), so a request's blocks are freed exactly once whichever way it ends. A static batch's
finished row (``is_padding``) stays in ``running`` until its batch ends, and ``_release_padding``
drops it then.
"""

from __future__ import annotations

from engine.errors import InvalidParameterError
from engine.request import FinishReason, Request, RequestState
from engine.scheduler_output import SchedulerOutput

_S = RequestState


class LifecycleMixin:
    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.num_prompt_tokens == 0:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        self._check_fits_cache(req)
        self._register(req)
        self.waiting.push(req)

    def _check_fits_cache(self, req: Request) -> None:
        """A request whose whole sequence needs more blocks than the pool has could never finish: it
        would preempt itself for ever. Refused up front (as ``max_tokens``: the part a client sets)."""
        bm = self.block_manager
        need = bm.blocks_needed(min(req.max_total_tokens, self.max_model_len))
        if need > bm.num_blocks:
            raise InvalidParameterError(
                "max_tokens", f"request {req.request_id!r} needs {need} KV blocks but the cache has only {bm.num_blocks}"
            )

    def _register(self, req: Request) -> None:
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
        self._finish(req, FinishReason.ABORT, _S.ABORTED)
        return req

    def step_failed(self, so: SchedulerOutput) -> list[Request]:
        """The step ``so`` describes raised: end its requests (ERROR) and return them.

        Their tokens were advanced, and their newly full blocks entered in the prefix cache, as the
        step was scheduled; the KV it was to write is missing or partial. So those cache entries are
        withdrawn before the blocks are freed, and the requests end rather than retry, since a step
        that failed once (out of memory, a bad kernel) would likely fail again. Requests outside the
        step are untouched."""
        failed = []
        bm = self.block_manager
        for rid, n in zip(so.request_ids, so.counts):
            req = self.requests.get(rid)
            if req is None:
                continue
            req.num_computed_tokens -= n
            req.spec_token_ids = []
            if req.num_computed_tokens < req.num_prompt_tokens:  # (counted as scheduled, for the router's rate)
                self.prompt_tokens_computed -= min(n, req.num_prompt_tokens - req.num_computed_tokens)
            bm.unregister_unwritten(req, req.num_computed_tokens)
            if req.is_padding:
                self._release_padding(req)
            elif not req.is_finished:
                self._finish(req, FinishReason.ERROR, _S.ABORTED)
                failed.append(req)
        return failed

    def _join_running(self, req: Request) -> None:
        req.slot = self._free_slots.pop()
        self._slot_req[req.slot] = req
        self.running.append(req)
        self._runner_unseen.add(req.request_id)

    def _leave_running(self, req: Request) -> None:
        self.running.remove(req)
        self._runner_unseen.discard(req.request_id)
        self._left_batch.add(req.request_id)
        self._slot_req[req.slot] = None
        self._free_slots.append(req.slot)
        req.slot = -1

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Finish a running request (token stop, or a stop string found by the detokenizer)."""
        if req.is_finished:
            return
        self._finish(req, reason, _S.FINISHED)

    def _finish(self, req: Request, reason: FinishReason, state: RequestState) -> None:
        req.finish_reason = reason
        was_running = req.state in (_S.PREFILLING, _S.DECODING)
        self.reserved.pop(req.request_id, None)
        self.transferring.pop(req.request_id, None)
        req.transition(state)
        if (
            was_running
            and self.admission.hold_finished
            and state is _S.FINISHED
            and req.num_computed_tokens + 1 < self.max_model_len
        ):
            req.is_padding = True  # static baseline: the row keeps computing until the batch ends
            return
        self._drop(req, was_running)

    def _release_padding(self, req: Request) -> None:
        req.is_padding = False
        self._drop(req, was_running=True)

    def _drop(self, req: Request, was_running: bool) -> None:
        if was_running:
            self._leave_running(req)
        self.block_manager.free(req)
        del self.requests[req.request_id]

    def _preempt(self, req: Request) -> None:
        req.spec_token_ids = []
        self._leave_running(req)
        self.block_manager.free(req)
        self.preempted_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.transition(_S.PREEMPTED)
        self.waiting.push(req)
        self.num_preemptions += 1
