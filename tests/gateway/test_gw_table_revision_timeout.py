"""The routing table's revision check is bounded by ``revision_timeout_s`` — the gateway passes
``LORAPLANE_DATABASE_TIMEOUT_S`` (a hung registry database counts as a failure after as long as
any database operation, not after a fixed 10 s)."""

from __future__ import annotations

import asyncio
import time

from gateway.build import build_gateway
from gateway.settings import GatewaySettings
from gateway.table import RoutingTable
from registry.snapshot import RoutingSnapshot

from .gw_fakes import FakeRouter, make_snapshot


class HangingApplier:
    """A change applier whose revision read never answers (a database that hangs)."""

    async def __call__(self, base: RoutingSnapshot, subjects: frozenset[str], revision: int) -> None:
        return None

    async def revision(self) -> int:
        await asyncio.sleep(3600)
        return 0

    async def aclose(self) -> None:
        return None


async def test_a_hanging_revision_read_fails_after_revision_timeout_s_and_keeps_the_snapshot() -> None:
    snap, _keys = make_snapshot()
    table = RoutingTable(lambda: snap, apply_changes=HangingApplier(), revision_timeout_s=0.3)
    await table.refresh()
    assert table.snapshot is snap and not table.stale
    t0 = time.monotonic()
    await table.check_revision()
    waited = time.monotonic() - t0
    assert 0.25 <= waited < 2.0, waited
    assert table.stale and table.snapshot is snap  # a failure: the last snapshot stays


def test_the_gateway_passes_its_database_timeout() -> None:
    snap, _keys = make_snapshot()
    settings = GatewaySettings(database_timeout_s=2.5)
    gw = build_gateway(settings, router=FakeRouter(), loader=lambda: snap)  # type: ignore[arg-type]
    assert gw.table._revision_timeout_s == 2.5
