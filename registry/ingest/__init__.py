"""Streaming ingest of one adapter version: multipart upload or register-by-reference.

``ingest_multipart`` parses ``multipart/form-data`` straight off ``request.stream()`` with
its own streaming parser (``registry.ingest.formdata``; no ``request.form()``, no temp files,
no whole-file buffering): every part goes through a
:class:`~registry.storage.base.FileWriter` (sha256 + size on the way, blocking store calls in
a worker thread, one batch in flight while the next is received), the weights part through
the safetensors header parser, and ``adapter_config.json`` is kept (≤ 1 MiB).
``ingest_source`` copies the files of an allowed ``s3://`` / ``file://`` prefix into the
store the same way, so later edits of the source cannot change the version; for an allowed
``hf://ORG/REPO@REVISION[/SUBDIR]`` it imports from the Hugging Face Hub
(``registry.ingest.hf``: revision pinned to its commit, LFS sha256 checked).

Both return an :class:`IngestResult` whose ``pending`` upload the caller must ``commit()``
(after recording the version) or ``abort()``. On any failure — validation, size cap,
client disconnect, storage error, cancellation — they abort the pending upload themselves
before raising: nothing is left behind.
"""

from registry.ingest.common import IngestResult, abort_pending
from registry.ingest.hf import HubOptions, RevisionNotFound, SourceUnavailable
from registry.ingest.hf_uri import SourceNotAllowed, check_hf_uri
from registry.ingest.multipart import ingest_multipart
from registry.ingest.source import check_source_uri, ingest_source

__all__ = [
    "HubOptions",
    "IngestResult",
    "RevisionNotFound",
    "SourceNotAllowed",
    "SourceUnavailable",
    "abort_pending",
    "check_hf_uri",
    "check_source_uri",
    "ingest_multipart",
    "ingest_source",
]
