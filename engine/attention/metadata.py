"""Per-step attention inputs, built once by the runner and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """The batch is ``num_decode_tokens`` single-token sequences first, then ragged prefill chunks."""

    num_decode_tokens: int
    num_prefill_tokens: int
    # Where each token's new K/V goes: [T] block ids and offsets inside the block.
    slot_block: torch.Tensor
    slot_offset: torch.Tensor
    # Decode sequences: [D, max_blocks] and [D] (context length including the new token).
    decode_block_tables: torch.Tensor | None
    decode_seq_lens: torch.Tensor | None
    # Prefill sequences: [P, max_blocks], [P + 1] offsets into the prefill rows, [P] context lengths.
    prefill_block_tables: torch.Tensor | None
    prefill_cu_seqlens_q: torch.Tensor | None
    prefill_seq_lens: torch.Tensor | None
