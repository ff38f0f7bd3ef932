"""The JSON shapes of request fields that router/http/schemas.py validates by hand (plain
validators, for OpenAI's error messages): given to pydantic as those fields' ``json_schema_input_type``
so that the published schema (``/openapi.json``) describes them. Never used to parse a body."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_Text = Annotated[str, Field(min_length=1)]
_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
# A completions prompt: text, token ids, or an array holding one of those (a batch of one prompt).
PromptInput = (
    _Text
    | _TokenIds
    | Annotated[list[_Text], Field(min_length=1, max_length=1)]
    | Annotated[list[_TokenIds], Field(min_length=1, max_length=1)]
)
StopInput = str | list[str] | None
NON_EMPTY: dict[str, Any] = {"minItems": 1}  # the published bound of a list the model checks itself
# A body that sets ``stream_options`` must stream.
STREAM_OPTIONS_NEED_STREAM: dict[str, Any] = {
    "dependentSchemas": {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}
}
# Only an assistant turn may leave out ``content`` (it has tool calls instead).
CONTENT_UNLESS_ASSISTANT: dict[str, Any] = {
    "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
    "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
}
ONE_OF_PROMPT_AND_MESSAGES: dict[str, Any] = {"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}


class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Shape):
    type: Literal["text"]
    text: str


ContentInput = str | list[TextPart] | None


class FunctionCallInput(_Shape):
    name: str
    arguments: str = Field(description="JSON text of the arguments object.")


class ToolCallInput(_Shape):
    """One of an assistant message's ``tool_calls`` (history sent back to the model)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallInput


class FunctionDefinition(_Shape):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="The JSON schema of the arguments; a forced call is held to it."
    )


class Tool(_Shape):
    type: Literal["function"]
    function: FunctionDefinition


ToolCallsInput = list[ToolCallInput] | None
ToolsInput = list[Tool] | None
