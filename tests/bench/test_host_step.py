"""bench/host_step.py: an engine step with the model's arithmetic taken out, timed per batch size."""

from bench.host_step import main, measure


def test_host_step_times_every_batch_size():
    r = measure([1, 4], context=16, steps=3)
    assert [row["batch"] for row in r["rows"]] == [1, 4]
    assert all(row["host_ms"] > 0 for row in r["rows"])


def test_host_step_cli_prints_a_line_per_batch(capsys):
    assert main(["--sizes", "2", "--context", "8", "--steps", "2"]) == 0
    assert "batch    2:" in capsys.readouterr().out
