"""Test-only helpers: hand-built routing snapshots and a small fake Router implementing ``forward``.

The fake is for unit tests of the gateway's own rules; end-to-end tests use the real router
and simulator processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from registry.keys import generate_key, hash_key, key_prefix
from registry.replicas import ReplicaDirectory
from registry.snapshot import (
    AdapterInfo,
    BaseModelInfo,
    FileInfo,
    GrantInfo,
    KeyInfo,
    Limits,
    RoutingSnapshot,
    TenantInfo,
    VersionInfo,
)
from router.contract import ForwardRequest, ForwardResult, NoCapacity, Usage

BASE = "demo-base"


def version(adapter: str, n: int, status: str) -> VersionInfo:
    return VersionInfo(
        adapter_id=adapter,
        version=f"v{n}",
        number=n,
        status=status,
        rank=8,
        lora_alpha=16.0,
        target_modules=("q_proj",),
        files=(FileInfo("adapter_model.safetensors", 10, f"{adapter}{n:02d}" * 8),),
        storage_uri="file:///nowhere/",
        base_model=BASE,
    )


def adapter(
    aid: str,
    versions: dict[str, str],
    *,
    active: str | None,
    canary: str | None = None,
    weight: int | None = None,
    status: str = "active",
) -> AdapterInfo:
    vs = {v: version(aid, int(v[1:]), st) for v, st in versions.items()}
    return AdapterInfo(aid, BASE, status, active, canary, weight, vs)


def make_snapshot(
    revision: int = 1,
    *,
    limits: Limits | None = None,
    grant_limits: dict[str, tuple[int | None, int | None]] | None = None,
) -> tuple[RoutingSnapshot, dict[str, str]]:
    """Snapshot with tenants ``acme`` (grants alpha..delta, base access) and ``other`` (no grants)."""
    adapters = {
        "alpha": adapter("alpha", {"v1": "active", "v2": "ready", "v3": "disabled"}, active="v1"),
        "beta": adapter("beta", {"v1": "active", "v2": "canary"}, active="v1", canary="v2", weight=30),
        "gamma": adapter("gamma", {"v1": "active"}, active="v1", status="disabled"),
        "delta": adapter("delta", {"v1": "ready"}, active=None),
        "secret": adapter("secret", {"v1": "active"}, active="v1"),
    }
    gl = grant_limits or {}
    grants = {a: GrantInfo(a, *gl.get(a, (None, None))) for a in ("alpha", "beta", "gamma", "delta")}
    tenants = {
        "acme": TenantInfo("acme", "Acme", limits or Limits(), True, grants),
        "other": TenantInfo("other", "Other", Limits(), False, {}),
    }
    keys: dict[str, str] = {t: generate_key() for t in tenants}
    by_prefix: dict[str, tuple[KeyInfo, ...]] = {}
    for i, (t, k) in enumerate(keys.items()):
        by_prefix.setdefault(key_prefix(k), ())
        by_prefix[key_prefix(k)] += (KeyInfo(f"k{i}", t, key_prefix(k), hash_key(k)),)
    snap = RoutingSnapshot(
        revision=revision,
        base_models={BASE: BaseModelInfo(BASE, "loraplane/demo-base", 64, ("q_proj",))},
        adapters=adapters,
        tenants=tenants,
        keys_by_prefix=by_prefix,
    )
    return snap, keys


class FakeRouter:
    """Answers like a replica would after the router's rewrite (model = client_model)."""

    def __init__(self) -> None:
        self.requests: list[ForwardRequest] = []
        self.fail: Exception | None = None
        self.chunk_delay = 0.0
        self.n_chunks = 3
        self.closed_streams = 0
        self.forward_delay = 0.0
        self.status = 200
        self.error_body: bytes | None = None
        self.updates: list[int] = []
        self.is_ready = True
        self.resident: set[str] = set()
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def healthy_count(self, base_model: str | None = None) -> int:
        return 1 if self.is_ready else 0

    def is_resident(self, lora_name: str) -> bool:
        return lora_name in self.resident

    @property
    def directory(self) -> ReplicaDirectory:
        from router.directory import LocalReplicaDirectory

        return LocalReplicaDirectory(self)

    def replica_records(self) -> list[dict[str, Any]]:
        return []

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        return {"adapter_id": adapter_id, "version": version, "replicas": []}

    def update_snapshot(self, snapshot: RoutingSnapshot) -> None:
        self.updates.append(snapshot.revision)

    async def forward(self, req: ForwardRequest) -> ForwardResult:
        self.requests.append(req)
        if self.forward_delay:
            await asyncio.sleep(self.forward_delay)
        if self.fail is not None:
            raise self.fail
        replica = "http://127.0.0.1:1"
        if self.status >= 400:
            return ForwardResult(
                self.status,
                {"content-type": "application/json"},
                replica,
                False,
                body=self.error_body or b'{"error":{"message":"bad","type":"BadRequestError"}}',
            )
        obj = "chat.completion" if req.endpoint == "chat/completions" else "text_completion"
        usage = Usage(prompt_tokens=7, completion_tokens=5, total_tokens=12)
        if not req.stream:
            body = orjson.dumps(
                {
                    "id": "x-1",
                    "object": obj,
                    "model": req.client_model,
                    "created": 1,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hi"},
                            "text": "hi",
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                }
            )
            return ForwardResult(
                200, {"content-type": "application/json"}, replica, False, body=body, usage=usage
            )
        result = ForwardResult(200, {"content-type": "text/event-stream"}, replica, False)
        result.stream = self._stream(req, result, usage)
        return result

    async def _stream(self, req: ForwardRequest, result: ForwardResult, usage: Usage) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n_chunks):
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                chunk: dict[str, Any] = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "model": req.client_model,
                    "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "text": f"t{i}"}],
                }
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            if req.client_wants_usage:
                u = {
                    "id": "c",
                    "model": req.client_model,
                    "choices": [],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                }
                yield b"data: " + orjson.dumps(u) + b"\n\n"
            result.usage = usage  # as the router's relay: parsed before the last event is passed on
            yield b"data: [DONE]\n\n"
        finally:
            self.closed_streams += 1


class FakeNoCapacity(NoCapacity):
    pass


def internal_client(gw: Any) -> Any:
    """An httpx client of ``gw``'s internal port app (/metrics, the detailed /readyz; SPEC §19)."""
    import httpx

    from gateway.internal import create_internal_app

    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_internal_app(gw)), base_url="http://internal"
    )
