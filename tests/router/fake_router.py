"""A scripted ``RouterAPI`` for frontend tests: real HTTP/gRPC servers on loopback in front of a
router whose behaviour the test controls (tokens, delays, errors, aborts). End-to-end tests use the
real router and cluster instead."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob
from router.api import (
    ErrorKind,
    GenerateRequest,
    GenerationResult,
    ModelInfo,
    Readiness,
    RouterError,
    StreamEvent,
    Usage,
    invalid,
)

WORDS = ["alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta", " iota", " kappa"]


@dataclass
class FakeStream:
    request_id: str
    lane: str
    request: GenerateRequest
    router: FakeRouter
    prompt_tokens: int
    aborted: bool = False
    _events: list = field(default_factory=list)

    async def __aiter__(self):
        n = self.request.sampling.max_tokens
        text_so_far = ""
        for i in range(n):
            if self.aborted:
                return
            await asyncio.sleep(self.router.token_delay_s)  # a slow model, when a test asks for one
            if self.aborted:
                return
            if self.router.fail_after_tokens is not None and i == self.router.fail_after_tokens:
                yield StreamEvent(
                    self.request_id,
                    "",
                    (),
                    finished=True,
                    finish_reason="error",
                    error=RouterError(ErrorKind.INTERNAL, "the decode worker failed"),
                )
                return
            word = WORDS[i % len(WORDS)]
            text_so_far += word
            last = i == n - 1
            stop_hit = any(s in text_so_far for s in self.request.sampling.stop)
            finished = last or stop_hit
            yield StreamEvent(
                self.request_id,
                word,
                (100 + i,),
                finished=finished,
                finish_reason=("stop" if stop_hit else "length") if finished else None,
                usage=Usage(self.prompt_tokens, i + 1) if finished else None,
                logprobs=self._logprobs(i),
                prompt_logprobs=self._prompt_logprobs() if i == 0 else None,
            )
            if finished:
                self.router.completed.append(self.request_id)
                return

    def _logprobs(self, i: int) -> tuple[TokenLogprob, ...] | None:
        """Token 100 + i has logprob -(i + 1) / 4; its alternatives are 300 + i (a split UTF-8
        character), 200 + i, ... (FakeRouter.token_bytes names them)."""
        n = self.request.sampling.logprobs
        if n is None:
            return None
        value = -(i + 1) / 4
        top = ((300 + i, value + 0.1), (100 + i, value)) + tuple((200 + i + 10 * k, value - 1 - k) for k in range(18))
        return (TokenLogprob(100 + i, value, top[:n]),)

    def _prompt_logprobs(self) -> tuple[TokenLogprob, ...] | None:
        """Prompt token j is 500 + j (b"p<j>"), with logprob -j / 8; the first has none."""
        n = self.request.sampling.prompt_logprobs
        if n is None:
            return None
        return (TokenLogprob(500, None),) + tuple(
            TokenLogprob(500 + j, -j / 8, ((500 + j, -j / 8),)[:n]) for j in range(1, self.prompt_tokens)
        )

    async def result(self) -> GenerationResult:
        text, ids, reason, usage, logprobs, prompt_logprobs = "", [], None, None, None, None
        async for ev in self:
            if ev.error is not None:
                raise ev.error
            text += ev.text
            ids += ev.token_ids
            if ev.logprobs is not None:
                logprobs = (logprobs or ()) + ev.logprobs
            prompt_logprobs = ev.prompt_logprobs or prompt_logprobs
            reason, usage = ev.finish_reason, ev.usage or usage
        return GenerationResult(
            self.request_id,
            text,
            tuple(ids),
            reason,
            usage or Usage(self.prompt_tokens, len(ids)),
            self.lane,
            prompt_text=self.request.prompt if self.request.echo_prompt else None,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    async def cancel(self) -> None:
        await self.abort()

    async def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self.router.aborted.append(self.request_id)


class FakeRouter:
    """Keys: "sk-test" -> tenant "acme". ``require_auth`` off by default. A prompt of more than
    ``max_model_len`` words (or ids) plus max_tokens is rejected like the real router does, unless
    the client gave no max_tokens: then max_tokens is clamped to what the prompt leaves."""

    def __init__(
        self,
        *,
        require_auth: bool = False,
        token_delay_s: float = 0.0,
        max_model_len: int = 64,
        check_vocab: bool = False,
    ) -> None:
        self.require_auth = require_auth
        self.check_vocab = check_vocab  # refuse prompt token ids >= 1000 (the model card's vocabulary), as the router
        self.keys = {"sk-test": "acme"}
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len
        self.fail_next: RouterError | None = None  # raised by the next generate() call
        self.fail_calls: dict[int, RouterError] = {}  # raised by the k-th generate() call (1-based)
        self.fail_after_tokens: int | None = None  # in-band error after this many tokens
        self.ready = Readiness(True)
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self._ids = itertools.count()
        self.batch_jobs: dict[str, dict] = {}

    def authenticate(self, api_key: str | None) -> str:
        if not self.require_auth:
            return self.keys.get(api_key or "", "default")
        if api_key is None:
            raise RouterError(ErrorKind.UNAUTHENTICATED, "Missing API key: send 'Authorization: Bearer <key>'.")
        tenant = self.keys.get(api_key)
        if tenant is None:
            raise RouterError(ErrorKind.UNAUTHENTICATED, "Incorrect API key provided.", code="invalid_api_key")
        return tenant

    async def generate(self, request: GenerateRequest) -> FakeStream:
        self.requests.append(request)
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        if len(self.requests) in self.fail_calls:
            raise self.fail_calls.pop(len(self.requests))
        if request.lane is not None and request.lane not in ("interactive", "batch", "long_context"):
            raise invalid(f"unknown lane {request.lane!r}", param="lane")
        if (
            self.check_vocab
            and request.prompt_token_ids is not None
            and any(t >= 1000 for t in request.prompt_token_ids)
        ):
            raise invalid("token id outside the vocabulary [0, 1000)", param="prompt")  # the router's name for it
        if request.prompt is not None:
            n_prompt = len(request.prompt.split())
        elif request.prompt_token_ids is not None:
            n_prompt = len(request.prompt_token_ids)
        else:
            n_prompt = sum(len(m.content.split()) for m in request.messages or ())
        budget = self.max_model_len - n_prompt
        if not request.max_tokens_given and request.sampling.max_tokens > budget > 0:
            # An unbounded request ("up to the context length") is clamped, not rejected, like the real router.
            request = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, max_tokens=budget))
        if n_prompt + request.sampling.max_tokens > self.max_model_len:
            raise invalid(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n_prompt + request.sampling.max_tokens} tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        rid = request.request_id or f"fake-{next(self._ids)}"
        return FakeStream(rid, request.lane or "interactive", request, self, n_prompt)

    async def abort(self, request_id: str, tenant: str) -> bool:
        self.aborted.append(request_id)
        return True

    def model_info(self) -> ModelInfo:
        return ModelInfo("fake-model", self.max_model_len, 1000, int(time.time()), ("interactive", "batch"))

    def tokenize(self, request: GenerateRequest) -> list[int]:
        """Word j of a prompt (or of the messages' contents) is token 500 + j."""
        text = request.prompt if request.prompt is not None else " ".join(m.content for m in request.messages)
        return [500 + j for j in range(len(text.split()))]

    def detokenize(self, token_ids) -> str:
        if any(t >= 1000 for t in token_ids):
            raise invalid("token id outside the vocabulary", param="tokens")
        return b"".join(self.token_bytes(token_ids)).decode("utf-8", "replace")

    def token_bytes(self, token_ids) -> list[bytes]:
        """100 + i: the i-th word of the script; 300 + i: the first byte of "é" (half a character);
        500 + j: prompt token j (b"p<j>"); any other id: b"alt<id>"."""

        def one(t: int) -> bytes:
            if 100 <= t < 200:
                return WORDS[(t - 100) % len(WORDS)].encode()
            if 300 <= t < 400:
                return "é".encode()[:1]
            if 500 <= t < 600:
                return f"p{t - 500}".encode()
            return f"alt{t}".encode()

        return [one(t) for t in token_ids]

    def readiness(self) -> Readiness:
        return self.ready

    def metrics(self) -> tuple[bytes, str]:
        return (
            b"# HELP baton_fake_total a fake counter\n# TYPE baton_fake_total counter\nbaton_fake_total 1.0\n",
            "text/plain; version=0.0.4; charset=utf-8",
        )

    async def batch_result(self, job_id: str, tenant: str) -> dict:
        job = self.batch_jobs.get(job_id)
        if job is None:
            raise RouterError(ErrorKind.NOT_FOUND, f"no batch job {job_id!r}", param="id")
        return job
