"""A CPU engine keeps freed activation memory in the heap: a large step reuses the pages of the step
before instead of faulting fresh ones in (engine/host_memory.py). Each case runs in a fresh process,
since malloc's state is process-wide."""

import subprocess
import sys

import pytest

from engine.host_memory import keep_freed_memory

PROBE = """
import resource, sys
import torch
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    from engine.host_memory import keep_freed_memory
    assert keep_freed_memory()
def step():  # a large step's activations: allocated, written, freed together
    xs = [torch.empty(3 << 20).fill_(1.0) for _ in range(8)]  # 8 x 12 MiB
    del xs
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_of_a_repeated_step(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_repeated_large_steps_reuse_their_pages():
    if not keep_freed_memory():
        pytest.skip("not glibc: the settings do not apply")
    one_step = 8 * (12 << 20) // 4096  # pages a step writes
    # With glibc's defaults the five steps fault in 1-2 steps' worth of pages again in most runs
    # (27-52k here; where the address layout lets the heap keep them, ~3k): not asserted, it varies.
    # Kept: 0 or one tensor's 3k pages in most runs, two tensors' (6,144) in one CI run. Half a step
    # still tells the settings from the defaults' step or more of fresh faults.
    kept = [_faults_of_a_repeated_step("keep") for _ in range(3)]
    assert all(k < one_step // 2 for k in kept), kept
