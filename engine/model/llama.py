"""Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral, SmolLM2) over a flat ragged batch.

(Over 400 lines as one concept: the decoder's forward, layer by layer; the families' differences,
rope, MoE, the linear kernels and the shard layout already live in their own modules.)

Tokens of all sequences in a step are one ``[T, hidden]`` matrix (no padding); attention reads and
writes the paged KV cache through ``AttentionMetadata``. Q/K/V and gate/up projections are fused
into single matmuls. Weights arrive with Hugging Face names and are checked against the config.

The model computes with the ``KernelSet`` it is given (engine/kernels.py picks it for the device and
dtype): it loads no kernel and holds no switch of its own; ``use_kernels`` gives it another set.

Tensor parallel (``shard`` and ``collectives``, engine/parallel/): the model holds one rank's shard
(engine/parallel/layout.py says which): its query and KV heads, its gate/up rows, the matching
o_proj and down_proj columns (their outputs all-reduced, one each per layer) and its vocabulary
range of the embedding (looked up where the id falls in it, then all-reduced) and of the head
(logits gathered on every rank, so every rank samples the same tokens from the same floats). Every
family shards so (family_forward.py): a MoE layer's experts each like the dense MLP, under one
all-reduce for the layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch
import torch.nn.functional as F

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.errors import ModelLoadError
from engine.kernels import KernelSet
from engine.model.config import ModelConfig, RopeScaling
from engine.model.family_forward import family_forward
from engine.model.family_weights import family_shapes, layer_extras, plus_one, split_fused
from engine.model.linear import Linear, ProjectionMode, can_pack
from engine.model.moe import MoeWeights
from engine.model.reference_ops import LayerOps
from engine.model.rope import RotaryEmbedding
from engine.native.decode_layers import DecodePlan, NativeDecodeLayers
from engine.native.greedy_head import GreedyHeadWeights
from engine.native.quant_linear import MAX_ROWS as QUANT_MAX_ROWS
from engine.native.quant_linear import QuantizedWeight
from engine.parallel.group import ShardCollectives
from engine.parallel.layout import ShardLayout


class DecoderLayer:
    __slots__ = ("down", "extra", "gate_up", "ln1", "ln2", "moe", "o", "qkv")

    def __init__(
        self,
        qkv: Linear,
        o: Linear,
        ln1: torch.Tensor,
        ln2: torch.Tensor,
        extra: dict[str, torch.Tensor],
        gate_up: Linear | None = None,
        down: Linear | None = None,
        moe: MoeWeights | None = None,
    ) -> None:
        self.qkv = qkv
        self.o = o
        self.ln1 = ln1
        self.ln2 = ln2
        self.extra = extra  # a family's other tensors (family_weights.py)
        self.gate_up = gate_up  # (None where ``moe``: a mixture-of-experts MLP in their place)
        self.down = down
        self.moe = moe

    def dense_mlp(self) -> tuple[Linear, Linear]:
        """(gate_up, down): a plain family's layers all have them."""
        assert self.gate_up is not None and self.down is not None, "a mixture-of-experts layer"
        return self.gate_up, self.down

    def projections(self) -> tuple[Linear, ...]:
        return tuple(p for p in (self.qkv, self.o, self.gate_up, self.down) if p is not None)


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
        kernels: KernelSet,
        shard: ShardLayout | None = None,
        collectives: ShardCollectives | None = None,
    ) -> None:
        cfg = replace(cfg, family=cfg.family.within(max_positions))  # (a window as long as the context: none)
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        moe = cfg.family.moe
        if shard is not None and moe is not None:  # each expert's rows split like the dense MLP's
            for what, n in (
                ("expert intermediate size", moe.intermediate_size),
                ("shared expert intermediate size", moe.shared_intermediate_size),
            ):
                if n % shard.size:
                    raise ModelLoadError(
                        f"tensor_parallel_size={shard.size} does not divide the model's {what} {n} ({cfg.architecture})"
                    )
        if (shard is None) != (collectives is None):
            raise ValueError("a sharded model needs both its shard layout and its group's collectives")
        self.shard = shard
        self.collectives = collectives
        self.num_heads = shard.heads if shard else cfg.num_attention_heads
        self.num_kv_heads = shard.kv_heads if shard else cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.rope = RotaryEmbedding(cfg, max_positions, device, dtype)
        family = cfg.family
        if family.query_pre_attn_scalar is not None:
            self.scale = family.query_pre_attn_scalar**-0.5
        # Gemma 3's sliding layers: their own rope base, unscaled
        self.local_rope = (
            None
            if family.local_rope_theta is None
            else RotaryEmbedding(
                replace(cfg, rope_theta=family.local_rope_theta, rope_scaling=RopeScaling()),
                max_positions,
                device,
                dtype,
            )
        )
        self.layers: list[DecoderLayer] = []  # built with the weights (load_weights)
        self._embed_weight: torch.Tensor | None = None
        self._norm_weight: torch.Tensor | None = None
        self._lm_head: Linear | None = None
        self.kernels = kernels
        self.projection_mode = kernels.projection_mode
        # Decode steps whose every call is a compiled kernel run their layer loop in C (one call a
        # step instead of ~10 a layer: engine/native/decode_layers.py), planned on first use.
        self._decode_plan: DecodePlan | None = None
        # (attention kernel, layer ops, KV cache) it was made for
        self._decode_plan_for: tuple[object, ...] | None = None
        # The head's Q8_0 blocks in the greedy head's layout (the quantized mode, where the greedy head
        # loaded); None: greedy rows take compute_logits and an argmax.
        self.greedy_head_weights: GreedyHeadWeights | None = None
        self.greedy_head_candidates = 0  # exact logits it computed, all calls together (bench/tests)

    @property
    def embed(self) -> torch.Tensor:
        assert self._embed_weight is not None, "weights not loaded"
        return self._embed_weight

    @property
    def norm(self) -> torch.Tensor:
        assert self._norm_weight is not None, "weights not loaded"
        return self._norm_weight

    @property
    def lm_head(self) -> Linear:
        assert self._lm_head is not None, "weights not loaded"
        return self._lm_head

    @property
    def ops(self) -> LayerOps:
        return self.kernels.layer_ops

    def use_kernels(self, kernels: KernelSet) -> None:
        """Compute with ``kernels`` from now on, in the current projection mode where they serve it
        (else in their own default mode)."""
        self.kernels = kernels
        self.invalidate_decode_plan()
        if self._lm_head is None:  # no weights yet: they take the set's mode as they are assembled
            self.projection_mode = kernels.projection_mode
            return
        mode = self.projection_mode
        self.set_projections(mode if self._unserved(mode) is None else kernels.projection_mode)

    # -- weights ----------------------------------------------------------------------------
    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        h, i = c.hidden_size, c.intermediate_size
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, h)
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            shapes[p + "self_attn.q_proj.weight"] = (q_size, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv_size, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv_size, h)
            if c.attention_bias:
                shapes[p + "self_attn.q_proj.bias"] = (q_size,)
                shapes[p + "self_attn.k_proj.bias"] = (kv_size,)
                shapes[p + "self_attn.v_proj.bias"] = (kv_size,)
            shapes[p + "self_attn.o_proj.weight"] = (h, q_size)
            shapes[p + "mlp.gate_proj.weight"] = (i, h)
            shapes[p + "mlp.up_proj.weight"] = (i, h)
            shapes[p + "mlp.down_proj.weight"] = (h, i)
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
        extra, dropped = family_shapes(c)
        for n in range(c.num_hidden_layers):
            p = f"model.layers.{n}."
            shapes.update({p + name: shape for name, shape in extra.items()})
            for name in dropped:
                del shapes[p + name]
        if self.shard is not None:  # this rank's part of each
            shapes = {name: self.shard.shard_shape(name, shape) for name, shape in shapes.items()}
        return shapes

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor, str]]) -> None:
        """Take (name, tensor, source file) triples; fail naming the file on any mismatch."""
        expected = self.expected_shapes()
        got: dict[str, torch.Tensor] = {}
        if self.cfg.family.fused_checkpoint:  # (a rank's parts of each: engine/parallel/layout.py)
            mlp = self.cfg.intermediate_size // (self.shard.size if self.shard else 1)
            weights = split_fused(weights, self.q_size, self.kv_size, mlp)
        for name, tensor, source in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer some checkpoints carry; recomputed from the config
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue  # tied: the embedding is the head
            if name not in expected:
                mlp = ".mlp." in name
                if name.endswith(".o_proj.bias") or (mlp and name.endswith(".bias")):  # a config we do not run
                    field, where = ("mlp_bias", "the MLP projections") if mlp else ("attention_bias", "o_proj")
                    raise ModelLoadError(
                        f"{source}: {name!r}: {self.cfg.architecture} with {field}=true (a bias "
                        f"on {where}) is not supported"
                    )
                raise ModelLoadError(f"{source}: unexpected tensor {name!r} for {self.cfg.architecture}")
            if tuple(tensor.shape) != expected[name]:
                raise ModelLoadError(
                    f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"but config.json implies {expected[name]}"
                )
            got[name] = plus_one(self.cfg, name, tensor).to(device=self.device, dtype=self.dtype)
        missing = sorted(set(expected) - set(got))
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise ModelLoadError(f"weights are missing tensors: {', '.join(missing[:3])}{more}")
        self._assemble(got)

    def _assemble(self, w: dict[str, torch.Tensor]) -> None:
        self.invalidate_decode_plan()
        embed = self._embed_weight = w.pop("model.embed_tokens.weight")
        self._norm_weight = w.pop("model.norm.weight")
        # Tied: the head is the embedding; packed, it is a second copy (the lookup needs it dense).
        lm_head = self._lm_head = Linear(embed if self.cfg.tie_word_embeddings else w.pop("lm_head.weight"))
        self.layers = []
        for n in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{n}."
            a = p + "self_attn."
            qkv_w = torch.cat([w.pop(a + "q_proj.weight"), w.pop(a + "k_proj.weight"), w.pop(a + "v_proj.weight")])
            qkv_b = None
            if self.cfg.attention_bias:
                qkv_b = torch.cat([w.pop(a + "q_proj.bias"), w.pop(a + "k_proj.bias"), w.pop(a + "v_proj.bias")])
            qkv = Linear(qkv_w, qkv_b)
            o = Linear(w.pop(a + "o_proj.weight"))
            extra = layer_extras(self.cfg, w, p)
            moe = gate_up = down = None
            if self.cfg.family.moe is not None:
                moe = MoeWeights.take(self.cfg.family.moe, extra)
            else:
                gate_up = Linear(torch.cat([w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")]))
                down = Linear(w.pop(p + "mlp.down_proj.weight"))
            ln1, ln2 = w.pop(p + "input_layernorm.weight"), w.pop(p + "post_attention_layernorm.weight")
            layer = DecoderLayer(qkv, o, ln1, ln2, extra, gate_up, down, moe)
            self.layers.append(layer)
            # Packed as they are built, so the dense and packed copies of all layers never coexist.
            for proj in layer.projections():
                proj.use(self.projection_mode, self.kernels.skinny)
                proj.use_amx(self.kernels.amx)
        lm_head.use(self.projection_mode, self.kernels.skinny)

    @property
    def takes_blocks(self) -> bool:
        """Whether ``attach_quantized`` can turn the quantized mode on (the kernels load, default mode)."""
        return (
            self.kernels.skinny is not None
            and self.kernels.quant is not None
            and self.projection_mode in (ProjectionMode.SKINNY, ProjectionMode.PACKED)
        )

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
        assert quant is not None  # (takes_blocks)
        head = "model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"
        parts = {self.lm_head: [head]}
        for n, layer in enumerate(self.layers):
            a, m = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
            parts[layer.qkv] = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
            parts[layer.o] = [a + "o_proj.weight"]
            if layer.gate_up is not None and layer.down is not None:  # (not a mixture of experts)
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
                    raise ModelLoadError(
                        f"{source}: the {fused.qtype} blocks of {names[0]} do not dequantize to "
                        f"the weights in the model directory (row {row}); delete the directory "
                        "to re-import it"
                    )
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
        if not self.cfg.family.plain:  # Qwen3, Gemma, MoE...: engine/model/family_forward.py
            return family_forward(self, input_ids, positions, kv_cache, meta, attn, keep)
        eps, norm = self.cfg.rms_norm_eps, self.ops.add_rms_norm
        h = self.embed_ids(input_ids)  # the residual stream, updated in place by each norm
        delta = None  # each block's output, added into h by the next norm
        last = len(self.layers) - 1
        if keep is not None and len(keep) == input_ids.shape[0]:
            keep = None  # every row (a decode step): nothing to skip
        native_layers = self.kernels.decode_layers
        if keep is None and meta.num_prefill_tokens == 0 and native_layers is not None:
            out = self._native_decode(native_layers, h, positions, kv_cache, meta, attn)
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
            gate_up, down = layer.dense_mlp()
            delta = self.reduce(down(self.ops.silu_mul(gate_up(x))))
        return norm(h, delta, self.norm, eps)

    def embed_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``input_ids`` (a shard looks up its vocabulary range's, then sums)."""
        if self.shard is None:
            return F.embedding(input_ids, self.embed)
        lo, hi = self.shard.vocab_range()
        outside = (input_ids < lo) | (input_ids >= hi)
        h = F.embedding((input_ids - lo).clamp_(0, max(0, hi - lo - 1)), self.embed)
        h[outside] = 0
        return self.reduce(h)  # one rank's row plus zeros: exact

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel product's sum over the ranks (the product itself where not sharded)."""
        return partial if self.collectives is None else self.collectives.all_reduce_(partial)

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
        q, k, v = self.ops.rotate_qkv(
            layer.qkv(x), positions, self.rope, self.num_heads, self.num_kv_heads, self.head_dim
        )
        attn.write_kv(k_cache, v_cache, k, v, meta.slot_block, meta.slot_offset)
        if rows is not None and not len(rows):
            return x[:0]
        nd = meta.num_decode_tokens
        if meta.num_prefill_tokens == 0:
            out = attn.decode(q, k_cache, v_cache, *meta.decode_tables(), self.scale)
        elif nd == 0:
            out = attn.prefill(q, k_cache, v_cache, *meta.prefill_tables(), self.scale)
        else:
            out = torch.empty_like(q)
            out[:nd] = attn.decode(q[:nd], k_cache, v_cache, *meta.decode_tables(), self.scale)
            out[nd:] = attn.prefill(q[nd:], k_cache, v_cache, *meta.prefill_tables(), self.scale)
        out = out.view(t, self.q_size)
        return self.reduce(layer.o(out if rows is None else out.index_select(0, rows)))

    def _native_decode(
        self,
        native_layers: NativeDecodeLayers,
        h: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attn: AttentionBackend,
    ) -> torch.Tensor | None:
        """The decode step in one C call where the plan for this model, cache, attention kernel and
        layer ops exists; None (nothing done) otherwise."""
        made_for = (attn.decode_kernel(), self.ops, kv_cache)
        known = self._decode_plan_for
        if known is None or any(a is not b for a, b in zip(known, made_for)):
            self._decode_plan = native_layers.plan(self, kv_cache, made_for[0])
            self._decode_plan_for = made_for
        if self._decode_plan is None:
            return None
        return native_layers.run(
            self._decode_plan, h, positions, meta.slot_block, meta.slot_offset, *meta.decode_tables()
        )

    @property
    def decode_loop_planned(self) -> bool:
        """Whether the last decode step's layers ran in C (a plan exists for this model and cache)."""
        return self._decode_plan is not None

    def invalidate_decode_plan(self) -> None:
        """Call after changing a projection's weights or blocks in place: the plan points at them."""
        self._decode_plan = self._decode_plan_for = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.cfg.family.final_softcap
        if cap is not None:  # Gemma 2
            logits = torch.tanh(logits / cap) * cap
        if self.collectives is not None:
            logits = self.collectives.gather_vocab(logits, self.cfg.vocab_size)
        return logits

    def greedy_head_takes(self, num_rows: int) -> bool:
        """Whether a step sampling ``num_rows`` rows multiplies them all as the head's blocks (at most
        64), so the greedy head's tokens and any row's logits computed alone are that step's floats."""
        return self.greedy_head is not None and 0 < num_rows <= QUANT_MAX_ROWS

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """argmax(compute_logits(hidden)) row by row, the same ids, without computing every logit: where
        the head multiplies GGUF Q8_0 blocks for these rows (the quantized mode, at most 64 rows) and
        the screening kernel loads. None elsewhere, or for a row that is not finite: the caller then
        computes the logits."""
        if (
            not self.greedy_head_takes(hidden.shape[0])
            or hidden.dim() != 2
            or hidden.dtype != torch.float32
            or hidden.stride(1) != 1
        ):
            return None
        greedy_head, weights = self.kernels.greedy_head, self.greedy_head_weights
        if greedy_head is None or weights is None:  # (greedy_head_takes said both are there)
            return None
        got = greedy_head(hidden, weights)
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
            self._lm_head = Linear(self.embed)  # the embedding itself again, not the unpacked copy
            self._lm_head.quantized = blocks
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
            return (
                f"{mode.value} projections need the compiled kernel, which is not loaded here "
                "(CPU fp32 with AVX-512, or AVX2 with FMA, and a C compiler; see BATON_NATIVE_KERNELS)"
            )
        projections = (self.lm_head, *(p for layer in self.layers for p in layer.projections()))
        if mode is ProjectionMode.QUANTIZED and (
            self.kernels.quant is None or not any(p.quantized is not None for p in projections)
        ):
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
