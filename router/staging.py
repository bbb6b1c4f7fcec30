"""Staging with verification: artifact store → staging directory the replica reads.

Local mode (a directory shared with the replicas): every file of a version is streamed from
the ``ArtifactStore`` into ``<root>/.tmp-<lora_name>-<random>/``, hashed while written, checked
against the registry's sha256, and only then the directory is renamed to
``<root>/<lora_name>/``. Before EVERY load the staged copy is re-hashed (SPEC §10); a staged
copy that no longer matches is thrown away and staged again; a stored object that does not
match raises :class:`HashMismatch` (no load happens). A write that fails (the staging
filesystem full, read-only…) removes the temporary directory and raises :class:`StagingError`:
the load fails with the designed 503 (SPEC §15's fallback applies), nothing half-written is
ever renamed into place.

Agent mode: the same, but the bytes go to ``loraplane agent`` beside the replica (see
``router.agent``), which verifies on its side too and renames into its volume.

The ``lora_path`` handed to the engine is always resolved and checked to lie inside the
staging root.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, Protocol

import aiohttp
import orjson

from registry.snapshot import VersionInfo
from router.replica import LORA_NAME_RE

CHUNK = 1024 * 1024
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ReadableStore(Protocol):
    """The part of ``registry.storage``'s ``ArtifactStore`` the stager needs."""

    def open_read(self, storage_uri: str, name: str) -> BinaryIO: ...


class StagingError(Exception):
    """Staging failed for a reason other than a hash mismatch (store unreachable, disk full…)."""


class HashMismatch(StagingError):
    def __init__(self, file: str, expected: str, actual: str) -> None:
        super().__init__(f"sha256 mismatch for {file}: expected {expected}, got {actual}")
        self.file = file
        self.expected = expected
        self.actual = actual


def check_names(version: VersionInfo) -> None:
    if not LORA_NAME_RE.match(version.lora_name):
        raise StagingError(f"refusing to stage: bad lora_name {version.lora_name!r}")
    for f in version.files:
        if not FILE_NAME_RE.match(f.name) or ".." in f.name:
            raise StagingError(f"refusing to stage: bad file name {f.name!r}")


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved; raises StagingError unless it lies strictly inside ``root``."""
    root_r = root.resolve()
    p = path.resolve()
    if p == root_r or not p.is_relative_to(root_r):
        raise StagingError(f"path {p} is outside the staging directory {root_r}")
    return p


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Stager(Protocol):
    async def stage(self, replica_url: str, host: str, version: VersionInfo) -> str:
        """Make the verified files available to the replica; return the ``lora_path``."""
        ...

    async def remove(self, host: str, lora_name: str) -> None: ...


class LocalStager:
    """Stages into a directory the replicas share with the router."""

    def __init__(self, root: Path, store: ReadableStore) -> None:
        self.root = root.resolve()
        self._store = store
        self._locks: dict[str, asyncio.Lock] = {}

    def path_for(self, lora_name: str) -> Path:
        return inside(self.root, self.root / lora_name)

    async def stage(self, replica_url: str, host: str, version: VersionInfo) -> str:
        check_names(version)
        lock = self._locks.setdefault(version.lora_name, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self._stage_sync, version)

    def _verify_existing(self, final: Path, version: VersionInfo) -> bool:
        for f in version.files:
            p = final / f.name
            if not p.is_file() or p.is_symlink() or _hash_file(p) != f.sha256:
                return False
        return True

    def _stage_sync(self, version: VersionInfo) -> str:
        try:
            return self._stage_files(version)
        except OSError as exc:  # this side's filesystem: full, read-only, over quota, gone
            raise StagingError(f"cannot write to the staging directory {self.root}: {exc}") from exc

    def _stage_files(self, version: VersionInfo) -> str:
        final = self.path_for(version.lora_name)
        if final.is_dir() and not final.is_symlink():
            if self._verify_existing(final, version):
                return str(final)
            shutil.rmtree(final, ignore_errors=True)  # staged copy changed on disk: stage again
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = inside(self.root, self.root / f".tmp-{version.lora_name}-{uuid.uuid4().hex[:12]}")
        tmp.mkdir()
        try:
            for f in version.files:
                h = hashlib.sha256()
                try:
                    src = self._store.open_read(version.storage_uri, f.name)
                except Exception as exc:  # translate the store's errors at this boundary
                    raise StagingError(f"cannot read {f.name} from the artifact store: {exc}") from exc
                with src, open(tmp / f.name, "wb") as out:
                    while True:
                        try:
                            chunk = src.read(CHUNK)
                        except Exception as exc:
                            raise StagingError(f"reading {f.name} failed: {exc}") from exc
                        if not chunk:
                            break
                        h.update(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                actual = h.hexdigest()
                if actual != f.sha256:
                    raise HashMismatch(f.name, f.sha256, actual)
            try:
                os.rename(tmp, final)
            except OSError:
                # Another process staged it meanwhile: keep theirs if it verifies.
                if not self._verify_existing(final, version):
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(tmp, final)
            return str(self.path_for(version.lora_name))
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    async def remove(self, host: str, lora_name: str) -> None:
        if not LORA_NAME_RE.match(lora_name):
            return
        path = self.path_for(lora_name)
        async with self._locks.setdefault(lora_name, asyncio.Lock()):  # never under a staging
            await asyncio.to_thread(shutil.rmtree, path, True)


class AgentStager:
    """Stages through ``loraplane agent`` running beside each replica (one per host)."""

    def __init__(
        self,
        url_template: str,
        token: str | None,
        store: ReadableStore,
        session: aiohttp.ClientSession,
        *,
        replica_dir: Path | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self._template = url_template
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._store = store
        self._session = session
        self._replica_dir = replica_dir
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def agent_url(self, host: str) -> str:
        return self._template.format(host=host).rstrip("/")

    async def _request(self, method: str, url: str, **kw: object) -> tuple[int, bytes]:
        try:
            async with self._session.request(
                method,
                url,
                headers=self._headers,
                timeout=self._timeout,
                **kw,  # type: ignore[arg-type]
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise StagingError(f"agent {method} {url}: {type(exc).__name__}: {exc}") from exc

    async def _file_chunks(
        self, version: VersionInfo, name: str, hasher: hashlib._Hash
    ) -> AsyncIterator[bytes]:
        try:
            src = await asyncio.to_thread(self._store.open_read, version.storage_uri, name)
        except Exception as exc:
            raise StagingError(f"cannot read {name} from the artifact store: {exc}") from exc
        try:
            while True:
                chunk = await asyncio.to_thread(src.read, CHUNK)
                if not chunk:
                    break
                hasher.update(chunk)
                yield chunk
        finally:
            await asyncio.to_thread(src.close)

    def _check_path(self, path: str, agent_root: str, lora_name: str) -> str:
        root = Path(self._replica_dir) if self._replica_dir else Path(agent_root)
        p = Path(path)
        # The path is the replica's view; check it lexically (it may not exist on this host).
        norm = Path(os.path.normpath(p))
        if (
            not p.is_absolute()
            or norm != p
            or norm.parent != Path(os.path.normpath(root))
            or norm.name != lora_name
        ):
            raise StagingError(f"agent returned a path outside its staging directory: {path}")
        return str(norm)

    async def stage(self, replica_url: str, host: str, version: VersionInfo) -> str:
        check_names(version)
        base = self.agent_url(host)
        lock = self._locks.setdefault((base, version.lora_name), asyncio.Lock())
        async with lock:
            manifest = {"files": [{"name": f.name, "sha256": f.sha256} for f in version.files]}
            # Re-verify an already staged copy (the agent re-hashes it) before every load.
            status, body = await self._request(
                "POST", f"{base}/v1/staging/{version.lora_name}/verify", data=orjson.dumps(manifest)
            )
            if status == 200:
                info = orjson.loads(body)
                return self._check_path(str(info["path"]), str(info["root"]), version.lora_name)
            upload = uuid.uuid4().hex
            for f in version.files:
                h = hashlib.sha256()
                status, body = await self._request(
                    "PUT",
                    f"{base}/v1/staging/{version.lora_name}/files/{f.name}",
                    data=self._file_chunks(version, f.name, h),
                    params={"sha256": f.sha256, "upload": upload},
                )
                actual = h.hexdigest()
                if actual != f.sha256:
                    raise HashMismatch(f.name, f.sha256, actual)
                if status == 422:
                    info = orjson.loads(body)
                    raise HashMismatch(f.name, f.sha256, str(info.get("actual", "")))
                if status != 200:
                    raise StagingError(f"agent refused {f.name}: HTTP {status} {body[:200]!r}")
            status, body = await self._request(
                "POST",
                f"{base}/v1/staging/{version.lora_name}/commit",
                data=orjson.dumps(manifest),
                params={"upload": upload},
            )
            if status != 200:
                raise StagingError(f"agent commit failed: HTTP {status} {body[:200]!r}")
            info = orjson.loads(body)
            return self._check_path(str(info["path"]), str(info["root"]), version.lora_name)

    async def remove(self, host: str, lora_name: str) -> None:
        if not LORA_NAME_RE.match(lora_name):
            return
        with contextlib.suppress(StagingError):
            await self._request("DELETE", f"{self.agent_url(host)}/v1/staging/{lora_name}")


StagerFactory = Callable[[str], Stager]
