"""The request-state table: every allowed transition works, every other one is refused."""

import pytest

from engine.request import ALLOWED_TRANSITIONS, IllegalTransitionError, Request, RequestState
from engine.sampling_params import SamplingParams


def _req_in(state: RequestState) -> Request:
    r = Request("r", [1, 2, 3], SamplingParams())
    r.state = state
    return r


@pytest.mark.parametrize("src", list(RequestState))
@pytest.mark.parametrize("dst", list(RequestState))
def test_every_transition_follows_the_table(src, dst):
    r = _req_in(src)
    if dst in ALLOWED_TRANSITIONS[src]:
        r.transition(dst)
        assert r.state is dst
    else:
        with pytest.raises(IllegalTransitionError):
            r.transition(dst)
        assert r.state is src


def test_terminal_states_have_no_exit_and_every_live_state_can_abort():
    for s in RequestState:
        if s.is_terminal:
            assert not ALLOWED_TRANSITIONS[s]
        else:
            assert RequestState.ABORTED in ALLOWED_TRANSITIONS[s]


def test_every_state_is_reachable_from_queued():
    seen, frontier = {RequestState.QUEUED}, [RequestState.QUEUED]
    while frontier:
        for nxt in ALLOWED_TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(RequestState)


def test_token_accounting():
    r = Request("r", [5, 6, 7], SamplingParams(max_tokens=4))
    assert (r.num_tokens, r.num_output_tokens, r.max_total_tokens) == (3, 0, 7)
    r.append_token(9)
    assert r.output_token_ids == [9] and r.num_tokens == 4
