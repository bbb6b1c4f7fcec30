"""Shared parts of the two ingest paths: the result type, the inspector that collects what
validation needs while files stream by, the one-call-in-flight thread pipe, and abort."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kit.errors import InvalidAdapter, PayloadTooLarge
from registry.safetensors_header import SafetensorsHeaderParser, SafetensorsInfo
from registry.snapshot import CONFIG_FILE, WEIGHTS_FILE, FileInfo
from registry.storage.base import FileWriter, PendingUpload
from registry.validation import (
    MAX_CONFIG_BYTES,
    BaseModelSpec,
    ValidatedAdapter,
    cap_problems,
    validate_adapter,
)

BATCH_BYTES = 4 * 1024 * 1024  # hand the store ~4 MiB at a time (one thread hop each)
MULTIPART_SLACK = 1024 * 1024  # Content-Length above max_bytes + this is refused up front
T = TypeVar("T")


@dataclass
class IngestResult:
    pending: PendingUpload
    files: list[FileInfo]
    rank: int
    lora_alpha: float
    target_modules: list[str]
    fields: dict[str, str] = field(default_factory=dict)  # accepted form fields (multipart only)
    source_uri: str | None = None  # by reference: the normalised source it was copied from
    source_revision: str | None = None  # hf://: the commit sha the revision resolved to


def too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"adapter version is larger than the limit of {max_bytes} bytes", details={"max_bytes": max_bytes}
    )


class Inspector:
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
            raise too_large(self.max_bytes)

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


class Pipe:
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


async def copy_and_validate(
    pending: PendingUpload,
    copy: Callable[[threading.Event], None],
    insp: Inspector,
    base: BaseModelSpec,
) -> ValidatedAdapter:
    """Run the blocking ``copy(cancel)`` in a thread, then validate what it saw (in that thread too:
    a large weights header takes a while). On any failure, cancellation included, the copy is told
    to stop and waited for, then ``pending`` is aborted."""
    cancel = threading.Event()

    def run() -> ValidatedAdapter:
        copy(cancel)
        return insp.validate(base)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        return await asyncio.shield(task)
    except BaseException:
        cancel.set()
        with contextlib.suppress(BaseException):
            await task
        await abort_pending(pending)
        raise


def write_chunks(writer: FileWriter, chunks: list[bytes]) -> None:
    for c in chunks:
        writer.write(c)


async def abort_pending(pending: PendingUpload, pipe: Pipe | None = None) -> None:
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
