"""A matcher that fails mid-request (llguidance out of room in an Earley row; a replayed token its
grammar refuses) ends that request with finish reason "error" and an error naming the constraint's
field -- not "stop" at the EOS its failed mask forces -- without the token sampled under that mask;
the other requests of the batch carry on (a guided_choice of as many options among them: one lexer
terminal, no Earley row), and no block is left behind."""

import json

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.structured.constraint import ConstraintKind, StructuredOutput

OPTIONS = [f"option number {i} of the list" for i in range(2001)]
# A grammar rule of two thousand and one alternatives: consuming the first token overflows
# llguidance's Earley row (its limit is two thousand items).
MANY_RULE = StructuredOutput(ConstraintKind.GRAMMAR, "start: " + " | ".join(map(json.dumps, OPTIONS)), "guided_grammar")
MANY_CHOICE = StructuredOutput.choice(OPTIONS)
YES_NO = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32"))


def _drained(engine):
    return not engine.has_unfinished_requests() and engine.num_free_blocks == engine.num_total_blocks


def test_matcher_out_of_room_ends_with_error(engine):
    bad, good, plain = engine.generate(
        [[5, 7, 9, 11], [5, 7, 9, 12], [5, 7, 9, 13]],
        [
            SamplingParams(max_tokens=40, structured=MANY_RULE, logprobs=1),
            SamplingParams(max_tokens=24, structured=MANY_CHOICE),
            SamplingParams(max_tokens=6, ignore_eos=True),
        ],
    )
    assert bad.finish_reason == "error", bad
    assert bad.error is not None and bad.error.param == "guided_grammar"
    assert bad.error.message.startswith("guided_grammar could not be enforced")
    # Its first token (the mask allowed it) was delivered; the EOS sampled under the failed mask was not.
    assert len(bad.token_ids) == 1 and "option".startswith(bad.text) and bad.text
    assert bad.logprobs is not None and len(bad.logprobs) == len(bad.token_ids)
    assert good.finish_reason == "stop" and good.text in OPTIONS and good.error is None
    assert plain.finish_reason == "length" and len(plain.token_ids) == 6
    assert _drained(engine)


def test_replayed_token_the_grammar_refuses_ends_with_error(engine):
    """A resumed request (a migrated one) whose delivered tokens its grammar refuses: the fresh
    matcher fails replaying them, at the request's first step."""
    regex = StructuredOutput(ConstraintKind.REGEX, "[0-9]+", "guided_regex")
    resumed = engine.tokenizer.encode("abc")
    rid = engine.add_request(
        None, [5, 7, 9, 11], SamplingParams(max_tokens=10, structured=regex), resume_token_ids=resumed
    )
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    (out,) = outs
    assert out.request_id == rid and out.finished and out.finish_reason == "error"
    assert out.new_token_ids == [] and out.token_ids == resumed
    assert out.error is not None and out.error.param == "guided_regex"
    assert f"with {len(resumed)} output tokens generated" in out.error.message
    assert _drained(engine)
