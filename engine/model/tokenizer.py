"""The model's tokenizer: encode/decode, chat templates and streaming detokenization.

Deliberately torch-free (``tokenizers``, ``jinja2`` and the standard library only) because the
router imports it to count and render prompts without loading a model. It reads the same files as
transformers' ``AutoTokenizer`` and reproduces its behaviour for the generic ``tokenizers``-backed
tokenizer (transformers is the oracle in the tests): the ``tokenizer.json`` pipeline, the
``add_bos_token``/``add_eos_token`` post-processor override, and chat templates rendered in the
same sandboxed jinja2 environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Backend
from tokenizers import processors

from engine.errors import InvalidParameterError, ModelLoadError
from engine.model.detokenizer import IncrementalDetokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
    """A loaded tokenizer. Build it with :meth:`from_dir`."""

    def __init__(
        self,
        backend: _Backend,
        *,
        special_tokens: Mapping[str, str | None],
        chat_template: str | Mapping[str, str] | None,
        generation_eos_ids: Sequence[int] = (),
        source: str = "<memory>",
    ) -> None:
        self._backend = backend
        self._special = {k: v for k, v in special_tokens.items() if v is not None}
        self._chat_template = chat_template
        self._compiled: dict[str, jinja2.Template] = {}
        self.source = source
        eos_ids: list[int] = []
        tok_eos = self._token_id(self._special.get("eos_token"))
        self.generation_eos_ids = tuple(int(x) for x in generation_eos_ids)  # generation_config.json's
        for i in ([tok_eos] if tok_eos is not None else []) + list(self.generation_eos_ids):
            if i not in eos_ids:
                eos_ids.append(i)
        self._eos_ids = tuple(eos_ids)
        self._byte_level: bool | None = None  # the decoder maps GPT-2's byte alphabet (token_bytes)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` plus the optional config, generation config and template files."""
        path = Path(path)
        tok_file = path / TOKENIZER_FILE
        if not tok_file.is_file():
            raise ModelLoadError(f"{tok_file}: not found (a model directory needs {TOKENIZER_FILE})")
        try:
            backend = _Backend.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for every parse problem
            raise ModelLoadError(f"{tok_file}: invalid tokenizer file ({e})") from None
        cfg = _read_json(path / TOKENIZER_CONFIG_FILE)
        gen = _read_json(path / GENERATION_CONFIG_FILE)
        special = {name: _token_content(cfg.get(name)) for name in _SPECIAL_TOKEN_NAMES}

        # transformers rebuilds the post-processor when the config states add_bos/eos_token, or
        # when tokenizer.json has none; otherwise tokenizer.json's own post-processor stands.
        if "add_bos_token" in cfg or "add_eos_token" in cfg or backend.post_processor is None:
            backend.post_processor = bos_eos_post_processor(
                backend, special, bool(cfg.get("add_bos_token")), bool(cfg.get("add_eos_token"))
            )

        template = _chat_template(cfg.get("chat_template"), path / TOKENIZER_CONFIG_FILE)
        template_file = path / CHAT_TEMPLATE_FILE
        if template_file.is_file():
            try:
                template = template_file.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ModelLoadError(f"{template_file}: not UTF-8 text ({e})") from None
        eos = gen.get("eos_token_id")
        eos_list = eos if isinstance(eos, list) else [eos]
        gen_eos = [e for e in eos_list if isinstance(e, int) and not isinstance(e, bool)]
        return cls(
            backend, special_tokens=special, chat_template=template, generation_eos_ids=gen_eos, source=str(path)
        )

    # ---- basic properties -------------------------------------------------------------------

    @property
    def backend(self) -> _Backend:
        """The underlying ``tokenizers.Tokenizer`` (read-only use, please)."""
        return self._backend

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the tokenizer's eos plus generation_config's."""
        return self._eos_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id(self._special.get("bos_token"))

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id(self._special.get("pad_token"))

    @property
    def special_tokens(self) -> dict[str, str]:
        """bos/eos/unk/pad token strings, as the chat template sees them."""
        return dict(self._special)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._chat_template)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (what logprobs report per token): exact for byte-level BPE
        and ``<0xHH>`` byte-fallback pieces, so a token holding part of a UTF-8 character is not
        turned into U+FFFD; otherwise the UTF-8 of the piece (sentencepiece's ``▁`` as a space)."""
        piece = self._backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level is None:
            self._byte_level = _decoder_is_byte_level(self._backend)
        if self._byte_level and all(c in _BYTE_DECODER for c in piece):
            return bytes(_BYTE_DECODER[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode()

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    # ---- encode / decode ----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, not encode: the same ids at the same cost, but it releases the GIL, so a huge
        # prompt tokenized on a worker thread does not stall the server's event loop.
        try:
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        except TypeError:
            if isinstance(text, str) and not _is_unicode(text):
                raise InvalidParameterError(
                    "prompt", "the text is not valid Unicode (it holds a lone surrogate, such as \\ud800)"
                ) from None
            raise

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def new_detokenizer(
        self, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, prompt_token_ids, skip_special_tokens)

    # ---- chat ---------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render ``messages`` to prompt text exactly as transformers' ``apply_chat_template(tokenize=False)``.

        A template's ``raise_exception`` (e.g. "roles must alternate") is the caller's fault, so it
        surfaces as ``InvalidParameterError('messages', ...)``, as does a model without a template.
        """
        template = self._template(kwargs.get("tools") is not None)
        chat = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        context = {**self._special, "tools": None, "documents": None, **kwargs}
        try:
            return template.render(messages=chat, add_generation_prompt=add_generation_prompt, **context)
        except jinja2.TemplateError as e:
            raise InvalidParameterError("messages", f"chat template error: {e}") from None

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """Template text encoded without adding special tokens (the template writes its own)."""
        text = self.apply_chat_template(messages, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False)

    def _template(self, with_tools: bool) -> jinja2.Template:
        source = self._chat_template
        if isinstance(source, Mapping):
            name = "tool_use" if with_tools and "tool_use" in source else "default"
            if name not in source:
                raise InvalidParameterError(
                    "messages", f"{self.source}: the model has several chat templates and no 'default' one"
                )
            source = source[name]
        if not source:
            raise InvalidParameterError(
                "messages",
                f"{self.source}: the model has no chat template (none in {TOKENIZER_CONFIG_FILE} or "
                f"{CHAT_TEMPLATE_FILE}); use the completions API with a raw prompt instead",
            )
        if source not in self._compiled:
            try:
                self._compiled[source] = _jinja_env().from_string(source)
            except jinja2.TemplateSyntaxError as e:
                raise ModelLoadError(f"{self.source}: invalid chat template (line {e.lineno}: {e.message})") from None
        return self._compiled[source]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers some templates use): render the body."""

    tags = {"generation"}  # noqa: RUF012  (jinja2's Extension declares it an instance attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        body: str = caller()
        return body


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson HTML-escapes; chat templates expect plain JSON (as transformers renders it).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _jinja_env() -> ImmutableSandboxedEnvironment:
    """The environment transformers renders chat templates in (templates are untrusted code)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def bos_eos_post_processor(backend: _Backend, special: Mapping[str, str | None], add_bos: bool, add_eos: bool) -> Any:
    """The TemplateProcessing transformers installs for add_bos_token/add_eos_token."""
    bos, eos = special.get("bos_token"), special.get("eos_token")
    bos_id = backend.token_to_id(bos) if bos else None
    eos_id = backend.token_to_id(eos) if eos else None
    add_bos = add_bos and bos_id is not None
    add_eos = add_eos and eos_id is not None
    bos, eos = bos or "", eos or ""  # (each is there where it is added: its id is)
    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
    tokens = ([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=tokens)


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(value: object, source: Path) -> str | dict[str, str] | None:
    """tokenizer_config.json's chat_template: a string, or ``[{"name": ..., "template": ...}, ...]``
    (transformers' named templates). Anything else would fail only when a chat request renders it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    raise ModelLoadError(
        f"{source}: chat_template must be a string or a list of {{name, template}} objects "
        f"with string values, got {value!r:.80}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    """An optional JSON object file: {} when absent, ModelLoadError when unreadable."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable bytes stand for themselves, the others are
    shifted to code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _gpt2_byte_decoder()


def _decoder_is_byte_level(backend: _Backend) -> bool:
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    if decoder.get("type") == "Sequence":
        return any(d.get("type") == "ByteLevel" for d in decoder.get("decoders", []))
    return decoder.get("type") == "ByteLevel"


def _is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (JSON's "\\ud800" decodes to one): not encodable."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
