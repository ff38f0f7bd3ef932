"""Shared prefixes in flight, for the scheduler's admission (pure Python, no torch).

A waiting request whose next uncached prompt block is one that a running request has yet to compute
(same chained hash, so the same prefix) is passed over this step, and the requests behind it are
considered; once that block is computed (registered as it is scheduled), the request is admitted
with it as a cache hit. A burst of prompts with a common system prompt computes it once, not once
per request (``SchedulerConfig.defer_for_shared_prefix``). ``Scheduler`` mixes this in; its
``_admit`` asks these questions.
"""

from __future__ import annotations

from engine.request import Request


class SharedPrefixMixin:
    def _uncomputed_prompt_blocks(self, req: Request) -> list:
        """Hashes of ``req``'s full prompt blocks not yet registered (still to be computed)."""
        return req.block_hashes[req.num_registered_blocks : req.num_prompt_tokens // self.block_manager.block_size]

    def _prompt_blocks_in_flight(self) -> set:
        """Hashes of the full prompt blocks running requests have yet to compute."""
        bs = self.block_manager.block_size
        out: set = set()
        for r in self.running:
            if r.num_registered_blocks < r.num_prompt_tokens // bs:
                if len(r.block_hashes) < r.num_prompt_tokens // bs:
                    self.block_manager.update_block_hashes(r)
                out.update(self._uncomputed_prompt_blocks(r))
        return out
