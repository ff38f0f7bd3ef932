"""A tolerant scanner over JSON text that may still be arriving: where a value ends (None while it
is incomplete) and the keys of a top-level object with their values' spans (pure Python)."""

from __future__ import annotations

_WS = " \t\r\n"
_OPEN = {"{": "}", "[": "]"}


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int | None:
    """``s[i]`` is a string's opening quote: the index after its closing one (None: not yet seen)."""
    j = i + 1
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(s: str, i: int) -> int | None:
    """The index after the JSON value starting at ``s[i]`` (None: it runs past the end of ``s``)."""
    if i >= len(s):
        return None
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in _OPEN:
        depth, j = 0, i
        while j < len(s):
            c = s[j]
            if c == '"':
                end = string_end(s, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    j = i  # a number or a literal: ends at a delimiter (at the end of the text it may still grow)
    while j < len(s) and s[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(s) else None


def object_members(s: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The members of the object starting at ``s[i]`` (``{``): key -> (value start, value end or
    None while incomplete), and the index after the object (None: incomplete). Keys whose value has
    not begun are left out."""
    members: dict[str, tuple[int, int | None]] = {}
    j = skip_ws(s, i + 1)
    while j < len(s):
        if s[j] == "}":
            return members, j + 1
        if s[j] == ",":
            j = skip_ws(s, j + 1)
            continue
        if s[j] != '"':
            return members, None
        key_end = string_end(s, j)
        if key_end is None:
            return members, None
        key = s[j + 1 : key_end - 1]
        j = skip_ws(s, key_end)
        if j >= len(s) or s[j] != ":":
            return members, None
        j = skip_ws(s, j + 1)
        if j >= len(s):
            return members, None
        end = value_end(s, j)
        members[key] = (j, end)
        if end is None:
            return members, None
        j = skip_ws(s, end)
    return members, None
