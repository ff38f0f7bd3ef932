"""Tensor parallelism: one engine's model sharded over a group of ranks (Megatron-style).

``layout`` says which heads, rows and vocabulary a rank holds (pure Python); ``group`` is the
rank group's collectives over ``torch.distributed``; ``local_ranks`` runs ranks 1..N-1 of the
colocated engine as local processes, ``rank_loop`` is what such a rank runs, and ``plan_runner``
is rank 0's runner, which broadcasts each step's plan before running it.
"""
