"""What a request's output must match (pure Python, picklable: it travels in ``SamplingParams``
from the router to both pools)."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidParameterError

MAX_SPEC_CHARS = 256 * 1024  # a schema, regex or grammar longer than this is refused before compiling


class ConstraintKind(enum.StrEnum):
    """The field a constraint came from (OpenAI's ``response_format`` types, vLLM's guided names)."""

    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    CHOICE = "choice"  # one of a list of strings
    GRAMMAR = "grammar"  # Lark (llguidance's) or GBNF


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the output: ``spec`` is the schema as JSON text, the regex, the choices as a
    JSON list, or the grammar text (empty for ``JSON_OBJECT``). ``field`` names the request field it
    came from, so a constraint that does not compile is refused naming it."""

    kind: ConstraintKind
    spec: str = ""
    field: str = "response_format"

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ConstraintKind):
            raise InvalidParameterError(self.field, f"unknown constraint kind {self.kind!r}")
        if not isinstance(self.spec, str):
            raise InvalidParameterError(self.field, f"{self.field} must be text, got {type(self.spec).__name__}")
        if len(self.spec) > MAX_SPEC_CHARS:
            raise InvalidParameterError(self.field, f"{self.field} is longer than {MAX_SPEC_CHARS} characters")
        if self.kind is not ConstraintKind.JSON_OBJECT and not self.spec:
            raise InvalidParameterError(self.field, f"{self.field} must not be empty")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool, field: str = "response_format") -> StructuredOutput:
        if not isinstance(schema, (dict, bool)):
            raise InvalidParameterError(field, f"{field}'s schema must be a JSON object, got {type(schema).__name__}")
        return cls(ConstraintKind.JSON_SCHEMA, json.dumps(schema, sort_keys=True), field)

    @classmethod
    def choice(cls, choices: list[str], field: str = "guided_choice") -> StructuredOutput:
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise InvalidParameterError(field, f"{field} must be a non-empty list of strings")
        return cls(ConstraintKind.CHOICE, json.dumps(choices), field)

    @property
    def key(self) -> str:
        """The compile cache's key: a hash of what the matcher depends on (not the field name)."""
        return hashlib.sha256(f"{self.kind}\0{self.spec}".encode()).hexdigest()
