"""Streaming ingest of one adapter version: multipart upload or register-by-reference.

``ingest_multipart`` parses ``multipart/form-data`` straight off ``request.stream()`` with
python-multipart's push parser (no ``request.form()``, no temp files, no whole-file
buffering): every part goes through a :class:`~registry.storage.base.FileWriter` (sha256 +
size on the way, blocking store calls in a worker thread, one batch in flight while the next
is received), the weights part through the safetensors header parser, and
``adapter_config.json`` is kept (≤ 1 MiB). ``ingest_source`` copies the files of an allowed
``s3://`` / ``file://`` prefix into the store the same way, so later edits of the source
cannot change the version.

Both return an :class:`IngestResult` whose ``pending`` upload the caller must ``commit()``
(after recording the version) or ``abort()``. On any failure — validation, size cap,
client disconnect, storage error, cancellation — they abort the pending upload themselves
before raising: nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from kit.errors import InvalidAdapter, InvalidRequest, LoraplaneError, PayloadTooLarge
from registry.safetensors_header import SafetensorsHeaderParser, SafetensorsInfo
from registry.snapshot import CONFIG_FILE, WEIGHTS_FILE, FileInfo
from registry.storage.base import ArtifactStore, FileWriter, PendingUpload, file_uri_to_path
from registry.validation import (
    MAX_CONFIG_BYTES,
    BaseModelSpec,
    ValidatedAdapter,
    cap_problems,
    check_filename,
    validate_adapter,
)

__all__ = ["IngestResult", "check_source_uri", "ingest_multipart", "ingest_source"]

BATCH_BYTES = 1024 * 1024  # hand the store ~1 MiB at a time
MULTIPART_SLACK = 1024 * 1024  # Content-Length above max_bytes + this is refused up front
T = TypeVar("T")


@dataclass
class IngestResult:
    pending: PendingUpload
    files: list[FileInfo]
    rank: int
    lora_alpha: float
    target_modules: list[str]


def _too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"adapter version is larger than the limit of {max_bytes} bytes", details={"max_bytes": max_bytes}
    )


class _Inspector:
    """Collects what validation needs while the files stream by (upload or source copy)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        self.problems: list[str] = []
        self.files: list[FileInfo] = []
        self.config: bytearray | None = None
        self.config_too_big = False
        self.weights: SafetensorsHeaderParser | None = None

    def start_file(self, name: str) -> None:
        if name == CONFIG_FILE:
            self.config = bytearray()
        elif name == WEIGHTS_FILE:
            self.weights = SafetensorsHeaderParser()

    def count(self, n: int) -> None:
        self.total += n
        if self.total > self.max_bytes:
            raise _too_large(self.max_bytes)

    def inspect(self, name: str, chunk: bytes) -> None:
        if name == WEIGHTS_FILE and self.weights is not None:
            self.weights.feed(chunk)
        elif name == CONFIG_FILE and self.config is not None and not self.config_too_big:
            if len(self.config) + len(chunk) > MAX_CONFIG_BYTES:
                self.config_too_big = True
            else:
                self.config += chunk

    def validate(self, base: BaseModelSpec) -> ValidatedAdapter:
        problems = list(self.problems)
        config: bytes | None = bytes(self.config) if self.config is not None else None
        if self.config_too_big:
            problems.append(f"{CONFIG_FILE}: file is larger than {MAX_CONFIG_BYTES} bytes")
            config = b"{}"  # reported above; still check the weights
        weights: SafetensorsInfo | None = self.weights.finish() if self.weights is not None else None
        try:
            res = validate_adapter(config, weights, base)
        except InvalidAdapter as e:
            more = [p for p in e.problems if not (self.config_too_big and p.startswith(f"{CONFIG_FILE}:"))]
            problems.extend(more)
            raise InvalidAdapter(cap_problems(problems)) from None
        if problems:
            raise InvalidAdapter(cap_problems(problems))
        return res


class _Pipe:
    """Runs a part's blocking store calls in a worker thread, one call in flight at a time,
    so the next batch is received while the previous one is hashed and stored."""

    def __init__(self) -> None:
        self._inflight: asyncio.Future[Any] | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` in a thread once the previous call has finished."""
        await self.wait()
        self._inflight = asyncio.ensure_future(asyncio.to_thread(fn, *args))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        await self.run(fn, *args)
        assert self._inflight is not None
        result: T = await self._inflight
        self._inflight = None
        return result

    async def wait(self) -> None:
        if self._inflight is not None:
            await self._inflight  # on error/cancel it stays set, for quiesce()
            self._inflight = None

    async def quiesce(self) -> None:
        """Wait for the thread to finish, whatever happens (used before aborting)."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(fut)


def _write_chunks(writer: FileWriter, chunks: list[bytes]) -> None:
    for c in chunks:
        writer.write(c)


async def _abort(pending: PendingUpload, pipe: _Pipe | None = None) -> None:
    """Abort even while being cancelled: the abort runs to completion in a thread."""
    if pipe is not None:
        await pipe.quiesce()
    task = asyncio.ensure_future(asyncio.to_thread(pending.abort))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await task
        raise


# --------------------------------------------------------------------------- multipart


@dataclass
class _Part:
    headers: dict[str, str] = field(default_factory=dict)
    hname: bytearray = field(default_factory=bytearray)
    value: bytearray = field(default_factory=bytearray)
    name: str | None = None  # accepted file name, None when the part is refused
    writer: FileWriter | None = None
    batch: list[bytes] = field(default_factory=list)
    batch_len: int = 0


class _MultipartIngest:
    def __init__(self, pending: PendingUpload, max_bytes: int) -> None:
        self.pending = pending
        self.insp = _Inspector(max_bytes)
        self.pipe = _Pipe()
        self.events: list[tuple[str, Any]] = []
        self.part: _Part | None = None
        self.seen: set[str] = set()
        self.ended = False
        self.parts = 0

    def callbacks(self) -> dict[str, Any]:
        ev = self.events

        def data(kind: str) -> Callable[[bytes, int, int], None]:
            # the whole chunk is passed on as is (no copy); only edges are sliced
            return lambda d, s, e: ev.append((kind, d if s == 0 and e == len(d) else d[s:e]))

        return {
            "on_part_begin": lambda: ev.append(("begin", None)),
            "on_header_field": data("hfield"),
            "on_header_value": data("hvalue"),
            "on_header_end": lambda: ev.append(("hend", None)),
            "on_headers_finished": lambda: ev.append(("headers", None)),
            "on_part_data": data("data"),
            "on_part_end": lambda: ev.append(("end", None)),
            "on_end": lambda: ev.append(("done", None)),
        }

    async def process(self) -> None:
        events, self.events[:] = list(self.events), []
        for kind, val in events:
            if kind == "data":
                await self._data(val)
            elif kind == "begin":
                self.part = _Part()
                self.parts += 1
            elif kind == "hfield" and self.part is not None:
                self.part.hname += val
            elif kind == "hvalue" and self.part is not None:
                self.part.value += val
            elif kind == "hend" and self.part is not None:
                key = self.part.hname.decode("latin-1").strip().lower()
                self.part.headers[key] = self.part.value.decode("latin-1").strip()
                self.part.hname, self.part.value = bytearray(), bytearray()
            elif kind == "headers":
                await self._open_part()
            elif kind == "end":
                await self._close_part()
            elif kind == "done":
                self.ended = True

    async def _open_part(self) -> None:
        part = self.part
        assert part is not None
        disp, opts = parse_options_header(part.headers.get("content-disposition", ""))
        field_name = opts.get(b"name", b"").decode("latin-1")
        filename = opts.get(b"filename")
        p = self.insp.problems
        if disp != b"form-data":
            p.append(f"multipart part {self.parts} has no 'Content-Disposition: form-data' header")
            return
        if field_name != "files":
            p.append(f"multipart part named {field_name!r}: every part must be named 'files'")
            return
        if filename is None:
            p.append(f"multipart part {self.parts} has no filename")
            return
        name = filename.decode("utf-8", "replace")
        problem = check_filename(name)
        if problem:
            p.append(problem)
            return
        if name in self.seen:
            p.append(f"file {name!r} sent twice (duplicate part)")
            return
        self.seen.add(name)
        part.name = name
        part.writer = self.pending.writer(name)
        self.insp.start_file(name)

    async def _data(self, chunk: bytes) -> None:
        self.insp.count(len(chunk))
        part = self.part
        if part is None or part.writer is None or part.name is None:
            return  # refused part: counted, not stored
        self.insp.inspect(part.name, chunk)
        part.batch.append(chunk)
        part.batch_len += len(chunk)
        if part.batch_len >= BATCH_BYTES:
            await self._flush(part)

    async def _flush(self, part: _Part) -> None:
        if not part.batch or part.writer is None:
            return
        chunks, part.batch, part.batch_len = part.batch, [], 0
        await self.pipe.run(_write_chunks, part.writer, chunks)

    async def _close_part(self) -> None:
        part, self.part = self.part, None
        if part is None or part.writer is None:
            return
        await self._flush(part)
        self.insp.files.append(await self.pipe.call(part.writer.close))


async def ingest_multipart(
    request: Request, *, store: ArtifactStore, adapter_id: str, base: BaseModelSpec, max_bytes: int
) -> IngestResult:
    """Stream a multipart upload into a new pending version and validate it (see module doc)."""
    ctype, opts = parse_options_header(request.headers.get("content-type"))
    if ctype != b"multipart/form-data":
        raise InvalidRequest(
            "upload must be multipart/form-data with one part named 'files' per file "
            '(or JSON {"source_uri": "s3://bucket/prefix/"})'
        )
    boundary = opts.get(b"boundary")
    if not boundary or len(boundary) > 200:
        raise InvalidRequest("multipart/form-data without a valid boundary")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes + MULTIPART_SLACK:
        raise _too_large(max_bytes)

    pending = await asyncio.to_thread(store.begin, adapter_id)
    ing = _MultipartIngest(pending, max_bytes)
    try:
        parser = MultipartParser(boundary, ing.callbacks())  # type: ignore[arg-type]
        async for chunk in request.stream():
            if not chunk:
                continue
            try:
                parser.write(chunk)
            except MultipartParseError as e:
                raise InvalidRequest(f"malformed multipart body: {e}") from None
            await ing.process()
        if not ing.ended:
            raise InvalidRequest("multipart body ended before its closing boundary")
        await ing.pipe.wait()
        checked = ing.insp.validate(base)
        return IngestResult(
            pending=pending,
            files=list(ing.insp.files),
            rank=checked.rank,
            lora_alpha=checked.lora_alpha,
            target_modules=checked.target_modules,
        )
    except ClientDisconnect:
        await _abort(pending, ing.pipe)
        raise LoraplaneError("client disconnected during upload", code="client_disconnected") from None
    except BaseException:
        await _abort(pending, ing.pipe)
        raise


# --------------------------------------------------------------------------- by reference


def _normalise_source(uri: str, *, what: str) -> str:
    if not isinstance(uri, str) or not uri:
        raise InvalidRequest(f"{what} must be a non-empty string")
    if any(c in uri for c in "\\?#%") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri):
        raise InvalidRequest(f"{what} {uri!r} holds characters that are not allowed (\\ ? # % or spaces)")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in ("s3", "file"):
        raise InvalidRequest(
            f"{what} {uri!r}: only s3://bucket/prefix/ (or an allowed file:// directory) works"
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
    insp: _Inspector,
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
) -> IngestResult:
    """Copy the files directly under an allowed source prefix into a new pending version."""
    uri = check_source_uri(source_uri, allowed_sources)
    entries = await asyncio.to_thread(store.list_source, uri)
    if sum(e.size for e in entries) > max_bytes:
        raise _too_large(max_bytes)
    insp = _Inspector(max_bytes)
    names: list[str] = []
    for e in entries:
        problem = check_filename(e.name)
        if problem:
            insp.problems.append(f"source file {e.name!r}: {problem}")
        else:
            names.append(e.name)
    pending = await asyncio.to_thread(store.begin, adapter_id)
    cancel = threading.Event()
    copy = asyncio.ensure_future(asyncio.to_thread(_copy_source, store, pending, uri, names, insp, cancel))
    try:
        await asyncio.shield(copy)
        checked = insp.validate(base)
    except BaseException:
        cancel.set()
        with contextlib.suppress(BaseException):
            await copy
        await _abort(pending)
        raise
    return IngestResult(
        pending=pending,
        files=list(insp.files),
        rank=checked.rank,
        lora_alpha=checked.lora_alpha,
        target_modules=checked.target_modules,
    )
