"""Roles and permissions of SPEC §14: who may do what, as data.

``PERMISSIONS`` names every permission a route can declare (with whether it is *scoped*: checked
against the ``owner`` of the adapter it acts on). ``ROLE_PERMISSIONS`` says which role holds
which. ``maintainer`` and ``approver`` are scoped roles: their scoped permissions hold only for
adapters whose ``owner`` is in the principal's ``owners``; every other role holds its
permissions on every adapter. :func:`allowed` is the one check, shared by the admin API and the
console.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("viewer", "maintainer", "approver", "operator", "admin")
SCOPED_ROLES = frozenset({"maintainer", "approver"})


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated admin caller. ``owners`` matter only for scoped roles."""

    id: str
    role: str
    owners: tuple[str, ...] = field(default=())


BOOTSTRAP_ID = "bootstrap"
BOOTSTRAP = Principal(id=BOOTSTRAP_ID, role="admin", owners=())

# The platform's own actors (SPEC §14): what they record is not a person's judgement.
PLATFORM_ACTORS = frozenset({"router", "evaluator", "canary-analyzer"})
# Ids the platform's own actors write into the audit log: never a principal's id.
RESERVED_IDS = PLATFORM_ACTORS | {BOOTSTRAP_ID, "admin"}


@dataclass(frozen=True, slots=True)
class Permission:
    name: str
    scoped: bool
    description: str


_ALL = (
    Permission("read", False, "every GET of the admin API"),
    Permission("base_model.write", False, "register and change base models (approvals_required included)"),
    Permission("adapter.create", True, "create an adapter (scope: the new adapter's owner)"),
    Permission("adapter.update", True, "PATCH an adapter (a new owner must be in scope too)"),
    Permission("adapter.approvals", False, "change an adapter's approvals_required (PATCH field)"),
    Permission("version.upload", True, "upload or register a version"),
    Permission("version.quality_gate", True, "record a version's quality-gate result"),
    Permission("adapter.prewarm", True, "load the active version onto replicas now"),
    Permission("adapter.promote", True, "promote / canary, or request it when approvals are required"),
    Permission(
        "adapter.force_promote",
        False,
        "promote or request with `force: true`, past a pending or failed quality gate",
    ),
    Permission("evaluation.run", True, "run evaluations"),
    Permission("adapter.rollback", True, "roll back or end a canary (bulk included)"),
    Permission("adapter.disable", True, "kill switch on (bulk included)"),
    Permission("adapter.enable", True, "kill switch off (bulk included)"),
    Permission("version.disable", True, "block one version"),
    Permission("version.enable", True, "take a disabled version back to ready"),
    Permission("promotion.approve", True, "approve a promotion request (never one's own)"),
    Permission("promotion.reject", True, "reject a promotion request"),
    Permission("tenant.write", False, "tenants, API keys and grants"),
    Permission("owner.limits", False, "per-owner limits"),
    Permission("principal.write", False, "principals and their tokens"),
)
PERMISSIONS: dict[str, Permission] = {p.name: p for p in _ALL}

_EMERGENCY = frozenset(
    {"adapter.rollback", "adapter.disable", "adapter.enable", "version.disable", "version.enable"}
)
_MAINTAIN = frozenset(
    {
        "adapter.create",
        "adapter.update",
        "version.upload",
        "version.quality_gate",
        "adapter.prewarm",
        "adapter.promote",
        "evaluation.run",
    }
)

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "maintainer": frozenset({"read"}) | _MAINTAIN | _EMERGENCY,
    "approver": frozenset({"read", "promotion.approve", "promotion.reject"}),
    "operator": frozenset({"read"}) | _EMERGENCY,
    "admin": frozenset(PERMISSIONS),
}


def role_has(role: str, permission: str) -> bool:
    """Whether ``role`` holds ``permission`` for at least some adapters."""
    return permission in ROLE_PERMISSIONS.get(role, frozenset())


def is_scoped_for(role: str, permission: str) -> bool:
    """Whether ``role`` holds ``permission`` only for adapters of its owners."""
    perm = PERMISSIONS.get(permission)
    return role in SCOPED_ROLES and perm is not None and perm.scoped


def allowed(principal: Principal, permission: str, owner: str | None) -> bool:
    """May ``principal`` use ``permission`` on an adapter of ``owner``?

    For unscoped permissions (or unscoped roles) ``owner`` is ignored. For a scoped role, an
    adapter without an owner is out of every scope."""
    if not role_has(principal.role, permission):
        return False
    if is_scoped_for(principal.role, permission):
        return owner is not None and owner in principal.owners
    return True


def missing(principal: Principal, permission: str, owner: str | None) -> str:
    """The message of a 403: what the caller lacks, e.g. ``adapter.promote on owner 'x'``."""
    if role_has(principal.role, permission) and is_scoped_for(principal.role, permission):
        where = f"owner {owner!r}" if owner is not None else "adapters without an owner"
        return f"principal {principal.id!r} ({principal.role}) needs {permission} on {where}"
    return f"principal {principal.id!r} ({principal.role}) needs {permission}"
