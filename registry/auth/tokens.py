"""Admin tokens: ``lpa-`` + 43 url-safe characters (256 random bits), so a plain sha256 is a safe
hash. ``prefix`` = the first 12 characters, stored and shown, used for the lookup; the token is
shown once and compared by hash with ``hmac.compare_digest``."""

from __future__ import annotations

import hashlib
import hmac
import secrets

TOKEN_PREFIX = "lpa-"
PREFIX_LEN = 12


def generate_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_prefix(token: str) -> str:
    return token[:PREFIX_LEN]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)
