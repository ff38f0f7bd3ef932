import pytest

from engine.errors import InvalidParameterError
from engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**64}, "seed"),  # wrapped onto seed 0 (the same tokens)
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        # each is checked against every token: 3,000,000 over gRPC slowed the worker ~40x
        ({"stop_token_ids": [7] * 1025}, "stop_token_ids"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 2.0}, "logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"min_p": -0.1}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        # Found by a sampling audit: each of these was accepted and misbehaved later.
        ({"temperature": float("inf")}, "temperature"),  # NaN logits with min_tokens: token 0 every time
        ({"temperature": 1e39}, "temperature"),  # inf in float32
        ({"temperature": 10**400}, "temperature"),  # OverflowError inside step(), failing the whole batch
        ({"repetition_penalty": 1e-38}, "repetition_penalty"),  # a positive logit / 1e-38 = inf
        ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output"),  # truthy: read as True
        ({"ignore_eos": "no"}, "ignore_eos"),
        ({"detokenize": 0}, "detokenize"),
        ({"skip_special_tokens": "False"}, "skip_special_tokens"),  # a TypeError inside generate()
        ({"stop": 5}, "stop"),  # "'int' object is not iterable"
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"logit_bias": 5}, "logit_bias"),
        ({"stop": ["Paris"], "detokenize": False}, "stop"),  # silently never matched
    ],
)
def test_bad_parameters_name_the_parameter(kwargs, param):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param
    assert param in str(e.value)


def test_the_largest_allowed_values_still_sample():
    SamplingParams(temperature=1e6, min_tokens=1, max_tokens=2, repetition_penalty=0.01)


def test_lists_become_tuples_and_defaults_are_greedy():
    sp = SamplingParams(stop=["a", "b"], stop_token_ids=[3])
    assert sp.stop == ("a", "b") and sp.stop_token_ids == (3,)
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams().greedy and not SamplingParams(temperature=0.7).greedy
