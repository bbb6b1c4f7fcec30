"""Typed settings of the router runtime (it runs inside the gateway process). Env prefix ``LORAPLANE_``.

``LORAPLANE_POOLS`` is a JSON list of pools, e.g.::

    [{"name": "main", "base_model": "demo-base", "urls": ["http://10.0.0.5:8000"],
      "max_loras": 4, "max_adapters": 8,
      "staging": {"mode": "local", "dir": "/shared/staging"}}]

or with ``"dns": "vllm.svc:8000"`` (re-resolved every ``dns_interval_s``) instead of ``urls``, and
``"staging": {"mode": "agent", "url_template": "http://{host}:9090", "token": "…"}`` to stage
through ``loraplane agent`` running beside each replica.

``"engine"`` picks the pool's driver (``vllm`` | ``sglang`` | ``ray-serve`` | ``trtllm``; see
``router.capabilities``). A ``ray-serve`` pool stages by publishing to the app's
``dynamic_lora_loading_path``: ``"staging": {"mode": "publish", "uri": "s3://bucket/loras/"}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

from kit.settings import LoraplaneSettings
from router.capabilities import EngineName, capabilities_of


class StagingConfig(BaseModel):
    """Where a pool's replicas read adapter files from."""

    mode: Literal["local", "agent", "publish"] = Field(
        default="local",
        description="local: a directory shared with the replicas; agent: `loraplane agent` per replica; "
        "publish: verified files published under the version's name to `uri`, where an engine that "
        "loads adapters by name reads them (ray-serve's dynamic_lora_loading_path).",
    )
    dir: Path | None = Field(
        default=None,
        description="local: the shared staging directory (default: the router's staging_dir). "
        "agent: the staging directory as the replica sees it (default: what the agent reports).",
    )
    url_template: str = Field(
        default="http://{host}:9090",
        description="agent mode: agent URL for a replica; {host} is the replica's host name or IP.",
    )
    token: SecretStr | None = Field(default=None, description="agent mode: bearer token of the agent.")
    uri: str | None = Field(
        default=None,
        description="publish mode: where to publish, `s3://bucket/prefix/` (the engine's "
        "dynamic_lora_loading_path) or `file:///dir` (simulated replicas only).",
    )
    endpoint_url: str | None = Field(
        default=None, description="publish mode, s3: the S3 endpoint (default: boto3's, AWS_ENDPOINT_URL)."
    )
    region: str | None = Field(default=None, description="publish mode, s3: the region.")
    access_key_id: str | None = Field(
        default=None, description="publish mode, s3: access key (default: boto3's credential chain)."
    )
    secret_access_key: SecretStr | None = Field(default=None, description="publish mode, s3: secret key.")


UNBOUNDED = 1 << 30  # ``PoolConfig.evict_bound`` of a pool whose engine evicts by itself


class PoolConfig(BaseModel):
    """One pool of identical replicas serving one base model."""

    name: str = Field(default="default", description="Pool name (shown in replica records and metrics).")
    base_model: str = Field(default="demo-base", description="Registry base model served by this pool.")
    served_model: str | None = Field(
        default=None, description="Name the replicas serve the base model under (default: base_model)."
    )
    urls: list[str] = Field(default_factory=list, description="Static replica URLs (http://host:port).")
    dns: str | None = Field(
        default=None, description="host:port resolved periodically; every address is one replica."
    )
    dns_interval_s: float = Field(default=10.0, description="Re-resolution interval of `dns`.")
    max_loras: int = Field(default=4, ge=1, description="GPU LoRA slots per replica (vLLM --max-loras).")
    max_adapters: int = Field(default=8, ge=1, description="Adapters kept registered per replica.")
    max_num_seqs: int = Field(
        default=256,
        ge=1,
        description="Requests a replica runs at once (vLLM --max-num-seqs): placement's measure of a "
        "replica's load.",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        description="Adapters a replica keeps in host memory (vLLM --max-cpu-loras; default: vLLM's, "
        "max_loras). Placement prices an adapter there as a copy into a GPU slot, one beyond it as a "
        "re-read from disk.",
    )
    max_lora_rank: int | None = Field(
        default=None,
        ge=1,
        description="vLLM --max-lora-rank of the replicas (unknown when unset): adapters of a higher rank "
        "are never placed there, and lower ranks pay for the padding.",
    )
    reserved_hot_slots: int = Field(
        default=0,
        ge=0,
        description="Of each replica's max_loras, this many are kept for adapters marked hot: a replica "
        "whose other slots are busy with cold adapters takes no further cold adapter (SPEC §15).",
    )
    engine: EngineName = Field(
        default="vllm",
        description="Engine of the replicas: vllm | sglang | ray-serve | trtllm (docs/engines.md).",
    )
    api_key: SecretStr | None = Field(default=None, description="Replica --api-key, sent as a bearer token.")
    staging: StagingConfig = Field(default_factory=StagingConfig, description="How files are staged.")

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.urls and self.dns:
            raise ValueError(f"pool {self.name}: give either urls or dns, not both")
        self._check_engine_staging()
        if self.max_adapters < self.max_loras:
            self.max_adapters = self.max_loras
        self.urls = [u.rstrip("/") for u in self.urls]
        return self

    def _check_engine_staging(self) -> None:
        """The staging an engine's load mode needs (``router.capabilities``)."""
        caps = capabilities_of(self.engine)
        mode = self.staging.mode
        if caps.load_mode == "lazy_by_name" and mode != "publish":
            raise ValueError(
                f"pool {self.name}: engine {self.engine} loads adapters by name from a store; set "
                'staging {"mode": "publish", "uri": "s3://bucket/prefix/"} (its dynamic_lora_loading_path)'
            )
        if mode == "publish":
            if caps.load_mode != "lazy_by_name":
                raise ValueError(
                    f"pool {self.name}: staging mode publish is for engines that load adapters by name "
                    f"(ray-serve); engine {self.engine} reads staged files (mode local or agent)"
                )
            uri = self.staging.uri or ""
            if not (uri.startswith("s3://") and len(uri) > 5) and not uri.startswith("file:///"):
                raise ValueError(
                    f"pool {self.name}: staging mode publish needs uri s3://bucket/prefix/ (or file:///dir "
                    "for simulated replicas)"
                )
        if caps.load_mode == "per_request" and mode == "agent" and self.staging.dir is None:
            raise ValueError(
                f"pool {self.name}: engine {self.engine} is told the adapter's path in every request; "
                "set staging.dir to the staging directory as the replicas see it"
            )

    @property
    def served_name(self) -> str:
        return self.served_model or self.base_model

    @property
    def evict_bound(self) -> int:
        """Adapters the plane keeps registered per replica, evicting beyond it: ``max_adapters``,
        or no bound for an engine whose own LRU bounds what it holds (the plane never evicts for
        room there; ``router.capabilities``)."""
        return self.max_adapters if capabilities_of(self.engine).plane_evicts else UNBOUNDED


class RouterSettings(LoraplaneSettings):
    """Settings of the router runtime."""

    pools: list[PoolConfig] = Field(
        default_factory=list, description="Replica pools (LORAPLANE_POOLS, JSON)."
    )
    staging_dir: Path | None = Field(
        default=None, description="Local staging directory (default: data_dir/staging)."
    )
    load_timeout_s: float = Field(default=30.0, description="Longest a request waits for an adapter load.")
    load_settle_s: float = Field(
        default=60.0,
        ge=0,
        description="A load call that went unanswered (timed out, or its connection broke with the replica "
        "up) may still finish on the replica: for up to this long the adapter stays counted toward "
        "max_adapters (as loading) while the replica's listing is watched for it; if it never shows, "
        "the router unloads it to be sure and the load counts as failed.",
    )
    max_loads_per_replica: int = Field(
        default=1,
        ge=0,
        description="Cold-load admission: adapter loads in flight at once on one replica, cluster-wide "
        "(0 = no cap); more wait in a bounded queue up to load_timeout_s, then 503 no_capacity.",
    )
    max_loads_per_pool: int = Field(
        default=4,
        ge=0,
        description="Cold-load admission: adapter loads in flight at once in one pool, cluster-wide "
        "(0 = no cap).",
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        description="Liveness lease of a gateway process in the cluster state (renewed every third of it): "
        "what a process that dies holds (in-flight marks, loads in progress) is released within this.",
    )
    mark_linger_s: float = Field(
        default=0.25,
        ge=0,
        description="How long an adapter stays marked in use on a replica after this process's last request "
        "there ends (saves a Redis round trip per request for back-to-back traffic).",
    )
    cluster_sync_s: float = Field(
        default=0.2,
        gt=0,
        description="Period of the read of the cluster's shared replica state "
        "(the bounded staleness of placement's view).",
    )
    poll_interval_s: float = Field(default=1.0, description="Seconds between polls of one replica.")
    poll_timeout_s: float = Field(default=2.0, description="Timeout of one poll (health, models, metrics).")
    unhealthy_after: int = Field(
        default=2, ge=1, description="Failed polls before a replica leaves rotation."
    )
    placement_profile: str = Field(default="default", description="Placement profile name.")
    placement_params: dict[str, Any] = Field(default_factory=dict, description="Profile parameters.")
    request_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Non-streaming requests: the whole answer must arrive within this "
        "(504 upstream_timeout).",
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="Connect timeout towards a replica.")
    upstream_ttfb_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Streaming requests: the first event must arrive within this; a replica that misses it "
        "counts as failed and the request is retried once on another replica.",
    )
    upstream_idle_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Streaming requests: longest silence between two chunks; then the stream ends with an "
        "error event (a long stream that keeps sending is never cut).",
    )
    outlier_failures: int = Field(
        default=3,
        ge=1,
        description="Consecutive failures (refused or failed connections, 5xx, first-byte timeouts, "
        "failed loads) that take a replica out of rotation before its next health poll "
        "(passive outlier detection); as many failed loads in a row, of at least two adapters, "
        "stop new adapters being placed there for the cool-off.",
    )
    outlier_cooloff_s: float = Field(
        default=10.0,
        ge=0,
        description="How long an ejected replica stays out of rotation at least; it returns at the "
        "first good poll after that, its residency re-learned from /v1/models.",
    )
    max_connections_per_replica: int = Field(default=256, description="Pooled keep-alive connections.")
    max_cold_waiters_per_adapter: int = Field(
        default=256, description="Requests that may wait for one adapter's load; more get 503."
    )
    fairness: Literal["vtc", "fifo"] = Field(
        default="vtc",
        description="Order of the requests (and loads) waiting for a free GPU slot in a gateway "
        "process: vtc = the tenant that received the least service first (virtual token counters, "
        "router/fairness.py); fifo = arrival order.",
    )
    fairness_weights: dict[str, float] = Field(
        default_factory=dict,
        description='vtc: tenant → weight (JSON object, e.g. {"acme": 2}): a tenant of weight 2 gets '
        "twice the share of a tenant of weight 1 while they wait; default 1.",
    )
    retired_idle_unload_s: float = Field(
        default=60.0, description="Retired/non-serving versions are unloaded after this long idle."
    )
    reconcile_interval_s: float = Field(default=2.0, description="Period of the reconciler.")
    hot_prewarm_rps: float = Field(
        default=0.0, description="Request rate (per second) above which an adapter counts as hot (0 = off)."
    )
    hot_prewarm_replicas: int = Field(default=2, ge=1, description="Replicas a hot adapter is kept on.")
    rate_window_s: float = Field(default=10.0, description="Window of the measured per-adapter request rate.")
    plan_interval_s: float = Field(
        default=3.0,
        ge=0,
        description="Period of the placement controller (one process in the cluster): forecast each "
        "adapter's demand from every gateway's counts, plan which replicas hold it, load them ahead of "
        "demand (0 = off: requests place adapters as they come, hot adapters are prewarmed by the "
        "reconciler).",
    )
    plan_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Parameters of the placement plan (JSON object; router/placement/README.md, "
        '"The placement plan"), e.g. {"plan_share": 0.5, "min_rps": 0.02}.',
    )
    publish_interval_s: float = Field(default=1.0, description="How often replica state goes to Redis.")
    state_ttl_s: float = Field(default=30.0, description="TTL of replica records published to Redis.")

    @model_validator(mode="after")
    def _check_plan(self) -> RouterSettings:
        from router.placement.plan import PlanParams

        try:
            PlanParams(**self.plan_params)
        except TypeError as exc:
            raise ValueError(f"plan_params: {exc}") from None
        return self

    def resolved_staging_dir(self) -> Path:
        return (self.staging_dir or (self.data_dir / "staging")).resolve()
