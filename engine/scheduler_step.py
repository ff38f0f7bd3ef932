"""What one ``Scheduler.schedule()`` call has decided so far, shared by its passes (pure Python).

A step is planned in passes: the decodes (one token each, the hot loop), then the other running
requests (prompt chunks, recomputes, static padding rows), then admissions. A preemption in any pass
may take back a request an earlier pass scheduled; ``StepPlan.unschedule`` returns its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Request


@dataclass(slots=True)
class StepPlan:
    budget: int  # tokens left this step
    prefill_budget: int  # of those, tokens left for prompt chunks (decodes never wait for it)
    # Decodes, one token each, their num_computed_tokens already advanced (the step computes them).
    decodes: list[Request] = field(default_factory=list)
    filled: list[Request] = field(default_factory=list)  # decodes whose token fills their last block
    # Everything else, with its token count: advanced when the plan is settled.
    chunks: list[Request] = field(default_factory=list)
    chunk_counts: list[int] = field(default_factory=list)
    grew: dict[Request, int] = field(default_factory=dict)  # request -> len(block_ids) before this step
    preempted: int = 0

    def unschedule(self, req: Request) -> None:
        """Take ``req`` (a preemption's victim) out of the plan, if it is in it, and give back its
        tokens."""
        if req in self.decodes:
            self.decodes.remove(req)
            if req in self.filled:
                self.filled.remove(req)
            req.num_computed_tokens -= 1
            self.budget += 1
        elif req in self.chunks:
            i = self.chunks.index(req)
            n = self.chunk_counts[i]
            self.budget += n
            if n > 1 and not req.spec_token_ids:  # (a decode's drafts took no prompt budget)
                self.prefill_budget += n
            del self.chunks[i], self.chunk_counts[i]
        self.grew.pop(req, None)


def decodes_first(running: list[Request]) -> list[Request]:
    """The running requests, those with one token to compute first (each group in order)."""
    decodes: list[Request] = []
    rest: list[Request] = []
    for r in running:
        (decodes if len(r.all_token_ids) - r.num_computed_tokens == 1 else rest).append(r)
    return decodes + rest
