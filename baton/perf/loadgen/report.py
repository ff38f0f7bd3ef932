"""The JSON report of ``baton bench serve`` and its text summary.

Schema ``baton.bench.serve/1`` (additive changes keep the version; a field's meaning never changes
under it)::

    {
      "schema": "baton.bench.serve/1",
      "created_unix": float,                 # when the (reported) run started
      "config": {url, protocol, metrics_url, mode: "open"|"closed", rate, concurrency, duration_s,
                 warmup_s, burst: {factor, start_s, length_s}|null, seed, timeout_s,
                 workload: {name, lanes, input_len, output_len, prefix_groups, prefix_len, arrival,
                            gamma_shape, streaming, lane_input_len?, lane_output_len?},
                 slos: {lane: {ttft_s, tpot_s}}},
      "server": {model, max_model_len, vocab_size, lanes},
      "wall_s": float, "clipped_prompts": int,
      "summary": Stats,                      # all lanes together
      "lanes": {lane: Stats},
      "timeseries": [{t, in_flight, scraped, waiting: {lane: n}, running: {lane: n},
                      kv_usage: {"role/worker": ratio}, worker_waiting: {...}, worker_running: {...},
                      worker_steps, worker_busy_s, worker_busy_cpu_s: {"role/worker": cumulative},
                      lane_decode_tokens: {lane: cumulative}}],
      "workers": {"role/worker": {steps, busy_s, busy_cpu_s, mean_step_ms, busy_share, cpu_share}},
      "lane_decode_shares": {lane: {decode_tokens, share, share_with_demand, share_with_unmet_demand,
                                    share_while_refused}},  # lane shares on; in the measured window
      "requests": [{index, lane, served_lane, status: "ok"|"rejected"|"error"|"timeout", reason,
                    arrival_s, send_s, prompt_len, output_len, output_tokens, cached_tokens, chunks,
                    ttft_s, tpot_s, e2e_s, http_status, grpc_code, error_type, error_code,
                    error_message}],
      "search": null | {target, goodput_rate, points: [{rate, attainment, passed, summary: Stats,
                                                        lanes: {lane: Stats}}]}
    }

    Stats = {requests, completed, rejected, errors, rejections: {reason: n}, duration_s, elapsed_s,
             offered_rate, request_throughput, output_token_throughput,
             ttft_s|tpot_s|itl_s|e2e_s|client_lag_s: {n, mean, p50, p90, p99, max},
             slo: {ttft_s, tpot_s}|null, slo_met, slo_attainment, goodput_rps}

Times are seconds; ``arrival_s``/``send_s``/``t`` count from the run's start. With ``--search`` the
top-level run (summary, lanes, time series, requests) is the one at the goodput rate (or the last
run when no rate passed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from baton.perf.loadgen.records import RequestRecord
from baton.perf.loadgen.runner import RunResult
from baton.perf.loadgen.search import SearchResult
from baton.perf.loadgen.server_metrics import lane_decode_shares, worker_utilisation
from router.admission import PACE_REFUSAL

SCHEMA = "baton.bench.serve/1"


def refused_send_times(records: Iterable[RequestRecord], for_pace: bool = False) -> dict[str, list[float]]:
    """By lane, when the client sent the requests the server refused (on the run's clock); with
    ``for_pace``, those refused for their lane's pace only (router.admission's ``PACE_REFUSAL``)."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.status == "rejected" and (not for_pace or PACE_REFUSAL in (r.error_message or "")):
            out.setdefault(r.lane, []).append(r.send_s)
    return out


def run_report(result: RunResult, search: SearchResult[RunResult] | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "created_unix": round(result.started_at, 3),
        "config": result.config.to_dict(),
        "server": result.server.to_dict(),
        "wall_s": round(result.wall_s, 3),
        "clipped_prompts": result.clipped_prompts,
        "summary": result.summary().to_dict(),
        "lanes": {lane: s.to_dict() for lane, s in result.lanes().items()},
        "timeseries": [s.to_dict() for s in result.timeseries],
        "workers": worker_utilisation(result.timeseries),
        "lane_decode_shares": lane_decode_shares(
            result.timeseries,
            refused_send_times(result.records, for_pace=True),
            refused_send_times(result.records),
            window=(result.config.warmup_s, result.config.duration_s),
        ),
        "requests": [r.to_dict() for r in result.records],
        "search": None,
    }
    if search is not None:
        report["search"] = {
            "target": search.target,
            "goodput_rate": search.goodput_rate,
            "points": [
                {
                    "rate": p.rate,
                    "attainment": round(p.attainment, 6),
                    "passed": p.passed,
                    "summary": p.result.summary().to_dict(),
                    "lanes": {lane: s.to_dict() for lane, s in p.result.lanes().items()},
                }
                for p in sorted(search.points, key=lambda p: p.rate)
            ],
        }
    return report


def write_json(report: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _ms(d: dict | None, key: str) -> str:
    v = None if d is None else d.get(key)
    return "-" if v is None else f"{v * 1e3:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def format_summary(report: dict[str, Any]) -> str:
    """A markdown table per lane (and overall) of a report."""
    cfg = report["config"]
    load = f"rate {cfg['rate']} req/s" if cfg["mode"] == "open" else f"concurrency {cfg['concurrency']}"
    lines = [
        f"workload {cfg['workload']['name']} over {cfg['protocol']}, {load}, {cfg['duration_s']} s"
        + (
            f", burst x{cfg['burst']['factor']} at {cfg['burst']['start_s']} s for {cfg['burst']['length_s']} s"
            if cfg.get("burst")
            else ""
        ),
        "",
        "| lane | sent | ok | rejected | req/s | out tok/s | TTFT p50/p90/p99 ms | TPOT p50/p99 ms "
        "| ITL p99 ms | e2e p50/p99 ms | SLO met | goodput req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = (
        [*report["lanes"].items(), ("all", report["summary"])]
        if len(report["lanes"]) > 1
        else [*report["lanes"].items()]
    )
    for lane, s in rows:
        att = s.get("slo_attainment")
        lines.append(
            f"| {lane} | {s['requests']} | {s['completed']} | {s['rejected']} | {s['request_throughput']:.2f} | "
            f"{s['output_token_throughput']:.1f} | {_ms(s['ttft_s'], 'p50')}/{_ms(s['ttft_s'], 'p90')}/"
            f"{_ms(s['ttft_s'], 'p99')} | {_ms(s['tpot_s'], 'p50')}/{_ms(s['tpot_s'], 'p99')} | "
            f"{_ms(s['itl_s'], 'p99')} | {_ms(s['e2e_s'], 'p50')}/{_ms(s['e2e_s'], 'p99')} | "
            f"{'-' if att is None else f'{att:.0%}'} | {s['goodput_rps']:.2f} |"
        )
    reasons = report["summary"]["rejections"]
    if reasons:
        lines += ["", "rejections and failures: " + ", ".join(f"{k}: {v}" for k, v in reasons.items())]
    shares = report.get("lane_decode_shares") or {}
    if shares:
        lines += [
            "",
            "decode-token share by lane in the measured window (while it had requests running or waiting; "
            "waiting or refused for pace; waiting or refused): "
            + ", ".join(
                f"{lane} {_pct(v['share'])} ({_pct(v['share_with_demand'])}; {_pct(v.get('share_with_unmet_demand'))}; "
                f"{_pct(v.get('share_while_refused'))})"
                for lane, v in shares.items()
            ),
        ]
    search = report.get("search")
    if search:
        lines += [
            "",
            f"goodput rate (>= {search['target']:.0%} of requests within both SLOs): "
            f"{search['goodput_rate']:.3g} req/s",
            "tested: " + ", ".join(f"{p['rate']:.3g} ({p['attainment']:.0%})" for p in search["points"]),
        ]
    lag = report["summary"].get("client_lag_s") or {}
    if (lag.get("p99") or 0) > 0.05:
        lines += [
            "",
            f"warning: the client sent requests late (lag p99 {lag['p99'] * 1e3:.0f} ms): "
            "the machine running the load generator is overloaded",
        ]
    return "\n".join(lines)
