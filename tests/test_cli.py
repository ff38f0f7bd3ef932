"""The ``baton`` CLI as a user runs it: a subprocess, real model, JSON output, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def baton(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "baton", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_generate_json_on_tiny(tiny_model_dir):
    r = baton("generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--prompt", "second prompt here",
              "--max-tokens", "6", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["prompt"] for x in lines] == ["hello", "second prompt here"]
    for x in lines:
        assert len(x["token_ids"]) == 6 and isinstance(x["text"], str)
        assert "logprobs" not in x
    r = baton("generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--max-tokens", "3", "--ignore-eos",
              "--logprobs", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [lp["token_id"] for lp in out["logprobs"]] == out["token_ids"]
    assert all(len(lp["top"]) == 2 and lp["top"][0] == [lp["token_id"], lp["logprob"]] for lp in out["logprobs"])
    r = baton("generate", "--model", str(tiny_model_dir), "--prompt", "hello", "--max-tokens", "1",
              "--prompt-logprobs", "0", "--json")
    out = json.loads(r.stdout)
    assert len(out["prompt_logprobs"]) == out["num_prompt_tokens"] and out["prompt_logprobs"][0]["logprob"] is None


@pytest.mark.slow
def test_generate_chat_on_default_model(default_model_dir):
    r = baton("generate", "--model", str(default_model_dir), "--chat", "--prompt", "What is the capital of France?",
              "--max-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "Paris" in out["text"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--max-tokens", "0"], "max_tokens"),
        (["--max-tokens", "-4"], "max_tokens"),
        (["--top-p", "1.5"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--max-tokens", "100000"], "maximum context length"),
        (["--logprobs", "21"], "logprobs"),
        (["--frequency-penalty", "3"], "frequency_penalty"),
        (["--repetition-penalty", "0"], "repetition_penalty"),
        (["--device", "foo"], "device must be auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_parameters_give_a_clear_error(tiny_model_dir, args, needle):
    r = baton("generate", "--model", str(tiny_model_dir), "--prompt", "hi", *args)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_missing_model_is_named(tmp_path):
    r = baton("generate", "--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    r = baton("generate", "--model", str(tmp_path / "broken"), "--prompt", "hi")
    assert r.returncode == 2 and "config.json" in r.stderr and "Traceback" not in r.stderr


def test_generate_through_the_pools_matches_the_engine(tiny_model_dir):
    common = ["generate", "--model", str(tiny_model_dir), "--prompt", "hello there, how are you today? " * 3,
              "--prompt", "short", "--max-tokens", "8", "--ignore-eos", "--json", "--max-num-batched-tokens", "16"]
    local = baton(*common)
    pooled = baton(*common, "--prefill-workers", "1", "--decode-workers", "1", timeout=600)
    assert local.returncode == 0 and pooled.returncode == 0, pooled.stderr[-2000:]
    assert [json.loads(x)["token_ids"] for x in pooled.stdout.splitlines()] == \
        [json.loads(x)["token_ids"] for x in local.stdout.splitlines()]
