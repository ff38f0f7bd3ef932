"""A mixture-of-experts MLP in torch (the CPU path): softmax router, top-k experts, each token's
chosen experts' outputs weighted and summed, plus Qwen2-MoE's gated shared expert.

Tokens are grouped by expert (one sort), so each expert multiplies all its tokens at once. On CUDA
the routed experts run as the fused Triton kernel instead (``moe_fused.fused_experts``, handed in
by the model's ``KernelSet``); the routing and the shared expert stay here for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.family import MoeLayout, MoeSpec

# (x, gate_up, down, top-k weights (float32), top-k experts, act_mul) -> the routed experts' sum
FusedExperts = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]],
    torch.Tensor,
]


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [experts, hidden]
    gate_up: torch.Tensor  # [experts, 2 * intermediate, hidden]: gate rows, then up rows
    down: torch.Tensor  # [experts, hidden, intermediate]
    shared_gate_up: torch.Tensor | None = None  # [2 * shared intermediate, hidden]
    shared_down: torch.Tensor | None = None
    shared_gate: torch.Tensor | None = None  # [1, hidden]

    @classmethod
    def take(cls, spec: MoeSpec, extra: dict[str, torch.Tensor]) -> MoeWeights:
        """From a layer's extra tensors (family_weights.family_shapes names), which it pops."""
        if spec.layout is MoeLayout.MIXTRAL:
            p, names = "block_sparse_moe.", ("w1", "w3", "w2")
        else:
            p, names = "mlp.", ("gate_proj", "up_proj", "down_proj")
        router = extra.pop(p + "gate.weight")
        gate_up, down = [], []
        for e in range(spec.num_experts):
            g, u, d = (extra.pop(f"{p}experts.{e}.{n}.weight") for n in names)
            gate_up.append(torch.cat([g, u]))
            down.append(d)
        shared = {}
        if spec.shared_intermediate_size:
            s = "mlp.shared_expert."
            gate_up_rows = [extra.pop(s + "gate_proj.weight"), extra.pop(s + "up_proj.weight")]
            shared = dict(
                shared_gate_up=torch.cat(gate_up_rows),
                shared_down=extra.pop(s + "down_proj.weight"),
                shared_gate=extra.pop("mlp.shared_expert_gate.weight"),
            )
        return cls(router, torch.stack(gate_up), torch.stack(down), **shared)


def moe_mlp(
    x: torch.Tensor,
    w: MoeWeights,
    spec: MoeSpec,
    act_mul: Callable[[torch.Tensor], torch.Tensor],
    fused: FusedExperts | None = None,
) -> torch.Tensor:
    """x: [T, hidden] -> [T, hidden]. ``act_mul``: activation(gate) * up over fused gate/up rows.
    ``fused``: the routed experts in one kernel per projection (None: expert by expert in torch)."""
    probs = F.softmax(F.linear(x, w.router), dim=-1, dtype=torch.float32)
    top, experts = torch.topk(probs, spec.top_k, dim=-1)  # [T, k]
    if spec.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    if fused is not None:
        out = fused(x, w.gate_up, w.down, top, experts, act_mul)
    else:
        out = _experts(x, w, spec, top.to(x.dtype), experts, act_mul)
    if w.shared_gate_up is not None and w.shared_down is not None and w.shared_gate is not None:
        shared = F.linear(act_mul(F.linear(x, w.shared_gate_up)), w.shared_down)
        out = out + torch.sigmoid(F.linear(x, w.shared_gate)) * shared
    return out


def _experts(
    x: torch.Tensor,
    w: MoeWeights,
    spec: MoeSpec,
    top: torch.Tensor,
    experts: torch.Tensor,
    act_mul: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The routed experts' weighted sum, expert by expert (each over all its tokens at once)."""
    out = torch.zeros_like(x)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=spec.num_experts).tolist()
    tokens = order // spec.top_k
    weights = top.reshape(-1)[order]
    start = 0
    for e, n in enumerate(counts):
        if n:
            rows = tokens[start : start + n]
            y = F.linear(act_mul(F.linear(x[rows], w.gate_up[e])), w.down[e])
            out.index_add_(0, rows, y * weights[start : start + n, None])
        start += n
    return out
