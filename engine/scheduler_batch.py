"""The running batch: the requests the scheduler may schedule, each holding one of ``max_num_seqs``
slots (its row in the runner's persistent batch). Pure Python, no torch.

It remembers what the runner must be told: requests that joined and have no row yet (sent in full
once scheduled), and those that left (their rows freed) since the last step was built.
"""

from __future__ import annotations

from engine.request import Request


class RunningBatch:
    def __init__(self, max_num_seqs: int) -> None:
        self.requests: list[Request] = []  # in the order they joined
        self.slot_req: list[Request | None] = [None] * max_num_seqs
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.unseen: set[str] = set()  # joined, and the runner has no row for them yet
        self._left: set[str] = set()  # finished/aborted/preempted since the last take_left()
        self.by_priority: dict[int, int] = {}  # running requests by priority (the lane shares read it each step)

    def __len__(self) -> int:
        return len(self.requests)

    def join(self, req: Request) -> None:
        req.slot = self._free_slots.pop()
        self.slot_req[req.slot] = req
        self.requests.append(req)
        self.unseen.add(req.request_id)
        self.by_priority[req.priority] = self.by_priority.get(req.priority, 0) + 1

    def leave(self, req: Request) -> None:
        self.requests.remove(req)
        self.by_priority[req.priority] -= 1
        self.unseen.discard(req.request_id)
        self._left.add(req.request_id)
        self.slot_req[req.slot] = None
        self._free_slots.append(req.slot)
        req.slot = -1

    def take_left(self) -> set[str]:
        """The ids that left since the last call (the runner drops their rows)."""
        left, self._left = self._left, set()
        return left
