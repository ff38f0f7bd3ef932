"""The Ray-free disaggregated check the GPU run uses (bench/disagg_check.py), here on CPU with the
shared-memory local path: a prefill and a decode worker in spawned processes, greedy equal to the
colocated engine, the shared prefix not shipped twice, and no block left held on either side."""

import json

from bench.disagg_check import main


def test_workers_in_spawned_processes_equal_the_colocated_engine(capsys):
    assert main(["--device", "cpu", "--prompts", "5", "--max-tokens", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_path"] == "shm" and report["greedy_equal_to_colocated"]
    assert report["chunks_per_longest_prompt"] >= 2
    assert report["shared_prefix_skip_blocks"] == report["shared_prefix_full_blocks"] > 0
    assert report["transfers_completed"] == 5 and report["transfers_failed"] == 0
    assert report["prefill_blocks_free"][0] == report["prefill_blocks_free"][1]
    assert report["decode_blocks_free"][0] == report["decode_blocks_free"][1]
