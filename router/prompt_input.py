"""A request's prompt as token ids (and token ids back as text or bytes), and what makes two
requests "the same" (pure Python).

Exactly one of a text prompt, token ids or chat messages; token ids are checked against the
vocabulary, text and messages go through the model's tokenizer (and its chat template). Every
problem is an ``invalid`` error naming the parameter (HTTP 400 / gRPC INVALID_ARGUMENT).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict

from engine.errors import InvalidParameterError
from engine.model.tokenizer import Tokenizer
from router.api import GenerateRequest, invalid


def tokenize_request(
    req: GenerateRequest, tokenizer: Tokenizer | None, vocab_size: int
) -> tuple[list[int], str | None]:
    """(prompt token ids, the prompt text to echo back or None)."""
    given = sum(x is not None for x in (req.prompt, req.prompt_token_ids, req.messages))
    if given != 1:
        raise invalid("exactly one of prompt, prompt token ids or messages is required", param="prompt")
    if req.prompt_token_ids is not None:
        ids = list(req.prompt_token_ids)
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size), None)
        if bad is not None:
            raise invalid(f"token id {bad!r} is outside the vocabulary [0, {vocab_size})", param="prompt")
        text = None
    elif tokenizer is None:
        raise invalid("this model has no tokenizer: send token ids", param="prompt")
    elif req.messages is not None:
        if not req.messages:
            raise invalid("messages must not be empty", param="messages")
        msgs = [m.to_template() for m in req.messages]
        tools = {"tools": [t.to_template() for t in req.tools]} if req.tools else {}  # transformers' tools=
        try:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=req.add_generation_prompt, **tools)
        except InvalidParameterError as e:
            raise invalid(e.message, param=e.param) from None
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        assert req.prompt is not None  # exactly one of the three is given (checked above)
        text = req.prompt
        ids = tokenizer.encode(req.prompt)
    if not ids:
        raise invalid("the prompt is empty", param="prompt")
    try:  # here, not on a worker: a worker's refusal costs a round trip (and once cost a worker)
        req.sampling.check_vocabulary(vocab_size)
    except InvalidParameterError as e:
        raise invalid(e.message, param=e.param) from None
    return ids, (text if req.echo_prompt else None)


# Prompts longer than this (characters) are tokenized on a worker thread: the tokenizer releases
# the GIL, and a multi-megabyte prompt would otherwise stall every request on the event loop for seconds.
OFF_LOOP_CHARS = 32_768


async def tokenize_off_loop(
    req: GenerateRequest, tokenizer: Tokenizer | None, vocab_size: int
) -> tuple[list[int], str | None]:
    """``tokenize_request`` for a coroutine: inline for ordinary prompts, on a thread for huge ones."""
    # (a token-id prompt's ids are each checked against the vocabulary: counted like characters)
    chars = len(req.prompt or "") + sum(len(m.content) for m in req.messages or ()) + len(req.prompt_token_ids or ())
    if chars < OFF_LOOP_CHARS:
        return tokenize_request(req, tokenizer, vocab_size)
    return await asyncio.to_thread(tokenize_request, req, tokenizer, vocab_size)


def request_fingerprint(req: GenerateRequest, ids: list[int]) -> str:
    """What makes two requests "the same" for an Idempotency-Key: the prompt and the parameters."""
    # Every sampling field (a field added later is covered too), the lane and the choice count.
    body = json.dumps([ids, asdict(req.sampling), req.lane, req.num_choices], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def detokenize(token_ids: Sequence[int], tokenizer: Tokenizer | None, vocab_size: int) -> str:
    """Token ids -> text, special tokens included (the inverse of tokenizing a prompt)."""
    if tokenizer is None:
        raise invalid("this model has no tokenizer", param="tokens")
    bad = next((t for t in token_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad!r} is outside the vocabulary [0, {vocab_size})", param="tokens")
    return tokenizer.decode(list(token_ids), skip_special_tokens=False)


def token_bytes(token_ids: Sequence[int], tokenizer: Tokenizer | None) -> list[bytes]:
    """The bytes each token stands for; a model without a tokenizer names them by id, as vLLM does."""
    if tokenizer is None:
        return [f"token_id:{t}".encode() for t in token_ids]
    return [tokenizer.token_bytes(t) for t in token_ids]
