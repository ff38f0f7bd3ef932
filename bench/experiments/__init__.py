"""Serving experiments: each module starts its own Baton cluster(s) and drives ``baton.perf.loadgen``
through the real HTTP API (``python -m bench.experiments.<name> --json OUT``; see
``baton/perf/loadgen/README.md`` for the commands and what each reports)."""
