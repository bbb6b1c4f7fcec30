"""The TensorRT-LLM flavour (``--engine trtllm``): ``trtllm-serve`` with the PyTorch backend and
``lora_config`` set, as ``NVIDIA/TensorRT-LLM`` has it (files and commits in
``simulator/README.md``).

- No load API. A request names its adapter in the body: ``"lora_request": {"lora_name",
  "lora_int_id", "lora_path"}``; ``model`` is not checked (it is echoed).
- Adapter weights are cached by ``lora_int_id`` — ``--max-loras`` on the GPU, ``--max-cpu-loras``
  on the host, LRU. When a request arrives the worker asks whether the id is in the host cache
  (``is_adapter_in_cpu_cache``); only when it is not are the weights read from ``lora_path`` and
  sent along. So an id reused for other files is served with the cached weights (ids must be
  unique per adapter version), and when the cache drops the id between that check and the
  enqueue the request fails with the C++ PEFT cache's ``LoRA task <id> not found in cache.
  Please send LoRA weights with request`` (400): sending it again succeeds. The simulator makes
  that race happen on demand (``POST /_sim/engine {"evict_next": N}``: the next N requests whose
  id is cached lose it at that moment).
- A path it cannot load: ``400 Failed to load LoRA adapter <id>: …``.
- Errors are ``{"object": "error", "message", "type": "BadRequestError", "param", "code"}`` with
  400 for every failure (``create_error_response(str(e))``).
- ``/v1/models`` lists the base only; ``/metrics`` is JSON iteration stats; ``/health`` 200.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from simulator.adapters import AdapterNotFound, AdapterRejected, inspect_adapter
from simulator.asgi_io import Request, send_json, send_response
from simulator.config import SimConfig
from simulator.flavour_base import FlavourApp, FlavourError, json_body
from simulator.generate import handle_generate
from simulator.lora_api import LoadedAdapter, LoadError, read_json_object

TRTLLM_VERSION = "1.2.1"


def trt_error(message: str, status: int = 400, type_: str = "BadRequestError") -> FlavourError:
    """trtllm-serve's ``create_error_response`` (a flat ``ErrorResponse``)."""
    return FlavourError(
        status, {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    )


@dataclass
class _Task:
    """What the worker's LoraManager holds for one ``lora_int_id``."""

    lora_name: str
    path: str
    sha256: str


def task_name(lora_int_id: int) -> str:
    return f"lora-task-{lora_int_id}"


class TrtllmApp(FlavourApp):
    def __init__(self, config: SimConfig, *, exit_process: bool = False) -> None:
        super().__init__(config, exit_process=exit_process)
        self.tasks: dict[int, _Task] = {}
        self._loading: set[int] = set()  # ids whose weights are on their way (not cached yet)
        self.evict_next = 0  # fault: cached ids dropped between the check and the enqueue
        self.cache_misses = 0
        self.weight_loads = 0
        self._lock = asyncio.Lock()
        self.iteration = 0
        self.routes.update(
            {
                "/health": {"GET": self._health},
                "/version": {"GET": self._trt_version},
                "/v1/models": {"GET": self._trt_models},
                "/metrics": {"GET": self._trt_metrics},
                "/v1/completions": {"POST": lambda r: self._generate(r, False)},
                "/v1/chat/completions": {"POST": lambda r: self._generate(r, True)},
            }
        )
        if config.enable_fault_control:
            self.routes["/_sim/engine"] = {"GET": self._engine_state, "POST": self._engine_faults}

    def cached(self, lora_int_id: int) -> bool:
        """``is_adapter_in_cpu_cache``: the id is in the host cache (and so on the engine)."""
        if lora_int_id in self._loading:
            return False
        engine_id = self.engine.lora_id(task_name(lora_int_id))
        return engine_id is not None and engine_id in self.engine.cpu_cache()

    async def _prepare(self, lora: dict[str, Any]) -> None:
        """The worker's ``_enqueue_request`` for a request with a ``lora_request``."""
        lora_id = lora["lora_int_id"]
        name = task_name(lora_id)
        if self.cached(lora_id):
            if self.evict_next > 0:  # the cache dropped it after the check: no weights were sent
                self.evict_next -= 1
                self.cache_misses += 1
                self.engine.unregister_adapter(name)
                raise trt_error(
                    f"LoRA task {lora_id} not found in cache. Please send LoRA weights with request"
                )
            return
        async with self._lock:
            if self.cached(lora_id):
                return
            faults = self.config.faults
            self.load_calls += 1
            if faults.slow_load_s > 0:
                await asyncio.sleep(faults.slow_load_s)
            if faults.fail_loads > 0:
                faults.fail_loads -= 1
                raise trt_error(f"Failed to load LoRA adapter {lora_id}: simulated load failure")
            try:
                files = await asyncio.to_thread(inspect_adapter, lora["lora_path"], self.config.max_lora_rank)
            except (AdapterNotFound, AdapterRejected) as exc:
                raise trt_error(f"Failed to load LoRA adapter {lora_id}: {exc}") from None
            load = self.engine.register_adapter(
                name, files.size_bytes, time.monotonic(), inplace=self.engine.lora_id(name) is not None
            )
            self.driver.kick()
            wait = load.ready_at - time.monotonic()
            if wait > 0:
                self._loading.add(lora_id)  # requests arriving meanwhile wait behind the lock
                try:
                    await asyncio.sleep(wait)
                finally:
                    self._loading.discard(lora_id)
            self.tasks[lora_id] = _Task(lora["lora_name"], lora["lora_path"], files.sha256)
            self.adapters[name] = LoadedAdapter(
                name, lora["lora_path"], load.lora_id, files.sha256, files.size_bytes, time.time()
            )
            self.weight_loads += 1
            self.loads_ok += 1

    async def _generate(self, req: Request, chat: bool) -> None:
        try:
            body = await read_json_object(req)
        except LoadError as exc:
            await trt_error(exc.message).send(req)
            return
        lora = body.get("lora_request")
        try:
            if lora is not None:
                _check_lora_request(lora)
                await self._prepare(lora)
        except FlavourError as exc:
            await exc.send(req)
            return
        await handle_generate(self, req, chat)

    def resolve_request(self, body: dict[str, Any], model: str) -> tuple[str | None, str]:
        lora = body.get("lora_request")
        if not isinstance(lora, dict):
            return None, f"base:{self.config.model}"
        task = self.tasks.get(lora["lora_int_id"])
        name = task_name(lora["lora_int_id"])
        if task is None or self.engine.lora_id(name) is None:
            raise LoadError(400, "BadRequestError", f"LoRA task {lora['lora_int_id']} not found in cache")
        return name, task.sha256  # the cached weights, whatever path this request names

    async def _trt_version(self, req: Request) -> None:
        await send_json(req.send, 200, {"version": TRTLLM_VERSION})

    async def _trt_models(self, req: Request) -> None:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "tensorrt_llm",
        }
        await send_json(req.send, 200, {"object": "list", "data": [card]})

    async def _trt_metrics(self, req: Request) -> None:
        eng = self.engine
        self.iteration += 1
        stat = {
            "iter": eng.steps,
            "iterLatencyMS": 0.0,
            "numActiveRequests": eng.running,
            "numQueuedRequests": eng.waiting,
            "maxNumActiveRequests": self.config.timing.max_num_seqs,
            "gpuMemUsage": 0,
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "kvCacheStats": {
                "maxNumBlocks": self.config.timing.kv_cache_tokens // 32,
                "usedNumBlocks": int(eng.kv_cache_usage * self.config.timing.kv_cache_tokens) // 32,
                "tokensPerBlock": 32,
            },
        }
        await send_json(req.send, 200, [stat])

    async def _engine_state(self, req: Request) -> None:
        await send_json(
            req.send,
            200,
            {
                "engine": "trtllm",
                "tasks": {str(k): {"lora_name": t.lora_name, "path": t.path} for k, t in self.tasks.items()},
                "cached": sorted(k for k in self.tasks if self.cached(k)),
                "weight_loads": self.weight_loads,
                "cache_misses": self.cache_misses,
                "evict_next": self.evict_next,
            },
        )

    async def _engine_faults(self, req: Request) -> None:
        body = json_body(await req.body())
        value = body.get("evict_next") if body is not None else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            await send_json(req.send, 400, {"detail": "evict_next must be an integer >= 0"})
            return
        self.evict_next = value
        await send_response(req.send, 204, b"")


def _check_lora_request(lora: object) -> None:
    """The ``LoRARequest`` fields (a validation error otherwise)."""
    if (
        not isinstance(lora, dict)
        or not isinstance(lora.get("lora_name"), str)
        or not isinstance(lora.get("lora_int_id"), int)
        or isinstance(lora.get("lora_int_id"), bool)
        or not isinstance(lora.get("lora_path"), str)
    ):
        raise trt_error(
            "1 validation error for CompletionRequest\nlora_request\n  Input should be a valid "
            "LoRARequest with lora_name (str), lora_int_id (int) and lora_path (str)"
        )
