"""Engine drivers: ``make_driver(pool, session, …)`` picks the implementation for a pool's
``engine`` (``vllm`` | ``sglang`` | ``ray-serve`` | ``trtllm``); each declares its
:class:`Capabilities` (``router.capabilities``), which is all the rest of the router
reads about an engine."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from router.capabilities import CAPABILITIES, ENGINE_NAMES, Capabilities, capabilities_of
from router.drivers.base import (
    AnswerKind,
    EngineDriver,
    LoadResult,
    MetricsSample,
    ModelsInfo,
    Retryable,
    UnloadResult,
)
from router.drivers.http_base import DriverError
from router.drivers.ray_serve import RayServeDriver
from router.drivers.sglang import SglangDriver
from router.drivers.trtllm import TrtllmDriver
from router.drivers.vllm import VllmDriver
from router.settings import PoolConfig

__all__ = [
    "CAPABILITIES",
    "ENGINE_NAMES",
    "AnswerKind",
    "Capabilities",
    "DriverError",
    "EngineDriver",
    "LoadResult",
    "MetricsSample",
    "ModelsInfo",
    "RayServeDriver",
    "Retryable",
    "SglangDriver",
    "TrtllmDriver",
    "UnloadResult",
    "VllmDriver",
    "capabilities_of",
    "make_driver",
]


def make_driver(
    pool: PoolConfig,
    session: aiohttp.ClientSession,
    *,
    staging_dir: Path,
    timeout: aiohttp.ClientTimeout | None = None,
    stream_timeout: aiohttp.ClientTimeout | None = None,
) -> EngineDriver:
    """The driver of ``pool``'s engine. ``staging_dir``: the router's local staging directory
    (where a ``local``-staged pool's replicas read files)."""
    api_key = pool.api_key.get_secret_value() if pool.api_key else None
    kw = {"timeout": timeout, "stream_timeout": stream_timeout}
    if pool.engine == "vllm":
        return VllmDriver(session, api_key, **kw)
    if pool.engine == "sglang":
        return SglangDriver(session, api_key, max_loras=pool.max_loras, **kw)
    if pool.engine == "ray-serve":
        return RayServeDriver(session, api_key, served_model=pool.served_name, **kw)
    if pool.engine == "trtllm":
        if pool.staging.mode == "local":
            replica_dir = str((pool.staging.dir or staging_dir).resolve())
        else:  # agent: the directory as the replica sees it (required for this engine by the settings)
            replica_dir = str(pool.staging.dir)
        return TrtllmDriver(session, api_key, replica_dir=replica_dir, **kw)
    raise ValueError(f"unknown engine driver {pool.engine!r}")
