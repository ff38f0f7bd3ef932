"""The offline benchmark's small version: it completes and reports every key (all four systems)."""

from baton.perf.offline import run_offline

KEYS = {"baton_cb_tok_s", "baton_static_tok_s", "hf_cb_tok_s", "hf_static_tok_s", "kv_waste"}


def test_small_offline_bench_reports_all_systems(tiny_model_dir):
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=6)
    assert r.keys() >= KEYS
    for k in KEYS - {"kv_waste"}:
        assert r[k] > 0
    assert 0 <= r["kv_waste"] < 1
    assert r["num_requests"] == 6
    # Greedy, EOS ignored: every system must produce the same tokens for every request.
    assert r["requests_identical_across_systems"] == 6
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "hf-cb", "hf-static"}
    machine = r["machine"]  # both sides on the same device and dtype, and the JSON says which
    assert (
        (machine["baton_device"], machine["baton_dtype"])
        == (machine["hf_device"], machine["hf_dtype"])
        == ("cpu", "float32")
    )


def test_baton_is_pinned_to_the_baselines_cpu_fp32_even_on_a_cuda_host(tiny_model_dir, monkeypatch):
    import torch

    import baton.perf.offline as offline
    from engine.model_loader import pick_device, pick_dtype

    seen = []
    real = offline.run_baton
    monkeypatch.setattr(offline, "run_baton", lambda cfg, reqs, name: seen.append(cfg) or real(cfg, reqs, name))
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=2, include_hf=False)
    assert {(c.device, c.dtype) for c in seen} == {("cpu", "float32")}  # was ("auto", "auto"): bf16 on a GPU
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        device = pick_device(seen[0].device)
        assert (device.type, pick_dtype(seen[0].dtype, device)) == ("cpu", torch.float32)
    assert {k: r["machine"][k] for k in ("baton_device", "baton_dtype", "hf_device", "hf_dtype")} == {
        "baton_device": "cpu",
        "baton_dtype": "float32",
        "hf_device": None,
        "hf_dtype": None,
    }


def test_repeated_rounds_report_each_systems_median_run(tiny_model_dir):
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=4, include_hf=False, repeat=3)
    assert r["repeat"] == 3 and set(r["runs_tok_s"]) == {"baton-cb", "baton-static"}
    for name, key in (("baton-cb", "baton_cb_tok_s"), ("baton-static", "baton_static_tok_s")):
        runs = r["runs_tok_s"][name]
        assert len(runs) == 3 and r[key] == sorted(runs)[1]  # the median of three is one of the runs
    assert r["requests_identical_across_systems"] == 4  # every run of every system


def test_repeat_must_be_positive():
    import pytest

    with pytest.raises(ValueError, match="repeat must be at least 1"):
        run_offline("anyscale-cpu-small", model="tiny", repeat=0)


def test_the_torch_path_baseline_is_the_same_engine_without_native_kernels(tiny_model_dir, monkeypatch):
    import os

    from engine.native import build

    monkeypatch.delenv(build.DISABLE_ENV, raising=False)
    seen: list[bool] = []
    real = build.native_kernels_enabled
    monkeypatch.setattr(build, "native_kernels_enabled", lambda: seen.append(real()) or seen[-1])
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=4, include_hf=False, torch_path_baseline=True)
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "baton-cb-torch-path"}
    assert r["baton_cb_torch_path_tok_s"] > 0 and r["baton_cb_over_torch_path"] > 0
    assert r["requests_identical_across_systems"] == 4  # same tokens with and without the kernels
    assert True in seen and False in seen  # both arms asked, and the baseline was refused the kernels
    assert build.DISABLE_ENV not in os.environ  # restored afterwards


def test_the_speculative_arms_run_beside_the_plain_ones_with_the_same_tokens(tiny_model_dir):
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=4, include_hf=False, speculative_tokens=3)
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "baton-cb-spec", "baton-static-spec"}
    assert r["speculative_tokens"] == 3
    assert r["baton_cb_spec_tok_s"] > 0 and r["baton_static_spec_tok_s"] > 0
    assert r["baton_cb_spec_over_cb"] > 0 and r["baton_cb_spec_over_static_spec"] > 0
    assert all(0 <= f <= 1 for f in r["spec_kept_fraction"].values())
    assert r["details"]["baton-cb-spec"]["drafts"] > 0 and r["details"]["baton-cb"]["drafts"] == 0
    assert r["requests_identical_across_systems"] == 4  # drafts change the steps, not the tokens


def test_the_greedy_head_baseline_runs_both_modes_with_every_logit(tiny_model_dir, monkeypatch):
    from baton.perf import offline
    from engine.engine import LLMEngine

    enabled: list[bool] = []
    real_step = LLMEngine.step
    monkeypatch.setattr(
        LLMEngine,
        "step",
        lambda self: enabled.append(self.runner.model.kernels.greedy_head is not None) or real_step(self),
    )
    r = offline.run_offline(
        "anyscale-cpu-small", model=str(tiny_model_dir), n=4, include_hf=False, greedy_head_baseline=True
    )
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "baton-cb-every-logit", "baton-static-every-logit"}
    assert r["baton_cb_every_logit_tok_s"] > 0 and r["baton_cb_over_every_logit"] > 0
    assert r["baton_static_over_every_logit"] > 0 and r["baton_cb_over_static_every_logit"] > 0
    assert r["requests_identical_across_systems"] == 4
    assert True in enabled and False in enabled  # the baselines really switched it off


def test_the_amx_baseline_runs_both_modes_off_amx(tiny_model_dir, monkeypatch):
    from baton.perf import offline
    from engine.engine import LLMEngine

    enabled: list[bool] = []
    real_step = LLMEngine.step
    monkeypatch.setattr(
        LLMEngine, "step", lambda self: enabled.append(self.runner.model.kernels.amx is not None) or real_step(self)
    )
    r = offline.run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=4, include_hf=False, amx_baseline=True)
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "baton-cb-no-amx", "baton-static-no-amx"}
    assert r["baton_cb_no_amx_tok_s"] > 0 and r["baton_cb_over_no_amx"] > 0 and r["baton_cb_over_static_no_amx"] > 0
    assert r["requests_identical_across_systems"] == 4
    assert False in enabled  # the baselines run off AMX (on a CPU with it, the others on it)
