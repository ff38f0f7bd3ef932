"""The launch-shape sweep (bench/kernel_sweep.py) under the Triton interpreter: every point is
checked against the reference, the default is measured in the same run, and the report is
written as it goes. Its timings mean nothing here; the GPU run is in docs/BENCHMARKS.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def test_the_sweep_checks_every_launch_shape_against_the_reference(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "sweep.json"
    # A child process: the interpreter must be on before Triton is imported.
    p = subprocess.run(
        [sys.executable, "-m", "bench.kernel_sweep", "--allow-cpu", "--out", str(out)],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [s["kind"] for s in report["shapes"]] == ["decode", "prefill"]
    for shape in report["shapes"]:
        assert len(shape["points"]) == 2 and sum(pt["default"] for pt in shape["points"]) == 1
        assert all(pt.get("ok") for pt in shape["points"]), shape["points"]
        assert shape["default_ms"] is not None and shape["speedup_over_default"] >= 1.0


def test_tiles_refuse_shapes_the_kernels_cannot_use():
    pytest.importorskip("triton")
    from engine.attention.triton_decode import DecodeTiles
    from engine.attention.triton_prefill import PrefillTiles

    with pytest.raises(ValueError, match="block_n"):
        DecodeTiles(block_n=48)
    with pytest.raises(ValueError, match="block_m"):
        PrefillTiles(block_m=8)
