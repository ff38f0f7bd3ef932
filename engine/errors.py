"""Errors the engine raises for bad input. Frontends map them to HTTP 400 / INVALID_ARGUMENT."""

from __future__ import annotations


class InvalidParameterError(ValueError):
    """A request parameter is out of range. ``param`` names it, as the OpenAI error object does."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message

    # Picklable: a Ray worker raising it reaches the router as itself.
    def __reduce__(self) -> tuple[type[InvalidParameterError], tuple[str, str]]:
        return type(self), (self.param, self.message)


class ContextLengthError(InvalidParameterError):
    """prompt + max_tokens exceeds the model's context length."""


class ModelLoadError(RuntimeError):
    """A model directory or file cannot be loaded; the message names the file and the problem."""
