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

    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(decode_block_tables, decode_seq_lens): a step with decode rows has them."""
        assert self.decode_block_tables is not None and self.decode_seq_lens is not None, "no decode rows"
        return self.decode_block_tables, self.decode_seq_lens

    def prefill_tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(prefill_block_tables, prefill_cu_seqlens_q, prefill_seq_lens): a step with prefill rows has them."""
        assert (
            self.prefill_block_tables is not None
            and self.prefill_cu_seqlens_q is not None
            and self.prefill_seq_lens is not None
        ), "no prefill rows"
        return self.prefill_block_tables, self.prefill_cu_seqlens_q, self.prefill_seq_lens
