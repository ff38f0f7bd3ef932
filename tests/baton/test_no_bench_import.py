"""The product never imports ``bench`` (DESIGN.md, dependency rules): the tools behind ``baton bench``,
``baton plan`` and ``baton profile`` live in ``baton.perf``; ``bench`` holds benchmarks that drive the
product like a client and may import anything."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("baton", "engine", "router", "kv_transfer", "prefill_worker", "decode_worker")


def imports_under(source: str, package: str) -> list[str]:
    """The modules under ``package`` (dotted) that ``source`` imports: absolute imports, anywhere in the file."""

    def under(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if under(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if under(node.module):
                found.append(node.module)
            else:  # ``from baton import perf``
                found += [f"{node.module}.{a.name}" for a in node.names if under(f"{node.module}.{a.name}")]
    return found


def bench_imports(source: str) -> list[str]:
    return imports_under(source, "bench")


def test_the_checker_sees_every_form_of_import():
    assert bench_imports("import bench") == ["bench"]
    assert bench_imports("import os, bench.gpu_check as g") == ["bench.gpu_check"]
    assert bench_imports("def f():\n    from bench.kernels import Shape\n") == ["bench.kernels"]
    assert bench_imports("from bench import gpu_check") == ["bench"]
    assert bench_imports("import benchmark\nfrom baton.perf import offline\nfrom .bench import x") == []
    assert imports_under("from baton import perf\nfrom baton.perf.sim import cli", "baton.perf") == [
        "baton.perf",
        "baton.perf.sim",
    ]
    assert imports_under("from baton import config\nimport baton.performance", "baton.perf") == []


def test_no_product_module_imports_bench():
    offenders = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in bench_imports(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_the_core_does_not_import_the_performance_tools():
    """``baton.perf`` drives the engine, router and workers; they never import it back."""
    offenders = []
    for package in PRODUCT[1:]:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in imports_under(path.read_text(), "baton.perf"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
