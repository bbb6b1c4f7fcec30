"""Names shared by every package: slugs (SPEC §2), version names, process-unique ids."""

from __future__ import annotations

import itertools
import os
import re

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
VERSION_RE = re.compile(r"^v([1-9][0-9]{0,8})$")

_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count(1)


def is_slug(value: str) -> bool:
    """True when ``value`` is a valid base-model, adapter or tenant id."""
    return bool(SLUG_RE.match(value)) and ".." not in value


def version_name(number: int) -> str:
    return f"v{number}"


def version_number(name: str) -> int | None:
    """``"v3"`` → 3; anything else → None."""
    m = VERSION_RE.match(name)
    return int(m.group(1)) if m else None


def lora_name(adapter_id: str, version: str, weights_sha256: str) -> str:
    """The name a version is loaded under in vLLM: unique per version content (SPEC §2)."""
    return f"{adapter_id}@{version}-{weights_sha256[:8]}"


def new_id() -> str:
    """A process-unique id, globally unique in practice (random per-process prefix + counter)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"
