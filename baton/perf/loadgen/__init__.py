"""``baton bench serve``: an open-loop serving load generator (see ``README.md`` here).

workload (what and when) -> prompts -> clients (HTTP / gRPC) -> records -> stats, report, plots;
``runner`` ties one run together, ``search`` repeats runs to find the goodput rate.
"""
