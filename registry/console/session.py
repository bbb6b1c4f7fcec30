"""Console sign-in sessions: a signed, expiring cookie value and its CSRF token.

The cookie (``lp_console``: HttpOnly, SameSite=Strict, Path=/admin/ui) holds
``base64url(json) "." base64url(hmac_sha256(secret, json))`` with the principal id, its role
and owners, the sign-in token's public prefix, an expiry and a random per-session CSRF token —
never the token itself. Every request re-reads the principal (``web.signed_in``): a revoked
token or a deleted principal signs the session out at once, and a role change applies at once. Every
form carries the CSRF token in a hidden ``csrf`` field and every POST compares it (constant
time) with the session's. The sign-in form itself is protected by a double-submit cookie
(``lp_console_pre``).

The signing key is derived from ``LORAPLANE_CONSOLE_SECRET`` (share it between admin API
processes) *and* the admin token, from whichever of the two is set, or random per process when
there is neither. The admin token is in the key whenever there is one, so processes that share
it (and the console secret) accept each other's sessions, and rotating it signs everyone out,
console secret or not: an old cookie's signature no longer verifies, on every request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

COOKIE = "lp_console"
PRE_COOKIE = "lp_console_pre"
DEFAULT_TTL_S = 8 * 3600


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    principal: str
    role: str
    owners: tuple[str, ...]
    csrf: str
    expires: int
    token: str = ""  # prefix of the principal token signed in with ("" for the bootstrap token)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def console_secret(explicit: str | None, admin_token: str | None) -> bytes:
    """The session signing key (module doc): bound to the admin token whenever there is one."""
    if explicit and admin_token:
        bound = b"loraplane-console-session-v2|" + hashlib.sha256(admin_token.encode()).digest()
        return hmac.new(explicit.encode(), bound, hashlib.sha256).digest()
    if explicit:
        return explicit.encode()
    if admin_token:
        return hmac.new(admin_token.encode(), b"loraplane-console-session-v1", hashlib.sha256).digest()
    return secrets.token_bytes(32)


class SessionCodec:
    def __init__(self, secret: bytes, *, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._secret = secret
        self.ttl_s = ttl_s

    def _sign(self, payload: bytes) -> str:
        return _b64(hmac.new(self._secret, payload, hashlib.sha256).digest())

    def issue(
        self, principal: str, role: str, owners: tuple[str, ...], *, token: str = ""
    ) -> tuple[str, ConsoleSession]:
        sess = ConsoleSession(
            principal=principal,
            role=role,
            owners=owners,
            csrf=secrets.token_urlsafe(24),
            expires=int(time.time()) + self.ttl_s,
            token=token,
        )
        body = {"p": principal, "r": role, "o": list(owners), "c": sess.csrf, "e": sess.expires, "t": token}
        payload = json.dumps(body, separators=(",", ":")).encode()
        return f"{_b64(payload)}.{self._sign(payload)}", sess

    def load(self, value: str | None) -> ConsoleSession | None:
        """The session in a cookie value, or None if missing, tampered with or expired."""
        if not value or value.count(".") != 1:
            return None
        data, sig = value.split(".")
        try:
            payload = _unb64(data)
        except ValueError:
            return None
        if not hmac.compare_digest(sig, self._sign(payload)):
            return None
        try:
            body = json.loads(payload)
            sess = ConsoleSession(
                principal=str(body["p"]),
                role=str(body["r"]),
                owners=tuple(str(o) for o in body["o"]),
                csrf=str(body["c"]),
                expires=int(body["e"]),
                token=str(body.get("t", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if sess.expires < time.time():
            return None
        return sess


def same_token(sent: str | None, expected: str | None) -> bool:
    """Constant-time comparison of a submitted CSRF token with the expected one."""
    if not sent or not expected:
        return False
    return hmac.compare_digest(sent.encode(), expected.encode())
