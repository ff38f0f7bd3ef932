"""Kept for users and re-runs of docs/BENCHMARKS.md's experiment (4): what SLO admission buys.

Experiment 4: SLO-predictive admission on vs off under overload.

Two setups, identical but for ``router.slo_rejection`` (the router predicts each request's TTFT
from the work queued ahead and the measured prefill rate, and rejects with 429/503 + Retry-After
when the prediction exceeds the lane's objective):

- ``admission_on``: ``router.slo_rejection: true`` (the default);
- ``admission_off``: ``router.slo_rejection: false`` (only the lane queue bounds remain).

Driven above capacity with interactive traffic. Reported per rate: of the interactive requests
the router *admitted*, the share that met both SLOs (what admission control promises: the work it
accepts is served well); rejections (share and reasons); goodput (requests meeting the SLO per
second: rejecting must not cost goodput); and TTFT of admitted requests.

    python -m bench.experiments.admission --json results/exp4.json
    python -m bench.experiments.admission --json /tmp/exp4.json --model tiny --rates 8,16 --duration 10
"""

from __future__ import annotations

import sys
from typing import Any

from baton.perf.loadgen.records import RequestRecord
from baton.perf.loadgen.slo import LaneSLO, resolve_slos
from baton.perf.loadgen.stats import meets_slo, percentile
from bench.experiments.common import (
    base_parser,
    common_overrides,
    fmt_ms,
    fmt_pct,
    markdown_table,
    parse_rates,
    plots_dir,
    run_setup,
    summaries,
    workload,
    write_experiment,
    write_rate_plots,
)
from bench.experiments.server import ServerSetup

NAME = "admission"


def _record(d: dict[str, Any]) -> RequestRecord:
    """A report's request back as a record (enough of it to score against an SLO)."""
    rec = RequestRecord(
        d["index"],
        d["lane"],
        d["prompt_len"],
        d["output_len"],
        d["arrival_s"],
        d["send_s"],
        status=d["status"],
        output_tokens=d["output_tokens"],
    )
    if d["ttft_s"] is not None:
        rec.first_token_s = d["send_s"] + d["ttft_s"]
    if d["e2e_s"] is not None:
        rec.end_s = d["send_s"] + d["e2e_s"]
    return rec


def admission_stats(report: dict[str, Any], lane: str = "interactive") -> dict[str, Any]:
    """Of ``lane``'s measured requests: admitted (not rejected at admission), the share of those
    meeting both SLOs, rejections by reason, goodput."""
    cfg = report["config"]
    slo = LaneSLO(**cfg["slos"][lane]) if lane in cfg["slos"] else resolve_slos([lane])[lane]
    w0, w1 = cfg["warmup_s"], cfg["duration_s"]
    mine = [r for r in report["requests"] if r["lane"] == lane and w0 <= r["arrival_s"] < w1]
    admitted = [r for r in mine if r["status"] != "rejected"]
    met = [r for r in admitted if meets_slo(_record(r), slo)]
    reasons: dict[str, int] = {}
    for r in mine:
        if r["status"] == "rejected":
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    ttft = [r["ttft_s"] for r in admitted if r["status"] == "ok" and r["ttft_s"] is not None]
    return {
        "requests": len(mine),
        "admitted": len(admitted),
        "rejected": len(mine) - len(admitted),
        "rejected_share": (len(mine) - len(admitted)) / len(mine) if mine else None,
        "admitted_meeting_slo": len(met),
        "admitted_slo_share": len(met) / len(admitted) if admitted else None,
        "slo_attainment_of_all": len(met) / len(mine) if mine else None,
        "goodput_rps": len(met) / (w1 - w0),
        "rejections": reasons,
        "admitted_not_finished": sum(1 for r in admitted if r["status"] != "ok"),
        "admitted_ttft_p50_s": percentile(ttft, 50),
        "admitted_ttft_p99_s": percentile(ttft, 99),
    }


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.split("\n\n")[0], rates="1,2", duration=40.0, workload="sharegpt")
    p.add_argument("--lane", default="interactive", help="the lane whose admitted requests are scored")
    args = p.parse_args(argv)
    rates = parse_rates(args.rates)
    spec = workload(args)
    base = common_overrides(args)
    setups = [
        ServerSetup("admission_on", {**base, "router.slo_rejection": True}),
        ServerSetup("admission_off", {**base, "router.slo_rejection": False}),
    ]
    runs = [run_setup(s, spec, rates, args) for s in setups]

    rows: list[list[str]] = []
    results: dict[str, Any] = {}
    for s in runs:
        results[s.setup.name] = []
        for report in s.reports:
            a = admission_stats(report, args.lane)
            results[s.setup.name].append({"rate": report["config"]["rate"], **a})
            reasons = ", ".join(f"{k}: {v}" for k, v in sorted(a["rejections"].items())) or "-"
            rows.append(
                [
                    s.setup.name,
                    f"{report['config']['rate']:g}",
                    str(a["requests"]),
                    f"{a['rejected']} ({fmt_pct(a['rejected_share'])})",
                    fmt_pct(a["admitted_slo_share"]),
                    f"{a['goodput_rps']:.2f}",
                    f"{fmt_ms(a['admitted_ttft_p50_s'])} / {fmt_ms(a['admitted_ttft_p99_s'])}",
                    str(a["admitted_not_finished"]),
                    reasons,
                ]
            )
    table = markdown_table(
        [
            "setup",
            "offered req/s",
            f"{args.lane} sent",
            "rejected",
            "admitted meeting SLO",
            "goodput req/s",
            "admitted TTFT p50 / p99 ms",
            "admitted, not finished",
            "rejection reasons",
        ],
        rows,
    )
    write_experiment(
        NAME,
        args,
        {
            "rates": rates,
            "duration_s": args.duration,
            "workload": spec.to_dict(),
            "model": args.model,
            "lane": args.lane,
        },
        runs,
        {"admission": results, "by_setup": summaries(runs)},
        table,
    )
    write_rate_plots(runs, plots_dir(args))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
