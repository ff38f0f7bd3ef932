"""The vocabulary of a GGUF file as a ``tokenizers`` tokenizer and its ``tokenizer_config.json``,
built the way transformers' GGUF converter builds them (integrations/gguf/gguf_tokenizer_mapping.py),
so that an imported directory yields transformers' token ids (engine/model/gguf_import.py)."""

from __future__ import annotations

from typing import Any, Protocol

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from engine.errors import ModelLoadError
from engine.model.tokenizer import bos_eos_post_processor

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


class GGUFMetadata(Protocol):
    """The file's key-value metadata (engine/model/gguf_import.py's reader)."""

    path: Any

    def get(self, key: str, default: Any = None) -> Any: ...

    def require(self, key: str) -> Any: ...


# Pre-tokenizer split regexes keyed by `tokenizer.ggml.pre`, as transformers' GGUF converter uses
# them. Any other value (e.g. SmolLM2's "smollm") keeps GPT-2's default byte-level regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
}


def tokenizer_files(meta: GGUFMetadata, config: dict[str, Any]) -> tuple[HFTokenizer, dict[str, Any]]:
    """tokenizer.json + tokenizer_config.json contents, as transformers' GGUF converter builds them."""
    model = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.require("tokenizer.ggml.tokens")
    token_types: list[int] = meta.get("tokenizer.ggml.token_type") or []
    if model == "gpt2":
        tok, alphabet = _byte_level_bpe(meta, tokens), set(_bytes_to_unicode().values())
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    elif model == "llama":
        tok, alphabet = _sentencepiece_bpe(meta, tokens, str(meta.get("general.architecture"))), None
        # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    else:
        raise ModelLoadError(
            f"{meta.path}: unsupported GGUF tokenizer model {model!r}; supported: 'gpt2' (byte-level BPE), "
            "'llama' (sentencepiece BPE)"
        )
    # Control tokens become special added tokens (matched whole, skipped on decode). In a byte-level
    # vocabulary one spelled outside the byte alphabet is a llama.cpp mislabel: skip it.
    typed = list(zip(tokens, token_types, strict=False))  # older files may lack token types
    tok.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, ty in typed
            if ty == _CONTROL and (alphabet is None or set(t) <= alphabet)
        ]
    )
    current = tok.get_vocab(with_added_tokens=True)
    user = [AddedToken(t, normalized=False, special=False) for t, ty in typed if ty == _USER_DEFINED and t in current]
    if user:
        tok.add_tokens(user)

    special = {}
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        special[name] = tokens[int(token_id)] if token_id is not None and int(token_id) < len(tokens) else None
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = [t for t in special.values() if t is not None and t not in added]
    if missing:  # named special tokens are always added tokens in transformers
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(missing)])
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    tok.post_processor = bos_eos_post_processor(tok, special, add_bos, add_eos)

    tokenizer_config: dict[str, Any] = {
        # the generic class: transformers then uses tokenizer.json as written instead of rebuilding it
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        tokenizer_config["chat_template"] = template
    return tok, tokenizer_config


def _merges(meta: GGUFMetadata) -> list[tuple[str, str]] | None:
    raw = meta.get("tokenizer.ggml.merges")
    if raw is None:
        return None
    merges = [tuple(m.split(" ")) for m in raw]
    if any(len(m) != 2 for m in merges):
        raise ModelLoadError(f"{meta.path}: malformed tokenizer.ggml.merges entry")
    return merges


def _byte_level_bpe(meta: GGUFMetadata, tokens: list[str]) -> HFTokenizer:
    """GPT-2-style byte-level BPE (transformers' GPT2Tokenizer + the file's pre-tokenizer split)."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token using characters outside the byte alphabet is stored as raw text: respell its bytes.
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    tok = HFTokenizer(
        BPE(
            vocab=vocab,
            merges=_merges(meta) or [],
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = _PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: GGUFMetadata, tokens: list[str], arch: str) -> HFTokenizer:
    """Sentencepiece BPE with byte fallback (Llama 2, Mistral, TinyLlama), as transformers'
    LlamaTokenizer builds it; Gemma's and Phi-3's variants as transformers picks them by architecture
    (gguf_tokenizer_mapping.py's gemma_tokenizer and phi3_tokenizer). Files usually carry no merges:
    they are rebuilt from the scores (Gemma: from the file's token order, which its scores do not follow)."""
    gemma = arch in ("gemma", "gemma2", "gemma3")
    if gemma:  # a token of spaces only is stored as spaces; the model looks it up as "\u2581"s
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _merges(meta)
    if merges is None and gemma:
        merges = _merges_from_scores(vocab, {t: -float(i) for i, t in enumerate(tokens)})
    elif merges is None:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ModelLoadError(f"{meta.path}: sentencepiece vocabulary without merges or scores")
        merges = _merges_from_scores(vocab, dict(zip(tokens, scores, strict=True)))
    unk = "<unk>" if gemma and "<unk>" in vocab else None  # GemmaTokenizer's default
    tok = HFTokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None, unk_token=unk))
    to_space = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # no prefix space: spaces become "\u2581" and stay with the word before them
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence(to_space)
        return tok
    if arch == "phi3":  # the prefix space from a normalizer, so leading spaces are not folded into it
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([*to_space, decoders.Strip(content=" ", left=1)])
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a piece into two vocabulary pieces, best score first (transformers'
    ``generate_merges``: ties broken by the pieces' lengths, then their ids)."""
    merges = []
    for piece, score in scores.items():
        splits = ((piece[:i], piece[i:]) for i in range(1, len(piece)))
        local = [(left, right, score) for left, right in splits if left in vocab and right in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table
