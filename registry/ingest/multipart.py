"""``ingest_multipart``: stream a multipart/form-data upload into a pending version.

Every file part is named ``files``. The caller may also accept a few small text form fields
(``fields``: name → parser); such a part is read whole (at most ``MAX_FIELD_BYTES``), decoded as
UTF-8 and passed to its parser when it ends, which returns the value to keep or raises (422) —
an upload with a bad field is refused while it streams, and nothing is kept.

The body is parsed by :mod:`registry.ingest.formdata` as it arrives; a malformed body is a 422
``invalid_request`` ("malformed multipart body: …"), a body larger than the size cap plus
``MULTIPART_SLACK`` a 413, whether or not a Content-Length announced it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request

from kit.errors import InvalidRequest, LoraplaneError
from registry.ingest.common import (
    BATCH_BYTES,
    MULTIPART_SLACK,
    IngestResult,
    Inspector,
    Pipe,
    abort_pending,
    too_large,
    write_chunks,
)
from registry.ingest.formdata import PART_END, Event, FormDataError, FormDataParser, Part, check_boundary
from registry.storage.base import ArtifactStore, FileWriter, PendingUpload
from registry.validation import (
    BaseModelSpec,
    check_filename,
)

MAX_FIELD_BYTES = 1024
FieldParser = Callable[[str], str]


@dataclass
class _Part:
    headers: dict[str, str]
    name: str | None = None  # accepted file name, None when the part is refused
    form_field: str | None = None  # name of an accepted text field (not a file)
    text: bytearray = field(default_factory=bytearray)
    writer: FileWriter | None = None
    batch: list[bytes] = field(default_factory=list)
    batch_len: int = 0


class _MultipartIngest:
    def __init__(
        self, pending: PendingUpload, max_bytes: int, field_parsers: Mapping[str, FieldParser] | None = None
    ) -> None:
        self.pending = pending
        self.field_parsers = dict(field_parsers or {})
        self.fields: dict[str, str] = {}
        self.insp = Inspector(max_bytes)
        self.pipe = Pipe()
        self.part: _Part | None = None
        self.seen: set[str] = set()
        self.seen_fields: set[str] = set()
        self.parts = 0

    async def handle(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, bytes):
                await self._data(ev)
            elif isinstance(ev, Part):
                self.part = _Part(ev.headers)
                self.parts += 1
                await self._open_part()
            elif ev is PART_END:
                await self._close_part()

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
        if field_name in self.field_parsers:
            if field_name in self.seen_fields:
                raise InvalidRequest(f"form field {field_name!r} sent twice", details={"field": field_name})
            self.seen_fields.add(field_name)
            part.form_field = field_name
            return
        if field_name != "files":
            also = "".join(f" (or be the form field {n!r})" for n in self.field_parsers)
            p.append(f"multipart part named {field_name!r}: every part must be named 'files'{also}")
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
        if part is not None and part.form_field is not None:
            part.text += chunk
            if len(part.text) > MAX_FIELD_BYTES:
                raise InvalidRequest(
                    f"form field {part.form_field!r} is longer than {MAX_FIELD_BYTES} bytes",
                    details={"field": part.form_field},
                )
            return
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
        await self.pipe.run(write_chunks, part.writer, chunks)

    async def _close_part(self) -> None:
        part, self.part = self.part, None
        if part is not None and part.form_field is not None:
            name = part.form_field
            try:
                value = bytes(part.text).decode("utf-8")
            except UnicodeDecodeError:
                msg = f"form field {name!r} is not UTF-8 text"
                raise InvalidRequest(msg, details={"field": name}) from None
            self.fields[name] = self.field_parsers[name](value.strip())
            return
        if part is None or part.writer is None:
            return
        await self._flush(part)
        self.insp.files.append(await self.pipe.call(part.writer.close))


async def ingest_multipart(
    request: Request,
    *,
    store: ArtifactStore,
    adapter_id: str,
    base: BaseModelSpec,
    max_bytes: int,
    fields: Mapping[str, FieldParser] | None = None,
) -> IngestResult:
    """Stream a multipart upload into a new pending version and validate it (see module doc);
    ``fields`` are the text form fields accepted besides the ``files`` parts."""
    ctype, opts = parse_options_header(request.headers.get("content-type"))
    if ctype != b"multipart/form-data":
        raise InvalidRequest(
            "upload must be multipart/form-data with one part named 'files' per file "
            '(or JSON {"source_uri": "s3://bucket/prefix/"})'
        )
    boundary = opts.get(b"boundary")
    if not boundary or not check_boundary(boundary):
        raise InvalidRequest("multipart/form-data without a valid boundary")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes + MULTIPART_SLACK:
        raise too_large(max_bytes)

    pending = await asyncio.to_thread(store.begin, adapter_id)
    ing = _MultipartIngest(pending, max_bytes, fields)
    try:
        parser = FormDataParser(boundary)
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes + MULTIPART_SLACK:
                raise too_large(max_bytes)
            try:
                events = parser.feed(chunk)
            except FormDataError as e:
                raise InvalidRequest(f"malformed multipart body: {e}") from None
            await ing.handle(events)
        if not parser.done:
            raise InvalidRequest("multipart body ended before its closing boundary")
        await ing.pipe.wait()
        checked = await asyncio.to_thread(ing.insp.validate, base)  # a large header takes a while
        return IngestResult(
            pending=pending,
            files=list(ing.insp.files),
            rank=checked.rank,
            lora_alpha=checked.lora_alpha,
            target_modules=checked.target_modules,
            fields=dict(ing.fields),
        )
    except ClientDisconnect:
        await abort_pending(pending, ing.pipe)
        raise LoraplaneError("client disconnected during upload", code="client_disconnected") from None
    except BaseException:
        await abort_pending(pending, ing.pipe)
        raise
