"""What a failed S3 upload leaves behind, and the two ways it is removed.

1. **At once, with retries** (:class:`Janitor`): ``S3PendingUpload.abort()`` aborts the open
   multipart uploads and deletes the objects of a failed version with a short-timeout client.
   When S3 refuses (it is down, which is often *why* the upload failed), the leftover — its open
   upload ids, written keys and version prefix — goes to the janitor, a background thread that
   retries with exponential backoff (``first_delay`` doubling up to ``max_delay``) until S3 takes
   the cleanup, so the bucket is clean within ``max_delay`` of S3 coming back.
2. **By sweeping** (:func:`sweep_s3`): what a registry killed mid-upload could not hand to a
   janitor is found by listing. An unfinished multipart upload under ``<prefix>adapters/``
   initiated more than ``older_than_s`` ago is aborted; a version prefix
   (``<prefix>adapters/<adapter>/<token>/``) whose newest object is older than that bound and
   that no version row names is deleted. Uploads open in this process, or in any other
   process whose upload lease is fresh (``registry.storage.s3_leases``), are skipped whatever
   their age. ``registry.storage.sweeper`` runs it at start-up and periodically.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from registry.storage.base import SweepReport

log = logging.getLogger(__name__)

_GONE_UPLOAD = {"NoSuchUpload", "404", "NotFound"}
DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys per call


@dataclass
class Leftover:
    """What one failed version left in the bucket."""

    key_prefix: str
    uploads: dict[str, str] = field(default_factory=dict)  # key → open multipart upload id
    keys: set[str] = field(default_factory=set)


def _abort_upload(client: Any, bucket: str, key: str, upload_id: str) -> None:
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code", "")) not in _GONE_UPLOAD:
            raise


def _delete_keys(client: Any, bucket: str, keys: Iterable[str]) -> int:
    batch = sorted(keys)
    for i in range(0, len(batch), DELETE_BATCH):
        objs = [{"Key": k} for k in batch[i : i + DELETE_BATCH]]
        client.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})
    return len(batch)


def clean_prefix(client: Any, bucket: str, prefix: str) -> tuple[int, int]:
    """Delete every object and abort every multipart upload under ``prefix``; raises botocore
    errors. Returns (objects deleted, uploads aborted)."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    deleted = _delete_keys(client, bucket, keys)
    aborted = 0
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for up in page.get("Uploads", []):
            _abort_upload(client, bucket, up["Key"], up["UploadId"])
            aborted += 1
    return deleted, aborted


def clean_leftover(client: Any, bucket: str, left: Leftover) -> None:
    """Abort the leftover's uploads, delete its keys, then sweep its prefix; raises botocore errors
    (nothing is forgotten: the caller keeps ``left`` until this returns)."""
    for key, upload_id in list(left.uploads.items()):
        _abort_upload(client, bucket, key, upload_id)
        del left.uploads[key]
    _delete_keys(client, bucket, left.keys)
    left.keys.clear()
    clean_prefix(client, bucket, left.key_prefix)


class Janitor:
    """Retries the cleanup of failed versions in one background thread until S3 takes it.

    ``submit`` never blocks and never raises; at most ``max_pending`` leftovers wait (the oldest
    is dropped, logged, and left to the sweeper, beyond that). The thread starts on the first
    submit and is a daemon: at exit the sweeper of the next start-up finishes the job."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        *,
        first_delay: float = 1.0,
        max_delay: float = 30.0,
        max_pending: int = 10_000,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._queue: deque[Leftover] = deque(maxlen=max_pending)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.cleaned = 0

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, left: Leftover) -> None:
        with self._cond:
            if self._closed:
                return
            if len(self._queue) == self._queue.maxlen:
                log.warning(
                    "cleanup queue full: %s is left to the orphan sweeper",
                    self._queue[0].key_prefix,
                    extra={"event": "s3_cleanup_dropped"},
                )
            self._queue.append(left)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="s3-janitor", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        delay = self.first_delay
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(self._queue)
            failed = False
            for left in batch:
                try:
                    clean_leftover(self.client, self.bucket, left)
                except (ClientError, BotoCoreError) as e:
                    failed = True
                    log.info(
                        "cleanup of %s failed (%s); retrying in %.0f s",
                        left.key_prefix,
                        type(e).__name__,
                        delay,
                        extra={"event": "s3_cleanup_retry"},
                    )
                    break  # S3 is still down: wait before trying the rest
                with self._cond, contextlib.suppress(ValueError):
                    self._queue.remove(left)
                self.cleaned += 1
                log.info("cleaned up %s", left.key_prefix, extra={"event": "s3_cleanup_done"})
            if failed:
                with self._cond:
                    if not self._closed:
                        self._cond.wait(delay)
                delay = min(delay * 2, self.max_delay)
            else:
                delay = self.first_delay


def _age_s(stamp: Any, now: float) -> float:
    if isinstance(stamp, datetime):
        ts = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        return now - ts.timestamp()
    return float("inf")  # no timestamp: treat as old


def version_prefix(key: str, root: str) -> str | None:
    """``<root>adapters/<adapter>/<token>/`` of an object key, or None outside that layout."""
    rest = key[len(root) :].split("/")
    if not key.startswith(root) or len(rest) < 4 or rest[0] != "adapters" or not rest[1] or not rest[2]:
        return None
    return f"{root}adapters/{rest[1]}/{rest[2]}/"


def sweep_s3(
    client: Any,
    bucket: str,
    root: str,
    *,
    referenced: Callable[[list[str]], set[str]],
    older_than_s: float,
    live: set[str],
    now: float | None = None,
) -> SweepReport:
    """Abort old unfinished multipart uploads and delete old version prefixes no version row names
    (see the module doc). ``referenced`` maps storage URIs to those a version row holds; ``live``
    holds the key prefixes of this process's open uploads. Raises botocore errors."""
    now = time.time() if now is None else now
    base = f"{root}adapters/"
    report = SweepReport()
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=base):
        for up in page.get("Uploads", []):
            vp = version_prefix(up["Key"], root)
            if vp in live or _age_s(up.get("Initiated"), now) < older_than_s:
                continue
            _abort_upload(client, bucket, up["Key"], up["UploadId"])
            report.uploads_aborted += 1
    newest: dict[str, float] = {}  # version prefix → age of its newest object
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
        for o in page.get("Contents", []):
            vp = version_prefix(o["Key"], root)
            if vp is None or vp in live:
                continue
            age = _age_s(o.get("LastModified"), now)
            newest[vp] = min(newest.get(vp, age), age)
    candidates = sorted(vp for vp, age in newest.items() if age >= older_than_s)
    for i in range(0, len(candidates), 500):
        chunk = candidates[i : i + 500]
        uris = {f"s3://{bucket}/{vp}": vp for vp in chunk}
        kept = referenced(list(uris))
        for uri, vp in uris.items():
            if uri in kept:
                continue
            deleted, aborted = clean_prefix(client, bucket, vp)
            report.objects_deleted += deleted
            report.uploads_aborted += aborted
            report.prefixes_deleted.append(uri)
    return report
