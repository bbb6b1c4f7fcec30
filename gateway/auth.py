"""API key → tenant, against the routing snapshot.

The key's prefix (``registry.keys.key_prefix``) selects candidate keys; each candidate's stored
sha256 is compared in constant time (``registry.keys.key_matches``). Results (hits and misses)
are cached per key for the life of one snapshot revision, bounded in size. The admin token is
never a tenant key: it is refused explicitly (and could not match a stored key anyway).
"""

from __future__ import annotations

import hmac

from gateway.errors import GatewayError
from registry.keys import key_matches, key_prefix
from registry.snapshot import RoutingSnapshot, TenantInfo


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, "invalid_api_key", message)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or a 401."""
    if not authorization:
        raise _unauthorized("Missing API key: send `Authorization: Bearer <key>`.")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("Malformed Authorization header: expected `Bearer <key>`.")
    return token


class Authenticator:
    """Finds the tenant of an API key in a snapshot; caches per revision."""

    def __init__(self, *, admin_token: str | None = None, cache_size: int = 10000) -> None:
        self._admin = admin_token.encode() if admin_token else None
        self._cache_size = cache_size
        self._cache: dict[str, str | None] = {}
        self._revision: int | None = None

    def lookup(self, snapshot: RoutingSnapshot, key: str) -> TenantInfo | None:
        """The tenant owning ``key`` in ``snapshot``, or None."""
        if self._revision != snapshot.revision:
            self._cache.clear()
            self._revision = snapshot.revision
        if key in self._cache:
            tid = self._cache[key]
        else:
            tid = self._find(snapshot, key)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[key] = tid
        return snapshot.tenants.get(tid) if tid is not None else None

    def _find(self, snapshot: RoutingSnapshot, key: str) -> str | None:
        if self._admin is not None and hmac.compare_digest(key.encode(), self._admin):
            return None
        found: str | None = None
        for info in snapshot.keys_by_prefix.get(key_prefix(key), ()):
            if key_matches(key, info.key_hash):  # constant time; check every candidate
                found = info.tenant_id
        return found

    def authenticate(self, snapshot: RoutingSnapshot, authorization: str | None) -> TenantInfo:
        """The tenant of the bearer key in ``authorization``, else a 401 ``invalid_api_key``."""
        key = bearer_token(authorization)
        tenant = self.lookup(snapshot, key)
        if tenant is None:
            raise _unauthorized("Incorrect API key provided.")
        return tenant
