"""Imports from the Hugging Face Hub through the admin API (SPEC §15): the real ``huggingface_hub``
client against a local fake Hub (``hubfake``) — a branch and a tag pinned to their commit, a
commit sha, a subdirectory, the allow-list, unknown repos and revisions, a private repo and the
token, a tampered file, the hub down; refusals leave nothing behind and consume no number."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import Engine

from kit.db import make_engine
from kit.localservices import S3Server
from registry.adapter_factory import write_adapter
from registry.storage.base import ArtifactStore
from registry.storage.local import LocalArtifactStore
from tests.registry.core_support import AUTH, make_settings, seed_adapter
from tests.registry.hubfake import FakeHub

V1 = "/admin/v1"
URL = f"{V1}/adapters/ad/versions"
REPO = "my-org/support-lora"
TOKEN = "hf_secret_token_for_tests_0123456789"


@dataclass
class Env:
    c: TestClient
    hub: FakeHub
    store: ArtifactStore
    tmp: Path

    def post(self, uri: str, **kw: Any) -> Any:
        return self.c.post(URL, json={"source_uri": uri, **kw})

    def versions(self) -> list[str]:
        return [v["version"] for v in self.c.get(URL).json()["data"]]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    h = FakeHub()
    yield h
    h.stop()


def _app(tmp_path: Path, db_url: str, engine: Engine, hub: FakeHub, **kw: Any) -> tuple[Any, ArtifactStore]:
    from registry.api import create_admin_app

    kw = {"allowed_sources": ["hf://my-org/*"], "hf_endpoint": hub.url, "hf_timeout_s": 5.0, **kw}
    settings = make_settings(tmp_path, db_url, **kw)
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    return create_admin_app(settings, engine=engine, store=store), store


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    target = tmp_path / "registry.db"
    shutil.copyfile(sqlite_template, target)
    return f"sqlite:///{target}"


def _env(tmp_path: Path, url: str, hub: FakeHub, *, seed: bool = True, **kw: Any) -> Iterator[Env]:
    engine = make_engine(url)
    app, store = _app(tmp_path, url, engine, hub, **kw)
    try:
        with TestClient(app, headers=AUTH) as c:
            if seed:
                seed_adapter(c, "ad")
            yield Env(c, hub, store, tmp_path)
    finally:
        engine.dispose()


@pytest.fixture
def env(tmp_path: Path, sqlite_url: str, hub: FakeHub) -> Iterator[Env]:
    yield from _env(tmp_path, sqlite_url, hub)


def stored_files(env: Env) -> list[str]:
    assert isinstance(env.store, LocalArtifactStore)
    return sorted(str(p.relative_to(env.store.root)) for p in env.store.root.rglob("*") if p.is_file())


def adapter_dir(tmp: Path, name: str, **kw: Any) -> Path:
    d = write_adapter(tmp / name, **kw)
    (d / "README.md").write_text(f"# {name}\n")
    return d


def sha256_of(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def read_stored(store: ArtifactStore, storage_uri: str, name: str) -> bytes:
    with store.open_read(storage_uri, name) as f:
        return f.read()


# ------------------------------------------------------------------------------------ imports


def test_branch_is_resolved_once_and_pinned(db_url: str, tmp_path: Path, hub: FakeHub) -> None:
    for env in _env(tmp_path, db_url, hub):  # SQLite and PostgreSQL
        a = adapter_dir(tmp_path, "a", rank=8, seed=1)
        files = {p.name: p.read_bytes() for p in a.iterdir()}
        files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
        files["checkpoint-100/adapter_model.safetensors"] = b"not part of the version"
        sha = hub.commit(REPO, files)
        r = env.post(f"hf://{REPO}@main")
        assert r.status_code == 201, r.text
        v = r.json()
        assert v["version"] == "v1" and v["rank"] == 8
        assert v["source_uri"] == f"hf://{REPO}@main" and v["source_revision"] == sha
        # the files directly in the repository root, dotfiles and nested directories left out
        assert {f["name"]: f["sha256"] for f in v["files"]} == {
            p.name: sha256_of(p) for p in a.iterdir()
        }  # fmt: skip
        # every file was fetched at the resolved commit, never at the moving branch
        fetched = hub.file_requests()
        assert len(fetched) == 3 and all(f"/resolve/{sha}/" in r.path for r in fetched)
        # the branch moves on: the version keeps the bytes of the commit it was imported from
        b = adapter_dir(tmp_path, "b", rank=16, seed=2)
        new_sha = hub.commit_dir(REPO, b)
        assert new_sha != sha
        again = env.c.get(f"{URL}/v1").json()
        assert again["source_revision"] == sha
        weights = read_stored(env.store, again["storage_uri"], "adapter_model.safetensors")
        assert weights == (a / "adapter_model.safetensors").read_bytes()
        # importing main again now gets the new commit, as v2
        v2 = env.post(f"hf://{REPO}@main").json()
        assert (v2["version"], v2["source_revision"], v2["rank"]) == ("v2", new_sha, 16)
        # the audit event says where the version came from
        events = env.c.get(f"{V1}/audit", params={"action": "version.uploaded"}).json()["data"]
        assert [(e["details"]["source_uri"], e["details"]["source_revision"]) for e in events] == [
            (f"hf://{REPO}@main", sha),
            (f"hf://{REPO}@main", new_sha),
        ]


def test_tag_and_commit_sha(env: Env, tmp_path: Path) -> None:
    old = env.hub.commit_dir(REPO, adapter_dir(tmp_path, "a", rank=4))
    env.hub.tag(REPO, "v1.0", old)
    env.hub.commit_dir(REPO, adapter_dir(tmp_path, "b", rank=32))  # main moves on
    by_tag = env.post(f"hf://{REPO}@v1.0").json()
    assert (by_tag["source_uri"], by_tag["source_revision"], by_tag["rank"]) == (f"hf://{REPO}@v1.0", old, 4)
    by_sha = env.post(f"hf://{REPO}@{old}").json()
    assert (by_sha["source_uri"], by_sha["source_revision"], by_sha["rank"]) == (f"hf://{REPO}@{old}", old, 4)
    # no revision means main
    latest = env.post(f"hf://{REPO}").json()
    assert latest["source_uri"] == f"hf://{REPO}@main" and latest["rank"] == 32
    assert env.versions() == ["v1", "v2", "v3"]


def test_subdirectory(env: Env, tmp_path: Path) -> None:
    root = adapter_dir(tmp_path, "root", rank=4)
    sub = adapter_dir(tmp_path, "sub", rank=16, target_modules=["q_proj", "k_proj"])
    files = {p.name: p.read_bytes() for p in root.iterdir()}
    files |= {f"adapters/support/{p.name}": p.read_bytes() for p in sub.iterdir()}
    files["adapters/support/deeper/adapter_config.json"] = b"{}"
    sha = env.hub.commit(REPO, files)
    v = env.post(f"hf://{REPO}@main/adapters/support/", quality_gate="pending").json()
    assert v["source_uri"] == f"hf://{REPO}@main/adapters/support" and v["source_revision"] == sha
    assert (v["rank"], v["quality_gate"]) == (16, "pending")
    assert sorted(v["target_modules"]) == ["k_proj", "q_proj"]
    assert {f["name"]: f["sha256"] for f in v["files"]} == {p.name: sha256_of(p) for p in sub.iterdir()}
    # a directory with no files is refused with the reason, like an upload without its files
    r = env.post(f"hf://{REPO}@main/adapters/nothing")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_adapter"
    problems = r.json()["error"]["details"]["problems"]
    assert any("no files in directory 'adapters/nothing'" in p for p in problems)


# ------------------------------------------------------------------------------------ refusals


def assert_nothing_kept(env: Env, before: list[str]) -> None:
    assert env.versions() == before
    assert stored_files(env) == []  # pending uploads live under the store's root too


@pytest.mark.parametrize("target", ["adapter_model.safetensors", "adapter_config.json"])
def test_tampered_file_is_refused(env: Env, tmp_path: Path, target: str) -> None:
    a = adapter_dir(tmp_path, "a")
    sha = env.hub.commit_dir(REPO, a)
    original = (a / target).read_bytes()
    # same length, one byte changed: still a valid adapter, only the hub's hash can tell
    tampered = original[:-2] + bytes([original[-2] ^ 0x01]) + original[-1:]
    if target == "adapter_config.json":
        assert b'"lora_alpha": 16,' in original
        tampered = original.replace(b'"lora_alpha": 16,', b'"lora_alpha": 64,')
    env.hub.tamper(REPO, sha, target, tampered)
    r = env.post(f"hf://{REPO}@main")
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_adapter"
    expected = "LFS sha256" if target.endswith(".safetensors") else "git blob id"
    assert any(p.startswith(f"{target}:") and expected in p for p in err["details"]["problems"]), err
    assert_nothing_kept(env, [])
    # the refusal consumed no number: the untampered import is v1
    env.hub.tampered.clear()
    assert env.post(f"hf://{REPO}@main").json()["version"] == "v1"


def test_invalid_adapter_on_the_hub_is_validated_like_an_upload(env: Env, tmp_path: Path) -> None:
    env.hub.commit_dir(REPO, adapter_dir(tmp_path, "a", rank=128))  # demo-base allows up to 64
    r = env.post(f"hf://{REPO}@main")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_adapter"
    assert any("64" in p for p in r.json()["error"]["details"]["problems"])
    assert_nothing_kept(env, [])


def test_size_cap_checked_from_the_hub_listing(tmp_path: Path, sqlite_url: str, hub: FakeHub) -> None:
    for env in _env(tmp_path, sqlite_url, hub, max_adapter_bytes=20_000):
        hub.commit_dir(REPO, adapter_dir(tmp_path, "a", pad_bytes=50_000))
        r = env.post(f"hf://{REPO}@main")
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert hub.file_requests() == []  # refused before any download
        assert_nothing_kept(env, [])


@pytest.mark.parametrize(
    ("uri", "allowed", "code"),
    [
        ("hf://other-org/support-lora@main", ["hf://my-org/*"], "source_not_allowed"),
        ("hf://my-org-evil/support-lora@main", ["hf://my-org/*"], "source_not_allowed"),
        ("hf://my-org/support-lora@main", ["hf://my-org/other-*"], "source_not_allowed"),
        ("hf://my-org/support-lora@main", ["s3://bucket/adapters/"], "source_not_allowed"),
        ("hf://my-org/support-lora@main", [], "source_not_allowed"),
        ("hf://my-org@main", ["hf://*"], "invalid_request"),
        ("hf://datasets/my-org/support-lora@main", ["hf://*"], "invalid_request"),
        ("hf://my-org/support-lora@main/../x", ["hf://*"], "invalid_request"),
        ("hf://my-org/support-lora@main?x=1", ["hf://*"], "invalid_request"),
    ],
)
def test_allow_list_and_bad_uris_refused_before_the_hub_is_asked(
    tmp_path: Path, sqlite_url: str, hub: FakeHub, uri: str, allowed: list[str], code: str
) -> None:
    hub.commit_dir(REPO, adapter_dir(tmp_path, "a"))
    for env in _env(tmp_path, sqlite_url, hub, allowed_sources=allowed):
        r = env.post(uri)
        assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
        assert hub.requests == []
        assert_nothing_kept(env, [])


def test_allow_list_patterns_admit(tmp_path: Path, sqlite_url: str, hub: FakeHub) -> None:
    hub.commit_dir(REPO, adapter_dir(tmp_path, "a"))
    allowed = ["s3://bucket/x/", "hf://models/other/*", "hf://my-org/support-*"]
    for env in _env(tmp_path, sqlite_url, hub, allowed_sources=allowed):
        assert env.post(f"hf://{REPO}@main").status_code == 201


@pytest.mark.parametrize(
    ("uri", "what"),
    [
        ("hf://my-org/no-such-repo@main", "repository 'my-org/no-such-repo' not found"),
        (f"hf://{REPO}@no-such-branch", "revision 'no-such-branch' not found"),
        (f"hf://{REPO}@{'0' * 40}", "not found"),
    ],
)
def test_unknown_repo_or_revision(env: Env, tmp_path: Path, uri: str, what: str) -> None:
    env.hub.commit_dir(REPO, adapter_dir(tmp_path, "a"))
    r = env.post(uri)
    assert r.status_code == 422 and r.json()["error"]["code"] == "revision_not_found", r.text
    assert what in r.json()["error"]["message"]
    assert_nothing_kept(env, [])


def test_private_repo_needs_the_token_which_is_never_shown(
    tmp_path: Path, sqlite_url: str, hub: FakeHub, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    hub.tokens.add(TOKEN)
    sha = hub.commit_dir(REPO, adapter_dir(tmp_path, "a"), private=True)
    for env in _env(tmp_path / "anon", sqlite_url, hub):
        r = env.post(f"hf://{REPO}@main")
        assert r.status_code == 422 and r.json()["error"]["code"] == "revision_not_found"
        assert all(req.authorization is None for req in hub.requests)
    for env in _env(tmp_path / "tok", sqlite_url, hub, seed=False, hf_token=SecretStr(TOKEN)):
        v = env.post(f"hf://{REPO}@main").json()
        assert v["source_revision"] == sha
        assert {req.authorization for req in hub.requests[-3:]} == {f"Bearer {TOKEN}"}
        hub.fail_status = 500
        failed = env.post(f"hf://{REPO}@main")
        assert failed.status_code == 502 and TOKEN not in failed.text
        assert TOKEN not in json.dumps(env.c.get(f"{V1}/audit").json())
    assert TOKEN not in caplog.text


# ------------------------------------------------------------------------------------ hub down


def test_hub_unreachable_or_failing(env: Env, tmp_path: Path) -> None:
    env.hub.commit_dir(REPO, adapter_dir(tmp_path, "a"))
    # 5xx on the model info
    env.hub.fail_status = 503
    r = env.post(f"hf://{REPO}@main")
    assert r.status_code == 502 and r.json()["error"]["code"] == "source_unavailable", r.text
    assert r.json()["error"]["details"] == {
        "source_uri": f"hf://{REPO}@main",
        "endpoint": env.hub.url,
        "hub_status": 503,
    }
    # the revision resolves, then the downloads fail (after the library's retries)
    env.hub.fail_status, env.hub.fail_only_files = 500, True
    r = env.post(f"hf://{REPO}@main")
    assert r.status_code == 502 and r.json()["error"]["code"] == "source_unavailable"
    assert len(env.hub.file_requests()) == 3  # the first file, tried three times
    assert_nothing_kept(env, [])
    # the hub's port is closed
    env.hub.stop()
    r = env.post(f"hf://{REPO}@main")
    assert r.status_code == 502 and r.json()["error"]["code"] == "source_unavailable"
    assert "could not be reached" in r.json()["error"]["message"]
    assert_nothing_kept(env, [])


def test_hub_that_hangs_times_out(tmp_path: Path, sqlite_url: str, hub: FakeHub) -> None:
    hub.commit_dir(REPO, adapter_dir(tmp_path, "a"))
    hub.delay_s = 2.0
    for env in _env(tmp_path, sqlite_url, hub, hf_timeout_s=0.3):
        started = time.monotonic()
        r = env.post(f"hf://{REPO}@main")
        assert r.status_code == 502 and r.json()["error"]["code"] == "source_unavailable", r.text
        assert "ReadTimeout" in r.json()["error"]["message"]
        assert time.monotonic() - started < 1.9  # the registry did not wait for the hub
        assert_nothing_kept(env, [])


def test_s3_store_failure_leaves_no_object_and_success_lands(
    tmp_path: Path, sqlite_url: str, hub: FakeHub, s3_server: S3Server, s3_bucket: str
) -> None:
    from registry.storage.s3 import S3ArtifactStore

    kw = dict(
        s3_bucket=s3_bucket,
        s3_prefix="reg/",
        s3_endpoint_url=s3_server.endpoint_url,
        s3_access_key_id=s3_server.access_key,
        s3_secret_access_key=SecretStr(s3_server.secret_key),
    )
    engine = make_engine(sqlite_url)
    from registry.api import create_admin_app

    settings = make_settings(
        tmp_path, sqlite_url, allowed_sources=["hf://my-org/*"], hf_endpoint=hub.url, hf_timeout_s=5.0, **kw
    )
    app = create_admin_app(settings, engine=engine)
    store = app.state.admin.store
    assert isinstance(store, S3ArtifactStore)

    def bucket() -> list[str]:
        cl = s3_server.client()
        keys = [o["Key"] for o in cl.list_objects_v2(Bucket=s3_bucket, Prefix="reg/").get("Contents", [])]
        ups = cl.list_multipart_uploads(Bucket=s3_bucket, Prefix="reg/").get("Uploads", [])
        return sorted(keys + [f"upload:{u['Key']}" for u in ups])

    a = adapter_dir(tmp_path, "a")
    sha = hub.commit_dir(REPO, a)
    try:
        with TestClient(app, headers=AUTH) as c:
            seed_adapter(c, "ad")
            zeros = b"\0" * (a / "adapter_model.safetensors").stat().st_size
            hub.tamper(REPO, sha, "adapter_model.safetensors", zeros)
            r = c.post(URL, json={"source_uri": f"hf://{REPO}@main"})
            assert r.status_code == 422 and bucket() == []
            hub.tampered.clear()
            v = c.post(URL, json={"source_uri": f"hf://{REPO}@main"}).json()
            assert v["version"] == "v1" and v["storage_uri"].startswith(f"s3://{s3_bucket}/reg/")
            assert len(bucket()) == 3
            assert read_stored(store, v["storage_uri"], "README.md") == (a / "README.md").read_bytes()
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize(
    ("uri", "canonical", "revision", "subdir"),
    [
        ("hf://my-org/lora", "hf://my-org/lora@main", "main", ""),
        ("hf://models/my-org/lora@v2/", "hf://my-org/lora@v2", "v2", ""),
        ("hf://my-org/lora@refs/pr/3/a/b", "hf://my-org/lora@refs/pr/3/a/b", "refs/pr/3", "a/b"),
        ("hf://my-org/lora@feature%2Fx/a", "hf://my-org/lora@feature%2Fx/a", "feature/x", "a"),
    ],
)
def test_uri_forms(uri: str, canonical: str, revision: str, subdir: str) -> None:
    from registry.ingest.hf_uri import parse_hf_uri

    ref = parse_hf_uri(uri)
    assert (ref.uri, ref.revision, ref.subdir, ref.repo_id) == (canonical, revision, subdir, "my-org/lora")
