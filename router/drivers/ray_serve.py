"""The Ray Serve LLM driver (``ray.serve.llm``'s OpenAI app over vLLM), as Ray's source has it
(``ray-project/ray``; files and commits in ``simulator/README.md``).

Ray Serve LLM has no load API. An ``LLMConfig`` with ``lora_config.dynamic_lora_loading_path``
loads an adapter by name on the first request for ``model="<base_model_id>:<name>"``: it reads
``<path>/<name>/adapter_config.json`` (404 ``Unable to find LoRA adapter config file …`` when
missing), downloads the folder into a local disk cache keyed by the name, and keeps it in each
replica's LRU of ``max_num_adapters_per_replica`` (Serve multiplexing routes a name to replicas
that hold it). So here:

- the plane's "load" is the stager's *publish* of the verified files under the version's
  immutable name (``staging.mode: publish``); ``load`` then only checks the app sees it
  (``GET /v1/models/<base>:<name>``: 200, or 404 → ``not_found``, and the loader publishes again);
- ``unload`` asks nothing of the engine (Ray evicts by itself); the unloader's cleanup
  *unpublishes* a version once it is retired or disabled;
- the endpoint is one opaque pool (an outside caller cannot address a Ray replica): residency is
  the plane's ledger of what it published (``advisory``), and the plane never evicts for room;
- health is the Serve proxy's ``/-/healthz``; there are no engine metrics on the Serve HTTP port
  (Ray exports them per node): placement uses its own in-flight counts.

Inference answers: 5xx and 408 (the ingress's own request timeout) are retried elsewhere; a 404
for an adapter request (the folder is not published, or not readable) means republish and resend.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from router.capabilities import CAPABILITIES
from router.drivers.base import AnswerKind, LoadResult, MetricsSample, ModelsInfo, UnloadResult
from router.drivers.http_base import DriverError, HttpDriver, error_fields, parse_model_list


class RayServeDriver(HttpDriver):
    name = "ray-serve"
    capabilities = CAPABILITIES["ray-serve"]
    health_path = "/-/healthz"
    metrics_path = None

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api_key: str | None = None,
        *,
        served_model: str,
        timeout: aiohttp.ClientTimeout | None = None,
        stream_timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        super().__init__(session, api_key, timeout=timeout, stream_timeout=stream_timeout)
        self._served = served_model

    def request_fields(self, lora_name: str | None, int_id: int, served_model: str) -> dict[str, Any]:
        return {"model": f"{served_model}:{lora_name}" if lora_name else served_model}

    def classify_answer(self, status: int, body: bytes, *, adapter: bool) -> AnswerKind:
        if status >= 500 or status == 408:
            return "retry"
        if status == 404 and adapter:
            return "adapter_missing"
        return "ok"

    async def list_adapters(self, url: str, timeout: float) -> ModelsInfo:
        """``/v1/models``: the base models and ``<base>:<name>`` per published folder (what can be
        served, not what a replica holds)."""
        status, body = await self._get(f"{url}/v1/models", timeout, auth=True)
        if status != 200:
            raise DriverError(f"GET {url}/v1/models: HTTP {status}")
        bases: list[str] = []
        adapters: dict[str, str] = {}
        for card in parse_model_list(body, url):
            base, sep, lora = card["id"].partition(":")
            if sep and lora:
                adapters[lora] = ""
            else:
                bases.append(base)
        return ModelsInfo(base_names=tuple(bases), adapters=adapters)

    def parse_metrics(self, text: str) -> MetricsSample:
        return MetricsSample()

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
        model_id = f"{self._served}:{lora_name}"
        if "--" in model_id:  # Ray's model_data turns "--" into "/" in this path: nothing to check
            return LoadResult(ok=True)
        try:
            async with self._session.get(
                f"{url}/v1/models/{quote(model_id, safe=':@')}",
                headers=self._auth,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                status, body = resp.status, await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return await self.unanswered_load(url, exc, timeout)
        if status == 200:
            return LoadResult(ok=True, status=status)
        message = error_fields(body)[1]
        if status == 404:
            return LoadResult(False, "not_found", status, message)
        if status in (502, 503, 504):
            return LoadResult(False, "replica_down", status, message)
        return LoadResult(False, "rejected" if status < 500 else "other", status, message)

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult:
        return UnloadResult(True)
