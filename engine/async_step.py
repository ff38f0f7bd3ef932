"""Asynchronous scheduling: the host schedules step n+1 while step n runs (``EngineConfig.async_scheduling``).

One step is in flight at most. ``runner.execute`` runs on a dedicated device thread (torch releases
the GIL inside its ops; on CUDA the thread launches the kernels and waits for the sampled ids), and
meanwhile the engine's thread plans the next step assuming that every decoding row of step n yields
one token: a *placeholder* is appended to each such request's tokens, so that the scheduler, which
counts tokens, gives the row its next decode. Then step n is collected (its ids copied once), the
placeholders are taken back out, step n+1 is launched, and step n's tokens are applied
(``update_from_output``, stop strings) while step n+1 runs. So step n+1's scheduling and step n's
output processing are both off the device's critical path; what stays between two steps is the
copy of the ids and the runner's inputs of the next step.

A request that ends at step n (a stop token, a stop string, an abort) is still computed by step n+1:
that row's token is discarded (never appended, never counted) and its blocks were freed as today
(the stray KV write lands before any later step reuses them: steps run in order on one thread and
one stream). A request whose step-n token is its last by length gets no placeholder, so step n+1
does not compute it at all.

The next step is planned with placeholders only when step n's tokens cannot change it: every
running request was a plain decode of step n and none needs its history on the host (penalties, a
logit bias, ``min_tokens``: ``SamplingParams.processes_logits``) or a grammar, no preemption can
happen (enough free blocks and budget for every decode), and the engine has no speculation, lane
shares, static batching, longrope or tensor-parallel ranks. Otherwise the next step is scheduled
after step n's update, as without this (``num_sync`` counts those steps).

The placeholder bookkeeping is plain ints on the requests' token lists (the scheduler stays pure
Python); a decode whose placeholder fills a block has its block entered in the prefix cache once
the real token replaced it (``Scheduler.deferred_filled``).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from engine.device import ThreadDevice
from engine.request import Request, RequestState
from engine.runner import ModelRunner
from engine.scheduler import Scheduler
from engine.scheduler_output import RunnerOutput, SchedulerOutput

# A token id no model has: it stands for step n's token until the ids are on the host.
PLACEHOLDER = -1

_DECODING = RequestState.DECODING


@dataclass(slots=True)
class _InFlight:
    so: SchedulerOutput
    reqs: list[Request]  # so's requests, in its order (a row's token counts only while it is theirs)
    result: Future[RunnerOutput]


class AsyncSteps:
    """Runs steps on a device thread, one in flight, and plans the next one while it runs."""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, device: ThreadDevice) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.device = device
        self._executor: ThreadPoolExecutor | None = None  # made at the first step
        self._inflight: _InFlight | None = None
        self._placeholders: list[Request] = []  # requests holding one now (between planning and collecting)
        self._next: tuple[SchedulerOutput, list[Request]] | None = None  # planned, not launched yet
        self._filled: list[Request] = []  # decodes of the planned step whose placeholder fills a block
        self._failed: list[SchedulerOutput] = []  # after a step raised (``take_failed``)
        # Steps scheduled while the one before ran / after it was collected (the first, fallbacks).
        self.num_overlapped = 0
        self.num_sync = 0
        # Rows computed for a request that had ended by then (their tokens discarded).
        self.num_discarded = 0
        # Scheduler-wide reasons that keep every step synchronous (checked once).
        sc = scheduler
        self._never = bool(
            sc.speculation is not None
            or sc.lane_shares is not None
            or sc.admission.hold_finished
            or sc.long_rope is not None
            or runner.plan_sink is not None
        )

    @property
    def busy(self) -> bool:
        """A step is in flight (its outputs are still to come)."""
        return self._inflight is not None

    # -- one engine step --------------------------------------------------------------------
    def step(self) -> tuple[SchedulerOutput, RunnerOutput]:
        """Launch a step if none is in flight, plan the next while it runs, collect it, launch the
        planned one; returns the collected step and its output (rows of ended requests left out),
        for the engine to apply. After it, ``register_deferred`` (once the output is applied)."""
        if self._inflight is None:
            so = self.scheduler.schedule()
            self.num_sync += 1
            self._launch(so, self._requests_of(so))
        assert self._inflight is not None
        current = self._inflight
        try:
            self._next = self._plan_next(current)
            ran = current.result.result()
        except BaseException:
            current.result.exception()  # (a failed plan: the step in flight ends before anything else runs)
            self._inflight = None
            self._take_placeholders()
            planned, self._next, self._filled = self._next, None, []
            self._failed = [current.so] + ([planned[0]] if planned is not None else [])
            raise
        self._inflight = None
        self._take_placeholders()
        planned, self._next = self._next, None
        if planned is not None:
            self._launch(*planned)
            self.num_overlapped += 1
        return current.so, self._drop_ended(current, ran)

    def take_failed(self) -> list[SchedulerOutput]:
        """After ``step`` raised: the failed step, then the one planned beside it (never launched;
        its requests end with the failed step's). Taken once."""
        failed, self._failed = self._failed, []
        return failed

    def register_deferred(self) -> None:
        """The launched step's decodes that fill a block, into the prefix cache now that their last
        token is known (a request that ended meanwhile has freed its blocks: skipped)."""
        if self._filled:
            live = [r for r in self._filled if not r.is_finished]
            self._filled = []
            if live:
                self.scheduler.block_manager.register_filled_blocks(live)

    def wait_device(self) -> None:
        """Block until the step in flight has run (its output stays to be collected): the KV cache
        is then safe to read or write from this thread."""
        if self._inflight is not None:
            self._inflight.result.exception()  # (waits; an error is raised when it is collected)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # -- the parts ----------------------------------------------------------------------------
    def _launch(self, so: SchedulerOutput, reqs: list[Request]) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="engine-device")
        if so.is_empty or any(r.sampling_params.structured is not None for r in reqs):
            # Nothing to overlap, or grammar matchers, which other calls between steps use too: here.
            result: Future[RunnerOutput] = Future()
            try:
                result.set_result(self.runner.execute(so))
            except BaseException as e:  # noqa: BLE001 - raised where the step is collected
                result.set_exception(e)
        else:
            started = threading.Event()
            result = self._executor.submit(self._execute, so, started)
            # Handing the device thread the GIL now: it keeps it while it builds the inputs and
            # launches the step (until a wait in torch), where this thread would otherwise run on
            # and only let it start at its own next wait.
            started.wait()
        self._inflight = _InFlight(so, reqs, result)

    def _execute(self, so: SchedulerOutput, started: threading.Event) -> RunnerOutput:
        started.set()
        self.device.enter()  # (the device thread's first step binds its GPU)
        return self.runner.execute(so)

    def _requests_of(self, so: SchedulerOutput) -> list[Request]:
        slot_req = self.scheduler.batch.slot_req
        out = [slot_req[slot] for slot in so.slots]
        assert None not in out  # (a scheduled row's request holds its slot)
        return out  # type: ignore[return-value]

    def _plan_next(self, current: _InFlight) -> tuple[SchedulerOutput, list[Request]] | None:
        """The next step, scheduled now with placeholders, or None where step n's tokens must be
        applied first (see the module's docstring)."""
        if self._never or current.so.is_empty or current.so.total_num_scheduled_tokens != len(current.reqs):
            return None
        sc = self.scheduler
        running = sc.running
        n = len(running)
        if sc.config.max_num_batched_tokens < n or sc.block_manager.num_free_blocks < n:
            return None  # a decode could wait or preempt
        in_step = {id(r) for r in current.reqs}
        max_len = sc.max_model_len
        last: list[Request] = []
        for r in running:
            sp = r.sampling_params
            if (
                id(r) not in in_step
                or r.state is not _DECODING
                or sp.structured is not None
                or sp.processes_logits
                or r.spec_token_ids
            ):
                return None
            size = len(r.all_token_ids)
            if size != r.num_computed_tokens:  # (a row of step n that is not its one decode)
                return None
            if size + 1 - r.num_prompt_tokens >= sp.max_tokens or size + 1 >= max_len:
                last.append(r)  # step n's token is its last: no placeholder, not in the next step
        ending = {id(r) for r in last}
        for r in running:
            if id(r) not in ending:
                r.all_token_ids.append(PLACEHOLDER)
                self._placeholders.append(r)
        sc.deferred_filled = self._filled
        try:
            so = sc.schedule()
        finally:
            sc.deferred_filled = None
        # (With a block free for each decode and admissions that never preempt, nothing can be.)
        assert not so.num_preempted, "an asynchronously planned step preempted a request"
        return so, self._requests_of(so)

    def _take_placeholders(self) -> None:
        """Step n's ids are on the host: the placeholders leave (``update_from_output`` appends the
        real tokens in their place)."""
        for r in self._placeholders:
            assert r.all_token_ids[-1] == PLACEHOLDER
            r.all_token_ids.pop()
        self._placeholders = []

    def _drop_ended(self, step: _InFlight, ran: RunnerOutput) -> RunnerOutput:
        """``ran`` without the rows of requests that ended (or whose slot another request took)
        after the step was scheduled: their tokens are discarded."""
        slot_req = self.scheduler.batch.slot_req
        # (A request that ended left the batch; a static batch's padding rows stay, and count.)
        stale = {slot for slot, r in zip(step.so.slots, step.reqs) if slot_req[slot] is not r}
        if not stale:
            return ran
        keep = [i for i, slot in enumerate(ran.slots) if slot not in stale]
        self.num_discarded += len(ran.slots) - len(keep)
        changes: dict[str, object] = {
            "slots": [ran.slots[i] for i in keep],
            "sampled_token_ids": [ran.sampled_token_ids[i] for i in keep],
        }
        if ran.logprobs is not None:
            changes["logprobs"] = [ran.logprobs[i] for i in keep]
        for name in ("prompt_logprobs", "accepted_draft_ids", "verified_logprobs", "errors"):
            by_slot = getattr(ran, name, None)
            if by_slot:
                changes[name] = {s: v for s, v in by_slot.items() if s not in stale}
        return dataclasses.replace(ran, **changes)  # type: ignore[arg-type]
