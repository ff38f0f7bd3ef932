"""The router (and the engine modules it uses) never import torch: it must start fast and small."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "router.router",
    "router.dispatcher",
    "router.stream",
    "router.worker_pool",
    "engine.request",
    "engine.sampling_params",
    "engine.block_hash",
    "engine.block_manager",
    "engine.scheduler",
    "engine.request_spec",
    "engine.outputs",
    "engine.model.config",
    "engine.model.tokenizer",
    "engine.worker_stats",
    "decode_worker.messages",
    "prefill_worker.messages",
    "kv_transfer.peer",
    "kv_transfer.fault",
    "engine.structured.compiler",
    "router.grammar_check",
    "router.http.app",
    "router.tool_calls.streaming",
    "router.tool_calls.constraint",
]


def test_router_side_modules_do_not_import_torch():
    code = "import sys\n" + "".join(f"import {m}\n" for m in MODULES) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr
