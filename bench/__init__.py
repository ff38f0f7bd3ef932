"""Benchmarks that measure what a user or a future change needs, and the prepared GPU checks
(``python3 -m bench.gpu_check``). The product never imports this package; the tools behind
``baton bench``, ``baton plan`` and ``baton profile`` live in ``baton.perf``."""
