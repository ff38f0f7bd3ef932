"""Constraints compiled into llguidance matchers, once per distinct constraint (torch-free: the
router compiles a request's constraint to refuse a bad one with a 400 before it is queued).

llguidance was chosen over xgrammar by measurement (bench/grammar_backends.py, docs/BENCHMARKS.md):
it compiles the test schemas in well under a millisecond where xgrammar takes tens, its masks are
computed lazily per step at a comparable cost, and it imports no torch (xgrammar needs torch,
transformers and triton), so the router can use it. Compilation runs under llguidance's fuel limits
and a wall-clock bound (``CompileBudget``): a schema or regex too large to compile in it is an error
naming the field and the budget, never a hang -- on the router and on a worker alike (a worker
compiles every constraint it is given, a migrated request's too, on the compiler's threads while
its engine steps: engine/structured/grammar_waits.py).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance

from engine.errors import InvalidParameterError
from engine.model.tokenizer import Tokenizer
from engine.structured.constraint import ConstraintKind, StructuredOutput
from engine.structured.control_tokens import resolve_control_tokens

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# Compact JSON (no free whitespace): a small model given free whitespace may pad forever.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


@dataclass(frozen=True, slots=True)
class CompileBudget:
    """llguidance's work limits for one compile (its units: ~50k lexer fuel per ms), and the wall
    time a caller waits for it (``wall_s``; the compile itself goes on, bounded by the fuel, and
    its matcher is cached for the next request that sends the constraint)."""

    wall_s: float = 10.0
    lexer_fuel: int = 2_000_000
    max_grammar_size: int = 500_000
    max_lexer_states: int = 250_000
    step_lexer_fuel: int = 200_000

    def limits(self) -> llguidance.LLParserLimits:
        return llguidance.LLParserLimits(
            initial_lexer_fuel=self.lexer_fuel,
            max_grammar_size=self.max_grammar_size,
            max_lexer_states=self.max_lexer_states,
            step_lexer_fuel=self.step_lexer_fuel,
            verbose_errors=False,
        )


def grammar_text(c: StructuredOutput, tokenizer: llguidance.LLTokenizer | None = None) -> str:
    """llguidance's grammar for ``c``; InvalidParameterError naming its field if it is malformed.
    ``tokenizer``: the one it compiles for (a grammar's bracketed control tokens are its own:
    engine/structured/control_tokens.py)."""
    try:
        if c.kind is ConstraintKind.JSON_OBJECT:
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if c.kind is ConstraintKind.JSON_SCHEMA:
            return llguidance.LLMatcher.grammar_from_json_schema(c.spec, defaults=_JSON_OPTIONS)
        if c.kind is ConstraintKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(c.spec)
        if c.kind is ConstraintKind.CHOICE:
            return llguidance.grammar_from("lark", choice_grammar(json.loads(c.spec)))
        spec = c.spec if tokenizer is None else resolve_control_tokens(c.spec, tokenizer)
        return llguidance.grammar_from("grammar", spec)
    except (ValueError, TypeError) as e:
        raise InvalidParameterError(c.field, f"{c.field} is not valid: {e}") from None


class GrammarCompiler:
    """Compiles constraints for one tokenizer into matchers: a bounded LRU cache of compiled
    (pristine) matchers keyed by the constraint's hash; each request gets a copy. Thread-safe: the
    router compiles off its event loop, a worker off its engine thread (``compile_async``)."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: tuple[int, ...] | list[int],
        *,
        cache_size: int = 256,
        budget: CompileBudget = CompileBudget(),
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
        self.budget = budget
        self.cache_size = cache_size
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._compiling: dict[str, Future[llguidance.LLMatcher]] = {}  # (one compile per key at a time)
        self._threads: ThreadPoolExecutor | None = None

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int | None = None, **kw: Any) -> GrammarCompiler:
        """From an ``engine.model.tokenizer.Tokenizer`` (``vocab_size``: the logits' width, if wider)."""
        vocab = max(vocab_size or 0, tokenizer.vocab_size)
        return cls(tokenizer.backend.to_str(), vocab, tokenizer.eos_token_ids, **kw)

    def compile(self, c: StructuredOutput) -> llguidance.LLMatcher:
        """The pristine compiled matcher of ``c`` (do not advance it: ``matcher`` copies it); one
        compiling on the threads already is waited for, not compiled again."""
        with self._lock:
            hit = self._cache.get(c.key)
            if hit is not None:
                self._cache.move_to_end(c.key)
                return hit
            future = self._compiling.get(c.key)
        return self._compile(c) if future is None else future.result()

    def compile_async(self, c: StructuredOutput) -> Future[llguidance.LLMatcher]:
        """``c``'s compile on the compiler's threads (done already when cached); its error, if it
        does not compile, is InvalidParameterError naming the field. Cached once done."""
        with self._lock:
            hit = self._cache.get(c.key)
            if hit is not None:
                self._cache.move_to_end(c.key)
                done: Future[llguidance.LLMatcher] = Future()
                done.set_result(hit)
                return done
            future = self._compiling.get(c.key)
            if future is None:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(2, thread_name_prefix="grammar-compile")
                future = self._compiling[c.key] = self._threads.submit(self._compile, c)
                future.add_done_callback(functools.partial(self._compiled, c.key))
            return future

    def _compiled(self, key: str, _done: Future[llguidance.LLMatcher]) -> None:
        with self._lock:
            self._compiling.pop(key, None)

    def _compile(self, c: StructuredOutput) -> llguidance.LLMatcher:
        key = c.key
        grammar = grammar_text(c, self.tokenizer)
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.budget.limits())
        if m.is_error():
            raise InvalidParameterError(c.field, f"{c.field} cannot be compiled: {_short(m.get_error())}")
        with self._lock:
            self._cache[key] = m
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return m

    def matcher(self, c: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher for one request (one per choice)."""
        return self.compile(c).deep_copy()

    def __len__(self) -> int:
        return len(self._cache)


def choice_grammar(choices: list[str]) -> str:
    """One of ``choices`` as a single lexer terminal, not a rule of alternatives (llguidance's own
    ``choice``): a rule puts every option in one Earley row, whose size llguidance bounds (a longer
    list fails at its first token), and the lexer's masks cost a fraction of the parser's."""
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(o, ensure_ascii=False) for o in choices) + "\n"


def over_budget(field: str, wall_s: float) -> str:
    """The error message of a compile of ``field`` that took longer than ``wall_s``."""
    return f"{field} did not compile within the compile budget ({wall_s:g} s): simplify it"


def _short(error: str, limit: int = 300) -> str:
    error = " ".join(error.split())
    return error if len(error) <= limit else error[:limit] + "..."
