"""A small typed HTTP client of the admin API (SPEC §5, §13), used by the CLI, `up --demo` and tests.

It speaks only HTTP: it never imports registry services. Every error answer of the API
(``{"error": {"code", "message", "details"}}``) is raised as :class:`AdminAPIError`; a server
that cannot be reached at all raises :class:`AdminUnreachable`. httpx exceptions never leak.

Uploads stream every file of an adapter directory from disk in chunks, as one
``multipart/form-data`` body with one part per file, every part named ``files``; the total
``Content-Length`` is computed up front, and an optional ``progress(n_bytes)`` callback is
called as bytes go out. Text form fields (``quality_gate``) go first, before the files.

Example::

    with AdminClient("http://127.0.0.1:8081", token="…") as admin:
        admin.create_base_model(**demo_base_model())
        admin.create_adapter("support-bot", base_model="demo-base")
        version = admin.upload_version("support-bot", "./my-adapter")
        admin.promote("support-bot", version["version"])

        # with a quality gate: promotion waits for a passing eval (or force=True)
        v = admin.upload_version("support-bot", "./next", quality_gate="pending")["version"]
        admin.set_quality_gate("support-bot", v, "passed", details={"accuracy": 0.91})
        admin.promote("support-bot", v)
"""

from __future__ import annotations

import functools
import json
import mimetypes
import os
import secrets
import ssl
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from registry.admin_client_governance import GovernanceCalls
from registry.admin_client_quality import QualityCalls

API_PREFIX = "/admin/v1"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8081"
UPLOAD_CHUNK_BYTES = 1024 * 1024

JSON = dict[str, Any]
ProgressCallback = Callable[[int], None]


class AdminAPIError(Exception):
    """An error answer of the admin API: HTTP ``status``, ``code``, ``message``, ``details``."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    @property
    def problems(self) -> list[str]:
        """``details.problems`` of an ``invalid_adapter`` answer (else empty)."""
        if isinstance(self.details, dict):
            probs = self.details.get("problems")
            if isinstance(probs, list):
                return [str(p) for p in probs]
        return []


class AdminUnreachable(Exception):
    """The admin API could not be reached (connection refused, DNS, timeout)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the admin API at {url} ({reason})")
        self.url = url
        self.reason = reason


def adapter_files(directory: str | Path) -> list[Path]:
    """The regular, non-hidden files directly inside ``directory``, sorted by name."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d} is not a directory")
    return sorted(
        (p for p in d.iterdir() if not p.name.startswith(".") and p.is_file() and not p.is_symlink()),
        key=lambda p: p.name,
    )


class MultipartUpload:
    """A streaming ``multipart/form-data`` body of files, all parts named ``files``, after the
    text form ``fields`` (if any; e.g. ``{"quality_gate": "pending"}``).

    ``len(upload)`` is the exact body size (for ``Content-Length``); iterating reads each file
    from disk in ``chunk_bytes`` chunks and calls ``progress`` with the file bytes sent.
    """

    def __init__(
        self,
        files: list[Path],
        *,
        progress: ProgressCallback | None = None,
        chunk_bytes: int = UPLOAD_CHUNK_BYTES,
        boundary: str | None = None,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        self.files = files
        self.progress = progress
        self.chunk_bytes = chunk_bytes
        self.boundary = boundary or f"loraplane-{secrets.token_hex(16)}"
        self._fields = b"".join(self._field_part(k, v) for k, v in (fields or {}).items())
        self._heads = [self._part_head(p) for p in files]
        self._sizes = [p.stat().st_size for p in files]
        self._tail = f"--{self.boundary}--\r\n".encode()

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    @property
    def file_bytes(self) -> int:
        """Total size of the files (what a progress bar counts)."""
        return sum(self._sizes)

    def __len__(self) -> int:
        parts = sum(len(h) + s + 2 for h, s in zip(self._heads, self._sizes, strict=True))
        return len(self._fields) + parts + len(self._tail)

    def _field_part(self, name: str, value: str) -> bytes:
        safe = name.replace('"', "%22").replace("\r", "").replace("\n", "")
        return (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{safe}"\r\n\r\n{value}\r\n'
        ).encode()

    def _part_head(self, path: Path) -> bytes:
        name = path.name.replace('"', "%22").replace("\r", "").replace("\n", "")
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return (
            f"--{self.boundary}\r\n"
            f'Content-Disposition: form-data; name="files"; filename="{name}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n"
        ).encode()

    def __iter__(self) -> Iterator[bytes]:
        if self._fields:
            yield self._fields
        for path, head, size in zip(self.files, self._heads, self._sizes, strict=True):
            yield head
            sent = 0
            with open(path, "rb") as f:
                while sent < size:
                    chunk = f.read(min(self.chunk_bytes, size - sent))
                    if not chunk:
                        raise OSError(f"{path} shrank while it was being uploaded")
                    sent += len(chunk)
                    if self.progress is not None:
                        self.progress(len(chunk))
                    yield chunk
            yield b"\r\n"
        yield self._tail


def _error_from(resp: httpx.Response) -> AdminAPIError:
    code, message, details = f"http_{resp.status_code}", resp.reason_phrase or "error", None
    try:
        body = resp.json()
    except (ValueError, UnicodeDecodeError):
        text = resp.text.strip()
        if text:
            message = text[:300]
        return AdminAPIError(resp.status_code, code, message, details)
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
        details = err.get("details")
    elif isinstance(body, dict) and "detail" in body:  # a framework answer (e.g. 404 of an unknown route)
        message = body["detail"] if isinstance(body["detail"], str) else json.dumps(body["detail"])
    return AdminAPIError(resp.status_code, code, message, details)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once per process (building one loads the CA
    bundle, which costs tens of milliseconds, seconds on a loaded machine)."""
    return httpx.create_ssl_context()


def _q(segment: str) -> str:
    """Quote one path segment (ids are slugs, but never let input change the path)."""
    return quote(segment, safe="")


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


IMPORT_TIMEOUT_S = 3600.0  # an hf:// import answers once every file is copied (2 GiB by default)


class AdminClient(GovernanceCalls, QualityCalls):
    """Synchronous client of ``/admin/v1``. Use as a context manager, or call :meth:`close`.
    The governance calls (principals, promotions, bulk) come from :class:`GovernanceCalls`, the
    quality calls (regression sets, policies, evaluations) from :class:`QualityCalls`."""

    def __init__(
        self,
        base_url: str = DEFAULT_ADMIN_URL,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"accept": "application/json", "user-agent": "loraplane-cli"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=transport,
            verify=_tls_context(),
        )

    # -- plumbing -----------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        content: Any = None,
        headers: dict[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON answer (None for an empty body).
        ``read_timeout`` replaces the client's timeout for waiting on this answer."""
        kwargs: dict[str, Any] = {}
        if read_timeout is not None:
            kwargs["timeout"] = httpx.Timeout(read_timeout, connect=min(read_timeout, 10.0))
        if json_body is not None:
            kwargs["json"] = json_body
        if content is not None:
            kwargs["content"] = content
        try:
            resp = self._http.request(
                method, path, params=_drop_none(params or {}) or None, headers=headers, **kwargs
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise AdminUnreachable(self.base_url, str(exc) or type(exc).__name__) from exc
        except httpx.TimeoutException as exc:
            raise AdminUnreachable(self.base_url, f"timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            raise AdminUnreachable(self.base_url, f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as exc:
            raise AdminAPIError(resp.status_code, "bad_response", "the admin API answered non-JSON") from exc

    def _list_all(self, path: str, params: dict[str, Any], limit: int | None = None) -> list[JSON]:
        """Follow ``next_cursor`` until the end (or until ``limit`` items)."""
        out: list[JSON] = []
        cursor: str | None = None
        page_size = min(limit, 500) if limit else 500
        for _ in range(100_000):
            page = self.request("GET", path, params={**params, "limit": page_size, "cursor": cursor})
            data = page.get("data", []) if isinstance(page, dict) else page
            out.extend(data)
            cursor = page.get("next_cursor") if isinstance(page, dict) else None
            if not cursor or (limit is not None and len(out) >= limit):
                break
        return out[:limit] if limit is not None else out

    # -- base models --------------------------------------------------------------------------

    def create_base_model(
        self,
        name: str,
        hf_id: str,
        max_lora_rank: int,
        target_modules: list[str],
        module_shapes: dict[str, list[int]] | None = None,
        revision: str | None = None,
    ) -> JSON:
        body = _drop_none(
            {
                "name": name,
                "hf_id": hf_id,
                "max_lora_rank": max_lora_rank,
                "target_modules": list(target_modules),
                "module_shapes": module_shapes,
                "revision": revision,
            }
        )
        return self.request("POST", "/base-models", json_body=body)

    def list_base_models(self) -> list[JSON]:
        return self._list_all("/base-models", {})

    def get_base_model(self, name: str) -> JSON:
        return self.request("GET", f"/base-models/{_q(name)}")

    # -- adapters -----------------------------------------------------------------------------

    def create_adapter(
        self,
        adapter_id: str,
        base_model: str,
        owner: str | None = None,
        description: str | None = None,
        hot: bool | None = None,
        on_load_failure: str | None = None,
    ) -> JSON:
        """``on_load_failure``: error | previous_version | base_model (sent only when given)."""
        body = _drop_none(
            {
                "id": adapter_id,
                "base_model": base_model,
                "owner": owner,
                "description": description,
                "hot": hot,
                "on_load_failure": on_load_failure,
            }
        )
        return self.request("POST", "/adapters", json_body=body)

    def update_adapter(
        self,
        adapter_id: str,
        *,
        description: str | None = None,
        owner: str | None = None,
        hot: bool | None = None,
        on_load_failure: str | None = None,
    ) -> JSON:
        """PATCH: only the given (non-None) fields change. ``hot=True`` marks the adapter hot (the
        router keeps its active version prewarmed); ``hot=False`` unmarks it. ``on_load_failure``:
        error | previous_version | base_model."""
        body = _drop_none(
            {"description": description, "owner": owner, "hot": hot, "on_load_failure": on_load_failure}
        )
        return self.request("PATCH", f"/adapters/{_q(adapter_id)}", json_body=body)

    def set_adapter_limits(self, adapter_id: str, limits: dict[str, int | None] | None) -> JSON:
        """PATCH the adapter's ``limits`` (shared by every tenant), merged key by key (a None value
        = unlimited); ``limits=None`` clears all three."""
        return self.request("PATCH", f"/adapters/{_q(adapter_id)}", json_body={"limits": limits})

    def list_adapters(
        self,
        base_model: str | None = None,
        owner: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[JSON]:
        params = {"base_model": base_model, "owner": owner, "status": status}
        return self._list_all("/adapters", params, limit)

    def get_adapter(self, adapter_id: str) -> JSON:
        return self.request("GET", f"/adapters/{_q(adapter_id)}")

    def upload_version(
        self,
        adapter_id: str,
        directory: str | Path,
        *,
        progress: ProgressCallback | None = None,
        quality_gate: str | None = None,
    ) -> JSON:
        """Upload every regular non-hidden file of ``directory`` as a new version (streamed).
        ``quality_gate="pending"`` blocks its promotion until a passing result is recorded
        (:meth:`set_quality_gate`); the server's default is ``skipped``."""
        return self.upload_files(
            adapter_id, adapter_files(directory), progress=progress, quality_gate=quality_gate
        )

    def upload_files(
        self,
        adapter_id: str,
        files: list[Path],
        *,
        progress: ProgressCallback | None = None,
        quality_gate: str | None = None,
    ) -> JSON:
        fields = {"quality_gate": quality_gate} if quality_gate is not None else None
        body = MultipartUpload(files, progress=progress, fields=fields)
        headers = {"content-type": body.content_type, "content-length": str(len(body))}
        return self.request(
            "POST", f"/adapters/{_q(adapter_id)}/versions", content=iter(body), headers=headers
        )

    def register_version(self, adapter_id: str, source_uri: str, *, quality_gate: str | None = None) -> JSON:
        """Register a version by reference to an allowed ``s3://bucket/prefix/``."""
        body = _drop_none({"source_uri": source_uri, "quality_gate": quality_gate})
        return self.request("POST", f"/adapters/{_q(adapter_id)}/versions", json_body=body)

    def import_version(
        self,
        adapter_id: str,
        source_uri: str,
        *,
        quality_gate: str | None = None,
        timeout: float = IMPORT_TIMEOUT_S,
    ) -> JSON:
        """Import a version from the Hugging Face Hub (``hf://ORG/REPO@REVISION[/SUBDIR]``, inside
        the registry's ``LORAPLANE_ALLOWED_SOURCES``). The registry copies every file before it
        answers, so the answer may take a while (``timeout`` seconds at most). The version record
        has ``source_uri`` and ``source_revision`` (the commit sha the revision resolved to)."""
        body = _drop_none({"source_uri": source_uri, "quality_gate": quality_gate})
        return self.request(
            "POST", f"/adapters/{_q(adapter_id)}/versions", json_body=body, read_timeout=timeout
        )

    def list_versions(self, adapter_id: str) -> list[JSON]:
        return self._list_all(f"/adapters/{_q(adapter_id)}/versions", {})

    def get_version(self, adapter_id: str, version: str) -> JSON:
        return self.request("GET", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}")

    def promote(
        self, adapter_id: str, version: str, canary_weight: int | None = None, *, force: bool = False
    ) -> JSON:
        """Promote (or with ``canary_weight`` make canary). A version whose quality gate is
        ``pending``/``failed`` is refused (409) unless ``force=True`` (audited)."""
        body: dict[str, Any] = {"canary_weight": canary_weight} if canary_weight is not None else {}
        if force:
            body["force"] = True
        return self.request(
            "POST", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/promote", json_body=body or None
        )

    def set_quality_gate(
        self, adapter_id: str, version: str, status: str, details: dict[str, Any] | None = None
    ) -> JSON:
        """Record a quality-gate result (``passed`` | ``failed`` | ``pending`` | ``skipped``) with
        optional ``details`` (a JSON object, e.g. eval scores); returns the version record."""
        body: dict[str, Any] = {"status": status}
        if details is not None:
            body["details"] = details
        return self.request(
            "POST", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/quality-gate", json_body=body
        )

    def rollback(self, adapter_id: str) -> JSON:
        return self.request("POST", f"/adapters/{_q(adapter_id)}/rollback")

    def disable_adapter(self, adapter_id: str) -> JSON:
        return self.request("POST", f"/adapters/{_q(adapter_id)}/disable")

    def enable_adapter(self, adapter_id: str) -> JSON:
        return self.request("POST", f"/adapters/{_q(adapter_id)}/enable")

    def disable_version(self, adapter_id: str, version: str) -> JSON:
        return self.request("POST", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/disable")

    def enable_version(self, adapter_id: str, version: str) -> JSON:
        """A disabled version back to ``ready`` (409 ``conflict`` when it is not disabled)."""
        return self.request("POST", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/enable")

    def end_canary(self, adapter_id: str) -> JSON:
        """Clear the canary, keep the active version (200 with the adapter, also when none ran)."""
        return self.request("DELETE", f"/adapters/{_q(adapter_id)}/canary")

    def prewarm(self, adapter_id: str, replicas: int | None = None) -> JSON:
        body = {"replicas": replicas} if replicas is not None else None
        return self.request("POST", f"/adapters/{_q(adapter_id)}/prewarm", json_body=body)

    def list_replicas(self) -> list[JSON]:
        page = self.request("GET", "/replicas")
        return page.get("data", []) if isinstance(page, dict) else list(page or [])

    def replica_plan(self) -> JSON:
        """The published placement plan (``GET /replicas/plan``): desired replicas per pool and,
        per planned adapter version, demand, planned replicas and where it is now."""
        return dict(self.request("GET", "/replicas/plan"))

    # -- tenants, keys, grants ----------------------------------------------------------------

    def create_tenant(
        self,
        tenant_id: str,
        name: str | None = None,
        limits: dict[str, int | None] | None = None,
        base_model_access: bool = False,
    ) -> JSON:
        body: dict[str, Any] = {"id": tenant_id, "base_model_access": base_model_access}
        if name is not None:
            body["name"] = name
        if limits is not None:
            body["limits"] = limits
        return self.request("POST", "/tenants", json_body=body)

    def list_tenants(self, adapter_id: str | None = None, limit: int | None = None) -> list[JSON]:
        """Tenants (``adapter_id``: only those granted that adapter)."""
        return self._list_all("/tenants", {"adapter_id": adapter_id}, limit)

    def get_tenant(self, tenant_id: str) -> JSON:
        return self.request("GET", f"/tenants/{_q(tenant_id)}")

    def update_tenant(
        self,
        tenant_id: str,
        *,
        name: str | None = None,
        limits: dict[str, int | None] | None = None,
        base_model_access: bool | None = None,
    ) -> JSON:
        """PATCH: only the given fields change; ``limits`` is merged key by key (None = unlimited)."""
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if limits:
            body["limits"] = limits
        if base_model_access is not None:
            body["base_model_access"] = base_model_access
        return self.request("PATCH", f"/tenants/{_q(tenant_id)}", json_body=body)

    def issue_key(self, tenant_id: str) -> JSON:
        """Issue an API key; the answer's ``key`` is shown this once only."""
        return self.request("POST", f"/tenants/{_q(tenant_id)}/keys")

    def revoke_key(self, tenant_id: str, key_id: str) -> JSON | None:
        return self.request("DELETE", f"/tenants/{_q(tenant_id)}/keys/{_q(key_id)}")

    def put_grant(
        self, tenant_id: str, adapter_id: str, rpm: int | None = None, tpm: int | None = None
    ) -> JSON:
        return self.request(
            "PUT", f"/tenants/{_q(tenant_id)}/grants/{_q(adapter_id)}", json_body={"rpm": rpm, "tpm": tpm}
        )

    def delete_grant(self, tenant_id: str, adapter_id: str) -> JSON | None:
        return self.request("DELETE", f"/tenants/{_q(tenant_id)}/grants/{_q(adapter_id)}")

    # -- owners -------------------------------------------------------------------------------

    def get_owner(self, owner: str) -> JSON:
        """The owner's limits and adapters (404 ``owner_not_found`` if none names it, no limits set)."""
        return self.request("GET", f"/owners/{_q(owner)}")

    def put_owner_limits(self, owner: str, limits: dict[str, int | None]) -> JSON:
        """Replace the owner's limits (a key left out = unlimited), shared by all its adapters."""
        return self.request("PUT", f"/owners/{_q(owner)}/limits", json_body=limits)

    # -- audit --------------------------------------------------------------------------------

    def list_audit(
        self,
        action: str | None = None,
        subject_type: str | None = None,
        subject_id: str | None = None,
        since: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[JSON]:
        """Audit events, oldest first (``newest_first``: the ``limit`` most recent, newest first)."""
        params = {"action": action, "subject_type": subject_type, "subject_id": subject_id, "since": since}
        if newest_first:
            params["order"] = "desc"
        return self._list_all("/audit", params, limit)


def admin_url_from_env() -> str:
    """``LORAPLANE_ADMIN_URL`` or the default ``http://127.0.0.1:8081``."""
    return os.environ.get("LORAPLANE_ADMIN_URL") or DEFAULT_ADMIN_URL
