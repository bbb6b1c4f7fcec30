"""The SGLang flavour (``--engine sglang``): SGLang's LoRA HTTP API and semantics, as
``sgl-project/sglang`` has them (files and commits in ``simulator/README.md``).

- ``POST /load_lora_adapter {"lora_name", "lora_path", "pinned"?}`` and ``POST
  /unload_lora_adapter {"lora_name"}`` (no ``/v1``) answer 200 or 400 with
  ``{"success", "error_message", "loaded_adapters": {name: path}}`` (``LoRAUpdateOutput``);
  the texts are SGLang's (already loaded, does not exist, incompatible rank, pin limit).
- The registry is an LRU (every request for a name counts as a use); after a load, while more
  than ``--max-loaded-loras`` are registered, the least recently used unpinned one is unloaded
  (``Unloading least recently used LoRA adapter``).
- Implicit reload: a request naming an adapter that was loaded once but is no longer registered
  (unloaded by hand or by the LRU) reloads it from the path remembered for it; a name never
  loaded is ``400 Got LoRA adapter that has never been loaded``.
- Pinning: at most ``--max-loras`` (``--max-loras-per-batch``) − 1 pinned adapters.
- Unload waits until the requests in flight on the adapter are done.
- ``model`` is ``"<served>:<adapter>"`` split on the first colon; another base is
  ``404 Model '…' is not served.``; ``/v1/models`` lists the base and every registered adapter
  (``parent``, ``root``); ``/metrics`` has SGLang's gauges.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from simulator.adapters import AdapterNotFound, AdapterRejected, inspect_adapter
from simulator.asgi_io import Request, send_json, send_response
from simulator.config import SimConfig
from simulator.flavour_base import FlavourApp, FlavourError
from simulator.generate import handle_generate
from simulator.lora_api import LoadedAdapter, LoadError, check_fields, read_json_object

log = logging.getLogger("simulator.sglang")

SGLANG_VERSION = "0.5.23"


def openai_error(status: int, message: str, type_: str) -> FlavourError:
    """SGLang's OpenAI-endpoint error (``OpenAIServingBase.create_error_response``)."""
    err = {"object": "error", "message": message, "type": type_, "param": None, "code": status}
    return FlavourError(status, {"error": err})


def parse_model(model: str) -> tuple[str, str | None]:
    """``_parse_model_parameter``: ``base:adapter`` split on the first colon, both stripped."""
    if ":" not in model:
        return model, None
    base, adapter = model.split(":", 1)
    return base.strip(), adapter.strip() or None


@dataclass
class _Ref:
    """SGLang's ``LoRARef`` (and what the simulator read from the files)."""

    name: str
    path: str
    pinned: bool
    sha256: str = ""
    size_bytes: int = 0


class SglangApp(FlavourApp):
    def __init__(self, config: SimConfig, *, exit_process: bool = False) -> None:
        super().__init__(config, exit_process=exit_process)
        self.max_loaded = config.flavour.max_loaded_loras
        self.slots = config.timing.max_loras  # --max-loras-per-batch
        self.registry: OrderedDict[str, _Ref] = OrderedDict()  # LRU first
        self.ref_cache: dict[str, _Ref] = {}  # every name ever loaded: implicit reloads read it
        self.in_use: dict[str, int] = {}
        self._drained: dict[str, asyncio.Event] = {}
        self._update_lock = asyncio.Lock()
        self.implicit_reloads = 0
        self.lru_unloads = 0
        for name, adapter in self.adapters.items():  # --lora-modules: SGLang's --lora-paths
            ref = _Ref(name, adapter.path, False, adapter.sha256, adapter.size_bytes)
            self.registry[name] = self.ref_cache[name] = ref
        self.routes.update(
            {
                "/health": {"GET": self._health},
                "/health_generate": {"GET": self._health},
                "/get_model_info": {"GET": self._model_info},
                "/load_lora_adapter": {"POST": self._load_route},
                "/unload_lora_adapter": {"POST": self._unload_route},
                "/v1/models": {"GET": self._sgl_models},
                "/metrics": {"GET": self._sgl_metrics},
                "/v1/completions": {"POST": lambda r: self._generate(r, False)},
                "/v1/chat/completions": {"POST": lambda r: self._generate(r, True)},
            }
        )
        if config.enable_fault_control:
            self.routes["/_sim/engine"] = {"GET": self._engine_state}

    # ------------------------------------------------------------------ registry

    def _loaded(self) -> dict[str, str]:
        return {name: ref.path for name, ref in self.registry.items()}

    def _failure(self, message: str, *, loaded: bool = True) -> dict[str, Any]:
        return {
            "success": False,
            "error_message": message,
            "loaded_adapters": self._loaded() if loaded else None,
        }

    async def load_adapter(self, name: str, path: str, pinned: bool) -> dict[str, Any]:
        """``TokenizerManager.load_lora_adapter`` + ``LoRAManager.load_lora_adapter``."""
        log.info("Start load Lora adapter. Lora name=%s, path=%s", name, path)
        async with self._update_lock:
            faults = self.config.faults
            self.load_calls += 1
            if faults.slow_load_s > 0:
                await asyncio.sleep(faults.slow_load_s)
            if faults.fail_loads > 0:
                faults.fail_loads -= 1
                return self._failure("simulated load failure")
            if name in self.registry:
                return self._failure(f"Failed to load LoRA adapter {name} because it is already loaded")
            n_pinned = sum(1 for r in self.registry.values() if r.pinned)
            if pinned and n_pinned >= self.slots - 1:
                return self._failure(
                    f"Already have {n_pinned} pinned adapters, max allowed is {self.slots - 1} "
                    "(reserving 1 slot for dynamic use). Please unpin some adapters or increase "
                    "max_loras_per_batch."
                )
            try:
                files = await asyncio.to_thread(inspect_adapter, path, self.config.max_lora_rank)
            except AdapterNotFound:
                return self._failure(_not_found_message(path))
            except AdapterRejected as exc:
                return self._failure(_rejected_message(name, path, str(exc), self.config.max_lora_rank))
            load = self.engine.register_adapter(name, files.size_bytes, time.monotonic())
            self.driver.kick()
            wait = load.ready_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            ref = _Ref(name, path, pinned, files.sha256, files.size_bytes)
            self.registry[name] = self.ref_cache[name] = ref
            self.adapters[name] = LoadedAdapter(
                name, path, load.lora_id, files.sha256, files.size_bytes, time.time()
            )
            self.loads_ok += 1
            while self.max_loaded is not None and len(self.registry) > self.max_loaded:
                victim = next((n for n, r in self.registry.items() if not r.pinned), None)
                if victim is None:
                    return self._failure(
                        "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter. "
                        f"LoRA registry is: {dict(self.registry)}",
                        loaded=False,
                    )
                log.info(
                    "Unloading least recently used LoRA adapter '%s' (current number of adapters: %d, "
                    "max allowed: %d)",
                    victim,
                    len(self.registry),
                    self.max_loaded,
                )
                await self._unload_locked(victim)
                self.lru_unloads += 1
            return {"success": True, "error_message": "", "loaded_adapters": self._loaded()}

    async def _unload_locked(self, name: str) -> dict[str, Any]:
        if name not in self.registry:
            raise ValueError(f"LoRA with name {name} does not exist. Loaded LoRAs: {self.registry.keys()}")
        del self.registry[name]  # no new request starts on it
        self.adapters.pop(name, None)
        if self.in_use.get(name, 0) > 0:  # wait_for_unload: the requests in flight finish first
            event = self._drained.setdefault(name, asyncio.Event())
            await event.wait()
        self.engine.unregister_adapter(name)
        return {"success": True, "error_message": "", "loaded_adapters": self._loaded()}

    async def unload_adapter(self, name: str) -> dict[str, Any]:
        log.info("Start unload Lora adapter. Lora name=%s", name)
        async with self._update_lock:
            try:
                return await self._unload_locked(name)
            except ValueError as exc:
                return {"success": False, "error_message": str(exc), "loaded_adapters": None}

    async def _acquire(self, name: str) -> None:
        """``_resolve_lora_path`` + ``LoRARegistry.acquire``: reload an evicted name, count a use."""
        if name not in self.registry:
            ref = self.ref_cache.get(name)
            if ref is None:
                raise ValueError(
                    f"Got LoRA adapter that has never been loaded: {name}\n"
                    f"All loaded adapters: {self.ref_cache.keys()}."
                )
            log.info("Reloading evicted adapter: %s", name)
            self.implicit_reloads += 1
            out = await self.load_adapter(ref.name, ref.path, ref.pinned)
            if not out["success"] and "already loaded" not in out["error_message"]:
                raise ValueError(f"Failed to implicitly load LoRA adapter {name}: {out['error_message']}")
        if name not in self.registry:
            raise ValueError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {self.registry.keys()}."
            )
        self.registry.move_to_end(name)
        self.in_use[name] = self.in_use.get(name, 0) + 1

    def _release(self, name: str) -> None:
        left = self.in_use.get(name, 1) - 1
        if left > 0:
            self.in_use[name] = left
            return
        self.in_use.pop(name, None)
        event = self._drained.pop(name, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ routes

    async def _load_route(self, req: Request) -> None:
        try:
            body = await read_json_object(req)
            check_fields(body, {"lora_name": str, "lora_path": str}, {"pinned": bool, "lora_id": str})
        except LoadError as exc:
            await send_json(req.send, 400, _validation(exc.message))
            return
        out = await self.load_adapter(body["lora_name"], body["lora_path"], bool(body.get("pinned")))
        await send_json(req.send, 200 if out["success"] else 400, out)

    async def _unload_route(self, req: Request) -> None:
        try:
            body = await read_json_object(req)
            check_fields(body, {"lora_name": str}, {"lora_id": str})
        except LoadError as exc:
            await send_json(req.send, 400, _validation(exc.message))
            return
        out = await self.unload_adapter(body["lora_name"])
        await send_json(req.send, 200 if out["success"] else 400, out)

    async def _generate(self, req: Request, chat: bool) -> None:
        try:
            body = await read_json_object(req)
        except LoadError as exc:
            await send_json(req.send, 400, _validation(exc.message))
            return
        model = body.get("model")
        adapter: str | None = None
        try:
            if isinstance(model, str) and model:
                base, adapter = parse_model(model)
                if base != self.config.model:
                    raise openai_error(404, f"Model {model!r} is not served.", "NotFound")
            if adapter is None and isinstance(body.get("lora_path"), str):
                adapter = body["lora_path"]  # the older form: model names the base
            if adapter is not None:
                try:
                    await self._acquire(adapter)
                except ValueError as exc:
                    raise openai_error(400, str(exc), "BadRequest") from None
        except FlavourError as exc:
            await exc.send(req)
            return
        try:
            await handle_generate(self, req, chat)
        finally:
            if adapter is not None:
                self._release(adapter)

    def resolve_request(self, body: dict[str, Any], model: str) -> tuple[str | None, str]:
        _, adapter = parse_model(model) if model else (model, None)
        if adapter is None and isinstance(body.get("lora_path"), str):
            adapter = body["lora_path"]
        if adapter is None:
            return None, f"base:{self.config.model}"
        loaded = self.adapters.get(adapter)
        if loaded is None:  # unloaded between the check and now
            raise LoadError(
                400, "BadRequest", f"The following requested LoRA adapters are not loaded: {adapter}"
            )
        return adapter, loaded.sha256

    async def _model_info(self, req: Request) -> None:
        await send_json(
            req.send,
            200,
            {
                "model_path": self.config.model_root or self.config.model,
                "tokenizer_path": self.config.model_root or self.config.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            },
        )

    async def _sgl_models(self, req: Request) -> None:
        now = int(time.time())
        served = self.config.model

        def card(id_: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
            return {
                "id": id_,
                "object": "model",
                "created": now,
                "owned_by": "sglang",
                "root": root,
                "parent": parent,
                "max_model_len": max_len,
            }

        data = [card(served, served, None, self.config.max_model_len)]
        data += [card(r.name, r.path, served, None) for r in self.registry.values()]
        await send_json(req.send, 200, {"object": "list", "data": data})

    async def _sgl_metrics(self, req: Request) -> None:
        eng = self.engine
        labels = f'model_name="{self.config.model}",engine_type="unified",tp_rank="0",pp_rank="0"'
        used = len(eng.gpu_slots())
        rows = [
            ("num_running_reqs", "The number of running requests.", eng.running),
            ("num_queue_reqs", "The number of requests in the waiting queue.", eng.waiting),
            ("token_usage", "The token usage.", round(eng.kv_cache_usage, 6)),
            ("lora_pool_slots_used", "Number of LoRA adapter slots currently occupied in GPU memory.", used),
            (
                "lora_pool_slots_total",
                "Total number of LoRA adapter slots available (max_loras_per_batch).",
                self.slots,
            ),
            (
                "lora_pool_utilization",
                "LoRA pool utilization ratio (used/total); 1.0 means the pool is full.",
                round(used / self.slots, 6) if self.slots else 0.0,
            ),
        ]
        out = []
        for name, doc, value in rows:
            out.append(f"# HELP sglang:{name} {doc}\n# TYPE sglang:{name} gauge\n")
            out.append(f"sglang:{name}{{{labels}}} {float(value)}\n")
        await send_response(
            req.send,
            200,
            "".join(out).encode(),
            ((b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),),
        )

    async def _engine_state(self, req: Request) -> None:
        await send_json(
            req.send,
            200,
            {
                "engine": "sglang",
                "registry": [
                    {"name": r.name, "path": r.path, "pinned": r.pinned} for r in self.registry.values()
                ],
                "ref_cache": sorted(self.ref_cache),
                "in_use": dict(self.in_use),
                "implicit_reloads": self.implicit_reloads,
                "lru_unloads": self.lru_unloads,
                "max_loaded_loras": self.max_loaded,
            },
        )


def _validation(message: str) -> dict[str, Any]:
    """SGLang's answer to a request that fails validation (422 turned into 400, flat)."""
    return {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}


def _not_found_message(path: str) -> str:
    """What ``LoRAConfig(path)`` raises: a local directory without the config, or (no such
    directory) the hub's repo-id validation."""
    from pathlib import Path

    if Path(path).expanduser().is_dir():
        return f"[Errno 2] No such file or directory: '{path.rstrip('/')}/adapter_config.json'"
    return (
        "Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        f"'{path}'. Use `repo_type` argument if needed."
    )


def _rejected_message(name: str, path: str, reason: str, max_rank: int) -> str:
    """``validate_new_adapter``'s memory-pool message for a rank over ``--max-lora-rank``; the
    reason as it is otherwise."""
    import json
    from pathlib import Path

    try:
        cfg = json.loads((Path(path).expanduser() / "adapter_config.json").read_text())
        rank = int(cfg.get("r", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return reason
    if rank > max_rank:
        return (
            f"LoRA adapter {name} with rank {rank} is incompatible with the current LoRA memory pool "
            "configuration. Please ensure that the LoRA adapter's rank is within the configured "
            "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`."
        )
    return reason
