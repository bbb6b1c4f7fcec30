"""A small local Hugging Face Hub for the import tests: the part of the Hub's HTTP API that
``huggingface_hub`` uses to import a repository, served on 127.0.0.1 by a thread of the test.

- ``GET /api/models/{org}/{repo}[/revision/{rev}]`` (``?blobs=true``): model info with the
  commit ``sha`` the revision points at and ``siblings`` (``rfilename``, ``size``, ``blobId``
  and, for LFS files, ``lfs: {sha256, size, pointerSize}``), as the Hub answers it.
- ``GET|HEAD /{org}/{repo}/resolve/{rev}/{path}``: the file at that revision, with ``ETag`` and
  ``X-Repo-Commit``.
- Errors as the Hub gives them: ``X-Error-Code: RepoNotFound`` (401, also for a private repo
  without a valid token), ``RevisionNotFound`` (404), ``EntryNotFound`` (404).

Files ending in ``.safetensors`` or ``.bin`` are LFS files (their sha256 is listed); others are
kept in git (their git blob sha1 is listed). Faults: ``tamper()`` serves other bytes than the
ones listed, ``fail_status`` answers every request (or only file downloads) with that status,
``delay_s`` answers late, ``stop()`` closes the port. Every request is recorded in ``requests``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")
LFS_SPEC = "version https://git-lfs.github.com/spec/v1"
Answer = tuple[int, dict[str, str], bytes]  # status, headers, body


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Recorded:
    method: str
    path: str
    authorization: str | None


@dataclass
class FakeRepo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> path -> bytes
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    private: bool = False


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.tampered: dict[tuple[str, str, str], bytes] = {}  # (repo, sha, path) -> served bytes
        self.tokens: set[str] = set()
        self.fail_status: int | None = None
        self.fail_only_files = False
        self.delay_s = 0.0  # answer this late (a hub that hangs)
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    # ------------------------------------------------------------------ content

    def commit(
        self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", private: bool = False
    ) -> str:
        """A new commit holding exactly ``files`` on ``branch`` (created or moved); its sha."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, FakeRepo())
            repo.private = repo.private or private
            h = hashlib.sha1(f"{repo_id}:{len(repo.commits)}".encode())
            for path in sorted(files):
                h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
            sha = h.hexdigest()
            repo.commits[sha] = dict(files)
            repo.refs[branch] = sha
            return sha

    def commit_dir(self, repo_id: str, directory: Path, *, subdir: str = "", **kw: bool | str) -> str:
        prefix = f"{subdir}/" if subdir else ""
        files = {prefix + p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        return self.commit(repo_id, files, **kw)  # type: ignore[arg-type]

    def tag(self, repo_id: str, name: str, sha: str) -> None:
        with self._lock:
            self.repos[repo_id].refs[name] = sha

    def tamper(self, repo_id: str, sha: str, path: str, served: bytes) -> None:
        """Serve ``served`` for the file while the model info still lists the original."""
        with self._lock:
            self.tampered[(repo_id, sha, path)] = served

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def file_requests(self) -> list[Recorded]:
        return [r for r in self.requests if "/resolve/" in r.path]

    # ------------------------------------------------------------------ lookups

    def _visible(self, repo_id: str, authorization: str | None) -> FakeRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None
        if repo.private:
            token = (authorization or "").removeprefix("Bearer ").strip()
            if token not in self.tokens:
                return None
        return repo

    def _resolve(self, repo: FakeRepo, rev: str) -> str | None:
        if rev in repo.refs:
            return repo.refs[rev]
        return rev if rev in repo.commits else None

    def model_info(self, repo_id: str, rev: str, authorization: str | None) -> Answer:
        repo = self._visible(repo_id, authorization)
        if repo is None:
            return _error(401, "RepoNotFound", "Repository not found")
        sha = self._resolve(repo, rev)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        siblings = []
        for path, data in sorted(repo.commits[sha].items()):
            sib: dict[str, object] = {"rfilename": path, "size": len(data)}
            if path.endswith(LFS_SUFFIXES):
                pointer = f"{LFS_SPEC}\noid sha256:{_sha256(data)}\nsize {len(data)}\n"
                sib["blobId"] = git_blob_id(pointer.encode())
                sib["lfs"] = {"sha256": _sha256(data), "size": len(data), "pointerSize": len(pointer)}
            else:
                sib["blobId"] = git_blob_id(data)
            siblings.append(sib)
        body = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": sha,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "tags": ["peft", "safetensors"],
            "library_name": "peft",
            "siblings": siblings,
        }
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def resolve_file(self, repo_id: str, rev: str, path: str, authorization: str | None) -> Answer:
        repo = self._visible(repo_id, authorization)
        if repo is None:
            return _error(401, "RepoNotFound", "Repository not found")
        sha = self._resolve(repo, rev)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        data = repo.commits[sha].get(path)
        if data is None:
            return _error(404, "EntryNotFound", f"{path} does not exist on {rev}")
        etag = _sha256(data) if path.endswith(LFS_SUFFIXES) else git_blob_id(data)
        served = self.tampered.get((repo_id, sha, path), data)
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{etag}"',
            "X-Repo-Commit": sha,
            "Accept-Ranges": "bytes",
        }
        return 200, headers, served


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _error(status: int, code: str, message: str) -> Answer:
    headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
    return status, headers, json.dumps({"error": message}).encode()


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

        def _answer(self, head_only: bool) -> None:
            path = urlsplit(self.path).path
            auth = self.headers.get("Authorization")
            hub.requests.append(Recorded(self.command, path, auth))
            if hub.delay_s:
                time.sleep(hub.delay_s)
            parts = path.strip("/").split("/")
            is_file = len(parts) >= 5 and parts[2] == "resolve"
            if hub.fail_status is not None and (is_file or not hub.fail_only_files):
                status, headers, body = hub.fail_status, {"Content-Type": "text/plain"}, b"hub is failing"
            elif parts[:2] == ["api", "models"] and len(parts) in (4, 6):
                rev = unquote(parts[5]) if len(parts) == 6 and parts[4] == "revision" else "main"
                status, headers, body = hub.model_info(f"{parts[2]}/{parts[3]}", rev, auth)
            elif is_file:
                repo_id, rev, file_path = f"{parts[0]}/{parts[1]}", unquote(parts[3]), "/".join(parts[4:])
                status, headers, body = hub.resolve_file(repo_id, rev, unquote(file_path), auth)
            else:
                status, headers, body = _error(404, "NotFound", "no such route")
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head_only:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(head_only=False)

        def do_HEAD(self) -> None:
            self._answer(head_only=True)

    return Handler
