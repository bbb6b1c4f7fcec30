"""The vLLM engine driver (as vLLM 0.32 does): dynamic LoRA endpoints, ``/v1/models``, ``/metrics``.

Load failure classification (by status code and vLLM's error ``type``, never by message
substring alone):

| answer | failure |
|---|---|
| 200 | ok |
| 404 (``NotFoundError``: no adapter_config.json at the path) | ``not_found`` |
| 404 ``{"detail":"Not Found"}`` (runtime LoRA updating disabled) | ``rejected`` |
| 400 ``InvalidUserInput`` "already been loaded" | ``conflict`` (treated as loaded) |
| 400 (≤0.17: the engine refused the adapter) | ``rejected`` |
| 500 ``InternalServerError`` "Call to add_lora method failed: …" (the engine refused it) | ``rejected`` |
| any other 500 (not vLLM's answer: a proxy, a crashed worker) | ``other`` |
| 401 (wrong api key) | ``rejected`` |
| 502/503/504 | ``replica_down`` |
| no answer | ``router.drivers.http_base``: refused → ``replica_down``; reset → ``other`` (health probe OK) |
"""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from router.capabilities import CAPABILITIES
from router.drivers.base import AnswerKind, LoadResult, MetricsSample, ModelsInfo, UnloadResult
from router.drivers.http_base import DriverError, HttpDriver, error_fields, parse_model_list

__all__ = ["DriverError", "VllmDriver", "classify_load", "wanted_lines"]

# vLLM's own message for an adapter the engine refused (``InternalServerError``, (as vLLM 0.32 does);
# checked together with the error type, never alone.
_ADD_LORA_FAILED = "Call to add_lora method failed"


# The families placement reads; every other line of a replica's /metrics (~70 families, most of
# them histograms: ~500 lines) is dropped before parsing, which took ~15-45 ms a poll.
_FAMILIES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
    }
)
_SUFFIXES = ("_total", "_created", "_count", "_sum", "_bucket", "_info")


def _family_of(name: str) -> str:
    if name in _FAMILIES:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in _FAMILIES:
            return name[: -len(suffix)]
    return ""


def wanted_lines(text: str) -> str:
    """The lines of the families in ``_FAMILIES`` (samples, ``# HELP`` / ``# TYPE``); the parse of
    the result gives those families exactly as the parse of the whole text would."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and _family_of(parts[2]):
                out.append(line)
        elif line.startswith("vllm:"):
            end = len(line)
            for stop in ("{", " ", "\t"):
                i = line.find(stop)
                if 0 <= i < end:
                    end = i
            if _family_of(line[:end]):
                out.append(line)
    out.append("")
    return "\n".join(out)


def _error_fields(body: bytes) -> tuple[str, str]:
    """(type, message) of a vLLM error body; ("", text) when it is not one."""
    return error_fields(body)


def classify_load(status: int, body: bytes) -> LoadResult:
    """Classify a ``/v1/load_lora_adapter`` answer."""
    if status == 200:
        return LoadResult(ok=True, status=status)
    etype, message = _error_fields(body)
    if status == 404:
        if etype == "detail":
            return LoadResult(False, "rejected", status, "runtime LoRA updating is disabled on the replica")
        return LoadResult(False, "not_found", status, message)
    if status == 400 and etype == "InvalidUserInput" and "already been loaded" in message:
        return LoadResult(False, "conflict", status, message)
    if status == 500 and not (etype == "InternalServerError" and message.startswith(_ADD_LORA_FAILED)):
        return LoadResult(False, "other", status, message)
    if status in (400, 401, 403, 422, 500):
        return LoadResult(False, "rejected", status, message)
    if status in (502, 503, 504):
        return LoadResult(False, "replica_down", status, message)
    return LoadResult(False, "other", status, message)


class VllmDriver(HttpDriver):
    """Talks to vLLM (and the simulator) over a shared aiohttp session."""

    name = "vllm"
    capabilities = CAPABILITIES["vllm"]

    def classify_answer(self, status: int, body: bytes, *, adapter: bool) -> AnswerKind:
        """5xx: the replica is in trouble (retry elsewhere). 404 for an adapter request: vLLM's
        "model does not exist" (it restarted and lost the adapter). Anything else is the
        answer to this request (4xx errors about the request pass through to the client)."""
        if status >= 500:
            return "retry"
        if status == 404 and adapter:
            return "adapter_missing"
        return "ok"

    def request_fields(self, lora_name: str | None, int_id: int, served_model: str) -> dict[str, Any]:
        return {"model": lora_name or served_model}

    async def list_adapters(self, url: str, timeout: float) -> ModelsInfo:
        status, body = await self._get(f"{url}/v1/models", timeout, auth=True)
        if status != 200:
            raise DriverError(f"GET {url}/v1/models: HTTP {status}")
        bases: list[str] = []
        adapters: dict[str, str] = {}
        for card in parse_model_list(body, url):
            if card.get("parent"):
                adapters[card["id"]] = str(card.get("root") or "")
            else:
                bases.append(card["id"])
        return ModelsInfo(base_names=tuple(bases), adapters=adapters)

    def parse_metrics(self, text: str) -> MetricsSample:
        """Sum the gauges over engines; ``lora_requests_info``: the sample with the LARGEST value."""
        running = waiting = 0.0
        by_reason: dict[str, int] = {}
        kv = 0.0
        best: tuple[float, dict[str, str]] | None = None
        try:
            families = list(text_string_to_metric_families(wanted_lines(text)))
        except ValueError:
            return MetricsSample()
        for fam in families:
            name = fam.name
            if name == "vllm:num_requests_running":
                running = sum(s.value for s in fam.samples)
            elif name == "vllm:num_requests_waiting":
                waiting = sum(s.value for s in fam.samples)
            elif name == "vllm:num_requests_waiting_by_reason":
                for s in fam.samples:
                    reason = s.labels.get("reason", "")
                    by_reason[reason] = by_reason.get(reason, 0) + int(s.value)
            elif name == "vllm:kv_cache_usage_perc":
                kv = max((s.value for s in fam.samples), default=0.0)
            elif name == "vllm:lora_requests_info":
                for s in fam.samples:
                    if best is None or s.value > best[0]:
                        best = (s.value, s.labels)
        lora_running: tuple[str, ...] = ()
        lora_waiting: tuple[str, ...] = ()
        max_lora: int | None = None
        if best is not None:
            labels = best[1]
            lora_running = tuple(x for x in labels.get("running_lora_adapters", "").split(",") if x)
            lora_waiting = tuple(x for x in labels.get("waiting_lora_adapters", "").split(",") if x)
            try:
                max_lora = int(labels.get("max_lora", ""))
            except ValueError:
                max_lora = None
        return MetricsSample(
            running=int(running),
            waiting=int(waiting),
            waiting_by_reason=by_reason,
            kv_cache_usage=float(kv),
            lora_running=lora_running,
            lora_waiting=lora_waiting,
            max_lora=max_lora,
        )

    async def load(
        self,
        url: str,
        lora_name: str,
        lora_path: str,
        timeout: float,
        *,
        pinned: bool = False,
        int_id: int = 0,
    ) -> LoadResult:
        try:
            status, body = await self._post(
                f"{url}/v1/load_lora_adapter", {"lora_name": lora_name, "lora_path": lora_path}, timeout
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return await self.unanswered_load(url, exc, timeout)
        return classify_load(status, body)

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult:
        try:
            status, body = await self._post(
                f"{url}/v1/unload_lora_adapter", {"lora_name": lora_name}, timeout
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return UnloadResult(False, message=f"{type(exc).__name__}: {exc}")
        if status == 200:
            return UnloadResult(True)
        if status == 404:
            return UnloadResult(True, already_gone=True, message=_error_fields(body)[1])
        return UnloadResult(False, message=f"HTTP {status}: {_error_fields(body)[1]}")
