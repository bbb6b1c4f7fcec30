"""Hostile input the fuzzer rarely reaches, by hand, on SQLite and PostgreSQL (SPEC §13, §18):
integers out of range for their column, NUL and other control characters, deep nesting and huge
bodies — in every body, query filter, path parameter and JSON file of an upload. Each is a 4xx in
the admin API's error shape naming the field, and leaves nothing written (the audit log and the
lists are unchanged afterwards). Each of these was a 500 on PostgreSQL before (issue 13,
finding 7), or would have been."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from registry.adapter_factory import write_adapter
from registry.api import create_admin_app
from registry.demo import demo_base_model
from registry.storage.local import LocalArtifactStore
from tests.registry.core_support import (  # noqa: F401 - fixtures
    AUTH,
    db_url,
    engine,
    make_settings,
    pg_migrated,
    seed_adapter,
    sqlite_template,
)

V1 = "/admin/v1"
BIG = 2**31  # one past the INTEGER column
HUGE = 2**63
NUL, BEL, ESC = "\x00", "\x07", "\x1b"


@pytest.fixture
def c(tmp_path: Path, db_url: str, engine: Engine) -> Iterator[TestClient]:  # noqa: F811
    settings = make_settings(tmp_path, db_url)
    store = LocalArtifactStore(settings.resolved_artifact_dir())
    app = create_admin_app(settings, engine=engine, store=store)
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as client:
        seed_adapter(client, "ad")
        assert client.post(f"{V1}/tenants", json={"id": "tn"}).status_code == 201
        assert client.put(f"{V1}/tenants/tn/grants/ad", json={}).status_code == 200
        yield client


def _state(c: TestClient) -> tuple[Any, ...]:
    """What a refused request must leave as it was."""
    return tuple(
        c.get(f"{V1}/{what}", params={"limit": 500}).json()["data"]
        for what in ("audit", "tenants", "adapters", "base-models", "principals", "adapters/ad/versions")
    )


def _refused(r: Any, status: int, field: str, code: str = "invalid_request") -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code and err["message"], err
    assert field in json.dumps(err["details"]) + err["message"], err
    return err


# (method, path, body, the field the error must name)
OUT_OF_RANGE = [
    ("post", "/base-models", {**demo_base_model("b2"), "max_lora_rank": BIG}, "max_lora_rank"),
    ("post", "/base-models", {**demo_base_model("b2"), "max_lora_rank": HUGE}, "max_lora_rank"),
    ("post", "/base-models", {**demo_base_model("b2"), "approvals_required": HUGE}, "approvals_required"),
    (
        "post",
        "/base-models",
        {**demo_base_model("b2"), "module_shapes": {"q_proj": [BIG, 8]}},
        "module_shapes",
    ),
    ("patch", "/base-models/demo-base", {"approvals_required": -HUGE}, "approvals_required"),
    ("patch", "/adapters/ad", {"approvals_required": BIG}, "approvals_required"),
    ("patch", "/adapters/ad", {"limits": {"tpm": BIG}}, "tpm"),
    ("post", "/tenants", {"id": "t2", "limits": {"rpm": HUGE}}, "rpm"),
    ("post", "/tenants", {"id": "t2", "limits": {"max_concurrency": BIG}}, "max_concurrency"),
    ("patch", "/tenants/tn", {"limits": {"rpm": -1}}, "rpm"),
    ("put", "/tenants/tn/grants/ad", {"rpm": BIG}, "rpm"),
    ("put", "/tenants/tn/grants/ad", {"tpm": HUGE}, "tpm"),
    ("put", "/owners/team-a/limits", {"max_concurrency": HUGE}, "max_concurrency"),
    ("post", "/adapters/ad/versions/v1/promote", {"canary_weight": HUGE}, "canary_weight"),
    ("post", "/adapters/ad/prewarm", {"replicas": HUGE}, "replicas"),
    ("post", "/tenants", b'{"id": "t2", "limits": {"rpm": 1e400}}', "limits.rpm"),  # 1e400: infinity
    ("put", "/tenants/tn/grants/ad", b'{"rpm": -1e400}', "rpm"),
]

CONTROL = [
    ("post", "/base-models", {**demo_base_model("b2"), "hf_id": f"org/m{NUL}"}, "hf_id"),
    ("post", "/base-models", {**demo_base_model("b2"), "revision": f"main{NUL}"}, "revision"),
    ("post", "/base-models", {**demo_base_model("b2"), "target_modules": [f"q{NUL}"]}, "target_modules"),
    ("post", "/base-models", {**demo_base_model("b2"), "name": f"b2{NUL}"}, "name"),
    ("post", "/tenants", b'{"id": "t2", "name": "\\ud800"}', "name"),  # a lone surrogate
    ("patch", "/adapters/ad", b'{"description": "\\udfff"}', "description"),
    ("post", "/adapters", {"id": "a2", "base_model": "demo-base", "description": f"x{NUL}y"}, "description"),
    ("post", "/adapters", {"id": "a2", "base_model": "demo-base", "owner": f"team{BEL}"}, "owner"),
    ("post", "/adapters", {"id": f"a2{ESC}", "base_model": "demo-base"}, "id"),
    ("patch", "/adapters/ad", {"description": f"{NUL}"}, "description"),
    ("patch", "/adapters/ad", {"owner": f"o{NUL}"}, "owner"),
    ("post", "/tenants", {"id": "t2", "name": f"Acme{NUL}"}, "name"),
    ("post", "/tenants", {"id": "t2", "name": f"Acme{BEL}"}, "name"),
    ("patch", "/tenants/tn", {"name": f"x{NUL}"}, "name"),
    ("post", "/principals", {"id": "p1", "role": "maintainer", "owners": [f"o{NUL}"]}, "owners"),
    ("post", "/principals", {"id": f"p{NUL}", "role": "viewer"}, "id"),
    ("post", "/bulk/disable", {"selector": {"owner": f"team{NUL}"}, "dry_run": True}, "selector"),
    ("post", "/bulk/disable", {"selector": {"adapters": ["ad"]}, "reason": f"r{NUL}"}, "reason"),
    ("post", "/adapters/ad/versions", {"source_uri": f"s3://b/p{NUL}/"}, "source_uri"),
    ("post", "/adapters/ad/versions/v1/quality-gate", {"status": "passed", "details": {"k": NUL}}, "details"),
    ("post", "/adapters/ad/versions/v1/quality-gate", {"status": "passed", "details": {NUL: 1}}, "details"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), OUT_OF_RANGE + CONTROL)
def test_hostile_body_fields_are_422_naming_the_field(
    c: TestClient, method: str, path: str, body: Any, field: str
) -> None:
    before = _state(c)
    if isinstance(body, bytes):  # what json= cannot send: 1e400, lone surrogates
        r = c.request(method, V1 + path, content=body, headers={"content-type": "application/json"})
    else:
        r = c.request(method, V1 + path, json=body)
    _refused(r, 422, field)
    assert _state(c) == before


def test_free_text_keeps_tabs_and_newlines(c: TestClient) -> None:
    r = c.patch(f"{V1}/adapters/ad", json={"description": "line one\n\tline two\r\n"})
    assert r.status_code == 200 and r.json()["description"] == "line one\n\tline two\r\n"


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/adapters", {"owner": f"team{NUL}"}, "owner"),
        ("/adapters", {"base_model": f"demo{NUL}base"}, "base_model"),
        ("/adapters", {"status": f"active{BEL}"}, "status"),
        ("/adapters", {"cursor": f"abc{NUL}"}, "cursor"),
        ("/audit", {"subject_id": f"ad{NUL}"}, "subject_id"),
        ("/audit", {"action": f"x{NUL}"}, "action"),
        ("/audit", {"subject_type": f"{ESC}[31m"}, "subject_type"),
        ("/audit", {"since": f"2026-01-01{NUL}"}, "since"),
        ("/promotions", {"adapter_id": f"ad{NUL}"}, "adapter_id"),
        ("/tenants", {"limit": f"5{NUL}"}, "limit"),
        ("/adapters", {f"own{NUL}er": "x"}, "own"),
    ],
)
def test_hostile_query_filters_are_422(c: TestClient, path: str, params: dict[str, str], field: str) -> None:
    _refused(c.get(V1 + path, params=params), 422, field)


def test_pagination_limit_out_of_range(c: TestClient) -> None:
    for limit in (str(HUGE), "9" * 400):  # clamped to 500 (SPEC §13), not an overflow
        r = c.get(f"{V1}/adapters", params={"limit": limit})
        assert r.status_code == 200 and [a["id"] for a in r.json()["data"]] == ["ad"]
    for limit in ("-1", str(-HUGE), "0", "1e3"):
        _refused(c.get(f"{V1}/adapters", params={"limit": limit}), 422, "limit")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/adapters/a%00d", "adapter_id"),
        ("/adapters/ad/versions/v%001", "version"),
        ("/tenants/t%07n", "tenant_id"),
        ("/base-models/demo%00base", "name"),
        ("/owners/team%00a", "owner"),
        ("/principals/p%001", "principal_id"),
        ("/promotions/x%00y", "promotion_id"),
        ("/tenants/tn/grants/a%1bd", "adapter_id"),
        ("/tenants/tn/keys/k%00", "key_id"),
        ("/owners/team-a/limits", None),
    ],
)
def test_hostile_path_parameters_are_422_naming_them(c: TestClient, path: str, field: str | None) -> None:
    before = _state(c)
    if field is None:  # control: the same request with a sane path is accepted
        assert c.put(V1 + path, json={"rpm": 5}).status_code == 200
        return
    for method in ("get", "put", "delete", "patch", "post"):
        r = c.request(method, V1 + path, json={})
        if r.status_code != 405:
            _refused(r, 422, field)
    assert _state(c) == before


def test_deep_and_huge_bodies_are_422_and_413(c: TestClient) -> None:
    before = _state(c)
    h = {"content-type": "application/json"}
    # deeper than the JSON parser's recursion: json.loads raises RecursionError (was a 400/500)
    for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        _refused(c.post(f"{V1}/tenants", content=deep, headers=h), 422, "body")
        _refused(c.patch(f"{V1}/adapters/ad", content=deep, headers=h), 422, "body")
    # parseable, but deeper than any request needs (32 levels)
    nested: Any = 1
    for _ in range(40):
        nested = {"k": nested}
    r = c.post(f"{V1}/adapters/ad/versions/v1/quality-gate", json={"status": "passed", "details": nested})
    _refused(r, 422, "details")
    # the text/plain door: the permission check reads JSON bodies whatever their type
    deep_text = {"content-type": "text/plain"}
    _refused(c.post(f"{V1}/tenants", content=b"[" * 100_000, headers=deep_text), 422, "body")
    # huge: 413 before anything is parsed, with or without a Content-Length
    huge = json.dumps({"id": "t9", "name": "x" * (9 * 1024 * 1024)}).encode()
    _refused(c.post(f"{V1}/tenants", content=huge, headers=h), 413, "body", "payload_too_large")
    chunks = iter([huge[i : i + 65536] for i in range(0, len(huge), 65536)])
    _refused(c.post(f"{V1}/tenants", content=chunks, headers=h), 413, "body", "payload_too_large")
    # a digit string past Python's int limit, NaN, a lone surrogate
    _refused(
        c.post(f"{V1}/tenants", content=b'{"id": "t9", "limits": {"rpm": ' + b"9" * 5000 + b"}}", headers=h),
        422,
        "body",
    )
    _refused(c.post(f"{V1}/tenants", content=b'{"id": "t9", "limits": {"rpm": NaN}}', headers=h), 422, "body")
    # a name longer than its column
    _refused(c.post(f"{V1}/tenants", json={"id": "t9", "name": "x" * 256}), 422, "name")
    _refused(
        c.post(f"{V1}/base-models", json={**demo_base_model("b9"), "hf_id": "o/" + "m" * 300}), 422, "hf_id"
    )
    assert _state(c) == before


def _upload(c: TestClient, d: Path) -> Any:
    files = [("files", (p.name, p.read_bytes())) for p in sorted(d.iterdir())]
    return c.post(f"{V1}/adapters/ad/versions", files=files)


def _problems(r: Any) -> str:
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_adapter", err
    return "\n".join(err["details"]["problems"])


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(
    ("raw_config", "expect"),
    [
        ('"r": 8, "revision": "main\\u0000"', "revision"),
        ('"r": 8, "task_type": "CAUSAL\\u0007LM"', "task_type"),
        ('"r": 8, "target_modules": ["q_proj\\u0000"]', "target_modules"),
        ('"r": 1e400', "r"),
        ('"r": 8, "lora_alpha": -1e999', "lora_alpha"),
        ('"r": ' + "9" * 5000, "adapter_config.json"),
        ('"r": 18446744073709551616', "r="),
        ('"r": 8, "loftq_config": ' + _deep(100_000), "adapter_config.json"),
        ('"r": 8, "rank_pattern": ' + '{"a":' * 40 + "1" + "}" * 40, "rank_pattern"),
    ],
)
def test_hostile_adapter_config_is_invalid_adapter(
    c: TestClient, tmp_path: Path, raw_config: str, expect: str
) -> None:
    d = write_adapter(tmp_path / "a")
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg.pop("r")
    if '"lora_alpha"' in raw_config:
        cfg.pop("lora_alpha")
    if '"target_modules"' in raw_config:
        cfg.pop("target_modules")
    body = json.dumps(cfg)
    (d / "adapter_config.json").write_text(body[:-1] + ", " + raw_config + "}")
    before = _state(c)
    assert expect in _problems(_upload(c, d))
    assert _state(c) == before


def test_hostile_safetensors_header_is_invalid_adapter(c: TestClient, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a")
    weights = d / "adapter_model.safetensors"
    raw = weights.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    before = _state(c)
    for meta in (_deep(100_000), '{"k": ' + "9" * 5000 + "}"):
        text = json.dumps({k: v for k, v in header.items() if k != "__metadata__"})
        text = text[:-1] + ', "__metadata__": ' + meta + "}"
        weights.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data)
        assert "adapter_model.safetensors" in _problems(_upload(c, d))
    assert _state(c) == before


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/adapters", b'{"k": "a\\u0000"}'),  # a key no row has, reaching PostgreSQL with a NUL
        ("/tenants", b'{"k": "\\ud800"}'),  # a lone surrogate: neither database can encode it
        ("/principals", b'{"k": ' + b"[" * 3000 + b"]" * 3000 + b"}"),  # RecursionError
        ("/audit", b'{"k": 100000000000000000000000000000}'),  # past the INTEGER id
        ("/adapters/ad/versions", b'{"k": -2147483649}'),
    ],
)
def test_forged_cursors_are_422(c: TestClient, path: str, raw: bytes) -> None:
    _refused(c.get(V1 + path, params={"cursor": _cursor(raw)}), 422, "cursor")


def test_times_utc_cannot_hold_are_422(c: TestClient) -> None:
    for since in ("9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"):
        _refused(c.get(f"{V1}/audit", params={"since": since}), 422, "since")
        body = {"selector": {"promoted_since": since}, "dry_run": True}
        _refused(c.post(f"{V1}/bulk/disable", json=body), 422, "promoted_since")
    assert c.get(f"{V1}/audit", params={"since": "0001-01-01"}).status_code == 200


def test_deep_json_under_a_multipart_type_is_422(c: TestClient) -> None:
    """Multipart bodies skip the input guard (uploads stream); the permission check that reads a
    route's JSON body must still not fall over on a nesting deeper than json's recursion."""
    h = {"content-type": "multipart/form-data; boundary=xyz"}
    for path in ("/bulk/disable", "/tenants", "/adapters/ad/versions/v1/promote"):
        r = c.post(V1 + path, content=b"[" * 100_000, headers=h)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
