"""Kept for users and re-runs of docs/BENCHMARKS.md's experiment (1): what continuous batching buys.

Experiment 1: continuous vs static batching through the whole cluster.

Two setups with the same pools (1 prefill + 1 decode worker, the default config) and the same
open-loop traffic at rising rates; they differ only in the workers' scheduling policy:

- ``continuous``: token-budget continuous batching (Baton's default);
- ``static``: the engine's static-batching baseline (``SchedulerConfig(policy="static")``): a
  batch of 16 is admitted only when the previous one has completely finished, and rows that finish
  early keep computing until the batch's longest request ends.

The router's SLO-predictive early rejection is off by default (``--admission`` turns it on), so
both setups serve every request and the comparison is of latency and throughput, not of what
each refused (experiment 4 measures admission).

Reported per rate: completed requests/s, output tokens/s, TTFT/TPOT/e2e percentiles, SLO
attainment and goodput; and the throughput and goodput ratios at each rate.

    python -m bench.experiments.continuous_vs_static --json results/exp1.json
    python -m bench.experiments.continuous_vs_static --json /tmp/exp1.json --model tiny --rates 2,4 --duration 10
"""

from __future__ import annotations

import sys

from bench.experiments.common import (
    RATE_HEADER,
    base_parser,
    common_overrides,
    markdown_table,
    parse_rates,
    plots_dir,
    rate_rows,
    run_setup,
    summaries,
    workload,
    write_experiment,
    write_rate_plots,
)
from bench.experiments.server import ServerSetup

NAME = "continuous_vs_static"


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0], rates="0.2,0.4,0.6", duration=50.0, workload="sharegpt", admission=False)
    p.add_argument("--static-batch-size", type=int, default=16)
    args = p.parse_args(argv)
    rates = parse_rates(args.rates)
    spec = workload(args)
    base = common_overrides(args)
    setups = [ServerSetup("continuous", base), ServerSetup("static", base, static_batch_size=args.static_batch_size)]
    runs = [run_setup(s, spec, rates, args) for s in setups]

    cont, stat = runs
    ratio_rows, ratios = [], []
    for rc, rs in zip(cont.reports, stat.reports):
        c, s = rc["summary"], rs["summary"]
        tok = c["output_token_throughput"] / s["output_token_throughput"] if s["output_token_throughput"] else None
        good = c["goodput_rps"] / s["goodput_rps"] if s["goodput_rps"] else None
        ratios.append({"rate": rc["config"]["rate"], "output_tok_s_ratio": tok, "goodput_ratio": good})
        ratio_rows.append(
            [
                f"{rc['config']['rate']:g}",
                "-" if tok is None else f"{tok:.2f}x",
                "-" if good is None else f"{good:.2f}x (static: {s['goodput_rps']:.2f} req/s)",
            ]
        )
    table = (
        markdown_table(RATE_HEADER, rate_rows(runs))
        + "\n\n"
        + markdown_table(
            ["offered req/s", "output tok/s, continuous / static", "goodput, continuous / static"], ratio_rows
        )
    )
    write_experiment(
        NAME,
        args,
        {
            "rates": rates,
            "duration_s": args.duration,
            "workload": spec.to_dict(),
            "model": args.model,
            "static_batch_size": args.static_batch_size,
        },
        runs,
        {"by_setup": summaries(runs), "ratios": ratios},
        table,
    )
    write_rate_plots(runs, plots_dir(args))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
