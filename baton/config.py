"""Baton's configuration schema (pydantic), shared by ``baton up`` and ``baton cluster``.

(Over 400 lines as one concept: the config file's schema, one section model per top-level key, with
the cross-section checks that need all of them; the engine's own sections live in engine/config.py.)

A wrong config fails at start with a message naming the field. Secrets (API keys, the Redis
password) are references — ``{env: NAME}`` or ``{file: PATH}`` — so configs can be committed and
mounted from Kubernetes Secrets; ``{value: ...}`` exists for tests and local experiments only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from engine.config import (
    MAX_NUM_SEQS,
    MAX_TENSOR_PARALLEL,
    CacheConfig,
    EngineConfig,
    LaneShareConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from router.admission import PACE_HEADROOM, SLO_HEADROOM
from router.lane_pressure import lane_share_configs
from router.lanes import ClassificationRules, LaneConfig, LanePolicy, TenantConfig, default_lanes
from router.tool_calls.parsers import ToolFormatSetting


class ConfigError(ValueError):
    """A configuration problem; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SecretRef(_Model):
    env: str | None = None
    file: str | None = None
    value: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if sum(x is not None for x in (self.env, self.file, self.value)) != 1:
            raise ValueError("a secret reference needs exactly one of env, file, value")
        return self

    def resolve(self, where: str) -> str:
        if self.env is not None:
            v = os.environ.get(self.env)
            if not v:
                raise ConfigError(f"{where}: environment variable {self.env} is not set")
            return v
        if self.file is not None:
            try:
                return Path(self.file).read_text().strip()
            except OSError as e:
                raise ConfigError(f"{where}: cannot read secret file {self.file}: {e.strerror}") from None
        return self.value or ""


class ModelSection(_Model):
    path: str = Field("default", min_length=1, description="default | tiny | a Hugging Face directory | a .gguf file")
    served_name: str | None = Field(None, description="the model id clients see (default: derived from path)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(None, ge=16)


class EngineSection(_Model):
    block_size: int = Field(16, ge=1)
    max_num_seqs: int = Field(256, ge=1, le=MAX_NUM_SEQS)
    max_num_batched_tokens: int = Field(2048, ge=16)
    kv_cache_memory_gb: float | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="CUDA without kv_cache_memory_gb: the share of the GPU's total memory a "
        "worker's weights, activations and KV cache may use (a fractional-gpus worker: that share of its fraction)",
    )
    enable_prefix_caching: bool = True
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    cuda_graphs: bool = Field(True, description="CUDA: decode steps replay graphs captured at start")
    async_scheduling: bool = Field(
        False, description="schedule step n+1 while step n runs (decode-only steps; the others stay synchronous)"
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=MAX_TENSOR_PARALLEL,
        description="ranks an engine's model is "
        "sharded over (heads and MLP rows split, Megatron-style); the pools' default",
    )
    kv_shared_memory: bool = Field(False, description="CPU: KV caches in /dev/shm; same-host transfers copy directly")
    speculative_tokens: int = Field(
        0, ge=0, le=32, description="n-gram drafts a step for each decoding request; 0: off"
    )
    speculative_min_keep_chance: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="a request drafts only as many tokens as its keep rate gives this chance of "
        "being kept; 0: always speculative_tokens (lower it where a draft row is cheap, as on a GPU)",
    )

    @field_validator("block_size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("block_size must be a power of two")
        return v


class PoolSection(_Model):
    workers: int = Field(1, ge=0)
    cpus: float = Field(1.0, gt=0, description="Ray CPUs per worker: the worker's total, split across its ranks")
    gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per worker (0 on CPU): the worker's total, split across its ranks (one GPU each "
        "at tensor_parallel_size above 1)",
    )
    threads: int = Field(1, ge=1, description="torch threads per worker on CPU")
    tensor_parallel_size: int | None = Field(
        None,
        ge=1,
        le=MAX_TENSOR_PARALLEL,
        description="ranks a worker spans, on one node (null: engine.tensor_parallel_size); the worker's "
        "cpus, gpus and its pool's custom resource are the group's total, split across its ranks",
    )


class PoolsSection(_Model):
    prefill: PoolSection = PoolSection(workers=1)
    decode: PoolSection = PoolSection(workers=1)
    local_prefill_threshold: int = Field(256, ge=0, description="shorter prompts prefill on the decode worker")
    short_prompts_to_idle_prefill: bool = Field(
        True,
        description="a short prompt still goes to a prefill worker with room for it now (idle between "
        "long prompts), so decode steps do not compute it",
    )
    decode_prefill_token_budget: int | None = Field(
        256, ge=1, description="with a prefill pool: prompt tokens a decode worker's step may compute (null: no cap)"
    )
    transfer_timeout_s: float = Field(10.0, gt=0)
    max_restarts: int = Field(3, ge=0)

    @field_validator("decode")
    @classmethod
    def _decode(cls, v: PoolSection) -> PoolSection:
        if v.workers < 1:
            raise ValueError("the decode pool needs at least one worker")
        return v


class RouterSection(_Model):
    replicas: int = Field(1, ge=1, description="router replicas (baton cluster)")
    host: str = Field("127.0.0.1", min_length=1, description="the address to listen on (0.0.0.0 or :: for all)")
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(50051, ge=0, le=65535)
    slo_rejection: bool = True
    slo_headroom: float = Field(
        SLO_HEADROOM,
        gt=0,
        le=1,
        description="queue-wait estimates / this must fit the TTFT SLO; the predicted decode pace must stay "
        "under this x the TPOT SLO (loosened towards pace_headroom while the lane's streams keep within it)",
    )
    pace_headroom: float = Field(
        PACE_HEADROOM,
        gt=0,
        le=1,
        description="the most the pace check's headroom loosens to, while the lane's recently finished "
        "streams ran faster than slo_headroom x its TPOT SLO",
    )
    pace_guard: bool = Field(
        True,
        description="hold lanes with a looser TPOT objective in the router while the live "
        "decode pace is past 0.8 x headroom x the tightest one in use",
    )
    lane_priority: bool = Field(
        True,
        description="decode workers share their sequence slots by lane weight (with each "
        "lane's decode_floor) and preempt preemptible lanes for a more important lane's pace; "
        "admission counts what that frees",
    )
    tenant_cache_isolation: bool = True
    drain_timeout_s: float = Field(30.0, ge=0)
    initial_prefill_tokens_per_s: float = Field(1000.0, gt=0)
    tool_call_format: ToolFormatSetting = Field(
        ToolFormatSetting.AUTO,
        description="the markup tool calls are parsed in and forced calls constrained to "
        "(auto: the one the model's chat template teaches)",
    )

    @model_validator(mode="after")
    def _distinct_ports(self) -> RouterSection:
        if self.http_port and self.http_port == self.grpc_port:
            raise ValueError(f"http_port and grpc_port are both {self.http_port}: they need a port each")
        return self


class LaneSection(_Model):
    name: str
    ttft_slo_s: float = Field(gt=0)
    tpot_slo_s: float = Field(gt=0)
    weight: float = Field(1.0, gt=0)
    priority: int = 0
    queue_bound: int = Field(256, ge=1)
    preemptible: bool = False
    batch_window_s: float = Field(0.0, ge=0)
    durable: bool = False
    decode_floor: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="the least share of a decode worker's sequence slots "
        "the lane keeps while it has demand (router.lane_priority)",
    )


class TenantSection(_Model):
    name: str = Field(min_length=1)
    api_key: SecretRef | None = None
    allowed_lanes: list[str] | None = Field(None, min_length=1, description="null: every lane")
    default_lane: str | None = None
    requests_per_min: float | None = Field(None, gt=0)
    tokens_per_min: float | None = Field(None, gt=0)


class ClassificationSection(_Model):
    long_context_tokens: int = Field(4096, ge=1)
    batch_min_max_tokens: int = Field(1024, ge=1)
    default_lane: str = "interactive"


class AuthSection(_Model):
    required: bool = False
    api_key: SecretRef | None = Field(None, description="a single key for the 'default' tenant")


class RedisSection(_Model):
    url: str | None = Field(None, description="redis://host:port/db; null or empty: start an embedded redis-server")
    password: SecretRef | None = None
    cluster_name: str = Field("baton", pattern=r"^[A-Za-z0-9_-]+$")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if not v:
            return None  # the embedded server
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must start with redis://, rediss:// or unix://, got {v!r}")
        from redis.connection import parse_url

        try:  # (else the URL's error came only when the routers connected, after the workers loaded)
            parse_url(v)
        except ValueError as e:
            raise ValueError(str(e)) from None  # (not the URL: it may hold a password)
        return v


class ClusterSection(_Model):
    """``baton cluster`` on an existing Ray cluster: where each role's actors go."""

    ray_address: str | None = Field(None, description="null: $RAY_ADDRESS, else 'auto'")
    namespace: str = Field("baton", pattern=r"^[A-Za-z0-9_.-]+$", description="Ray namespace of the actors")
    router_resource: str = Field("baton_router", min_length=1, description="custom resource a router node offers")
    prefill_resource: str = Field("baton_prefill", min_length=1)
    decode_resource: str = Field("baton_decode", min_length=1)
    router_cpus: float = Field(1.0, ge=0, description="Ray CPUs per router replica")
    supervise_interval_s: float = Field(5.0, gt=0)
    round_timeout_s: float = Field(10.0, gt=0, description="the most one supervision round waits for its probes")
    start_timeout_s: float = Field(600.0, gt=0, description="model load + placement, per start")
    pending_report_s: float = Field(20.0, gt=0, description="an actor not placed this long is reported")


class ObservabilitySection(_Model):
    """Request tracing (router/tracing.py): off unless an OTLP endpoint is given."""

    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector URL, e.g. http://otel-collector:4318; null: tracing off"
    )
    service_name: str = Field("baton", min_length=1, description="the traces' service.name")
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="share of new traces kept (a client's sampled traceparent is followed)"
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, v: str | None) -> str | None:
        if not v:
            return None
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL (OTLP over HTTP), got {v!r}")
        from importlib.util import find_spec

        if find_spec("opentelemetry.exporter.otlp.proto.http") is None:  # fail at start, not at the first span
            raise ValueError("the OTLP exporter is not installed: pip install 'baton[otlp]'")
        return v


def _default_lane_sections() -> list[LaneSection]:
    return [LaneSection(**lane.__dict__) for lane in default_lanes()]


class BatonConfig(_Model):
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()
    pools: PoolsSection = PoolsSection()
    router: RouterSection = RouterSection()
    lanes: list[LaneSection] = Field(default_factory=_default_lane_sections)
    classification: ClassificationSection = ClassificationSection()
    tenants: list[TenantSection] = Field(default_factory=list)
    auth: AuthSection = AuthSection()
    redis: RedisSection = RedisSection()
    cluster: ClusterSection = ClusterSection()
    observability: ObservabilitySection = ObservabilitySection()

    @model_validator(mode="after")
    def _cross_checks(self) -> BatonConfig:
        names = [lane.name for lane in self.lanes]
        if not names:
            raise ValueError("lanes: at least one lane is required")
        if len(set(names)) != len(names):
            raise ValueError("lanes: lane names must be unique")
        if self.classification.default_lane not in names:
            raise ValueError(f"classification.default_lane: {self.classification.default_lane!r} is not a lane")
        seen: set[str] = set()
        for i, t in enumerate(self.tenants):
            for lane in (t.allowed_lanes or []) + ([t.default_lane] if t.default_lane else []):
                if lane not in names:
                    raise ValueError(f"tenants[{i}] ({t.name}): unknown lane {lane!r}")
            if t.default_lane and t.allowed_lanes and t.default_lane not in t.allowed_lanes:
                raise ValueError(
                    f"tenants[{i}] ({t.name}): default_lane {t.default_lane!r} is not in its allowed_lanes"
                )
            if t.name in seen:  # the router knows a tenant by name: the second one's limits would be ignored
                raise ValueError(f"tenants[{i}]: the name {t.name!r} is taken by an earlier tenant")
            seen.add(t.name)
        for role, pool in (("prefill", self.pools.prefill), ("decode", self.pools.decode)):
            tp = self.pool_tensor_parallel_size(role)
            # A worker's gpus are its ranks' total: each rank holds a whole GPU of its own.
            if pool.gpus and pool.gpus < tp:
                raise ValueError(
                    f"pools.{role}: tensor_parallel_size={tp} needs one GPU per rank, but a worker is "
                    f"given gpus={pool.gpus:g} in all (its ranks' total)"
                )
            if pool.gpus and tp > 1 and pool.gpus % tp:
                raise ValueError(
                    f"pools.{role}: gpus={pool.gpus:g} does not split into whole GPUs across "
                    f"tensor_parallel_size={tp} ranks"
                )
        if self.auth.api_key is not None and "default" in seen:
            raise ValueError(
                "auth.api_key is the 'default' tenant's key, and a tenant named 'default' is "
                "configured too: give that tenant the key instead"
            )
        return self

    # -- building the runtime objects ------------------------------------------------------------
    def engine_config(self) -> EngineConfig:
        e = self.engine
        return EngineConfig(
            model=self.model.path,
            dtype=self.model.dtype,
            max_model_len=self.model.max_model_len,
            attention_backend=e.attention_backend,
            cuda_graphs=e.cuda_graphs,
            async_scheduling=e.async_scheduling,
            tensor_parallel_size=e.tensor_parallel_size,
            scheduler=SchedulerConfig(
                max_num_seqs=e.max_num_seqs,
                max_num_batched_tokens=e.max_num_batched_tokens,
                speculative=SpeculativeConfig.from_num_tokens(
                    e.speculative_tokens, min_keep_chance=e.speculative_min_keep_chance
                ),
                lane_shares=self.lane_shares(),
            ),
            cache=CacheConfig(
                block_size=e.block_size,
                kv_cache_memory_gb=e.kv_cache_memory_gb,
                gpu_memory_utilization=e.gpu_memory_utilization,
                enable_prefix_caching=e.enable_prefix_caching,
                shared_memory=e.kv_shared_memory,
            ),
        )

    def pool_tensor_parallel_size(self, role: str) -> int:
        """The ranks a ``role`` ('prefill' or 'decode') worker spans: its pool's size, else the engine's."""
        pool = self.pools.prefill if role == "prefill" else self.pools.decode
        return pool.tensor_parallel_size or self.engine.tensor_parallel_size

    def lane_shares(self) -> tuple[LaneShareConfig, ...]:
        """The lanes as the workers' schedulers share decode capacity by them (none: router.lane_priority off)."""
        if not self.router.lane_priority:
            return ()
        return lane_share_configs(LaneConfig(**lane.model_dump()) for lane in self.lanes)

    def lane_policy(self) -> LanePolicy:
        tenants = []
        for i, t in enumerate(self.tenants):
            key = t.api_key.resolve(f"tenants[{i}].api_key") if t.api_key else None
            tenants.append(
                TenantConfig(
                    t.name,
                    key,
                    tuple(t.allowed_lanes) if t.allowed_lanes else None,
                    t.default_lane,
                    t.requests_per_min,
                    t.tokens_per_min,
                )
            )
        default_key = self.auth.api_key.resolve("auth.api_key") if self.auth.api_key else None
        if not any(t.name == "default" for t in tenants):
            tenants.append(TenantConfig("default", default_key))
        required = self.auth.required or default_key is not None
        try:
            return LanePolicy(
                lanes=tuple(LaneConfig(**lane.model_dump()) for lane in self.lanes),
                tenants=tuple(tenants),
                rules=ClassificationRules(**self.classification.model_dump()),
                auth_required=required,
            )
        except ValueError as e:
            raise ConfigError(f"config: {e}") from None

    def redis_password(self) -> str | None:
        return self.redis.password.resolve("redis.password") if self.redis.password else None


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> BatonConfig:
    """Read a YAML config (or the defaults), apply dotted overrides (``{"pools.decode.workers": 2}``),
    validate. Raises ConfigError naming the file and the field."""
    data: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
        try:
            data = yaml.load(raw, Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the config must be a mapping at the top level")
    applied = False
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: {'.'.join(parents[: depth + 1])}: must be a mapping, got {node!r}")
        node[leaf] = value
        applied = True
    if applied:
        source += " + command-line options"
    try:
        return BatonConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: " + "; ".join(_describe(err) for err in e.errors())) from None


def _describe(err: ErrorDetails) -> str:
    loc = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
    msg = err.get("msg", "invalid")
    msg = msg.removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (the second would silently win)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # SafeLoader refuses an unhashable key itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
