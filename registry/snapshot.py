"""The routing snapshot: everything a gateway process needs to admit and route requests.

CONTRACT shared by registry (producer), router and gateway (consumers). Plain frozen
dataclasses — no ORM rows leave the registry. ``load_snapshot(session)`` (in
``registry.services.snapshot``) builds one in a single read transaction; the change feed
(``registry.feed``) tells gateways when ``revision`` moved on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.ids import lora_name as _lora_name

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True, slots=True)
class FileInfo:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class VersionInfo:
    adapter_id: str
    version: str  # "v3"
    number: int  # 3
    status: str  # ready | active | canary | retired | disabled
    rank: int
    lora_alpha: float
    target_modules: tuple[str, ...]
    files: tuple[FileInfo, ...]
    storage_uri: str  # "s3://bucket/prefix/…/" or "file:///abs/dir/"
    base_model: str
    rollback_to: str | None = None  # the version that was active when this one was promoted
    # The version's registry row id: a stable integer per version, never reused for other bytes
    # (rows are never deleted; a version's bytes never change). Engines that cache adapters by an
    # integer id (TensorRT-LLM's lora_int_id) get this one. 0 = unknown.
    int_id: int = 0
    # Name under which this version is loaded into vLLM; never shown to clients. Made once
    # (the request path asks for it several times per request).
    lora_name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_name", _lora_name(self.adapter_id, self.version, self.weights_sha256))

    @property
    def weights_sha256(self) -> str:
        for f in self.files:
            if f.name == WEIGHTS_FILE:
                return f.sha256
        return ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True, slots=True)
class Limits:
    """rpm / tpm / max_concurrency of one level (tenant, adapter, owner); None = unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    id: str
    base_model: str
    status: str  # active | disabled
    active_version: str | None
    canary_version: str | None
    canary_weight: int | None
    versions: dict[str, VersionInfo] = field(default_factory=dict)  # "v1" → VersionInfo
    hot: bool = False  # marked hot: the router keeps the active version prewarmed (SPEC §8)
    owner: str | None = None
    limits: Limits = Limits()  # shared by every tenant (SPEC §15)
    on_load_failure: str = "error"  # error | previous_version | base_model (SPEC §15)


@dataclass(frozen=True, slots=True)
class BaseModelInfo:
    name: str
    hf_id: str
    max_lora_rank: int
    target_modules: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GrantInfo:
    adapter_id: str
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True, slots=True)
class TenantInfo:
    id: str
    name: str
    limits: Limits
    base_model_access: bool
    grants: dict[str, GrantInfo] = field(default_factory=dict)  # adapter_id → grant
    # requests of the tenant that may wait for a cold load at once, per gateway process (SPEC §15)
    max_cold_waiters: int | None = None


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: str
    tenant_id: str
    prefix: str
    key_hash: str  # hex sha256 of the whole key (see registry.keys)


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    revision: int
    base_models: dict[str, BaseModelInfo] = field(default_factory=dict)
    adapters: dict[str, AdapterInfo] = field(default_factory=dict)
    tenants: dict[str, TenantInfo] = field(default_factory=dict)
    keys_by_prefix: dict[str, tuple[KeyInfo, ...]] = field(default_factory=dict)  # only non-revoked keys
    owners: dict[str, Limits] = field(default_factory=dict)  # owner → limits over all its adapters
