"""longrope's two rotary states (Phi-3/3.5): which requests are rotated with the long factors, and
the crossing from short to long (pure Python, no torch).

transformers rotates every position of a forward pass with the long factors when the sequence (the
token being fed included) is longer than the original length, and with the short ones otherwise: a
prompt longer than it is prefilled with the long factors, and when a generation grows past it,
``Phi3ForCausalLM.prepare_inputs_for_generation`` drops the cache and computes the whole sequence
again with the long factors. The same here, per request: one that arrives longer than the original
length (a long prompt, or a resumed one) is long from the start; a short one whose next decode would
feed a token past it is preempted by recompute and turned long. It keeps every token delivered (its
client sees each token once) and computes prompt + generated again with the long factors. Its block
hashes change with the state (engine/block_hash.py), so neither state's cached blocks serve the
other. A prefill and a decode worker decide a prompt's state the same way; a decode worker whose
request crosses recomputes it locally.

Transitions it makes: DECODING → PREEMPTED (the crossing, through ``RequestLifecycle.preempt``).
"""

from __future__ import annotations

from engine.request import Request, RequestState
from engine.scheduler_lifecycle import RequestLifecycle


class LongRope:
    def __init__(self, original_len: int, lifecycle: RequestLifecycle) -> None:
        self.original_len = original_len
        self.lifecycle = lifecycle
        self.num_crossings = 0  # requests recomputed with the long factors after passing the original length

    def admit(self, req: Request) -> None:
        """A request about to be computed from its first token (added, or reserved by a decode
        worker): long if its known tokens pass the original length."""
        if not req.long_rope and req.num_tokens > self.original_len:
            req.use_long_rope()

    def cross(self, running: list[Request]) -> int:
        """Preempt (by recompute, turned long) every short decoding request whose next token would
        be fed past the original length; returns how many. A short request's drafts (speculative
        decoding) are cut to end within it: the tokens fed past it are computed long, after the
        crossing."""
        n, decoding = self.original_len, RequestState.DECODING
        crossing = []
        for r in running:
            if r.long_rope or r.state is not decoding:
                continue
            if r.num_computed_tokens >= n:
                crossing.append(r)
            elif r.spec_token_ids and r.num_computed_tokens + 1 + len(r.spec_token_ids) > n:
                r.spec_token_ids = r.spec_token_ids[: n - r.num_computed_tokens - 1]
        for req in crossing:
            self.lifecycle.preempt(req)
            req.use_long_rope()
        self.num_crossings += len(crossing)
        return len(crossing)
