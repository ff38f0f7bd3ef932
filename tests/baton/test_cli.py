"""The ``baton`` CLI as a user runs it: a subprocess, real model, JSON output, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def baton(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "baton", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_generate_json_on_tiny(tiny_model_dir):
    r = baton(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "hello",
        "--prompt",
        "second prompt here",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["prompt"] for x in lines] == ["hello", "second prompt here"]
    for x in lines:
        assert len(x["token_ids"]) == 6 and isinstance(x["text"], str)
        assert "logprobs" not in x
    r = baton(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "hello",
        "--max-tokens",
        "3",
        "--ignore-eos",
        "--logprobs",
        "2",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [lp["token_id"] for lp in out["logprobs"]] == out["token_ids"]
    assert all(len(lp["top"]) == 2 and lp["top"][0] == [lp["token_id"], lp["logprob"]] for lp in out["logprobs"])
    r = baton(
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "hello",
        "--max-tokens",
        "1",
        "--prompt-logprobs",
        "0",
        "--json",
    )
    out = json.loads(r.stdout)
    assert len(out["prompt_logprobs"]) == out["num_prompt_tokens"] and out["prompt_logprobs"][0]["logprob"] is None


def test_generate_with_ngram_drafts_gives_the_same_tokens(tiny_model_dir):
    outs = []
    for k in ("0", "4"):
        r = baton(
            "generate",
            "--model",
            str(tiny_model_dir),
            "--prompt",
            "one two three one two three one",
            "--prompt",
            "hello",
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--speculative-tokens",
            k,
            "--json",
        )
        assert r.returncode == 0, r.stderr
        outs.append([json.loads(x)["token_ids"] for x in r.stdout.splitlines()])
    assert outs[0] == outs[1] and all(len(t) == 24 for t in outs[1])


@pytest.mark.slow
def test_generate_chat_on_default_model(default_model_dir):
    r = baton(
        "generate",
        "--model",
        str(default_model_dir),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "12",
        "--json",
    )
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
        (["--logprobs", "21", "--json"], "logprobs"),
        (["--logprobs", "2"], "--logprobs and --prompt-logprobs are printed only with --json"),  # was ignored
        (["--frequency-penalty", "3"], "frequency_penalty"),
        (["--repetition-penalty", "0"], "repetition_penalty"),
        (["--device", "foo"], "device must be auto, cpu, cuda or cuda:N"),
        (["--max-num-seqs", "10000000"], "max_num_seqs must be at most 65536"),  # was a numpy MemoryError
        (["--threads", "100000"], "num_threads must be at most"),  # was a segfault
        (["--threads", "20000"], "num_threads must be at most"),  # was a libgomp failure
        (["--num-kv-blocks", "999999999999"], "set by num_blocks (--num-kv-blocks)"),  # was torch's alloc_cpu.cpp line
        (["--speculative-tokens", "-1"], "--speculative-tokens must be 0 (off) or positive"),
        (["--speculative-tokens", "64"], "speculative num_tokens must be at most 32"),
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
    # Seeded sampling: a seeded request's tokens are the same wherever its positions are sampled
    # (the prefill worker samples the first), with or without drafts.
    common = [
        "generate",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "hello there, how are you today? " * 3,
        "--prompt",
        "short",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--json",
        "--max-num-batched-tokens",
        "16",
        "--temperature",
        "0.8",
        "--seed",
        "3",
    ]
    local = baton(*common)
    pooled = baton(*common, "--prefill-workers", "1", "--decode-workers", "1", timeout=600)
    assert local.returncode == 0 and pooled.returncode == 0, pooled.stderr[-2000:]
    assert [json.loads(x)["token_ids"] for x in pooled.stdout.splitlines()] == [
        json.loads(x)["token_ids"] for x in local.stdout.splitlines()
    ]
    # The decode workers' engines take the drafts setting too; the tokens stay the same.
    drafted = baton(
        *common, "--prefill-workers", "1", "--decode-workers", "1", "--speculative-tokens", "3", timeout=600
    )
    assert drafted.returncode == 0, drafted.stderr[-2000:]
    assert drafted.stdout == pooled.stdout


# ---- baton chat, and the errors an audit found as tracebacks ----------------------------------------


def chat(model_dir, stdin: bytes, *args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "baton", "chat", "--model", str(model_dir), *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def _copy_model(src: Path, dst: Path, drop: str | None = None) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(drop) if drop else None)
    return dst


def test_chat_refuses_max_tokens_beyond_the_context_before_reading_input(tiny_model_dir):
    """It was cut to the context silently, where generate refuses the same value."""
    r = chat(tiny_model_dir, b"hello\n", "--max-tokens", "100000")
    err = r.stderr.decode()
    assert r.returncode == 2 and "--max-tokens 100000: this model's context length is" in err
    assert "Traceback" not in err and b"you>" not in r.stdout


def test_chat_skips_a_message_longer_than_the_context_and_goes_on(tiny_model_dir):
    r = chat(tiny_model_dir, ("word " * 40 + "\nhi\n").encode(), "--max-tokens", "8", "--max-model-len", "32")
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err  # was: a max_tokens error ended the session
    assert "message too long (" in err and "context 32); not sent" in err
    assert r.stdout.decode().count("model> ") == 1  # the next message got its reply


@pytest.mark.parametrize("stdin_errors", ["surrogateescape", "strict"])  # C.UTF-8 and other UTF-8 locales
def test_chat_skips_a_line_that_is_not_utf8(tiny_model_dir, stdin_errors):
    r = chat(
        tiny_model_dir, b"\xffhi\nsecond\n", "--max-tokens", "4", env={"PYTHONIOENCODING": f"utf-8:{stdin_errors}"}
    )
    err = r.stderr.decode()
    assert r.returncode == 0 and "not valid UTF-8 text; not sent" in err and "surrogate" not in err, err
    assert r.stdout.decode().count("model> ") == 1


def test_chat_skips_a_message_the_template_rejects(tiny_model_dir, tmp_path):
    model = _copy_model(tiny_model_dir, tmp_path / "m")
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['content'] == 'bad' %}{{ raise_exception('no bad words') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    r = chat(model, b"bad\nfine\n", "--max-tokens", "4")
    err = r.stderr.decode()
    assert r.returncode == 0 and "messages: chat template error: no bad words; not sent" in err, err
    assert r.stdout.decode().count("model> ") == 1


def test_chat_keeps_the_system_message_when_starting_over(tiny_model_dir, monkeypatch):
    import io

    from baton.cli import main
    from engine.model.tokenizer import Tokenizer

    sent = []
    encode_chat = Tokenizer.encode_chat

    def record(self, messages, *a, **k):
        ids = encode_chat(self, messages, *a, **k)
        sent.append(([m["role"] for m in messages], len(ids)))
        return ids

    monkeypatch.setattr(Tokenizer, "encode_chat", record)
    monkeypatch.setattr("sys.stdin", io.StringIO("one two three four\nfive six seven eight nine\n"))
    assert (
        main(
            [
                "chat",
                "--model",
                str(tiny_model_dir),
                "--system",
                "be brief",
                "--max-tokens",
                "8",
                "--max-model-len",
                "48",
                "--ignore-eos",
            ]
        )
        == 0
    )
    # the second turn does not fit with the history, so it starts over: with the system message
    assert sent[-2][0] == ["system", "user", "assistant", "user"] and sent[-2][1] >= 48
    assert sent[-1][0] == ["system", "user"]


def test_ctrl_c_stops_the_reply_not_the_chat(tiny_model_dir):
    import pty
    import select
    import signal

    master, slave = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "baton", "chat", "--model", str(tiny_model_dir), "--ignore-eos", "--max-tokens", "4000"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    os.close(slave)
    seen = b""

    def read_until(needle: bytes, after: int, timeout: float = 120) -> int:
        def found() -> bool:
            nonlocal seen
            if seen.find(needle, after) >= 0:
                return True
            assert p.poll() is None, seen.decode(errors="replace")[-2000:]
            if select.select([master], [], [], 0.1)[0]:  # blocks up to 0.1 s for output: no pause needed
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    pass
            return False

        wait_until(found, timeout_s=timeout, interval_s=0, message=lambda: seen.decode(errors="replace")[-2000:])
        return seen.find(needle, after) + len(needle)

    try:
        at = read_until(b"you> ", 0)
        os.write(master, b"hello\n")
        at = read_until(b"model> ", at)
        read_until(b" ", at)  # the reply is streaming (4000 tokens: seconds from done)
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: SIGINT to the foreground group
        at = read_until(b"you> ", at)  # the reply stopped and the chat asks for the next message
        os.write(master, b"\n")  # an empty line ends the session
        assert p.wait(timeout=60) == 0
        assert b"Traceback" not in seen and b"interrupted" not in seen
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        os.close(master)


def test_ctrl_c_aborts_the_request_and_keeps_the_partial_reply(tiny_model_dir, monkeypatch, capsys):
    import io
    import signal

    from baton.cli import main
    from engine.engine import LLMEngine
    from engine.model.tokenizer import Tokenizer

    sent, aborted, steps = [], [], []
    encode_chat, step, abort = Tokenizer.encode_chat, LLMEngine.step, LLMEngine.abort

    def record(self, messages, *a, **k):
        sent.append([dict(m) for m in messages])
        return encode_chat(self, messages, *a, **k)

    def step_then_ctrl_c(self):
        steps.append(1)
        out = step(self)
        if len(steps) == 4:  # the first reply is a few tokens along
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(Tokenizer, "encode_chat", record)
    monkeypatch.setattr(LLMEngine, "step", step_then_ctrl_c)
    monkeypatch.setattr(LLMEngine, "abort", lambda self, rid: aborted.append(rid) or abort(self, rid))
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nsecond\n"))
    assert main(["chat", "--model", str(tiny_model_dir), "--max-tokens", "20", "--ignore-eos"]) == 0
    assert len(aborted) == 1
    assert len(steps) == 4 + 20  # the second reply ran to its max_tokens: nothing of the first was left over
    partial = sent[-1][1]
    assert sent[-1][0]["content"] == "hello" and partial["role"] == "assistant" and sent[-1][2]["content"] == "second"
    assert partial["content"] and partial["content"] in capsys.readouterr().out  # kept as shown


def test_chat_without_a_tokenizer_or_a_template_says_so_before_reading_input(tiny_model_dir, tmp_path):
    r = chat(_copy_model(tiny_model_dir, tmp_path / "notok", drop="tokenizer.json"), b"hi\n")
    err = r.stderr.decode()
    assert r.returncode == 2 and "has no tokenizer" in err and "Traceback" not in err, err
    notmpl = _copy_model(tiny_model_dir, tmp_path / "notmpl")
    cfg = json.loads((notmpl / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (notmpl / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = chat(notmpl, b"hi\n")
    err = r.stderr.decode()
    assert r.returncode == 2 and "you> " not in r.stdout.decode(), err
    assert "no chat template" in err and "baton generate" in err and "completions API" not in err
    r = baton("generate", "--model", str(notmpl), "--chat", "--prompt", "hi")
    assert r.returncode == 2 and "no chat template" in r.stderr and "without --chat" in r.stderr
    assert "completions API" not in r.stderr


@pytest.mark.parametrize("value, rc", [("debug", 0), ("Info", 0), ("CRITICAL", 0), ("", 0), ("verbose", 2)])
def test_log_level_from_the_environment(value, rc):
    r = subprocess.run(
        [sys.executable, "-m", "baton", "config", "--print-defaults"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BATON_LOG_LEVEL": value},
    )
    assert r.returncode == rc and "Traceback" not in r.stderr, r.stderr
    if rc:
        assert r.stderr.strip() == (
            "baton: error: BATON_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, "
            "CRITICAL (any case), got 'verbose'"
        )
    r = baton("--log-level", "debug", "config", "--print-defaults")
    assert r.returncode == 0, r.stderr


def test_a_closed_output_pipe_ends_quietly(tiny_model_dir):
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "baton",
            "generate",
            "--model",
            str(tiny_model_dir),
            "--prompt",
            "a",
            "--prompt",
            "b",
            "--max-tokens",
            "2",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    p.stdout.close()  # like `| true`: the reader is gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141 and err == "", err  # was: "baton: error: [Errno 32] Broken pipe", rc 2


def test_out_of_memory_is_one_line(monkeypatch, capsys):
    import numpy as np

    from baton import cli
    from baton.commands import config_cmd

    def huge(args):
        return np.zeros((1 << 22, 1 << 22), dtype=np.int64)  # 128 TiB: numpy's _ArrayMemoryError

    monkeypatch.setattr(config_cmd, "run", huge)
    assert cli.main(["config", "--print-defaults"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("baton: error: out of memory (") and "max_num_seqs" in err and err.count("\n") == 1
