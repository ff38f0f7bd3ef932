"""Whole-cluster tests: one real Ray local instance for the session; clusters start and stop in it."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # The custom resources `baton cluster` places its actors by (tests/e2e/test_supervisor_faults.py).
    ray.init(
        num_cpus=16,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=False,
        resources={"baton_router": 4, "baton_prefill": 4, "baton_decode": 4},
    )
    yield ray
    ray.shutdown()
