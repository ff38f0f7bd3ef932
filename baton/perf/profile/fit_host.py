"""Fit the host model (``host.HostModel``: the rest of the serving stack's CPU demand) from
experiment reports whose runs carry CPU measurements, and write it into a cost-model file.

    python -m baton.perf.profile.fit_host --cost-model cost_model.json --from results/exp1.json [--from ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from baton.perf.profile.cost_model import CostModel, CostModelError
from baton.perf.profile.host import fit_host, samples_from_experiment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baton.perf.profile.fit_host", description=__doc__.split("\n\n")[0])
    p.add_argument("--cost-model", required=True, metavar="FILE", help="the cost model to add the host model to")
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        metavar="REPORT",
        help="an experiment report whose runs carry CPU measurements (repeatable)",
    )
    p.add_argument("--cores", type=int, default=None, help="the host's cores (default: the reports' machine)")
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of over --cost-model")
    args = p.parse_args(argv)
    try:
        cost = CostModel.load(args.cost_model)
        samples, cores = [], args.cores
        for path in args.sources:
            try:
                doc = json.loads(Path(path).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"cannot read {path}: {e}") from None
            samples += samples_from_experiment(doc)
            cores = cores or (doc.get("machine") or {}).get("cpus")
        if not cores:
            raise ValueError("the reports do not say how many cores the host has: pass --cores")
        host = fit_host(samples, int(cores), source=" + ".join(Path(s).name for s in args.sources))
    except (ValueError, CostModelError) as e:
        print(f"python -m baton.perf.profile.fit_host: error: {e}", file=sys.stderr)
        return 2
    replace(cost, host=host).save(args.out or args.cost_model)
    for s in samples:
        pred = host.base_cores * s.wall_s + host.cpu_s_per_token * s.tokens
        print(f"  run: {s.wall_s:6.1f} s, {s.tokens:6d} tokens, host CPU {s.host_cpu_s:6.1f} s, model {pred:6.1f} s")
    print(
        f"host: {host.cores} cores, base {host.base_cores:.3f} cores + {host.cpu_s_per_token * 1e3:.2f} ms CPU "
        f"per output token (from {len(samples)} runs) -> {args.out or args.cost_model}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
