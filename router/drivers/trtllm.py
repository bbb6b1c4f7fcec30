"""The TensorRT-LLM driver (``trtllm-serve``, PyTorch backend), as TensorRT-LLM's source has it
(``NVIDIA/TensorRT-LLM``; files and commits in ``simulator/README.md``).

trtllm-serve has no load API: every request carries its adapter in the OpenAI body,
``"lora_request": {"lora_name", "lora_int_id", "lora_path"}``, with ``model`` the base. The
engine caches adapter weights by ``lora_int_id`` (``max_loras`` on the GPU, ``max_cpu_loras`` on
the host, LRU) and loads ``lora_path`` when the id is not in its host cache. So here:

- ``lora_int_id`` is the version's registry id (``VersionInfo.int_id``): stable cluster-wide,
  never reused for other bytes (a version's bytes never change and its row is never deleted);
  a version without one is refused (``load`` → ``rejected``);
- ``load`` asks nothing of the engine: the loader has staged the verified files where the engine
  reads them (``<staging dir as the replica sees it>/<lora_name>``), and the plane's residency
  records are the advisory ledger of what each replica's caches hold (``max_adapters`` mirrors
  ``max_cpu_loras``; an eviction only forgets);
- the engine checks its host cache when a request arrives and sends the weights only if the id
  is not there; when the cache dropped it meanwhile, the request fails with the C++ PEFT cache's
  ``LoRA task <id> not found in cache. Please send LoRA weights with request`` (400): that
  answer means reload (stage again) and resend.
- ``/v1/models`` lists the base only; ``/metrics`` is JSON iteration stats gathered over a 2 s
  wait, not Prometheus: it is not polled (placement uses its own in-flight counts).

Inference answers: 5xx are retried elsewhere; a 400 for an adapter request whose message is the
cache miss or ``Failed to load LoRA adapter`` (trtllm-serve answers every failure as
``BadRequestError``: the message is all there is) means stage again and resend; any other 4xx
is the client's answer.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from router.capabilities import CAPABILITIES
from router.drivers.base import AnswerKind, LoadResult, MetricsSample, ModelsInfo, UnloadResult
from router.drivers.http_base import DriverError, HttpDriver, error_fields, parse_model_list

_RESEND = ("not found in cache. Please send LoRA weights", "Failed to load LoRA adapter")


class TrtllmDriver(HttpDriver):
    name = "trtllm"
    capabilities = CAPABILITIES["trtllm"]
    metrics_path = None

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api_key: str | None = None,
        *,
        replica_dir: str,
        timeout: aiohttp.ClientTimeout | None = None,
        stream_timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        super().__init__(session, api_key, timeout=timeout, stream_timeout=stream_timeout)
        self._replica_dir = replica_dir.rstrip("/")

    def lora_path(self, lora_name: str) -> str:
        """Where the replica reads ``lora_name``'s staged files."""
        return f"{self._replica_dir}/{lora_name}"

    def request_fields(self, lora_name: str | None, int_id: int, served_model: str) -> dict[str, Any]:
        if lora_name is None:
            return {"model": served_model}
        lora = {"lora_name": lora_name, "lora_int_id": int_id, "lora_path": self.lora_path(lora_name)}
        return {"model": served_model, "lora_request": lora}

    def classify_answer(self, status: int, body: bytes, *, adapter: bool) -> AnswerKind:
        if status >= 500:
            return "retry"
        if status == 400 and adapter and any(p in error_fields(body)[1] for p in _RESEND):
            return "adapter_missing"
        return "ok"

    async def list_adapters(self, url: str, timeout: float) -> ModelsInfo:
        status, body = await self._get(f"{url}/v1/models", timeout, auth=True)
        if status != 200:
            raise DriverError(f"GET {url}/v1/models: HTTP {status}")
        return ModelsInfo(base_names=tuple(c["id"] for c in parse_model_list(body, url)))

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
        if int_id <= 0:
            return LoadResult(
                False, "rejected", None, f"{lora_name} has no integer id (lora_int_id): not servable here"
            )
        return LoadResult(ok=True)

    async def unload(self, url: str, lora_name: str, timeout: float) -> UnloadResult:
        return UnloadResult(True)
