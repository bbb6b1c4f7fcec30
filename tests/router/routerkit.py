"""Helpers for router tests: put adapter versions into a real artifact store, build snapshots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from registry.adapter_factory import write_adapter
from registry.snapshot import AdapterInfo, BaseModelInfo, FileInfo, RoutingSnapshot, VersionInfo
from router.contract import ForwardRequest
from simulator.procs import SimProcess, stop_all


def put_version(
    store: Any,
    tmp: Path,
    adapter_id: str,
    version: str = "v1",
    *,
    seed: int = 0,
    status: str = "active",
    base_model: str = "demo-base",
) -> VersionInfo:
    """Write a small valid adapter and store it through the store's real upload path."""
    src = write_adapter(tmp / f"src-{adapter_id}-{version}-{seed}", rank=4, seed=seed, layers=1)
    pending = store.begin(adapter_id)
    infos: list[FileInfo] = []
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        w = pending.writer(name)
        w.write((src / name).read_bytes())
        infos.append(w.close())
    pending.commit()
    number = int(version[1:])
    return VersionInfo(
        adapter_id=adapter_id,
        version=version,
        number=number,
        status=status,
        rank=4,
        lora_alpha=16.0,
        target_modules=("q_proj", "v_proj"),
        files=tuple(infos),
        storage_uri=pending.storage_uri,
        base_model=base_model,
    )


def snapshot_of(
    *versions: VersionInfo, revision: int = 1, disabled: tuple[str, ...] = (), hot: tuple[str, ...] = ()
) -> RoutingSnapshot:
    adapters: dict[str, AdapterInfo] = {}
    for v in versions:
        prev = adapters.get(v.adapter_id)
        vs = dict(prev.versions) if prev else {}
        vs[v.version] = v
        active = v.version if v.status == "active" else (prev.active_version if prev else None)
        adapters[v.adapter_id] = AdapterInfo(
            id=v.adapter_id,
            base_model=v.base_model,
            status="disabled" if v.adapter_id in disabled else "active",
            active_version=active,
            canary_version=None,
            canary_weight=None,
            versions=vs,
            hot=v.adapter_id in hot,
        )
    return RoutingSnapshot(
        revision=revision,
        base_models={
            "demo-base": BaseModelInfo("demo-base", "loraplane/demo-base", 64, ("q_proj", "v_proj"))
        },
        adapters=adapters,
    )


def chat(
    version: VersionInfo | None,
    *,
    stream: bool = False,
    max_tokens: int = 8,
    client_wants_usage: bool = False,
    want_usage: bool = True,
    request_id: str = "req-1",
) -> ForwardRequest:
    client_model = f"demo-base:{version.adapter_id}" if version else "demo-base"
    body: dict[str, Any] = {
        "model": client_model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if client_wants_usage:
        body["stream_options"] = {"include_usage": True}
    return ForwardRequest(
        request_id=request_id,
        tenant_id="t1",
        base_model="demo-base",
        version=version,
        endpoint="chat/completions",
        body=body,
        client_model=client_model,
        stream=stream,
        client_wants_usage=client_wants_usage,
        want_usage=want_usage,
    )


async def wait_until(
    pred: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, step: float = 0.05
) -> None:
    """Poll ``pred`` until true (bounded); AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / step) + 2):
        got = pred()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(step)
    raise AssertionError("condition not met in time")


# --------------------------------------------------------------------------- simulators


_HTTP: Any = None


def http() -> Any:
    """One shared sync httpx client (creating one per call is slow on a loaded machine)."""
    global _HTTP
    import httpx

    if _HTTP is None:
        _HTTP = httpx.Client(timeout=5.0)
    return _HTTP


class Sim(SimProcess):
    """A simulated replica process (``simulator.procs``) with helpers for its test endpoints."""

    def __init__(self, args: list[str], port: int | None = None) -> None:
        super().__init__(
            model="demo-base",
            port=port,
            extra_args=args,
            env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
            ready_timeout=180.0,  # the shared test machine can be very busy
        )

    def start(self) -> Sim:
        super().start()
        self.wait_ready()
        return self

    def state(self) -> dict[str, Any]:
        return dict(http().get(f"{self.url}/_sim/state").json())

    def faults(self, **changes: Any) -> dict[str, Any]:
        return dict(http().post(f"{self.url}/_sim/faults", json=changes).json())

    def loaded(self) -> set[str]:
        data = http().get(f"{self.url}/v1/models").json()["data"]
        return {m["id"] for m in data if m.get("parent")}


SIM_ARGS = ["--zero-latency", "--enable-fault-control", "--log-level", "error"]


def start_sims(n: int, *extra: str) -> list[Sim]:
    sims = [Sim([*SIM_ARGS, *extra]) for _ in range(n)]
    try:
        for s in sims:
            SimProcess.start(s)
        for s in sims:
            s.wait_ready()
    except BaseException:
        stop_all(list(sims))
        raise
    return sims
