"""The compile budget on a worker: a constraint that does not compile within it is refused at
add_request with an error naming the field and the budget (never a hang, nothing allocated), the
engine serves on, and the compile, finished on its thread, is cached for the next request."""

import json

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams
from engine.structured.compiler import CompileBudget
from engine.structured.constraint import ConstraintKind, StructuredOutput
from tests.waiting import wait_until

SLOW = StructuredOutput.choice([f"option number {i} of many" for i in range(2000)])  # (a compile of tens of ms)


@pytest.fixture
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))


def test_past_the_budget_the_request_is_refused_naming_it(engine):
    compiler = engine.runner.grammars.compiler
    compiler.budget = CompileBudget(wall_s=0.001)
    with pytest.raises(InvalidParameterError, match=r"guided_choice did not compile within the compile budget") as e:
        engine.add_request("slow", [5, 6, 7], SamplingParams(max_tokens=4, structured=SLOW))
    assert e.value.param == "guided_choice"
    assert not engine.has_unfinished_requests() and engine.num_free_blocks == engine.num_total_blocks
    # The engine serves on, constrained requests included.
    yes_no = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    compiler.budget = CompileBudget()
    out = engine.generate([[5, 6, 7]], [SamplingParams(max_tokens=8, structured=yes_no)])[0]
    assert out.text in ("yes", "no")
    # The slow compile finished on its thread: cached, the same constraint is then taken at once.
    wait_until(lambda: len(compiler) == 2, timeout_s=60, message="the slow compile cached")
    compiler.budget = CompileBudget(wall_s=0.001)
    out = engine.generate([[5, 6, 7]], [SamplingParams(max_tokens=2, structured=SLOW)])[0]
    assert out.token_ids and "option number".startswith(out.text)  # (admitted this time, and decoded)


def test_a_bad_constraint_is_still_its_own_error(engine):
    with pytest.raises(InvalidParameterError, match=r"guided_regex cannot be compiled|guided_regex is not valid"):
        engine.add_request(
            None, [5, 6], SamplingParams(structured=StructuredOutput(ConstraintKind.REGEX, "(a", "guided_regex"))
        )
