"""Telling a peer that its pair's group failed, where its own group may not show it (NCCL keeps a
receive waiting when the other side aborts; gloo fails it).

The side that saw the failure writes it under the failed epoch's key (``Channel.failure_key``), then
bumps a counter named for the peer's incarnation (``failures_key``). Each agent's watcher reads its
own counter once per interval while it has channels, and only when the counter moved does it look
up its channels' keys and sever the ones recorded as failed (kv_transfer/agent.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch.distributed as dist

from kv_transfer.channel import Channel
from kv_transfer.peer import PeerInfo

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5  # how often an agent looks for failures its peers recorded
UNREACHABLE_RETRY_S = 5.0


def failures_key(peer: PeerInfo) -> str:
    """A counter of the pair failures that ``peer``'s agent should look at (its watcher reads it)."""
    return f"baton/pair-failures/{peer.key}"


def watch_failures(
    store: dist.Store, me: PeerInfo, open_channels: Callable[[], list[Channel]], closing: threading.Event
) -> None:
    """Until ``closing``: sever the channels (``open_channels()``: not failed) whose group the peer
    recorded as failed. One store call per interval while there are channels. While the store is
    unreachable (our channels' own errors still tell us of failures), it tries again every 5 s."""
    seen, interval, warned = 0, WATCH_INTERVAL_S, False
    while not closing.wait(interval):
        if not open_channels():
            continue
        try:
            n = store.add(failures_key(me), 0)
            interval, warned = WATCH_INTERVAL_S, False
            if n == seen:
                continue
            for ch in open_channels():  # (listed after the counter was read: a channel formed since is checked too)
                if store.check([ch.failure_key]):
                    ch.sever(f"{ch.peer.key} recorded the pair's failure: {store.get(ch.failure_key).decode()}")
            seen = n  # (only once all were checked)
        except Exception as e:  # noqa: BLE001 - any store error: the watcher warns once and keeps polling
            if not warned:
                log.warning("the KV failure watcher of %s cannot reach the store: %s", me.key, e)
            interval, warned = UNREACHABLE_RETRY_S, True
