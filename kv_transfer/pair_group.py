"""A two-rank process group for one prefill/decode pair, formed from the rendezvous store.

No global world: ``ProcessGroupGloo`` (CPU tensors) or ``ProcessGroupNCCL`` (CUDA tensors) is built
directly over ``PrefixStore(pair_key, TCPStore client)``, so a pair can be formed at any time, and
formed again with a restarted peer (its new incarnation gives a new key).

Before the group, each side writes what its KV rows are (shape and dtype) under the pair's prefix
and waits up to ``connect_timeout_s`` for the other's: gloo's own rendezvous waits for the group's
op timeout (24 h, so that idle channels live), and a peer that never joins held the transfers
queued for it, and their blocks, that long. Rows that differ (another block size, head count or
dtype) fail the pair with both geometries named: the payload would be cut short or read as the
wrong layout, and gloo aborts the receiving process on a payload larger than its buffer.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from kv_transfer.peer import PeerInfo, StoreAddress, pair_key

# Idle channels wait for their next message indefinitely; liveness comes from connection errors
# and from the transfer deadlines enforced above this layer.
_OP_TIMEOUT = datetime.timedelta(hours=24)


def connect_store(addr: StoreAddress, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(addr.host, addr.port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def form_pair_group(
    store: dist.Store, me: PeerInfo, peer: PeerInfo, device: torch.device, connect_timeout_s: float,
    rows: str = "",
) -> tuple[dist.ProcessGroup, int]:
    """Blocks until the peer joins (or ``connect_timeout_s`` passes: DistStoreError). ``rows``
    describes this side's KV rows; the peer's must be the same (ValueError). Returns (group, peer rank)."""
    prefill, decode = (me, peer) if me.role == "prefill" else (peer, me)
    if prefill.role != "prefill" or decode.role != "decode":
        raise ValueError(f"a pair is one prefill and one decode worker, got {me.role} and {peer.role}")
    rank = 0 if me is prefill else 1
    prefixed = dist.PrefixStore(pair_key(prefill, decode), store)
    timeout = datetime.timedelta(seconds=connect_timeout_s)
    prefixed.set_timeout(timeout)
    prefixed.set(f"rows/{rank}", rows)
    prefixed.wait([f"rows/{1 - rank}"], timeout)
    theirs = prefixed.get(f"rows/{1 - rank}").decode()
    if theirs != rows:
        raise ValueError(f"the two workers' KV rows differ: {me.key} has {rows}, {peer.key} has {theirs} "
                         "(run both pools with the same model, dtype and block size)")
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = _OP_TIMEOUT
        group = dist.ProcessGroupNCCL(prefixed, rank, 2, opts)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, 2, _OP_TIMEOUT)
    return group, 1 - rank
