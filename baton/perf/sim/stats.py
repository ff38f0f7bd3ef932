"""Statistics of a simulated run, computed by the load generator's own code (``baton.perf.loadgen.stats``)
so that simulated and measured numbers mean exactly the same thing: TTFT from arrival to the first
streamed token, TPOT = (e2e - TTFT) / (tokens - 1), ITL = every gap between streamed tokens,
percentiles with linear interpolation, SLO attainment over the requests sent in the measured
window ``[warmup, duration)`` (rejected and unfinished ones count as misses), goodput = requests
meeting their SLO per second of that window."""

from __future__ import annotations

from baton.perf.loadgen.records import UNFINISHED
from baton.perf.loadgen.records import RequestRecord as ServeRecord
from baton.perf.loadgen.slo import LaneSLO, resolve_slos
from baton.perf.loadgen.stats import summarize as serve_summarize
from baton.perf.loadgen.stats import summarize_by_lane
from baton.perf.sim.requests import RequestRecord

# The router's admission errors, as the HTTP frontend answers them.
_HTTP_STATUS = {
    "queue_full": 503,
    "slo_predicted_violation": 503,
    "rate_limit_exceeded": 429,
    "context_length_exceeded": 400,
}


def to_serve_record(r: RequestRecord) -> ServeRecord:
    rec = ServeRecord(
        index=r.index,
        lane=r.lane,
        prompt_len=r.prompt_len,
        output_len=r.output_len,
        arrival_s=r.arrival_s,
        send_s=r.arrival_s,
        served_lane=r.lane,
        cached_tokens=r.cached_tokens,
    )
    if r.rejected is not None:
        rec.status, rec.error_code, rec.http_status = "rejected", r.rejected, _HTTP_STATUS.get(r.rejected, 503)
        return rec
    t = r.token_times
    if t:
        rec.first_token_s = t[0]
        rec.output_tokens = rec.chunks = len(t)
        rec.itl_s = r.itl_s
    if r.finished_s is None:
        rec.status, rec.error_type = "timeout", UNFINISHED
    else:
        rec.end_s = r.finished_s
    return rec


def summarize(
    records: list[RequestRecord],
    *,
    duration_s: float,
    warmup_s: float = 0.0,
    slo: LaneSLO | dict[str, LaneSLO] | None = None,
    lanes: list[str] | None = None,
    rate: float | None = None,
) -> dict:
    """``{"summary": Stats, "lanes": {lane: Stats}}`` as in a ``baton.bench.serve/1`` report.
    ``slo``: one objective for every request (``baton plan``), or per lane; None: the lanes' defaults
    (``baton.perf.loadgen.slo.DEFAULT_SLOS``, i.e. ``baton/default_config.yaml``)."""
    measured = [to_serve_record(r) for r in records if warmup_s <= r.arrival_s < duration_s]
    window = max(duration_s - warmup_s, 1e-9)
    names = sorted(set(lanes or ()) | {r.lane for r in measured})
    if isinstance(slo, LaneSLO):
        slos: dict[str, LaneSLO] = {n: slo for n in names}
        single: LaneSLO | dict[str, LaneSLO] = slo
    else:
        slos = {**resolve_slos(names), **(slo or {})}
        single = slos
    lane_rates = None
    if rate is not None:
        lane_rates = {n: sum(1 for r in measured if r.lane == n) / window for n in names}
    return {
        "summary": serve_summarize(
            measured, single, window, warmup_s, len(measured) / window if rate is not None else None
        ).to_dict(),
        "lanes": {n: s.to_dict() for n, s in summarize_by_lane(measured, slos, window, warmup_s, lane_rates).items()},
    }


def format_summary(s: dict) -> str:
    def ms(d: dict | None, k: str) -> str:
        v = None if d is None else d.get(k)
        return "-" if v is None else f"{v * 1e3:.0f}"

    def trio(d: dict) -> str:
        return f"{ms(d, 'p50')}/{ms(d, 'p90')}/{ms(d, 'p99')}"

    lines = [
        "| lane | sent | ok | rejected | out tok/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms "
        "| ITL p50/p90/p99 ms | e2e p50/p90/p99 ms | SLO met | goodput req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = list(s["lanes"].items()) + ([("all", s["summary"])] if len(s["lanes"]) != 1 else [])
    for lane, x in rows:
        att = x.get("slo_attainment")
        lines.append(
            f"| {lane} | {x['requests']} | {x['completed']} | {x['rejected']} | "
            f"{x['output_token_throughput']:.1f} | {trio(x['ttft_s'])} | {trio(x['tpot_s'])} | "
            f"{trio(x['itl_s'])} | {trio(x['e2e_s'])} | {'-' if att is None else f'{att:.0%}'} | "
            f"{x['goodput_rps']:.2f} |"
        )
    return "\n".join(lines)
