"""The sender's staging buffers (kv_transfer/send_buffers.py): gathered rows are exact, a buffer
comes back to be reused, the smallest fitting one is taken, and at most ``keep`` stay idle."""

import torch

from kv_transfer.send_buffers import SendBuffers


def test_gathers_exactly_and_reuses_returned_buffers():
    cache = torch.randn(10, 3, 4)
    bufs = SendBuffers((3, 4), torch.float32)
    rows, sent = bufs.gather(cache, torch.tensor([7, 2, 5]))
    assert torch.equal(rows, cache[[7, 2, 5]])
    sent()
    again, sent_again = bufs.gather(cache, torch.tensor([1, 0]))  # smaller: the same buffer serves
    assert torch.equal(again, cache[[1, 0]]) and again.data_ptr() == rows.data_ptr()
    assert bufs.allocated == 1
    sent_again()


def test_a_buffer_in_flight_is_never_handed_out_and_idle_ones_are_capped():
    cache = torch.randn(10, 2)
    bufs = SendBuffers((2,), torch.float32, keep=2)
    held = [bufs.gather(cache, torch.tensor(list(range(n)))) for n in (1, 2, 3)]
    assert len({rows.data_ptr() for rows, _ in held}) == 3  # none shared while not yet sent
    for _, sent in held:
        sent()
    assert bufs.idle() == 2  # the smallest was dropped
    rows, _ = bufs.gather(cache, torch.tensor([4, 5, 6]))
    assert bufs.allocated == 3 and torch.equal(rows, cache[[4, 5, 6]])
