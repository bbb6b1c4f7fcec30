"""The simulated vLLM replica as a raw ASGI app: ``create_app(SimConfig(...))``.

Routes (as vLLM 0.32 does): ``/health`` ``/ping`` ``/version`` ``/load`` ``/metrics`` ``/tokenize``
``/v1/models`` ``/v1/completions`` ``/v1/chat/completions``; with runtime LoRA updating also
``/v1/load_lora_adapter`` ``/v1/unload_lora_adapter`` ``POST /adapters``
``DELETE /adapters/{name}``; with ``enable_fault_control`` also ``/_sim/faults`` and
``/_sim/state``. Unknown paths get FastAPI's 404 ``{"detail":"Not Found"}``, a wrong method
405 ``{"detail":"Method Not Allowed"}``. ``--api-key`` guards ``/v1`` ``/v2`` ``/inference``
``/cohere`` before routing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from simulator.adapters import AdapterNotFound, AdapterRejected, inspect_adapter
from simulator.asgi_io import Receive, Request, Scope, Send, send_error, send_json, send_response
from simulator.behaviours import BehaviourError
from simulator.config import SimConfig
from simulator.engine import EngineModel
from simulator.generate import handle_generate
from simulator.lora_api import (
    LoadedAdapter,
    LoadError,
    handle_load,
    handle_sagemaker_load,
    handle_sagemaker_unload,
    handle_unload,
    read_json_object,
)
from simulator.metrics import CONTENT_TYPE, SimMetrics
from simulator.runtime import EngineDriver
from simulator.textgen import render_chat, token_ids

log = logging.getLogger("simulator")

Handler = Callable[[Request], Awaitable[None]]
_AUTH_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
_NOT_FOUND = orjson.dumps({"detail": "Not Found"})
_NOT_ALLOWED = orjson.dumps({"detail": "Method Not Allowed"})
_JSON = (b"content-type", b"application/json")


class SimApp:
    """One simulated replica (state + ASGI entry point)."""

    dead_message = "EngineCore encountered an issue. See stack trace (above) for the root cause."

    def __init__(self, config: SimConfig, *, exit_process: bool = False) -> None:
        self.config = config
        self.exit_process = exit_process
        self.engine = EngineModel(config.timing)
        self.metrics = SimMetrics(self.engine, config.model, config.timing.max_loras, config.max_model_len)
        self.driver = EngineDriver(self.engine, on_record=self.metrics.record_lora_info)
        self.adapters: dict[str, LoadedAdapter] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.in_flight = 0
        self.requests_done = 0
        self.load_calls = 0
        self.loads_ok = 0
        self.started_at = time.time()
        digest = hashlib.sha256(f"{config.model}:{config.seed}".encode()).hexdigest()[:8]
        self.fingerprint = f"vllm-{config.version}-{digest}"
        self._auth = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.routes: dict[str, dict[str, Handler]] = {
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health, "POST": self._health},
            "/version": {"GET": self._version},
            "/load": {"GET": self._load},
            "/metrics": {"GET": self._metrics},
            "/tokenize": {"POST": self._tokenize},
            "/v1/models": {"GET": self._models},
            "/v1/completions": {"POST": lambda r: handle_generate(self, r, False)},
            "/v1/chat/completions": {"POST": lambda r: handle_generate(self, r, True)},
        }
        if config.allow_runtime_lora:
            log.warning(
                "LoRA dynamic loading & unloading is enabled in the API server. "
                "This should ONLY be used for local development!"
            )
            self.routes["/v1/load_lora_adapter"] = {"POST": lambda r: handle_load(self, r)}
            self.routes["/v1/unload_lora_adapter"] = {"POST": lambda r: handle_unload(self, r)}
            self.routes["/adapters"] = {"POST": lambda r: handle_sagemaker_load(self, r)}
        if config.enable_fault_control:
            self.routes["/_sim/faults"] = {"GET": self._faults_get, "POST": self._faults_post}
            self.routes["/_sim/state"] = {"GET": self._state}
        self._load_static()

    # ------------------------------------------------------------------ helpers
    def _load_static(self) -> None:
        """``--lora-modules``: loaded before the server listens; a failure aborts startup."""
        for name, path in self.config.lora_modules:
            try:
                files = inspect_adapter(path, self.config.max_lora_rank)
            except (AdapterNotFound, AdapterRejected) as exc:
                raise RuntimeError(f"Loading static LoRA {name!r} failed: {exc}") from None
            load = self.engine.register_adapter(name, files.size_bytes, time.monotonic())
            self.adapters[name] = LoadedAdapter(
                name, path, load.lora_id, files.sha256, files.size_bytes, time.time()
            )

    def name_lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def resolve_model(self, model: str) -> tuple[str | None, str]:
        """vLLM ``_check_model``: (lora name or None, generation identity); LoadError 404 if unknown."""
        if not model or model == self.config.model:
            return None, f"base:{self.config.model}"
        adapter = self.adapters.get(model)
        if adapter is None:
            raise LoadError(
                404,
                "NotFoundError",
                f"The model `{model}` does not exist. Valid aliases: {self.config.model}.",
                "model",
            )
        return model, adapter.sha256

    def resolve_request(self, body: dict[str, Any], model: str) -> tuple[str | None, str]:
        """The adapter a request asks for: its ``model`` here (an engine flavour may read more of
        the body, e.g. TensorRT-LLM's ``lora_request``)."""
        return self.resolve_model(model)

    def request_done(self) -> None:
        self.requests_done += 1
        limit = self.config.faults.exit_after_requests
        if limit is not None and self.requests_done >= limit:
            if self.exit_process:
                log.warning("fault injection: exiting after %d requests", self.requests_done)
                asyncio.get_running_loop().call_later(0.05, os._exit, 17)
            else:
                self.config.faults.dead = True

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        for _ in range(10):
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                self.driver.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if self._auth is not None and path.startswith(_AUTH_PREFIXES) and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._auth):
                await send_response(send, 401, b'{"error":"Unauthorized"}', (_JSON,))
                return
        req = Request(scope, receive, send)
        methods = self.routes.get(path)
        if methods is None and path.startswith("/adapters/") and self.config.allow_runtime_lora:
            methods = {"DELETE": lambda r: handle_sagemaker_unload(self, r)}
            req.path_params["name"] = path[len("/adapters/") :]
        if methods is None:
            await send_response(send, 404, _NOT_FOUND, (_JSON,))
            return
        handler = methods.get(req.method)
        if handler is None:
            allow = ", ".join(methods).encode()
            await send_response(send, 405, _NOT_ALLOWED, (_JSON, (b"allow", allow)))
            return
        await handler(req)

    # ------------------------------------------------------------------ simple endpoints
    async def _health(self, req: Request) -> None:
        await send_response(req.send, 503 if self.config.faults.dead else 200, b"")

    async def _version(self, req: Request) -> None:
        await send_json(req.send, 200, {"version": self.config.version})

    async def _load(self, req: Request) -> None:
        load = self.in_flight if self.config.enable_server_load_tracking else 0
        await send_json(req.send, 200, {"server_load": load})

    async def _metrics(self, req: Request) -> None:
        await send_response(req.send, 200, self.metrics.render(), ((b"content-type", CONTENT_TYPE.encode()),))

    def _card(
        self, id_: str, root: str, parent: str | None, max_len: int | None, created: int
    ) -> dict[str, Any]:
        return {
            "id": id_,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(8)}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    async def _models(self, req: Request) -> None:
        now = int(time.time())
        cfg = self.config
        data = [self._card(cfg.model, cfg.model_root or cfg.model, None, cfg.max_model_len, now)]
        data += [self._card(a.name, a.path, cfg.model, None, now) for a in self.adapters.values()]
        await send_json(req.send, 200, {"object": "list", "data": data})

    async def _tokenize(self, req: Request) -> None:
        try:
            body = await read_json_object(req)
            if "messages" in body and isinstance(body["messages"], list):
                text = render_chat([m for m in body["messages"] if isinstance(m, dict)])
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise LoadError(400, "BadRequestError", "Either 'prompt' or 'messages' must be provided.")
            model = body.get("model") or ""
            self.resolve_model(model if isinstance(model, str) else "")
        except LoadError as exc:
            await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
            return
        ids = token_ids(text)
        await send_json(
            req.send,
            200,
            {
                "count": len(ids),
                "max_model_len": self.config.max_model_len,
                "tokens": ids,
                "token_strs": None,
            },
        )

    # ------------------------------------------------------------------ fault control
    async def _faults_get(self, req: Request) -> None:
        await send_json(req.send, 200, self.config.faults.as_dict())

    async def _faults_post(self, req: Request) -> None:
        try:
            body = orjson.loads(await req.body())
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            if body.pop("reset", False):  # defaults first, then the body's fields: one change
                body = {**type(self.config.faults)().as_dict(), **body}
            self.config.faults.update(body)
        except BehaviourError as exc:
            await send_json(req.send, 400, {"detail": str(exc), "problems": exc.problems})
            return
        except (ValueError, orjson.JSONDecodeError) as exc:
            await send_json(req.send, 400, {"detail": str(exc)})
            return
        await send_json(req.send, 200, self.config.faults.as_dict())

    async def _state(self, req: Request) -> None:
        state = {
            "model": self.config.model,
            "adapters": [
                {
                    "name": a.name,
                    "path": a.path,
                    "lora_id": a.lora_id,
                    "sha256": a.sha256,
                    "size_bytes": a.size_bytes,
                }
                for a in self.adapters.values()
            ],
            "engine": self.engine.state(),
            "load_calls": self.load_calls,
            "loads_ok": self.loads_ok,
            "in_flight": self.in_flight,
            "requests_done": self.requests_done,
            "faults": self.config.faults.as_dict(),
        }
        await send_json(req.send, 200, state)


def create_app(config: SimConfig | None = None, *, exit_process: bool = False) -> SimApp:
    """Build a simulated vLLM replica (an ASGI app). ``exit_process`` lets faults end the process.
    Other engines' flavours: ``simulator.flavours.build_app``."""
    config = config or SimConfig()
    if config.engine != "vllm":
        raise ValueError(f"engine {config.engine!r}: build it with simulator.flavours.build_app")
    return SimApp(config, exit_process=exit_process)
