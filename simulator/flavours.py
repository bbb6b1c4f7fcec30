"""Engine flavours of the simulator: ``build_app(config)`` is a replica speaking the HTTP API of
``config.engine`` — ``vllm`` (``simulator.app.SimApp``), ``sglang``, ``ray-serve`` or ``trtllm``
(``simulator.flavour_sglang`` / ``flavour_ray`` / ``flavour_trtllm``, each a ``SimApp`` with that
engine's routes, adapter semantics, status codes and error texts over the same engine model).
Sources (files and commits) are in ``simulator/README.md``, "Engine flavours".
"""

from __future__ import annotations

from simulator.app import SimApp
from simulator.config import SimConfig
from simulator.flavour_ray import RayServeApp
from simulator.flavour_sglang import SglangApp
from simulator.flavour_trtllm import TrtllmApp

HEALTH_PATHS = {"vllm": "/health", "sglang": "/health", "ray-serve": "/-/healthz", "trtllm": "/health"}


def build_app(config: SimConfig, *, exit_process: bool = False) -> SimApp:
    """The replica of ``config.engine`` (an ASGI app)."""
    if config.engine == "sglang":
        return SglangApp(config, exit_process=exit_process)
    if config.engine == "ray-serve":
        return RayServeApp(config, exit_process=exit_process)
    if config.engine == "trtllm":
        return TrtllmApp(config, exit_process=exit_process)
    return SimApp(config, exit_process=exit_process)
