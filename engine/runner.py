"""Model runner: applies the scheduler's deltas to the persistent batch, runs one forward pass,
samples. Owns the KV cache tensor."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.cuda_graphs import DecodeGraphs
from engine.device_sampling import process_logits_on_device
from engine.input_batch import InputBatch, StepInputs
from engine.logits_processing import process_logits
from engine.logprobs import TokenLogprob, compute_logprobs
from engine.model.llama import LlamaModel
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler_output import RunnerOutput, SchedulerOutput
from engine.structured.grammar_rows import GrammarRows, MaskJob

# slot -> (the first prompt token scored, its logprobs and the next ones'): RunnerOutput.prompt_logprobs
PromptLogprobs = dict[int, tuple[int, list[TokenLogprob]]]

# Prompt positions scored per head call: a whole chunk's logits would be rows x vocabulary floats,
# and up to 64 rows the CPU head runs in the compiled kernel (linear.SKINNY_MAX_ROWS), faster than a
# dense GEMM.
_SCORE_ROWS = 64


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: torch.Tensor,
        attn: AttentionBackend,
        *,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        seed: int,
        eos_token_ids: tuple[int, ...] | list[int] = (),
        plan_sink: Callable[[SchedulerOutput], None] | None = None,
        grammars: GrammarRows | None = None,
    ) -> None:
        self.model = model
        # Tensor parallel rank 0: hands each step's plan to the other ranks before running it
        # (engine/parallel/), so that every rank applies and runs the same steps.
        self.plan_sink = plan_sink
        self.eos_token_ids = list(eos_token_ids)  # masked while a request is short of its min_tokens
        self.kv_cache = kv_cache
        self.attn = attn
        self.device = kv_cache.device
        self.batch = InputBatch(max_num_seqs, max_model_len, block_size)
        self.sampler = Sampler(seed, self.device)
        self.graphs: DecodeGraphs | None = None  # decode steps as CUDA graphs, once captured
        self.grammars = grammars  # structured outputs' matchers, one per constrained row

    def capture_decode_graphs(self, *, capture: bool = True) -> DecodeGraphs:
        """Capture the decode forward for every graph batch size (engine/cuda_graphs.py); decode
        steps replay them from then on. ``capture=False`` (tests on CPU) runs the same padded
        static-buffer forward without a graph."""
        self.graphs = DecodeGraphs(
            self.model,
            self.kv_cache,
            self.attn,
            max_num_seqs=len(self.batch.params),
            max_blocks=self.batch.max_blocks,
            capture=capture,
        )
        return self.graphs

    def execute(self, so: SchedulerOutput) -> RunnerOutput:
        if self.plan_sink is not None:
            self.plan_sink(so)
        self.batch.apply(so)
        if self.grammars is not None:
            for new in so.new_requests:
                self.grammars.join(new.slot, new.sampling_params)
        if so.is_empty:
            return RunnerOutput([], [])
        inputs = self.batch.prepare(so)
        masks = None  # a constrained step's masks, computed beside the forward
        if self.grammars is not None and len(inputs.logits_indices):
            b = self.batch
            masks = self.grammars.start(
                inputs.sample_rows, inputs.sample_offsets, b.token_ids, b.num_tokens, b.num_prompt_tokens
            )
        graphs = self.graphs
        if graphs is not None and graphs.takes(inputs):
            hidden, prompt_logprobs = self._graph_forward(graphs, inputs), None
        else:
            hidden, prompt_logprobs = self._eager_forward(inputs)
        if not len(inputs.logits_indices):
            return RunnerOutput([], [], prompt_logprobs=prompt_logprobs)
        out = self._sample(hidden, inputs, masks)
        out.prompt_logprobs = prompt_logprobs
        if masks is not None:  # (a row whose matcher failed: its request ends with ERROR)
            out.errors = masks.result().errors or None
        return out

    def _graph_forward(self, graphs: DecodeGraphs, inputs: StepInputs) -> torch.Tensor:
        """The sampling rows' hidden states, from a replayed decode graph (every row computed)."""
        hidden = graphs.run(inputs)
        if len(inputs.logits_indices) != len(hidden):  # a one-token prompt chunk that does not sample
            hidden = hidden[self._tensor(inputs.logits_indices.astype(np.int64, copy=False))]
        return hidden

    def _eager_forward(self, inputs: StepInputs) -> tuple[torch.Tensor, PromptLogprobs | None]:
        """The sampling rows' hidden states, and the prompt logprobs the step scores (None if none)."""
        keep = inputs.logits_indices.astype(np.int64, copy=False)
        scored = inputs.prompt_logprob_rows
        if scored:  # prompt positions to score as well
            keep = np.union1d(keep, np.concatenate([r[2] for r in scored]))
        hidden = self.model.forward(  # the kept rows' hidden states only (ascending)
            self._tensor(inputs.input_ids),
            self._tensor(inputs.positions),
            self.kv_cache,
            self._metadata(inputs),
            self.attn,
            keep=self._tensor(keep),
        )
        if not scored:
            return hidden, None
        prompt_logprobs = self._prompt_logprobs(hidden, keep, scored)
        return hidden[self._tensor(np.searchsorted(keep, inputs.logits_indices))], prompt_logprobs

    @torch.inference_mode()
    def _prompt_logprobs(
        self, hidden: torch.Tensor, keep: np.ndarray, scored: list[tuple[int, int, np.ndarray, np.ndarray]]
    ) -> PromptLogprobs:
        """The prompt positions' logprobs, ``_SCORE_ROWS`` rows at a time."""
        out: PromptLogprobs = {}
        for slot, first, rows, targets in scored:
            at = np.searchsorted(keep, rows)
            sp = self.batch.params[slot]
            assert sp is not None and sp.prompt_logprobs is not None  # (a scoring row's request asked)
            k = sp.prompt_logprobs
            values: list[TokenLogprob] = []
            for i in range(0, len(at), _SCORE_ROWS):
                logits = self.model.compute_logits(hidden[self._tensor(at[i : i + _SCORE_ROWS])])
                part = targets[i : i + _SCORE_ROWS]
                values += compute_logprobs(logits, self._tensor(part), [k] * len(part))
            out[slot] = (first, values)
        return out

    @torch.inference_mode()
    def _sample(self, hidden: torch.Tensor, inputs: StepInputs, masks: MaskJob | None = None) -> RunnerOutput:
        batch = self.batch
        rows = inputs.sample_rows
        row_list = rows.tolist()
        params = [batch.params[r] for r in row_list]
        if self.model.greedy_head_takes(len(row_list)):
            got = self._greedy_head_sample(hidden, inputs, row_list, params, masks)
            if got is not None:
                tokens, others_logits, others = got
                return self._take(tokens, others_logits, rows, row_list, params, logits_rows=others)
        logits = self.model.compute_logits(hidden)
        sampled_t = self._sample_logits(logits, rows, row_list, params, inputs.sample_offsets, masks)
        return self._take(sampled_t, logits, rows, row_list, params)

    def _greedy_head_sample(
        self,
        hidden: torch.Tensor,
        inputs: StepInputs,
        row_list: list[int],
        params: list[SamplingParams],
        masks: MaskJob | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray | None] | None:
        """Plain greedy rows (no penalties, bias, ``min_tokens``, logprobs) need only each row's argmax:
        the model's greedy head finds it without every logit, and the other rows' logits are computed
        and sampled alone. The same tokens as computing every logit (the greedy head's argmax is the
        head's), and the rows that ask for logprobs are among the others (their logits computed
        without the plain rows agree with the full batch's to the last bits: ~1e-6 in logprobs).
        (tokens, the others' logits, the others' positions among the step's rows; both None when every
        row is plain). A constrained row is plain while its grammar's mask allows its argmax (the
        masked argmax is then that token), else one of the others. None where no row is plain
        greedy, or the greedy head does not take these rows."""
        processing = self.batch.processing_rows
        is_plain = np.array([p.greedy and p.logprobs is None and r not in processing for r, p in zip(row_list, params)])
        if not is_plain.any():
            return None
        plain = np.flatnonzero(is_plain)
        tokens = self.model.greedy_tokens(hidden if len(plain) == len(row_list) else hidden[torch.from_numpy(plain)])
        if tokens is None:
            return None
        if masks is not None:  # a constrained row keeps its argmax where its mask allows it, else needs every logit
            plain, tokens = _allowed_argmax(masks, plain, tokens)
        if len(plain) == len(row_list):
            return tokens, None, None
        others = np.setdiff1d(np.arange(len(row_list)), plain, assume_unique=True)
        plain_t, others_t = torch.from_numpy(plain), torch.from_numpy(others)
        offsets = inputs.sample_offsets
        others_logits = self.model.compute_logits(hidden[others_t])
        sampled = self._sample_logits(
            others_logits,
            inputs.sample_rows[others],
            [row_list[i] for i in others],
            [params[i] for i in others],
            None if offsets is None else offsets[others],
            masks,
            others,
        )
        out = torch.empty(len(params), dtype=torch.int64)
        out[plain_t], out[others_t] = tokens, sampled
        return out, others_logits, others

    def _sample_logits(
        self,
        logits: torch.Tensor,
        rows: np.ndarray,
        row_list: list[int],
        params: list[SamplingParams],
        offsets: np.ndarray | None,
        masks: MaskJob | None = None,
        positions: np.ndarray | None = None,
    ) -> torch.Tensor:
        """Tokens sampled from ``logits`` (one row per sampled position of ``rows``: the step's, or
        those at ``positions`` among them), logit processing first, then the grammars' masks."""
        batch = self.batch
        # Tokens before the one each position samples: a drafted position's include the drafts
        # before it (written after the known ones), so its seed's output index and its penalties'
        # history are the ones plain decoding would use there.
        known = batch.num_tokens[rows]
        if offsets is not None:
            known = known + offsets
        out_pos = (known - batch.num_prompt_tokens[rows]).tolist()
        to_sample = logits
        if batch.processing_rows and not batch.processing_rows.isdisjoint(row_list):
            histories = [
                batch.token_ids[r, :n] if r in batch.processing_rows else None for r, n in zip(row_list, known.tolist())
            ]
            process = process_logits_on_device if self.sampler.sync_free else process_logits
            to_sample = process(logits, params, histories, batch.num_prompt_tokens[rows].tolist(), self.eos_token_ids)
        if masks is not None and self.grammars is not None:
            to_sample = self.grammars.apply(to_sample, masks.result(), positions)
        return self.sampler.sample(to_sample, params, out_pos)

    def _take(
        self,
        sampled_t: torch.Tensor,
        logits: torch.Tensor | None,
        rows: np.ndarray,
        row_list: list[int],
        params: list[SamplingParams],
        logits_rows: np.ndarray | None = None,
    ) -> RunnerOutput:
        """The sampled tokens into the batch (drafts verified); ``logits`` (None: no row asked for
        logprobs) give the logprobs: a row per sampled position, or per position of ``logits_rows``
        (every one that asked among them)."""
        batch = self.batch
        if batch.draft_rows:
            return self._verify(logits, sampled_t, rows, params, logits_rows)
        sampled = sampled_t.cpu().numpy()
        batch.append_sampled(rows, sampled)
        logprobs = None
        if batch.logprob_rows and not batch.logprob_rows.isdisjoint(row_list):
            assert logits is not None  # (None only where no row asked)
            logprobs = _logprobs(logits, sampled_t, params, logits_rows)
        return RunnerOutput(row_list, sampled.tolist(), logprobs)

    def _verify(
        self,
        logits: torch.Tensor | None,
        sampled_t: torch.Tensor,
        rows: np.ndarray,
        params: list[SamplingParams],
        logits_rows: np.ndarray | None = None,
    ) -> RunnerOutput:
        """A step with drafts (engine/spec_decode.py): a row with k drafts sampled k + 1 positions in a
        run, each with the noise (seeded requests: the seed and output index) plain decoding would
        use there; it keeps its drafts up to the first that differs from the token sampled before
        it, then that sampled token (or the one after the last draft, if all are kept). So each
        token kept is the one sampled after the tokens really before it: the output has plain
        decoding's distribution (and, greedy or seeded, its tokens)."""
        batch = self.batch
        sampled = sampled_t.cpu().numpy()
        row_list = rows.tolist()
        slots, final, plain, runs = [], [], [], []
        accepted: dict[int, list[int]] = {}
        i = 0
        while i < len(row_list):
            row = row_list[i]
            k = int(batch.num_drafts[row])
            at = i  # the position whose sampled token is the row's own next token
            if k:
                start = int(batch.num_tokens[row])
                drafts = batch.token_ids[row, start : start + k]
                a = int(np.argmin(np.append(drafts == sampled[i : i + k], False)))  # the first mismatch
                at += a
                batch.take_verified(row, a, sampled[at])
                accepted[row] = drafts[:a].tolist()
                runs.append((row, i, at))
            else:
                plain.append(i)
            slots.append(row)
            final.append(at)
            i += k + 1
        if plain:
            batch.append_sampled(rows[plain], sampled[plain])
        logprobs = verified_logprobs = None
        if batch.logprob_rows and not batch.logprob_rows.isdisjoint(slots):
            assert logits is not None  # (None only where no row asked)
            every = _logprobs(
                logits, sampled_t, params, logits_rows
            )  # every position's (a kept draft's: where it was sampled)
            assert every is not None  # (a row asked)
            logprobs = [every[j] for j in final]
            # (a run's positions are one request's: all asked, or none)
            verified_logprobs = {
                row: [lp for lp in every[i : at + 1] if lp is not None] for row, i, at in runs if every[i] is not None
            }
        return RunnerOutput(
            slots, sampled[final].tolist(), logprobs, accepted_draft_ids=accepted, verified_logprobs=verified_logprobs
        )

    def _metadata(self, x: StepInputs) -> AttentionMetadata:
        t = self._tensor
        has_decode = x.num_decode_tokens > 0
        has_prefill = len(x.prefill_seq_lens) > 0
        return AttentionMetadata(
            num_decode_tokens=x.num_decode_tokens,
            num_prefill_tokens=len(x.input_ids) - x.num_decode_tokens,
            slot_block=t(x.slot_block),
            slot_offset=t(x.slot_offset),
            decode_block_tables=t(x.decode_block_tables) if has_decode else None,
            decode_seq_lens=t(x.decode_seq_lens) if has_decode else None,
            prefill_block_tables=t(x.prefill_block_tables) if has_prefill else None,
            prefill_cu_seqlens_q=t(x.prefill_cu_seqlens_q) if has_prefill else None,
            prefill_seq_lens=t(x.prefill_seq_lens) if has_prefill else None,
        )

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(a))
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)


def _allowed_argmax(masks: MaskJob, plain: np.ndarray, tokens: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """The plain greedy positions (and their argmax tokens) left once each constrained one whose
    argmax its mask forbids is taken out: where the mask allows the argmax, the masked argmax is it."""
    m = masks.result()
    constrained = np.isin(plain, m.at)
    if not constrained.any():
        return plain, tokens
    ok = np.ones(len(plain), dtype=bool)
    ok[constrained] = m.allows(plain[constrained], tokens.cpu().numpy()[constrained])
    if ok.all():
        return plain, tokens
    return plain[ok], tokens[torch.from_numpy(ok).to(tokens.device)]


def _logprobs(
    logits: torch.Tensor, sampled: torch.Tensor, params: list[SamplingParams], logits_rows: np.ndarray | None = None
) -> list[TokenLogprob | None] | None:
    """Logprobs of the rows whose request asked for them, in row order (None elsewhere). ``logits``
    has a row per position, or (``logits_rows``) a row for each listed position only."""
    asking = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not asking:
        return None
    at = asking
    if logits_rows is not None:
        row_of = {int(position): j for j, position in enumerate(logits_rows)}
        at = [row_of[i] for i in asking]
    idx = torch.tensor(asking, device=sampled.device)
    computed = compute_logprobs(
        logits[torch.tensor(at, device=logits.device)],
        sampled[idx],
        [p.logprobs for p in params if p.logprobs is not None],
    )
    out: list[TokenLogprob | None] = [None] * len(params)
    for i, lp in zip(asking, computed):
        out[i] = lp
    return out
