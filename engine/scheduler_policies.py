"""Small policy objects the scheduler composes: queue order, admission, preemption victims.

Pure Python. Priority: lower value is more important (lanes map onto it); ties go to arrival order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from engine.request import Request


class WaitingQueue:
    """Requests waiting for admission, most important first, then oldest first.

    Removal is lazy and keyed by ``arrival_seq``, unique to one registration: an aborted request's
    id may be reused at once by a new request, whose entry must not be mistaken for the old one.
    Requests and tokens to compute by priority are kept as entries come and go, for the lane shares
    to read each step without a pass over the queue."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Request]] = []
        self._removed: set[int] = set()  # arrival_seq of entries removed but still in the heap
        self._len = 0
        self._count: dict[int, int] = {}  # live entries by priority
        self._tokens: dict[int, int] = {}  # their tokens to compute by priority ...
        self._entry_tokens: dict[int, int] = {}  # ... each entry's, as pushed (arrival_seq -> tokens)

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_seq, req))
        self._len += 1
        n = req.num_tokens - req.num_computed_tokens
        self._entry_tokens[req.arrival_seq] = n
        p = req.priority
        self._count[p] = self._count.get(p, 0) + 1
        self._tokens[p] = self._tokens.get(p, 0) + n

    def _gone(self, priority: int, seq: int) -> None:
        n = self._entry_tokens.pop(seq, None)
        if n is not None:
            self._count[priority] -= 1
            self._tokens[priority] -= n

    def peek(self) -> Request | None:
        self._drop_removed()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Request:
        self._drop_removed()
        self._len -= 1
        req = heapq.heappop(self._heap)[2]
        self._gone(req.priority, req.arrival_seq)
        self._compact()  # (the last live one gone: only removed entries are left, behind it)
        return req

    def remove(self, req: Request) -> None:
        """Lazy removal (abort); the entry is skipped when it reaches the head."""
        self._removed.add(req.arrival_seq)
        self._len -= 1
        self._gone(req.priority, req.arrival_seq)
        self._compact()

    def more_important_than(self, priority: int) -> Iterator[Request]:
        """The waiting requests of a lower priority value (unordered)."""
        return (r for p, seq, r in self._heap if p < priority and seq not in self._removed)

    def count_by_priority(self) -> dict[int, int]:
        """Waiting requests by priority."""
        return {p: n for p, n in self._count.items() if n}

    def tokens_by_priority(self) -> dict[int, int]:
        """Tokens the waiting requests have to compute (prompt, or all they had after a preemption),
        by priority, as they were when queued (a prefix-cache hit is found only at admission)."""
        return {p: n for p, n in self._tokens.items() if n}

    def _compact(self) -> None:
        """Removed entries that never reach the head (the queue emptied, or more important requests
        keep arriving ahead of them) go once they are over half the heap: 5,000 aborted queued
        prompts kept ~150 MB for good. Amortized O(1) a removal."""
        if len(self._removed) > len(self._heap) // 2:
            self._heap = [e for e in self._heap if e[1] not in self._removed]
            heapq.heapify(self._heap)
            self._removed.clear()

    def _drop_removed(self) -> None:
        heap = self._heap
        while heap and heap[0][1] in self._removed:
            self._removed.discard(heapq.heappop(heap)[1])

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        return (r for _, seq, r in sorted(self._heap) if seq not in self._removed)


class AdmissionPolicy:
    """Continuous batching: admit whenever there is room."""

    hold_finished = False  # whether finished rows stay in the batch as padding

    def admission_limit(self, num_running: int, max_num_seqs: int, num_waiting: int) -> int:
        return max_num_seqs - num_running

    def admits(self, req: Request) -> bool:
        """Whether ``req`` may join the running batch now (room aside)."""
        return True

    def admitted(self, req: Request) -> None:
        """``req`` joined the running batch."""


class StaticBatchAdmission(AdmissionPolicy):
    """Static batching baseline: a batch is the ``batch_size`` requests (or fewer, if fewer wait)
    waiting when the previous batch has fully finished. It fills over as many steps as the token
    budget needs to start all their prompts (16 prompts of ~160 tokens take two steps of 2,048), and
    then takes no one until its longest request ends (its finished rows stay running, as padding,
    so the running count is the batch's admitted count)."""

    hold_finished = True

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self._quota = 0  # requests the current batch takes in all
        # Its members: a place freed mid-batch (an abort, a padding row released, a preemption) is
        # taken back only by the member that left it, never by a newcomer.
        self._members: set[str] = set()

    def admission_limit(self, num_running: int, max_num_seqs: int, num_waiting: int) -> int:
        if num_running == 0:  # the previous batch has left: the next one is what waits now
            self._quota = min(self.batch_size, max_num_seqs, num_waiting)
            self._members.clear()
        return max(self._quota - num_running, 0)

    def admits(self, req: Request) -> bool:
        return req.request_id in self._members or len(self._members) < self._quota

    def admitted(self, req: Request) -> None:
        self._members.add(req.request_id)


class PreemptionPolicy:
    """Victim: a static batch's padding row first (a finished request: releasing it loses nothing),
    then a preemptible request (its lane's ``preemptible``) before any other, and among those the
    least important, newest first (it has the least work to redo)."""

    def pick_victim(self, running: list[Request]) -> Request:
        return max(running, key=lambda r: (r.is_padding, r.preemptible, r.priority, r.arrival_seq))
