"""Baton's performance tools, part of the product: what ``baton bench``, ``baton plan`` and
``baton profile`` run.

- ``loadgen``: the open-loop serving load generator (``baton bench serve``);
- ``profile``: step-time measurement and the fitted cost model (``baton profile``);
- ``sim``: the discrete-event cluster simulator and the planner's search (``baton plan``);
- ``offline`` (with ``offline_workloads``, ``hf_baselines``, ``work``, ``other_load``): offline
  throughput against static batching and transformers (``baton bench offline``);
- ``interference`` (``interference_workload``), ``kv_transfer_bench`` (``proc_actor``,
  ``random_model``), ``scheduler_overhead``: ``baton bench interference``, ``kv-transfer``,
  ``scheduler``.

These modules drive the engine, workers and router like a client would; nothing in ``engine``,
``router``, ``kv_transfer`` or the workers imports them. One-off experiments and the GPU checks
live in ``bench/``, which the product never imports.
"""
