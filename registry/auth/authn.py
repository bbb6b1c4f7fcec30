"""``authenticate(session, token)``: a bearer token → its :class:`Principal`, or None.

The bootstrap token (``LORAPLANE_ADMIN_TOKEN``, passed as ``bootstrap_token``) is principal
``bootstrap`` with role ``admin``. Other admin tokens start ``lpa-``: looked up by their prefix,
compared by sha256 with ``hmac.compare_digest``; revoked tokens never match. Anything else (a
tenant key ``lp-…`` included) is None.
"""

from __future__ import annotations

import hmac

from sqlalchemy.orm import Session

from registry.auth.roles import BOOTSTRAP, Principal
from registry.auth.tokens import TOKEN_PREFIX, token_matches, token_prefix
from registry.repositories import principals as repo


def authenticate(session: Session, token: str, *, bootstrap_token: str | None = None) -> Principal | None:
    if not token:
        return None
    if bootstrap_token and hmac.compare_digest(token.encode(), bootstrap_token.encode()):
        return BOOTSTRAP
    if not token.startswith(TOKEN_PREFIX):
        return None
    found: Principal | None = None
    for row, principal in repo.live_tokens_by_prefix(session, token_prefix(token)):
        if token_matches(token, row.token_hash):
            found = Principal(id=principal.id, role=principal.role, owners=tuple(principal.owners or ()))
    return found
