"""``ingest_source``: copy an allowed ``s3://`` / ``file://`` prefix into a pending version, or
import an allowed ``hf://`` reference (``registry.ingest.hf``)."""

from __future__ import annotations

import asyncio
import threading

from kit.errors import InvalidRequest
from registry.ingest.common import (
    BATCH_BYTES,
    IngestResult,
    Inspector,
    copy_and_validate,
    too_large,
)
from registry.ingest.hf import HubOptions, ingest_hf
from registry.ingest.hf_uri import is_hf_uri
from registry.storage.base import ArtifactStore, PendingUpload, file_uri_to_path
from registry.validation import (
    BaseModelSpec,
    check_filename,
)


def _normalise_source(uri: str, *, what: str) -> str:
    if not isinstance(uri, str) or not uri:
        raise InvalidRequest(f"{what} must be a non-empty string")
    if any(c in uri for c in "\\?#%") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri):
        raise InvalidRequest(f"{what} {uri!r} holds characters that are not allowed (\\ ? # % or spaces)")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in ("s3", "file"):
        raise InvalidRequest(
            f"{what} {uri!r}: only s3://bucket/prefix/, hf://ORG/REPO@REVISION[/SUBDIR] "
            "(or an allowed file:// directory) works"
        )
    if scheme == "file" and not rest.startswith("/"):
        raise InvalidRequest(f"{what} {uri!r}: file URIs must be file:///absolute/path/")
    segments = rest.strip("/").split("/") if scheme == "s3" else rest[1:].rstrip("/").split("/")
    if any(s in ("..", ".") for s in segments):
        raise InvalidRequest(f"{what} {uri!r} must not contain '..' or '.' segments")
    if any(s == "" for s in segments) and rest.strip("/"):
        raise InvalidRequest(f"{what} {uri!r} must not contain empty path segments ('//')")
    if scheme == "s3" and not segments[0]:
        raise InvalidRequest(f"{what} {uri!r} names no bucket")
    return uri if uri.endswith("/") else uri + "/"


def check_source_uri(source_uri: str, allowed_sources: list[str]) -> str:
    """The normalised ``source_uri`` (trailing ``/``) if it lies inside one of
    ``allowed_sources``; else InvalidRequest (422 ``invalid_request``) saying why."""
    uri = _normalise_source(source_uri, what="source_uri")
    if not allowed_sources:
        raise InvalidRequest("registration by reference is disabled: LORAPLANE_ALLOWED_SOURCES is empty")
    for raw in allowed_sources:
        try:
            allowed = _normalise_source(raw, what="allowed source")
        except InvalidRequest:
            continue
        if not uri.startswith(allowed):
            continue
        if uri.startswith("file://"):
            real = file_uri_to_path(uri).resolve()
            if not real.is_relative_to(file_uri_to_path(allowed).resolve()):
                continue  # a symlink leads outside the allowed directory
        return uri
    raise InvalidRequest(
        f"source_uri {source_uri!r} is not inside an allowed source (LORAPLANE_ALLOWED_SOURCES)",
        details={"allowed_sources": list(allowed_sources)},
    )


def _copy_source(
    store: ArtifactStore,
    pending: PendingUpload,
    uri: str,
    names: list[str],
    insp: Inspector,
    cancel: threading.Event,
) -> None:
    for name in names:
        insp.start_file(name)
        w = pending.writer(name)
        with store.open_source(uri, name) as src:
            while chunk := src.read(BATCH_BYTES):
                if cancel.is_set():
                    raise asyncio.CancelledError()
                insp.count(len(chunk))
                insp.inspect(name, chunk)
                w.write(chunk)
        insp.files.append(w.close())


async def ingest_source(
    source_uri: str,
    *,
    allowed_sources: list[str],
    store: ArtifactStore,
    adapter_id: str,
    base: BaseModelSpec,
    max_bytes: int,
    hub: HubOptions | None = None,
) -> IngestResult:
    """Copy the files directly under an allowed source prefix into a new pending version; an
    ``hf://`` reference is imported from the Hugging Face Hub with ``hub``'s options."""
    if is_hf_uri(source_uri):
        return await ingest_hf(
            source_uri,
            allowed_sources=allowed_sources,
            hub=hub or HubOptions(),
            store=store,
            adapter_id=adapter_id,
            base=base,
            max_bytes=max_bytes,
        )
    uri = check_source_uri(source_uri, allowed_sources)
    entries = await asyncio.to_thread(store.list_source, uri)
    if sum(e.size for e in entries) > max_bytes:
        raise too_large(max_bytes)
    insp = Inspector(max_bytes)
    names: list[str] = []
    for e in entries:
        problem = check_filename(e.name)
        if problem:
            insp.problems.append(f"source file {e.name!r}: {problem}")
        else:
            names.append(e.name)
    pending = await asyncio.to_thread(store.begin, adapter_id)
    checked = await copy_and_validate(
        pending, lambda cancel: _copy_source(store, pending, uri, names, insp, cancel), insp, base
    )
    return IngestResult(
        pending=pending,
        files=list(insp.files),
        rank=checked.rank,
        lora_alpha=checked.lora_alpha,
        target_modules=checked.target_modules,
        source_uri=uri,
    )
