"""``tool_choice`` ``required`` or a named function as a grammar: the output must be one call (or,
with ``parallel_tool_calls``, one or more) in the model family's markup, each an object naming a
function with arguments valid against that function's parameters schema (pure Python). Mistral's
``[TOOL_CALLS]`` is written ``<[TOOL_CALLS]>``: the special token where the model's tokenizer has it,
else its spelling (engine/structured/control_tokens.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.structured.constraint import ConstraintKind, StructuredOutput
from router.tool_calls.parsers import ToolFormat


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One entry of ``tools`` (``{"type": "function", "function": {...}}``)."""

    name: str
    parameters: str  # its JSON schema, as JSON text
    description: str | None = None

    def to_template(self) -> dict[str, Any]:
        """As chat templates receive it (transformers' ``tools=``)."""
        function: dict[str, Any] = {"name": self.name, "parameters": json.loads(self.parameters)}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


def _call_schema(tools: list[FunctionTool], fmt: ToolFormat) -> dict[str, Any]:
    key = "parameters" if fmt is ToolFormat.LLAMA3_JSON else "arguments"
    alternatives = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, key: json.loads(t.parameters)},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def tool_call_constraint(fmt: ToolFormat, tools: list[FunctionTool], parallel: bool) -> StructuredOutput:
    """The grammar of a forced call among ``tools`` (one tool: that one)."""
    obj = "obj: %json " + json.dumps(_call_schema(tools, fmt))
    if fmt is ToolFormat.HERMES:
        rules = [
            'start: call ("\\n" call)*' if parallel else "start: call",
            'call: "<tool_call>\\n" obj "\\n</tool_call>"',
        ]
    elif fmt is ToolFormat.MISTRAL:  # (its marker the special token where the tokenizer has it)
        rules = ['start: <[TOOL_CALLS]> "[" obj ("," obj)* "]"' if parallel else 'start: <[TOOL_CALLS]> "[" obj "]"']
    else:
        rules = ['start: obj (";" obj)*' if parallel else "start: obj"]
    return StructuredOutput(ConstraintKind.GRAMMAR, "\n".join([*rules, obj]) + "\n", "tool_choice")
