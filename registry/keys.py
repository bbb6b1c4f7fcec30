"""API keys: format, prefix and hash. Keys are 256-bit random, so a plain sha256 is a safe hash.

Key format: ``lp-`` + 43 url-safe characters. ``prefix`` = the first 12 characters (used for
lookup, stored and shown); the key itself is shown once and stored only as its sha256.
Lookups compare hashes with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "lp-"
PREFIX_LEN = 12


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_prefix(key: str) -> str:
    return key[:PREFIX_LEN]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_matches(key: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_key(key), key_hash)
