"""``python -m baton.perf.sim``: simulate a cluster on a workload at one or more rates.

    python -m baton.perf.sim --cost-model cost_model.json --workload sharegpt --rate 0.2,0.4,0.6 --duration 50 \
        --prefill-workers 1 --decode-workers 1 [--max-num-batched-tokens N] [--json OUT]

Prints per-lane TTFT/TPOT/ITL/e2e p50/p90/p99, SLO attainment and goodput for each rate; ``--json``
writes ``baton.sim/1``: the inputs, and per rate the load generator's summary shape
(``summary``, ``lanes``), the workers (steps, busy time, preemptions, leaked blocks) and every
request (TTFT, TPOT, ITL list, e2e, placement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

SCHEMA = "baton.sim/1"


def add_sim_args(p: argparse.ArgumentParser, budgets: bool = True) -> None:
    """The flags shared by ``python -m baton.perf.sim`` and ``baton plan`` (which searches the budgets)."""
    p.add_argument("--cost-model", required=True, metavar="FILE", help="from `baton profile`")
    p.add_argument(
        "--workload", default="sharegpt", help="a builtin workload (sharegpt, mixed, ...) or a YAML/JSON file"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a baton config (pools, engine, lanes, router) to simulate; flags below override it",
    )
    if budgets:
        p.add_argument(
            "--max-num-batched-tokens",
            type=int,
            default=None,
            help="token budget per step of every worker (the prefill chunk size)",
        )
        p.add_argument(
            "--prefill-chunk",
            type=int,
            default=None,
            help="the prefill pool's token budget, when it differs from the decode pool's",
        )
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per worker (default: the cost model's pool)")
    p.add_argument("--local-prefill-threshold", type=int, default=None)
    p.add_argument(
        "--admission",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the router's SLO-predictive rejection (default: on, as in baton/default_config.yaml)",
    )
    p.add_argument(
        "--lane-priority",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode slots shared by lane weight, preemption for pace (router.lane_priority; default: on)",
    )
    p.add_argument(
        "--step-scale",
        type=float,
        default=1.0,
        help="multiply every predicted step time (e.g. a speed probe's decode ratio: the machine now)",
    )
    p.add_argument(
        "--prefill-step-scale",
        type=float,
        default=None,
        help="multiply steps that compute prompt tokens instead (a speed probe's prefill ratio; default: --step-scale)",
    )
    p.add_argument(
        "--host",
        default=None,
        metavar="CORES:BASE_CORES:CPU_MS_PER_TOKEN",
        help="the rest of the stack's CPU on the workers' host (baton.perf.profile.host), over the cost model's",
    )


def parse_host(text: str):
    """``CORES:BASE_CORES:CPU_MS_PER_TOKEN`` as a ``HostModel`` (ValueError naming the flag)."""
    from baton.perf.profile.host import HostModel

    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError("three fields")
        return HostModel(int(parts[0]), float(parts[1]), float(parts[2]) / 1e3, source="--host")
    except ValueError as e:
        raise ValueError(
            f"--host must be CORES:BASE_CORES:CPU_MS_PER_TOKEN (e.g. 2:0.071:1.26), got {text!r}: {e}"
        ) from e


def positive_float(name: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if not 0 < v < math.inf:  # inf would plan every arrival at t=0, forever (NaN fails too)
        raise ValueError(f"{name} must be a finite number > 0, got {text!r}")
    return v


def check_output_file(flag: str, path: str) -> None:
    """Fail before a long run, not after it, when ``path`` cannot be written."""
    p = Path(path)
    parent = p.resolve().parent
    if p.is_dir():
        raise ValueError(f"{flag} {path}: is a directory, not a file")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")


def parse_rates(text: str) -> list[float]:
    parts = [x.strip() for x in str(text).split(",") if x.strip()]
    if not parts:
        raise ValueError(f"--rate must be a number or a comma-separated list, got {text!r}")
    return [positive_float("--rate", x) for x in parts]


def load_inputs(args: argparse.Namespace):
    """(cost model, workload spec, base SimConfig) from the shared flags; ValueError on bad input."""
    from baton.perf.loadgen.workload import load_workload
    from baton.perf.profile.cost_model import CostModel
    from baton.perf.sim.config import SimConfig, sim_config_from_baton

    cost = CostModel.load(args.cost_model)
    spec = load_workload(args.workload)
    if args.config:
        from baton.config import load_config

        base = sim_config_from_baton(load_config(args.config), cost)
    else:
        base = SimConfig()
    _check_pool_flags(args, cost, base)
    changes = {}
    budget = getattr(args, "max_num_batched_tokens", None)
    if budget is not None:
        changes["prefill_max_num_batched_tokens"] = changes["decode_max_num_batched_tokens"] = budget
    if getattr(args, "prefill_chunk", None) is not None:
        changes["prefill_max_num_batched_tokens"] = args.prefill_chunk
    for flag, field in (
        ("max_num_seqs", "max_num_seqs"),
        ("kv_blocks", "num_kv_blocks"),
        ("local_prefill_threshold", "local_prefill_threshold"),
        ("admission", "slo_rejection"),
        ("lane_priority", "lane_priority"),
    ):
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    changes["step_scale"] = args.step_scale
    if getattr(args, "prefill_step_scale", None) is not None:
        changes["prefill_step_scale"] = args.prefill_step_scale
    if getattr(args, "host", None):
        cost = dataclasses.replace(cost, host=parse_host(args.host))
    known = {lane.name for lane in base.lanes.lanes}
    unknown = sorted({lane for lane, share in spec.lanes.items() if share > 0} - known)  # (a 0 share sends none)
    if unknown:  # every such request is rejected, and the search blamed capacity
        raise ValueError(
            f"workload {spec.name}: lane(s) {', '.join(unknown)} are not lanes of the simulated router "
            f"({', '.join(sorted(known))})"
        )
    return cost, spec, replace(base, **changes)


def _check_pool_flags(args: argparse.Namespace, cost, base) -> None:
    """The worker flags, named (SimConfig's own errors name its fields, not the flags)."""
    from engine.config import MAX_NUM_SEQS

    for flag, name, lo, hi in (
        ("--max-num-batched-tokens", "max_num_batched_tokens", 1, None),
        ("--prefill-chunk", "prefill_chunk", 1, None),
        ("--max-num-seqs", "max_num_seqs", 1, MAX_NUM_SEQS),
        ("--kv-blocks", "kv_blocks", 1, None),
        ("--local-prefill-threshold", "local_prefill_threshold", 0, None),
    ):
        v = getattr(args, name, None)
        if v is not None and (v < lo or (hi is not None and v > hi)):
            raise ValueError(f"{flag} must be {f'between {lo} and {hi}' if hi else f'>= {lo}'}, got {v}")
    if not 0 < args.step_scale < math.inf:
        raise ValueError(f"--step-scale must be a finite number > 0, got {args.step_scale}")
    if getattr(args, "kv_blocks", None) is not None:
        m = cost.model
        seqs = args.max_num_seqs if args.max_num_seqs is not None else base.max_num_seqs
        useful = seqs * -(-m.max_model_len // m.block_size)  # every sequence at the model's full context
        if args.kv_blocks > max(useful, m.num_kv_blocks):  # (each block is an object per worker: memory)
            raise ValueError(
                f"--kv-blocks must be at most {max(useful, m.num_kv_blocks)} ({seqs} sequences of "
                f"{m.max_model_len} tokens, in blocks of {m.block_size}), got {args.kv_blocks}"
            )


def check_requests_fit(requests, cost, cfg, args: argparse.Namespace) -> None:
    """Every request's whole sequence must fit one worker's KV pool. Checked here, before the
    simulation, so that the error names --kv-blocks: the simulated engine's own refusal (a request that
    could never finish) names max_tokens, a parameter these commands do not have."""
    if not requests:
        return
    m = cost.model
    blocks = cfg.num_kv_blocks or m.num_kv_blocks
    if not blocks:
        return  # (the simulator says so itself)
    big = max(requests, key=lambda r: min(r.prompt_len + r.output_len, m.max_model_len))
    tokens = min(big.prompt_len + big.output_len, m.max_model_len)
    need = -(-tokens // m.block_size)
    if need > blocks:
        if getattr(args, "kv_blocks", None) is not None:
            where = f"--kv-blocks {args.kv_blocks}"
        elif cfg.num_kv_blocks:
            where = f"the KV pool of --config {args.config} ({blocks} blocks)"
        else:
            where = f"the cost model's KV pool ({blocks} blocks)"
        raise ValueError(
            f"{where} is too small for the workload: its longest request ({big.prompt_len} prompt + "
            f"{big.output_len} output tokens) needs {need} KV blocks of {m.block_size} tokens; "
            f"raise --kv-blocks to at least {need}"
        )


def sim_requests(spec, rate: float, duration_s: float, seed: int, max_model_len: int, burst=None):
    from baton.perf.loadgen.arrivals import plan_requests
    from baton.perf.loadgen.prompts import clip_prompt_len
    from baton.perf.sim.requests import SimRequest

    # Clipped as the load generator clips them, so that both send the same requests.
    return [
        SimRequest(
            p.index,
            p.arrival_s,
            p.lane,
            clip_prompt_len(p, max_model_len),
            p.output_len,
            p.prefix_group,
            spec.prefix_len if p.prefix_group is not None else 0,
            spec.streaming,
        )
        for p in plan_requests(spec, rate, duration_s, seed=seed, burst=burst)
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m baton.perf.sim", description=__doc__.split("\n\n")[0])
    add_sim_args(p)
    p.add_argument("--rate", required=True, help="offered requests/s; a comma-separated list runs each")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (default 60)")
    p.add_argument("--warmup", type=float, default=0.0, help="arrivals in the first S seconds are not measured")
    p.add_argument(
        "--drain",
        type=float,
        default=300.0,
        help="simulated seconds after the last arrival before unfinished requests count as timeouts",
    )
    p.add_argument("--burst", default=None, metavar="FACTOR:START:LEN")
    p.add_argument("--prefill-workers", type=int, default=None)
    p.add_argument("--decode-workers", type=int, default=None)
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="LANE:ttft=MS,tpot=MS",
        help="override a lane's objectives for scoring (as `baton bench serve --slo`)",
    )
    p.add_argument("--json", default=None, metavar="OUT")
    p.add_argument("--no-requests", action="store_true", help="leave the per-request records out of the JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from baton.perf.loadgen.arrivals import Burst
    from baton.perf.loadgen.run_checks import check_request_count
    from baton.perf.loadgen.slo import resolve_slos
    from baton.perf.sim.simulator import Simulation
    from baton.perf.sim.stats import format_summary

    rates = parse_rates(args.rate)
    if not 0 < args.duration < math.inf:
        raise ValueError(f"--duration must be a finite number > 0, got {args.duration}")
    if not 0 <= args.warmup < args.duration:
        raise ValueError(f"--warmup must be in [0, duration), got {args.warmup}")
    if not 0 <= args.drain < math.inf:  # a negative drain ends the simulation before the last arrivals
        raise ValueError(f"--drain must be a finite number >= 0, got {args.drain}")
    burst = Burst.parse(args.burst) if args.burst else None
    for rate in rates:  # before any simulation: a plan is built in memory
        check_request_count(rate, args.duration, burst)
    if args.json:
        check_output_file("--json", args.json)
    cost, spec, cfg = load_inputs(args)
    changes = {}
    if args.prefill_workers is not None:
        changes["prefill_workers"] = args.prefill_workers
    if args.decode_workers is not None:
        changes["decode_workers"] = args.decode_workers
    cfg = replace(cfg, **changes)
    slos = resolve_slos(tuple(spec.lanes), args.slo)
    runs = []
    for rate in rates:
        reqs = sim_requests(spec, rate, args.duration, args.seed, cost.model.max_model_len, burst)
        check_requests_fit(reqs, cost, cfg, args)
        res = Simulation(cost, cfg, seed=args.seed).run(
            reqs,
            duration_s=args.duration,
            rate=rate,
            drain_s=args.drain,
            warmup_s=args.warmup,
            lanes=list(spec.lanes),
            slo=slos,
        )
        busy = ", ".join(f"{w.worker_id} {w.busy_s / max(res.end_s, 1e-9):.0%} busy" for w in res.workers)
        print(
            f"\n{cfg.label()}, {spec.name} at {rate:g} req/s for {args.duration:g} s "
            f"(simulated to {res.end_s:.1f} s; {busy}; {res.num_local} local / {res.num_disaggregated} "
            f"disaggregated prefills)"
        )
        print(format_summary(res.summary))
        if res.extrapolation_note():
            print(res.extrapolation_note())
        runs.append(res.to_json(with_requests=not args.no_requests))
    if args.json:
        out = {
            "schema": SCHEMA,
            "cost_model": str(args.cost_model),
            "workload": spec.to_dict(),
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "seed": args.seed,
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as e:  # CostModelError, workload and config errors: one line, no traceback
        print(f"python -m baton.perf.sim: error: {e}", file=sys.stderr)
        return 2
