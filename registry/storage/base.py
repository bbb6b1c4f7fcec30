"""Artifact store Protocols, ``make_store(settings)``, and shared helpers.

An :class:`ArtifactStore` holds the files of adapter versions under a storage URI per
version (``file:///abs/dir/`` or ``s3://bucket/prefix/…/``). Writing goes through a
:class:`PendingUpload`: files written there are invisible to the registry until the caller
records the version, and ``abort()`` removes every byte written (no object, no temp file).

Stores also read *sources* for register-by-reference (``list_source`` / ``open_source``);
callers must check the source URI against ``LORAPLANE_ALLOWED_SOURCES`` first
(``registry.ingest`` does).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from kit.errors import InvalidRequest, NotFound
from registry.snapshot import FileInfo

if TYPE_CHECKING:
    from registry.settings import RegistrySettings

__all__ = [
    "ArtifactStore",
    "FileWriter",
    "HashingCounter",
    "PendingUpload",
    "SourceEntry",
    "SweepReport",
    "file_uri_to_path",
    "list_file_source",
    "make_store",
    "open_file_source",
]

READ_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One file found under a source prefix (register-by-reference)."""

    name: str
    size: int


@dataclass
class SweepReport:
    """What one orphan sweep removed (``ArtifactStore.sweep``)."""

    prefixes_deleted: list[str] = field(default_factory=list)  # storage URIs of orphan versions
    objects_deleted: int = 0
    uploads_aborted: int = 0  # unfinished S3 multipart uploads (local: abandoned pending dirs)


@runtime_checkable
class FileWriter(Protocol):
    """Hashes (sha256) and counts while streaming one file into a pending upload."""

    name: str

    def write(self, chunk: bytes) -> None: ...

    def close(self) -> FileInfo:
        """Complete the file; returns its name, size and sha256."""
        ...


@runtime_checkable
class PendingUpload(Protocol):
    storage_uri: str

    def writer(self, name: str) -> FileWriter: ...

    def abort(self) -> None:
        """Remove everything written so far (no object, no temp file). Safe to call twice,
        and after ``commit()`` (then it deletes the committed files too)."""
        ...

    def commit(self) -> None:
        """Make the files final (rename for local, nothing left to do for S3)."""
        ...


@runtime_checkable
class ArtifactStore(Protocol):
    scheme: str  # "file" or "s3"

    def begin(self, adapter_id: str) -> PendingUpload:
        """A new, invisible-until-commit location for one version's files."""
        ...

    def open_read(self, storage_uri: str, name: str) -> BinaryIO:
        """Stream a stored file (NotFound if missing)."""
        ...

    def delete_prefix(self, storage_uri: str) -> None:
        """Delete a version's files (idempotent)."""
        ...

    def list_source(self, source_uri: str) -> list[SourceEntry]:
        """Files directly under a source prefix (``s3://…/`` or ``file:///…/``)."""
        ...

    def open_source(self, source_uri: str, name: str) -> BinaryIO:
        """Stream one file of a source prefix."""
        ...

    def sweep(self, referenced: Callable[[list[str]], set[str]], older_than_s: float) -> SweepReport:
        """Remove what failed uploads left behind, older than ``older_than_s``: unfinished
        uploads, and version locations no version row names (``referenced`` maps storage URIs
        to those a row holds). Uploads open in this process are kept whatever their age."""
        ...

    def close(self) -> None:
        """Release threads and clients (pending cleanups are left to the next sweep)."""
        ...


def make_store(settings: RegistrySettings) -> ArtifactStore:
    """S3 when ``s3_bucket`` is set, else a local directory (``resolved_artifact_dir()``)."""
    if settings.s3_bucket:
        from registry.storage.s3 import S3ArtifactStore

        return S3ArtifactStore.from_settings(settings)
    from registry.storage.local import LocalArtifactStore

    return LocalArtifactStore.from_settings(settings)


class HashingCounter:
    """sha256 + byte count of a stream, fed chunk by chunk."""

    __slots__ = ("_h", "size")

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.size = 0

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self._h.update(chunk)
        self.size += len(chunk)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


# --------------------------------------------------------------------------- file:// sources


def file_uri_to_path(uri: str) -> Path:
    """``file:///abs/dir/`` → ``Path('/abs/dir')``; refuses hosts, queries, relative paths."""
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise InvalidRequest(f"not a file:// URI: {uri!r}")
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise InvalidRequest(f"file URI must be file:///absolute/path/, got {uri!r}")
    path = unquote(parts.path)
    if not path.startswith("/") or "\x00" in path:
        raise InvalidRequest(f"file URI must hold an absolute path, got {uri!r}")
    return Path(path)


def list_file_source(source_uri: str) -> list[SourceEntry]:
    """Regular files directly inside a ``file://`` directory (symlinks and sub-directories are
    not followed)."""
    root = file_uri_to_path(source_uri)
    try:
        entries = []
        with os.scandir(root) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    entries.append(SourceEntry(e.name, e.stat(follow_symlinks=False).st_size))
    except FileNotFoundError as e:
        raise NotFound(f"source {source_uri!r} does not exist", code="source_not_found") from e
    except NotADirectoryError as e:
        raise InvalidRequest(f"source {source_uri!r} is not a directory") from e
    except PermissionError as e:
        raise InvalidRequest(f"source {source_uri!r} cannot be read") from e
    return sorted(entries, key=lambda s: s.name)


def open_file_source(source_uri: str, name: str) -> BinaryIO:
    """Open one regular file of a ``file://`` source without following symlinks."""
    if "/" in name or name in ("", ".", ".."):
        raise InvalidRequest(f"bad source file name {name!r}")
    path = file_uri_to_path(source_uri) / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as e:
        raise NotFound(f"source file {name!r} vanished from {source_uri!r}", code="source_not_found") from e
    except OSError as e:
        raise InvalidRequest(f"source file {name!r} cannot be opened: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidRequest(f"source file {name!r} is not a regular file")
    return os.fdopen(fd, "rb")
