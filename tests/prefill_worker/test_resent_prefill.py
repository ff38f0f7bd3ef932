"""A prefill worker sent a request id it still holds (an earlier placement's copy, whose decode
worker died) aborts that copy and takes the new task: before, it refused the new one ("duplicate
request id") and the old copy kept its blocks while shipping to a dead peer."""

from types import SimpleNamespace

from engine.config import CacheConfig, EngineConfig
from engine.engine import LLMEngine
from engine.request_spec import RequestSpec
from engine.sampling_params import SamplingParams
from engine.structured.constraint import ConstraintKind, StructuredOutput
from prefill_worker.messages import PrefillTask
from prefill_worker.worker import PrefillWorker


class ScriptedAgent:
    def __init__(self):
        self.aborts = []

    def connect(self, peer):
        pass

    def send_abort(self, peer, transfer_id):
        self.aborts.append((peer, transfer_id))


def test_a_re_sent_prefill_supersedes_the_earlier_copy(tiny_model_dir):
    engine = LLMEngine(
        EngineConfig(model=str(tiny_model_dir), max_model_len=512, cache=CacheConfig(num_blocks=64, block_size=16))
    )
    w = object.__new__(PrefillWorker)  # the prefill path's state only: no transfer mesh
    w.worker_id, w._shipping, w._received, w.agent = "prefill-0", {}, {}, ScriptedAgent()
    w.loop = SimpleNamespace(call=lambda fn: fn(engine))
    spec = RequestSpec("r-1", tuple(range(5, 205)), SamplingParams(max_tokens=8), origin="router-0")
    w.prefill(PrefillTask(spec, "decode-0 (died)", 1, 0))
    engine.step()  # its first chunk is computed (and would be shipped)
    w.prefill(PrefillTask(spec, "decode-1", 7, 0))  # the router placed it again
    assert w.agent.aborts == [("decode-0 (died)", 1)]  # the old transfer is called off
    assert w._shipping["r-1"].task.transfer_id == 7 and len(engine.scheduler.requests) == 1
    w.prefill(PrefillTask(RequestSpec("r-2", (5, 6, 7), SamplingParams(max_tokens=2)), "decode-1", 8, 0))
    engine.abort("r-1")
    engine.abort("r-2")
    assert engine.num_free_blocks == engine.num_total_blocks


def test_a_prefill_the_engine_ends_early_calls_its_transfer_off(tiny_model_dir):
    """A constraint the prefill worker cannot compile ends the request there (no output stream on
    this side): its shipment is dropped and the decode worker told at once, not at its deadline."""
    engine = LLMEngine(
        EngineConfig(model=str(tiny_model_dir), max_model_len=512, cache=CacheConfig(num_blocks=64, block_size=16))
    )
    w = object.__new__(PrefillWorker)
    w.worker_id, w._shipping, w._received, w.agent = "prefill-0", {}, {}, ScriptedAgent()
    w.loop = SimpleNamespace(call=lambda fn: fn(engine))
    bad = StructuredOutput(ConstraintKind.REGEX, "(a", "guided_regex")
    w.prefill(PrefillTask(RequestSpec("r-1", (5, 6, 7), SamplingParams(structured=bad)), "decode-0", 3, 0))
    w.prefill(PrefillTask(RequestSpec("r-2", tuple(range(5, 40)), SamplingParams(max_tokens=2)), "decode-0", 4, 0))
    while "r-1" in engine.grammar_waits:
        engine.step()
        w._drop_ended(engine)
    w._drop_ended(engine)
    assert w.agent.aborts == [("decode-0", 3)] and set(w._shipping) == {"r-2"}  # the other prefill ships on
    engine.abort("r-2")
    assert engine.num_free_blocks == engine.num_total_blocks
