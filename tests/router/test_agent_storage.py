"""The staging agent when writing fails or an upload is given up: a full volume (a real tmpfs
of a few hundred KiB where the test may mount one), a read-only volume, a hash mismatch, a client
that goes away mid-upload, and upload directories left by a router that died. In every case
nothing of the upload stays on the volume and the answer says what happened (never a 500)."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import router.agent as agent_mod
from router.agent import make_app, sweep_stale_uploads
from tests.filesystems import small_filesystem

TOKEN = "agent-storage-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = "ad@v1-0123abcd"
UPLOAD = "cd" * 8


def _client(root: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=make_app(root, TOKEN)), base_url="http://agent"
    )


async def _put(c: httpx.AsyncClient, name: str, data: bytes, sha: str | None = None) -> httpx.Response:
    return await c.put(
        f"/v1/staging/{NAME}/files/{name}",
        params={"sha256": sha or hashlib.sha256(data).hexdigest(), "upload": UPLOAD},
        content=data,
        headers=AUTH,
    )


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a staging volume that really fills up."""
    with small_filesystem(tmp_path / "vol", "256k") as mnt:
        yield mnt


async def test_a_full_volume_answers_507_and_keeps_nothing(small_volume: Path) -> None:
    root = small_volume / "staging"
    async with _client(root) as c:
        r = await _put(c, "small.json", b"{}")
        assert r.status_code == 200
        r = await _put(c, "adapter_model.safetensors", os.urandom(1 << 20))  # 1 MiB into 256 KiB
        assert r.status_code == 507, r.text
        assert r.json()["error"]["code"] == "insufficient_storage"
        assert "full" in r.json()["error"]["message"]
        assert _leftovers(root) == []  # the whole upload went, its first file too
        assert os.statvfs(small_volume).f_bfree * os.statvfs(small_volume).f_frsize > 200_000
        r = await _put(c, "small.json", b"{}")  # the volume is usable again
        assert r.status_code == 200


async def test_a_read_only_volume_answers_503(small_volume: Path) -> None:
    root = small_volume / "staging"
    async with _client(root) as c:
        subprocess.run(["mount", "-o", "remount,ro", str(small_volume)], check=True)
        try:
            r = await _put(c, "small.json", b"{}")
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(small_volume)], check=True)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "staging_unavailable"
        assert "Read-only" in r.json()["error"]["message"]
        assert _leftovers(root) == []


async def test_a_write_failing_with_enospc_answers_507_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rule where no small volume can be mounted: the flush to disk fails as on a full
    volume (ENOSPC), injected into the agent's ``fsync``."""
    root = tmp_path / "staging"

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async with _client(root) as c:
        assert (await _put(c, "a.json", b"{}")).status_code == 200
        monkeypatch.setattr(agent_mod.os, "fsync", full)
        r = await _put(c, "b.json", b"[]")
        assert r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage"
    assert _leftovers(root) == []


async def test_a_hash_mismatch_removes_the_whole_upload(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    async with _client(root) as c:
        assert (await _put(c, "a.json", b"{}")).status_code == 200
        r = await _put(c, "b.json", b"[]", sha="0" * 64)
        assert r.status_code == 422 and r.json()["error"]["code"] == "hash_mismatch"
    assert _leftovers(root) == []


async def test_a_client_that_goes_away_mid_upload_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    app = make_app(root, TOKEN)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"x" * 4096, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(msg)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "PUT",
        "scheme": "http", "path": f"/v1/staging/{NAME}/files/w.safetensors", "raw_path": b"",
        "query_string": f"sha256={'1' * 64}&upload={UPLOAD}".encode(), "root_path": "",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-length", b"100000")],
        "client": ("127.0.0.1", 1), "server": ("agent", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert _leftovers(root) == []


def test_stale_uploads_are_swept_fresh_ones_kept(tmp_path: Path) -> None:
    root = tmp_path
    old = root / f".tmp-{NAME}-{'ab' * 8}"
    fresh = root / f".tmp-{NAME}-{'ef' * 8}"
    staged = root / NAME  # a committed copy is never an upload
    for d in (old, fresh, staged):
        d.mkdir()
        (d / "f.json").write_text("{}")
    two_hours_ago = time.time() - 7200
    for p in (old, old / "f.json", staged, staged / "f.json"):
        os.utime(p, (two_hours_ago, two_hours_ago))
    (fresh / "f.json").touch()
    assert sweep_stale_uploads(root, time.time() - 3600) == [old.name]
    assert sorted(p.name for p in root.iterdir()) == sorted([fresh.name, staged.name])


async def test_the_agent_sweeps_stale_uploads_when_written_to(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    root.mkdir()
    dead = root / f".tmp-{NAME}-{'ab' * 8}"
    dead.mkdir()
    (dead / "half.part").write_bytes(b"x" * 10)
    long_ago = time.time() - 2 * agent_mod.STALE_UPLOAD_S
    for p in (dead, dead / "half.part"):
        os.utime(p, (long_ago, long_ago))
    async with _client(root) as c:
        assert (await _put(c, "a.json", b"{}")).status_code == 200
    assert _leftovers(root) == [f".tmp-{NAME}-{UPLOAD}"]
