"""A pool given as ``"dns": "host:port"``: every address the name resolves to is one replica,
re-resolved every ``dns_interval_s`` — replicas join and leave as the answer changes, and a
failed lookup keeps the replicas the pool has.

Two real simulators listen on the same port at 127.0.0.2 and 127.0.0.3 (loopback aliases), as
pods behind a headless Kubernetes service would; the name's answers come from a stand-in for
the event loop's resolver (other names resolve as usual).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kit.localservices import free_port
from registry.audit_sink import MemoryAuditSink
from registry.storage.local import LocalArtifactStore
from router.core import Router
from router.settings import PoolConfig, RouterSettings
from simulator.procs import SimProcess, stop_all
from tests.router.routerkit import SIM_ARGS, chat, put_version, snapshot_of, wait_until

pytestmark = pytest.mark.xdist_group("router-dns")

NAME = "vllm-headless.loraplane.test"
ADDRS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def port_sims() -> Iterator[tuple[int, list[SimProcess]]]:
    port = free_port()
    sims = [
        SimProcess(
            host=a,
            port=port,
            extra_args=SIM_ARGS,
            env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
            ready_timeout=180.0,
        ).start()
        for a in ADDRS
    ]
    try:
        for s in sims:
            s.wait_ready()
        yield port, sims
    finally:
        stop_all(sims)


class FakeDns:
    """Answers for NAME; raises OSError (like a failed lookup) when ``answers`` is None."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.answers: list[str] | None = [ADDRS[0]]
        self.lookups = 0

    async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host != NAME:
            return await self.real(host, port, *args, **kw)
        self.lookups += 1
        if self.answers is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port))) for a in self.answers]


async def test_dns_pool_follows_the_name_and_keeps_replicas_on_lookup_failure(
    port_sims: tuple[int, list[SimProcess]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = port_sims
    loop = asyncio.get_running_loop()
    dns = FakeDns(loop.getaddrinfo)
    monkeypatch.setattr(loop, "getaddrinfo", dns.getaddrinfo)
    settings = RouterSettings(
        pools=[
            PoolConfig(
                name="dns",
                base_model="demo-base",
                dns=f"{NAME}:{port}",
                dns_interval_s=0.1,
                max_loras=2,
                max_adapters=4,
                staging={"mode": "local", "dir": str(tmp_path / "staging")},  # type: ignore[arg-type]
            )
        ],
        data_dir=tmp_path / "data",
        poll_interval_s=0.2,
        poll_timeout_s=5.0,
        unhealthy_after=2,
        reconcile_interval_s=0.3,
        load_timeout_s=10.0,
    )
    artifacts = LocalArtifactStore(tmp_path / "artifacts")
    router = Router(
        settings, store=artifacts, audit=MemoryAuditSink(), redis=None, registry=CollectorRegistry()
    )
    await router.start()
    try:
        urls = [f"http://{a}:{port}" for a in ADDRS]

        def present() -> set[str]:
            return {r["url"] for r in router.replica_records()}

        await wait_until(lambda: router.healthy_count("demo-base") == 1, timeout=30)
        assert present() == {urls[0]}
        v = put_version(artifacts, tmp_path, "dnsed", seed=5)
        router.update_snapshot(snapshot_of(v))
        res = await router.forward(chat(v))
        assert res.status == 200 and res.replica == urls[0]

        dns.answers = list(ADDRS)  # scale out: a second pod answers
        await wait_until(lambda: router.healthy_count("demo-base") == 2, timeout=30)
        assert present() == set(urls)

        dns.answers = None  # the resolver fails: keep serving with what we have
        before = dns.lookups
        await wait_until(lambda: dns.lookups >= before + 3, timeout=10)
        assert present() == set(urls) and router.healthy_count("demo-base") == 2

        dns.answers = [ADDRS[1]]  # scale in: the first pod is gone from the answer
        await wait_until(lambda: present() == {urls[1]}, timeout=10)
        res = await router.forward(chat(v))
        assert res.status == 200 and res.replica == urls[1]
    finally:
        await router.stop()
