"""The scheduler's side of speculative decoding (engine/spec_decode.py), pure Python.

A decoding request with drafts is scheduled like a short chunk: its last token and its drafts, all
advanced in ``num_computed_tokens`` when scheduled (a short budget cuts the drafts). After the step,
``take_verified`` appends the drafts the runner kept and the runner's own next token, stopping
where a stop token or ``max_tokens`` ends the request (DECODING → FINISHED), and gives back the
rejected drafts' positions; ``draft`` proposes the next step's drafts.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.block_manager import BlockManager
from engine.logprobs import TokenLogprob
from engine.request import FinishReason, Request, RequestState, check_stop
from engine.spec_decode import NgramProposer


class Speculation:
    def __init__(
        self,
        drafter: NgramProposer,
        block_manager: BlockManager,
        max_model_len: int,
        finish: Callable[[Request, FinishReason], None],
    ) -> None:
        self.drafter = drafter
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.finish = finish
        self.num_draft_tokens = 0  # drafted tokens computed, and of those kept
        self.num_accepted_tokens = 0

    def take_verified(
        self, req: Request, accepted: list[int], tok: int, logprobs: list[TokenLogprob] | None = None
    ) -> None:
        """A decode step with drafts: the drafts the model agreed with, then its own next token, each
        checked for a stop. The rejected drafts' KV positions are given back (their slots are written
        again by the tokens that take those positions); the blocks stay with the request."""
        drafts, req.spec_token_ids = req.spec_token_ids, []
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += len(accepted)
        state = req.draft_state
        assert state is not None  # it drafted, so the proposer gave it one
        self.drafter.record(state, len(drafts), len(accepted))
        req.num_computed_tokens -= len(drafts) - len(accepted)
        max_len = self.max_model_len
        for i, t in enumerate((*accepted, tok)):
            req.all_token_ids.append(t)
            if logprobs is not None:
                req.pending_logprobs.append(logprobs[i])
            reason = check_stop(req, t, max_len)
            if reason is not None:
                self.finish(req, reason)
                return
        if self.block_manager.enable_prefix_caching:  # blocks the kept drafts filled (KV now written)
            self.block_manager.register_full_blocks(req, req.num_computed_tokens)

    def draft(self, updated: list[Request]) -> None:
        """Drafts for the next step of every request still decoding."""
        drafter, max_len, decoding = self.drafter, self.max_model_len, RequestState.DECODING
        for req in updated:
            if req.state is decoding:
                # The step computes positions up to len + drafts - 1 and may keep every draft plus
                # one more token: all within max_tokens and the context.
                room = min(req.max_total_tokens, max_len) - len(req.all_token_ids) - 1
                req.spec_token_ids = drafter.propose(req, room)
