"""Tensor parallelism: one engine's model sharded over a group of ranks (Megatron-style).

``layout`` says which heads, rows and vocabulary a rank holds (pure Python); ``group`` is the
rank group's collectives over ``torch.distributed``; ``launcher`` is how ranks 1..N-1 start:
``local_ranks`` (the colocated engine's local processes) unless the caller injects another
starter (a pool worker's Ray actors, ``baton/ray_ranks.py``: the engine imports no Ray);
``rank_loop`` is what such a rank runs (every plan rank 0 broadcasts: a step's, or a KV
handoff's from ``direct_kv`` (rank to rank, over a group spanning both workers' ranks) or
``group_kv`` (through rank 0)); ``head_routes`` maps KV heads to the ranks of two groups of any
sizes.
"""
