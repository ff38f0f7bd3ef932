"""The offline run's time breakdown: step buckets cover the run, projections are a part of it."""

from bench.offline_breakdown import BUCKETS, bucket_of, run


def test_steps_are_bucketed_by_kind_and_batch_size():
    assert bucket_of([5, 1, 1]) == "prefill"  # any multi-token row: a prefill-carrying step
    assert bucket_of([1] * 8) == "decode<=8"
    assert bucket_of([1] * 9) == "decode9-32"
    assert bucket_of([1] * 33) == "decode33+"


def test_breakdown_of_a_small_run(tiny_model_dir):
    from engine.model import linear

    real_call = linear.Linear.__call__
    r = run(str(tiny_model_dir), "anyscale-cpu-small")
    assert linear.Linear.__call__ is real_call  # the timer is removed afterwards
    assert set(r["steps"]) == set(BUCKETS)
    stepped = sum(v["seconds"] for v in r["steps"].values())
    assert 0 < stepped <= r["seconds"]
    assert 0 < r["projection_seconds"] < stepped
    assert r["steps"]["prefill"]["steps"] >= 1 and r["tok_s"] > 0


def test_the_schedule_what_ifs(tiny_model_dir):
    import pytest

    r = run(str(tiny_model_dir), "anyscale-cpu-small", budget=16, order="longest-output-first")
    assert (r["budget"], r["order"]) == (16, "longest-output-first") and r["tok_s"] > 0
    with pytest.raises(ValueError, match="order must be one of"):
        run(str(tiny_model_dir), "anyscale-cpu-small", order="shortest")


def test_prefill_on_the_torch_path(tiny_model_dir):
    r = run(str(tiny_model_dir), "anyscale-cpu-small", prefill_kernel=False)
    assert r["prefill_kernel"] is False and r["tok_s"] > 0


def test_the_python_loop_times_every_projection(tiny_model_dir):
    looped = run(str(tiny_model_dir), "anyscale-cpu-small")
    python = run(str(tiny_model_dir), "anyscale-cpu-small", c_loop=False)
    assert python["c_decode_loop"] is False and python["tok_s"] > 0
    if looped["c_decode_loop"]:  # the compiled loop is here: its decode steps' layers escape the timer
        decode = sum(v["seconds"] for k, v in python["steps"].items() if k != "prefill")
        assert python["projection_seconds"] > looped["projection_seconds"] and decode > 0
