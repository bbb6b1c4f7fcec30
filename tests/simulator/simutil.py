"""Helpers for simulator tests: an in-process simulator + httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from simulator.app import SimApp, create_app
from simulator.config import SimConfig


@asynccontextmanager
async def sim_client(
    config: SimConfig | None = None, **kw: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, SimApp]]:
    """An in-process simulator and an httpx client bound to it (ASGITransport)."""
    app = create_app(config or SimConfig(**kw))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        try:
            yield client, app
        finally:
            app.driver.close()


async def load(client: httpx.AsyncClient, name: str, path: str, **extra: Any) -> httpx.Response:
    return await client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})
