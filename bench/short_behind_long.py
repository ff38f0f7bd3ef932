"""Kept for placement changes: TTFT of short prompts sent behind long ones to a running server.

Short prompts behind a burst of long ones: time to first token of a few short prompts sent just
after N long prompts, against a running server (``baton up``). With one prefill worker the long
prompts queue for it; a short prompt prefills on a decode worker and should not wait for them.

    python -m bench.short_behind_long --url http://127.0.0.1:8000 --long 0,2,12 --json out.json

Run the server with ``router.slo_rejection: false`` (``baton config --print-defaults``), or
admission turns most long prompts away and nothing queues. Requests go through the load
generator's HTTP client (``baton.perf.loadgen.http_client``: token-id prompts of exact lengths, streamed,
interactive lane); the long prompts are random ids, new ones every run (``--seed`` repeats them;
against the same server they then hit its prefix cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

from baton.perf.loadgen.http_client import HttpClient
from baton.perf.loadgen.outgoing import Outgoing
from baton.perf.loadgen.prompts import DEFAULT_TOKEN_RANGE


async def burst(url: str, n_long: int, n_short: int, long_tokens: int, delay_s: float, rng: random.Random) -> dict:
    client = HttpClient(url)
    start = time.monotonic()
    clock = lambda: time.monotonic() - start  # noqa: E731

    def request(index: int, n_tokens: int) -> Outgoing:
        ids = tuple(rng.randrange(*DEFAULT_TOKEN_RANGE) for _ in range(n_tokens))
        return Outgoing(index, "interactive", ids, max_tokens=4, arrival_s=clock())

    try:
        longs = [asyncio.create_task(client.send(request(i, long_tokens), clock)) for i in range(n_long)]
        await asyncio.sleep(delay_s)
        shorts = await asyncio.gather(*[client.send(request(n_long + i, 8), clock) for i in range(n_short)])
        long_records = await asyncio.gather(*longs)
    finally:
        await client.aclose()
    short_ttft = [r.ttft_s for r in shorts]
    done = [s for s in short_ttft if s is not None]
    return {
        "long": n_long,
        "short_ttft_s": short_ttft,
        "long_ttft_s": [r.ttft_s for r in long_records],
        "short_ttft_p50_s": statistics.median(done) if done else None,
        "short_ttft_max_s": max(done) if done else None,
        "refused": sum(r.status != "ok" for r in shorts + long_records),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server: http://HOST:PORT")
    p.add_argument("--long", default="0,2,12", help="comma-separated burst sizes (long prompts), one run each")
    p.add_argument("--short", type=int, default=6, help="short prompts (8 tokens) per run")
    p.add_argument("--long-tokens", type=int, default=1700, help="tokens per long prompt")
    p.add_argument("--delay", type=float, default=0.5, help="seconds between the long burst and the short prompts")
    p.add_argument("--seed", type=int, default=None, help="seed of the prompts (default: new ones)")
    p.add_argument("--json", default=None, help="write the runs here")
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.long.split(",") if x.strip()]
    except ValueError:
        p.error(f"--long must be comma-separated integers, got {args.long!r}")
    if not sizes or min(sizes) < 0 or args.short < 1 or args.long_tokens < 1 or args.delay < 0:
        p.error("--long sizes must be >= 0, --short and --long-tokens >= 1, --delay >= 0")
    runs = []
    rng = random.Random(args.seed)
    for n in sizes:
        run = asyncio.run(burst(args.url.rstrip("/"), n, args.short, args.long_tokens, args.delay, rng))
        runs.append(run)
        fmt = lambda v: "-" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
        print(
            f"{n:3d} long: short TTFT ms {[fmt(s) for s in run['short_ttft_s']]}, "
            f"long TTFT s {[None if s is None else round(s, 1) for s in run['long_ttft_s']]}, "
            f"refused {run['refused']}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "command": " ".join(sys.argv), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
