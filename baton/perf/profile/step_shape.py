"""What one engine step computes, reduced to the few numbers its duration depends on (pure Python).

The features are the candidates the cost model is fitted on:

- ``const``: the fixed cost of a forward pass (at small batches, re-reading the weights);
- ``multi_token``: 1 when the step has more than one token (with dense weights the BLAS switched
  from a GEMV to matrix-matrix kernels that repack the weights, ~25 ms per step on a 1-thread CPU;
  the packed CPU weights of engine/model/linear.py removed most of that; the fit decides);
- ``tokens``: tokens in the step (every matmul is linear in them);
- ``sampled``: rows that produce logits and a token (the LM head, sampling, output processing);
- ``decode_ctx``: decode attention. The CPU path gathers the decode rows' blocks padded to the
  longest row of their length group (engine/attention/decode_groups.py), so it costs the padded
  sum; a paged GPU kernel costs the plain sum, hence both ``decode_ctx_padded`` and
  ``decode_ctx_sum`` are offered and the fit keeps what the measurements support;
- ``prefill_pairs``: prefill attention, query x key pairs (``chunk x context``) per prefilling row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.attention.decode_groups import length_groups

FEATURES: tuple[str, ...] = (
    "const",
    "multi_token",
    "tokens",
    "sampled",
    "decode_ctx_padded",
    "decode_ctx_sum",
    "prefill_pairs",
)


@dataclass(frozen=True)
class StepShape:
    num_tokens: int
    num_seqs: int
    num_sampled: int
    num_decode: int  # single-token rows (the runner puts them through decode attention)
    decode_ctx_sum: int  # sum of the decode rows' context lengths (the new token included)
    decode_ctx_max: int  # the longest decode row's context, rounded up to whole blocks
    prefill_pairs: int  # sum over multi-token rows of chunk x context length
    # Decode context as the CPU path gathers it: each row padded to its length group's longest
    # (whole blocks). None: every row padded to the longest (cost-model files from before groups).
    decode_ctx_padded: int | None = None

    def features(self) -> dict[str, float]:
        return {
            "const": 1.0,
            "multi_token": 1.0 if self.num_tokens > 1 else 0.0,
            "tokens": float(self.num_tokens),
            "sampled": float(self.num_sampled),
            "decode_ctx_padded": float(self.padded_decode_ctx),
            "decode_ctx_sum": float(self.decode_ctx_sum),
            "prefill_pairs": float(self.prefill_pairs),
        }

    @property
    def padded_decode_ctx(self) -> int:
        if self.decode_ctx_padded is None:
            return self.num_decode * self.decode_ctx_max
        return self.decode_ctx_padded

    def to_json(self) -> dict:
        return {
            "num_tokens": self.num_tokens,
            "num_seqs": self.num_seqs,
            "num_sampled": self.num_sampled,
            "num_decode": self.num_decode,
            "decode_ctx_sum": self.decode_ctx_sum,
            "decode_ctx_max": self.decode_ctx_max,
            "prefill_pairs": self.prefill_pairs,
            "decode_ctx_padded": self.padded_decode_ctx,
        }

    @classmethod
    def from_json(cls, d: dict) -> StepShape:
        padded = d.get("decode_ctx_padded")
        return cls(
            **{
                k: int(d[k])
                for k in (
                    "num_tokens",
                    "num_seqs",
                    "num_sampled",
                    "num_decode",
                    "decode_ctx_sum",
                    "decode_ctx_max",
                    "prefill_pairs",
                )
            },
            decode_ctx_padded=None if padded is None else int(padded),
        )


EMPTY = StepShape(0, 0, 0, 0, 0, 0, 0)


def shape_of_rows(counts: Sequence[int], ends: Sequence[int], known: Sequence[int], block_size: int) -> StepShape:
    """A step's shape from its rows: tokens computed (``counts``), the context each row reaches
    (``ends`` = computed tokens after the step) and the tokens each row knew before the step
    (``known``; a row samples when it reaches the end of them)."""
    tokens = seqs = sampled = n_dec = dec_sum = dec_max = pairs = 0
    dec_blocks: list[int] = []
    for n, end, k in zip(counts, ends, known):
        tokens += n
        seqs += 1
        if end == k:
            sampled += 1
        if n == 1:
            n_dec += 1
            dec_sum += end
            dec_blocks.append(-(-end // block_size))
            if end > dec_max:
                dec_max = end
        else:
            pairs += n * end
    dec_max = -(-dec_max // block_size) * block_size
    groups = length_groups(dec_blocks, dec_max // block_size) if dec_blocks else []
    padded = sum(len(rows) * width for rows, width in groups) * block_size
    return StepShape(tokens, seqs, sampled, n_dec, dec_sum, dec_max, pairs, padded)


def shape_of_schedule(so, requests: dict, block_size: int) -> StepShape:
    """Right after ``Scheduler.schedule()`` (which advances ``num_computed_tokens`` to each row's end)."""
    ends, known = [], []
    for rid in so.request_ids:
        req = requests[rid]
        ends.append(req.num_computed_tokens)
        known.append(req.num_tokens)
    return shape_of_rows(so.counts, ends, known, block_size)
