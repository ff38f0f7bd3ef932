"""A worker's side of the direct KV handoff (engine/parallel/direct_kv.py), as its transfer agent
drives it: the pairs with a peer where either worker is a tensor-parallel group ship each rank's
heads rank to rank over the pair's handoff group, while the agent's control plane carries one
header per chunk for the group (flagged ``FLAG_DIRECT``; no payload follows it there).

Every call ends up on the engine thread, where rank 0 broadcasts the plans to its ranks in order
with the steps: ``send`` is called there already (the prefill worker ships after a step); the
channel threads' ``join``, ``close`` and ``receive`` are queued onto it. The receives run in the
order their headers arrived, so a chunk's acknowledgement never overtakes an earlier chunk's
receive; a decode worker's blocks are checked to still be the transfer's, and written, on the
engine thread, where cancelling a transfer happens too (so a cancelled transfer's blocks, maybe
reused by then, are never written: its heads are received and dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from engine.engine import LLMEngine
from engine.engine_loop import EngineLoop
from engine.parallel.direct_kv import HandoffClose, HandoffJoin, HandoffRecv, HandoffSend, RankHandoffs, run_handoff
from kv_transfer.peer import PeerInfo, StoreAddress

log = logging.getLogger(__name__)

# (Whether the receive went well for every rank, the bytes all of them received.)
Landed = Callable[[bool, int], None]


class GroupHandoff:
    def __init__(
        self, loop: EngineLoop, store: StoreAddress, me: PeerInfo, *, receive_timeout_s: float, join_timeout_s: float
    ) -> None:
        engine = loop.engine
        self._loop, self._store, self.me = loop, store, me
        self.receive_timeout_s, self.join_timeout_s = receive_timeout_s, join_timeout_s
        self.handoffs = RankHandoffs(
            0, engine.config.tensor_parallel_size, engine.runner.kv_cache, engine.model_config.num_key_value_heads
        )

    def uses(self, peer: PeerInfo) -> bool:
        """Whether the pair with ``peer`` hands off rank to rank (both sides decide alike)."""
        return self.me.tensor_parallel_size > 1 or peer.tensor_parallel_size > 1

    @staticmethod
    def key(peer: PeerInfo, epoch: int) -> str:
        return f"{peer.key}/{epoch}"

    def join(self, peer: PeerInfo, epoch: int, prefix: str) -> None:
        """Channel thread: every rank of this worker joins the pair's handoff group at ``prefix``;
        returns once this rank 0 has (raises ConnectionError if it could not)."""
        plan = HandoffJoin(
            self.key(peer, epoch),
            self._store.host,
            self._store.port,
            prefix,
            self.me.role,
            *self._sizes(peer),
            self.join_timeout_s,
        )
        # The engine thread only starts the forming (every rank on a thread of its own): an engine
        # waiting for another worker's, which may wait for a third's, could close a cycle.
        self._loop.call(lambda e: self._run(e, plan), self.join_timeout_s)
        if not self.handoffs.wait_formed(plan.key, self.join_timeout_s + 5.0):
            raise ConnectionError(f"the handoff group with {peer.key} did not form")

    def close(self, peer: PeerInfo, epoch: int) -> None:
        """Any thread: the pair's channel ended; its ranks drop the group (and sends still held)."""
        self._loop.call_async(lambda e: self._run(e, HandoffClose(self.key(peer, epoch))))

    def send(self, peer: PeerInfo, epoch: int, block_ids: Sequence[int]) -> None:
        """Engine thread: every rank gathers its heads of ``block_ids`` and ships them to the peer's."""
        prefill, decode = self._sizes(peer)
        self._run(self._loop.engine, HandoffSend(self.key(peer, epoch), tuple(block_ids), prefill, decode))

    def receive(
        self, peer: PeerInfo, epoch: int, num_blocks: int, block_ids: Callable[[], list[int] | None], landed: Landed
    ) -> None:
        """Channel thread: queue a chunk's receive on the engine thread; ``block_ids`` is asked there
        (None: the transfer is no longer wanted, drain it), then ``landed`` runs there too."""

        def run(engine: LLMEngine) -> None:
            if num_blocks == 0:  # (a last chunk with no blocks of its own: nothing travels)
                landed(True, 0)
                return
            ids = block_ids()
            plan = HandoffRecv(
                self.key(peer, epoch), num_blocks, None if ids is None else tuple(ids), self.receive_timeout_s
            )
            try:
                failed, received = self._run(engine, plan)
            except Exception as e:  # noqa: BLE001 - a group short of a rank: the transfer fails, as a dead peer's
                log.warning("the handoff from %s failed: %s", peer.key, e)
                failed, received = 1, 0
            landed(failed == 0, received)

        self._loop.call_async(run)

    def _sizes(self, peer: PeerInfo) -> tuple[int, int]:
        """(prefill size, decode size) of the pair with ``peer``."""
        prefill, decode = (self.me, peer) if self.me.role == "prefill" else (peer, self.me)
        return prefill.tensor_parallel_size, decode.tensor_parallel_size

    def _run(self, engine: LLMEngine, plan: HandoffJoin | HandoffSend | HandoffRecv | HandoffClose) -> tuple[int, int]:
        return run_handoff(engine.ranks, self.handoffs, plan)
