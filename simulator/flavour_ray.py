"""The Ray Serve LLM flavour (``--engine ray-serve``): one replica of a Ray Serve LLM app (the
OpenAI ingress and one ``LLMServer`` replica over vLLM), as ``ray-project/ray`` has it (files and
commits in ``simulator/README.md``).

- No load API. ``model="<base_model_id>:<lora_id>"`` (the lora id is everything after the first
  colon); the base must be the served one (else ``404 Got request for model …``).
- First request for a lora id on this replica: read ``<path>/<lora_id>/adapter_config.json``
  (missing: ``404 Unable to find LoRA adapter config file "adapter_config.json" in folder …``),
  download the folder into the replica's disk cache — keyed by the model id and never refreshed
  (new bytes under an old name are not seen) — then load it into the engine with a fresh
  ``lora_int_id``. That first request pays the download and the load.
- Each replica keeps an LRU of ``max_num_adapters_per_replica`` loaded ids (Serve
  multiplexing); beyond it the least recently used is unloaded from the engine.
- ``/v1/models``: the base and ``<base>:<folder>`` for every folder of the loading path whose
  config can be read (what can be served, not what is loaded); ``/v1/models/<id>`` one card or
  ``404 Unable to find <id>…``.
- Health is the Serve proxy's ``/-/healthz`` (``success``); there is no ``/metrics`` on the Serve
  HTTP port (the proxy's 404 text).
- ``dynamic_lora_loading_path``: ``s3://bucket/prefix`` (boto3: ``AWS_ENDPOINT_URL`` and the usual
  credential variables) as Ray requires, or — the simulator only — ``file:///dir``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from simulator.adapters import AdapterNotFound, AdapterRejected, inspect_adapter
from simulator.asgi_io import Receive, Request, Scope, Send, send_json, send_response
from simulator.config import SimConfig
from simulator.flavour_base import FlavourApp, FlavourError
from simulator.generate import handle_generate
from simulator.lora_api import LoadedAdapter, LoadError, read_json_object

log = logging.getLogger("simulator.ray")

CONFIG_NAME = "adapter_config.json"


def ray_error(status: int, message: str, type_: str = "HTTPException") -> FlavourError:
    """Ray's ``get_response_for_error`` (the request id left out)."""
    text = (
        f"Message: {message}, Internal exception: {type_}: {status}: {message}, original exception: {message}"
    )
    return FlavourError(status, {"error": {"message": text, "type": type_, "param": None, "code": status}})


class LoraStore:
    """The app's ``dynamic_lora_loading_path``: an S3 prefix or (simulator only) a directory."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        if uri.startswith("s3://"):
            import boto3

            self.bucket, _, prefix = uri[5:].partition("/")
            self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
            self._s3: Any = boto3.client("s3")
            self.root: Path | None = None
        elif uri.startswith("file:///"):
            self.root = Path(uri[len("file://") :])
        else:
            raise ValueError(
                "dynamic_lora_loading_path must be s3://bucket/prefix (or file:///dir for the simulator)"
            )

    def read(self, lora_id: str, name: str) -> bytes | None:
        if self.root is not None:
            p = self.root / lora_id / name
            return p.read_bytes() if p.is_file() else None
        try:
            obj = self._s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}{lora_id}/{name}")
        except self._s3.exceptions.NoSuchKey:
            return None
        return bytes(obj["Body"].read())

    def subfolders(self) -> list[str]:
        if self.root is not None:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        out: list[str] = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix, Delimiter="/"
        )
        for page in pages:
            out += [cp["Prefix"][len(self.prefix) :].rstrip("/") for cp in page.get("CommonPrefixes", [])]
        return sorted(out)

    def download(self, lora_id: str, dest: Path) -> None:
        """Copy the folder ``lora_id`` into ``dest`` (Ray: ``sync_files_with_lock``)."""
        dest.mkdir(parents=True, exist_ok=True)
        if self.root is not None:
            for f in (self.root / lora_id).iterdir():
                if f.is_file():
                    shutil.copyfile(f, dest / f.name)
            return
        prefix = f"{self.prefix}{lora_id}/"
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(prefix) :]
                if name and "/" not in name:
                    self._s3.download_file(self.bucket, obj["Key"], str(dest / name))


class RayServeApp(FlavourApp):
    def __init__(self, config: SimConfig, *, exit_process: bool = False) -> None:
        super().__init__(config, exit_process=exit_process)
        opts = config.flavour
        if not opts.dynamic_lora_loading_path:
            raise ValueError("--engine ray-serve needs --dynamic-lora-loading-path")
        self.store = LoraStore(opts.dynamic_lora_loading_path)
        self.max_per_replica = opts.max_num_adapters_per_replica
        self.cache_dir = Path(opts.lora_cache_dir or tempfile.mkdtemp(prefix="ray-lora-cache-"))
        self.lru: OrderedDict[str, None] = OrderedDict()  # loaded model ids, LRU first
        self.disk_cache: dict[str, Path] = {}  # model id → downloaded folder (never refreshed)
        self._loading: dict[str, asyncio.Task[None]] = {}
        self.downloads = 0
        self.first_hits = 0
        self.evictions = 0
        self.routes.pop("/health", None)
        self.routes.pop("/metrics", None)
        self.routes.update(
            {
                "/-/healthz": {"GET": self._healthz},
                "/-/routes": {"GET": self._routes},
                "/v1/models": {"GET": self._ray_models},
                "/v1/completions": {"POST": lambda r: self._generate(r, False)},
                "/v1/chat/completions": {"POST": lambda r: self._generate(r, True)},
            }
        )
        if config.enable_fault_control:
            self.routes["/_sim/engine"] = {"GET": self._engine_state}

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path.startswith("/v1/models/") and scope["method"] == "GET":
            await self._model_data(Request(scope, receive, send), path[len("/v1/models/") :])
            return
        if path not in self.routes:  # the Serve proxy's answer for a route no app has
            text = f"Path '{path}' not found. Ping http://.../-/routes for available routes."
            await send_response(send, 404, text.encode(), ((b"content-type", b"text/plain; charset=utf-8"),))
            return
        await super()._http(scope, receive, send)

    # ------------------------------------------------------------------ the multiplexed loader

    async def _ensure(self, model_id: str, lora_id: str) -> None:
        if model_id in self.lru:
            self.lru.move_to_end(model_id)
            return
        task = self._loading.get(model_id)
        if task is None:
            task = asyncio.ensure_future(self._first_hit(model_id, lora_id))
            self._loading[model_id] = task
            task.add_done_callback(lambda _t: self._loading.pop(model_id, None))
        await asyncio.shield(task)

    async def _first_hit(self, model_id: str, lora_id: str) -> None:
        self.first_hits += 1
        self.load_calls += 1
        faults = self.config.faults
        if faults.slow_load_s > 0:
            await asyncio.sleep(faults.slow_load_s)
        raw = await asyncio.to_thread(self.store.read, lora_id, CONFIG_NAME)
        if raw is None:
            raise ray_error(
                404,
                f'Unable to find LoRA adapter config file "{CONFIG_NAME}" in folder '
                f"{self.store.uri}/{lora_id}. Check that the file exists and that you have read permissions.",
            )
        if faults.fail_loads > 0:
            faults.fail_loads -= 1
            raise ray_error(500, "Internal Server Error", "InternalServerError")
        local = self.disk_cache.get(model_id)
        if local is None:  # the disk cache is keyed by the model id: downloaded once
            local = self.cache_dir / lora_id.replace("/", "--")
            await asyncio.to_thread(self.store.download, lora_id, local)
            self.downloads += 1
            self.disk_cache[model_id] = local
        try:
            files = await asyncio.to_thread(inspect_adapter, str(local), self.config.max_lora_rank)
        except (AdapterNotFound, AdapterRejected) as exc:
            raise ray_error(500, f"Call to add_lora method failed: {exc}", "InternalServerError") from None
        download_s = self.config.timing.load_cost(files.size_bytes)  # the download, then the load
        if download_s > 0:
            await asyncio.sleep(download_s)
        while len(self.lru) >= self.max_per_replica:  # Serve multiplexing: evict the LRU model
            victim, _ = self.lru.popitem(last=False)
            self.adapters.pop(victim, None)
            self.engine.unregister_adapter(victim)
            self.evictions += 1
        load = self.engine.register_adapter(model_id, files.size_bytes, time.monotonic())
        self.driver.kick()
        wait = load.ready_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.adapters[model_id] = LoadedAdapter(
            model_id, str(local), load.lora_id, files.sha256, files.size_bytes, time.time()
        )
        self.lru[model_id] = None
        self.loads_ok += 1

    # ------------------------------------------------------------------ routes

    async def _generate(self, req: Request, chat: bool) -> None:
        try:
            body = await read_json_object(req)
        except LoadError as exc:
            await ray_error(400, f"Invalid request format: {exc.message}", "BadRequestError").send(req)
            return
        model = body.get("model")
        try:
            if not isinstance(model, str) or not model:
                model = self.config.model
                body["model"] = model
            base = model.split(":")[0]
            if base != self.config.model:
                raise ray_error(
                    404, f'Got request for model "{model}". Could not find base model with ID "{base}".'
                )
            lora_id = ":".join(model.split(":")[1:])
            if lora_id:
                await self._ensure(model, lora_id)
        except FlavourError as exc:
            await exc.send(req)
            return
        await handle_generate(self, req, chat)

    def resolve_request(self, body: dict[str, Any], model: str) -> tuple[str | None, str]:
        if not model or ":" not in model:
            return None, f"base:{self.config.model}"
        loaded = self.adapters.get(model)
        if loaded is None:
            raise LoadError(404, "HTTPException", f'Could not find model with id "{model}".')
        return model, loaded.sha256

    def _card(
        self, id_: str, root: str, parent: str | None, max_len: int | None, created: int
    ) -> dict[str, Any]:
        return {
            "id": id_,
            "object": "model",
            "owned_by": "organization-owner",
            "permission": [],
            "metadata": {
                "model_id": id_,
                "base_model_id": parent,
                "max_request_context_length": max_len,
            },
        }

    async def _readable(self, lora_id: str) -> bool:
        return await asyncio.to_thread(self.store.read, lora_id, CONFIG_NAME) is not None

    async def _ray_models(self, req: Request) -> None:
        served = self.config.model
        data = [self._card(served, served, None, self.config.max_model_len, 0)]
        for sub in await asyncio.to_thread(self.store.subfolders):
            if await self._readable(sub):
                data.append(self._card(f"{served}:{sub}", sub, served, self.config.max_model_len, 0))
        await send_json(req.send, 200, {"object": "list", "data": data})

    async def _model_data(self, req: Request, model: str) -> None:
        model = model.replace("--", "/")  # Ray's replace_prefix
        served = self.config.model
        if model == served:
            await send_json(req.send, 200, self._card(served, served, None, self.config.max_model_len, 0))
            return
        base, _, lora_id = model.partition(":")
        if base == served and lora_id and await self._readable(lora_id):
            await send_json(req.send, 200, self._card(model, lora_id, served, self.config.max_model_len, 0))
            return
        await ray_error(
            404,
            f"Unable to find {model}. Please ensure that the model exists and you have permission.",
            "InvalidModel",
        ).send(req)

    async def _healthz(self, req: Request) -> None:
        if self.config.faults.dead:
            await send_response(req.send, 503, b"This node is being drained.")
            return
        await send_response(req.send, 200, b"success", ((b"content-type", b"text/plain; charset=utf-8"),))

    async def _routes(self, req: Request) -> None:
        await send_json(req.send, 200, {"/": "llm_app"})

    async def _engine_state(self, req: Request) -> None:
        await send_json(
            req.send,
            200,
            {
                "engine": "ray-serve",
                "loaded": list(self.lru),
                "disk_cache": sorted(self.disk_cache),
                "downloads": self.downloads,
                "first_hits": self.first_hits,
                "evictions": self.evictions,
                "max_num_adapters_per_replica": self.max_per_replica,
            },
        )
