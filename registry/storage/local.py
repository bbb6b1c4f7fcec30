"""Local-directory artifact store (the embedded default).

Layout under the artifact directory::

    .pending/<uuid>/<name>              files being written (hidden, removed on abort)
    adapters/<adapter_id>/<uuid>/<name> committed versions; storage_uri file:///…/<uuid>/

``commit()`` renames the pending directory into place (atomic on one filesystem), so a
version's directory either holds all its files or does not exist. ``s3://`` sources for
register-by-reference are read with an S3 client built from the same settings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from kit.errors import InvalidRequest, NotFound, Unavailable
from registry.snapshot import FileInfo
from registry.storage.base import (
    HashingCounter,
    SourceEntry,
    SweepReport,
    file_uri_to_path,
    list_file_source,
    open_file_source,
)
from registry.validation import check_filename

if TYPE_CHECKING:
    from registry.settings import RegistrySettings
    from registry.storage.s3 import S3SourceReader

PENDING_DIR = ".pending"
ADAPTERS_DIR = "adapters"


class LocalFileWriter:
    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self._path = path
        self._f: BinaryIO | None = open(path, "xb")  # noqa: SIM115 - closed in close()/abort
        self._hc = HashingCounter()
        self._info: FileInfo | None = None

    def write(self, chunk: bytes) -> None:
        if self._f is None:
            raise RuntimeError(f"write to closed file {self.name!r}")
        self._hc.update(chunk)
        try:
            self._f.write(chunk)
        except OSError as e:
            raise _write_failed(e) from e

    def close(self) -> FileInfo:
        if self._info is not None:
            return self._info
        if self._f is None:
            raise RuntimeError(f"file {self.name!r} was aborted")
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        except OSError as e:
            raise _write_failed(e) from e
        finally:
            self._f = None
        self._info = FileInfo(name=self.name, size=self._hc.size, sha256=self._hc.hexdigest())
        return self._info

    def _discard(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class LocalPendingUpload:
    def __init__(self, root: Path, adapter_id: str, on_done: Callable[[Path], None] | None = None) -> None:
        token = uuid.uuid4().hex
        self._on_done = on_done
        self._tmp = root / PENDING_DIR / token
        self._final = root / ADAPTERS_DIR / adapter_id / token
        self._tmp.mkdir(parents=True)
        self.storage_uri = self._final.as_uri() + "/"
        self._writers: dict[str, LocalFileWriter] = {}
        self._state = "open"

    def writer(self, name: str) -> LocalFileWriter:
        if self._state != "open":
            raise RuntimeError(f"pending upload is {self._state}")
        problem = check_filename(name)
        if problem:
            raise InvalidRequest(problem)
        if name in self._writers:
            raise InvalidRequest(f"file {name!r} written twice")
        w = LocalFileWriter(self._tmp / name, name)
        self._writers[name] = w
        return w

    def commit(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"pending upload is {self._state}")
        for w in self._writers.values():
            w.close()
        self._final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self._tmp, self._final)
        _fsync_dir(self._final.parent)
        self._state = "committed"
        if self._on_done is not None:
            self._on_done(self._tmp)

    def abort(self) -> None:
        for w in self._writers.values():
            w._discard()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._state == "committed":
            shutil.rmtree(self._final, ignore_errors=True)
        self._state = "aborted"
        if self._on_done is not None:
            self._on_done(self._tmp)


class LocalArtifactStore:
    scheme = "file"

    def __init__(self, root: Path, *, s3_sources: Callable[[], S3SourceReader] | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._s3_factory = s3_sources
        self._s3: S3SourceReader | None = None
        self._live: set[Path] = set()  # pending directories of this process's open uploads
        self._live_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: RegistrySettings) -> LocalArtifactStore:
        def s3_sources() -> S3SourceReader:
            from registry.storage.s3 import S3SourceReader, make_s3_client

            return S3SourceReader(make_s3_client(settings))

        return cls(settings.resolved_artifact_dir(), s3_sources=s3_sources)

    @property
    def pending_dir(self) -> Path:
        return self.root / PENDING_DIR

    def begin(self, adapter_id: str) -> LocalPendingUpload:
        if "/" in adapter_id or adapter_id in ("", ".", "..") or ".." in adapter_id:
            raise InvalidRequest(f"bad adapter id {adapter_id!r}")
        pending = LocalPendingUpload(self.root, adapter_id, on_done=self._forget)
        with self._live_lock:
            self._live.add(pending._tmp)
        return pending

    def _forget(self, tmp: Path) -> None:
        with self._live_lock:
            self._live.discard(tmp)

    def close(self) -> None:
        """Nothing to release (the Protocol's ``close``)."""

    def sweep(self, referenced: Callable[[list[str]], set[str]], older_than_s: float) -> SweepReport:
        """Remove pending directories a killed process left and version directories no row names,
        once untouched for ``older_than_s``."""
        now = time.time()
        with self._live_lock:
            live = set(self._live)
        report = SweepReport()

        def old(path: Path) -> bool:
            with contextlib.suppress(OSError):
                return now - path.stat().st_mtime >= older_than_s
            return False

        for d in _subdirs(self.pending_dir):
            if d not in live and old(d):
                shutil.rmtree(d, ignore_errors=True)
                report.uploads_aborted += 1
        versions = [v for a in _subdirs(self.root / ADAPTERS_DIR) for v in _subdirs(a) if old(v)]
        for i in range(0, len(versions), 500):
            uris = {v.as_uri() + "/": v for v in versions[i : i + 500]}
            kept = referenced(list(uris))
            for uri, v in uris.items():
                if uri not in kept:
                    report.objects_deleted += sum(1 for p in v.iterdir() if p.is_file())
                    shutil.rmtree(v, ignore_errors=True)
                    report.prefixes_deleted.append(uri)
        return report

    def _version_dir(self, storage_uri: str) -> Path:
        path = file_uri_to_path(storage_uri)
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root / ADAPTERS_DIR) or ".." in path.parts:
            raise InvalidRequest(f"storage URI {storage_uri!r} is not inside this artifact store")
        return resolved

    def open_read(self, storage_uri: str, name: str) -> BinaryIO:
        problem = check_filename(name)
        if problem:
            raise InvalidRequest(problem)
        path = self._version_dir(storage_uri) / name
        try:
            return open(path, "rb")
        except FileNotFoundError as e:
            raise NotFound(f"artifact {name!r} not found at {storage_uri}", code="artifact_not_found") from e

    def delete_prefix(self, storage_uri: str) -> None:
        shutil.rmtree(self._version_dir(storage_uri), ignore_errors=True)

    def list_source(self, source_uri: str) -> list[SourceEntry]:
        if source_uri.startswith("file:"):
            return list_file_source(source_uri)
        return self._s3_reader().list_source(source_uri)

    def open_source(self, source_uri: str, name: str) -> BinaryIO:
        if source_uri.startswith("file:"):
            return open_file_source(source_uri, name)
        return self._s3_reader().open_source(source_uri, name)

    def _s3_reader(self) -> S3SourceReader:
        if self._s3 is None:
            if self._s3_factory is None:
                raise InvalidRequest("this registry cannot read s3:// sources (no S3 settings)")
            self._s3 = self._s3_factory()
        return self._s3


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _write_failed(e: OSError) -> Unavailable:
    return Unavailable(f"artifact directory write failed: {e.strerror}", code="storage_unavailable")


def _fsync_dir(path: Path) -> None:
    fd: Any = None
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)
