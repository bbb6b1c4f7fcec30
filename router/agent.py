"""``loraplane agent``: the replica-side stager.

A small HTTP service that runs beside a replica and writes verified adapter files into the
replica's staging volume for the router's ``agent`` staging mode. Every name is checked
(``ADAPTER@vN-sha8`` directories, plain file names) and every path resolved inside the
staging directory; nothing else on disk can be touched.

Endpoints (bearer token when one is configured):

- ``PUT /v1/staging/{lora_name}/files/{name}?sha256=…&upload=…``: streamed body written to
  ``.tmp-<lora_name>-<upload>/<name>.part``, hashed, renamed on a match; 422 ``hash_mismatch``
  (with ``expected`` / ``actual``) otherwise. A PUT that fails removes its whole upload
  directory (the router gives the upload up at any failure): a hash mismatch, a client that goes
  away (400 ``client_disconnected``), a full volume (507 ``insufficient_storage``) or another
  write error (503 ``staging_unavailable``). Upload directories untouched for an hour (a router
  that died mid-upload) are removed by a sweep at most once a minute.
- ``POST /v1/staging/{lora_name}/commit?upload=…`` body ``{"files": [{"name", "sha256"}]}``:
  re-hashes the upload directory and renames it to ``<lora_name>/``; answers ``{"path", "root"}``.
- ``POST /v1/staging/{lora_name}/verify`` (same body): 200 ``{"path", "root"}`` when the staged
  copy is complete and every hash matches; 404 when absent; 409 (and the copy is deleted)
  when it no longer matches.
- ``DELETE /v1/staging/{lora_name}``: removes the staged copy. ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import typer
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from router.replica import LORA_NAME_RE
from router.staging import FILE_NAME_RE, _hash_file

log = logging.getLogger("loraplane.agent")
UPLOAD_RE = re.compile(r"^[0-9a-f]{8,64}$")
STALE_UPLOAD_S = 3600.0  # an upload directory untouched this long belongs to no live upload
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def _json(status: int, data: dict[str, Any]) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _err(status: int, code: str, message: str, **extra: Any) -> Response:
    return _json(status, {"error": {"code": code, "message": message}, **extra})


class _Bad(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


class AgentApp:
    def __init__(self, staging_dir: Path, token: str | None) -> None:
        self.root = staging_dir.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.token = token
        self._swept = 0.0  # wall time of the last sweep of stale uploads
        self.app = Starlette(
            routes=[
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/v1/staging/{lora_name}/files/{name}", self.put_file, methods=["PUT"]),
                Route("/v1/staging/{lora_name}/commit", self.commit, methods=["POST"]),
                Route("/v1/staging/{lora_name}/verify", self.verify, methods=["POST"]),
                Route("/v1/staging/{lora_name}", self.delete, methods=["DELETE"]),
            ]
        )

    # ---------------------------------------------------------------- helpers

    def _auth(self, request: Request) -> None:
        if self.token is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            raise _Bad(_err(401, "unauthorized", "missing or wrong bearer token"))

    def _inside(self, *parts: str) -> Path:
        p = self.root.joinpath(*parts).resolve()
        if p == self.root or not p.is_relative_to(self.root):
            raise _Bad(_err(400, "bad_path", "path outside the staging directory"))
        return p

    def _lora(self, request: Request) -> str:
        name = str(request.path_params["lora_name"])
        if not LORA_NAME_RE.match(name):
            raise _Bad(_err(400, "bad_name", "not an adapter version name"))
        return name

    def _upload_dir(self, request: Request, lora_name: str) -> Path:
        upload = request.query_params.get("upload", "")
        if not UPLOAD_RE.match(upload):
            raise _Bad(_err(400, "bad_upload", "upload must be 8-64 lowercase hex characters"))
        return self._inside(f".tmp-{lora_name}-{upload}")

    async def _manifest(self, request: Request) -> list[tuple[str, str]]:
        try:
            data = orjson.loads(await request.body())
            files = [(str(f["name"]), str(f["sha256"])) for f in data["files"]]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise _Bad(_err(400, "bad_manifest", "body must be {files: [{name, sha256}]}")) from exc
        for name, sha in files:
            if not FILE_NAME_RE.match(name) or ".." in name or not SHA_RE.match(sha):
                raise _Bad(_err(400, "bad_manifest", f"bad file entry {name!r}"))
        if not files:
            raise _Bad(_err(400, "bad_manifest", "no files"))
        return files

    @staticmethod
    def _matches(directory: Path, files: list[tuple[str, str]]) -> str | None:
        """None when every file is present and matches; else the first problem."""
        for name, sha in files:
            p = directory / name
            if not p.is_file() or p.is_symlink():
                return f"{name} missing"
            actual = _hash_file(p)
            if actual != sha:
                return f"{name}: expected {sha}, got {actual}"
        return None

    def _located(self, final: Path) -> Response:
        return _json(200, {"path": str(final), "root": str(self.root)})

    # ---------------------------------------------------------------- routes

    async def healthz(self, request: Request) -> Response:
        return _json(200, {"status": "ok", "root": str(self.root)})

    async def put_file(self, request: Request) -> Response:
        try:
            self._auth(request)
            lora = self._lora(request)
            name = str(request.path_params["name"])
            if not FILE_NAME_RE.match(name) or ".." in name:
                raise _Bad(_err(400, "bad_name", "bad file name"))
            expected = request.query_params.get("sha256", "")
            if not SHA_RE.match(expected):
                raise _Bad(_err(400, "bad_sha256", "sha256 must be 64 lowercase hex characters"))
            updir = self._upload_dir(request, lora)
            part = self._inside(updir.name, f"{name}.part")
            await self._sweep_stale()
            h = hashlib.sha256()
            try:
                updir.mkdir(exist_ok=True)
                with open(part, "wb") as out:
                    async for chunk in request.stream():
                        if chunk:
                            h.update(chunk)
                            await asyncio.to_thread(out.write, chunk)
                    out.flush()
                    os.fsync(out.fileno())
                actual = h.hexdigest()
                if actual == expected:
                    os.replace(part, self._inside(updir.name, name))
            except ClientDisconnect:
                await self._abandon(updir)
                log.warning("upload cut off by the client", extra={"lora_name": lora, "file": name})
                return _err(400, "client_disconnected", "the client went away during the upload")
            except OSError as exc:
                await self._abandon(updir)
                return self._storage_error(exc, lora, name)
            if actual != expected:
                await self._abandon(updir)
                log.warning("hash mismatch", extra={"lora_name": lora, "file": name})
                return _err(
                    422, "hash_mismatch", f"sha256 mismatch for {name}", expected=expected, actual=actual
                )
            return _json(200, {"name": name, "sha256": actual})
        except _Bad as bad:
            return bad.response

    async def _abandon(self, updir: Path) -> None:
        """Remove an upload that cannot complete (the router gives up on it at any failure):
        nothing of it stays on the staging volume."""
        await asyncio.to_thread(shutil.rmtree, updir, True)

    @staticmethod
    def _storage_error(exc: OSError, lora: str, name: str) -> Response:
        fields = {"lora_name": lora, "file": name, "error": str(exc)}
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            log.warning("staging volume full", extra=fields)
            return _err(
                507, "insufficient_storage", f"the staging volume is full ({exc.strerror}); nothing kept"
            )
        log.error("cannot write to the staging volume", extra=fields)
        return _err(503, "staging_unavailable", f"cannot write to the staging volume: {exc.strerror or exc}")

    async def _sweep_stale(self) -> None:
        """At most once a minute: remove upload directories untouched for ``STALE_UPLOAD_S`` (a
        router that died mid-upload never commits or abandons them)."""
        now = time.time()
        if now - self._swept < 60.0:
            return
        self._swept = now
        await asyncio.to_thread(sweep_stale_uploads, self.root, now - STALE_UPLOAD_S)

    async def commit(self, request: Request) -> Response:
        try:
            self._auth(request)
            lora = self._lora(request)
            updir = self._upload_dir(request, lora)
            files = await self._manifest(request)
            if not updir.is_dir():
                return _err(404, "not_found", "no such upload")
            problem = await asyncio.to_thread(self._matches, updir, files)
            if problem:
                await self._abandon(updir)
                return _err(422, "hash_mismatch", problem)
            final = self._inside(lora)
            try:
                os.rename(updir, final)
            except OSError:
                if await asyncio.to_thread(self._matches, final, files) is None:
                    shutil.rmtree(updir, ignore_errors=True)
                else:
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(updir, final)
            return self._located(final)
        except _Bad as bad:
            return bad.response

    async def verify(self, request: Request) -> Response:
        try:
            self._auth(request)
            lora = self._lora(request)
            files = await self._manifest(request)
            final = self._inside(lora)
            if not final.is_dir():
                return _err(404, "not_found", "not staged")
            problem = await asyncio.to_thread(self._matches, final, files)
            if problem:
                shutil.rmtree(final, ignore_errors=True)
                return _err(409, "stale", problem)
            return self._located(final)
        except _Bad as bad:
            return bad.response

    async def delete(self, request: Request) -> Response:
        try:
            self._auth(request)
            lora = self._lora(request)
            final = self._inside(lora)
            await asyncio.to_thread(shutil.rmtree, final, True)
            for tmp in self.root.glob(f".tmp-{lora}-*"):
                await asyncio.to_thread(shutil.rmtree, tmp, True)
            return _json(200, {"deleted": lora})
        except _Bad as bad:
            return bad.response


def sweep_stale_uploads(root: Path, older_than: float) -> list[str]:
    """Remove ``root``'s upload directories (``.tmp-*``) whose newest entry was modified before
    ``older_than`` (wall time); returns their names."""
    removed = []
    for d in root.glob(".tmp-*"):
        try:
            newest = max([d.stat().st_mtime, *(f.stat().st_mtime for f in d.iterdir())])
        except OSError:  # removed meanwhile
            continue
        if newest < older_than:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    if removed:
        log.warning("removed stale uploads", extra={"uploads": removed})
    return removed


def make_app(staging_dir: Path, token: str | None) -> Starlette:
    return AgentApp(staging_dir, token).app


def agent(
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address."),
    port: int = typer.Option(9090, "--port", help="Port."),
    staging_dir: Path = typer.Option(
        Path("/shared/staging"), "--staging-dir", help="The replica's staging volume."
    ),
    token: str = typer.Option(
        "", "--token", envvar="LORAPLANE_AGENT_TOKEN", help="Bearer token the router must send (recommended)."
    ),
) -> None:
    """Run the replica-side stager that writes verified adapter files into the staging volume."""
    import uvicorn

    from kit.logs import setup_logging

    setup_logging()
    if not token:
        log.warning("agent runs without a token: anyone who can reach it can stage files")
    uvicorn.run(make_app(staging_dir, token or None), host=host, port=port, log_level="warning")
