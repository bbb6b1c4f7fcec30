"""Concurrent approvals of one promotion request execute it once (SPEC §14), on PostgreSQL with
parallel transactions: the approvers lock the adapter row, then the request row."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from kit import localservices as ls
from kit.db import make_engine, make_session_factory, session_scope
from kit.errors import LoraplaneError
from registry import migrate
from registry.auth import Principal
from registry.repositories import base_models as base_repo
from registry.services import adapters as adapter_svc
from registry.services import base_models as base_svc
from registry.services import promotions
from registry.services.versions import register_version


@pytest.fixture(scope="module")
def pg_engine() -> Iterator[Engine]:
    with ls.temp_pg_database("govconc") as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=20)
        yield engine
        engine.dispose()


def _setup(factory: Any, adapter_id: str, required: int) -> str:
    from registry.demo import demo_base_model

    with session_scope(factory) as s:
        if base_repo.get(s, "demo-base") is None:
            base_svc.create_base_model(s, demo_base_model(), actor="t")
        adapter_svc.create_adapter(
            s, adapter_id=adapter_id, base_model="demo-base", owner="team-a", description=None, actor="t"
        )
        for i in range(2):
            register_version(
                s, adapter_id, rank=8, lora_alpha=16.0, target_modules=["q_proj"],
                files=[{"name": "adapter_model.safetensors", "size": 1, "sha256": f"{i:064x}"}],
                storage_uri=f"file:///x/{adapter_id}/{i}/", actor="t",
            )  # fmt: skip
    with session_scope(factory) as s:
        promotions.promote_or_request(
            s, adapter_id, "v1", canary_weight=None, force=False, actor="t", ttl_s=60
        )
        adapter_svc.update_adapter(s, adapter_id, {"approvals_required": required}, actor="t")
    with session_scope(factory) as s:
        out = promotions.promote_or_request(
            s, adapter_id, "v2", canary_weight=None, force=False, actor="mia", ttl_s=60
        )
    assert out.promotion is not None
    return out.promotion.id


def _approve_all_at_once(factory: Any, pid: str, approvers: list[str]) -> list[str]:
    barrier = threading.Barrier(len(approvers))
    results: list[str] = []
    lock = threading.Lock()

    def approve(name: str) -> None:
        barrier.wait()
        try:
            with session_scope(factory) as s:
                out = promotions.approve(s, pid, Principal(name, "approver", ("team-a",)), comment=None)
            outcome = out.promotion.status if out.promotion is not None else "?"
        except LoraplaneError as e:
            outcome = e.code
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=approve, args=(n,)) for n in approvers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return sorted(results)


@pytest.mark.parametrize(("adapter_id", "required", "approvers"), [("c0", 1, 8), ("c1", 2, 6)])
def test_concurrent_approvals_execute_once(
    pg_engine: Engine, adapter_id: str, required: int, approvers: int
) -> None:
    factory = make_session_factory(pg_engine)
    pid = _setup(factory, adapter_id, required)
    names = [f"appr{i}" for i in range(approvers)]
    results = _approve_all_at_once(factory, pid, names)
    assert results.count("executed") == 1, results
    assert results.count("pending") == required - 1, results
    assert results.count("promotion_not_pending") == approvers - required, results
    with pg_engine.connect() as conn:
        promoted = conn.execute(
            text(
                "SELECT count(*) FROM audit_events WHERE action = 'version.promoted' AND subject_id = :a "
                "AND details::jsonb ? 'promotion_id'"
            ),
            {"a": adapter_id},
        ).scalar()
        executed = conn.execute(
            text("SELECT count(*) FROM audit_events WHERE action = 'promotion.executed' AND subject_id = :a"),
            {"a": adapter_id},
        ).scalar()
        active = conn.execute(
            text("SELECT number FROM versions WHERE adapter_id = :a AND status = 'active'"), {"a": adapter_id}
        ).all()
        approvals = conn.execute(
            text("SELECT approvals FROM promotion_requests WHERE id = :p"), {"p": pid}
        ).scalar()
    assert (promoted, executed, [r[0] for r in active]) == (1, 1, [2])
    assert isinstance(approvals, list) and len(approvals) == required


def test_concurrent_http_approvals_execute_once(pg_engine: Engine, tmp_path: Path) -> None:
    """The same through the admin API: a real server on PostgreSQL, approvers calling at once."""
    import httpx
    import uvicorn

    from kit.procs import free_port, http_ready, wait_for
    from registry.api import create_admin_app
    from tests.registry.core_support import AUTH, make_settings

    factory = make_session_factory(pg_engine)
    url = pg_engine.url.render_as_string(hide_password=False)
    app = create_admin_app(make_settings(tmp_path, url), engine=pg_engine)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}/admin/v1"
    try:
        wait_for(http_ready(f"{base}/healthz", timeout=5), 60)
        pid = _setup(factory, "c2", 1)
        tokens = []
        with httpx.Client(headers=AUTH) as admin:
            for i in range(6):
                r = admin.post(
                    f"{base}/principals", json={"id": f"h{i}", "role": "approver", "owners": ["team-a"]}
                )
                assert r.status_code == 201, r.text
                tokens.append(admin.post(f"{base}/principals/h{i}/tokens").json()["token"])
        barrier = threading.Barrier(len(tokens))
        answers: list[tuple[int, str]] = []
        lock = threading.Lock()

        def approve(token: str) -> None:
            with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
                barrier.wait()
                r = c.post(f"{base}/promotions/{pid}/approve")
            body = r.json()
            with lock:
                answers.append((r.status_code, body.get("status") or body["error"]["code"]))

        threads = [threading.Thread(target=approve, args=(t,)) for t in tokens]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(answers) == [(200, "executed")] + [(409, "promotion_not_pending")] * 5, answers
        with httpx.Client(headers=AUTH) as admin:
            adapter = admin.get(f"{base}/adapters/c2").json()
            promoted = admin.get(
                f"{base}/audit", params={"action": "version.promoted", "subject_id": "c2", "limit": 500}
            ).json()["data"]
        assert adapter["active_version"] == "v2"
        assert [e["details"].get("promotion_id") for e in promoted] == [None, pid]  # v1 directly, v2 once
    finally:
        server.should_exit = True
        thread.join(timeout=10)
