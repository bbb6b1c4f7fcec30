"""Regression sets, quality policies and evaluation records through the admin API (SPEC §16),
on SQLite and PostgreSQL: strict validation with every problem listed and nothing stored,
versions and hashes, preconditions of an evaluation, a gateway that cannot be reached (the run
fails visibly, the gate is untouched), and restarts (a run a killed process left ``running``
ends ``failed`` with the reason)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from kit.db import session_scope
from kit.procs import free_port
from registry.quality import service
from registry.quality.models import EvaluationRow
from registry.quality.settings import EvaluatorSettings
from tests.registry.core_support import AUTH, add_versions, make_settings, seed_adapter
from tests.registry.quality_support import json_cases, jsonl

V1 = "/admin/v1"
JSONL = {"content-type": "application/jsonl"}


def _app(tmp_path: Path, db_url: str, engine: Engine, **evaluator: Any) -> TestClient:
    from registry.api import create_admin_app

    evaluator.setdefault("eval_gateway_url", f"http://127.0.0.1:{free_port()}")
    settings = EvaluatorSettings(**evaluator)
    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine, evaluator_settings=settings)
    return TestClient(app, headers=AUTH)


@pytest.fixture
def qc(tmp_path: Path, db_url: str, engine: Engine) -> Iterator[TestClient]:
    """The admin API whose evaluator points at a port where nothing listens."""
    with _app(tmp_path, db_url, engine) as c:
        yield c


def _problems(r: Any) -> list[str]:
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    problems: list[str] = err["details"]["problems"]
    return problems


def test_every_problem_of_a_bad_set_is_listed_and_nothing_is_stored(qc: TestClient) -> None:
    seed_adapter(qc, "shop")
    lines = [
        json.dumps(
            {"id": "a", "prompt": "hi", "checks": [{"type": "json_schema", "schema": {"type": "nope"}}]}
        ),
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "x"}], "checks": []}),
        json.dumps({"id": "b", "checks": [{"type": "regex", "pattern": "(unclosed"}]}),
        json.dumps({"id": "c", "prompt": "x", "messages": [], "max_tokens": 0}),
        json.dumps(
            {"id": "d", "prompt": "x", "checks": [{"type": "max_chars", "n": 0}, {"type": "sentiment"}]}
        ),
        json.dumps({"id": "e", "prompt": "x", "checks": [{"type": "refusal", "expected": "no"}], "extra": 1}),
        json.dumps({"id": "f", "messages": [{"role": "robot", "content": 3}]}),
        json.dumps({"id": "g", "prompt": "x", "checks": [{"type": "contains", "txt": "y"}]}),
    ]
    r = qc.put(f"{V1}/adapters/shop/regression-set", content="\n".join(lines), headers=JSONL)
    problems = _problems(r)
    expected = [
        "line 1 (id 'a'): checks[0].schema is not a valid JSON Schema",
        "line 2: id 'a' is already used by line 1",
        "line 3 (id 'b'): exactly one of messages or prompt is required",
        "line 3 (id 'b'): checks[0].pattern does not compile",
        "line 4 (id 'c'): exactly one of messages or prompt is required",
        "line 4 (id 'c'): max_tokens must be an integer from 1 to",
        "line 5 (id 'd'): checks[0].n must be a positive integer",
        "line 5 (id 'd'): checks[1].type must be one of",
        "line 6 (id 'e'): unknown keys ['extra']",
        "line 6 (id 'e'): checks[0].expected must be true or false",
        "line 7 (id 'f'): messages[0].role must be one of",
        "line 7 (id 'f'): messages[0].content must be a string",
        "line 8 (id 'g'): checks[0]: unknown keys ['txt'] for a contains check",
        "line 8 (id 'g'): checks[0].text must be a non-empty string",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), (want, problems)
    assert len(problems) == len(expected)
    r = qc.get(f"{V1}/adapters/shop/regression-set")
    assert r.status_code == 404 and r.json()["error"]["code"] == "regression_set_not_found"
    for body in ("", "[]", "[1]", '{"id": "x"}'):
        assert _problems(qc.put(f"{V1}/adapters/shop/regression-set", content=body))
    # a body that does not parse (or holds NaN) is refused at the API's input guard, naming the line
    for body, headers, field in (
        ('{"id": "x", "prompt": "p"}\n{not json', JSONL, "body.line2"),
        ('[{"id": "x", "prompt": "p", "checks": [{"type": "max_chars", "n": NaN}]}]', {}, "body"),
        ("[1, ", {}, "body"),
    ):
        r = qc.put(f"{V1}/adapters/shop/regression-set", content=body, headers=headers)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        assert r.json()["error"]["details"]["field"] == field
    r = qc.put(f"{V1}/adapters/nobody/regression-set", content=jsonl(json_cases(1)), headers=JSONL)
    assert r.status_code == 404 and r.json()["error"]["code"] == "adapter_not_found"


def test_sets_are_versioned_and_hashed(qc: TestClient) -> None:
    seed_adapter(qc, "shop")
    cases = json_cases(4)
    r = qc.put(f"{V1}/adapters/shop/regression-set", content=json.dumps(cases))
    assert r.status_code == 200, r.text
    first = r.json()
    canonical = json.dumps(first["cases"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert first["version"] == 1 and first["case_count"] == 4
    assert first["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert first["check_counts"] == {"json_schema": 4, "max_chars": 4, "refusal": 4, "regex": 2}
    # the same cases as JSON Lines: same hash, no new version
    again = qc.put(f"{V1}/adapters/shop/regression-set", content=jsonl(cases), headers=JSONL).json()
    assert (again["version"], again["sha256"]) == (1, first["sha256"])
    second = qc.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(5)), headers=JSONL).json()
    assert second["version"] == 2 and second["sha256"] != first["sha256"]
    assert qc.get(f"{V1}/adapters/shop/regression-set").json()["version"] == 2
    old = qc.get(f"{V1}/adapters/shop/regression-set", params={"version": 1}).json()
    assert old["sha256"] == first["sha256"] and [c["id"] for c in old["cases"]] == [c["id"] for c in cases]
    r = qc.get(f"{V1}/adapters/shop/regression-set", params={"version": 7})
    assert r.status_code == 404
    events = qc.get(f"{V1}/audit", params={"action": "regression_set.uploaded"}).json()["data"]
    assert [e["details"]["regression_set_version"] for e in events] == [1, 2]


def test_quality_policy(qc: TestClient) -> None:
    seed_adapter(qc, "shop")
    got = qc.get(f"{V1}/adapters/shop/quality-policy").json()
    assert got["quality_policy"] is None
    assert got["effective"] == {"min_pass_rate": 0.9, "max_regression_pp": 5.0, "max_format_error_rate": 0.05}
    bad = {"min_pass_rate": 1.5, "max_regression_pp": "5", "max_format_error_rate": True, "typo": 1}
    problems = _problems(qc.put(f"{V1}/adapters/shop/quality-policy", json=bad))
    assert len(problems) == 4, problems
    r = qc.put(f"{V1}/adapters/shop/quality-policy", json={"min_pass_rate": 0.8, "max_regression_pp": 2})
    assert r.status_code == 200, r.text
    assert r.json()["effective"] == {
        "min_pass_rate": 0.8,
        "max_regression_pp": 2.0,
        "max_format_error_rate": 0.05,
    }
    assert qc.get(f"{V1}/adapters/shop/quality-policy").json()["quality_policy"]["min_pass_rate"] == 0.8


def test_evaluation_preconditions(qc: TestClient, factory: Any) -> None:
    seed_adapter(qc, "shop")
    (v1,) = add_versions(factory, "shop", 1)
    r = qc.post(f"{V1}/adapters/shop/versions/{v1}/evaluations")
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_regression_set"
    qc.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(2)), headers=JSONL)
    r = qc.post(f"{V1}/adapters/shop/versions/v9/evaluations")
    assert r.status_code == 404 and r.json()["error"]["code"] == "version_not_found"
    assert qc.post(f"{V1}/adapters/shop/versions/{v1}/disable").status_code == 200
    r = qc.post(f"{V1}/adapters/shop/versions/{v1}/evaluations")
    assert r.status_code == 409 and r.json()["error"]["code"] == "version_disabled"
    r = qc.get(f"{V1}/adapters/shop/versions/{v1}/evaluations/ev_nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "evaluation_not_found"


def _wait_done(c: TestClient, path: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ev: dict[str, Any] = c.get(path).json()
        if ev["status"] != "running":
            return ev
        assert time.monotonic() < deadline, ev
        time.sleep(0.1)


def test_unreachable_gateway_fails_the_run_and_leaves_the_gate(qc: TestClient, factory: Any) -> None:
    seed_adapter(qc, "shop")
    (v1,) = add_versions(factory, "shop", 1)
    qc.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(3)), headers=JSONL)
    r = qc.post(f"{V1}/adapters/shop/versions/{v1}/evaluations")
    assert r.status_code == 202, r.text
    started = r.json()
    assert started["status"] == "running" and started["progress"] == {"done": 0, "total": 6, "fraction": 0.0}
    ev = _wait_done(qc, f"{V1}/adapters/shop/versions/{v1}/evaluations/{started['id']}")
    assert ev["status"] == "failed" and ev["verdict"] is None and ev["result"] is None
    assert "cannot reach the gateway at http://127.0.0.1:" in ev["error"]
    assert qc.get(f"{V1}/adapters/shop/versions/{v1}").json()["quality_gate"] == "skipped"
    # the evaluator's key was issued and revoked, its tenant made once
    actions = [
        (e["actor"], e["action"])
        for e in qc.get(f"{V1}/audit", params={"subject_id": "loraplane-evaluator"}).json()["data"]
    ]
    assert actions == [
        ("evaluator", "tenant.created"),
        ("evaluator", "grant.added"),
        ("evaluator", "key.issued"),
        ("evaluator", "key.revoked"),
    ]
    failed = qc.get(f"{V1}/audit", params={"action": "evaluation.failed"}).json()["data"]
    assert failed[0]["details"]["evaluation_id"] == started["id"]
    listed = qc.get(f"{V1}/adapters/shop/versions/{v1}/evaluations").json()
    assert [e["id"] for e in listed["data"]] == [started["id"]] and listed["next_cursor"] is None


def test_a_run_left_running_by_a_killed_process_fails_at_the_next_start(
    tmp_path: Path, db_url: str, engine: Engine, factory: Any
) -> None:
    with _app(tmp_path, db_url, engine) as c:
        seed_adapter(c, "shop")
        (v1,) = add_versions(factory, "shop", 1)
        c.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(2)), headers=JSONL)
    # what a process killed mid-run leaves: a running row, its heartbeat ageing
    with session_scope(factory) as s:
        dead = service.start_evaluation(s, "shop", v1, actor="bootstrap", worker="gone:1:dead")["id"]
        row = s.get(EvaluationRow, dead)
        assert row is not None and row.heartbeat_at is not None
        row.heartbeat_at -= timedelta(seconds=120)
    with _app(tmp_path, db_url, engine, eval_stale_s=60) as c:
        ev = _wait_done(c, f"{V1}/adapters/shop/versions/{v1}/evaluations/{dead}", timeout=20)
        assert ev["status"] == "failed"
        assert ev["error"].startswith("interrupted: the process running it (gone:1:dead) stopped reporting")
        # and a new run can start at once
        assert c.post(f"{V1}/adapters/shop/versions/{v1}/evaluations").status_code == 202


def test_a_recent_orphan_fails_once_its_heartbeat_goes_stale(
    tmp_path: Path, db_url: str, engine: Engine, factory: Any
) -> None:
    with _app(tmp_path, db_url, engine, eval_stale_s=1.0) as c:
        seed_adapter(c, "shop")
        (v1,) = add_versions(factory, "shop", 1)
        c.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(2)), headers=JSONL)
        with session_scope(factory) as s:  # another process, just killed: its heartbeat is fresh
            orphan = service.start_evaluation(s, "shop", v1, actor="bootstrap", worker="other:2:gone")["id"]
        r = c.post(f"{V1}/adapters/shop/versions/{v1}/evaluations")
        assert r.status_code == 409 and r.json()["error"]["details"]["evaluation_id"] == orphan
        ev = _wait_done(c, f"{V1}/adapters/shop/versions/{v1}/evaluations/{orphan}", timeout=30)
        assert ev["status"] == "failed" and "interrupted" in ev["error"]


def test_shutdown_fails_its_own_runs(tmp_path: Path, db_url: str, engine: Engine, factory: Any) -> None:
    """A clean stop (SIGTERM of the server) marks the runs of this process failed at once."""
    import socket

    hang = socket.socket()  # a gateway that accepts connections and never answers
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    url = f"http://127.0.0.1:{hang.getsockname()[1]}"
    try:
        with _app(tmp_path, db_url, engine, eval_gateway_url=url) as c:
            seed_adapter(c, "shop")
            (v1,) = add_versions(factory, "shop", 1)
            c.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(2)), headers=JSONL)
            eid = c.post(f"{V1}/adapters/shop/versions/{v1}/evaluations").json()["id"]
            time.sleep(0.5)
            assert c.get(f"{V1}/adapters/shop/versions/{v1}/evaluations/{eid}").json()["status"] == "running"
        with _app(tmp_path, db_url, engine) as c:
            ev = c.get(f"{V1}/adapters/shop/versions/{v1}/evaluations/{eid}").json()
            assert ev["status"] == "failed"
            assert ev["error"] == "interrupted: the registry process stopped during the run"
    finally:
        hang.close()


def test_a_registry_without_a_gateway_says_what_to_set(
    tmp_path: Path, db_url: str, engine: Engine, factory: Any
) -> None:
    with _app(tmp_path, db_url, engine, eval_gateway_url=None) as c:
        seed_adapter(c, "shop")
        (v1,) = add_versions(factory, "shop", 1)
        c.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(1)), headers=JSONL)
        eid = c.post(f"{V1}/adapters/shop/versions/{v1}/evaluations").json()["id"]
        ev = _wait_done(c, f"{V1}/adapters/shop/versions/{v1}/evaluations/{eid}")
        assert ev["status"] == "failed"
        assert ev["error"].startswith(
            "no gateway is configured for evaluations: set LORAPLANE_EVAL_GATEWAY_URL"
        )
        keys = c.get(f"{V1}/audit", params={"action": "key.issued"}).json()["data"]
        assert keys == []  # nothing issued for a run that cannot start


def test_openapi_describes_the_quality_routes(qc: TestClient) -> None:
    paths = TestClient(qc.app).get(f"{V1}/openapi.json").json()["paths"]
    put = paths["/admin/v1/adapters/{adapter_id}/regression-set"]["put"]
    assert set(put["requestBody"]["content"]) == {"application/jsonl", "application/json"}
    assert "post" in paths["/admin/v1/adapters/{adapter_id}/versions/{version}/evaluations"]
    assert "get" in paths["/admin/v1/adapters/{adapter_id}/versions/{version}/evaluations/{eval_id}"]


def test_recorded_runs_wait_for_an_evaluator_process(
    tmp_path: Path, db_url: str, engine: Engine, factory: Any
) -> None:
    """With LORAPLANE_EVAL_IN_PROCESS=false the admin API only records a run; a run no evaluator
    claims fails visibly once stale, and an evaluator worker claims the next one."""
    from registry.quality.standalone import transaction
    from registry.quality.worker import EvaluationWorker

    with _app(tmp_path, db_url, engine, eval_in_process=False, eval_stale_s=1.0) as c:
        seed_adapter(c, "shop")
        (v1,) = add_versions(factory, "shop", 1)
        c.put(f"{V1}/adapters/shop/regression-set", content=jsonl(json_cases(1)), headers=JSONL)
        path = f"{V1}/adapters/shop/versions/{v1}/evaluations"
        first = c.post(path).json()["id"]
        ev = _wait_done(c, f"{path}/{first}", timeout=30)
        assert ev["status"] == "failed" and ev["error"].startswith("no evaluator picked it up within 1 s")

    with _app(tmp_path, db_url, engine, eval_in_process=False) as c:
        second = c.post(f"{V1}/adapters/shop/versions/{v1}/evaluations").json()["id"]
        time.sleep(0.5)
        assert c.get(f"{path}/{second}").json()["status"] == "running"  # nobody runs it here
        url = f"http://127.0.0.1:{free_port()}"
        worker = EvaluationWorker(EvaluatorSettings(eval_gateway_url=url), transaction(engine, None))
        worker.start(claim=True)
        try:
            ev = _wait_done(c, f"{path}/{second}", timeout=30)
        finally:
            worker.stop()
        assert ev["status"] == "failed" and f"cannot reach the gateway at {url}" in ev["error"]
