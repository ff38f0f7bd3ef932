"""bench/host_step.py: an engine step with the model's arithmetic taken out, timed per batch size."""

from bench.host_step import main, measure


def test_host_step_times_every_batch_size():
    r = measure([1, 4], context=16, steps=3)
    assert [row["batch"] for row in r["rows"]] == [1, 4]
    assert all(row["host_ms"] > 0 for row in r["rows"])
    assert all(row["batch_in_phases"] == row["batch"] for row in r["rows"])  # nothing ended before
    for row in r["rows"]:  # each phase timed
        phases = [row[k] for k in ("schedule_ms", "runner_ms", "update_ms", "outputs_ms")]
        assert all(p > 0 for p in phases)


def test_host_step_cli_prints_a_line_per_batch(capsys):
    assert main(["--sizes", "2", "--context", "8", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "batch    2:" in out and "schedule " in out and "outputs " in out
