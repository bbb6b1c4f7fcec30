"""The SGLang engine driver (``sglang.launch_server --enable-lora``), as SGLang's source has it
(``sgl-project/sglang``; files and commits in ``simulator/README.md``).

- Load: ``POST /load_lora_adapter {"lora_name", "lora_path", "pinned"}`` (no ``/v1``); unload:
  ``POST /unload_lora_adapter {"lora_name"}``. Both answer 200 or 400 with the same JSON
  (``LoRAUpdateOutput``): ``{"success", "error_message", "loaded_adapters": {name: …}}``.
- Requests name an adapter as ``model="<served>:<lora_name>"`` (split on the first colon).
- ``/v1/models`` lists the base and every loaded adapter (``parent`` = the base, ``root`` = its
  path); ``/metrics`` has ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage`` and ``sglang:lora_pool_slots_total``.
- SGLang keeps its own LRU over ``--max-loaded-loras`` (= the pool's ``max_adapters``, so it
  never has to evict for the plane) and reloads a name it has seen from the path it remembers
  when a request names it after an unload (``implicit_reload``).
- ``pinned`` keeps a hot adapter in a GPU slot; SGLang refuses to pin all of
  ``--max-loras-per-batch`` (= the pool's ``max_loras``), so at most ``max_loras - 1`` are pinned
  here, and a pinned load it refuses is made again unpinned.

Load classification:

| answer | failure |
|---|---|
| 200, ``success: true`` | ok |
| 400, the name in ``loaded_adapters`` ("already loaded") | ``conflict`` (treated as loaded) |
| 400, other (``error_message``: bad adapter, LoRA not enabled, …) | ``rejected`` |
| 500 | ``other`` |
| 502/503/504 | ``replica_down`` |
| no answer | ``router.drivers.http_base`` |

Inference answers: 5xx and 404 (``Model '…' is not served``: this replica does not serve the
base) are retried elsewhere; a 400 for an adapter request whose message is SGLang's "not loaded"
/ "never been loaded" / "Failed to implicitly load" (its ``ValueError``s carry no type of their
own: ``BadRequest`` for all) means the replica does not have it (reload and resend); any other
4xx is the client's answer.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from router.capabilities import CAPABILITIES
from router.drivers.base import AnswerKind, LoadResult, MetricsSample, ModelsInfo, UnloadResult
from router.drivers.http_base import DriverError, HttpDriver, error_fields, parse_model_list

# SGLang's own wording (tokenizer manager / LoRA registry ValueErrors) of "this replica does not
# have that adapter": the only thing telling them from other 400s.
_NOT_LOADED = (
    "requested LoRA adapters are not loaded",
    "has never been loaded",
    "Failed to implicitly load LoRA adapter",
)
_FAMILIES = frozenset(
    {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:lora_pool_slots_total",
    }
)


def _update_output(body: bytes) -> tuple[bool, str, dict[str, Any] | None]:
    """(success, error_message, loaded_adapters) of a ``LoRAUpdateOutput``; (False, text, None)
    when the body is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, body.decode("utf-8", "replace")[:500], None
    if not isinstance(data, dict) or "success" not in data:
        return False, error_fields(body)[1], None
    loaded = data.get("loaded_adapters")
    return (
        bool(data.get("success")),
        str(data.get("error_message") or ""),
        (loaded if isinstance(loaded, dict) else None),
    )


def classify_load(status: int, body: bytes, lora_name: str) -> LoadResult:
    """Classify a ``/load_lora_adapter`` answer."""
    ok, message, loaded = _update_output(body)
    if status == 200 and ok:
        return LoadResult(ok=True, status=status)
    if status == 400 and loaded is not None and lora_name in loaded:
        return LoadResult(False, "conflict", status, message)
    if status in (400, 401, 403, 404, 422):
        return LoadResult(False, "rejected", status, message or f"HTTP {status}")
    if status in (502, 503, 504):
        return LoadResult(False, "replica_down", status, message)
    return LoadResult(False, "other", status, message or f"HTTP {status}")


class SglangDriver(HttpDriver):
    name = "sglang"
    capabilities = CAPABILITIES["sglang"]

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api_key: str | None = None,
        *,
        max_loras: int = 4,
        timeout: aiohttp.ClientTimeout | None = None,
        stream_timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        super().__init__(session, api_key, timeout=timeout, stream_timeout=stream_timeout)
        self._max_pinned = max(0, max_loras - 1)
        self._pinned: dict[str, set[str]] = {}  # url → names this process loaded pinned there

    def request_fields(self, lora_name: str | None, int_id: int, served_model: str) -> dict[str, Any]:
        return {"model": f"{served_model}:{lora_name}" if lora_name else served_model}

    def classify_answer(self, status: int, body: bytes, *, adapter: bool) -> AnswerKind:
        if status >= 500 or status == 404:
            return "retry"
        if status == 400 and adapter:
            message = error_fields(body)[1]
            if any(phrase in message for phrase in _NOT_LOADED):
                return "adapter_missing"
        return "ok"

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
        running = waiting = 0.0
        usage = 0.0
        slots: int | None = None
        lines = [ln for ln in text.splitlines() if ln.startswith("sglang:") or ln.startswith("#")]
        try:
            families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
        except ValueError:
            return MetricsSample()
        for fam in families:
            if fam.name not in _FAMILIES:
                continue
            values = [s.value for s in fam.samples]
            if fam.name == "sglang:num_running_reqs":
                running = sum(values)
            elif fam.name == "sglang:num_queue_reqs":
                waiting = sum(values)
            elif fam.name == "sglang:token_usage":
                usage = max(values, default=0.0)
            elif values:
                slots = int(max(values))
        return MetricsSample(
            running=int(running), waiting=int(waiting), kv_cache_usage=float(usage), max_lora=slots
        )

    async def _load_call(
        self, url: str, lora_name: str, lora_path: str, timeout: float, pinned: bool
    ) -> LoadResult:
        payload = {"lora_name": lora_name, "lora_path": lora_path, "pinned": pinned}
        try:
            status, body = await self._post(f"{url}/load_lora_adapter", payload, timeout)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return await self.unanswered_load(url, exc, timeout)
        return classify_load(status, body, lora_name)

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
        mine = self._pinned.setdefault(url, set())
        pin = pinned and len(mine) < self._max_pinned
        res = await self._load_call(url, lora_name, lora_path, timeout, pin)
        if pin and res.failure == "rejected":
            # SGLang refuses a pin beyond max_loras - 1 (other processes pinned too): load it unpinned
            res = await self._load_call(url, lora_name, lora_path, timeout, False)
            pin = False
        if (res.ok or res.failure == "conflict") and pin:
            mine.add(lora_name)
        return res

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult:
        try:
            status, body = await self._post(f"{url}/unload_lora_adapter", {"lora_name": lora_name}, timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return UnloadResult(False, message=f"{type(exc).__name__}: {exc}")
        ok, message, _ = _update_output(body)
        if status == 200 and ok:
            self._pinned.get(url, set()).discard(lora_name)
            return UnloadResult(True)
        if status == 400:
            # "LoRA with name X does not exist": confirmed by the replica's own listing, not the text
            try:
                listed = await self.list_adapters(url, timeout)
            except DriverError:
                return UnloadResult(False, message=f"HTTP {status}: {message}")
            if lora_name not in listed.adapters:
                self._pinned.get(url, set()).discard(lora_name)
                return UnloadResult(True, already_gone=True, message=message)
        return UnloadResult(False, message=f"HTTP {status}: {message}")
