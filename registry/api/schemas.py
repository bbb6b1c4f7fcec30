"""Request and response bodies of the admin API (pydantic); shapes of SPEC §5 and §13."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel as Schema
from pydantic import ConfigDict, Field, StrictBool

from kit.inputs import INT32_MAX, Int32, SafeStr, SafeText

QualityGate = Literal["pending", "passed", "failed", "skipped"]
UploadQualityGate = Literal["pending", "skipped"]

UPLOAD_GATE_DOC = (
    "Quality gate the new version starts with: `skipped` (default; promote as usual) or `pending` "
    "(promotion is refused with 409 `quality_gate_pending` until a `passed` result is recorded "
    "with POST /adapters/{id}/versions/{v}/quality-gate, or the promote is forced)."
)


class _In(Schema):
    model_config = ConfigDict(extra="forbid")


class _Out(Schema):
    model_config = ConfigDict(from_attributes=True)


# --------------------------------------------------------------------------- requests


class BaseModelCreate(_In):
    name: SafeStr
    hf_id: SafeStr = Field(min_length=1, max_length=255)
    max_lora_rank: Int32 = Field(ge=1, le=INT32_MAX)
    target_modules: list[SafeStr] = Field(min_length=1)
    module_shapes: dict[SafeStr, list[Int32]] | None = None
    revision: SafeStr | None = Field(default=None, max_length=255)
    approvals_required: Int32 = Field(
        default=0, ge=0, le=100, description="Approvals a promotion of its adapters needs (SPEC §14)."
    )


class BaseModelPatch(_In):
    approvals_required: Int32 = Field(
        ge=0, le=100, description="Approvals a promotion of its adapters needs (SPEC §14)."
    )


OnLoadFailure = Literal["error", "previous_version", "base_model"]
ON_LOAD_FAILURE_DOC = (
    "When the selected version cannot be served after the router's retry (load failed, hash "
    "mismatch, load timeout, no capacity): error (503 adapter_load_failed), previous_version (the "
    "rollback_to chain's first serveable version) or base_model (the bare base model). Pinned "
    "@vN requests never fall back."
)


class AdapterCreate(_In):
    id: SafeStr
    base_model: SafeStr
    owner: SafeStr | None = Field(default=None, max_length=255)
    description: SafeText | None = None
    hot: StrictBool = Field(
        default=False, description="Marked hot: the router keeps the active version prewarmed."
    )
    on_load_failure: OnLoadFailure = Field(default="error", description=ON_LOAD_FAILURE_DOC)


CANARY_POLICY_DOC = (
    "Canary analysis (SPEC §16): `min_requests`, `max_error_rate_delta`, `max_ttft_p99_ratio`, "
    "`max_check_failure_rate_delta`, `window_s`, `auto_promote_after_s`; stored whole, keys left "
    "out take their defaults; null: canaries run unwatched."
)


class AdapterPatch(_In):
    """Any of these; fields left out stay as they are. ``owner``/``description`` may be null."""

    description: SafeText | None = None
    owner: SafeStr | None = Field(default=None, max_length=255)
    hot: StrictBool | None = Field(
        default=None, description="Marked hot: the router keeps the active version prewarmed."
    )
    approvals_required: Int32 | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Approvals a promotion needs, overriding the base model's (null: the base model's).",
    )
    on_load_failure: OnLoadFailure | None = Field(default=None, description=ON_LOAD_FAILURE_DOC)
    limits: LimitsIn | None = Field(
        default=None,
        description="Limits shared by every tenant of the adapter, merged key by key (null clears all "
        "three); checked by the gateway with the tenant, grant and owner limits in one admission.",
    )
    canary_policy: dict[str, Any] | None = Field(default=None, description=CANARY_POLICY_DOC)


class PromoteBody(_In):
    canary_weight: Int32 | None = Field(
        default=None, ge=1, le=99, description="Make the version the canary with this share (1-99 %)."
    )
    force: StrictBool = Field(
        default=False,
        description=(
            "Promote even if the version's quality gate is `pending` or `failed` (else 409 "
            "`quality_gate_pending` / `quality_gate_failed`); the audit event records "
            "`forced_quality_gate`."
        ),
    )


class QualityGateBody(_In):
    """A quality-gate result, e.g. posted by CI after an eval run."""

    status: QualityGate = Field(
        description="`passed` and `skipped` allow promotion; `pending` and `failed` block it (unless forced)."
    )
    details: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Optional JSON object recorded with the result (e.g. eval scores, a CI run URL), at most "
            "64 KiB; replaces the previous details (left out = null)."
        ),
    )


LIMIT_MAX = INT32_MAX  # the INTEGER column


class LimitsIn(_In):
    """Any of these; null = unlimited."""

    rpm: Int32 | None = Field(default=None, ge=0, le=LIMIT_MAX, description="Requests per minute.")
    tpm: Int32 | None = Field(
        default=None, ge=0, le=LIMIT_MAX, description="Tokens (prompt + completion) per minute."
    )
    max_concurrency: Int32 | None = Field(
        default=None, ge=0, le=LIMIT_MAX, description="Requests in flight at once."
    )


MAX_COLD_WAITERS_DOC = (
    "Requests of the tenant waiting for a cold load (a version no healthy replica holds) at once, "
    "counted by each gateway process; beyond it 503 `no_capacity` with Retry-After (SPEC §15)."
)


class TenantLimitsIn(LimitsIn):
    """A tenant's limits: any of these; null = unlimited. ``max_cold_waiters`` is the tenant's only."""

    max_cold_waiters: Int32 | None = Field(default=None, ge=0, le=LIMIT_MAX, description=MAX_COLD_WAITERS_DOC)


class TenantCreate(_In):
    id: SafeStr
    name: SafeStr | None = Field(default=None, max_length=255)
    limits: TenantLimitsIn | None = None
    base_model_access: StrictBool = False


class TenantPatch(_In):
    name: SafeStr | None = Field(default=None, min_length=1, max_length=255)
    limits: TenantLimitsIn | None = Field(default=None, description="Merged key by key.")
    base_model_access: StrictBool | None = None


class GrantPut(_In):
    rpm: Int32 | None = Field(default=None, ge=0, le=LIMIT_MAX, description="Requests per minute.")
    tpm: Int32 | None = Field(default=None, ge=0, le=LIMIT_MAX, description="Tokens per minute.")


class PrewarmBody(_In):
    replicas: Int32 = Field(default=1, ge=1, le=1024)


class SourceUpload(_In):
    source_uri: SafeStr = Field(
        min_length=1,
        max_length=1024,
        description="An allowed s3://bucket/prefix/ (or file:// directory), or a Hugging Face model "
        "repository hf://ORG/REPO@REVISION[/SUBDIR] (revision: branch, tag or commit sha; default main), "
        "inside LORAPLANE_ALLOWED_SOURCES.",
    )
    quality_gate: UploadQualityGate | None = Field(default=None, description=UPLOAD_GATE_DOC)


# --------------------------------------------------------------------------- responses


class BaseModelOut(_Out):
    name: str
    hf_id: str
    max_lora_rank: int
    target_modules: list[str]
    module_shapes: dict[str, list[int]] | None
    revision: str | None
    approvals_required: int
    created_at: datetime


class FileOut(_Out):
    name: str
    size: int
    sha256: str


class VersionOut(_Out):
    adapter_id: str
    version: str
    status: str
    rank: int
    lora_alpha: float
    target_modules: list[str]
    files: list[FileOut]
    storage_uri: str
    rollback_to: str | None
    quality_gate: QualityGate
    quality_gate_details: dict[str, Any] | None = Field(
        description="The JSON object recorded with the gate result (e.g. eval scores), or null."
    )
    created_by: str
    created_at: datetime
    source_uri: str | None = Field(
        default=None,
        description="Registered by reference: the source it was copied from (s3://, file:// or "
        "hf://ORG/REPO@REVISION[/SUBDIR]); null for uploads.",
    )
    source_revision: str | None = Field(
        default=None, description="hf:// imports: the commit sha the revision resolved to; else null."
    )
    quality_gate_by: str | None = Field(
        default=None,
        description="Who recorded the quality gate last (a principal, or `evaluator`); null when it "
        "is still the one set at upload. A principal who set it by hand cannot approve this "
        "version's promotion.",
    )


class LimitsOut(_Out):
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None


class AdapterOut(_Out):
    id: str
    base_model: str
    owner: str | None
    description: str | None
    status: str
    active_version: str | None
    canary_version: str | None
    canary_weight: int | None
    hot: bool
    on_load_failure: str = Field(description=ON_LOAD_FAILURE_DOC)
    approvals_required: int | None = Field(description="Overrides the base model's; null: the base model's.")
    limits: LimitsOut = Field(description="Shared by every tenant of the adapter (null = unlimited).")
    created_at: datetime
    canary_policy: dict[str, Any] | None = Field(default=None, description=CANARY_POLICY_DOC)


class AdapterDetailOut(AdapterOut):
    versions: list[VersionOut]


class GrantOut(_Out):
    tenant_id: str
    adapter_id: str
    rpm: int | None
    tpm: int | None


class KeyOut(_Out):
    key_id: str
    tenant_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class IssuedKeyOut(_Out):
    key_id: str
    key: str
    prefix: str
    created_at: datetime


class OwnerOut(_Out):
    owner: str
    limits: LimitsOut = Field(description="Shared by all the owner's adapters and all tenants.")
    adapters: list[str] = Field(description="Ids of the adapters whose `owner` is this owner.")
    updated_at: datetime | None = Field(description="When the limits were last set; null if never.")


class TenantLimitsOut(LimitsOut):
    max_cold_waiters: int | None = Field(description=MAX_COLD_WAITERS_DOC)


class TenantOut(_Out):
    id: str
    name: str
    limits: TenantLimitsOut
    base_model_access: bool
    created_at: datetime


class TenantDetailOut(TenantOut):
    grants: list[GrantOut]
    keys: list[KeyOut]


class AuditOut(_Out):
    id: int
    ts: datetime
    actor: str
    action: str
    subject_type: str
    subject_id: str
    details: dict[str, Any]


class BaseModelPage(Schema):
    data: list[BaseModelOut]
    next_cursor: str | None


class AdapterPage(Schema):
    data: list[AdapterOut]
    next_cursor: str | None


class VersionPage(Schema):
    data: list[VersionOut]
    next_cursor: str | None


class TenantPage(Schema):
    data: list[TenantOut]
    next_cursor: str | None


class AuditPage(Schema):
    data: list[AuditOut]
    next_cursor: str | None


class ReplicaAdapterOut(Schema):
    model_config = ConfigDict(extra="allow")
    adapter: str
    version: str
    lora_name: str
    state: str


class ReplicaOut(Schema):
    model_config = ConfigDict(extra="allow")
    url: str
    pool: str | None = None
    base_model: str | None = None
    healthy: bool
    adapters: list[ReplicaAdapterOut] = []
    running: int | None = None
    waiting: int | None = None
    last_seen: Any = None


class ReplicaList(Schema):
    data: list[ReplicaOut]
    next_cursor: str | None = None


class ErrorBody(Schema):
    code: str
    message: str
    details: Any = None


class ErrorOut(Schema):
    error: ErrorBody
