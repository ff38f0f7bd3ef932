"""Request bodies: read with a size limit, parsed (off the event loop when large) into the
router/http/schemas.py models, and their validation errors mapped onto OpenAI error objects.

Every request of the router shares one event loop, so a body is bounded before it is read (its
``Content-Length``) and while it streams in (chunked bodies declare no length), and a large one is
parsed on a thread: the JSON walk and the schema checks of a multi-megabyte body would otherwise
stall every other request (``/health`` included) for seconds.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from router.api import ErrorKind, RouterError, invalid

# 16 MiB: the longest prompt of any served context fits many times over (128k tokens are ~1 MB as
# JSON token ids, a few MB as text even with every character \u-escaped), while a body that would
# take seconds and gigabytes to parse is refused before it is read.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Bodies from this size on are parsed on a worker thread; smaller ones parse in well under a
# millisecond, less than the thread hop costs.
OFF_LOOP_BYTES = 256 * 1024


class BodyTooLarge(Exception):
    """A request body over the limit: HTTP 413 with an OpenAI error object."""

    status_code = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit

    def to_openai(self) -> dict[str, Any]:
        size = f"{self.limit // (1024 * 1024)} MiB" if self.limit % (1024 * 1024) == 0 else f"{self.limit} bytes"
        message = f"The request body is too large: the limit is {size} ({self.limit} bytes)."
        return {
            "error": {
                "message": message,
                "type": ErrorKind.INVALID_REQUEST.type,
                "param": None,
                "code": "request_too_large",
            }
        }


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or ``BodyTooLarge`` as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:  # the HTTP server normally rejects this first
            raise invalid("The Content-Length header is not a number.", param="Content-Length") from None
        if length > limit:  # refused before a byte of it is read
            raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a chunked body (or one longer than it said): stop buffering it
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_and_parse(request: Request, schema: type, limit: int) -> Any:
    """The body validated against ``schema`` (a 400 ``RouterError`` if it is not), read with ``limit``."""
    raw = await read_body(request, limit)
    if len(raw) < OFF_LOOP_BYTES:
        return parse_body(raw, schema)
    return await asyncio.to_thread(parse_body, raw, schema)


# -- parsing and error mapping ------------------------------------------------------------------
_EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


def _json_kind(x: object) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, (int, float)):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "an array"
    return "an object"


def _param(loc: tuple[int | str, ...]) -> str:
    """OpenAI spells nested params as ``messages.[0].content``."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc) or "body"


def validation_error(e: ValidationError) -> RouterError:
    """The first problem of a pydantic ValidationError as a 400 OpenAI error naming its ``param``."""
    err = e.errors(include_url=False)[0]
    param, kind = _param(tuple(err["loc"])), err["type"]
    if kind == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if kind in _EXPECTED:
        return invalid(
            f"Invalid type for '{param}': expected {_EXPECTED[kind]}, but got {_json_kind(err['input'])} instead.",
            param=param,
            code="invalid_type",
        )
    if kind in ("invalid_type", "invalid_value", "unsupported_parameter"):  # ours: the message is complete
        return invalid(err["msg"], param=param, code=kind)
    return invalid(f"Invalid value for '{param}': {err['msg']}.", param=param, code="invalid_value")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """Bytes of a request body -> a validated ``model``; any problem is a 400 ``RouterError``."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)  # NaN/Infinity are not JSON
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise invalid(
            "We could not parse the JSON body of your request. The body must be a JSON object "
            "(Content-Type: application/json).",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise invalid(f"The request body must be a JSON object, got {_json_kind(data)}.", code="invalid_json")
    where = _lone_surrogate_at(data, ())
    if where is not None:  # JSON may escape one ("\ud800"); no tokenizer or response can hold it
        raise invalid(
            "The text is not valid Unicode: it holds a lone surrogate (such as \\ud800).",
            param=_param(where),
            code="invalid_value",
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


def _lone_surrogate_at(data: Any, root: tuple[int | str, ...]) -> tuple[int | str, ...] | None:
    """The path of the first string (key or value) in parsed JSON that UTF-8 cannot encode, or None.
    Iterative: a body nested as deep as the JSON parser allows must not exhaust the stack here."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, root)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(value, dict):
            for k, v in reversed(value.items()):
                stack.append((v, path + (k,)))
                stack.append((k, path))
        elif isinstance(value, list) and not _SCALARS.issuperset(map(type, value)):
            # (a list of numbers, such as a token-id prompt, is skipped by that C-speed test: walking
            # millions of them one by one took seconds)
            stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(value))))
    return None


_SCALARS = frozenset((int, float, bool, type(None)))  # what json.loads makes besides str, dict and list
