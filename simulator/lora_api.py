"""``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter`` and the SageMaker aliases (as vLLM 0.32 does).

Success bodies are plain text with no Content-Type; errors use vLLM 0.33's statuses, types
and messages, with ``<path>`` redaction.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from simulator.adapters import (
    AdapterFiles,
    AdapterNotFound,
    AdapterRejected,
    inspect_adapter,
    sanitize_message,
)
from simulator.asgi_io import Request, send_error, send_response, validation_message

if TYPE_CHECKING:
    from simulator.app import SimApp


@dataclass
class LoadedAdapter:
    name: str
    path: str  # lora_path as given (the card's ``root``)
    lora_id: int
    sha256: str
    size_bytes: int
    loaded_at: float


class LoadError(Exception):
    def __init__(self, status: int, type_: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.type_, self.message, self.param = status, type_, message, param


_TYPE_NAMES = {
    str: ("string_type", "Input should be a valid string"),
    bool: ("bool_type", "Input should be a valid boolean"),
}


def summarize_input(value: object) -> object:
    """vLLM's bounded rendering of a validation error's ``input``."""
    if isinstance(value, str):
        return value[:200] + "...[truncated]" if len(value) > 200 else value
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


async def read_json_object(req: Request) -> dict[str, Any]:
    """Content-type check + JSON parse, raising ``LoadError`` shaped like vLLM's 400s."""
    ctype = req.header(b"content-type").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise LoadError(
            400,
            "Bad Request",
            validation_message(["Unsupported Media Type: Only 'application/json' is allowed"]),
        )
    raw = await req.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        bad: dict[str, Any] = {
            "type": "json_invalid",
            "loc": "body.0",
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": str(exc).split(":", 1)[0]},
        }
        raise LoadError(400, "Bad Request", validation_message([bad]), "body.0") from None
    if not isinstance(body, dict):
        err: dict[str, Any] = {
            "type": "model_attributes_type",
            "loc": "body",
            "msg": "Input should be a valid dictionary or object to extract fields from",
            "input": summarize_input(body),
        }
        raise LoadError(400, "Bad Request", validation_message([err]), "body")
    return body


def check_fields(body: dict[str, Any], required: dict[str, type], optional: dict[str, type]) -> None:
    """Pydantic-like field validation with vLLM's rendering of the errors."""
    errors: list[dict[str, Any]] = []
    for name, typ in {**required, **optional}.items():
        if name not in body:
            if name in required:
                errors.append(
                    {
                        "type": "missing",
                        "loc": f"body.{name}",
                        "msg": "Field required",
                        "input": f"<dict of {len(body)} items>",
                    }
                )
            continue
        value = body[name]
        if value is None and name in optional:
            continue
        ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
        if typ is bool and value in (0, 1) and not isinstance(value, bool) and isinstance(value, int):
            ok = True
        if not ok:
            t, msg = _TYPE_NAMES.get(typ, ("type_error", f"Input should be a valid {typ.__name__}"))
            errors.append({"type": t, "loc": f"body.{name}", "msg": msg, "input": summarize_input(value)})
    if errors:
        raise LoadError(400, "Bad Request", validation_message(list(errors)), str(errors[0]["loc"]))


async def load_adapter(app: SimApp, name: str, path: str, load_inplace: bool) -> LoadedAdapter:
    """The load semantics shared by the HTTP route and static ``--lora-modules``."""
    if not name or not path:
        raise LoadError(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
    if name == app.config.model:
        raise LoadError(
            400, "InvalidUserInput", f"The lora adapter '{name}' conflicts with a served base model."
        )
    async with app.name_lock(name):
        existing = app.adapters.get(name)
        if existing is not None and not load_inplace:
            raise LoadError(
                400,
                "InvalidUserInput",
                f"The lora adapter '{name}' has already been loaded. "
                "If you want to load the adapter in place, set 'load_inplace' to True.",
            )
        faults = app.config.faults
        app.load_calls += 1
        if faults.dead:
            raise LoadError(500, "InternalServerError", app.dead_message)
        if faults.slow_load_s > 0:
            await asyncio.sleep(faults.slow_load_s)
        if faults.fail_loads > 0:
            faults.fail_loads -= 1
            if faults.fail_load_status == 404:
                raise LoadError(
                    404,
                    "NotFoundError",
                    sanitize_message(f"Loading lora {name} failed: No adapter found for {path}"),
                )
            raise LoadError(500, "InternalServerError", _add_lora_failed(app, "simulated load failure"))
        try:
            files: AdapterFiles = await asyncio.to_thread(inspect_adapter, path, app.config.max_lora_rank)
        except AdapterNotFound as exc:
            raise LoadError(
                404, "NotFoundError", sanitize_message(f"Loading lora {name} failed: {exc}")
            ) from None
        except AdapterRejected as exc:
            raise LoadError(500, "InternalServerError", _add_lora_failed(app, str(exc))) from None
        now = time.monotonic()
        load = app.engine.register_adapter(name, files.size_bytes, now, inplace=existing is not None)
        app.driver.kick()
        wait = load.ready_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        adapter = LoadedAdapter(name, path, load.lora_id, files.sha256, files.size_bytes, time.time())
        app.adapters[name] = adapter  # an in-place reload keeps its position (dict order)
        app.loads_ok += 1
        return adapter


def _add_lora_failed(app: SimApp, reason: str) -> str:
    if app.config.wrap_worker_errors:
        reason = f"Worker failed with error '{reason}', please check the stack trace above for the root cause"
    return sanitize_message(f"Call to add_lora method failed: {reason}")


async def unload_adapter(app: SimApp, name: str) -> None:
    if not name:
        raise LoadError(400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
    async with app.name_lock(name):
        if name not in app.adapters:
            raise LoadError(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del app.adapters[name]
        app.engine.unregister_adapter(name)  # registry only: engine residency persists (vLLM)


async def handle_load(app: SimApp, req: Request) -> None:
    try:
        body = await read_json_object(req)
        check_fields(
            body, {"lora_name": str, "lora_path": str}, {"load_inplace": bool, "is_3d_lora_weight": bool}
        )
        name = body["lora_name"]
        await load_adapter(app, name, body["lora_path"], bool(body.get("load_inplace") or False))
    except LoadError as exc:
        await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
        return
    await send_response(req.send, 200, f"Success: LoRA adapter '{name}' added successfully.".encode())


async def handle_unload(app: SimApp, req: Request) -> None:
    try:
        body = await read_json_object(req)
        check_fields(body, {"lora_name": str}, {"lora_int_id": int})
        name = body["lora_name"]
        await unload_adapter(app, name)
    except LoadError as exc:
        await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
        return
    await send_response(req.send, 200, f"Success: LoRA adapter '{name}' removed successfully.".encode())


async def handle_sagemaker_load(app: SimApp, req: Request) -> None:
    """``POST /adapters`` with ``{"name", "src"}`` (vLLM's SageMaker alias)."""
    try:
        body = await read_json_object(req)
        check_fields(body, {"name": str, "src": str}, {})
        name = body["name"]
        await load_adapter(app, name, body["src"], False)
    except LoadError as exc:
        await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
        return
    await send_response(req.send, 200, f"Success: LoRA adapter '{name}' added successfully.".encode())


async def handle_sagemaker_unload(app: SimApp, req: Request) -> None:
    name = req.path_params.get("name", "")
    try:
        await unload_adapter(app, name)
    except LoadError as exc:
        await send_error(req.send, exc.status, exc.message, exc.type_, exc.param)
        return
    await send_response(req.send, 200, f"Success: LoRA adapter '{name}' removed successfully.".encode())
