"""Penalties and logit bias: the logits of the rows whose request asks are reshaped before
sampling (greedy included); logprobs still report the model's own distribution.

Applied in this order, to a copy of the step's logits:
- ``logit_bias``: a fixed amount added to the named tokens' logits (OpenAI).
- ``repetition_penalty`` r, over every token of the prompt and the output so far (transformers'
  and vLLM's): a positive logit is divided by r, a negative one multiplied by it.
- ``frequency_penalty`` f and ``presence_penalty`` p, over the output so far (OpenAI's): a token
  generated c times loses ``f * c + p * (c > 0)``.
- ``min_tokens`` m: until m tokens are out, the stop tokens (EOS unless ``ignore_eos``, and
  ``stop_token_ids``) cannot be sampled (vLLM's): the output never holds a stop token before m.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.sampling_params import SamplingParams


@torch.inference_mode()
def process_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[np.ndarray | None],
    num_prompt_tokens: Sequence[int],
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """``logits`` [N, V]; ``histories[i]``: row i's tokens so far (prompt, then output), needed only
    where ``params[i].processes_logits``. Returns a new tensor; ``logits`` is left as it was."""
    out = logits.clone()
    for i, sp in enumerate(params):
        if not sp.processes_logits:
            continue
        row = out[i]
        tokens = histories[i]
        assert tokens is not None  # given for every row that processes its logits
        if sp.min_tokens and len(tokens) - num_prompt_tokens[i] < sp.min_tokens:
            stops = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos_token_ids))
            if stops:
                row[torch.tensor(stops, device=row.device)] = float("-inf")
        if sp.logit_bias:
            ids = torch.tensor([t for t, _ in sp.logit_bias], device=row.device)
            row.index_add_(0, ids, torch.tensor([b for _, b in sp.logit_bias], device=row.device, dtype=row.dtype))
        history = torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(row.device)
        if sp.repetition_penalty != 1.0 and len(history):
            seen = torch.unique(history)
            values = row[seen]
            row[seen] = torch.where(values > 0, values / sp.repetition_penalty, values * sp.repetition_penalty)
        if sp.frequency_penalty or sp.presence_penalty:
            output = history[num_prompt_tokens[i] :]
            if len(output):  # only the tokens generated so far change: no vocabulary-sized pass
                seen, counts = torch.unique(output, return_counts=True)
                row[seen] -= sp.frequency_penalty * counts.to(row.dtype) + sp.presence_penalty
    return out
