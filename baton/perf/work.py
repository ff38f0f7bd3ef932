"""The projection work a Baton run did, counted from what it computed: how many rows went through
the decoder layers and how many through the head (the rows that sampled, static batching's padding
rows included), times each row's multiply-adds. Attention is left out (it depends on each row's
context); so is the last layer's output projection and MLP for rows that do not sample, which the
model skips.

It turns a throughput ratio into work and rate: Baton continuous over static batching is (static's
work / continuous's work) x (continuous's GFLOP/s / static's GFLOP/s). The first factor is the
workload's, the second the engine's (docs/BENCHMARKS.md, "Engine: offline throughput").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowCost:
    """FLOPs (2 per multiply-add) of one row through every decoder layer's projections, through the
    last layer's output projection and MLP (what a row that does not sample skips), and through the head."""

    layers: float
    skipped_if_not_sampled: float
    head: float

    @classmethod
    def of(cls, cfg) -> RowCost:
        h, i, q, kv = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        )
        qkv, o, mlp = h * (q + 2 * kv), q * h, 3 * h * i
        return cls(2.0 * cfg.num_hidden_layers * (qkv + o + mlp), 2.0 * (o + mlp), 2.0 * cfg.vocab_size * h)


@dataclass
class WorkCounter:
    cost: RowCost
    rows: int = 0  # tokens through the layers
    sampled_rows: int = 0  # rows through the head

    def add_step(self, rows: int, sampled_rows: int) -> None:
        self.rows += rows
        self.sampled_rows += sampled_rows

    @property
    def flop(self) -> float:
        c = self.cost
        return (
            self.rows * c.layers
            - (self.rows - self.sampled_rows) * c.skipped_if_not_sampled
            + self.sampled_rows * c.head
        )

    def report(self, seconds: float) -> dict:
        return {
            "layer_rows": self.rows,
            "head_rows": self.sampled_rows,
            "projection_tflop": self.flop / 1e12,
            "projection_gflop_s": self.flop / 1e9 / seconds if seconds > 0 else None,
        }
