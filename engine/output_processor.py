"""Turns requests that got new tokens into ``RequestOutput`` deltas: incremental detokenization and
stop strings. A stop string ends the request through the scheduler and is cut from the text; text
that might still become the start of a stop string is held back until it cannot."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.logprobs import TokenLogprob
from engine.model.detokenizer import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer
from engine.outputs import RequestMetrics, RequestOutput
from engine.request import FinishReason, Request, RequestState
from engine.scheduler import Scheduler

_DECODING = RequestState.DECODING


@dataclass(slots=True)
class _Stream:
    detokenizer: IncrementalDetokenizer | None
    num_sent_tokens: int
    text: str = ""
    num_sent_chars: int = 0
    hold: int = 0  # characters held back: longest stop string - 1
    first: bool = True  # the next output carries the first token
    plain: bool = False  # no text and no logprobs: once decoding, its deltas take the short path


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer | None) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self._streams: dict[str, _Stream] = {}

    def add(self, req: Request, resume_text_chars: int = 0) -> None:
        """``resume_text_chars``: of a resumed (migrated) request's generated tokens' text, how much the
        caller has: their text is rebuilt here exactly as the first worker built it (same tokens, same
        detokenizer), and what it held back (a character cut by a token, a possible stop string's
        start) goes out with the next output instead of being lost."""
        sp = req.sampling_params
        detok, text = None, ""
        if self.tokenizer is not None and sp.detokenize:
            detok = self.tokenizer.new_detokenizer(req.prompt_token_ids, skip_special_tokens=sp.skip_special_tokens)
            text = detok.add(req.all_token_ids[req.num_prompt_tokens :])
        hold = max((len(s) for s in sp.stop), default=1) - 1
        self._streams[req.request_id] = _Stream(
            detok,
            req.num_tokens,
            text=text,
            num_sent_chars=min(resume_text_chars, len(text)),
            hold=hold,
            plain=detok is None and sp.logprobs is None,
        )

    def discard(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def process(self, updated: list[Request]) -> list[RequestOutput]:
        outs = []
        streams = self._streams
        for req in updated:
            st = streams.get(req.request_id)
            if st is None:
                continue
            ids = req.all_token_ids
            new_ids = ids[st.num_sent_tokens :]
            st.num_sent_tokens = n = len(ids)
            if st.plain and not st.first and req.state is _DECODING:
                # The common delta (a decoding request's tokens, no text, no logprobs), built here:
                # with hundreds of sequences a step, this loop is a GPU step's largest host cost.
                outs.append(RequestOutput(req.request_id, new_ids, "", n - req.num_prompt_tokens - len(new_ids)))
                continue
            if st.detokenizer is not None:
                new_ids = self._detokenize(req, st, new_ids)
            outs.append(self._output(req, st, new_ids))
        return outs

    def _detokenize(self, req: Request, st: _Stream, new_ids: list[int]) -> list[int]:
        """Adds ``new_ids``' text and looks for stop strings; returns ``new_ids``, cut after the token
        that completed a stop string when a step appended several (drafts kept: plain decoding
        would have stopped at that token, so the tokens after it are taken back)."""
        sp = req.sampling_params
        text_ids = new_ids
        if (
            new_ids
            and req.is_finished
            and req.finish_reason is FinishReason.STOP
            and isinstance(req.stop_reason, int)
            and not sp.include_stop_str_in_output
        ):
            text_ids = new_ids[:-1]  # a stop token (EOS, stop_token_ids) is in token_ids, not in the text (vLLM's)
        if len(text_ids) <= 1 or not sp.stop:
            self._add_text(req, st, text_ids, req.is_finished, req.num_output_tokens)
            return new_ids
        first = req.num_output_tokens - len(new_ids)
        for j in range(len(text_ids)):
            last = j == len(text_ids) - 1
            if self._add_text(req, st, text_ids[j : j + 1], req.is_finished and last, first + j + 1) and not last:
                self._take_back(req, st, len(new_ids) - j - 1)
                return new_ids[: j + 1]
        return new_ids

    @staticmethod
    def _take_back(req: Request, st: _Stream, n: int) -> None:
        """The last ``n`` tokens (and their logprobs) leave a request a stop string ended before them."""
        del req.all_token_ids[-n:]
        if req.pending_logprobs:
            del req.pending_logprobs[-n:]
        st.num_sent_tokens -= n

    def _add_text(self, req: Request, st: _Stream, ids: list[int], finished: bool, num_output: int) -> bool:
        """The text of ``ids`` (the request's output up to ``num_output`` tokens); True if a stop
        string ends it (the text is cut there and the request finished)."""
        sp = req.sampling_params
        detok = st.detokenizer
        assert detok is not None  # only a request with a detokenizer has text
        delta = detok.add(ids)
        if finished:
            delta += detok.finish()  # release a held-back partial character
        if not delta:
            return False
        before = len(st.text)
        st.text += delta
        if not sp.stop or num_output < sp.min_tokens:
            return False  # as vLLM: no stop string ends a request before its min_tokens
        found: tuple[int, str] | None = None  # the stop string that starts first in the text
        for stop in sp.stop:
            i = st.text.find(stop, max(0, before - len(stop) + 1))
            if i >= 0 and (found is None or i < found[0]):
                found = (i, stop)
        if found is None:
            return False
        i, stop = found
        st.text = st.text[: i + len(stop)] if sp.include_stop_str_in_output else st.text[:i]
        req.stop_reason = stop
        if not req.is_finished:
            self.scheduler.finish(req, FinishReason.STOP)
        elif req.finish_reason is FinishReason.LENGTH:  # the last allowed token held it: the text was cut
            req.finish_reason = FinishReason.STOP
        return True

    def _output(self, req: Request, st: _Stream, new_ids: list[int]) -> RequestOutput:
        finished = req.is_finished
        end = len(st.text) if finished else max(st.num_sent_chars, len(st.text) - st.hold)
        text_delta = st.text[st.num_sent_chars : end]
        st.num_sent_chars = end
        out = RequestOutput(
            req.request_id, new_ids, text_delta, first_index=req.num_tokens - req.num_prompt_tokens - len(new_ids)
        )
        if req.sampling_params.logprobs is not None:
            out.logprobs, req.pending_logprobs = req.pending_logprobs, []
        if st.first and new_ids:
            st.first = False
            if req.prompt_logprobs is not None:  # complete once the first token is sampled
                out.prompt_logprobs = [TokenLogprob(req.prompt_token_ids[0], None), *req.prompt_logprobs]
            if req.first_scheduled_time is not None and req.first_token_time is not None:
                # Preempted before its first token: that time out is its own stage, not compute.
                out_s = sum(b - a for a, b in req.preempted_spans or ())
                out.ttft_breakdown = {
                    "prefill_queue": req.first_scheduled_time - req.arrival_time,
                    "prefill_compute": max(0.0, req.first_token_time - req.first_scheduled_time - out_s),
                    "transfer": 0.0,
                    "decode_queue": 0.0,
                }
                if out_s:
                    out.ttft_breakdown["preempted"] = out_s
        if finished:
            self._streams.pop(req.request_id, None)
            out.finished = True
            out.finish_reason = req.finish_reason
            out.stop_reason = req.stop_reason
            out.num_prompt_tokens = req.num_prompt_tokens
            out.num_cached_tokens = req.num_cached_tokens
            out.token_ids = req.output_token_ids
            out.text = st.text
            now = time.monotonic()
            out.metrics = RequestMetrics(req.arrival_time, req.first_scheduled_time, req.first_token_time, now)
            out.error = req.error
            if req.preempted_spans:
                out.preempted = [(a - now, b - now) for a, b in req.preempted_spans]
        return out

    def abort_output(self, req: Request, finish_reason: FinishReason = FinishReason.ABORT) -> RequestOutput:
        """The final output of a request ended from outside its tokens (an abort, a failed step)."""
        st = self._streams.pop(req.request_id, None)
        text = st.text if st else ""
        return RequestOutput(
            req.request_id,
            [],
            text[st.num_sent_chars :] if st else "",
            finished=True,
            finish_reason=finish_reason,
            num_prompt_tokens=req.num_prompt_tokens,
            token_ids=req.output_token_ids,
            text=text,
            first_index=req.num_tokens - req.num_prompt_tokens,
        )
