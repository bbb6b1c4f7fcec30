"""Concurrent changes on both databases: promotes from many threads end in one consistent state
(one active version, a coherent rollback chain), and the database itself refuses two active
versions of one adapter."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from kit.db import session_scope
from kit.errors import Conflict
from registry.demo import demo_base_model
from registry.models import VersionRow
from registry.services import adapters as adapter_svc
from registry.services import lifecycle
from registry.services.base_models import create_base_model
from registry.services.snapshot import current_revision
from tests.registry.core_support import (
    add_versions,
)


def _seed(factory: Any, adapter_id: str, versions: int) -> None:
    with session_scope(factory) as s:
        create_base_model(s, demo_base_model(), actor="test")
        adapter_svc.create_adapter(
            s, adapter_id=adapter_id, base_model="demo-base", owner=None, description=None, actor="test"
        )
    add_versions(factory, adapter_id, versions)


def _run_threads(n: int, target: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def wrap(i: int) -> None:
        try:
            barrier.wait(timeout=20)
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_concurrent_promotes_leave_one_consistent_state(factory: Any) -> None:
    n = 6
    _seed(factory, "race", n)
    with session_scope(factory) as s:
        lifecycle.promote(s, "race", "v1", actor="test")
        rev0 = current_revision(s)

    def promote(i: int) -> None:
        # every thread promotes a different version, twice over, racing the others
        for v in (f"v{2 + i % (n - 1)}", f"v{2 + (i + 2) % (n - 1)}"):
            try:
                with session_scope(factory) as s:
                    lifecycle.promote(s, "race", v, actor=f"t{i}")
            except Conflict as e:
                assert e.code == "already_active"

    errors = _run_threads(n, promote)
    assert errors == []
    with session_scope(factory) as s:
        d = adapter_svc.describe_adapter(s, "race")
        rev = current_revision(s)
        promoted = [
            row[0]
            for row in s.execute(
                sa.text("SELECT details FROM audit_events WHERE action = 'version.promoted' ORDER BY id")
            )
        ]
    promoted = [json.loads(p) if isinstance(p, str) else p for p in promoted]
    assert d.versions is not None
    active = [v for v in d.versions if v.status == "active"]
    assert len(active) == 1 and d.active_version == active[0].version
    assert all(v.status in ("retired", "active", "ready") for v in d.versions)
    # the revision moved once per successful promote (each with its audit event) ...
    assert rev - rev0 == len(promoted) - 1  # minus the initial promote of v1
    # ... and the promotes were serialised: each saw the previous one's result as "previous"
    for before, after in itertools.pairwise(promoted):
        assert after["previous"] == before["version"]
    assert promoted[-1]["version"] == d.active_version
    assert active[0].rollback_to == promoted[-1]["previous"]


def test_concurrent_mixed_changes_keep_invariants(factory: Any) -> None:
    _seed(factory, "mix", 4)
    with session_scope(factory) as s:
        lifecycle.promote(s, "mix", "v1", actor="test")

    ops = [
        lambda s: lifecycle.promote(s, "mix", "v2", actor="a"),
        lambda s: lifecycle.promote(s, "mix", "v3", canary_weight=20, actor="b"),
        lambda s: lifecycle.rollback(s, "mix", actor="c"),
        lambda s: lifecycle.promote(s, "mix", "v4", canary_weight=40, actor="d"),
        lambda s: lifecycle.set_adapter_enabled(s, "mix", False, actor="e"),
        lambda s: lifecycle.promote(s, "mix", "v3", actor="f"),
    ]

    def run(i: int) -> None:
        for _ in range(2):
            try:
                with session_scope(factory) as s:
                    ops[i](s)
            except Conflict:
                pass

    assert _run_threads(len(ops), run) == []
    with session_scope(factory) as s:
        d = adapter_svc.describe_adapter(s, "mix")
    assert d.versions is not None
    active = [v.version for v in d.versions if v.status == "active"]
    canary = [v.version for v in d.versions if v.status == "canary"]
    assert len(active) <= 1 and len(canary) <= 1
    assert d.active_version == (active[0] if active else None)
    assert d.canary_version == (canary[0] if canary else None)
    assert (d.canary_weight is None) == (d.canary_version is None)


def test_concurrent_uploads_get_distinct_numbers(factory: Any) -> None:
    _seed(factory, "up", 0)
    got: list[str] = []
    lock = threading.Lock()

    def upload(i: int) -> None:
        vs = add_versions(factory, "up", 2)
        with lock:
            got.extend(vs)

    assert _run_threads(5, upload) == []
    assert sorted(got, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(1, 11)]


def test_database_refuses_two_active_versions(factory: Any) -> None:
    _seed(factory, "dbg", 2)
    with pytest.raises(IntegrityError), session_scope(factory) as s:
        s.execute(sa.update(VersionRow).where(VersionRow.adapter_id == "dbg").values(status="active"))
    with pytest.raises(IntegrityError), session_scope(factory) as s:
        s.execute(sa.update(VersionRow).where(VersionRow.adapter_id == "dbg").values(status="canary"))
    with session_scope(factory) as s:  # other statuses may repeat
        s.execute(sa.update(VersionRow).where(VersionRow.adapter_id == "dbg").values(status="retired"))
