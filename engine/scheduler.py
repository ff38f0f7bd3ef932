"""Token-budget continuous-batching scheduler (pure Python, no torch).

(Over 400 lines as one concept: the step, which decides in one pass what every running and waiting
request gets; admission, the running batch, lifecycles, hand-offs, speculation and lane shares are
components in their own files that it calls.)

A request is "computed tokens chasing total tokens": each step gives it
``min(num_tokens - num_computed_tokens, remaining budget)`` tokens, which is one token for a decode,
a chunk for a prompt (chunked prefill), and the whole known sequence again after preemption.
Prefix-cache hits advance ``num_computed_tokens`` at admission (except for a request that still
needs its prompt's logprobs: a hit would skip positions it must score).

Queues and transitions (``engine.request`` has the full table)::

    add_request ─► waiting (QUEUED) ──admit──► running (PREFILLING) ──first token──► (DECODING)
                        ▲                          │
                        └──── preempt (PREEMPTED) ◄┘ out of blocks: least important, newest first
    running ──stop / length──► FINISHED (blocks freed)      abort ──► ABORTED (blocks freed)

Each step serves running requests first (decodes, then continuing prefill chunks), then admits
waiting requests in priority order while budget, ``max_num_seqs`` and free blocks allow. A step in
which something was preempted admits nothing new. Prompt chunks (continuing and new) also share
``prefill_token_budget`` when one is set; decodes never wait for it.

The scheduler plans the step (this module) and holds its parts, each built with what it needs:

- ``RunningBatch`` (engine/scheduler_batch.py): the running requests and their slots;
- ``RequestLifecycle`` (engine/scheduler_lifecycle.py): requests in, out and preempted (blocks freed once);
- ``Admitter`` (engine/scheduler_admission.py): waiting requests into the batch, shared prefixes in
  flight (a waiting request whose next uncached prompt block a running request has yet to compute is
  passed over until that block is computed);
- ``Handoffs`` (engine/scheduler_disagg.py): the prefill and decode roles' reserved and transferring
  requests;
- ``LaneShares`` (engine/lane_shares.py, off unless ``SchedulerConfig.lane_shares``): sequence slots,
  and the prompt tokens the decodes leave, by lane weight with floors, and preemption of preemptible
  lanes for a more important lane's pace (victims are preempted before the step is planned, so that
  step admits nothing new);
- ``LongRope`` (engine/scheduler_long_rope.py, for a longrope model): which requests are rotated
  with the long factors, and the recompute of one that passes the original length;
- ``Speculation`` (engine/scheduler_spec.py, off unless ``SchedulerConfig.speculative``): a decode
  with drafted tokens is scheduled after the plain decodes, with the other running requests, as one
  chunk of its last token and its drafts; the drafts take no prompt budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.lane_shares import LanePlan, LaneShares
from engine.logprobs import TokenLogprob
from engine.output_error import OutputError
from engine.request import FinishReason, Request, RequestState, check_stop
from engine.scheduler_admission import Admitter
from engine.scheduler_batch import RunningBatch
from engine.scheduler_disagg import Handoffs
from engine.scheduler_lifecycle import RequestLifecycle
from engine.scheduler_long_rope import LongRope
from engine.scheduler_output import NewRequestData, RunnerOutput, SchedulerOutput
from engine.scheduler_policies import AdmissionPolicy, PreemptionPolicy, StaticBatchAdmission, WaitingQueue
from engine.scheduler_spec import Speculation
from engine.scheduler_step import StepPlan, decodes_first
from engine.spec_decode import NgramProposer

_S = RequestState


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        max_model_len: int,
        clock: Callable[[], float] = time.monotonic,
        long_rope_from: int | None = None,
    ) -> None:
        """``clock``: the lane shares' (the simulator passes its own). ``long_rope_from``: a longrope
        model's original length (``ModelConfig.long_rope_from``): engine/scheduler_long_rope.py."""
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.admission: AdmissionPolicy = (
            StaticBatchAdmission(config.static_batch_size) if config.policy == "static" else AdmissionPolicy()
        )
        self.preemption = PreemptionPolicy()
        self.waiting = WaitingQueue()
        self.batch = RunningBatch(config.max_num_seqs)
        self.lifecycle = RequestLifecycle(
            block_manager,
            self.waiting,
            self.batch,
            max_model_len,
            self.admission.hold_finished,
            config.max_num_batched_tokens,
        )
        watermark = int(config.admission_watermark * block_manager.num_blocks)
        self.lane_shares = LaneShares(config.lane_shares, config.max_num_seqs, clock) if config.lane_shares else None
        self.handoffs = Handoffs(
            self.lifecycle, block_manager, self.waiting, self.batch, config.max_num_seqs, watermark
        )
        self.admitter = Admitter(
            block_manager,
            self.waiting,
            self.batch,
            self.admission,
            config.max_num_seqs,
            config.defer_for_shared_prefix,
            watermark,
            lambda: len(self.handoffs.reserved),
            self.lane_shares.resumed if self.lane_shares is not None else None,
        )
        self.long_rope = LongRope(long_rope_from, self.lifecycle) if long_rope_from is not None else None
        self.speculation = (
            Speculation(NgramProposer(config.speculative), block_manager, max_model_len, self.lifecycle.finish)
            if config.speculative is not None
            else None
        )
        # The last step's batch and its ids and slots, reused while the batch stays the same.
        self._last_batch: list[Request] = []
        self._last_ids: list[str] = []
        self._last_slots: list[int] = []
        self.prompt_tokens_computed = 0
        # Asynchronous scheduling (engine/async_step.py) sets this while it plans a step with
        # placeholder tokens: decodes that fill a block go here, entered once their token is known.
        self.deferred_filled: list[Request] | None = None

    # -- requests in and out (the parts do the work) ----------------------------------------
    def add_request(self, req: Request) -> None:
        if self.long_rope is not None:
            self.long_rope.admit(req)
        self.lifecycle.add(req)

    def abort(self, request_id: str) -> Request | None:
        """Stop a request wherever it is (waiting, running, reserved, transferring); its blocks are
        freed now. Returns it, or None if unknown or already ended."""
        self.handoffs.forget(request_id)
        if self.lane_shares is not None:
            self.lane_shares.forget(request_id)
        return self.lifecycle.abort(request_id)

    def finish(self, req: Request, reason: FinishReason) -> None:
        """Finish a request (token stop, or a stop string found by the detokenizer)."""
        if not req.is_finished:
            self.handoffs.forget(req.request_id)
        self.lifecycle.finish(req, reason)

    def reserve(self, req: Request) -> bool:
        if self.long_rope is not None:
            self.long_rope.admit(req)
        return self.handoffs.reserve(req)

    def kv_arrived(
        self, request_id: str, first_token: int, first_logprob: TokenLogprob | None = None
    ) -> Request | None:
        return self.handoffs.kv_arrived(request_id, first_token, first_logprob)

    def fallback_to_local_prefill(self, request_id: str) -> Request | None:
        return self.handoffs.fallback_to_local_prefill(request_id)

    def release_transferred(self, request_id: str) -> Request | None:
        return self.handoffs.release_transferred(request_id)

    # -- what the engine, workers and benchmarks read ---------------------------------------
    @property
    def running(self) -> list[Request]:
        return self.batch.requests

    @property
    def requests(self) -> dict[str, Request]:
        return self.lifecycle.requests

    @property
    def reserved(self) -> dict[str, Request]:
        return self.handoffs.reserved

    @property
    def transferring(self) -> dict[str, Request]:
        return self.handoffs.transferring

    @property
    def num_preemptions(self) -> int:
        return self.lifecycle.num_preemptions

    @property
    def preempted_tokens(self) -> int:
        """Computed tokens preemptions threw away (to be computed again)."""
        return self.lifecycle.preempted_tokens

    @property
    def num_draft_tokens(self) -> int:
        """Drafted tokens computed (speculative decoding)."""
        return self.speculation.num_draft_tokens if self.speculation is not None else 0

    @property
    def num_accepted_tokens(self) -> int:
        """Of those, the ones kept."""
        return self.speculation.num_accepted_tokens if self.speculation is not None else 0

    def has_unfinished(self) -> bool:
        return bool(self.batch.requests) or len(self.waiting) > 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.batch.requests)

    # -- the step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        plan = StepPlan(cfg.max_num_batched_tokens, cfg.prefill_token_budget or cfg.max_num_batched_tokens)
        if self.long_rope is not None:  # requests passing longrope's original length: recomputed, long
            plan.preempted += self.long_rope.cross(self.batch.requests)
        lanes = self._plan_lanes(plan) if self.lane_shares is not None else None
        if plan.budget >= len(self.batch.requests):
            rest = self._schedule_decodes(plan)
        else:  # too little budget for every decode: all in one pass, decodes first, until it runs out
            rest = decodes_first(self.batch.requests)
        if lanes is not None:  # the prompt tokens the decodes leave, by lane
            assert self.lane_shares is not None
            lanes.tokens = self.lane_shares.token_shares(
                lanes,
                min(plan.budget, plan.prefill_budget),
                rest,
                self.waiting.tokens_by_priority(),
                len(self.batch.requests) < self.config.max_num_seqs and not plan.preempted,
            )
        self._schedule_rest(rest, plan, lanes.tokens if lanes is not None else None)
        if not plan.preempted:
            self.admitter.admit(min(plan.budget, plan.prefill_budget), plan, lanes)
        return self._build_output(plan)

    def _plan_lanes(self, plan: StepPlan) -> LanePlan | None:
        """The lanes' shares for this step; their victims for pace are preempted now, before anything
        is scheduled (by recompute: back to the waiting queue, their lane held at its floor)."""
        assert self.lane_shares is not None
        lanes = self.lane_shares.plan(self.batch.requests, self.batch.by_priority, self.waiting.count_by_priority())
        if lanes is None:
            return None
        for victim in lanes.victims:
            self.lifecycle.preempt(victim)
            self.lane_shares.preempted(victim)
            lanes.running[victim.priority] -= 1
            plan.preempted += 1
        return lanes

    def _schedule_decodes(self, plan: StepPlan) -> list[Request]:
        """The hot loop: every decoding request's one token, when the budget has room for all (a
        decode inside its last block costs a few attribute reads). Returns the other running
        requests (prompt chunks, recomputes, static padding rows), in order."""
        bm = self.block_manager
        bs = bm.block_size
        decodes, filled, grew, rest = plan.decodes, plan.filled, plan.grew, []
        schedule = decodes.append
        decoding = _S.DECODING
        running = self.batch.requests
        plenty = bm.num_free_blocks >= len(running)  # no decode here can run the pool dry
        drafting = self.speculation is not None
        window = bm.window  # an all-sliding model's: blocks behind it are released as decodes pass them
        charged = 0  # decodes already taken off plan.budget (the others are, after the loop)
        # A copy: a preemption below removes from ``running``. Its victims, PREEMPTED or (padding
        # rows) FINISHED now, go to ``rest``, which passes over them.
        for req in list(running):
            computed = req.num_computed_tokens + 1  # what it becomes once its one token is scheduled
            if len(req.all_token_ids) != computed or req.state is not decoding or (drafting and req.spec_token_ids):
                rest.append(req)
                continue
            if window is not None and computed - window >= (req.num_window_freed + 1) * bs:
                bm.free_passed_blocks(req, computed - 1)
            if computed >= len(req.block_ids) * bs:  # needs a block, or fills its last one
                if computed > len(req.block_ids) * bs:
                    if plenty:
                        grew[req] = len(req.block_ids)
                        bm.append_block(req)
                    else:
                        plan.budget -= len(decodes) - charged  # (a preemption gives back budget)
                        room = self._make_room(req, 1, plan)
                        charged = len(decodes)
                        if not room:
                            continue
                if computed == len(req.block_ids) * bs:
                    filled.append(req)  # entered in the prefix cache once the step is settled
            # Advanced now, optimistically (the step computes it); undone if it is preempted below.
            req.num_computed_tokens = computed
            schedule(req)
        plan.budget -= len(decodes) - charged
        return rest

    def _schedule_rest(self, reqs: list[Request], plan: StepPlan, lane_tokens: dict[int, int] | None = None) -> None:
        """Prompt chunks (continuing, or recomputing after a preemption), static padding rows, decodes
        with drafted tokens, and decodes when the budget is short, in order until the budget runs out.
        ``lane_tokens``: the prompt tokens each lane may still compute this step (engine/lane_shares.py)."""
        for req in reqs:
            if plan.preempted and req.slot < 0:  # a victim earlier in this step (it left the batch)
                continue
            if not plan.budget:
                break
            computed = req.num_computed_tokens
            n = 1 if req.is_padding else len(req.all_token_ids) - computed
            if n <= 0:  # (asynchronous scheduling: the token still to come from the step in flight is its last)
                continue
            chunk = n > 1  # a prompt chunk (or a preempted request's recompute), not a decode
            drafts = req.spec_token_ids  # (a decode's: computed like a chunk, but not prompt work)
            n += len(drafts)
            if chunk and n > plan.prefill_budget:
                if not plan.prefill_budget:
                    continue
                n = plan.prefill_budget
            if chunk and lane_tokens is not None and n > lane_tokens.get(req.priority, n):
                if not lane_tokens[req.priority]:
                    continue  # its lane's share of this step is spent
                n = lane_tokens[req.priority]
            if n > plan.budget:
                n = plan.budget
                if drafts:
                    req.spec_token_ids = drafts[: n - 1]
            self.block_manager.free_passed_blocks(req, computed)  # (before its window: read no more)
            if computed + n > len(req.block_ids) * self.block_manager.block_size and not self._make_room(req, n, plan):
                continue
            plan.chunks.append(req)
            plan.chunk_counts.append(n)
            plan.budget -= n
            if chunk:
                plan.prefill_budget -= n
                if lane_tokens is not None and req.priority in lane_tokens:
                    lane_tokens[req.priority] -= n

    def _make_room(self, req: Request, n: int, plan: StepPlan) -> bool:
        """Blocks for ``req``'s ``n`` more tokens, preempting running requests (least important,
        newest first) until the pool has them. False if ``req`` itself was preempted."""
        have = len(req.block_ids)
        while not self.block_manager.allocate(req, n):
            victim = self.preemption.pick_victim(self.batch.requests)
            plan.unschedule(victim)
            if victim.is_padding:  # a static batch's finished row: its blocks go, nothing to redo
                self.lifecycle.release_padding(victim)
            else:
                self.lifecycle.preempt(victim)
            plan.preempted += 1
            if victim is req:
                return False
        plan.grew[req] = have
        return True

    def _build_output(self, plan: StepPlan) -> SchedulerOutput:
        new_data = []
        unseen = self.batch.unseen
        if unseen:  # rows the runner gets in full (their tokens before this step's)
            for reqs, advanced in ((plan.decodes, 1), (plan.chunks, 0)):
                for req in reqs:
                    rid = req.request_id
                    if rid in unseen:
                        unseen.discard(rid)
                        plan.grew.pop(req, None)  # a new row gets all its blocks
                        new_data.append(
                            NewRequestData(
                                rid,
                                req.slot,
                                list(req.all_token_ids),
                                list(req.block_ids),
                                req.num_computed_tokens - advanced,
                                req.num_prompt_tokens,
                                req.sampling_params,
                                req.long_rope,
                            )
                        )
        new_blocks = {req.slot: req.block_ids[before:] for req, before in plan.grew.items()}
        bm = self.block_manager
        bs = bm.block_size
        register = bm.register_full_blocks if bm.enable_prefix_caching else None
        for req, n in zip(plan.chunks, plan.chunk_counts):  # (the decodes advanced as they were scheduled)
            if req.num_computed_tokens < req.num_prompt_tokens:  # prefill work (for the router's rate)
                self.prompt_tokens_computed += min(n, req.num_prompt_tokens - req.num_computed_tokens)
            # Advance optimistically: the step in flight computes these tokens.
            end = req.num_computed_tokens = req.num_computed_tokens + n
            if register is not None and end // bs > req.num_registered_blocks:
                register(req, end)
        if register is not None and plan.filled:
            if self.deferred_filled is None:
                bm.register_filled_blocks(plan.filled)
            else:
                self.deferred_filled += plan.filled
        scheduled = plan.decodes + plan.chunks if plan.chunks else plan.decodes
        if scheduled != self._last_batch:
            # (Otherwise the same requests as the last step, in the same order, so the same ids and
            # rows: they kept their slots, since one that left and came back would have missed a
            # step. The lists are shared between the two outputs, and nothing changes them.)
            self._last_batch = scheduled
            self._last_ids = [r.request_id for r in scheduled]
            self._last_slots = [r.slot for r in scheduled]
        left = self.batch.take_left()
        drafts = {r.slot: r.spec_token_ids for r in plan.chunks if r.spec_token_ids} if self.speculation else {}
        return SchedulerOutput(
            new_requests=new_data,
            new_block_ids=new_blocks,
            request_ids=self._last_ids,
            slots=self._last_slots,
            counts=[1] * len(plan.decodes) + plan.chunk_counts,
            total_num_scheduled_tokens=len(plan.decodes) + sum(plan.chunk_counts),
            finished_request_ids=left,
            num_preempted=plan.preempted,
            spec_token_ids=drafts,
        )

    # -- after the step ---------------------------------------------------------------------
    def update_from_output(self, out: RunnerOutput) -> list[Request]:
        """Append sampled tokens, apply token-level stops; return requests that got a token."""
        updated: list[Request] = []
        slot_req = self.batch.slot_req
        max_len = self.max_model_len
        lifecycle, speculation = self.lifecycle, self.speculation
        if out.prompt_logprobs:
            self._add_prompt_logprobs(out.prompt_logprobs)
        accepted = out.accepted_draft_ids
        if out.logprobs is not None:  # first: a request the loop below finishes leaves its slot
            for slot, lp in zip(out.slots, out.logprobs):
                req = slot_req[slot]
                # (A row with drafts gets its tokens' logprobs with them, in ``_take_verified``.)
                if lp is not None and req is not None and not req.is_padding and not req.spec_token_ids:
                    req.pending_logprobs.append(lp)
        for slot, tok in zip(out.slots, out.sampled_token_ids):
            req = slot_req[slot]
            if req is None:
                continue  # left the batch while the step ran
            if req.is_padding:  # its token is discarded; the row only occupies the batch
                if req.num_computed_tokens + 1 >= max_len:
                    lifecycle.release_padding(req)
                continue
            if out.errors is not None and slot in out.errors:  # its grammar failed: no token, an ERROR end
                self._fail(req, out.errors[slot])
                updated.append(req)
                continue
            if accepted is not None and req.spec_token_ids and speculation is not None:  # (None: no drafts this step)
                speculation.take_verified(req, accepted.get(slot, []), tok, (out.verified_logprobs or {}).get(slot))
                updated.append(req)
                continue
            req.all_token_ids.append(tok)
            if req.state is _S.PREFILLING:
                if req.first_token_time is None:  # not again after a preemption's recompute
                    req.first_token_time = time.monotonic()
                if req.prefill_only:  # prefill role: hold the blocks until the KV is acknowledged
                    self.handoffs.hand_off(req)
                    updated.append(req)
                    continue
                req.transition(_S.DECODING)
            reason = check_stop(req, tok, max_len)
            if reason is not None:
                lifecycle.finish(req, reason)
            updated.append(req)
        running = self.batch.requests
        if self.admission.hold_finished and running and all(r.is_padding for r in running):
            for r in list(running):
                lifecycle.release_padding(r)
        if speculation is not None:
            speculation.draft(updated)
        return updated

    def _fail(self, req: Request, error: OutputError) -> None:
        """End a running request with ERROR (``error`` says why) after a step that computed it: its
        KV is sound, so its blocks are freed as any finished request's."""
        req.error = error
        req.spec_token_ids = []
        req.pending_logprobs = []  # (this step's, for the token dropped)
        self.handoffs.forget(req.request_id)
        self.lifecycle.end(req, FinishReason.ERROR, _S.ABORTED)

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
            req = self.lifecycle.requests.get(rid)
            if req is None:
                continue
            req.num_computed_tokens -= n
            req.spec_token_ids = []
            if req.num_computed_tokens < req.num_prompt_tokens:  # (counted as scheduled, for the router's rate)
                self.prompt_tokens_computed -= min(n, req.num_prompt_tokens - req.num_computed_tokens)
            bm.unregister_unwritten(req, req.num_computed_tokens)
            if req.is_padding:
                self.lifecycle.release_padding(req)
            elif not req.is_finished:
                self.handoffs.forget(rid)
                self.lifecycle.end(req, FinishReason.ERROR, _S.ABORTED)
                failed.append(req)
        return failed

    def _add_prompt_logprobs(self, computed: dict[int, tuple[int, list[TokenLogprob]]]) -> None:
        """Chunks' prompt logprobs (first token index, values) in order; a chunk recomputed after a
        preemption adds only what is still missing."""
        for slot, (first, values) in computed.items():
            req = self.batch.slot_req[slot]
            if req is None or req.prompt_logprobs is None:
                continue
            have = len(req.prompt_logprobs) + 1  # the index of the next prompt token wanted
            if first <= have < first + len(values):
                req.prompt_logprobs.extend(values[have - first :])
