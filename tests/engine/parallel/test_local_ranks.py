"""The colocated engine's rank processes: a rank that dies fails the step (its requests leave the
scheduler, ending with an error) and every later one, with a message naming the rank; close()
returns and reaps the others. The failed step's ends come out of the very next step."""

import os
import signal

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.parallel.local_ranks import RankLost
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model
from tests.waiting import wait_until


def test_a_dead_rank_fails_the_steps_naming_it(tmp_path):
    d = build_tiny_hf_model(tmp_path, "llama", seed=1)
    eng = LLMEngine(EngineConfig(model=str(d), dtype="float32", tensor_parallel_size=2, num_threads=1))
    try:
        rid = eng.add_request(None, [5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True, detokenize=False))
        eng.step()
        victim = eng.ranks.processes[0]
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: not victim.is_alive(), timeout_s=30)
        with pytest.raises(RankLost, match=r"tensor-parallel rank 1 exited \(exit code -9\)"):
            eng.step()
        assert rid not in eng.scheduler.requests  # the failed step's request ended (with an error)...
        (out,) = eng.step()  # ...reported at once by the next step, which runs nothing...
        assert out.request_id == rid and out.finished and out.finish_reason == FinishReason.ERROR
        assert not eng.has_unfinished_requests()
        with pytest.raises(RankLost):  # ...and the group runs no later step
            eng.step()
    finally:
        eng.close()
    assert not any(p.is_alive() for p in eng.ranks.processes)
