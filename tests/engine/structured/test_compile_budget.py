"""A worker's grammar compiles off its engine thread: a request whose constraint is still compiling
waits outside the scheduler while the other requests step (add_request returns at once), then runs;
a constraint that does not compile, or not within the compile budget, ends its request with finish
reason "error" naming the field (and the budget), nothing allocated, and the engine serves on; a
compile past the budget finishes on its thread and is cached for the next request; a held request
can be aborted."""

import json
import random

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.structured.compiler import CompileBudget
from engine.structured.constraint import ConstraintKind, StructuredOutput
from tests.waiting import wait_until

YES_NO = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")


def _slow(seed: int) -> tuple[StructuredOutput, list[str]]:
    """A regex of nine thousand random alternatives: a compile of a good tenth of a second."""
    rng = random.Random(seed)
    options = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(24)) for _ in range(9000)]
    return StructuredOutput(ConstraintKind.REGEX, "(" + "|".join(options) + ")", "guided_regex"), options


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))


def _run(engine) -> dict[str, RequestOutput]:
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return done


def _clean(engine) -> bool:
    return not engine.has_unfinished_requests() and engine.num_free_blocks == engine.num_total_blocks


def test_a_slow_compile_holds_up_no_other_request(engine):
    slow, options = _slow(1)
    engine.add_request("slow", [5, 6, 7], SamplingParams(max_tokens=4, structured=slow))
    assert "slow" in engine.grammar_waits  # (add_request returned while its grammar compiles)
    engine.add_request("plain", [5, 6, 8], SamplingParams(max_tokens=3, ignore_eos=True))
    steps_while_held = tokens_while_held = 0
    while "slow" in engine.grammar_waits:
        outs = engine.step()
        if "slow" in engine.grammar_waits:
            assert "slow" not in engine.scheduler.requests
            steps_while_held += 1
            tokens_while_held += sum(len(o.new_token_ids) for o in outs if o.request_id == "plain")
    assert steps_while_held >= 1 and tokens_while_held >= 1  # the plain request stepped, the grammar compiling
    out = _run(engine)["slow"]  # compiled, then scheduled and constrained
    assert out.finish_reason in ("stop", "length") and any(o.startswith(out.text) for o in options), out
    assert _clean(engine)


def test_past_the_budget_the_request_ends_with_an_error_naming_it(engine):
    compiler = engine.runner.grammars.compiler
    slow, options = _slow(2)
    before = len(compiler)
    compiler.budget = CompileBudget(wall_s=0.001)
    try:
        engine.add_request("slow", [5, 6, 7], SamplingParams(max_tokens=4, structured=slow))
        engine.add_request("yes-no", [5, 6, 7], SamplingParams(max_tokens=8, structured=YES_NO))
        done = _run(engine)
        out = done["slow"]
        assert out.finish_reason == "error" and out.token_ids == [] and out.error.param == "guided_regex"
        assert out.error.message.startswith("guided_regex did not compile within the compile budget (0.001 s)")
        assert done["yes-no"].text in ("yes", "no")  # (compiled at once: the engine serves on)
        assert _clean(engine)
        # The slow compile finished on its thread: cached, the same constraint is then taken at once.
        wait_until(lambda: len(compiler) == before + 2, timeout_s=60, message="the slow compile cached")
        engine.add_request("again", [5, 6, 7], SamplingParams(max_tokens=2, structured=slow))
        assert "again" not in engine.grammar_waits and "again" in engine.scheduler.requests
        out = _run(engine)["again"]
        assert out.token_ids and any(o.startswith(out.text) for o in options)
    finally:
        compiler.budget = CompileBudget()


def test_a_bad_constraint_ends_with_its_own_error(engine):
    bad = StructuredOutput(ConstraintKind.REGEX, "(a", "guided_regex")
    engine.add_request("bad", [5, 6], SamplingParams(structured=bad))
    out = _run(engine)["bad"]
    assert out.finish_reason == "error" and out.error.param == "guided_regex"
    assert out.error.message.startswith(("guided_regex cannot be compiled", "guided_regex is not valid"))
    assert _clean(engine)


def test_a_held_request_can_be_aborted(engine):
    slow, _ = _slow(3)
    engine.add_request("slow", [5, 6, 7], SamplingParams(max_tokens=4, structured=slow))
    assert "slow" in engine.grammar_waits
    out = engine.abort("slow")
    assert out is not None and out.finish_reason == "abort"
    assert "slow" not in engine.grammar_waits and _clean(engine)
