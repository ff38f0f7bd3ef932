"""The offline benchmark's small version: it completes and reports every key (all four systems)."""

from bench.offline import run_offline

KEYS = {"baton_cb_tok_s", "baton_static_tok_s", "hf_cb_tok_s", "hf_static_tok_s", "kv_waste"}


def test_small_offline_bench_reports_all_systems(tiny_model_dir):
    r = run_offline("anyscale-cpu-small", model=str(tiny_model_dir), n=6)
    assert KEYS <= r.keys()
    for k in KEYS - {"kv_waste"}:
        assert r[k] > 0
    assert 0 <= r["kv_waste"] < 1
    assert r["num_requests"] == 6
    # Greedy, EOS ignored: every system must produce the same tokens for every request.
    assert r["requests_identical_across_systems"] == 6
    assert set(r["seconds"]) == {"baton-cb", "baton-static", "hf-cb", "hf-static"}
