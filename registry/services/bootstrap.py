"""Idempotent set-up used by ``loraplane up``: make sure a base model exists."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from registry.repositories import base_models as repo
from registry.services.base_models import create_base_model


def ensure_base_model(session: Session, spec: dict[str, Any], *, actor: str = "system") -> None:
    """Create the base model described by ``spec`` (as ``registry.demo.demo_base_model()``)
    unless one of that name exists; an existing one is left as it is."""
    if repo.get(session, spec["name"]) is not None:
        return
    create_base_model(session, spec, actor=actor)
