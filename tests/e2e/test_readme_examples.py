"""README.md's examples, run as a user would run them.

Every fenced example in README.md is accounted for: the Python ones run (the OpenAI client against a
real ``baton up`` serving the default model, with the stock ``openai`` client and the README's own
``api_key="unused"``; the engine snippet in-process); every ``baton`` command line in the shell
examples parses with the real CLI, the cheap ones run, and the configs they name load. A README
example that no test here knows fails ``test_every_readme_example_is_covered``."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import cast

import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.e2e.baton_up_process import ROOT, BatonUp, baton_up

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
README_URL = "http://127.0.0.1:8000/v1"  # where `make run` serves; the test's server has its own port


def shell_commands() -> list[list[str]]:
    """The command lines of the README's shell examples: continuations joined, comments dropped."""
    commands = []
    for lang, code in BLOCKS:
        if lang != "sh":
            continue
        for line in code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def baton_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``baton`` invocation (``.venv/bin/baton ...`` or ``python -m baton ...``)."""
    if words[0].endswith("bin/baton"):
        return words[1:]
    if words[:3] in (["python", "-m", "baton"], ["python3", "-m", "baton"]):
        return words[3:]
    return None


def submitted_baton(words: list[str]) -> list[str] | None:
    """What ``ray job submit ... -- python -m baton ...`` runs."""
    if words[:3] == ["ray", "job", "submit"] and "--" in words:
        return baton_args(words[words.index("--") + 1 :])
    return None


def test_every_readme_example_is_covered():
    assert len(PYTHON) == 3 and "openai.OpenAI(" in PYTHON[0] and "LLMEngine(" in PYTHON[2], PYTHON
    assert "response_format" in PYTHON[1] and "tool_choice" in PYTHON[1], PYTHON
    for words in shell_commands():
        known = (
            baton_args(words) is not None
            or submitted_baton(words) is not None
            or words[0] in ("make", "ray")
            or words[:3] == ["python3", "-m", "bench.gpu_check"]
        )
        assert known, f"README example with no test: {shlex.join(words)}"


def test_every_baton_command_in_the_readme_parses():
    from baton.cli import build_parser

    parser = build_parser()
    lines = [a for w in shell_commands() if (a := baton_args(w) or submitted_baton(w)) is not None]
    assert len(lines) >= 10
    for args in lines:
        try:
            parser.parse_args(args)
        except SystemExit as e:
            pytest.fail(f"README: `baton {shlex.join(args)}` does not parse (exit {e.code})")


def test_the_cluster_configs_the_readme_submits_load():
    from baton.config import load_config

    submitted = [a for w in shell_commands() if (a := submitted_baton(w)) is not None]
    configs = {a[a.index("--config") + 1] for a in submitted}
    configs |= set(re.findall(r"\[(deploy/ray/[\w.-]+\.yaml)\]", README))
    assert configs >= {"deploy/ray/cluster-cpu.yaml", "deploy/ray/cluster-gpu.yaml"}
    for path in configs:
        load_config(ROOT / path)


def test_the_gpu_check_command_in_the_readme_parses(tmp_path):
    from bench import gpu_check

    out = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "--out" in out.stdout, out.stderr
    assert callable(gpu_check.main)


@pytest.fixture(scope="module")
def made_run() -> Iterator[BatonUp]:
    """`make run`: ``baton up`` with no flags but the ports, one for the module's client examples."""
    with baton_up() as up:
        yield up


@pytest.mark.slow
def test_the_readme_openai_client_example_against_baton_up(made_run: BatonUp):
    """The README's client code as written against `make run`: the stock client sends
    ``Authorization: Bearer unused``, which a server without authentication serves."""
    example = PYTHON[0]
    assert README_URL in example and 'api_key="unused"' in example
    up = made_run
    namespace: dict[str, object] = {}
    exec(compile(example.replace(README_URL, f"{up.base}/v1"), "README.md", "exec"), namespace)
    r = namespace["r"]
    choice = r.choices[0]  # type: ignore[attr-defined]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert r.model == "SmolLM2-135M-Instruct"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_readme_structured_output_and_tool_call_example_against_baton_up(made_run: BatonUp):
    """The README's structured-output and tool-calling example against `make run`: a JSON object
    valid against its schema and a call of the named function with valid arguments, then the same
    call through the client's streaming helper, assembled from the streamed deltas."""
    import jsonschema
    import openai

    example = PYTHON[1]
    assert README_URL in example
    up = made_run
    namespace: dict[str, object] = {}
    exec(compile(example.replace(README_URL, f"{up.base}/v1"), "README.md", "exec"), namespace)
    jsonschema.validate(namespace["city"], namespace["schema"])
    t = namespace["t"]
    assert t.choices[0].finish_reason == "tool_calls"  # type: ignore[attr-defined]
    call = namespace["call"]
    assert call.function.name == "get_weather" and call.id  # type: ignore[attr-defined]
    weather = cast(ChatCompletionFunctionToolParam, namespace["weather"])  # the README defines it
    jsonschema.validate(namespace["args"], weather["function"]["parameters"])
    client = openai.OpenAI(base_url=f"{up.base}/v1", api_key="unused", max_retries=0)
    with client.chat.completions.stream(
        model="SmolLM2-135M-Instruct",
        max_tokens=64,
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,  # (one call: the grammar allows no second)
        messages=[{"role": "user", "content": "What is the weather in Rome?"}],
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    tool_calls = final.choices[0].message.tool_calls
    assert tool_calls is not None
    [streamed] = tool_calls
    assert streamed.function.name == "get_weather" and final.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(streamed.function.arguments), weather["function"]["parameters"])


@pytest.mark.slow
def test_the_readme_engine_example_runs():
    namespace: dict[str, object] = {}
    exec(compile(PYTHON[2], "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.finished and 1 <= len(out.token_ids) <= 16 and out.text  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_readme_generate_and_config_commands_run():
    generate = next(a for w in shell_commands() if (a := baton_args(w)) and a[0] == "generate" and "--json" in a)
    out = subprocess.run(
        [sys.executable, "-m", "baton", *generate], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    [result] = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert result["text"].strip() and result["finish_reason"] in ("stop", "length") and result["token_ids"]

    defaults = subprocess.run(
        [sys.executable, "-m", "baton", "config", "--print-defaults"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert defaults.returncode == 0 and "pools" in defaults.stdout, defaults.stderr
