"""In-process engine-flavour simulators (``simulator.flavours.build_app``) with an httpx client."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from simulator.app import SimApp
from simulator.config import SimConfig
from simulator.engine import TimingParams
from simulator.flavour_options import FlavourOptions
from simulator.flavours import build_app


@asynccontextmanager
async def flavour_client(
    engine: str, *, max_loras: int = 4, max_cpu_loras: int | None = None, **flavour: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, SimApp]]:
    config = SimConfig(
        engine=engine,
        timing=TimingParams.zero(max_loras=max_loras, max_cpu_loras=max_cpu_loras),
        enable_fault_control=True,
        flavour=FlavourOptions(**flavour),
    )
    app = build_app(config)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        try:
            yield client, app
        finally:
            app.driver.close()


def publish(adapter_dir: str, store: Path, name: str) -> Path:
    """Copy an adapter folder to ``store/name`` (what the router's publish stager does)."""
    dest = store / name
    shutil.copytree(adapter_dir, dest, dirs_exist_ok=True)
    return dest


def chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 6,
        **extra,
    }
