"""The S3 multipart writer: a file streamed as parts uploaded from a thread pool while it
arrives, plus the translation of botocore errors into :mod:`kit.errors`."""

from __future__ import annotations

import base64
import bisect
import contextlib
import io
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from kit.errors import NotFound, Unavailable
from registry.snapshot import FileInfo
from registry.storage.base import HashingCounter

if TYPE_CHECKING:
    from registry.storage.s3 import S3PendingUpload

try:  # ISA-L's CRC32 (zlib's polynomial; carry-less multiply): ~7x zlib's on x86-64 here
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - a platform without its wheel
    from zlib import crc32 as _crc32

_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404", "NoSuchBucket"}


def translate_error(e: Exception, what: str) -> NoReturn:
    """Raise the kit.errors equivalent of a botocore error."""
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in _NOT_FOUND_CODES:
            raise NotFound(f"S3 {what}: {code}", code="artifact_not_found") from e
        raise Unavailable(f"S3 {what} failed: {code or 'error'}", code="storage_unavailable") from e
    raise Unavailable(f"S3 {what} failed: {type(e).__name__}", code="storage_unavailable") from e


@contextlib.contextmanager
def s3_errors(what: str) -> Iterator[None]:
    """Translate botocore errors raised inside the block into kit.errors."""
    try:
        yield
    except (ClientError, BotoCoreError) as e:
        translate_error(e, what)


def crc32_base64(chunks: list[bytes | memoryview]) -> str:
    """The CRC32 of ``chunks`` as S3's ``x-amz-checksum-crc32`` carries it (big-endian, base64).

    The registry computes each part's checksum itself and sends it as that header: botocore
    then skips its own pass (zlib's CRC32, about 7x slower), and S3 checks the part against it
    as before (a mismatch is refused with ``BadDigest``)."""
    crc = 0
    for c in chunks:
        crc = _crc32(c, crc)
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


class _PartBody(io.RawIOBase):
    """One part's chunks as a seekable stream, so a part is never copied into one big buffer
    (nor piece by piece: ``read`` hands out views of the received chunks)."""

    def __init__(self, chunks: list[bytes | memoryview]) -> None:
        self._chunks = chunks
        self._starts: list[int] = []
        pos = 0
        for c in chunks:
            self._starts.append(pos)
            pos += len(c)
        self.size = pos
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _locate(self) -> tuple[int, int]:
        i = bisect.bisect_right(self._starts, self._pos) - 1
        return i, self._pos - self._starts[i]

    def read(self, size: int | None = -1) -> bytes | memoryview:  # type: ignore[override]
        """At most ``size`` bytes, from the current chunk only, without copying: the chunk itself
        or a memoryview of it (a short read; b"" only at the end). botocore's checksum pass and
        http.client's send loop read parts this way, so a part is never copied on its way out."""
        if self._pos >= self.size:
            return b""
        if size is None or size < 0:
            out = bytearray(self.size - self._pos)
            self.readinto(out)
            return bytes(out)
        i, off = self._locate()
        chunk = self._chunks[i]
        n = min(size, len(chunk) - off)
        self._pos += n
        if off == 0 and n == len(chunk) and isinstance(chunk, bytes):
            return chunk
        return memoryview(chunk)[off : off + n]

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        want = len(view)
        done = 0
        while done < want and self._pos < self.size:
            i, off = self._locate()
            chunk = self._chunks[i]
            n = min(want - done, len(chunk) - off)
            view[done : done + n] = chunk[off : off + n]
            done += n
            self._pos += n
        return done


class S3FileWriter:
    """Streams one object: a single put when it is smaller than one part, else a multipart upload.

    At most ``max_inflight_parts`` parts are sent at once, and one more full part waits, ready,
    so a part that finishes is replaced at once rather than once the next part has been
    received (without it S3 had one part instead of two in flight 10–20 % of a 1 GiB upload).
    ``write`` blocks while that part waits and the next one is full: at most about
    ``max_inflight_parts + 2`` parts of data are held."""

    def __init__(self, pending: S3PendingUpload, name: str) -> None:
        self.name = name
        self._p = pending
        self.key = pending.key_prefix + name
        self._chunks: list[bytes | memoryview] = []
        self._buffered = 0
        self._hc = HashingCounter()
        self.upload_id: str | None = None
        self._futures: list[Future[dict[str, Any]]] = []
        inflight = pending.store.max_inflight_parts
        self._sending = threading.BoundedSemaphore(inflight)  # parts being sent
        self._slots = threading.BoundedSemaphore(inflight + 1)  # parts handed over: sent or ready
        self._next_part = 1
        self._info: FileInfo | None = None

    def write(self, chunk: bytes) -> None:
        if self._info is not None:
            raise RuntimeError(f"write to closed file {self.name!r}")
        self._p.check_open()
        if not isinstance(chunk, bytes):
            chunk = bytes(chunk)  # callers may reuse mutable buffers
        if not chunk:
            return
        self._hc.update(chunk)
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        ps = self._p.store.part_size
        while self._buffered >= ps:
            self._submit(self._take(ps))

    def _take(self, n: int) -> list[bytes | memoryview]:
        """The first ``n`` buffered bytes as a chunk list (the chunk on the edge is split
        without copying)."""
        out: list[bytes | memoryview] = []
        got = 0
        while got < n:
            c = self._chunks.pop(0)
            if got + len(c) > n:
                k = n - got
                mv = memoryview(c)
                out.append(mv[:k])
                self._chunks.insert(0, mv[k:])
                got = n
            else:
                out.append(c)
                got += len(c)
        self._buffered -= n
        return out

    def _submit(self, part: list[bytes | memoryview]) -> None:
        self._raise_failed()
        if self.upload_id is None:
            self.upload_id = self._p.start_multipart(self.key)
        self._slots.acquire()
        n = self._next_part
        self._next_part += 1
        try:
            fut = self._p.store.executor.submit(self._upload_part, n, part)
        except BaseException:
            self._slots.release()
            raise
        self._futures.append(fut)

    def _upload_part(self, n: int, chunks: list[bytes | memoryview]) -> dict[str, Any]:
        try:
            with self._sending:  # the ready part waits here for one being sent to finish
                self._p.check_open()  # aborted meanwhile: do not send it
                body = _PartBody(chunks)
                with s3_errors(f"upload part {n} of {self.key}"):
                    resp = self._p.client.upload_part(
                        Bucket=self._p.bucket,
                        Key=self.key,
                        UploadId=self.upload_id,
                        PartNumber=n,
                        Body=body,
                        ContentLength=body.size,
                        ChecksumCRC32=crc32_base64(chunks),
                    )
            return {"PartNumber": n, "ETag": resp["ETag"]}
        finally:
            chunks.clear()
            self._slots.release()

    def _raise_failed(self) -> None:
        for f in self._futures:
            if f.done() and f.exception() is not None:
                f.result()

    def close(self) -> FileInfo:
        if self._info is not None:
            return self._info
        self._p.check_open()
        if self.upload_id is None:
            data = b"".join(self._chunks)
            self._chunks, self._buffered = [], 0
            with s3_errors(f"put {self.key}"):
                self._p.client.put_object(
                    Bucket=self._p.bucket, Key=self.key, Body=data, ChecksumCRC32=crc32_base64([data])
                )
            self._p.note_written(self.key)
        else:
            if self._buffered:
                self._submit(self._take(self._buffered))
            parts = [f.result() for f in self._futures]
            with s3_errors(f"complete {self.key}"):
                self._p.client.complete_multipart_upload(
                    Bucket=self._p.bucket,
                    Key=self.key,
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": parts},
                )
            self._p.note_written(self.key, completed_upload=self.upload_id)
        self._futures = []
        self._info = FileInfo(name=self.name, size=self._hc.size, sha256=self._hc.hexdigest())
        return self._info

    def _drain(self, timeout: float) -> None:
        for f in self._futures:
            f.cancel()
        wait_futures(self._futures, timeout=timeout)
        self._chunks, self._buffered = [], 0
