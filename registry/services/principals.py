"""Principals (SPEC §14): create, list, describe, change role/owners, issue and revoke tokens.

Rules: ids are slugs and not one of the platform's own actor names (``bootstrap``, ``router``,
``evaluator``, ``canary-analyzer``, ``admin``); ``owners`` only for the scoped roles
(``maintainer``, ``approver``); a token is shown once and stored as its sha256. Principal
changes are audited (``principal.created``, ``principal.updated``, ``token.issued``,
``token.revoked``; ``subject_type`` ``principal``) but do not bump the routing revision: nothing
a gateway serves depends on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from kit.ids import new_id
from registry.auth import RESERVED_IDS, ROLES, SCOPED_ROLES, Principal
from registry.auth.tokens import generate_token, hash_token, token_prefix
from registry.models import PrincipalRow, PrincipalTokenRow, utcnow
from registry.repositories import audit as audit_repo
from registry.repositories import principals as repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services.adapters import require_slug


@dataclass(frozen=True, slots=True)
class TokenRecord:
    token_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: PrincipalTokenRow) -> TokenRecord:
        return cls(
            token_id=row.token_id, prefix=row.prefix, created_at=row.created_at, revoked_at=row.revoked_at
        )


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """The one answer that ever carries the token."""

    token_id: str
    token: str
    prefix: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class PrincipalRecord:
    id: str
    role: str
    owners: list[str]
    created_by: str | None
    created_at: datetime | None
    tokens: list[TokenRecord] | None = None  # only in describe

    @classmethod
    def of(cls, row: PrincipalRow, tokens: list[PrincipalTokenRow] | None = None) -> PrincipalRecord:
        return cls(
            id=row.id,
            role=row.role,
            owners=list(row.owners or []),
            created_by=row.created_by,
            created_at=row.created_at,
            tokens=[TokenRecord.of(t) for t in tokens] if tokens is not None else None,
        )

    @classmethod
    def of_principal(cls, p: Principal) -> PrincipalRecord:
        """The record of a principal that has no row (``bootstrap``)."""
        return cls(id=p.id, role=p.role, owners=list(p.owners), created_by=None, created_at=None)


def _check_role_owners(role: Any, owners: Any) -> list[str]:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", details={"field": "role"})
    if owners is None:
        owners = []
    if not isinstance(owners, list) or not all(isinstance(o, str) and o and len(o) <= 255 for o in owners):
        raise InvalidRequest("owners must be a list of non-empty strings", details={"field": "owners"})
    if owners and role not in SCOPED_ROLES:
        raise InvalidRequest(
            f"owners apply only to the scoped roles (maintainer, approver), not {role}",
            details={"field": "owners"},
        )
    return sorted(set(owners))


def _row(session: Session, principal_id: str, *, for_update: bool = False) -> PrincipalRow:
    row = repo.get(session, principal_id, for_update=for_update)
    if row is None:
        raise NotFound(f"principal {principal_id!r} not found", code="principal_not_found")
    return row


def create_principal(
    session: Session, *, principal_id: str, role: str, owners: list[str] | None, actor: str
) -> PrincipalRecord:
    require_slug(principal_id, "id")
    if principal_id in RESERVED_IDS:
        raise InvalidRequest(f"{principal_id!r} is reserved for the platform", details={"field": "id"})
    clean = _check_role_owners(role, owners)
    if repo.get(session, principal_id) is not None:
        raise Conflict(f"principal {principal_id!r} already exists", code="principal_exists")
    row = PrincipalRow(id=principal_id, role=role, owners=clean, created_by=actor, created_at=utcnow())
    repo.add(session, row)
    audit_repo.add(
        session,
        actor=actor,
        action="principal.created",
        subject_type="principal",
        subject_id=principal_id,
        details={"role": role, "owners": clean},
    )
    return PrincipalRecord.of(row)


def list_principals(
    session: Session, *, limit: int | None = None, cursor: str | None = None
) -> Page[PrincipalRecord]:
    n = clamp_limit(limit)
    rows = repo.list_rows(session, limit=n, after=decode_cursor(cursor, str))
    items, nxt = page_of(rows, n, lambda r: r.id)
    return Page([PrincipalRecord.of(r) for r in items], nxt)


def describe_principal(session: Session, principal_id: str) -> PrincipalRecord:
    row = _row(session, principal_id)
    return PrincipalRecord.of(row, repo.tokens_of(session, principal_id))


def update_principal(
    session: Session, principal_id: str, changes: dict[str, Any], *, actor: str
) -> PrincipalRecord:
    """``changes``: any of ``role``, ``owners``. Changing the role to an unscoped one clears
    owners when they are not given."""
    for name in changes:
        if name not in ("role", "owners"):
            raise InvalidRequest(f"unknown field {name!r} (known: role, owners)", details={"field": name})
    row = _row(session, principal_id, for_update=True)
    role = changes.get("role", row.role)
    owners = changes.get("owners", row.owners if role in SCOPED_ROLES else [])
    clean = _check_role_owners(role, owners)
    applied: dict[str, Any] = {}
    if role != row.role:
        row.role = role
        applied["role"] = role
    if clean != list(row.owners or []):
        row.owners = clean
        applied["owners"] = clean
    if applied:
        repo.flush(session)
        audit_repo.add(
            session,
            actor=actor,
            action="principal.updated",
            subject_type="principal",
            subject_id=principal_id,
            details=applied,
        )
    return PrincipalRecord.of(row, repo.tokens_of(session, principal_id))


def issue_token(session: Session, principal_id: str, *, actor: str) -> IssuedToken:
    _row(session, principal_id)
    token = generate_token()
    row = PrincipalTokenRow(
        token_id=new_id(),
        principal_id=principal_id,
        prefix=token_prefix(token),
        token_hash=hash_token(token),
        created_at=utcnow(),
    )
    repo.add(session, row)
    audit_repo.add(
        session,
        actor=actor,
        action="token.issued",
        subject_type="principal",
        subject_id=principal_id,
        details={"token_id": row.token_id, "prefix": row.prefix},
    )
    return IssuedToken(token_id=row.token_id, token=token, prefix=row.prefix, created_at=row.created_at)


def revoke_token(session: Session, principal_id: str, token_id: str, *, actor: str) -> TokenRecord:
    _row(session, principal_id)
    row = repo.get_token(session, token_id)
    if row is None or row.principal_id != principal_id:
        raise NotFound(f"token {token_id!r} of principal {principal_id!r} not found", code="token_not_found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        repo.flush(session)
        audit_repo.add(
            session,
            actor=actor,
            action="token.revoked",
            subject_type="principal",
            subject_id=principal_id,
            details={"token_id": token_id, "prefix": row.prefix},
        )
    return TokenRecord.of(row)
