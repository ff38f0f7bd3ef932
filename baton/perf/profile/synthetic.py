"""Cost models written by hand rather than measured: for tests, for what-if planning ("what if a
step cost half as much?"), and for reasoning about the simulator with round numbers."""

from __future__ import annotations

from baton.perf.profile.cost_model import CostModel, ModelGeometry, Overheads, TransferModel
from baton.perf.profile.host import HostModel


def synthetic_cost_model(
    *,
    const_s: float = 0.010,
    multi_token_s: float = 0.0,
    per_token_s: float = 0.001,
    per_sampled_s: float = 0.0,
    decode_ctx_s: float = 0.0,
    prefill_pair_s: float = 0.0,
    num_kv_blocks: int = 4096,
    block_size: int = 16,
    max_model_len: int = 4096,
    vocab_size: int = 1000,
    kv_bytes_per_token: int = 46080,
    bandwidth_bytes_per_s: float = 0.65e9,
    transfer_latency_s: float = 0.005,
    step_overhead_s: float = 0.0,
    rpc_s: float = 0.0,
    output_s: float = 0.0,
    neighbour_slowdown: float = 0.0,
    device: str = "cpu",
    host: HostModel | None = None,
) -> CostModel:
    return CostModel(
        device=device,
        threads=1,
        model=ModelGeometry(
            spec="synthetic",
            name="synthetic",
            architecture="LlamaForCausalLM",
            num_layers=1,
            vocab_size=vocab_size,
            max_model_len=max_model_len,
            dtype="float32",
            kv_bytes_per_token=kv_bytes_per_token,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
        ),
        coefficients={
            "const": const_s,
            "multi_token": multi_token_s,
            "tokens": per_token_s,
            "sampled": per_sampled_s,
            "decode_ctx_padded": decode_ctx_s,
            "decode_ctx_sum": 0.0,
            "prefill_pairs": prefill_pair_s,
        },
        transfer=TransferModel(bandwidth_bytes_per_s, transfer_latency_s, "synthetic"),
        overheads=Overheads(step_overhead_s, rpc_s, output_s, "synthetic"),
        created="synthetic",
        neighbour_slowdown=neighbour_slowdown,
        host=host,
    )
