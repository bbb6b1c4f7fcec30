"""Artifact stores. CONTRACT (implemented in ``registry.storage.local`` and ``registry.storage.s3``)::

    class ArtifactStore(Protocol):
        scheme: str                      # "file" or "s3"
        def begin(self, adapter_id: str) -> PendingUpload
            # a new, invisible-until-commit location for one version's files
        def open_read(self, storage_uri: str, name: str) -> BinaryIO
            # stream a stored file (the router's stager reads through this)
        def delete_prefix(self, storage_uri: str) -> None
        # register-by-reference (callers check LORAPLANE_ALLOWED_SOURCES first, see registry.ingest):
        def list_source(self, source_uri: str) -> list[SourceEntry]   # files directly under the prefix
        def open_source(self, source_uri: str, name: str) -> BinaryIO
        def sweep(self, referenced, older_than_s) -> SweepReport
            # remove what failed or killed uploads left, older than the bound (registry.storage.sweeper
            # runs it at start-up and every LORAPLANE_STORAGE_SWEEP_INTERVAL_S)
        def close(self) -> None

    class PendingUpload(Protocol):
        storage_uri: str
        def writer(self, name: str) -> FileWriter
        def abort(self) -> None          # removes everything written so far (no object, no temp file;
                                         # S3 down: retried in the background until it is gone)
        def commit(self) -> None         # makes files final (no-op for S3 multipart, rename for local)

    class FileWriter(Protocol):          # hashes (sha256) and counts while streaming
        def write(self, chunk: bytes) -> None
        def close(self) -> FileInfo      # completes the object; returns name, size, sha256

See ``registry.storage.base`` for the Protocol definitions and ``make_store(settings)``.
"""

from registry.storage.base import (
    ArtifactStore,
    FileWriter,
    PendingUpload,
    SourceEntry,
    SweepReport,
    make_store,
)

__all__ = ["ArtifactStore", "FileWriter", "PendingUpload", "SourceEntry", "SweepReport", "make_store"]
