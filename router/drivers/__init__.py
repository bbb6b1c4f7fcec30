"""Engine drivers: ``make_driver(engine, session, api_key)`` picks the implementation for a pool."""

from __future__ import annotations

import aiohttp

from router.drivers.base import EngineDriver, LoadResult, MetricsSample, ModelsInfo, UnloadResult
from router.drivers.vllm import DriverError, VllmDriver

__all__ = [
    "DriverError",
    "EngineDriver",
    "LoadResult",
    "MetricsSample",
    "ModelsInfo",
    "UnloadResult",
    "VllmDriver",
    "make_driver",
]


def make_driver(engine: str, session: aiohttp.ClientSession, api_key: str | None) -> EngineDriver:
    if engine == "vllm":
        return VllmDriver(session, api_key)
    raise ValueError(f"unknown engine driver {engine!r}")
