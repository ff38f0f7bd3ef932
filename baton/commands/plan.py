"""``baton plan``: the cheapest cluster that meets a latency objective, predicted by the simulator.

    baton plan --workload sharegpt --rate 0.4 --slo ttft=2000,tpot=250 --cost-model cost_model.json \
               [--max-workers 4] [--gpu | --cpu] [--duration 60] [--json OUT]

Searches prefill workers P in [0, N-1] and decode workers D in [1, N-P], with the prefill chunk size
and the decode token budget from a small grid, simulating each (``baton.perf.sim``) on the workload at
the rate; prints the cheapest configuration (fewest workers, then highest goodput) where at least
90% of requests meet both objectives, and the best colocated one (P = 0) beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def parse_slo(text: str) -> tuple[float, float]:
    """``ttft=MS,tpot=MS`` -> (ttft seconds, tpot seconds); ValueError naming the bad part."""
    got: dict[str, float] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("ttft", "tpot"):
            raise ValueError(
                f"--slo must be ttft=MS,tpot=MS, got {text!r} ({part.strip()!r} is not KEY=MS with KEY ttft or tpot)"
            )
        if key in got:
            raise ValueError(f"--slo gives {key} twice: {text!r}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--slo: {key} must be a number of milliseconds, got {value.strip()!r}") from None
        if not ms > 0 or ms != ms or ms == float("inf"):
            raise ValueError(f"--slo: {key} must be a positive number of milliseconds, got {value.strip()!r}")
        got[key] = ms / 1e3
    missing = [k for k in ("ttft", "tpot") if k not in got]
    if missing:
        raise ValueError(f"--slo needs both ttft and tpot (missing {', '.join(missing)}), e.g. ttft=2000,tpot=250")
    return got["ttft"], got["tpot"]


def parse_budgets(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated token counts, got {text!r}") from None
    if not vals or any(v < 16 for v in vals):
        raise ValueError(f"{flag} must be token counts >= 16, got {text!r}")
    return vals


def add_parser(sub) -> None:
    from baton.perf.sim.cli import add_sim_args

    p = sub.add_parser(
        "plan", help="the cheapest cluster meeting an SLO, from the simulator", description=__doc__.split("\n\n")[0]
    )
    add_sim_args(p, budgets=False)
    p.add_argument("--rate", required=True, help="offered requests/s")
    p.add_argument("--slo", required=True, metavar="ttft=MS,tpot=MS", help="objectives every request is scored on")
    p.add_argument("--max-workers", type=int, default=4, metavar="N", help="the most workers to consider (default 4)")
    hw = p.add_mutually_exclusive_group()
    hw.add_argument(
        "--gpu",
        dest="hardware",
        action="store_const",
        const="cuda",
        help="plan GPU workers (the cost model must come from a GPU)",
    )
    hw.add_argument(
        "--cpu",
        dest="hardware",
        action="store_const",
        const="cpu",
        help="plan CPU workers (default: the cost model's device)",
    )
    p.add_argument("--target", type=float, default=0.9, help="share of requests that must meet the SLO (default 0.9)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="simulated seconds of arrivals per configuration (default: enough for ~300 requests, 60 to 600 s)",
    )
    p.add_argument(
        "--prefill-chunks", default=None, help="prefill chunk sizes to try (default 512,2048; GPU 2048,8192)"
    )
    p.add_argument("--decode-budgets", default=None, help="decode token budgets to try (default as the chunks)")
    p.add_argument("--verbose", action="store_true", help="print every configuration tried")
    p.add_argument("--json", default=None, metavar="OUT", help="write every configuration's prediction here")
    p.set_defaults(run=run)


def _describe(e, unit: str) -> list[str]:
    c, s = e.config, e.summary

    def trio(d: dict) -> str:
        vals = [d.get(k) for k in ("p50", "p90", "p99")]
        return "/".join("-" if v is None else f"{v * 1e3:.0f}" for v in vals) + " ms"

    if c.colocated:
        what = (
            f"{c.decode_workers} decode {unit}{'s' if c.decode_workers > 1 else ''} (colocated), "
            f"token budget {c.decode_max_num_batched_tokens}"
        )
    else:
        what = (
            f"{c.prefill_workers} prefill + {c.decode_workers} decode {unit}s, prefill chunk "
            f"{c.prefill_max_num_batched_tokens}, decode token budget {c.decode_max_num_batched_tokens}"
        )
    verdict = "meets the SLO" if e.meets else "MISSES the SLO"
    lines = [
        f"{c.num_workers} worker{'s' if c.num_workers > 1 else ''}: {what}",
        f"    predicted goodput {e.goodput_rps:.3g} req/s, {e.attainment:.1%} of requests within the SLO ({verdict})",
        f"    TTFT p50/p90/p99 {trio(s['ttft_s'])}, TPOT {trio(s['tpot_s'])}, ITL {trio(s['itl_s'])}, "
        f"{s['rejected']} rejected",
    ]
    return lines + ([f"    {e.extrapolation}"] if e.extrapolation else [])


def run(args: argparse.Namespace) -> int:
    from baton.perf.loadgen.run_checks import check_request_count
    from baton.perf.loadgen.slo import LaneSLO
    from baton.perf.sim.cli import check_output_file, check_requests_fit, load_inputs, parse_rates, sim_requests
    from baton.perf.sim.plan import CPU_BUDGETS, GPU_BUDGETS, PlanSpace, search

    ttft, tpot = parse_slo(args.slo)
    rates = parse_rates(args.rate)
    if len(rates) != 1:
        raise ValueError(f"--rate must be one number for plan, got {args.rate!r}")
    rate = rates[0]
    if args.max_workers < 1:
        raise ValueError(f"--max-workers must be >= 1, got {args.max_workers}")
    if not 0 < args.target <= 1:
        raise ValueError(f"--target must be in (0, 1], got {args.target}")
    if args.duration is None:
        args.duration = max(60.0, min(600.0, 300.0 / rate))
    if not 0 < args.duration < math.inf:
        raise ValueError(f"--duration must be a finite number > 0, got {args.duration}")
    check_request_count(rate, args.duration)  # the requests are planned in memory, then simulated per configuration
    if args.json:  # before the search, not after it
        check_output_file("--json", args.json)
    cost, spec, base = load_inputs(args)
    hardware = args.hardware or cost.device
    if hardware != cost.device:
        flag = "--gpu" if hardware == "cuda" else "--cpu"
        raise ValueError(
            f"{flag}: the cost model {args.cost_model} was profiled on {cost.device}; run `baton profile` "
            "on the target hardware first"
        )
    default = GPU_BUDGETS if hardware == "cuda" else CPU_BUDGETS
    chunks = parse_budgets(args.prefill_chunks, "--prefill-chunks") if args.prefill_chunks else default
    budgets = parse_budgets(args.decode_budgets, "--decode-budgets") if args.decode_budgets else chunks
    space = PlanSpace(args.max_workers, chunks, budgets)
    unit = "GPU" if hardware == "cuda" else "worker"
    requests = sim_requests(spec, rate, args.duration, args.seed, cost.model.max_model_len)
    if not requests:
        raise ValueError(f"no request arrives in {args.duration:g} s at {rate:g} req/s: raise --duration or --rate")
    check_requests_fit(requests, cost, base, args)
    slo = LaneSLO(ttft, tpot)

    def progress(e) -> None:
        if args.verbose:
            print(
                f"  {e.config.label():45s} {e.attainment:5.0%} within SLO, goodput {e.goodput_rps:.3g} req/s "
                f"({e.wall_s:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    result = search(
        cost,
        requests,
        base=base,
        space=space,
        slo=slo,
        duration_s=args.duration,
        target=args.target,
        seed=args.seed,
        lanes=list(spec.lanes),
        progress=progress,
    )
    print(
        f"baton plan: workload {spec.name} at {rate:g} req/s ({len(requests)} requests over {args.duration:g} s "
        f"simulated), SLO TTFT <= {ttft * 1e3:g} ms and TPOT <= {tpot * 1e3:g} ms for >= {args.target * 100:g}% "
        f"of requests"
    )
    print(
        f"cost model: {cost.model.name} on {cost.device}, {args.cost_model}; a worker is what was profiled: "
        f"{'one GPU' if hardware == 'cuda' else f'one CPU core running {cost.threads or 1} torch thread(s)'}"
    )
    print(
        f"searched {len(result.evaluated)} configurations (up to {args.max_workers} workers, prefill chunk in "
        f"{list(chunks)}, decode budget in {list(budgets)}) in {result.wall_s:.1f} s\n"
    )
    if result.best is not None:
        print("cheapest configuration meeting the SLO:")
        print("\n".join(_describe(result.best, unit)))
    else:
        print(f"no configuration with up to {args.max_workers} workers meets the SLO at {rate:g} req/s")
        print(_why_none(result.evaluated))
    if result.best is not None and result.best is result.best_colocated:
        print("\n(the cheapest configuration is colocated: no prefill pool)")
        dis = result.best_disaggregated
        if dis is not None:
            print("\nbest disaggregated configuration simulated, for comparison:")
            print("\n".join(_describe(dis, unit)))
    else:
        print("\nbest colocated configuration (no prefill pool):")
        print("\n".join(_describe(result.best_colocated, unit)) if result.best_colocated else "  none evaluated")
    if args.json:
        out = {
            "schema": "baton.plan/1",
            "workload": spec.to_dict(),
            "rate": rate,
            "slo": {"ttft_s": ttft, "tpot_s": tpot},
            "target": args.target,
            "duration_s": args.duration,
            "cost_model": str(args.cost_model),
            "best": result.best.config.label() if result.best else None,
            "best_colocated": result.best_colocated.config.label() if result.best_colocated else None,
            "best_disaggregated": (result.best_disaggregated.config.label() if result.best_disaggregated else None),
            "evaluated": [
                {
                    "label": e.config.label(),
                    "prefill_workers": e.config.prefill_workers,
                    "decode_workers": e.config.decode_workers,
                    "prefill_chunk": e.config.prefill_max_num_batched_tokens,
                    "decode_budget": e.config.decode_max_num_batched_tokens,
                    "meets": e.meets,
                    "slo_attainment": e.attainment,
                    "goodput_rps": e.goodput_rps,
                    "summary": e.summary,
                }
                for e in result.evaluated
            ],
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if result.best is not None else 1


def _why_none(evaluated: list) -> str:
    """What the closest configuration says about why none met the SLO: capacity, or the workload or
    the objectives themselves (every request rejected, or none met it even on a quiet worker)."""
    near = max(evaluated, key=lambda e: (e.attainment, e.goodput_rps), default=None)
    if near is None:
        return "(raise --max-workers, lower the rate, or relax the SLO)"
    s = near.summary
    line = (
        f"closest: {near.config.label()}, {near.attainment:.1%} of requests within the SLO, "
        f"{s['rejected']} of {s['requests']} rejected\n"
    )
    if s["requests"] and s["rejected"] == s["requests"]:
        return line + (
            "every request was rejected in every configuration: check that the workload's lanes "
            "exist and that its prompts and outputs fit the model's context"
        )
    if near.attainment == 0:
        return line + (
            "no request met the SLO in any configuration, loaded or not: the objectives may be "
            "below what one request takes on an idle worker (its TTFT and TPOT are below)"
        )
    return line + "(raise --max-workers, lower the rate, or relax the SLO)"
