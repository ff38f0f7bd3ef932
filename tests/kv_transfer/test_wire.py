"""The transfer header round-trips every field, the first token's logprobs bit for bit included."""

import pytest
import torch

from engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from kv_transfer.wire import FLAG_LAST, HEADER_LEN, Header, Kind, empty_header


def _round_trip(h: Header) -> Header:
    t = h.to_tensor(torch.device("cpu"))
    assert t.shape == empty_header(torch.device("cpu")).shape == (HEADER_LEN,)
    return Header.from_tensor(t)


def test_header_round_trips_with_and_without_logprobs():
    plain = Header(Kind.KV, 7, 3, 16, 4, FLAG_LAST, 1234, 5, 6, 1_700_000_000_000_000)
    assert _round_trip(plain) == plain and plain.first_logprob is None
    top = tuple((i * 7, -0.1 * i - 1e-9) for i in range(MAX_TOP_LOGPROBS))
    lp = TokenLogprob(1234, -0.123456789012345, top)
    with_lp = Header(Kind.KV, 7, 3, 16, 4, FLAG_LAST, 1234, first_logprob=lp)
    assert _round_trip(with_lp) == with_lp  # exact: float64 bit patterns
    zero_top = Header(Kind.KV, 1, first_token=9, first_logprob=TokenLogprob(9, -float("inf")))
    assert _round_trip(zero_top).first_logprob == TokenLogprob(9, -float("inf"), ())


def test_a_header_out_of_sync_is_refused():
    t = Header(Kind.ACK, 1).to_tensor(torch.device("cpu"))
    t[0] = 0
    with pytest.raises(ValueError, match="magic"):
        Header.from_tensor(t)
