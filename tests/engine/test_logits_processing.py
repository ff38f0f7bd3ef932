"""Penalties and logit bias equal transformers token for token under greedy decoding:
repetition_penalty against its own RepetitionPenaltyLogitsProcessor, OpenAI's presence/frequency
penalties and logit_bias against a transformers LogitsProcessor written from OpenAI's formula;
batched with requests that use none, and through chunked prefill."""

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from engine.config import EngineConfig, SchedulerConfig
from engine.engine import LLMEngine
from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams
from tests.engine.hf_oracle import build_tiny_hf_model, load_hf

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [300, 17, 2, 99], list(range(40, 90))]
MAX_NEW = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = build_tiny_hf_model(tmp_path_factory.mktemp("pen"), "llama", seed=5)
    return d, load_hf(d)


class OpenAIFormula(LogitsProcessor):
    """logit_bias added; then a token generated c times loses f * c + p * (c > 0)."""

    def __init__(self, prompt_len, presence=0.0, frequency=0.0, bias=()):
        self.prompt_len, self.presence, self.frequency, self.bias = prompt_len, presence, frequency, bias

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for t, b in self.bias:
            scores[:, t] += b
        out = input_ids[0, self.prompt_len :]
        if len(out):
            counts = torch.bincount(out, minlength=scores.shape[1]).to(scores.dtype)
            scores[0] -= self.frequency * counts + self.presence * (counts > 0).to(scores.dtype)
        return scores


def _hf(hf, prompt, **kw):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **kw,
        )
    return out[0, len(prompt) :].tolist()


def _engine(d, chunked):
    sched = SchedulerConfig(max_num_batched_tokens=8) if chunked else SchedulerConfig()
    return LLMEngine(EngineConfig(model=str(d), dtype="float32", scheduler=sched))


def _ours(eng, **kw):
    plain = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, detokenize=False)
    shaped = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, detokenize=False, **kw)
    # every shaped request next to an unshaped copy of itself: the shaping stays on its own rows
    outs = eng.generate(PROMPTS + PROMPTS, [shaped] * len(PROMPTS) + [plain] * len(PROMPTS))
    assert eng.num_free_blocks == eng.num_total_blocks
    return [o.token_ids for o in outs[: len(PROMPTS)]], [o.token_ids for o in outs[len(PROMPTS) :]]


@pytest.mark.parametrize("chunked", [False, True])
def test_repetition_penalty_equals_transformers(tiny, chunked):
    d, hf = tiny
    shaped, plain = _ours(_engine(d, chunked), repetition_penalty=1.5)
    assert shaped == [_hf(hf, p, repetition_penalty=1.5) for p in PROMPTS]
    assert plain == [_hf(hf, p) for p in PROMPTS]
    assert shaped != plain  # it did something


SHAPES = {  # each alone, so that a wrong sign or a swapped pair shows
    "presence": (0.7, 0.0, ()),
    "negative frequency": (0.0, -0.4, ()),
    "both": (-0.3, 0.5, ()),
    "bias": (0.0, 0.0, ((7, 3.0), (178, -100.0), (249, -100.0), (446, -100.0))),  # the plain first tokens
}


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_presence_frequency_and_bias_equal_the_openai_formula(tiny, chunked, shape):
    d, hf = tiny
    presence, frequency, bias = SHAPES[shape]
    shaped, plain = _ours(
        _engine(d, chunked), presence_penalty=presence, frequency_penalty=frequency, logit_bias=dict(bias)
    )
    want = [
        _hf(hf, p, logits_processor=LogitsProcessorList([OpenAIFormula(len(p), presence, frequency, bias)]))
        for p in PROMPTS
    ]
    assert shaped == want and plain == [_hf(hf, p) for p in PROMPTS]
    assert shaped != plain


def test_a_large_bias_forces_a_token_and_logprobs_stay_the_models(tiny):
    d, hf = tiny
    eng = _engine(d, False)
    out = eng.generate(
        [PROMPTS[1]],
        SamplingParams(
            max_tokens=4, ignore_eos=True, detokenize=False, logit_bias={321: 100}, logprobs=0, temperature=0.8, seed=1
        ),
    )[0]
    assert out.token_ids == [321] * 4
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([PROMPTS[1] + out.token_ids])).logits[0].float(), -1)
    for i, lp in enumerate(out.logprobs):  # the unbiased distribution's value
        assert lp.logprob == pytest.approx(ref[len(PROMPTS[1]) - 1 + i, 321].item(), abs=1e-4)


def test_a_bias_outside_the_vocabulary_is_refused(tiny):
    d, _ = tiny
    with pytest.raises(InvalidParameterError) as e:
        _engine(d, False).add_request(None, [1, 2], SamplingParams(logit_bias={10**6: 1.0}))
    assert e.value.param == "logit_bias"
