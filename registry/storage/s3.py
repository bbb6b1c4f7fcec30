"""S3 artifact store (boto3; AWS, MinIO, SeaweedFS, … — path-style for custom endpoints).

Objects live at ``<prefix>adapters/<adapter_id>/<uuid>/<name>``; a version's storage URI is
``s3://<bucket>/<prefix>adapters/<adapter_id>/<uuid>/``. A file is written as a streaming
multipart upload: parts of ``s3_multipart_chunk_bytes`` are handed to a thread pool as they
fill (at most ``max_inflight_parts`` per file in flight and one more ready to go, so memory
stays bounded) while sha256 and size are computed on the way; a file smaller than one part is
a single ``put_object``.
``abort()`` aborts open multipart uploads and deletes every object under the version's
prefix; what S3 refuses then (it is down) is retried in the background until it is gone, and
``sweep()`` removes what a killed process left (``registry.storage.s3_cleanup``), never an
upload another registry process has open (its lease: ``registry.storage.s3_leases``). botocore
errors become :mod:`kit.errors` (a down S3 is 503 ``storage_unavailable``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from kit.errors import InvalidRequest, LoraplaneError
from registry.storage.base import SourceEntry, SweepReport, list_file_source, open_file_source
from registry.storage.s3_cleanup import Janitor, Leftover, clean_leftover, clean_prefix, sweep_s3
from registry.storage.s3_leases import RENEW_S, TTL_S, UploadLeases, fresh_leases
from registry.storage.s3_multipart import S3FileWriter, s3_errors, translate_error
from registry.validation import check_filename

if TYPE_CHECKING:
    from registry.settings import RegistrySettings

log = logging.getLogger(__name__)

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
MIN_PART = 5 * 1024 * 1024
READ_BUFFER = 1024 * 1024


def make_s3_client(settings: RegistrySettings, *, cleanup: bool = False) -> Any:
    """A boto3 S3 client from the registry settings (path-style addressing for custom endpoints).
    ``cleanup``: short timeouts and one retry, for aborts and sweeps (the janitor retries)."""
    s3cfg: dict[str, Any] = {"addressing_style": "path"} if settings.s3_endpoint_url else {}
    # Parts carry botocore's CRC32 checksum and every file's sha256 is computed on the way in and
    # checked before every load: a second SHA-256 pass over each part just to sign it (what
    # botocore does on plain-http endpoints) buys nothing and costs a third of upload throughput.
    s3cfg["payload_signing_enabled"] = False
    cfg = Config(
        s3=s3cfg,  # type: ignore[arg-type]
        retries={"max_attempts": 2 if cleanup else 3, "mode": "standard"},
        max_pool_connections=32,
        connect_timeout=2 if cleanup else 5,
        read_timeout=15 if cleanup else 120,
    )
    secret = settings.s3_secret_access_key.get_secret_value() if settings.s3_secret_access_key else None
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret,
        config=cfg,
    )


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key/prefix/`` → ``("bucket", "key/prefix/")``."""
    if not uri.startswith("s3://"):
        raise InvalidRequest(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise InvalidRequest(f"bad bucket name in {uri!r}")
    return bucket, key


class _S3Body(io.RawIOBase):
    """A botocore StreamingBody as a raw binary stream with translated errors."""

    def __init__(self, body: Any, what: str) -> None:
        self._body = body
        self._what = what

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        with s3_errors(self._what):
            data = self._body.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()
        super().close()


def _open_object(client: Any, bucket: str, key: str) -> BinaryIO:
    what = f"read s3://{bucket}/{key}"
    with s3_errors(what):
        resp = client.get_object(Bucket=bucket, Key=key)
    return cast(BinaryIO, io.BufferedReader(_S3Body(resp["Body"], what), buffer_size=READ_BUFFER))


class S3SourceReader:
    """Reads register-by-reference sources: ``s3://bucket/prefix/`` (and ``file://``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def list_source(self, source_uri: str) -> list[SourceEntry]:
        if source_uri.startswith("file:"):
            return list_file_source(source_uri)
        bucket, prefix = parse_s3_uri(source_uri)
        out: list[SourceEntry] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                for o in page.get("Contents", []):
                    name = o["Key"][len(prefix) :]
                    if name:
                        out.append(SourceEntry(name, int(o["Size"])))
        except (ClientError, BotoCoreError) as e:
            translate_error(e, f"list {source_uri}")
        return sorted(out, key=lambda s: s.name)

    def open_source(self, source_uri: str, name: str) -> BinaryIO:
        if source_uri.startswith("file:"):
            return open_file_source(source_uri, name)
        bucket, prefix = parse_s3_uri(source_uri)
        return _open_object(self.client, bucket, prefix + name)


class S3PendingUpload:
    def __init__(self, store: S3ArtifactStore, adapter_id: str) -> None:
        self.store = store
        self.client = store.client
        self.bucket = store.bucket
        self.key_prefix = f"{store.prefix}adapters/{adapter_id}/{uuid.uuid4().hex}/"
        self.storage_uri = f"s3://{self.bucket}/{self.key_prefix}"
        self._writers: dict[str, S3FileWriter] = {}
        self._uploads: dict[str, str] = {}  # key → open multipart upload id
        self._written: set[str] = set()
        self._lock = threading.Lock()
        self._state = "open"

    def check_open(self) -> None:
        if self._state != "open":
            raise LoraplaneError(f"upload was {self._state}", code="upload_aborted", status=409)

    def writer(self, name: str) -> S3FileWriter:
        self.check_open()
        problem = check_filename(name)
        if problem:
            raise InvalidRequest(problem)
        if name in self._writers:
            raise InvalidRequest(f"file {name!r} written twice")
        w = S3FileWriter(self, name)
        self._writers[name] = w
        return w

    def start_multipart(self, key: str) -> str:
        with s3_errors(f"start upload of {key}"):
            upload_id = str(self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"])
        with self._lock:
            if self._state == "open":
                self._uploads[key] = upload_id
                return upload_id
        # aborted while we were starting: undo at once
        self.store.clean_up(Leftover(self.key_prefix, uploads={key: upload_id}))
        self.check_open()
        raise AssertionError("unreachable")

    def note_written(self, key: str, completed_upload: str | None = None) -> None:
        with self._lock:
            aborted = self._state == "aborted"
            if not aborted:
                self._written.add(key)
                if completed_upload is not None:
                    self._uploads.pop(key, None)
        if aborted:  # finished after abort() swept: remove it now
            self.store.clean_up(Leftover(self.key_prefix, keys={key}))
            self.check_open()

    def commit(self) -> None:
        self.check_open()
        for w in self._writers.values():
            w.close()
        self._state = "committed"
        self.store.forget(self.key_prefix, committed=True)

    def abort(self) -> None:
        with self._lock:
            if self._state == "aborted":
                return
            self._state = "aborted"
            uploads = dict(self._uploads)
            written = set(self._written)
            self._uploads.clear()
            self._written.clear()
        for w in self._writers.values():
            w._drain(timeout=120)
        lease = self.store.leases.release(self.key_prefix)
        self.store.clean_up(Leftover(self.key_prefix, uploads=uploads, keys={*written, lease}))
        self.store.forget(self.key_prefix)


class S3ArtifactStore:
    scheme = "s3"

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "loraplane/",
        *,
        part_size: int = 16 * 1024 * 1024,
        max_inflight_parts: int = 2,
        workers: int = 8,
        cleanup_client: Any = None,
        janitor_max_delay: float = 10.0,
        lease_renew_s: float = RENEW_S,
        lease_ttl_s: float = TTL_S,
    ) -> None:
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.lstrip("/")
        self.part_size = max(part_size, MIN_PART)
        self.max_inflight_parts = max(1, max_inflight_parts)
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-part")
        self._sources = S3SourceReader(client)
        # cleanup runs with short timeouts: S3 down must not hold a failed request for minutes
        self.cleanup_client = cleanup_client if cleanup_client is not None else client
        self.janitor = Janitor(self.cleanup_client, bucket, max_delay=janitor_max_delay)
        self._live: set[str] = set()  # key prefixes of this process's open uploads
        self._live_lock = threading.Lock()
        # every registry process's open uploads, for every process's sweep (s3_leases)
        self.leases = UploadLeases(self.cleanup_client, bucket, self.prefix, renew_s=lease_renew_s)
        self.lease_ttl_s = lease_ttl_s

    @classmethod
    def from_settings(cls, settings: RegistrySettings) -> S3ArtifactStore:
        assert settings.s3_bucket
        return cls(
            make_s3_client(settings),
            settings.s3_bucket,
            settings.s3_prefix,
            part_size=settings.s3_multipart_chunk_bytes,
            max_inflight_parts=settings.s3_max_inflight_parts,
            cleanup_client=make_s3_client(settings, cleanup=True),
        )

    def close(self) -> None:
        self.leases.stop()
        self.janitor.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def begin(self, adapter_id: str) -> S3PendingUpload:
        if "/" in adapter_id or not adapter_id or ".." in adapter_id:
            raise InvalidRequest(f"bad adapter id {adapter_id!r}")
        pending = S3PendingUpload(self, adapter_id)
        with self._live_lock:
            self._live.add(pending.key_prefix)
        self.leases.add(pending.key_prefix)
        return pending

    def forget(self, key_prefix: str, *, committed: bool = False) -> None:
        """The upload at ``key_prefix`` is over (committed or aborted): the sweeper may judge it.
        A committed upload's lease is deleted here (an aborted one's with its leftover)."""
        with self._live_lock:
            self._live.discard(key_prefix)
        if committed:
            lease = self.leases.release(key_prefix)
            try:
                self.cleanup_client.delete_object(Bucket=self.bucket, Key=lease)
            except (ClientError, BotoCoreError):  # the janitor retries (its prefix: the lease alone)
                self.janitor.submit(Leftover(lease, keys={lease}))

    def clean_up(self, left: Leftover) -> None:
        """Remove what a failed version left; if S3 refuses now, the janitor retries until it
        takes it (never raises)."""
        try:
            clean_leftover(self.cleanup_client, self.bucket, left)
        except (ClientError, BotoCoreError) as e:
            log.warning(
                "cleanup of %s failed (%s); retrying in the background",
                f"s3://{self.bucket}/{left.key_prefix}",
                type(e).__name__,
                extra={"event": "s3_cleanup_deferred"},
            )
            self.janitor.submit(left)

    def sweep(self, referenced: Callable[[list[str]], set[str]], older_than_s: float) -> SweepReport:
        with self._live_lock:
            live = set(self._live)
        with s3_errors(f"sweep s3://{self.bucket}/{self.prefix}adapters/"):
            live |= fresh_leases(self.cleanup_client, self.bucket, self.prefix, self.lease_ttl_s)
            return sweep_s3(
                self.cleanup_client,
                self.bucket,
                self.prefix,
                referenced=referenced,
                older_than_s=older_than_s,
                live=live,
            )

    def _own_prefix(self, storage_uri: str) -> str:
        bucket, key = parse_s3_uri(storage_uri)
        if bucket != self.bucket or not key.startswith(self.prefix + "adapters/") or ".." in key:
            raise InvalidRequest(f"storage URI {storage_uri!r} is not inside this artifact store")
        return key if key.endswith("/") else key + "/"

    def open_read(self, storage_uri: str, name: str) -> BinaryIO:
        problem = check_filename(name)
        if problem:
            raise InvalidRequest(problem)
        return _open_object(self.client, self.bucket, self._own_prefix(storage_uri) + name)

    def delete_prefix(self, storage_uri: str) -> None:
        with s3_errors(f"delete {storage_uri}"):
            clean_prefix(self.client, self.bucket, self._own_prefix(storage_uri))

    def list_source(self, source_uri: str) -> list[SourceEntry]:
        return self._sources.list_source(source_uri)

    def open_source(self, source_uri: str, name: str) -> BinaryIO:
        return self._sources.open_source(source_uri, name)
