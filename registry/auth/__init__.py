"""Who may call the admin API (SPEC §14): principals, roles, tokens.

- :class:`Principal` (``id``, ``role``, ``owners``) — an authenticated caller.
- :func:`allowed` ``(principal, permission, owner) -> bool`` — the one permission check; the
  admin API declares it per route (:func:`registry.auth.dependencies.requires`), the console
  asks it to enable or disable its buttons. :func:`missing` words a refusal.
- :func:`authenticate` ``(session, token, *, bootstrap_token=None) -> Principal | None``.
- ``PERMISSIONS`` / ``ROLE_PERMISSIONS`` / ``ROLES``: the table itself.
"""

from registry.auth.authn import authenticate
from registry.auth.roles import (
    BOOTSTRAP,
    BOOTSTRAP_ID,
    PERMISSIONS,
    PLATFORM_ACTORS,
    RESERVED_IDS,
    ROLE_PERMISSIONS,
    ROLES,
    SCOPED_ROLES,
    Permission,
    Principal,
    allowed,
    is_scoped_for,
    missing,
    role_has,
)
from registry.auth.tokens import TOKEN_PREFIX, generate_token, hash_token, token_prefix

__all__ = [
    "BOOTSTRAP",
    "BOOTSTRAP_ID",
    "PERMISSIONS",
    "PLATFORM_ACTORS",
    "RESERVED_IDS",
    "ROLES",
    "ROLE_PERMISSIONS",
    "SCOPED_ROLES",
    "TOKEN_PREFIX",
    "Permission",
    "Principal",
    "allowed",
    "authenticate",
    "generate_token",
    "hash_token",
    "is_scoped_for",
    "missing",
    "role_has",
    "token_prefix",
]
