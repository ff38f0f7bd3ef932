"""Serving experiments: each module starts its own Baton cluster(s) and drives ``bench.serve``
through the real HTTP API (``python -m bench.experiments.<name> --json OUT``; see
``bench/serve/README.md`` for the commands and what each reports)."""
