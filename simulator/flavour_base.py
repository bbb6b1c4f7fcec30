"""What the engine flavours share: an error answer in the flavour's own envelope, and the
common ``SimApp`` set-up of a flavour (the vLLM-only routes removed)."""

from __future__ import annotations

from dataclasses import replace

import orjson

from simulator.app import SimApp
from simulator.asgi_io import Request, send_json
from simulator.config import SimConfig

# vLLM's routes that the other engines do not have
VLLM_ONLY = (
    "/ping",
    "/load",
    "/tokenize",
    "/version",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/adapters",
)


class FlavourError(Exception):
    """An answer an engine flavour sends instead of generating (its own envelope and status)."""

    def __init__(self, status: int, body: dict[str, object]) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body

    async def send(self, req: Request) -> None:
        await send_json(req.send, self.status, self.body)


def json_body(raw: bytes) -> dict[str, object] | None:
    """``raw`` as a JSON object, or None."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class FlavourApp(SimApp):
    """A ``SimApp`` that speaks another engine's API: vLLM's runtime-LoRA routes are off and the
    vLLM-only routes are gone; subclasses add their own."""

    def __init__(self, config: SimConfig, *, exit_process: bool = False) -> None:
        super().__init__(replace(config, allow_runtime_lora=False), exit_process=exit_process)
        for path in VLLM_ONLY:
            self.routes.pop(path, None)
