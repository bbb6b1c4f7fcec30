"""``ingest_hf``: import one version from a Hugging Face Hub repository (``hf://ORG/REPO@REV[/SUBDIR]``).

Through ``huggingface_hub`` (``HfApi.model_info`` with file metadata, ``hf_hub_url``, its shared
HTTP session, ``http_stream_backoff`` and ``hf_raise_for_status``):

1. the URI is parsed and checked against ``LORAPLANE_ALLOWED_SOURCES`` before anything is fetched
   (422 ``invalid_request`` / ``source_not_allowed``);
2. the revision is resolved **once** to its commit sha (``model_info``), with the file list and
   each file's size, LFS sha256 or git blob id; every file is then fetched at that sha, so a
   branch that moves during the import changes nothing;
3. the files directly in SUBDIR (or the repository root; dotfiles such as ``.gitattributes`` left
   out) stream into a pending upload exactly like an upload: the same inspector and validation,
   the store's streaming sha256, the size cap while streaming (and up front from the hub's sizes);
4. each file is checked against the hub's LFS sha256 (LFS files) or git blob sha1 (small files
   kept in git) and size; a mismatch is a problem of the 422 ``invalid_adapter`` answer.

Errors: unknown (or inaccessible) repository or revision → 422 ``revision_not_found``; hub
unreachable, timing out, answering 5xx/429 or refusing the token → 502 ``source_unavailable``.
On any failure the pending upload is aborted (no row, no object, no temp file).

``HF_ENDPOINT`` is honoured by the library; ``LORAPLANE_HF_ENDPOINT`` overrides it. The token is
``LORAPLANE_HF_TOKEN`` only (kept as a ``SecretStr``; never logged, never in an error).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from kit.errors import InvalidRequest, LoraplaneError
from registry.ingest.common import BATCH_BYTES, IngestResult, Inspector, copy_and_validate, too_large
from registry.ingest.hf_uri import HfRef, check_hf_uri
from registry.storage.base import ArtifactStore, PendingUpload
from registry.validation import BaseModelSpec, check_filename

if TYPE_CHECKING:
    from huggingface_hub import HfApi

    from registry.settings import RegistrySettings

_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DOWNLOAD_RETRIES = 2  # per file, on connection errors and 429/5xx (0.5 s, then 1 s apart)


class RevisionNotFound(InvalidRequest):
    """422 ``revision_not_found``: the repository or revision does not exist (or is not visible)."""

    code = "revision_not_found"


class SourceUnavailable(LoraplaneError):
    """502 ``source_unavailable``: the hub could not be reached or failed to answer."""

    status = 502
    code = "source_unavailable"


@dataclass(frozen=True)
class HubOptions:
    endpoint: str | None = None  # None: the library's (HF_ENDPOINT, else huggingface.co)
    token: SecretStr | None = None
    timeout_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: RegistrySettings) -> HubOptions:
        return cls(endpoint=settings.hf_endpoint, token=settings.hf_token, timeout_s=settings.hf_timeout_s)


@dataclass(frozen=True)
class HubFile:
    name: str  # artifact file name (last path segment)
    path: str  # path in the repository
    size: int | None
    lfs_sha256: str | None
    git_blob_id: str | None  # for files kept in git (not LFS)


@dataclass(frozen=True)
class HubSnapshot:
    sha: str
    files: list[HubFile]


def _endpoint_name(api: HfApi) -> str:
    """The hub's URL as shown in errors: scheme, host, port and path, never a user or password."""
    parts = urlsplit(str(api.endpoint))
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _translate(exc: BaseException, ref: HfRef, api: HfApi, *, resolving: bool) -> LoraplaneError | None:
    """Our error for a library/transport error (None: not a hub error, let it through)."""
    import httpx2
    from huggingface_hub.errors import (
        DisabledRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = {"source_uri": ref.uri, "endpoint": _endpoint_name(api)}
    if resolving and isinstance(exc, RevisionNotFoundError):
        details = {**where, "revision": ref.revision}
        return RevisionNotFound(f"revision {ref.revision!r} not found in {ref.repo_uri}", details=details)
    if resolving and isinstance(exc, RepositoryNotFoundError | DisabledRepoError):
        return RevisionNotFound(
            f"repository {ref.repo_id!r} not found on the hub (or it is private or gated and "
            "LORAPLANE_HF_TOKEN gives no access to it)",
            details=where,
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        what = "refused the request" if status in (401, 403) else "failed"
        return SourceUnavailable(
            f"the Hugging Face Hub {what} (HTTP {status}) while importing {ref.uri}",
            details={**where, "hub_status": status},
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return SourceUnavailable("HF_HUB_OFFLINE is set: the hub is not contacted", details=where)
    if isinstance(exc, httpx2.HTTPError | httpx2.StreamError | TimeoutError | ConnectionError):
        return SourceUnavailable(
            f"the Hugging Face Hub could not be reached ({type(exc).__name__}) while importing {ref.uri}",
            details=where,
        )
    return None


class HubClient:
    """The few hub calls an import makes, with library errors translated at this boundary."""

    def __init__(self, options: HubOptions) -> None:
        from huggingface_hub import HfApi

        self.options = options
        token: str | bool = options.token.get_secret_value() if options.token is not None else False
        self.api = HfApi(endpoint=options.endpoint or None, token=token, library_name="loraplane")
        self._token = token

    def _headers(self) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers(token=self._token, library_name="loraplane")

    def resolve(self, ref: HfRef) -> HubSnapshot:
        """The commit the revision points at now, and the files directly in ``ref.subdir``."""
        try:
            info = self.api.model_info(
                ref.repo_id, revision=ref.revision, files_metadata=True, timeout=self.options.timeout_s
            )
        except Exception as e:
            err = _translate(e, ref, self.api, resolving=True)
            if err is None:
                raise
            raise err from None
        sha = str(info.sha or "").lower()
        if not _SHA1_RE.match(sha) or info.siblings is None:
            raise SourceUnavailable(
                f"the Hugging Face Hub did not name the commit and files of {ref.uri}",
                details={"source_uri": ref.uri, "endpoint": _endpoint_name(self.api)},
            )
        asked = ref.revision.lower()
        if _SHA1_RE.match(asked) and asked != sha:
            raise SourceUnavailable(
                f"the Hugging Face Hub answered commit {sha} for revision {ref.revision}",
                details={"source_uri": ref.uri, "endpoint": _endpoint_name(self.api)},
            )
        prefix = f"{ref.subdir}/" if ref.subdir else ""
        files: list[HubFile] = []
        for s in info.siblings:
            path = s.rfilename
            if not path.startswith(prefix):
                continue
            name = path[len(prefix) :]
            if not name or "/" in name or name.startswith("."):
                continue  # nested directories, and git metadata such as .gitattributes
            lfs = s.lfs.sha256.lower() if s.lfs is not None and s.lfs.sha256 else None
            blob = s.blob_id.lower() if lfs is None and s.blob_id else None
            files.append(
                HubFile(
                    name=name,
                    path=path,
                    size=int(s.size) if s.size is not None else None,
                    lfs_sha256=lfs if lfs and _SHA256_RE.match(lfs) else None,
                    git_blob_id=blob if blob and _SHA1_RE.match(blob) else None,
                )
            )
        return HubSnapshot(sha=sha, files=sorted(files, key=lambda f: f.name))

    @contextmanager
    def open(self, ref: HfRef, sha: str, file: HubFile) -> Iterator[Iterator[bytes]]:
        """The file's bytes at commit ``sha``, in chunks (hub errors translated)."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

        url = hf_hub_url(ref.repo_id, file.path, revision=sha, endpoint=self.options.endpoint or None)
        try:
            with http_stream_backoff(
                "GET",
                url,
                headers=self._headers(),
                timeout=self.options.timeout_s,
                max_retries=DOWNLOAD_RETRIES,
                base_wait_time=0.5,
                max_wait_time=1.0,
            ) as response:
                hf_raise_for_status(response)
                yield self._chunks(ref, response)
        except Exception as e:
            err = _translate(e, ref, self.api, resolving=False)
            if err is None:
                raise
            raise err from None

    def _chunks(self, ref: HfRef, response: Any) -> Iterator[bytes]:
        it = response.iter_bytes(BATCH_BYTES)
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                return
            except Exception as e:
                err = _translate(e, ref, self.api, resolving=False)
                if err is None:
                    raise
                raise err from None
            if chunk:
                yield chunk


def _copy_files(
    hub: HubClient,
    ref: HfRef,
    snap: HubSnapshot,
    files: list[HubFile],
    pending: PendingUpload,
    insp: Inspector,
    cancel: threading.Event,
) -> None:
    for f in files:
        insp.start_file(f.name)
        w = pending.writer(f.name)
        git = None
        if f.git_blob_id is not None and f.size is not None:
            git = hashlib.sha1(b"blob %d\0" % f.size)  # git's blob id: sha1 of header + content
        with hub.open(ref, snap.sha, f) as chunks:
            for chunk in chunks:
                if cancel.is_set():
                    raise asyncio.CancelledError()
                insp.count(len(chunk))
                insp.inspect(f.name, chunk)
                if git is not None:
                    git.update(chunk)
                w.write(chunk)
        info = w.close()
        insp.files.append(info)
        where = f"{f.path} at {snap.sha[:12]}"
        if f.size is not None and info.size != f.size:
            insp.problems.append(f"{f.name}: {info.size} bytes arrived, the hub lists {f.size} ({where})")
        elif f.lfs_sha256 is not None and info.sha256 != f.lfs_sha256:
            insp.problems.append(
                f"{f.name}: sha256 {info.sha256} does not match the hub's LFS sha256 {f.lfs_sha256} "
                f"({where}): the file was altered or corrupted on the way"
            )
        elif git is not None and git.hexdigest() != f.git_blob_id:
            insp.problems.append(
                f"{f.name}: content does not match the hub's git blob id {f.git_blob_id} ({where}): "
                "the file was altered or corrupted on the way"
            )


async def ingest_hf(
    source_uri: str,
    *,
    allowed_sources: list[str],
    hub: HubOptions,
    store: ArtifactStore,
    adapter_id: str,
    base: BaseModelSpec,
    max_bytes: int,
) -> IngestResult:
    """Import the files of an allowed ``hf://`` reference into a new pending version (module doc)."""
    ref = check_hf_uri(source_uri, allowed_sources)
    client = await asyncio.to_thread(HubClient, hub)
    snap = await asyncio.to_thread(client.resolve, ref)
    if sum(f.size or 0 for f in snap.files) > max_bytes:
        raise too_large(max_bytes)
    insp = Inspector(max_bytes)
    files: list[HubFile] = []
    for f in snap.files:
        problem = check_filename(f.name)
        if problem:
            insp.problems.append(f"hub file {f.path!r}: {problem}")
        else:
            files.append(f)
    if not snap.files:
        where = f"directory {ref.subdir!r}" if ref.subdir else "the repository root"
        insp.problems.append(f"{ref.uri}: no files in {where} at commit {snap.sha}")
    pending = await asyncio.to_thread(store.begin, adapter_id)
    checked = await copy_and_validate(
        pending, lambda cancel: _copy_files(client, ref, snap, files, pending, insp, cancel), insp, base
    )
    return IngestResult(
        pending=pending,
        files=list(insp.files),
        rank=checked.rank,
        lora_alpha=checked.lora_alpha,
        target_modules=checked.target_modules,
        source_uri=ref.uri,
        source_revision=snap.sha,
    )
