"""Kept for users and re-runs of docs/BENCHMARKS.md's experiment (2): when disaggregation pays.

Experiment 2: colocated vs disaggregated serving on the same cores, at rising rates.

Two setups with the same number of workers, cores and torch threads (two workers, one thread
each), the same engine settings and the same open-loop traffic:

- ``colocated``: no prefill pool, two decode workers that each prefill and decode their requests
  (``pools.prefill.workers: 0, pools.decode.workers: 2``);
- ``disaggregated``: one prefill worker and one decode worker (``prefill 1 + decode 1``); a prompt
  shorter than ``pools.local_prefill_threshold`` prefills on the decode worker (conditional
  disaggregation) unless the prefill worker has room for it (``pools.short_prompts_to_idle_prefill``,
  on by default; ``--set pools.short_prompts_to_idle_prefill=false`` turns it off);
  ``--local-prefill-threshold`` changes the threshold for this setup.

The router's SLO-predictive early rejection is off by default (``--admission`` turns it on), so
both setups serve every request and the comparison is of latency and throughput, not of what
each refused (experiment 4 measures admission).

Reported per rate: throughput, TTFT/TPOT/ITL/e2e percentiles, SLO attainment and goodput, and the
disaggregated/colocated ratios of p99 TPOT, p99 ITL and goodput.

    python -m bench.experiments.colocated_vs_disaggregated --json results/exp2.json
    python -m bench.experiments.colocated_vs_disaggregated --json /tmp/exp2.json --model tiny --rates 2,4 --duration 10
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

NAME = "colocated_vs_disaggregated"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0], rates="0.2,0.4,0.6", duration=50.0, workload="sharegpt", admission=False)
    p.add_argument(
        "--local-prefill-threshold",
        type=int,
        default=None,
        help="disaggregated setup: prompts shorter than this prefill on the decode worker (default: the config's, 256)",
    )
    args = p.parse_args(argv)
    rates = parse_rates(args.rates)
    spec = workload(args)
    base = common_overrides(args)
    disagg = {**base, "pools.prefill.workers": 1, "pools.decode.workers": 1}
    if args.local_prefill_threshold is not None:
        disagg["pools.local_prefill_threshold"] = args.local_prefill_threshold
    setups = [
        ServerSetup("colocated", {**base, "pools.prefill.workers": 0, "pools.decode.workers": 2}),
        ServerSetup("disaggregated", disagg),
    ]
    runs = [run_setup(s, spec, rates, args) for s in setups]

    colo, dis = runs
    ratios, rows = [], []
    for rc, rd in zip(colo.reports, dis.reports):
        c, d = rc["summary"], rd["summary"]
        r = {
            "rate": rc["config"]["rate"],
            "tpot_p99_colocated_over_disaggregated": _ratio(c["tpot_s"]["p99"], d["tpot_s"]["p99"]),
            "itl_p99_colocated_over_disaggregated": _ratio(c["itl_s"]["p99"], d["itl_s"]["p99"]),
            "goodput_disaggregated_over_colocated": _ratio(d["goodput_rps"], c["goodput_rps"]),
            "output_tok_s_disaggregated_over_colocated": _ratio(
                d["output_token_throughput"], c["output_token_throughput"]
            ),
        }
        ratios.append(r)
        fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        rows.append(
            [
                f"{r['rate']:g}",
                fmt(r["tpot_p99_colocated_over_disaggregated"]),
                fmt(r["itl_p99_colocated_over_disaggregated"]),
                fmt(r["goodput_disaggregated_over_colocated"]),
                fmt(r["output_tok_s_disaggregated_over_colocated"]),
            ]
        )
    table = (
        markdown_table(RATE_HEADER, rate_rows(runs))
        + "\n\n"
        + markdown_table(
            [
                "offered req/s",
                "p99 TPOT, colocated / disagg.",
                "p99 ITL, colocated / disagg.",
                "goodput, disagg. / colocated",
                "output tok/s, disagg. / colocated",
            ],
            rows,
        )
    )
    write_experiment(
        NAME,
        args,
        {"rates": rates, "duration_s": args.duration, "workload": spec.to_dict(), "model": args.model},
        runs,
        {"by_setup": summaries(runs), "ratios": ratios},
        table,
    )
    write_rate_plots(runs, plots_dir(args))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
