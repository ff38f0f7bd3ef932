"""The offline engine: ``add_request / abort / step() -> outputs`` and ``generate``.

(Over 400 lines as one concept: the engine's public API, each call a few lines handing over to
the parts that do the work: scheduler, runner, output processor, asynchronous steps, ranks.)

The step loop is three lines: schedule → run → update. Requests move between states only in the
scheduler (``engine.scheduler``) and the output processor (stop strings).
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable, Sequence

import torch

from engine.async_step import AsyncSteps
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.device import ThreadDevice
from engine.errors import ContextLengthError, InvalidParameterError
from engine.host_memory import keep_freed_memory
from engine.kv_events import KVCacheEvent
from engine.logprobs import TokenLogprob
from engine.model.tokenizer import Tokenizer
from engine.model_loader import LoadedModel, load_model
from engine.output_processor import OutputProcessor
from engine.outputs import RequestOutput
from engine.parallel.group_kv import export_kv, import_kv
from engine.parallel.launcher import RankStarter, start_ranks
from engine.request import FinishReason, Request
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput
from engine.structured.grammar_rows import grammar_rows
from engine.structured.grammar_waits import GrammarWaits

log = logging.getLogger(__name__)

_COMPILE_POLL_S = 0.01  # an engine with only requests waiting for their grammars waits this long a step


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        *,
        progress: Callable[[str], None] | None = None,
        record_kv_events: bool = False,
        ranks: RankStarter | None = None,
    ) -> None:
        """``ranks``: how the other tensor-parallel ranks start; they load their shards beside this one."""
        self.config = config
        self.async_steps: AsyncSteps | None = None  # (set below; close() may run before)
        self.ranks = start_ranks(config, ranks)
        try:
            loaded: LoadedModel = load_model(
                config, progress=progress, group=self.ranks.group if self.ranks is not None else None
            )
        except BaseException:
            self.close()
            raise
        self.model_config = loaded.model_config
        self.model_dir = loaded.model_dir
        self.tokenizer = loaded.tokenizer
        self.max_model_len = loaded.max_model_len
        self.device = loaded.device
        self._thread_device = ThreadDevice(self.device)  # steps may run on another thread (engine_loop.py)
        if self.device.type == "cpu":
            keep_freed_memory()  # large steps reuse their activations' pages (engine/host_memory.py)
        self.kv_segment = loaded.kv_segment  # the shared-memory segment of the KV cache, if any
        self.block_manager = BlockManager(
            loaded.num_blocks,
            config.cache.block_size,
            enable_prefix_caching=config.cache.enable_prefix_caching,
            record_events=record_kv_events,
            window=loaded.model.cfg.family.freeing_window,  # (Mistral: blocks behind the window go back)
        )
        self.scheduler = Scheduler(
            config.scheduler, self.block_manager, self.max_model_len, long_rope_from=loaded.model.rope.long_from
        )
        self.eos_token_ids = _stop_ids(self.tokenizer, self.model_config.eos_token_ids)
        self.runner = ModelRunner(
            loaded.model,
            loaded.kv_cache,
            loaded.attention,
            max_num_seqs=config.scheduler.max_num_seqs,
            max_model_len=self.max_model_len,
            block_size=config.cache.block_size,
            seed=config.seed,
            eos_token_ids=self.eos_token_ids,
            plan_sink=self.ranks.broadcast_plan if self.ranks is not None else None,
            grammars=grammar_rows(self.tokenizer, self.model_config.vocab_size),
        )
        if self.ranks is not None:
            self.ranks.start_steps(self.eos_token_ids)
        # (Not yet for a TP group: its ranks would have to capture the same graphs, collectives inside.)
        if (
            config.cuda_graphs
            and self.device.type == "cuda"
            and loaded.attention.name == "triton"
            and self.ranks is None
        ):
            self._capture_graphs(progress)
        self.output_processor = OutputProcessor(self.scheduler, self.tokenizer)
        # Steps on a device thread, the next one scheduled while one runs (engine/async_step.py).
        self.async_steps = (
            AsyncSteps(self.scheduler, self.runner, self._thread_device) if config.async_scheduling else None
        )
        self._ids = itertools.count()
        self.num_steps = 0
        # What the latest step computed (the prefill role ships it).
        self.last_scheduler_output: SchedulerOutput | None = None
        self._failed_outputs: list[RequestOutput] = []  # ends of a failed step's requests, for the next step
        self.grammar_waits = GrammarWaits()  # requests whose grammar is still compiling (not scheduled yet)

    def _capture_graphs(self, progress: Callable[[str], None] | None) -> None:
        try:
            graphs = self.runner.capture_decode_graphs()
        except Exception as e:  # noqa: BLE001 - torch's and Triton's own errors (compile, resources) alike: slower, not broken
            self.runner.graphs = None
            log.warning(
                "CUDA graph capture failed, decode steps run eagerly: %s: %s",
                type(e).__name__,
                (str(e).splitlines() or [""])[0],
            )
            return
        if progress is not None:
            progress(
                f"CUDA graphs: decode batch sizes {graphs.sizes[0]} to {graphs.sizes[-1]} "
                f"({len(graphs.sizes)} graphs) captured in {graphs.capture_seconds:.1f} s"
            )

    # -- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str | None,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        resume_token_ids: Sequence[int] | None = None,
        resume_text_chars: int = 0,
        prefill_only: bool = False,
        preemptible: bool = True,
    ) -> str:
        """Queue a request (text is tokenized as is; use ``tokenizer.encode_chat`` for chat).

        ``resume_token_ids``: tokens this request already generated elsewhere (migration); they are
        recomputed, not re-emitted, and ``resume_text_chars`` of their text were delivered there (the
        rest, held back there, comes with the next output). ``prefill_only``: the prefill role; the
        request stops after its first token and holds its blocks until ``release_transferred``.
        """
        req = self._new_request(
            request_id, prompt, params, priority, cache_salt, arrival_time, resume_token_ids, prefill_only, preemptible
        )
        if not self._held_for_grammar(req):
            self.scheduler.add_request(req)
        if not prefill_only:
            self._add_output_stream(req, resume_text_chars)
        return req.request_id

    def _add_output_stream(self, req: Request, resume_text_chars: int = 0) -> None:
        """The request's detokenizer; one that fails takes the queued request back out (it ran to its
        end unseen, reporting nothing, and its caller never learnt its id)."""
        try:
            self.output_processor.add(req, resume_text_chars)
        except BaseException:
            self.scheduler.abort(req.request_id) or self.grammar_waits.drop(req.request_id)
            raise

    def _new_request(
        self,
        request_id: str | None,
        prompt: str | Sequence[int],
        params: SamplingParams | None,
        priority: int,
        cache_salt: str | None,
        arrival_time: float | None,
        resume_token_ids: Sequence[int] | None = None,
        prefill_only: bool = False,
        preemptible: bool = True,
    ) -> Request:
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if self.tokenizer is None:  # the error type the missing tokenizer's lookup raised before
                raise AttributeError("this model has no tokenizer: pass the prompt as token ids")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = _token_ids(prompt, "prompt")
        resume = _token_ids(resume_token_ids or (), "resume_token_ids")
        self.validate_prompt(token_ids + resume, params, num_generated=len(resume))
        rid = request_id if request_id is not None else self._free_id()
        return Request(
            rid,
            token_ids,
            params,
            eos_token_ids=tuple(self.eos_token_ids),
            priority=priority,
            cache_salt=cache_salt,
            arrival_time=arrival_time,
            resume_token_ids=resume,
            prefill_only=prefill_only,
            preemptible=preemptible,
        )

    def _free_id(self) -> str:
        """The engine's next own id, stepping over live ones a caller chose."""
        while (rid := f"req-{next(self._ids)}") in self.scheduler.requests or rid in self.grammar_waits:
            pass
        return rid

    def validate_prompt(self, token_ids: list[int], params: SamplingParams, num_generated: int = 0) -> None:
        if not token_ids:
            raise InvalidParameterError("prompt", "the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)  # (ints: _token_ids checked the types)
        if bad is not None:
            raise InvalidParameterError("prompt", f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        if num_generated >= params.max_tokens:
            raise InvalidParameterError(
                "resume_token_ids",
                f"{num_generated} tokens were already generated, and "
                f"max_tokens is {params.max_tokens}: nothing is left to generate",
            )
        params.check_vocabulary(vocab)
        if params.structured is not None and self.runner.grammars is None:  # (compiled off the engine thread)
            raise InvalidParameterError(params.structured.field, "structured outputs need the model's tokenizer")
        total = len(token_ids) - num_generated + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthError(
                "max_tokens",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({len(token_ids)} in the prompt, {params.max_tokens} for the completion). "
                "Please reduce the prompt or max_tokens.",
            )

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.scheduler.abort(request_id) or self.grammar_waits.drop(request_id)
        if req is None:
            return None
        return self.output_processor.abort_output(req)

    def has_unfinished_requests(self) -> bool:
        """True while a request runs or waits, a step is in flight, or a failed step's final outputs
        are still to be sent."""
        return (
            self.scheduler.has_unfinished()
            or bool(self._failed_outputs)
            or bool(self.grammar_waits)
            or (self.async_steps is not None and self.async_steps.busy)
        )

    # -- disaggregation ---------------------------------------------------------------------
    def reserve(
        self,
        request_id: str,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
        preemptible: bool = True,
    ) -> Request | None:
        """Decode role: reserve blocks for a prompt a prefill worker will compute. None if no room now."""
        req = self._new_request(request_id, prompt, params, priority, cache_salt, arrival_time, preemptible=preemptible)
        if params.structured is not None and self.runner.grammars is not None:  # compiled while its KV comes
            self.runner.grammars.compiler.compile_async(params.structured)
        if self.async_steps is not None:  # (its blocks are written from another thread: no step may still write them)
            self.async_steps.wait_device()
        if not self.scheduler.reserve(req):
            return None
        self._add_output_stream(req)
        return req

    def kv_arrived(
        self,
        request_id: str,
        first_token: int,
        ttft_breakdown: dict[str, float] | None = None,
        first_logprob: TokenLogprob | None = None,
    ) -> list[RequestOutput]:
        """Decode role: the KV is in the reserved blocks; emit the first token and start decoding.
        ``ttft_breakdown``: the stages measured by the prefill side and the transfer;
        ``first_logprob``: the first token's, computed there (when the request asked for logprobs)."""
        req = self.scheduler.kv_arrived(request_id, first_token, first_logprob)
        if req is None:
            return []
        outs = self.output_processor.process([req])
        if outs and ttft_breakdown is not None:
            outs[0].ttft_breakdown = ttft_breakdown
        return outs

    def fallback_to_local_prefill(self, request_id: str) -> bool:
        return self.scheduler.fallback_to_local_prefill(request_id) is not None

    def release_transferred(self, request_id: str) -> bool:
        """Prefill role: the decode side has the KV (or gave up); drop this request's block references."""
        return self.scheduler.release_transferred(request_id) is not None

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step. If the model raises, the step's requests end with finish reason "error" (their
        final outputs come first from the next ``step()``), the others carry on, and the error is
        re-raised."""
        self._thread_device.enter()
        if self._failed_outputs and self.ranks is not None and not self.ranks.alive():
            # A rank died: no step runs again, so the failed one's ends go out now, not behind a raise.
            outputs, self._failed_outputs = self._failed_outputs, []
            return outputs
        if self.grammar_waits:
            self._release_compiled()
        if self.async_steps is not None:
            return self._step_async(self.async_steps)
        scheduled = self.last_scheduler_output = self.scheduler.schedule()
        try:
            ran = self.runner.execute(scheduled)
        except BaseException:
            self._failed_outputs += [
                self.output_processor.abort_output(r, FinishReason.ERROR) for r in self.scheduler.step_failed(scheduled)
            ]
            raise
        self.num_steps += 1
        outputs = self.output_processor.process(self.scheduler.update_from_output(ran))
        if self._failed_outputs:
            outputs[:0], self._failed_outputs = self._failed_outputs, []
        return outputs

    def _step_async(self, steps: AsyncSteps) -> list[RequestOutput]:
        """``step`` with the next step scheduled while this one runs; its outputs are this one's."""
        try:
            scheduled, ran = steps.step()
        except BaseException:
            for failed in steps.take_failed():
                self._failed_outputs += [
                    self.output_processor.abort_output(r, FinishReason.ERROR)
                    for r in self.scheduler.step_failed(failed)
                ]
            raise
        self.last_scheduler_output = scheduled
        self.num_steps += 1
        outputs = self.output_processor.process(self.scheduler.update_from_output(ran))
        steps.register_deferred()
        if self._failed_outputs:
            outputs[:0], self._failed_outputs = self._failed_outputs, []
        return outputs

    def _held_for_grammar(self, req: Request) -> bool:
        """A constrained request whose grammar is not compiled yet waits outside the scheduler, its
        compile on the compiler's threads: no step waits for it (engine/structured/grammar_waits.py)."""
        if req.request_id in self.grammar_waits:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        grammars = self.runner.grammars
        if req.sampling_params.structured is None or grammars is None:
            return False
        if req.request_id in self.scheduler.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.scheduler.lifecycle.check_fits_cache(req)  # (refused now, as the scheduler would)
        return self.grammar_waits.hold(req, grammars.compiler)

    def _release_compiled(self) -> None:
        """Held requests whose grammar compiled join the scheduler; those whose compile failed or ran
        past the budget end with ERROR (their outputs go out with this step's)."""
        grammars = self.runner.grammars
        assert grammars is not None  # (only held with one)
        if not self.scheduler.has_unfinished():  # nothing else to step: wait for a compile, briefly
            self.grammar_waits.wait(_COMPILE_POLL_S)
        ready, failed = self.grammar_waits.take(grammars.compiler.budget.wall_s)
        for req in ready:
            self.scheduler.add_request(req)
        for req in failed:
            if not req.prefill_only:  # (the prefill role has no output stream: its decode side recomputes)
                out = self.output_processor.abort_output(req, FinishReason.ERROR)
                out.error = req.error
                self._failed_outputs.append(out)

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order, each with the whole generation (its
        ``logprobs`` and ``prompt_logprobs`` too, when asked for)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("generate: one SamplingParams per prompt, or one for all")
        ids: list[str] = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.add_request(None, p, sp))
        except Exception:  # all or nothing: a bad prompt leaves none of the others queued
            for rid in ids:
                self.abort(rid)
            raise
        done: dict[str, RequestOutput] = {}
        logprobs: dict[str, list[TokenLogprob]] = {}
        prompt_logprobs: dict[str, list[TokenLogprob]] = {}
        try:
            while self.has_unfinished_requests():
                for out in self.step():
                    if out.logprobs is not None:
                        logprobs.setdefault(out.request_id, []).extend(out.logprobs)
                    if out.finished:
                        done[out.request_id] = out
                    if out.prompt_logprobs is not None:
                        prompt_logprobs[out.request_id] = out.prompt_logprobs
        except BaseException:  # a failed step (or an interrupt): none of these prompts stays behind
            mine = set(ids)
            for rid in ids:
                self.abort(rid)
            self._failed_outputs = [o for o in self._failed_outputs if o.request_id not in mine]
            raise
        for rid, lps in logprobs.items():
            done[rid].logprobs = lps
        for rid, lps in prompt_logprobs.items():
            done[rid].prompt_logprobs = lps
        return [done[i] for i in ids]

    # -- a pool worker's KV handoff: every head of a block (engine/parallel/group_kv.py) ---------
    def export_kv(self, block_ids: Sequence[int]) -> torch.Tensor:
        if self.async_steps is not None:  # (a step in flight may still write blocks that were freed)
            self.async_steps.wait_device()
        return export_kv(self.ranks, self.runner.kv_cache, self.model_config.num_key_value_heads, block_ids)

    def import_kv(self, block_ids: Sequence[int], rows: torch.Tensor) -> None:
        if self.async_steps is not None:
            self.async_steps.wait_device()
        import_kv(self.ranks, self.runner.kv_cache, self.model_config.num_key_value_heads, block_ids, rows)

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do at TP 1); the engine is unusable after."""
        if self.async_steps is not None:
            self.async_steps.close()
        if self.ranks is not None:
            self.ranks.close()

    # -- introspection ----------------------------------------------------------------------
    def take_kv_events(self) -> list[KVCacheEvent]:
        return self.block_manager.take_events()

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_blocks

    def kv_slot_usage(self) -> tuple[int, int]:
        """(token slots holding KV, token slots allocated) over running requests (blocks a sliding
        window left behind are released: neither)."""
        return self.block_manager.kv_slot_usage(self.scheduler.running)


def _token_ids(ids: Sequence[int], param: str) -> list[int]:
    """Token ids as Python ints (numpy's integers are welcome); anything else is named as the problem."""
    out = []
    for t in ids:
        if isinstance(t, bool):
            raise InvalidParameterError(param, f"token ids must be integers, got {t!r}")
        try:
            out.append(operator.index(t))
        except TypeError:
            raise InvalidParameterError(param, f"token ids must be integers, got {t!r}") from None
    return out


def _stop_ids(tokenizer: Tokenizer | None, config_eos_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The ids that end generation: the tokenizer's eos and generation_config.json's; where that file
    names none, config.json's ``eos_token_id`` (a list in Llama 3), as transformers falls back to it."""
    if tokenizer is None:
        return config_eos_ids
    ids = tokenizer.eos_token_ids
    if not tokenizer.generation_eos_ids:
        ids += tuple(i for i in config_eos_ids if i not in ids)
    return ids
