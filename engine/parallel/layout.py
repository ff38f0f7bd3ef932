"""Which part of the model a tensor-parallel rank holds (pure Python: the config checks it too).

Megatron-style: the query heads, and the rows of gate/up, are split evenly over the ranks
(column-parallel), o_proj and down_proj take the matching input columns (row-parallel, their
partial sums all-reduced), and the vocabulary (embedding and head) is split in contiguous ranges.
KV heads are split where the size divides them and replicated where the size exceeds them (a
multiple of them), as vLLM does: rank r then holds KV head ``r // (size / kv_heads)``, the one its
query heads attend with.

The other families shard the same way: each MoE expert (and Qwen2-MoE's shared expert) like the
dense MLP, over its own intermediate size (its gate/up rows and down columns: ``EvenShare``, as the
layout is not told the experts' size; the model checks the size divides it), the router and the
shared expert's gate whole on every rank; Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` as the
rank's rows of each part they fuse (``Pieces``). Norms, q/k norms included (per head), stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass


def check_tensor_parallel(
    size: int, num_heads: int, num_kv_heads: int, intermediate_size: int, setting: str = "tensor_parallel_size"
) -> None:
    """Refuse a size the model cannot be split by, naming both numbers."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"{setting} must be a positive integer, got {size!r}")
    if num_heads % size:
        raise ValueError(f"{setting}={size} does not divide the model's {num_heads} attention heads")
    if num_kv_heads % size and size % num_kv_heads:
        raise ValueError(
            f"{setting}={size} neither divides the model's {num_kv_heads} KV heads nor is a "
            f"multiple of them (KV heads are split or replicated)"
        )
    if intermediate_size % size:
        raise ValueError(f"{setting}={size} does not divide the model's intermediate size {intermediate_size}")


@dataclass(frozen=True)
class Pieces:
    """Ranges of a tensor along ``dim`` that a rank reads and concatenates, in order (one from each
    part of a fused tensor)."""

    dim: int
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class EvenShare:
    """Rank ``rank``'s share of ``size`` equal, contiguous shares of a tensor's length along ``dim``."""

    dim: int
    rank: int
    size: int

    def range(self, length: int) -> tuple[int, int]:
        if length % self.size:
            raise ValueError(f"a tensor of length {length} along dimension {self.dim} cannot be split in {self.size}")
        n = length // self.size
        return self.rank * n, (self.rank + 1) * n


# (dimension, start, stop) of one range, or several, or an even share
TensorPart = tuple[int, int, int] | Pieces | EvenShare

_EXPERT_ROWS = ("w1.weight", "w3.weight", "gate_proj.weight", "up_proj.weight")  # column-parallel
_EXPERT_COLUMNS = ("w2.weight", "down_proj.weight")  # row-parallel


def part_ranges(part: TensorPart, shape: tuple[int, ...]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(dimension, the ranges along it) that ``part`` reads of a tensor of ``shape``."""
    if isinstance(part, Pieces):
        return part.dim, part.ranges
    if isinstance(part, EvenShare):
        return part.dim, (part.range(shape[part.dim]),)
    dim, lo, hi = part
    return dim, ((lo, hi),)


@dataclass(frozen=True)
class ShardLayout:
    """Rank ``rank`` of ``size``: its heads, MLP rows and vocabulary range."""

    rank: int
    size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        check_tensor_parallel(self.size, self.num_heads, self.num_kv_heads, self.intermediate_size)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.size}")

    @property
    def heads(self) -> int:
        return self.num_heads // self.size

    @property
    def kv_heads(self) -> int:
        """KV heads this rank holds (1 where they are replicated)."""
        return max(1, self.num_kv_heads // self.size)

    @property
    def replicated_kv(self) -> bool:
        return self.size > self.num_kv_heads

    @property
    def first_kv_head(self) -> int:
        if self.replicated_kv:
            return self.rank // (self.size // self.num_kv_heads)
        return self.rank * self.kv_heads

    def kv_head_range(self) -> tuple[int, int]:
        return self.first_kv_head, self.first_kv_head + self.kv_heads

    def head_rows(self) -> tuple[int, int]:
        """The q_proj rows (and o_proj columns) of this rank's query heads."""
        n = self.heads * self.head_dim
        return self.rank * n, (self.rank + 1) * n

    def kv_rows(self) -> tuple[int, int]:
        lo, hi = self.kv_head_range()
        return lo * self.head_dim, hi * self.head_dim

    def mlp_rows(self) -> tuple[int, int]:
        """The gate/up rows (and down_proj columns) of this rank."""
        n = self.intermediate_size // self.size
        return self.rank * n, (self.rank + 1) * n

    @property
    def vocab_per_rank(self) -> int:
        """Each rank's vocabulary range is this long (the last one's may be shorter; gathers pad)."""
        return -(-self.vocab_size // self.size)

    def vocab_range(self) -> tuple[int, int]:
        lo = min(self.vocab_size, self.rank * self.vocab_per_rank)
        return lo, min(self.vocab_size, lo + self.vocab_per_rank)

    def slice_for(self, name: str) -> TensorPart | None:
        """The part of the HF tensor ``name`` this rank loads (mostly (dimension, start, stop)); None:
        the whole tensor."""
        if name.endswith("self_attn.qkv_proj.weight"):  # Phi-3: q, k and v rows in one tensor
            q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            (qlo, qhi), (klo, khi) = self.head_rows(), self.kv_rows()
            return Pieces(0, ((qlo, qhi), (q + klo, q + khi), (q + kv + klo, q + kv + khi)))
        if name.endswith("mlp.gate_up_proj.weight"):  # Phi-3: gate rows, then up rows
            lo, hi = self.mlp_rows()
            return Pieces(0, ((lo, hi), (self.intermediate_size + lo, self.intermediate_size + hi)))
        if ".experts." in name or ".shared_expert." in name:  # MoE: each expert like the dense MLP
            if name.endswith(_EXPERT_ROWS):
                return EvenShare(0, self.rank, self.size)
            if name.endswith(_EXPERT_COLUMNS):
                return EvenShare(1, self.rank, self.size)
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            return (0, *self.head_rows())
        if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            return (0, *self.kv_rows())
        if name.endswith("o_proj.weight"):
            return (1, *self.head_rows())
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            return (0, *self.mlp_rows())
        if name.endswith("down_proj.weight"):
            return (1, *self.mlp_rows())
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return (0, *self.vocab_range())
        return None

    def shard_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        got = self.slice_for(name)
        if got is None:
            return shape
        dim, ranges = part_ranges(got, shape)
        return shape[:dim] + (sum(hi - lo for lo, hi in ranges),) + shape[dim + 1 :]
