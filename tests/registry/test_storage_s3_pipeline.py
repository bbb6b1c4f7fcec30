"""The S3 writer's pipeline on a real S3 server (SeaweedFS): at most ``max_inflight_parts`` parts
are sent at once while one more full part waits ready (so a finished part is replaced at once),
the writer blocks after that, and an abort sends no waiting part. botocore's own event hooks
watch (and hold) the real requests."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from kit.localservices import S3Server
from registry.storage import make_store
from registry.storage.s3 import S3ArtifactStore
from tests.registry.test_storage_stores import PART, bucket_keys, open_uploads, s3_settings

CHUNK = 256 * 1024


class SendWatch:
    """Counts UploadPart requests being sent (peak concurrency, order) and holds part 1 until
    ``release()``."""

    def __init__(self, store: S3ArtifactStore) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.sending = 0
        self.peak = 0
        self.started: list[int] = []
        events = store.client.meta.events
        events.register("before-send.s3.UploadPart", self._before_send)
        events.register("after-call.s3.UploadPart", self._after_call)

    def _before_send(self, request: Any, **_: Any) -> None:
        n = int(parse_qs(urlsplit(request.url).query)["partNumber"][0])
        with self.lock:
            self.sending += 1
            self.peak = max(self.peak, self.sending)
            self.started.append(n)
        if n == 1:
            self.gate.wait(60)

    def _after_call(self, **_: Any) -> None:
        with self.lock:
            self.sending -= 1

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def store(s3_server: S3Server, s3_bucket: str) -> Iterator[S3ArtifactStore]:
    st = make_store(s3_settings(s3_server, s3_bucket))
    assert isinstance(st, S3ArtifactStore)
    st.max_inflight_parts = 1
    yield st
    st.close()


class Feeder(threading.Thread):
    """Writes ``data`` in 256 KiB chunks; ``written`` is how far ``write`` has returned."""

    def __init__(self, write: Callable[[bytes], None], data: bytes) -> None:
        super().__init__(daemon=True)
        self.write, self.data = write, data
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(0, len(self.data), CHUNK):
                self.write(self.data[i : i + CHUNK])
                self.written = min(len(self.data), i + CHUNK)
        except BaseException as e:
            self.error = e


def wait_until(cond: Callable[[], bool], timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_one_full_part_waits_ready_while_the_limit_of_parts_is_sent(
    store: S3ArtifactStore, s3_server: S3Server, s3_bucket: str
) -> None:
    watch = SendWatch(store)
    data = os.urandom(4 * PART + 11)
    pending = store.begin("a")
    w = pending.writer("w")
    feeder = Feeder(w.write, data)
    feeder.start()
    # part 1 is held while being sent; part 2 is handed over and waits; part 3 fills, then
    # the write that completes it blocks
    wait_until(lambda: feeder.written >= 3 * PART - CHUNK)
    time.sleep(0.3)
    assert feeder.is_alive() and feeder.written < 3 * PART
    assert watch.started == [1]  # max_inflight_parts = 1: part 2 is ready, not sent
    watch.release()
    feeder.join(60)
    assert feeder.error is None and feeder.written == len(data)
    info = w.close()
    pending.commit()
    assert watch.peak == 1  # never two parts sent at once (waiting parts may start in any order)
    assert watch.started[0] == 1 and sorted(watch.started) == [1, 2, 3, 4, 5]
    head = s3_server.client().head_object(Bucket=s3_bucket, Key=pending.key_prefix + "w")
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"').endswith("-5")
    got = s3_server.client().get_object(Bucket=s3_bucket, Key=pending.key_prefix + "w")["Body"].read()
    assert got == data and info.sha256 == hashlib.sha256(data).hexdigest()


def test_an_abort_does_not_send_the_part_waiting_ready(
    store: S3ArtifactStore, s3_server: S3Server, s3_bucket: str
) -> None:
    watch = SendWatch(store)
    pending = store.begin("a")
    w = pending.writer("w")
    feeder = Feeder(w.write, os.urandom(4 * PART))
    feeder.start()
    wait_until(lambda: feeder.written >= 3 * PART - CHUNK)  # part 2 waits, ready
    aborting = threading.Thread(target=pending.abort, daemon=True)
    aborting.start()
    wait_until(lambda: pending._state == "aborted")
    watch.release()
    aborting.join(60)
    feeder.join(60)
    assert not aborting.is_alive() and not feeder.is_alive()
    assert watch.started == [1]
    assert feeder.error is not None and "aborted" in str(feeder.error)
    assert bucket_keys(s3_server, s3_bucket) == [] and open_uploads(s3_server, s3_bucket) == []
