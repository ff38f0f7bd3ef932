"""Error answers of the HTTP API: every failure of an endpoint, and FastAPI's own 404/405/422, as
an OpenAI error object ``{"error": {"message", "type", "param", "code"}}`` with the status of its
kind (clients, the openai package among them, only understand that shape)."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from engine.errors import ContextLengthError, InvalidParameterError
from router.api import ErrorKind, RouterError, invalid
from router.http.body import BodyTooLarge
from router.http.responses import dumps, internal_error

log = logging.getLogger(__name__)
Endpoint = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's "client closed request": never seen by anyone, but logged


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(obj), status_code=status, headers=headers, media_type="application/json")


def error_response(err: RouterError, headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if err.retry_after_s is not None:  # HTTP wants whole seconds; never tell a client to retry at once
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    return json_response(err.to_openai(), err.kind.http_status, headers)


def guarded(fn: Endpoint) -> Endpoint:
    """Every failure of an endpoint becomes an OpenAI error response; nothing escapes as a bare 500."""

    @functools.wraps(fn)
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except RouterError as e:
            return error_response(e)
        except BodyTooLarge as e:
            return json_response(e.to_openai(), e.status_code)
        except ContextLengthError as e:
            return error_response(invalid(e.message, param=e.param, code="context_length_exceeded"))
        except InvalidParameterError as e:
            return error_response(invalid(e.message, param=e.param, code="invalid_value"))
        except ClientDisconnect:  # went away while sending the body
            return Response(status_code=CLIENT_CLOSED)
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.url.path)
            return error_response(internal_error())

    return endpoint


def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """404/405 and friends as OpenAI error objects (FastAPI's default is ``{"detail": ...}``)."""
    where = f"{request.method} {request.url.path}"
    body: dict[str, str | None]
    if exc.status_code == 404:
        body = {"message": f"Invalid URL ({where})", "type": ErrorKind.NOT_FOUND.type, "code": "unknown_url"}
    elif exc.status_code == 405:
        body = {
            "message": f"Method not allowed ({where})",
            "type": ErrorKind.INVALID_REQUEST.type,
            "code": "method_not_allowed",
        }
    else:
        kind = ErrorKind.INTERNAL if exc.status_code >= 500 else ErrorKind.INVALID_REQUEST
        body = {"message": str(exc.detail), "type": kind.type, "code": None}
    error = {"message": body["message"], "type": body["type"], "param": None, "code": body["code"]}
    return json_response({"error": error}, exc.status_code, dict(exc.headers or {}))


def install_error_handlers(app: FastAPI) -> None:
    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _http_error(request, exc)

    async def on_validation(request: Request, exc: Exception) -> Response:
        # Endpoints parse their own bodies, so this is a backstop: never a 422.
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        loc = [p for p in (errors[0]["loc"] if errors else ()) if p not in ("body", "query", "path", "header")]
        param = ".".join(map(str, loc)) or None
        return error_response(invalid(errors[0]["msg"] if errors else "Invalid request.", param=param))

    async def on_router_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RouterError)
        return error_response(exc)

    async def on_any(request: Request, exc: Exception) -> Response:
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(internal_error())

    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(RouterError, on_router_error)
    app.add_exception_handler(Exception, on_any)
