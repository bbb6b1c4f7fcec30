"""The admin API's permission check, declared at each route (SPEC §14):

    who: Annotated[Principal, Depends(requires("adapter.promote", scope=OWNER_OF_ADAPTER))]

:func:`requires` authenticates the bearer token (401 ``unauthorized`` when it is missing,
unknown or revoked; tenant keys are unknown here), checks that the principal's role holds the
permission (403 ``forbidden`` naming it), and for scoped roles asks the route's :class:`Scope`
which adapter owners the call touches and checks each. A scope that cannot tell (the adapter
does not exist, the body is not valid) defers: the route then answers 404 / 422 itself.

:func:`route_rules` lists every route with its :class:`Requirement`; the README's permission
table is generated from it (``python -m registry.api.permissions_doc``). A route that declares
nothing is admin-only (:func:`guard`, installed on every admin router).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from kit.db import session_scope
from kit.errors import Forbidden, Unauthorized
from registry.auth.authn import authenticate
from registry.auth.roles import BOOTSTRAP, PERMISSIONS, Principal, allowed, is_scoped_for, missing, role_has
from registry.auth.tokens import TOKEN_PREFIX

DEFER = None  # a Scope's answer when it cannot tell: the route answers 404 / 422 itself


class Scope(Protocol):
    """How a route finds the adapter owners a call acts on."""

    @property
    def name(self) -> str: ...

    @property
    def needs_body(self) -> bool: ...

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        """The owners in question, or ``None`` (:data:`DEFER`) when it cannot tell."""
        ...


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """What authentication needs from the app: the database and the bootstrap token."""

    factory: sessionmaker[Session]
    bootstrap_token: str | None


def auth_config(request: Request) -> AuthConfig:
    cfg: AuthConfig = request.app.state.auth
    return cfg


_bearer = HTTPBearer(
    auto_error=False,
    description="An admin token: a principal's `lpa-…` token or the bootstrap LORAPLANE_ADMIN_TOKEN.",
)


async def _json_body(request: Request) -> Any:
    try:
        raw = await request.body()
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not JSON, or nested past json's recursion: the route says
        return None


@dataclass(frozen=True, eq=False)
class Requirement:
    """A route's declared permission (None: any authenticated principal) and scope, and
    ``fields``: body fields that need a further permission when present (e.g. changing an
    adapter's ``approvals_required`` needs more than editing its description); ``flags``: body
    flags that need a further permission when ``true`` (e.g. ``force`` on a promote)."""

    permission: str | None
    scope: Scope | None = None
    fields: tuple[tuple[str, str], ...] = ()
    flags: tuple[tuple[str, str], ...] = ()

    async def __call__(
        self, request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
    ) -> Principal:
        token = credentials.credentials if credentials is not None else ""
        if not token:
            raise Unauthorized("missing bearer token")
        cfg = auth_config(request)
        scope = self.scope if self.permission is not None else None
        needs_body = bool(self.fields or self.flags) or (scope is not None and scope.needs_body)
        body = await _json_body(request) if needs_body else None
        path = dict(request.path_params)
        if cfg.bootstrap_token and hmac.compare_digest(token.encode(), cfg.bootstrap_token.encode()):
            principal = self.check(None, BOOTSTRAP, path, body)
        elif not token.startswith(TOKEN_PREFIX):
            raise Unauthorized("invalid admin token")
        else:
            principal = await anyio.to_thread.run_sync(self._check_in_db, cfg, token, path, body)
        request.state.actor = principal.id  # the audit actor, for handlers that read it from the request
        return principal

    def _check_in_db(self, cfg: AuthConfig, token: str, path: dict[str, str], body: Any) -> Principal:
        with session_scope(cfg.factory, read_only=True) as session:
            principal = authenticate(session, token)
            if principal is None:
                raise Unauthorized("invalid admin token")
            return self.check(session, principal, path, body)

    def check(
        self, session: Session | None, principal: Principal, path: dict[str, str], body: Any
    ) -> Principal:
        perm = self.permission
        if perm is None:
            return principal
        if not role_has(principal.role, perm):
            raise Forbidden(missing(principal, perm, None), details={"permission": perm})
        for field_name, field_perm in self.fields:
            if isinstance(body, dict) and field_name in body and not role_has(principal.role, field_perm):
                raise Forbidden(
                    f"{missing(principal, field_perm, None)} to change {field_name}",
                    details={"permission": field_perm, "field": field_name},
                )
        for flag, flag_perm in self.flags:
            if isinstance(body, dict) and body.get(flag) is True and not role_has(principal.role, flag_perm):
                raise Forbidden(
                    f"{missing(principal, flag_perm, None)} to set {flag}",
                    details={"permission": flag_perm, "field": flag},
                )
        if self.scope is None or not is_scoped_for(principal.role, perm) or session is None:
            return principal
        owners = self.scope.owners(session, path, body)
        for owner in owners or ():
            if not allowed(principal, perm, owner):
                raise Forbidden(missing(principal, perm, owner), details={"permission": perm, "owner": owner})
        return principal


def requires(
    permission: str | None,
    *,
    scope: Scope | None = None,
    fields: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> Requirement:
    """The dependency a route declares. ``permission`` (and each of ``fields``' and ``flags``'
    values) must be one of ``PERMISSIONS`` (None: any authenticated principal, e.g. ``/whoami``)."""
    for p in (permission, *(fields or {}).values(), *(flags or {}).values()):
        if p is not None and p not in PERMISSIONS:
            raise ValueError(f"unknown permission {p!r}")
    return Requirement(
        permission, scope, tuple(sorted((fields or {}).items())), tuple(sorted((flags or {}).items()))
    )


ADMIN_ONLY = Requirement("principal.write")  # what an undeclared route requires: only admin holds all


def requirement_of(route: APIRoute) -> Requirement | None:
    """The requirement a route declares (searched through its dependencies)."""

    def walk(dep: Dependant) -> Requirement | None:
        if isinstance(dep.call, Requirement):
            return dep.call
        for sub in dep.dependencies:
            found = walk(sub)
            if found is not None:
                return found
        return None

    for sub in route.dependant.dependencies:
        found = walk(sub)
        if found is not None and found is not ADMIN_ONLY:
            return found
    return None


async def guard(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    """Installed on every admin router: a route that declares no requirement is admin-only."""
    route = request.scope.get("route")
    if isinstance(route, APIRoute) and requirement_of(route) is not None:
        return
    principal = await ADMIN_ONLY(request, credentials)
    if principal.role != "admin":
        raise Forbidden(
            f"principal {principal.id!r} ({principal.role}) needs admin", details={"permission": "admin"}
        )


@dataclass(frozen=True, slots=True)
class RouteRule:
    method: str
    path: str
    requirement: Requirement | None  # None: undeclared (admin only)


def route_rules(routers: Sequence[APIRouter], prefix: str) -> list[RouteRule]:
    """Every route of ``routers`` (as mounted under ``prefix``) with its declared requirement."""
    out: list[RouteRule] = []
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            req = requirement_of(route)
            for method in sorted(route.methods or ()):
                out.append(RouteRule(method, prefix + route.path, req))
    return out
