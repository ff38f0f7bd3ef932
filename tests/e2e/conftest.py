"""Whole-cluster tests: one real Ray local instance for the session; clusters start and stop in it."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=16, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()
