"""The discrete-event simulator on hand-written cost models: exact timings, queueing, disaggregation,
no leaked blocks, the real scheduler underneath, determinism (fast, no torch)."""

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from baton.perf.profile.step_shape import shape_of_rows
from baton.perf.profile.synthetic import synthetic_cost_model
from baton.perf.sim.config import SimConfig
from baton.perf.sim.requests import RequestRecord, SimRequest
from baton.perf.sim.simulator import SimResult, Simulation, simulate
from router.lanes import LanePolicy, default_lanes

NO_ADMISSION: dict[str, Any] = dict(slo_rejection=False)


def _ttft(r: RequestRecord) -> float:
    assert r.ttft_s is not None, r
    return r.ttft_s


def _finished(r: RequestRecord) -> float:
    assert r.finished_s is not None, r
    return r.finished_s


def _stream(
    n: int,
    rate: float,
    seed: int = 0,
    prompt=(32, 128),
    output=(16, 48),
    long_every: int = 0,
    long_len: int = 1024,
    lane: str = "interactive",
) -> list[SimRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        plen = long_len if long_every and i % long_every == long_every - 1 else rng.randint(*prompt)
        out.append(SimRequest(i, t, lane, plen, rng.randint(*output)))
    return out


def test_single_request_ttft_is_the_predicted_prefill_and_itl_the_decode_step():
    cm = synthetic_cost_model(
        const_s=0.010, per_token_s=0.001, per_sampled_s=0.002, decode_ctx_s=1e-6, prefill_pair_s=1e-7
    )
    res = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1), [SimRequest(0, 1.0, "interactive", 100, 4)])
    rec = res.records[0]
    prefill = cm.step_seconds(shape_of_rows([100], [100], [100], 16))
    assert rec.ttft_s == pytest.approx(prefill, abs=1e-12)
    # each later token: one decode step at a growing context
    gaps = [cm.step_seconds(shape_of_rows([1], [100 + k], [100 + k], 16)) for k in (1, 2, 3)]
    assert rec.itl_s == pytest.approx(gaps, abs=1e-12)
    assert res.summary["summary"]["ttft_s"]["p50"] == pytest.approx(prefill, abs=1e-6)


def test_prefill_steps_scale_apart_from_decode_steps():
    """A CPU's prefill steps (compute-bound) and decode steps (memory-bound) drift apart."""
    cm = synthetic_cost_model(const_s=0.010, per_token_s=0.001, per_sampled_s=0.002)
    req = [SimRequest(0, 1.0, "interactive", 100, 4)]
    base = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1), req).records[0]
    slow_prefill = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1, prefill_step_scale=2.0), req).records[0]
    assert slow_prefill.ttft_s == pytest.approx(2 * _ttft(base), abs=1e-12)
    assert slow_prefill.itl_s == pytest.approx(base.itl_s, abs=1e-12)
    slow_decode = simulate(
        cm, SimConfig(prefill_workers=0, decode_workers=1, step_scale=1.5, prefill_step_scale=1.0), req
    ).records[0]
    assert slow_decode.ttft_s == pytest.approx(base.ttft_s, abs=1e-12)
    assert slow_decode.itl_s == pytest.approx([1.5 * x for x in base.itl_s], abs=1e-12)
    with pytest.raises(ValueError, match="prefill_step_scale must be a finite number > 0"):
        SimConfig(prefill_step_scale=0.0)


def test_chunked_prefill_takes_one_step_per_chunk_plus_overheads():
    cm = synthetic_cost_model(
        const_s=0.010, per_token_s=0.001, prefill_pair_s=1e-7, step_overhead_s=0.001, rpc_s=0.004, output_s=0.003
    )
    cfg = SimConfig(prefill_workers=0, decode_workers=1, decode_max_num_batched_tokens=32)
    rec = simulate(cm, cfg, [SimRequest(0, 0.0, "interactive", 100, 2)]).records[0]
    chunks = [
        cm.step_seconds(shape_of_rows([n], [end], [100], 16)) + 0.001
        for n, end in ((32, 32), (32, 64), (32, 96), (4, 100))
    ]
    # the call reaches the worker after half a round trip; the token reaches the client output_s later
    assert rec.ttft_s == pytest.approx(0.002 + sum(chunks) + 0.003, abs=1e-12)


def test_disaggregated_ttft_adds_the_transfer():
    cm = synthetic_cost_model(
        const_s=0.010, per_token_s=0.001, kv_bytes_per_token=1000, bandwidth_bytes_per_s=1e6, transfer_latency_s=0.005
    )
    cfg = SimConfig(prefill_workers=1, decode_workers=1, local_prefill_threshold=256, **NO_ADMISSION)
    res = simulate(cm, cfg, [SimRequest(0, 0.0, "interactive", 512, 3)])
    rec = res.records[0]
    assert rec.placement == "disaggregated" and res.num_disaggregated == 1
    prefill = cm.step_seconds(shape_of_rows([512], [512], [512], 16))
    transfer = 0.005 + 512 * 1000 / 1e6
    assert rec.ttft_s == pytest.approx(prefill + transfer, abs=1e-9)
    assert res.transfer_bytes == 512 * 1000


def test_queueing_delay_grows_with_the_rate():
    cm = synthetic_cost_model(const_s=0.020, per_token_s=0.0005)
    cfg = SimConfig(prefill_workers=0, decode_workers=1, **NO_ADMISSION)
    means = []
    for rate in (1.0, 4.0, 8.0):
        reqs = _stream(150, rate, prompt=(200, 400), output=(8, 16))
        res = simulate(cm, cfg, reqs)
        assert res.complete
        means.append(res.summary["summary"]["ttft_s"]["mean"])
    assert means[0] < means[1] < means[2]
    assert means[2] > 2 * means[0]


def test_disaggregation_keeps_long_prompts_out_of_decode_steps():
    # Expensive prompts: a 2048-token chunk takes ~2 s; decode steps ~50 ms.
    cm = synthetic_cost_model(const_s=0.040, per_token_s=0.001, prefill_pair_s=2e-8)
    reqs = _stream(120, 2.0, prompt=(16, 64), output=(64, 128), long_every=6, long_len=2048)
    colo = simulate(cm, SimConfig(prefill_workers=0, decode_workers=2, **NO_ADMISSION), reqs)
    dis = simulate(
        cm,
        SimConfig(
            prefill_workers=1,
            decode_workers=1,
            local_prefill_threshold=256,
            short_prompts_to_idle_prefill=False,
            **NO_ADMISSION,
        ),
        reqs,
    )
    assert colo.complete and dis.complete
    assert dis.num_disaggregated == sum(1 for r in reqs if r.prompt_len >= 256)
    c, d = colo.summary["summary"]["itl_s"], dis.summary["summary"]["itl_s"]
    # colocated, a decode step that carries a long chunk stalls every stream on that worker
    assert c["max"] > 1.0 > 3 * d["max"]
    assert c["p99"] > 3 * d["p99"]
    assert c["p50"] == pytest.approx(d["p50"], rel=0.2)  # a plain decode step costs the same in both


@pytest.mark.parametrize("prefill_workers, decode_workers", [(0, 2), (1, 1), (2, 2)])
def test_every_pool_returns_to_full(prefill_workers, decode_workers):
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.0005)
    reqs = _stream(200, 6.0, prompt=(16, 600), output=(4, 64))
    # shared prefixes exercise prefix caching and cache-aware placement
    reqs = [
        replace(r, prefix_group=r.index % 3, prefix_len=256, prompt_len=r.prompt_len + 256) if r.index % 2 else r
        for r in reqs
    ]
    sim = Simulation(
        cm, SimConfig(prefill_workers=prefill_workers, decode_workers=decode_workers, num_kv_blocks=600, **NO_ADMISSION)
    )
    res = sim.run(reqs)
    assert res.complete
    assert all(r.finished_s is not None and len(r.token_times) == r.output_len for r in res.records)
    for w in res.workers:
        assert w.leaked_blocks == 0, w
    for worker in sim.workers:
        s = worker.scheduler
        assert not s.requests and not s.running and not len(s.waiting) and not s.reserved and not s.transferring
    assert sum(r.cached_tokens for r in res.records) > 0  # the shared prefixes hit


def test_the_real_scheduler_preempts_when_the_kv_pool_is_tiny():
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.0005)
    reqs = _stream(30, 20.0, prompt=(100, 120), output=(150, 200))
    sim = Simulation(cm, SimConfig(prefill_workers=0, decode_workers=1, num_kv_blocks=48, **NO_ADMISSION))
    res = sim.run(reqs)
    assert res.complete
    assert res.workers[0].preemptions > 0 == res.workers[0].leaked_blocks
    assert any(r.preemptions for r in res.records)
    # a preempted request is recomputed, and still delivers exactly its tokens once each
    assert all(len(r.token_times) == r.output_len for r in res.records)


def test_admission_rejects_what_cannot_meet_the_ttft_objective():
    cm = synthetic_cost_model(const_s=0.05, per_token_s=0.002)
    reqs = _stream(300, 30.0, prompt=(400, 800), output=(8, 16))
    res = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1, slo_rejection=True), reqs)
    s = res.summary["summary"]
    assert s["rejected"] > 0
    assert set(s["rejections"]) <= {"HTTP 503 slo_predicted_violation", "HTTP 503 queue_full"}
    off = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1, slo_rejection=False), reqs, drain_s=3000)
    assert off.summary["summary"]["rejected"] == 0


def test_lanes_and_priorities_come_from_the_router_policy():
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.0005)
    reqs = [replace(r, lane="batch" if r.index % 3 == 0 else "interactive") for r in _stream(90, 5.0)]
    res = simulate(cm, SimConfig(prefill_workers=0, decode_workers=1, lanes=LanePolicy(default_lanes())), reqs)
    assert set(res.summary["lanes"]) == {"batch", "interactive"}
    assert res.summary["lanes"]["batch"]["requests"] == 30
    with pytest.raises(ValueError):
        SimConfig(decode_workers=0)


def test_the_simulation_is_deterministic():
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.0005)
    reqs = _stream(100, 5.0, prompt=(16, 800), output=(4, 40))
    cfg = SimConfig(prefill_workers=1, decode_workers=2)
    a = json.dumps(simulate(cm, cfg, reqs).to_json(), sort_keys=True)
    b = json.dumps(simulate(cm, cfg, reqs).to_json(), sort_keys=True)
    assert a == b


def test_busy_neighbours_slow_each_other_down():
    reqs = _stream(80, 4.0, prompt=(16, 64), output=(32, 64))
    cfg = SimConfig(prefill_workers=0, decode_workers=2, **NO_ADMISSION)
    alone = simulate(synthetic_cost_model(const_s=0.04, per_token_s=0.001), cfg, reqs)
    shared = simulate(synthetic_cost_model(const_s=0.04, per_token_s=0.001, neighbour_slowdown=0.5), cfg, reqs)
    a, s = alone.summary["summary"]["itl_s"], shared.summary["summary"]["itl_s"]
    assert 1.3 < s["p50"] / a["p50"] < 2.0  # both busy most of the time (and batches grow a little)
    # one worker alone on the host has no neighbour
    one = simulate(
        synthetic_cost_model(const_s=0.04, per_token_s=0.001, neighbour_slowdown=0.5),
        SimConfig(prefill_workers=0, decode_workers=1, **NO_ADMISSION),
        reqs[:1],
    )
    assert one.records[0].itl_s[0] == pytest.approx(0.041)


def test_steps_take_the_typical_not_the_fastest_time():
    cm = synthetic_cost_model(const_s=0.04)
    one = SimConfig(prefill_workers=0, decode_workers=1, **NO_ADMISSION)
    fast = simulate(cm, one, [SimRequest(0, 0.0, "interactive", 16, 3)]).records[0].itl_s
    typical = simulate(replace(cm, typical_over_fastest=1.1), one, [SimRequest(0, 0.0, "interactive", 16, 3)])
    assert typical.records[0].itl_s == pytest.approx([x * 1.1 for x in fast])


def test_the_pace_guard_keeps_batch_work_from_slowing_interactive_streams():
    # every sequence in the batch adds 20 ms to a step: the decode worker slows as batch work piles up
    cm = synthetic_cost_model(const_s=0.04, per_token_s=0.0, per_sampled_s=0.02)
    reqs = []
    for i in range(40):  # 40 s of both lanes: short interactive chats and long batch jobs
        reqs.append(SimRequest(2 * i, 1.0 * i, "interactive", 32, 20))
        reqs.append(SimRequest(2 * i + 1, 1.0 * i + 0.5, "batch", 32, 200))
    lanes = ["interactive", "batch"]

    def run(guard: bool):
        cfg = SimConfig(
            prefill_workers=0,
            decode_workers=1,
            pace_guard=guard,
            lane_priority=False,  # the guard alone
            **NO_ADMISSION,
        )
        return simulate(cm, cfg, reqs, lanes=lanes, drain_s=600.0).summary["lanes"]

    off, on = run(False), run(True)
    assert off["interactive"]["tpot_s"]["p50"] > 0.35  # batch jobs crowd the steps
    assert on["interactive"]["tpot_s"]["p90"] < 0.25  # held in the router instead
    assert on["batch"]["ttft_s"]["p50"] > off["batch"]["ttft_s"]["p50"]  # the batch lane absorbs it
    assert on["batch"]["completed"] == off["batch"]["completed"] == 40  # nothing is lost


def test_the_router_sees_decode_loads_as_the_long_poll_delivers_them():
    # A poll answered by a step's outputs carries the load snapshot taken before that step, and an
    # idle worker's next snapshot only arrives when the poll times out (0.5 s): a request arriving
    # just after another finished still sees that worker busy.
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.001)
    reqs = [
        SimRequest(0, 0.0, "interactive", 32, 4),
        SimRequest(1, 0.2, "interactive", 32, 4),
        SimRequest(2, 1.5, "interactive", 32, 4),
    ]
    res = simulate(cm, SimConfig(prefill_workers=0, decode_workers=2, **NO_ADMISSION), reqs)
    a, b, c = res.records
    assert _finished(a) < 0.2
    assert (a.decode_worker, b.decode_worker, c.decode_worker) == ("decode-1", "decode-0", "decode-1")


def test_the_simulator_and_planner_import_neither_torch_nor_ray():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    code = (
        "import sys, baton.perf.sim.simulator, baton.perf.sim.plan, baton.perf.sim.cli, baton.perf.sim.validate, "
        "baton.commands.plan; print('torch' in sys.modules, 'ray' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_short_prompts_fill_the_prefill_worker_between_long_ones():
    # The same traffic as above: a long prompt every ~3 s keeps the prefill worker busy ~2 s of them.
    cm = synthetic_cost_model(const_s=0.040, per_token_s=0.001, prefill_pair_s=2e-8)
    reqs = _stream(120, 2.0, prompt=(16, 64), output=(64, 128), long_every=6, long_len=2048)
    runs = {
        rule: simulate(
            cm,
            SimConfig(
                prefill_workers=1,
                decode_workers=1,
                local_prefill_threshold=256,
                short_prompts_to_idle_prefill=rule,
                **NO_ADMISSION,
            ),
            reqs,
        )
        for rule in (False, True)
    }
    long_prompts = sum(1 for r in reqs if r.prompt_len >= 256)
    off, on = runs[False], runs[True]
    assert off.complete and on.complete
    # short prompts arriving while it is idle go to the prefill worker; the others stay local
    assert off.num_disaggregated == long_prompts < on.num_disaggregated - 10 and on.num_disaggregated < len(reqs)
    itl_off, itl_on = off.summary["summary"]["itl_s"], on.summary["summary"]["itl_s"]
    assert itl_on["mean"] < itl_off["mean"] and itl_on["p99"] <= itl_off["p99"]


def test_short_prompts_are_not_held_behind_long_ones_waiting_for_the_prefill_pool():
    # Twelve ~1,700-token prompts at once fill the prefill worker's backlog for ~20 s; six short
    # prompts half a second later prefill on the decode worker at once, as the router's real lane
    # queues and capacity credits let them (they used to wait behind the long ones: ~17 s).
    cm = synthetic_cost_model(const_s=0.010, per_token_s=0.001, prefill_pair_s=2e-8)
    reqs = [SimRequest(i, 1.0, "interactive", 1700, 4) for i in range(12)]
    reqs += [SimRequest(12 + i, 1.5, "interactive", 8, 4) for i in range(6)]
    res = simulate(
        cm, SimConfig(prefill_workers=1, decode_workers=1, local_prefill_threshold=256, **NO_ADMISSION), reqs
    )
    assert res.complete
    long_ttft = sorted(_ttft(r) for r in res.records if r.prompt_len >= 256)
    short_ttft = [_ttft(r) for r in res.records if r.prompt_len < 256]
    assert long_ttft[-1] > 15.0  # the long ones queue for the prefill worker, one after another
    assert max(short_ttft) < 0.5


def test_steps_past_the_profiled_range_are_flagged():
    """A simulation predicting 7,000-token prompts from a profile that measured at most ~2,048 tokens
    a step extrapolated silently (prefill attention work 2x the largest measured)."""
    from baton.perf.loadgen.workload import workload_from_dict
    from baton.perf.profile.cost_model import CostModel
    from baton.perf.sim.cli import sim_requests
    from baton.perf.sim.config import SimConfig
    from baton.perf.sim.simulator import Simulation

    # A real CPU profile (SmolLM2 on a Zen 5 host, two cores), kept beside this test: its samples set the range.
    cm = CostModel.load(Path(__file__).resolve().parent / "data" / "cost_model_cpu2c_zen5.json")

    def run(prompt: int) -> SimResult:
        spec = workload_from_dict(
            {
                "lanes": {"batch": 1.0},
                "input_len": {"kind": "fixed", "value": prompt},
                "output_len": {"kind": "fixed", "value": 8},
            }
        )
        reqs = sim_requests(spec, 0.5, 8.0, 0, cm.model.max_model_len)
        return Simulation(cm, SimConfig(prefill_workers=1, decode_workers=1, slo_rejection=False), seed=0).run(
            reqs, duration_s=8.0, drain_s=600.0
        )

    long = run(7000)
    assert long.extrapolated.get("prefill_pairs", 0) > 1.5 and "prefill_pairs" in (long.extrapolation_note() or "")
    assert long.to_json(with_requests=False)["extrapolated"] == long.extrapolated
    assert run(200).extrapolated == {} and run(200).extrapolation_note() is None


def test_lane_priority_gives_interactive_its_decode_share_back_from_running_batch_jobs():
    """The issue-50 situation: long batch jobs already set the decode pace, so admission turns new
    interactive requests away for pace (policy off); with ``lane_priority`` the decode worker preempts
    batch sequences for the interactive lane's pace and admission counts what that frees. The real
    scheduler, lane shares and admission run on the simulated cluster (same code as ``baton up``)."""
    cm = synthetic_cost_model(const_s=0.04, per_token_s=0.0, per_sampled_s=0.02)
    reqs = [SimRequest(i, 0.1 * i, "batch", 32, 300) for i in range(12)]
    reqs += [SimRequest(100 + i, 3.0 + 1.0 * i, "interactive", 32, 20) for i in range(40)]
    lanes = ["interactive", "batch"]

    def run(on: bool):
        cfg = SimConfig(prefill_workers=0, decode_workers=1, pace_guard=False, lane_priority=on)
        sim = simulate(cm, cfg, reqs, lanes=lanes, drain_s=600.0)
        return sim.summary["lanes"], sim

    (off, _), (on, sim_on) = run(False), run(True)
    assert off["interactive"]["completed"] <= 5  # refused for pace: the batch jobs set it
    assert on["interactive"]["completed"] >= 35
    assert on["interactive"]["tpot_s"]["p99"] < 0.25  # admitted, and within the objective
    assert on["batch"]["completed"] == off["batch"]["completed"] == 12  # no batch job starves or is lost
    counters = [w.lane_counters for w in sim_on.workers if w.role == "decode"]
    assert sum(c.pace_preemptions.get(2, 0) for c in counters) > 0


def test_a_decode_worker_beside_a_prefill_pool_caps_its_own_prompt_work_per_step():
    """As ``baton.fleet``: ``pools.decode_prefill_token_budget`` caps a decode worker's local prefills
    and recomputes per step when there is a prefill pool (colocated, its prompts are all it has)."""
    cm = synthetic_cost_model(const_s=0.01, per_token_s=0.001)
    reqs = [SimRequest(i, 0.01 * i, "interactive", 200, 8) for i in range(6)]  # short: prefilled locally
    capped = Simulation(
        cm,
        SimConfig(
            prefill_workers=1,
            decode_workers=1,
            decode_prefill_token_budget=64,
            short_prompts_to_idle_prefill=False,
            **NO_ADMISSION,
        ),
    )
    budgets = {w.role: w.scheduler.config.prefill_token_budget for w in capped.workers}
    assert budgets == {"prefill": None, "decode": 64}
    res = capped.run(reqs)
    assert res.complete and res.num_local == 6
    # 1200 prompt tokens at most 64 a step: at least 19 steps on the decode worker before the last first token
    decode = next(w for w in res.workers if w.role == "decode")
    assert decode.steps >= 1200 // 64 + 8 and decode.max_step_s < 0.01 + 0.001 * (64 + 6) + 0.01
    colocated = Simulation(cm, SimConfig(prefill_workers=0, decode_workers=1, decode_prefill_token_budget=64))
    assert colocated.workers[0].scheduler.config.prefill_token_budget is None


def test_a_preemptible_lane_the_decode_worker_holds_back_waits_in_the_router_not_on_the_prefill_worker(
    monkeypatch, tmp_path
):
    """The issue-50 command (the mixed workload at 3 req/s, a 2x burst) on a measured CPU profile, as
    docs/BENCHMARKS.md runs it: with lane priority the decode worker keeps batch to its floor and
    preempts it for the interactive lane's pace. Batch prompts dispatched meanwhile were computed on
    the prefill worker only to wait there, or to be preempted on arrival and recomputed, while
    interactive prompts queued behind them. Held in the router while the decode worker holds batch
    waiting (router.decode_backlog), the decode worker recomputes less, the prefill worker computes
    more interactive prompts, and more interactive requests are served within both objectives;
    every batch job still completes."""
    from baton.perf.sim import cli
    from baton.perf.sim import router as sim_router

    cost_model = Path(__file__).resolve().parent / "data" / "cost_model_cpu2c_zen5.json"
    out = tmp_path / "run.json"
    args = ["--cost-model", str(cost_model), "--workload", "mixed", "--rate", "3", "--duration", "60"]
    args += ["--warmup", "10", "--burst", "2:40:10", "--host", "2:0.071:1.26", "--seed", "0", "--json", str(out)]
    args += ["--step-scale", "1.92", "--prefill-step-scale", "2.19"]

    def run() -> tuple[dict, dict[str, int]]:
        cli.main(args)
        res = json.loads(out.read_text())["runs"][0]
        return res["lanes"], {w["role"]: w["prompt_tokens_computed"] for w in res["workers"]}

    held, computed_held = run()
    monkeypatch.setattr(sim_router, "backlogged_lanes", lambda *a, **k: {})
    unheld, computed_unheld = run()
    assert computed_held["decode"] < 0.9 * computed_unheld["decode"]  # fewer preempted prompts recomputed
    assert computed_held["prefill"] > computed_unheld["prefill"]  # more interactive prompts admitted
    assert held["interactive"]["slo_met"] >= unheld["interactive"]["slo_met"] + 5
    assert held["interactive"]["slo_met"] >= 0.97 * held["interactive"]["completed"]
    assert held["batch"]["completed"] == unheld["batch"]["completed"] == held["batch"]["requests"]
