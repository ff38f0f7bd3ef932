"""The AVX2 builds' same-run A/B (bench/avx2_kernels.py): every arm is built and timed, the
kernels' results agree, and an unknown part is refused by name."""

import json
import shutil

import pytest

from bench.avx2_kernels import main
from engine.cpu_info import cpuinfo_field

pytestmark = [
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine"),
    pytest.mark.skipif(not {"avx2", "fma"} <= set(cpuinfo_field("flags").split()), reason="this CPU lacks AVX2 or FMA"),
]


def test_decode_and_silu_arms_run_and_agree(capsys):
    assert main(["--parts", "decode,silu", "--seqs", "3", "--context", "40", "--silu-rows", "5", "--repeats", "1",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (decode,) = report["decode"]
    assert set(decode["ms"]) == {"8-lane task", "8-lane, no read-ahead", "16-lane task", "16-lane, trapping math (before)"}
    assert all(diff < 1e-5 for diff in decode["max_abs_diff"].values())  # same attention, other lanes
    assert decode["max_abs_diff"]["8-lane, no read-ahead"] == 0.0  # reading ahead changes no float
    assert set(report["silu"]["5"]["ms"]) == {"8-lane vectors", "scalar loop (before)", "scalar loop, trapping math", "torch"}


def test_an_unknown_part_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--parts", "decode,gemm"])
    assert "unknown part(s) gemm" in capsys.readouterr().err
