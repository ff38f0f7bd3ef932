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


def test_the_load_call_brings_the_lanes_pressure_and_reports_what_each_lane_waits_for(tiny_model_dir):
    """The router's monitor sends its lanes' pressure with each load call: with an interactive lane
    streaming there, batch prompts keep to their floor of each step, and the report says what a new
    prompt of each lane waits for (``LaneCounters.ahead``), which the router's placement and admission read."""
    from dataclasses import replace

    from engine.config import LaneShareConfig
    from engine.lane_shares import LaneDemand

    config = EngineConfig(model=str(tiny_model_dir), max_model_len=512, cache=CacheConfig(num_blocks=64, block_size=16))
    lanes = (LaneShareConfig(0, weight=8.0, floor=0.05), LaneShareConfig(2, weight=1.0, floor=0.05, preemptible=True))
    scheduler = replace(config.scheduler, max_num_batched_tokens=256, lane_shares=lanes, lane_short_steps=True)
    engine = LLMEngine(replace(config, scheduler=scheduler))
    w = object.__new__(PrefillWorker)
    w.worker_id, w._shipping, w._received, w.agent, w.engine = "prefill-0", {}, {}, ScriptedAgent(), engine
    w.agent.stats, w.agent.bytes_sent = SimpleNamespace(completed=0, failed=0), lambda: 0
    w.peer = SimpleNamespace(incarnation="i0")
    w.loop = SimpleNamespace(call=lambda fn: fn(engine), num_steps=0, busy_seconds=0.0, busy_cpu_seconds=0.0)
    batch = RequestSpec("b-1", tuple(range(5, 405)), SamplingParams(max_tokens=8), origin="router-0", priority=2)
    w.prefill(PrefillTask(batch, "decode-0", 1, 0))
    load = w.load("router-0", (LaneDemand(0, streams=2),))
    assert load.lane_counters is not None
    assert load.lane_counters.queued_tokens == {2: 400}
    assert load.lane_counters.ahead == {0: 2 * 12, 2: 400}  # two steps of batch's floor (5% of 256)
    assert engine.scheduler.schedule().total_num_scheduled_tokens == 12
    engine.abort("b-1")
