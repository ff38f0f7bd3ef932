"""A tiny, seeded, random-weight Llama in Hugging Face format, for tests and CPU development.

Big enough to exercise every code path (GQA, several layers, a real byte-level BPE tokenizer and a
chat template), small enough (about 5M parameters, 20 MB) to build in a second and run anywhere.
The output is a pure function of the seed: the same bytes every time, on every machine, so tests
can compare against transformers loading the very same directory.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers, trainers
from tokenizers.models import BPE

from engine.model.tokenizer import bos_eos_post_processor
from engine.model.weights import SINGLE_FILE, atomic_model_dir

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "vocab_size": 4096,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Hello, world! How are you today? I am fine, thank you. What is the weather like in Paris, London and Tokyo?
Once upon a time there was a little model that served tokens to many users, one batch after another.
The scheduler decides which requests run; the cache keeps keys and values; the sampler picks the next token.
def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * i)\n
{"role": "user", "content": "Write a haiku about the sea."} <|user|> <|assistant|> <|system|>
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1024 2048 4096 3.14159 2.71828 1e-5 -7 +8 50% $12.99
Émile a mangé une crème brûlée au café. Der Bär läuft über die Straße. ¿Dónde está la biblioteca?
日本語のテキストも少し含めます。中文也有一些。 Emoji: 😀 🚀 🎉 👍🏽 ❤️
"""


def build_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny model (config, fp32 weights, tokenizer, generation config) to ``out_dir``.

    The directory appears atomically (built aside, then renamed), so a concurrent reader never
    sees a partial model; an existing ``out_dir`` is replaced.
    """
    out_dir = Path(out_dir)
    with atomic_model_dir(out_dir) as tmp:
        (tmp / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        save_file(_weights(seed), str(tmp / SINGLE_FILE), metadata={"format": "pt"})
        _tokenizer().save(str(tmp / "tokenizer.json"))
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": CONFIG["max_position_embeddings"],
            "chat_template": CHAT_TEMPLATE,
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        generation = {"bos_token_id": 1, "eos_token_id": 2}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out_dir


def _int(key: str) -> int:
    """One of CONFIG's sizes (CONFIG is config.json's JSON, whose values vary in type)."""
    value = CONFIG[key]
    assert isinstance(value, int), key
    return value


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) matrices and all-ones norms, drawn in a fixed order from one generator."""
    hidden, inter, head_dim = _int("hidden_size"), _int("intermediate_size"), _int("head_dim")
    q_dim, kv_dim = _int("num_attention_heads") * head_dim, _int("num_key_value_heads") * head_dim
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)

    tensors = {"model.embed_tokens.weight": normal(_int("vocab_size"), hidden)}
    for i in range(_int("num_hidden_layers")):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_dim, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_dim, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_dim, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, q_dim)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[p + "input_layernorm.weight"] = torch.ones(hidden)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["lm_head.weight"] = normal(_int("vocab_size"), hidden)
    return tensors


def _corpus() -> list[str]:
    """The built-in text plus seeded pseudo-words, so BPE has enough pairs to fill 4096 tokens."""
    rng = random.Random(1234)  # fixed: the tokenizer must not depend on the weights seed
    syllables = ["ka", "lo", "mi", "ne", "tra", "ver", "so", "qu", "an", "el", "is", "or", "un", "th", "st", "ing"]
    lines = _CORPUS.splitlines()
    for _ in range(4000):
        words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(3, 10))]
        lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ";", ""]))
    return lines


def _tokenizer() -> HFTokenizer:
    """A byte-level BPE trained on the built-in corpus to exactly the model's vocab size.

    The tokenizers BPE trainer is deterministic (ties break on token ids, which follow the sorted
    alphabet), so the same JSON comes out every time.
    """
    tok = HFTokenizer(BPE(continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_int("vocab_size"),
        min_frequency=0,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = bos_eos_post_processor(tok, {"bos_token": "<s>", "eos_token": "</s>"}, True, False)
    return tok
