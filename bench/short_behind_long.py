"""Short prompts behind a burst of long ones: time to first token of a few short prompts sent just
after N long prompts, against a running server (``baton up``). With one prefill worker the long
prompts queue for it; a short prompt prefills on a decode worker and should not wait for them.

    python -m bench.short_behind_long --url http://127.0.0.1:8000 --long 0,2,12 --json out.json

Run the server with ``router.slo_rejection: false`` (``baton config --print-defaults``), or
admission turns most long prompts away and nothing queues. The long prompts are random words,
new ones every run (``--seed`` repeats them; against the same server they then hit its prefix
cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx

WORDS = ("apple river stone cloud music paper orange window garden silver planet engine yellow bridge forest "
         "winter").split()


async def _ttft(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> float | None:
    """Seconds to the first streamed chunk; None if the server refused the request."""
    start = time.perf_counter()
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            return None
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                return time.perf_counter() - start
    return None


async def burst(url: str, n_long: int, n_short: int, long_words: int, delay_s: float, rng: random.Random) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        longs = [asyncio.create_task(_ttft(client, url, " ".join(rng.choice(WORDS) for _ in range(long_words)), 4))
                 for _ in range(n_long)]
        await asyncio.sleep(delay_s)
        shorts = await asyncio.gather(*[_ttft(client, url, f"Hi {i}", 4) for i in range(n_short)])
        long_ttft = await asyncio.gather(*longs)
    done = [s for s in shorts if s is not None]
    return {"long": n_long, "short_ttft_s": shorts, "long_ttft_s": long_ttft,
            "short_ttft_p50_s": statistics.median(done) if done else None,
            "short_ttft_max_s": max(done) if done else None,
            "refused": sum(x is None for x in shorts + long_ttft)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server: http://HOST:PORT")
    p.add_argument("--long", default="0,2,12", help="comma-separated burst sizes (long prompts), one run each")
    p.add_argument("--short", type=int, default=6, help="short prompts per run")
    p.add_argument("--long-words", type=int, default=1500, help="words per long prompt (~1,700 tokens)")
    p.add_argument("--delay", type=float, default=0.5, help="seconds between the long burst and the short prompts")
    p.add_argument("--seed", type=int, default=None, help="seed of the long prompts (default: new ones)")
    p.add_argument("--json", default=None, help="write the runs here")
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.long.split(",") if x.strip()]
    except ValueError:
        p.error(f"--long must be comma-separated integers, got {args.long!r}")
    if not sizes or min(sizes) < 0 or args.short < 1 or args.long_words < 1 or args.delay < 0:
        p.error("--long sizes must be >= 0, --short and --long-words >= 1, --delay >= 0")
    runs = []
    rng = random.Random(args.seed)
    for n in sizes:
        run = asyncio.run(burst(args.url.rstrip("/"), n, args.short, args.long_words, args.delay, rng))
        runs.append(run)
        fmt = lambda v: "-" if v is None else f"{v * 1e3:.0f}"  # noqa: E731
        print(f"{n:3d} long: short TTFT ms {[fmt(s) for s in run['short_ttft_s']]}, "
              f"long TTFT s {[None if s is None else round(s, 1) for s in run['long_ttft_s']]}, "
              f"refused {run['refused']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "command": " ".join(sys.argv), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
