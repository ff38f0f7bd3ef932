"""What admission measures from finished requests (pure Python): the service overhead by lane."""

import pytest

from router.load_signals import LoadSignals


def test_a_lane_predicts_its_service_from_its_own_requests_only():
    s = LoadSignals()
    times = [10.0 + 0.1 * i for i in range(8)]
    # A batch request waited 3 s on its decode worker for a slot its lane was over its share for.
    s.finished(12.0, times, 8, dispatch_to_first_token_s=3.5, prefill_queue_s=0.2, prefill_compute_s=0.3, lane="batch")
    s.finished(
        12.0, times, 8, dispatch_to_first_token_s=0.6, prefill_queue_s=0.2, prefill_compute_s=0.3, lane="interactive"
    )
    assert s.service_s(100, 1000.0, now=13.0, lane="interactive") == pytest.approx(0.1 + 0.1)
    assert s.service_s(100, 1000.0, now=13.0, lane="batch") == pytest.approx(0.1 + 3.0)
    # A lane with no measurement of its own gets the model estimate (None), not another lane's.
    assert s.service_s(100, 1000.0, now=13.0, lane="long_context") is None
    assert s.service_s(100, 1000.0, now=13.0) == pytest.approx(0.1 + 3.0 * 0.8 + 0.1 * 0.2)  # all lanes
