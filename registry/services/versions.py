"""Registering an uploaded version: the number is taken only here, at insert time, after the
artifact passed validation (refused uploads consume no number).

Numbers are ``max + 1`` under the adapter row lock, with a retry on a unique conflict (a
savepoint per attempt) for databases or callers that do not hold the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kit.errors import Conflict
from kit.ids import version_name
from registry.models import VersionRow
from registry.repositories import adapters as repo
from registry.services.adapters import adapter_row
from registry.services.audit import record_change
from registry.services.gates import DEFAULT_UPLOAD_GATE, check_upload_gate
from registry.services.records import VersionRecord

MAX_NUMBER_ATTEMPTS = 5


def _file_dict(f: Any) -> dict[str, Any]:
    if isinstance(f, dict):
        return {"name": str(f["name"]), "size": int(f["size"]), "sha256": str(f["sha256"])}
    return {"name": str(f.name), "size": int(f.size), "sha256": str(f.sha256)}


def register_version(
    session: Session,
    adapter_id: str,
    *,
    rank: int,
    lora_alpha: float,
    target_modules: Sequence[str],
    files: Sequence[Any],
    storage_uri: str,
    actor: str,
    quality_gate: str = DEFAULT_UPLOAD_GATE,
    source_uri: str | None = None,
    source_revision: str | None = None,
) -> VersionRecord:
    """Insert version ``v(max+1)`` (status ``ready``, gate ``skipped`` or ``pending``) with its
    audit event, in the caller's transaction. A version registered by reference records its
    ``source_uri`` (and for ``hf://`` the commit sha it resolved to, ``source_revision``)."""
    check_upload_gate(quality_gate)
    adapter_row(session, adapter_id, for_update=True)
    file_list = [_file_dict(f) for f in files]
    for _attempt in range(MAX_NUMBER_ATTEMPTS):
        number = repo.max_version_number(session, adapter_id) + 1
        try:
            with session.begin_nested():
                row = repo.add_version(
                    session,
                    VersionRow(
                        adapter_id=adapter_id,
                        number=number,
                        status="ready",
                        rank=int(rank),
                        lora_alpha=float(lora_alpha),
                        target_modules=list(target_modules),
                        files=file_list,
                        storage_uri=storage_uri,
                        rollback_to=None,
                        quality_gate=quality_gate,
                        created_by=actor,
                        source_uri=source_uri,
                        source_revision=source_revision,
                    ),
                )
        except IntegrityError:
            continue
        record_change(
            session,
            actor=actor,
            action="version.uploaded",
            subject_type="adapter",
            subject_id=adapter_id,
            details={
                "version": version_name(number),
                "files": [{"name": f["name"], "size": f["size"], "sha256": f["sha256"]} for f in file_list],
                "storage_uri": storage_uri,
                "quality_gate": quality_gate,
                **({"source_uri": source_uri} if source_uri is not None else {}),
                **({"source_revision": source_revision} if source_revision is not None else {}),
            },
        )
        return VersionRecord.of(row)
    raise Conflict("could not allocate a version number, retry the upload", code="version_conflict")
