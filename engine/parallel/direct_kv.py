"""The direct KV handoff between two tensor-parallel groups (a prefill worker's and a decode
worker's, of any sizes): each prefill rank ships the KV heads it holds straight to the decode
rank(s) holding them (``head_routes.handoff_routes``), all ranks at once, over a process group
spanning every rank of both workers (the pair's *handoff group*: prefill ranks first, then decode
ranks). Only the two rank 0s speak on the pair's control plane (kv_transfer/channel.py), one
header per chunk for the whole group; the ranks learn what to do from plans their rank 0
broadcasts on the engine thread, in order with the steps (as ``group_kv``'s are):

- ``HandoffJoin``: form this pair's handoff group (once per pair and epoch), each rank on a thread
  of its own: no engine waits for another worker's (which may be waiting for a third's), and the
  forming is bounded by the store's timeout;
- ``HandoffSend`` (prefill): gather the blocks' heads this rank is the source of and post their
  sends, without waiting (the engine goes on; a later plan reaps them). Sends issued before the
  group formed wait in the rank until it has;
- ``HandoffRecv`` (decode): receive this rank's heads of the blocks from their source ranks
  (bounded by a timeout) and write them into its cache; then every rank says over the group's
  collectives whether it got them and how many bytes (rank 0 acknowledges only if all did;
  ``block_ids`` None drains a transfer no longer wanted, keeping the pair in step);
- ``HandoffClose``: drop the pair's group (its channel failed or closed).

A rank whose receive fails (a source rank died, or sent nothing within the timeout) reports it:
rank 0 fails the pair's channel like a dead peer's, so the decode worker prefills the request
itself. A prefill rank's failed send is only logged: its rank 0 hears of the failure on the
control plane. NCCL carries the payloads on GPU, gloo on CPU: the same calls either way.
"""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from engine.parallel.group import RankGroup
from engine.parallel.head_routes import HeadRoute, handoff_routes, kv_head_range

log = logging.getLogger(__name__)

# An idle pair posts nothing; a send waits for its receive as long as the decode engine takes to
# get to it (its own receive is bounded by ``HandoffRecv.timeout_s``).
_OP_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class HandoffJoin:
    """Form pair ``key``'s handoff group at ``prefix`` in the store at ``host:port``."""

    key: str
    host: str
    port: int
    prefix: str
    role: str  # "prefill" | "decode": this worker's side
    prefill_size: int
    decode_size: int
    timeout_s: float


@dataclass(frozen=True)
class HandoffSend:
    """Ship blocks ``block_ids``' heads to pair ``key``'s decode ranks (the sizes: a send may be
    planned before the pair's group formed)."""

    key: str
    block_ids: tuple[int, ...]
    prefill_size: int
    decode_size: int


@dataclass(frozen=True)
class HandoffRecv:
    """Receive ``num_blocks`` blocks' heads of pair ``key`` into ``block_ids`` (None: discard)."""

    key: str
    num_blocks: int
    block_ids: tuple[int, ...] | None
    timeout_s: float


@dataclass(frozen=True)
class HandoffClose:
    key: str


HandoffPlan = HandoffJoin | HandoffSend | HandoffRecv | HandoffClose


@dataclass
class _Pair:
    group: Any  # (torch's stubs omit the process groups' send and recv)
    role: str
    prefill_size: int
    routes: tuple[HeadRoute, ...]
    sending: list[tuple[Any, torch.Tensor]] = field(default_factory=list)  # posted sends, their buffers kept
    broken: bool = False

    def group_rank(self, role: str, rank: int) -> int:
        return rank if role == "prefill" else self.prefill_size + rank


@dataclass
class HandoffStats:
    """What this rank moved (tests: a rank ships its own heads only)."""

    bytes_sent: int = 0
    bytes_received: int = 0


class RankHandoffs:
    """One rank's side of its worker's handoff groups (rank 0's too). Plans run on the engine
    thread; a group forms on a thread of its own (so that no engine waits on another worker's,
    which may itself wait on a third's), which then posts the sends planned meanwhile."""

    def __init__(self, rank: int, size: int, kv_cache: torch.Tensor, num_kv_heads: int) -> None:
        self.rank, self.size, self.kv_cache, self.num_kv_heads = rank, size, kv_cache, num_kv_heads
        self._lock = threading.Lock()  # the engine thread and the forming threads
        self._pairs: dict[str, _Pair] = {}
        self._forming: dict[str, threading.Event] = {}  # set once the group formed or failed to
        # Gathered sends planned before their pair formed: (decode rank, rows).
        self._waiting: dict[str, list[tuple[int, torch.Tensor]]] = {}
        self.stats = HandoffStats()

    @property
    def pairs(self) -> int:
        with self._lock:
            return len(self._pairs) + len(self._forming)

    def has(self, key: str) -> bool:
        """Whether pair ``key``'s group formed here (and has not failed)."""
        with self._lock:
            pair = self._pairs.get(key)
            return pair is not None and not pair.broken

    def wait_formed(self, key: str, timeout_s: float) -> bool:
        """Any thread: wait until pair ``key``'s group formed (True) or failed to (False)."""
        with self._lock:
            forming = self._forming.get(key)
        if forming is not None:
            forming.wait(timeout_s)
        return self.has(key)

    def apply(self, plan: HandoffPlan) -> tuple[int, int]:
        """Run ``plan``; (failed, bytes received): what this rank reports of a receive, else (0, 0)."""
        self._reap()
        if isinstance(plan, HandoffJoin):
            with self._lock:
                self._forming[plan.key] = threading.Event()
            threading.Thread(target=self._form, args=(plan,), name=f"kv-handoff-{self.rank}", daemon=True).start()
        elif isinstance(plan, HandoffSend):
            self._send(plan)
        elif isinstance(plan, HandoffRecv):
            return self._recv(plan)
        else:
            with self._lock:
                self._waiting.pop(plan.key, None)
                self._pairs.pop(plan.key, None)
                forming = self._forming.pop(plan.key, None)
            if forming is not None:
                forming.set()  # (a group still forming is dropped when it has: _form)
        return 0, 0

    def _form(self, plan: HandoffJoin) -> None:
        size = plan.prefill_size + plan.decode_size
        rank = self.rank if plan.role == "prefill" else plan.prefill_size + self.rank
        group: Any = None
        try:
            store = dist.TCPStore(
                plan.host,
                plan.port,
                is_master=False,
                timeout=datetime.timedelta(seconds=plan.timeout_s),
                wait_for_workers=False,
            )
            prefixed = dist.PrefixStore(plan.prefix, store)
            if self.kv_cache.device.type == "cuda":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = _OP_TIMEOUT
                group = dist.ProcessGroupNCCL(prefixed, rank, size, opts)
            else:
                group = dist.ProcessGroupGloo(prefixed, rank, size, _OP_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - rank 0 sees its own failure; the others' receives fail
            log.warning("rank %d: could not form handoff group %s: %s", self.rank, plan.key, e)
        routes = handoff_routes(self.num_kv_heads, plan.prefill_size, plan.decode_size)
        with self._lock:
            forming = self._forming.pop(plan.key, None)
            waiting = self._waiting.pop(plan.key, [])
            if forming is None or group is None:  # closed while it formed, or it did not form
                if forming is not None:
                    forming.set()
                return
            pair = self._pairs[plan.key] = _Pair(group, plan.role, plan.prefill_size, routes)
            for dst, rows in waiting:
                self._post(pair, dst, rows)
        forming.set()

    def _send(self, plan: HandoffSend) -> None:
        if not plan.block_ids:
            return
        lo, _ = kv_head_range(self.rank, self.size, self.num_kv_heads)
        idx = torch.tensor(plan.block_ids, dtype=torch.long, device=self.kv_cache.device)
        routes = handoff_routes(self.num_kv_heads, plan.prefill_size, plan.decode_size)
        # Gathered now, on the engine thread: the blocks may be reused once acknowledged.
        blocks = self.kv_cache.index_select(0, idx) if any(r.src == self.rank for r in routes) else None
        with self._lock:
            pair = self._pairs.get(plan.key)
            for route in routes:
                if route.src != self.rank or blocks is None:
                    continue
                rows = blocks[..., route.first_head - lo : route.end_head - lo, :].contiguous()
                if pair is not None:
                    self._post(pair, route.dst, rows)
                else:  # (dropped with the pair if it never forms: HandoffClose)
                    self._waiting.setdefault(plan.key, []).append((route.dst, rows))

    def _post(self, pair: _Pair, dst: int, rows: torch.Tensor) -> None:
        """(Under the lock.)"""
        if pair.broken:
            return
        try:
            work = pair.group.send([rows], pair.group_rank("decode", dst), 0)
        except RuntimeError as e:
            self._broke(pair, f"send to decode rank {dst} failed: {e}")
            return
        pair.sending.append((work, rows))
        self.stats.bytes_sent += rows.numel() * rows.element_size()

    def _recv(self, plan: HandoffRecv) -> tuple[int, int]:
        if not self.wait_formed(plan.key, plan.timeout_s):
            return 1, 0
        with self._lock:
            pair = self._pairs.get(plan.key)
        if pair is None:
            return 1, 0
        if plan.num_blocks == 0:
            return 0, 0
        lo, _ = kv_head_range(self.rank, self.size, self.num_kv_heads)
        shape = self.kv_cache.shape
        got: list[tuple[HeadRoute, torch.Tensor, Any]] = []
        try:
            for route in pair.routes:
                if route.dst != self.rank:
                    continue
                heads = route.end_head - route.first_head
                buf = torch.empty(
                    (plan.num_blocks, *shape[1:4], heads, shape[5]),
                    dtype=self.kv_cache.dtype,
                    device=self.kv_cache.device,
                )
                got.append((route, buf, pair.group.recv([buf], pair.group_rank("prefill", route.src), 0)))
            for _, _, work in got:
                work.wait(datetime.timedelta(seconds=plan.timeout_s))
        except RuntimeError as e:  # a source rank died, or sent nothing in time
            with self._lock:
                self._broke(pair, f"receive failed: {e}")
            return 1, 0
        received = sum(buf.numel() * buf.element_size() for _, buf, _ in got)
        self.stats.bytes_received += received
        if plan.block_ids is not None:
            idx = torch.tensor(plan.block_ids, dtype=torch.long, device=self.kv_cache.device)
            for route, buf, _ in got:
                self.kv_cache[..., route.first_head - lo : route.end_head - lo, :].index_copy_(0, idx, buf)
        return 0, received

    def _reap(self) -> None:
        """Let go of the buffers of sends that completed (a failed one breaks its pair)."""
        with self._lock:
            for pair in self._pairs.values():
                still = []
                for work, rows in pair.sending:
                    if not work.is_completed():
                        still.append((work, rows))
                        continue
                    try:
                        work.wait()
                    except RuntimeError as e:
                        self._broke(pair, f"a send failed: {e}")
                pair.sending = still

    def _broke(self, pair: _Pair, why: str) -> None:
        """(Under the lock.)"""
        if not pair.broken:
            log.warning("rank %d: a KV handoff group failed (%s); it carries nothing more", self.rank, why)
        pair.broken = True
        pair.sending = []


class PlanBroadcaster(Protocol):
    """Rank 0's side of a group (``engine/parallel/launcher.Ranks``), as far as a handoff uses it."""

    group: RankGroup

    def broadcast_plan(self, plan: HandoffPlan) -> None: ...


def run_handoff(ranks: PlanBroadcaster | None, handoffs: RankHandoffs, plan: HandoffPlan) -> tuple[int, int]:
    """Rank 0 (or a one-rank engine), on the engine thread: every rank runs ``plan``; for a receive,
    (ranks that failed, bytes received by all)."""
    if ranks is not None:
        ranks.broadcast_plan(plan)
    failed, received = handoffs.apply(plan)
    if ranks is not None and isinstance(plan, HandoffRecv):
        return report(ranks.group, failed, received)
    return failed, received


def report(group: RankGroup, failed: int, received: int) -> tuple[int, int]:
    """Every rank of a receive says how it went; all get the sums."""
    t = torch.tensor([failed, received], dtype=torch.int64)
    group.cpu.allreduce([t]).wait()
    return int(t[0]), int(t[1])
