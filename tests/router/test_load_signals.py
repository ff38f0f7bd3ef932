"""What admission measures (pure Python): the service overhead and the time per output token by
lane from finished requests, the live decode pace, a running request's expected length."""

import pytest

from router.load_signals import LoadSignals, expected_total_tokens, live_decode_pace, service_overhead


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


def test_service_overhead_leaves_out_prefill_queueing_and_compute():
    assert service_overhead(2.5, prefill_queue_s=1.9, prefill_compute_s=0.4) == pytest.approx(0.2)
    assert service_overhead(0.3, prefill_queue_s=0.2, prefill_compute_s=0.2) == 0.0  # clock skew: never negative


def test_live_decode_pace_is_the_median_stream_pace_and_sees_stalls():
    steady = [0.0, 0.1, 0.2, 0.3, 0.4]  # 0.1 s per token
    slow = [0.0, 0.5, 1.0, 1.5, 2.0]  # 0.5 s per token
    assert live_decode_pace([], now=2.0) is None
    assert live_decode_pace([[0.0, 1.0]], now=2.0) is None  # too few tokens to tell
    assert live_decode_pace([steady, steady, slow], now=0.45) == pytest.approx(0.1)
    assert live_decode_pace([slow, slow, steady], now=2.05) == pytest.approx(0.5)
    # Tokens delivered in one poll (zero gaps) and then nothing for 0.8 s: the step in progress counts.
    assert live_decode_pace([[1.0, 1.0, 1.0, 1.0]], now=1.8) == pytest.approx(0.8)


def test_expected_length_of_a_running_request():
    assert expected_total_tokens(10, 4096, None) == 4096  # nothing measured: its max_tokens
    assert expected_total_tokens(10, 4096, 120.0) == 120  # typical length, within its budget
    assert expected_total_tokens(150, 4096, 120.0) == 151  # already longer: at least one more
    assert expected_total_tokens(3, 16, 120.0) == 16  # never beyond max_tokens
