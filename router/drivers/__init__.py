"""Engine drivers: ``make_driver(engine, session, api_key)`` picks the implementation for a pool."""

from __future__ import annotations

import aiohttp

from router.drivers.base import (
    AnswerKind,
    EngineDriver,
    LoadResult,
    MetricsSample,
    ModelsInfo,
    Retryable,
    UnloadResult,
)
from router.drivers.vllm import DriverError, VllmDriver

__all__ = [
    "AnswerKind",
    "DriverError",
    "EngineDriver",
    "LoadResult",
    "MetricsSample",
    "ModelsInfo",
    "Retryable",
    "UnloadResult",
    "VllmDriver",
    "make_driver",
]


def make_driver(
    engine: str,
    session: aiohttp.ClientSession,
    api_key: str | None,
    timeout: aiohttp.ClientTimeout | None = None,
    stream_timeout: aiohttp.ClientTimeout | None = None,
) -> EngineDriver:
    if engine == "vllm":
        return VllmDriver(session, api_key, timeout=timeout, stream_timeout=stream_timeout)
    raise ValueError(f"unknown engine driver {engine!r}")
