"""Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral, SmolLM2) over a flat ragged batch.

Tokens of all sequences in a step are one ``[T, hidden]`` matrix (no padding); attention reads and
writes the paged KV cache through ``AttentionMetadata``. Q/K/V and gate/up projections are fused
into single matmuls. Weights arrive with Hugging Face names and are checked against the config.

The model computes with the ``KernelSet`` it is given (engine/kernels.py picks it for the device and
dtype): it loads no kernel and holds no switch of its own; ``use_kernels`` gives it another set.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.errors import ModelLoadError
from engine.kernels import KernelSet
from engine.model.config import ModelConfig
from engine.model.linear import Linear, ProjectionMode, can_pack
from engine.model.reference_ops import LayerOps
from engine.model.rope import RotaryEmbedding
from engine.native.decode_layers import DecodePlan
from engine.native.greedy_head import GreedyHeadWeights
from engine.native.quant_linear import MAX_ROWS as QUANT_MAX_ROWS
from engine.native.quant_linear import QuantizedWeight


class DecoderLayer:
    __slots__ = ("qkv", "o", "gate_up", "down", "ln1", "ln2")

    def __init__(self) -> None:
        self.qkv = self.o = self.gate_up = self.down = None
        self.ln1 = self.ln2 = None

    def projections(self) -> tuple[Linear, ...]:
        return (self.qkv, self.o, self.gate_up, self.down)


class LlamaModel:
    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype, max_positions: int,
                 kernels: KernelSet) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.rope = RotaryEmbedding(cfg, max_positions, device, dtype)
        self.layers = [DecoderLayer() for _ in range(cfg.num_hidden_layers)]
        self.embed: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.lm_head: Linear | None = None
        self.kernels = kernels
        self.projection_mode = kernels.projection_mode
        # Decode steps whose every call is a compiled kernel run their layer loop in C (one call a
        # step instead of ~10 a layer: engine/native/decode_layers.py), planned on first use.
        self._decode_plan: DecodePlan | None = None
        self._decode_plan_for: tuple | None = None  # (attention kernel, layer ops, KV cache) it was made for
        # The head's Q8_0 blocks in the greedy head's layout (the quantized mode, where the greedy head
        # loaded); None: greedy rows take compute_logits and an argmax.
        self.greedy_head_weights: GreedyHeadWeights | None = None
        self.greedy_head_candidates = 0  # exact logits it computed, all calls together (bench/tests)

    @property
    def ops(self) -> LayerOps:
        return self.kernels.layer_ops

    def use_kernels(self, kernels: KernelSet) -> None:
        """Compute with ``kernels`` from now on, in the current projection mode where they serve it
        (else in their own default mode)."""
        self.kernels = kernels
        self.invalidate_decode_plan()
        if self.lm_head is None:  # no weights yet: they take the set's mode as they are assembled
            self.projection_mode = kernels.projection_mode
            return
        mode = self.projection_mode
        self.set_projections(mode if self._unserved(mode) is None else kernels.projection_mode)

    # -- weights ----------------------------------------------------------------------------
    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        h, i = c.hidden_size, c.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, h)
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            shapes[p + "self_attn.q_proj.weight"] = (self.q_size, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.kv_size, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.kv_size, h)
            if c.attention_bias:
                shapes[p + "self_attn.q_proj.bias"] = (self.q_size,)
                shapes[p + "self_attn.k_proj.bias"] = (self.kv_size,)
                shapes[p + "self_attn.v_proj.bias"] = (self.kv_size,)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.q_size)
            shapes[p + "mlp.gate_proj.weight"] = (i, h)
            shapes[p + "mlp.up_proj.weight"] = (i, h)
            shapes[p + "mlp.down_proj.weight"] = (h, i)
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
        return shapes

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor, str]]) -> None:
        """Take (name, tensor, source file) triples; fail naming the file on any mismatch."""
        expected = self.expected_shapes()
        got: dict[str, torch.Tensor] = {}
        for name, tensor, source in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer some checkpoints carry; recomputed from the config
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue  # tied: the embedding is the head
            if name not in expected:
                mlp = ".mlp." in name
                if name.endswith(".o_proj.bias") or (mlp and name.endswith(".bias")):  # a config we do not run
                    field, where = ("mlp_bias", "the MLP projections") if mlp else ("attention_bias", "o_proj")
                    raise ModelLoadError(f"{source}: {name!r}: {self.cfg.architecture} with {field}=true (a bias "
                                         f"on {where}) is not supported")
                raise ModelLoadError(f"{source}: unexpected tensor {name!r} for {self.cfg.architecture}")
            if tuple(tensor.shape) != expected[name]:
                raise ModelLoadError(
                    f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"but config.json implies {expected[name]}"
                )
            got[name] = tensor.to(device=self.device, dtype=self.dtype)
        missing = sorted(set(expected) - set(got))
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise ModelLoadError(f"weights are missing tensors: {', '.join(missing[:3])}{more}")
        self._assemble(got)

    def _assemble(self, w: dict[str, torch.Tensor]) -> None:
        self.invalidate_decode_plan()
        self.embed = w.pop("model.embed_tokens.weight")
        self.norm = w.pop("model.norm.weight")
        # Tied: the head is the embedding; packed, it is a second copy (the lookup needs it dense).
        self.lm_head = Linear(self.embed if self.cfg.tie_word_embeddings else w.pop("lm_head.weight"))
        for n, layer in enumerate(self.layers):
            p = f"model.layers.{n}."
            a = p + "self_attn."
            qkv_w = torch.cat([w.pop(a + "q_proj.weight"), w.pop(a + "k_proj.weight"), w.pop(a + "v_proj.weight")])
            qkv_b = None
            if self.cfg.attention_bias:
                qkv_b = torch.cat([w.pop(a + "q_proj.bias"), w.pop(a + "k_proj.bias"), w.pop(a + "v_proj.bias")])
            layer.qkv = Linear(qkv_w, qkv_b)
            layer.o = Linear(w.pop(a + "o_proj.weight"))
            gate_up = torch.cat([w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")])
            layer.gate_up = Linear(gate_up)
            layer.down = Linear(w.pop(p + "mlp.down_proj.weight"))
            layer.ln1 = w.pop(p + "input_layernorm.weight")
            layer.ln2 = w.pop(p + "post_attention_layernorm.weight")
            # Packed as they are built, so the dense and packed copies of all layers never coexist.
            for proj in layer.projections():
                proj.use(self.projection_mode, self.kernels.skinny)
                proj.use_amx(self.kernels.amx)
        self.lm_head.use(self.projection_mode, self.kernels.skinny)

    @property
    def takes_blocks(self) -> bool:
        """Whether ``attach_quantized`` can turn the quantized mode on (the kernels load, default mode)."""
        return (self.kernels.skinny is not None and self.kernels.quant is not None
                and self.projection_mode in (ProjectionMode.SKINNY, ProjectionMode.PACKED))

    def attach_quantized(self, blocks: dict[str, QuantizedWeight], source: str) -> bool:
        """Give each projection the GGUF blocks its weight was dequantized from (``blocks`` by HF
        tensor name) and multiply them in decode steps (the ``quantized`` mode) where the kernel loads and
        the model's default is the skinny kernel, or packed weights on a CPU the skinny kernel runs on
        (AMD: larger products then stay packed). Fused projections need blocks for every part. Returns
        whether the quantized mode is on. A block row that does not dequantize to the loaded weight
        (a stale or foreign file) fails the load naming ``source``."""
        if not self.takes_blocks or not blocks:
            return False
        quant = self.kernels.quant
        head = "model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"
        parts = {self.lm_head: [head]}
        for n, layer in enumerate(self.layers):
            a, m = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
            parts[layer.qkv] = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
            parts[layer.o] = [a + "o_proj.weight"]
            parts[layer.gate_up] = [m + "gate_proj.weight", m + "up_proj.weight"]
            parts[layer.down] = [m + "down_proj.weight"]
        attached = 0
        for proj, names in parts.items():
            found = [blocks[name] for name in names if name in blocks]
            fused = QuantizedWeight.cat(found) if len(found) == len(names) else None
            if fused is None or fused.shape != tuple(proj.weight.shape):
                continue
            dense = proj.dense_weight()  # a copy where packed: at load only
            for row in (0, fused.shape[0] - 1):  # cheap: the first and last rows, exactly
                got = quant.dequantize(QuantizedWeight(fused.blocks[row : row + 1], fused.qtype))
                if not torch.equal(got[0], dense[row]):
                    raise ModelLoadError(f"{source}: the {fused.qtype} blocks of {names[0]} do not dequantize to "
                                         f"the weights in the model directory (row {row}); delete the directory "
                                         "to re-import it")
            proj.quantized = fused.regroup()  # Q4_1 in the kernel's 8-row layout (same floats, faster)
            attached += 1
        if not attached:  # no set of blocks fits a projection (another model's, or incomplete fused parts)
            return False
        self.set_projections(ProjectionMode.QUANTIZED)
        return True

    # -- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attn: AttentionBackend,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]. kv_cache: [blocks, layers, 2, block, kv_heads, head_dim]. -> [T, hidden],
        or with ``keep`` (row indices, ascending) only those rows' hidden states: the last layer still
        writes every row's K/V (later tokens attend to them), but its output projection and MLP run for
        the kept rows alone. A prefill chunk needs only its last row, for sampling: this skips most of
        the last layer's multiply-adds for the rest."""
        eps, norm = self.cfg.rms_norm_eps, self.ops.add_rms_norm
        h = F.embedding(input_ids, self.embed)  # the residual stream, updated in place by each norm
        delta = None  # each block's output, added into h by the next norm
        last = len(self.layers) - 1
        if keep is not None and len(keep) == input_ids.shape[0]:
            keep = None  # every row (a decode step): nothing to skip
        if keep is None and meta.num_prefill_tokens == 0 and self.kernels.decode_layers is not None:
            out = self._native_decode(h, positions, kv_cache, meta, attn)
            if out is not None:
                return out
        for n, layer in enumerate(self.layers):
            x = norm(h, delta, layer.ln1, eps)
            rows = keep if n == last else None
            delta = self._attention(x, positions, kv_cache[:, n, 0], kv_cache[:, n, 1], layer, meta, attn, rows)
            if rows is not None:
                if not len(rows):
                    return h[:0]
                h = h.index_select(0, rows)
            x = norm(h, delta, layer.ln2, eps)
            delta = layer.down(self.ops.silu_mul(layer.gate_up(x)))
        return norm(h, delta, self.norm, eps)

    def _attention(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer: DecoderLayer,
        meta: AttentionMetadata,
        attn: AttentionBackend,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention block's output for every row, or for ``rows`` only (every row's K/V is written)."""
        t = x.shape[0]
        q, k, v = self.ops.rotate_qkv(layer.qkv(x), positions, self.rope, self.num_heads, self.num_kv_heads, self.head_dim)
        attn.write_kv(k_cache, v_cache, k, v, meta.slot_block, meta.slot_offset)
        if rows is not None and not len(rows):
            return x[:0]
        nd = meta.num_decode_tokens
        if meta.num_prefill_tokens == 0:
            out = attn.decode(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale)
        elif nd == 0:
            out = attn.prefill(
                q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, self.scale
            )
        else:
            out = torch.empty_like(q)
            out[:nd] = attn.decode(q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale)
            out[nd:] = attn.prefill(
                q[nd:], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens,
                self.scale,
            )
        out = out.view(t, self.q_size)
        return layer.o(out if rows is None else out.index_select(0, rows))

    def _native_decode(self, h, positions, kv_cache, meta: AttentionMetadata, attn: AttentionBackend):
        """The decode step in one C call where the plan for this model, cache, attention kernel and
        layer ops exists; None (nothing done) otherwise."""
        native_layers = self.kernels.decode_layers
        made_for = (attn.decode_kernel(), self.ops, kv_cache)
        known = self._decode_plan_for
        if known is None or any(a is not b for a, b in zip(known, made_for)):
            self._decode_plan = native_layers.plan(self, kv_cache, made_for[0])
            self._decode_plan_for = made_for
        if self._decode_plan is None:
            return None
        return native_layers.run(self._decode_plan, h, positions, meta.slot_block, meta.slot_offset,
                                      meta.decode_block_tables, meta.decode_seq_lens)

    @property
    def decode_loop_planned(self) -> bool:
        """Whether the last decode step's layers ran in C (a plan exists for this model and cache)."""
        return self._decode_plan is not None

    def invalidate_decode_plan(self) -> None:
        """Call after changing a projection's weights or blocks in place: the plan points at them."""
        self._decode_plan = self._decode_plan_for = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def greedy_head_takes(self, num_rows: int) -> bool:
        """Whether a step sampling ``num_rows`` rows multiplies them all as the head's blocks (at most
        64), so the greedy head's tokens and any row's logits computed alone are that step's floats."""
        return self.greedy_head is not None and 0 < num_rows <= QUANT_MAX_ROWS

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """argmax(compute_logits(hidden)) row by row, the same ids, without computing every logit: where
        the head multiplies GGUF Q8_0 blocks for these rows (the quantized mode, at most 64 rows) and
        the screening kernel loads. None elsewhere, or for a row that is not finite: the caller then
        computes the logits."""
        if (not self.greedy_head_takes(hidden.shape[0]) or hidden.dim() != 2 or hidden.dtype != torch.float32
                or hidden.stride(1) != 1):
            return None
        got = self.kernels.greedy_head(hidden, self.greedy_head_weights)
        if got is None:
            return None
        self.greedy_head_candidates += got[1]
        return got[0]

    @property
    def greedy_head(self) -> GreedyHeadWeights | None:
        """The head's blocks for the greedy head, where greedy rows take it (else None)."""
        return self.greedy_head_weights if self.kernels.greedy_head is not None else None

    def set_projections(self, mode: ProjectionMode | str) -> None:
        """Multiply every projection the ``mode`` way (engine/model/linear.py): same products, another kernel."""
        mode = ProjectionMode.of(mode)
        problem = self._unserved(mode)
        if problem is not None:
            raise ValueError(problem)
        skinny, quant = self.kernels.skinny, self.kernels.quant
        if self.cfg.tie_word_embeddings and mode is not ProjectionMode.PACKED:
            blocks = self.lm_head.quantized
            self.lm_head = Linear(self.embed)  # the embedding itself again, not the unpacked copy
            self.lm_head.quantized = blocks
        pack_large = self.kernels.pack_large
        # A tied head is the embedding, which the lookup needs dense: it never packs for larger products.
        self.lm_head.use(mode, skinny, quant, pack_large and not self.cfg.tie_word_embeddings)
        for proj in (p for layer in self.layers for p in layer.projections()):
            proj.use(mode, skinny, quant, pack_large)
            # The head stays on its mode's path for larger products (prompt scoring is rare, and its
            # AMX pieces would be another 1.5x of the vocabulary's weights).
            proj.use_amx(self.kernels.amx)
        self.projection_mode = mode
        self.invalidate_decode_plan()
        self._set_greedy_head()

    def _unserved(self, mode: ProjectionMode) -> str | None:
        """Why ``mode`` cannot run on this model with its kernels; None where it can."""
        if mode is ProjectionMode.PACKED and not can_pack(self.device, self.dtype):
            return f"packed weights need fp32 on a CPU torch with oneDNN (have {self.dtype} on {self.device})"
        if mode in (ProjectionMode.SKINNY, ProjectionMode.QUANTIZED) and self.kernels.skinny is None:
            return (f"{mode.value} projections need the compiled kernel, which is not loaded here "
                    "(CPU fp32 with AVX-512, or AVX2 with FMA, and a C compiler; see BATON_NATIVE_KERNELS)")
        projections = (self.lm_head, *(p for layer in self.layers for p in layer.projections()))
        if mode is ProjectionMode.QUANTIZED and (self.kernels.quant is None
                                                 or not any(p.quantized is not None for p in projections)):
            return "quantized projections need GGUF blocks attached (attach_quantized) and their kernel"
        return None

    def _set_greedy_head(self) -> None:
        """The greedy head's weights where the head's decode-sized products multiply Q8_0 blocks (else None)."""
        head = self.lm_head
        if head.quant is None or head.quantized is None:
            self.greedy_head_weights = None
            return
        if self.greedy_head_weights is not None and self.greedy_head_weights.blocks is head.quantized.blocks:
            return  # (prepared for these blocks already)
        has_kernel = self.kernels.greedy_head is not None
        self.greedy_head_weights = GreedyHeadWeights.of(head.quantized) if has_kernel else None
