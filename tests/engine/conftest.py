"""Fixtures of the real-vLLM tier: the engine venv, the tiny model, test adapters, two replicas.

All engine tests carry ``@pytest.mark.engine`` and ``@pytest.mark.xdist_group("engine")`` so that
with ``--dist loadgroup`` only one xdist worker ever starts vLLM. Set ``LORAPLANE_SKIP_ENGINE=1``
to skip the tier on a quick local run; otherwise any failure to build or start is a test ERROR.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from registry.adapter_factory import write_adapter
from tests.engine import vllm_env as ve

SKIP_ENV = "LORAPLANE_SKIP_ENGINE"

# What every engine test module sets as ``pytestmark``; the timeout covers the first-time build.
ENGINE_MARKS = [pytest.mark.engine, pytest.mark.xdist_group("engine"), pytest.mark.timeout(3000)]


@dataclass(frozen=True)
class EngineEnv:
    python: Path
    model: Path
    module_shapes: dict[str, list[int]]
    setup_s: float


@dataclass(frozen=True)
class EngineAdapters:
    """Adapter directories made for the tiny model (absolute paths)."""

    a1: Path  # rank 8, q_proj+v_proj, seed 1
    a2: Path  # rank 8, q_proj+v_proj, seed 2
    a3: Path  # rank 4, q_proj+v_proj+o_proj, seed 3
    bad_rank: Path  # rank 32 > --max-lora-rank 16
    root: Path


def _skip_requested() -> bool:
    return os.environ.get(SKIP_ENV, "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def engine_env() -> EngineEnv:
    if _skip_requested():
        pytest.skip(f"real-vLLM tier disabled by {SKIP_ENV}=1 (unset it to run against real vLLM)")
    t0 = time.monotonic()
    py = ve.ensure_venv()
    model = ve.ensure_tiny_model(py)
    return EngineEnv(py, model, ve.module_shapes(model), time.monotonic() - t0)


def make_engine_adapter(
    path: Path, env: EngineEnv, *, seed: int, rank: int = 8, modules: tuple[str, ...] = ("q_proj", "v_proj")
) -> Path:
    """A PEFT adapter for the tiny model whose greedy outputs differ from the base and each other.

    Tensors are N(0, 0.02) (the factory's draw); ``lora_alpha`` = 64·r makes the scale 64 so the
    update B·A is comparable to the base weights (N(0, 0.2)) and outputs visibly change.
    """
    return write_adapter(
        path,
        rank=rank,
        alpha=64 * rank,
        target_modules=modules,
        module_shapes=env.module_shapes,
        layers=2,
        dtype="F32",
        seed=seed,
        base_model_name_or_path=str(env.model),
    )


@pytest.fixture(scope="session")
def engine_adapters(engine_env: EngineEnv, tmp_path_factory: pytest.TempPathFactory) -> EngineAdapters:
    root = tmp_path_factory.mktemp("engine-adapters")
    return EngineAdapters(
        a1=make_engine_adapter(root / "a1", engine_env, seed=1),
        a2=make_engine_adapter(root / "a2", engine_env, seed=2),
        a3=make_engine_adapter(
            root / "a3", engine_env, seed=3, rank=4, modules=("q_proj", "v_proj", "o_proj")
        ),
        bad_rank=make_engine_adapter(root / "bad-rank", engine_env, seed=4, rank=32),
        root=root,
    )


@pytest.fixture(scope="session")
def vllm_replicas(engine_env: EngineEnv) -> Iterator[list[ve.VllmReplica]]:
    """Two real vLLM replicas, started in parallel, stopped by PID at the end of the session."""
    if os.environ.get("LORAPLANE_ENGINE_ATTACH") == "1":  # development: replicas from `vllm_env.py serve`
        yield ve.attach_replicas(engine_env.python, engine_env.model)
        return
    reps = ve.start_replicas(engine_env.python, engine_env.model, n=2)
    try:
        yield reps
    finally:
        for r in reps:
            r.stop()


@pytest.fixture
def vllm_url(vllm_replicas: list[ve.VllmReplica]) -> str:
    """URL of the first replica, restarted if an earlier test killed it."""
    rep = vllm_replicas[0]
    if not rep.alive():
        rep.stop()
        rep.start()
        rep.wait_ready()
    return rep.url


@pytest.fixture
def vllm_client(vllm_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_url, timeout=60.0) as client:
        yield client
