"""Base models: register, describe, list; and the spec that upload validation checks against."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from kit.errors import Conflict, InvalidRequest, NotFound
from kit.ids import is_slug
from registry.models import BaseModelRow
from registry.repositories import base_models as repo
from registry.repositories.pagination import Page, clamp_limit, decode_cursor, page_of
from registry.services.approvals import check_approvals_required
from registry.services.audit import record_change
from registry.services.records import BaseModelRecord


def _check_spec(spec: dict[str, Any]) -> None:
    problems: list[str] = []
    name = spec.get("name")
    if not isinstance(name, str) or not is_slug(name):
        problems.append("name must be a slug matching ^[a-z0-9][a-z0-9._-]{0,62}$ without '..'")
    if not isinstance(spec.get("hf_id"), str) or not spec.get("hf_id"):
        problems.append("hf_id must be a non-empty string")
    rank = spec.get("max_lora_rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        problems.append("max_lora_rank must be a positive integer")
    tm = spec.get("target_modules")
    if not isinstance(tm, list) or not tm or not all(isinstance(m, str) and m for m in tm):
        problems.append("target_modules must be a non-empty JSON list of module names")
    shapes = spec.get("module_shapes")
    if shapes is not None:
        ok = isinstance(shapes, dict) and all(
            isinstance(k, str)
            and isinstance(v, list)
            and len(v) == 2
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in v)
            for k, v in shapes.items()
        )
        if not ok:
            problems.append("module_shapes must map module names to [in, out] positive integers")
    if problems:
        raise InvalidRequest("invalid base model: " + "; ".join(problems), details={"problems": problems})


def create_base_model(session: Session, spec: dict[str, Any], *, actor: str) -> BaseModelRecord:
    _check_spec(spec)
    if repo.get(session, spec["name"]) is not None:
        raise Conflict(f"base model {spec['name']!r} already exists", code="base_model_exists")
    row = repo.add(
        session,
        BaseModelRow(
            name=spec["name"],
            hf_id=spec["hf_id"],
            max_lora_rank=spec["max_lora_rank"],
            target_modules=list(dict.fromkeys(spec["target_modules"])),
            module_shapes=spec.get("module_shapes"),
            revision=spec.get("revision"),
            approvals_required=check_approvals_required(spec.get("approvals_required", 0)),
        ),
    )
    record_change(
        session,
        actor=actor,
        action="base_model.created",
        subject_type="base_model",
        subject_id=row.name,
        details={
            "hf_id": row.hf_id,
            "max_lora_rank": row.max_lora_rank,
            "approvals_required": row.approvals_required,
        },
    )
    return BaseModelRecord.of(row)


def update_base_model(session: Session, name: str, changes: dict[str, Any], *, actor: str) -> BaseModelRecord:
    """``changes``: ``approvals_required`` (SPEC §14). A real change writes one
    ``base_model.updated`` event; a call that changes nothing writes nothing."""
    for field in changes:
        if field != "approvals_required":
            raise InvalidRequest(
                f"unknown field {field!r} (known: approvals_required)", details={"field": field}
            )
    row = repo.get(session, name)
    if row is None:
        raise NotFound(f"base model {name!r} not found", code="base_model_not_found")
    if "approvals_required" in changes:
        value = check_approvals_required(changes["approvals_required"])
        if value != row.approvals_required:
            row.approvals_required = value
            session.flush()
            record_change(
                session,
                actor=actor,
                action="base_model.updated",
                subject_type="base_model",
                subject_id=name,
                details={"approvals_required": value},
            )
    return BaseModelRecord.of(row)


def get_base_model(session: Session, name: str) -> BaseModelRecord:
    row = repo.get(session, name)
    if row is None:
        raise NotFound(f"base model {name!r} not found", code="base_model_not_found")
    return BaseModelRecord.of(row)


def list_base_models(
    session: Session, *, limit: int | None = None, cursor: str | None = None
) -> Page[BaseModelRecord]:
    n = clamp_limit(limit)
    rows = repo.list_rows(session, limit=n, after=decode_cursor(cursor, str))
    items, nxt = page_of(rows, n, lambda r: r.name)
    return Page([BaseModelRecord.of(r) for r in items], nxt)
