"""bench.sampling_cost runs every mode on the same requests; the logprobs modes find the same tokens."""

import json

from bench.sampling_cost import MODES, main


def test_sampling_cost_on_tiny(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert main(["--model", "tiny", "--n", "4", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical_tokens"] is True
    assert set(result["tok_s"]) == set(MODES) and all(v > 0 for v in result["tok_s"].values())
    assert result["slowdown"]["off"] == 1.0
    assert "tokens identical in every logprobs mode: True" in capsys.readouterr().out
