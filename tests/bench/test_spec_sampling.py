"""The sampled-requests drafts bench's small version: it completes, reports every row, and seeded
requests get the same tokens with drafts as without."""

import json

from bench.spec_sampling import main, run


def test_small_spec_sampling_bench_reports_every_row_with_the_same_tokens(tiny_model_dir):
    r = run(str(tiny_model_dir), temperatures=(0.0, 0.8), batches=(1, 3), max_tokens=12, k=3, rounds=1)
    assert [(x["prompts"], x["batch"], x["temperature"]) for x in r["rows"]] == [
        (p, b, t) for p in ("rewrite", "random") for b in (1, 3) for t in (0.0, 0.8)
    ]
    for row in r["rows"]:
        assert row["plain_tok_s"] > 0 and row["drafts_tok_s"] > 0
        assert row["same_tokens"] is True
        assert row["kept"] is None or 0 <= row["kept"] <= 1
    assert any(row["kept"] for row in r["rows"] if row["temperature"] == 0.0)  # greedy drafts are kept here


def test_the_json_output_parses(tiny_model_dir, capsys):
    assert (
        main(
            [
                "--model",
                str(tiny_model_dir),
                "--temperatures",
                "0.5",
                "--batch",
                "2",
                "--max-tokens",
                "6",
                "--rounds",
                "1",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["rows"][0]["batch"] == 2
