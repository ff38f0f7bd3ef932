"""What admission measures from finished requests (pure Python): the service overhead and the time
per output token by lane."""

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


def test_a_lanes_recent_time_per_output_token_is_the_90th_percentile_of_its_recently_finished_streams():
    s = LoadSignals()
    for i in range(7):  # 0.1 s a token from the first token to the last; 16 tokens each
        first = 10.0 + i
        s.finished(
            first + 1.5, [first + 0.1 * k for k in range(16)], 16, 0.5, lane="interactive", first_token_time=first
        )
    assert s.recent_tpot_s("interactive", now=20.0) is None  # seven: too few to tell
    first = 20.0  # an eighth, slower: 0.3 s a token (its first gap 3 s, then 0.1 s: the whole life counts)
    s.finished(
        24.5, [first] + [first + 3.0 + 0.1 * k for k in range(15)], 16, 0.5, lane="interactive", first_token_time=first
    )
    assert s.recent_tpot_s("interactive", now=25.0) == pytest.approx(4.4 / 15)  # the 90th percentile of 8: the slowest
    assert s.recent_tpot_s("batch", now=25.0) is None  # another lane's streams are not its own
    assert s.recent_tpot_s("interactive", now=71.0) == pytest.approx(4.4 / 15)  # all eight within a minute
    assert s.recent_tpot_s("interactive", now=72.0) is None  # the first is over a minute old: seven left
    # Without the first token's time (or too few tokens for a pace), nothing is recorded.
    s.finished(90.0, [89.0, 89.1, 89.2], 3, 0.5, lane="interactive", first_token_time=89.0)
    s.finished(90.0, [80.0 + 0.1 * k for k in range(16)], 16, 0.5, lane="interactive")
    assert s.recent_tpot_s("interactive", now=90.0) is None
