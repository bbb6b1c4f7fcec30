"""Upload leases: how several registry processes sharing a bucket tell a live upload from an orphan.

Each upload open in a process (``S3PendingUpload``, from ``begin`` to ``commit``/``abort``) has a
lease object ``<root>leases/<adapter>/<token>`` beside its version prefix
``<root>adapters/<adapter>/<token>/``, written at ``begin`` and rewritten every ``renew_s`` by
one background thread per store (``UploadLeases``); its ``LastModified`` is the heartbeat. The
orphan sweep of *any* process (``fresh_leases``) leaves alone every version prefix whose lease
is younger than ``ttl_s`` — its unfinished multipart uploads and its objects — however long the
upload has been running, and deletes the leases older than that (their process died or hung
longer than ``ttl_s``: what they covered is an orphan now, swept by age as before).

A lease is removed when its upload ends (on the janitor's retries if S3 refuses then).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)

RENEW_S = 10.0  # how often a process rewrites the leases of its open uploads
TTL_S = 60.0  # a lease not rewritten for this long is stale (its process is gone)
EMPTY_CRC32 = "AAAAAA=="  # the CRC32 of b"", sent so botocore computes none (like every put of ours)


def lease_key(root: str, key_prefix: str) -> str:
    """``<root>leases/<adapter>/<token>`` of the version prefix ``<root>adapters/<adapter>/<token>/``."""
    rest = key_prefix[len(root) + len("adapters/") :].rstrip("/")
    return f"{root}leases/{rest}"


def leased_prefix(root: str, key: str) -> str | None:
    """The version prefix a lease key covers (None for a key outside that layout)."""
    rest = key[len(root) + len("leases/") :].split("/")
    if not key.startswith(f"{root}leases/") or len(rest) != 2 or not rest[0] or not rest[1]:
        return None
    return f"{root}adapters/{rest[0]}/{rest[1]}/"


def fresh_leases(client: Any, bucket: str, root: str, ttl_s: float, now: float | None = None) -> set[str]:
    """Version prefixes whose lease is younger than ``ttl_s``; stale leases are deleted.
    Raises botocore errors."""
    now = time.time() if now is None else now
    fresh: set[str] = set()
    stale: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}leases/"):
        for o in page.get("Contents", []):
            vp = leased_prefix(root, o["Key"])
            stamp = o.get("LastModified")
            age = float("inf")
            if isinstance(stamp, datetime):
                age = now - (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
            if vp is not None and age < ttl_s:
                fresh.add(vp)
            else:
                stale.append(o["Key"])
    for key in stale:
        client.delete_object(Bucket=bucket, Key=key)
    return fresh


class UploadLeases:
    """The leases of this process's open uploads, rewritten every ``renew_s`` by a daemon thread
    (started with the first lease). Writes are best effort: a refused one is logged and retried
    at the next renewal (the upload itself fails on its own if S3 stays down)."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        root: str,
        *,
        renew_s: float = RENEW_S,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.root = root
        self.renew_s = renew_s
        self._held: set[str] = set()  # lease keys
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _put(self, key: str) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=b"", ChecksumCRC32=EMPTY_CRC32)
        except (ClientError, BotoCoreError) as e:
            log.warning("upload lease %s not written (%s)", key, type(e).__name__)

    def add(self, key_prefix: str) -> str:
        key = lease_key(self.root, key_prefix)
        with self._lock:
            self._held.add(key)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="s3-upload-leases", daemon=True)
                self._thread.start()
        self._put(key)
        return key

    def release(self, key_prefix: str) -> str:
        """Stop renewing the lease of ``key_prefix``; returns its key (the caller deletes it)."""
        key = lease_key(self.root, key_prefix)
        with self._lock:
            self._held.discard(key)
        return key

    def stop(self) -> None:
        """Stop renewing every lease (they go stale; the process is ending)."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            with self._lock:
                keys = sorted(self._held)
            for key in keys:
                with self._lock:  # a lease released meanwhile is not written again
                    if key in self._held:
                        self._put(key)
