"""Control tokens spelled in brackets (Mistral's ``[TOOL_CALLS]``, ``[INST]``) in a Lark grammar.

llguidance names a special token in a grammar as ``<|name|>`` (the token's own text, when it is
angle-bracketed) or by id, ``<[123]>``; a special token whose text is ``[TOOL_CALLS]`` has no name
form, and a string literal ``"[TOOL_CALLS]"`` matches only its spelling in ordinary tokens, never
the token itself. So a grammar may write ``<[TOOL_CALLS]>`` (a name where llguidance takes ids:
never valid llguidance otherwise), and it is resolved here, per tokenizer, before compiling: to the
token's id where the tokenizer has ``[TOOL_CALLS]`` as one special token, else to its spelling (a
model without the token writes the text, as its template then teaches). String literals and
regexes are passed over.
"""

from __future__ import annotations

import json
import re

import llguidance

# A string literal, a regex (skipped), or a bracketed name: a letter or underscore first, unlike an
# id, a range, a negation or the wildcard.
_PIECES = re.compile(r'"(?:\\.|[^"\\])*"|/(?:\\.|[^/\\\n])+/|<\[([A-Za-z_][^\]\s<>]*)\]>')


def resolve_control_tokens(grammar: str, tokenizer: llguidance.LLTokenizer) -> str:
    """``grammar`` with every ``<[NAME]>`` outside literals as ``<[id]>`` of the special token
    ``[NAME]``, or as the literal ``"[NAME]"`` where the tokenizer has no such token."""
    if "<[" not in grammar:
        return grammar

    def resolve(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:  # a literal or a regex: as it is
            return m.group(0)
        text = f"[{name}]"
        ids = tokenizer.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    return _PIECES.sub(resolve, grammar)
