"""Request and response bodies of the governance routes (SPEC §14): principals, tokens,
promotion requests, bulk operations."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel as Schema
from pydantic import ConfigDict, Field, StrictBool

from kit.inputs import SafeStr, SafeText

Role = Literal["viewer", "maintainer", "approver", "operator", "admin"]


class _In(Schema):
    model_config = ConfigDict(extra="forbid")


class _Out(Schema):
    model_config = ConfigDict(from_attributes=True)


class PrincipalCreate(_In):
    id: SafeStr
    role: Role
    owners: list[SafeStr] = Field(
        default_factory=list, description="Adapter owners a maintainer or approver may act on."
    )


class PrincipalPatch(_In):
    role: Role | None = None
    owners: list[SafeStr] | None = None


class TokenOut(_Out):
    token_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class IssuedTokenOut(_Out):
    token_id: str
    token: str = Field(description="Shown in this answer only; only its sha256 is stored.")
    prefix: str
    created_at: datetime


class PrincipalOut(_Out):
    id: str
    role: str
    owners: list[str]
    created_by: str | None
    created_at: datetime | None


class PrincipalDetailOut(PrincipalOut):
    tokens: list[TokenOut] | None = None


class PrincipalPage(Schema):
    data: list[PrincipalOut]
    next_cursor: str | None


class DecisionBody(_In):
    comment: SafeText | None = Field(default=None, max_length=4000)


class ApprovalOut(_Out):
    principal: str
    at: datetime


class SeenOut(_Out):
    active_version: str | None
    canary_version: str | None
    version_status: str
    quality_gate: str | None = Field(
        description="The version's quality gate when requested (null for requests made before it was "
        "recorded)."
    )


class PromotionOut(_Out):
    id: str
    adapter_id: str
    version: str
    canary_weight: int | None
    force: bool = Field(
        description="Requested with force: the promotion runs even if the version's quality gate is "
        "pending or failed (needs adapter.force_promote)."
    )
    requested_by: str
    status: str
    approvals: list[ApprovalOut]
    approvals_required: int
    seen: SeenOut = Field(
        description="What the request was made against: the adapter's active and canary versions, the "
        "version's status and quality gate. A change of any of them makes the request stale."
    )
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    comment: str | None


class PromotionPage(Schema):
    data: list[PromotionOut]
    next_cursor: str | None


class BulkBody(_In):
    selector: dict[str, Any] = Field(
        description='Exactly one of {"adapters": [ids]}, {"owner": "…"}, {"base_model": "…"}, '
        '{"promoted_since": "ISO 8601"}.'
    )
    dry_run: StrictBool = False
    reason: SafeText | None = Field(default=None, max_length=1000)


class BulkErrorOut(_Out):
    code: str
    message: str


class BulkItemOut(_Out):
    adapter_id: str
    ok: bool
    from_version: str | None
    to_version: str | None
    error: BulkErrorOut | None


class BulkOut(_Out):
    bulk_id: str
    dry_run: bool
    results: list[BulkItemOut]
    applied: int
    failed: int
