"""A request's structured-output constraint compiled before it is queued: a schema, regex or grammar
the backend cannot compile (or not within the budget) is a 400 naming its field, never a failure on
a worker. Compiled on a thread (the event loop serves every other request meanwhile), with the
compiler's LRU cache, so a schema sent again costs a lookup."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from engine.errors import InvalidParameterError
from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.structured.compiler import CompileBudget, GrammarCompiler
from engine.structured.constraint import ConstraintKind, StructuredOutput
from router.api import invalid
from router.tool_calls.constraint import FunctionTool

COMPILE_BUDGET_S = CompileBudget().wall_s  # wall-clock bound over the compiler's own fuel limits (as workers')


class GrammarCheck:
    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, budget_s: float = COMPILE_BUDGET_S) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.budget_s = budget_s
        self._compiler: GrammarCompiler | None = None  # built at the first constrained request

    async def check(self, sampling: SamplingParams, tools: Sequence[FunctionTool] = ()) -> None:
        """The request's constraint and its tools' parameters schemas compile (else a 400 naming the field)."""
        for i, tool in enumerate(tools):
            field = f"tools.[{i}].function.parameters"
            await self._compile(StructuredOutput(ConstraintKind.JSON_SCHEMA, tool.parameters, field))
        if sampling.structured is not None:
            await self._compile(sampling.structured)

    async def _compile(self, c: StructuredOutput) -> None:
        if self.tokenizer is None:
            raise invalid("structured outputs need the model's tokenizer (this model has none)", param=c.field)
        if self._compiler is None:
            self._compiler = await asyncio.to_thread(GrammarCompiler.for_tokenizer, self.tokenizer, self.vocab_size)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._compiler.compile, c), self.budget_s)
        except InvalidParameterError as e:
            raise invalid(e.message, param=e.param) from None
        except TimeoutError:
            raise invalid(f"{c.field} did not compile within {self.budget_s:g} s: simplify it", param=c.field) from None
