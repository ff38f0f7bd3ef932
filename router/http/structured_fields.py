"""The request fields that ask for structured output (OpenAI's ``response_format``, vLLM's
``guided_*``) turned into one ``StructuredOutput``, and the vLLM-style fields Baton refuses
because ignoring them would change the answer (torch-free)."""

from __future__ import annotations

import json
from typing import Any

from engine.errors import InvalidParameterError
from engine.structured.constraint import ConstraintKind, StructuredOutput

GUIDED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
# Fields other servers accept that change the output; refused with a 400 naming them unless a
# request model implements them (then they are its own fields).
REFUSED_FIELDS = (
    "structured_outputs",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "chat_template",
    "chat_template_kwargs",
    "priority",
    "cache_salt",
    "allowed_token_ids",
    "bad_words",
    "use_beam_search",
    "length_penalty",
    "logits_processors",
    "truncate_prompt_tokens",
    "add_special_tokens",
    "continue_final_message",
    "documents",
    "mm_processor_kwargs",
    "reasoning_effort",
    "prediction",
    "return_tokens_as_token_ids",
    "spaces_between_special_tokens",
    "vllm_xargs",
    "kv_transfer_params",
    "prompt_logprobs",
    "echo",
    "best_of",
    "suffix",
    "functions",
    "function_call",
    "tools",
    "tool_choice",
)


def structured_output(fields: dict[str, Any]) -> StructuredOutput | None:
    """At most one of ``GUIDED_FIELDS`` (a ``response_format`` of type ``text`` is none)."""
    given = {name: v for name, v in fields.items() if v is not None}
    rf = given.get("response_format")
    if rf is not None and rf.get("type", "text") == "text":
        del given["response_format"]
    if len(given) > 1:
        names = sorted(given)
        raise InvalidParameterError(names[1], f"only one of {', '.join(names)} may be given")
    if not given:
        return None
    ((name, value),) = given.items()
    if name == "response_format":
        return _response_format(value)
    if name == "guided_json":
        if isinstance(value, str):
            value = _json(value, name)
        return StructuredOutput.json_schema(value, name)
    if name == "guided_choice":
        return StructuredOutput.choice(value, name)
    kind = ConstraintKind.REGEX if name == "guided_regex" else ConstraintKind.GRAMMAR
    return StructuredOutput(kind, value, name)


def _response_format(rf: dict[str, Any]) -> StructuredOutput:
    kind = rf.get("type")
    if kind == "json_object":
        return StructuredOutput(ConstraintKind.JSON_OBJECT, "", "response_format")
    if kind != "json_schema":
        raise InvalidParameterError(
            "response_format.type", f"response_format type {kind!r} is not supported (text, json_object or json_schema)"
        )
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidParameterError(
            "response_format.json_schema",
            "response_format json_schema needs a 'json_schema' object ({'name': ..., 'schema': {...}})",
        )
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise InvalidParameterError("response_format.json_schema.strict", "'strict' must be true or false")
    schema = spec.get("schema")
    if schema is None:  # (OpenAI: a schema-less json_schema is any JSON object)
        return StructuredOutput(ConstraintKind.JSON_OBJECT, "", "response_format.json_schema.schema")
    return StructuredOutput.json_schema(schema, "response_format.json_schema.schema")


def _json(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidParameterError(field, f"{field} is not valid JSON") from None
