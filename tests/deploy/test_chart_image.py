"""Which Baton image the chart runs: the CPU build by default, the CUDA build (appVersion-gpu) for
`image.variant: gpu` and in values-gpu.yaml, an explicit tag as written. GPU pools on the CPU build
are refused (torch there has no CUDA: the workers served on CPU while holding the GPUs)."""

from __future__ import annotations

import re

import yaml

from tests.deploy.chart import CHART, VALUES_FILES, helm, render_text, requires_helm, template_args

pytestmark = requires_helm

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def _baton_images(text: str) -> set[str]:
    return {m for m in re.findall(r"image: (\S+)", text) if "baton" in m}


def test_the_default_is_the_cpu_build_and_the_gpu_values_run_the_cuda_build():
    assert _baton_images(render_text([], ())) == {f"ghcr.io/baton-llm/baton:{APP_VERSION}"}
    assert _baton_images(render_text(VALUES_FILES["gpu"], ())) == {f"ghcr.io/baton-llm/baton:{APP_VERSION}-gpu"}
    assert _baton_images(render_text([], ("image.variant=gpu",))) == {f"ghcr.io/baton-llm/baton:{APP_VERSION}-gpu"}


def test_gpu_pools_need_the_cuda_build_or_an_explicit_tag():
    proc = helm(*template_args(sets=("prefill.gpusPerWorker=1",)), check=False)
    assert proc.returncode != 0
    assert "prefill.gpusPerWorker is 1 but the image is the CPU build: set image.variant: gpu" in proc.stderr
    mine = render_text([], ("prefill.gpusPerWorker=1", "image.tag=my-cuda-build"))
    assert _baton_images(mine) == {"ghcr.io/baton-llm/baton:my-cuda-build"}
