"""Baton's model-execution core, shared by both pools.

Torch-free modules (importable by the router): ``errors``, ``sampling_params``, ``request``,
``block_hash``, ``block_manager``, ``scheduler``, ``scheduler_policies``, ``config``, ``outputs``,
``model.config``, ``model.tokenizer`` and ``attention.decode_groups``. Everything else may import torch.
"""
