"""Log probabilities of sampled tokens (OpenAI's ``logprobs`` / ``top_logprobs``) and of prompt
tokens (``prompt_logprobs``: what completions' ``echo`` with ``logprobs`` reports, the way
evaluation harnesses score a text).

They are the model's own distribution: ``log_softmax`` of the raw logits, before temperature,
top-k or top-p reshape it for sampling (what OpenAI and vLLM report), so a token's logprob does not
depend on how it was drawn. Computed only for the rows of requests that ask, after sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the data types here stay torch-free
    import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs limit (and vLLM's default max_logprobs)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token's logprob and the ``top`` most likely tokens at its position (most likely first;
    the token itself is among them only if it was that likely). ``logprob`` is None only for a
    prompt's first token, which nothing precedes."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def compute_logprobs(logits: torch.Tensor, sampled: torch.Tensor, top_counts: list[int]) -> list[TokenLogprob]:
    """``logits`` [N, V] float32 and ``sampled`` [N] token ids (torch: the tokens whose logprobs are
    wanted, sampled or the prompt's next) -> one TokenLogprob per row, with ``top_counts[i]``
    alternatives for row i."""
    import torch  # the engine's data types above stay importable without torch

    with torch.inference_mode():
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = logprobs.gather(1, sampled.view(-1, 1).long()).view(-1).tolist()
        k = max(top_counts, default=0)
        if k:
            best = logprobs.topk(k, dim=-1)
            top_values, top_ids = best.values.tolist(), best.indices.tolist()
    out = []
    for i, (tok, lp) in enumerate(zip(sampled.tolist(), chosen)):
        n = top_counts[i]
        top = tuple(zip(top_ids[i][:n], top_values[i][:n])) if n else ()
        out.append(TokenLogprob(int(tok), float(lp), top))
    return out
