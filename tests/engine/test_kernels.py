"""The kernel seam (engine/kernels.py): one set of kernels per (device, dtype), and the model computes
with the set it is given."""

from __future__ import annotations

import torch

from engine.kernels import kernels_for
from engine.model.linear import ProjectionMode
from engine.model.reference_ops import TorchLayerOps


def test_only_cpu_fp32_gets_compiled_kernels():
    for device, dtype in ((torch.device("cpu"), torch.bfloat16), (torch.device("cuda"), torch.float32)):
        k = kernels_for(device, dtype)
        assert (k.skinny, k.quant, k.amx, k.decode_layers, k.greedy_head) == (None,) * 5
        assert isinstance(k.layer_ops, TorchLayerOps) and k.projection_mode is ProjectionMode.DENSE
    k = kernels_for(torch.device("cpu"), torch.float32)
    assert k.projection_mode in (ProjectionMode.PACKED, ProjectionMode.SKINNY, ProjectionMode.DENSE)
    if k.skinny is None:  # the quantized kernel and the greedy head serve only beside it
        assert k.quant is None and k.greedy_head is None


def test_native_kernels_off_leaves_the_torch_path(monkeypatch):
    monkeypatch.setenv("BATON_NATIVE_KERNELS", "0")
    k = kernels_for(torch.device("cpu"), torch.float32)
    assert (k.skinny, k.quant, k.amx, k.decode_layers, k.greedy_head) == (None,) * 5
    assert isinstance(k.layer_ops, TorchLayerOps)
