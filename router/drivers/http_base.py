"""What every engine driver shares: the inference path (``send``), plain GETs and POSTs of the
control endpoints, and the classification of a control call that got no answer.

A control call (a load) that got no answer is classified by what the connection did:

| what happened | failure |
|---|---|
| our timeout | ``timeout`` |
| no connection at all (refused, unreachable) | ``replica_down`` |
| the connection was reset or closed mid-call, and a health probe fails too | ``replica_down`` |
| the connection was reset or closed mid-call, and the replica answers its health probe | ``other`` |

A reset during a load says little by itself — a proxy or load balancer that drops a long
request, a keep-alive connection the replica had closed — and ``replica_down`` takes the
replica out of rotation and cancels every request there still waiting for its first byte, so
the replica is asked (its health endpoint, one short probe) before it is called down.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from router.contract import UpstreamTimeout
from router.drivers.base import LoadResult, Retryable, UpstreamResponse
from router.drivers.http1 import ConnectError, Disconnected, Http1Client

PROBE_S = 2.0  # bound of the health probe that decides a reset load's class


class DriverError(Exception):
    """A replica could not be reached or answered nonsense (translated aiohttp errors)."""


class HttpDriver:
    """Shared plumbing of the HTTP engine drivers (a shared aiohttp session for control calls,
    the lean HTTP/1.1 client for inference requests to plain-http replicas)."""

    health_path = "/health"
    metrics_path: str | None = "/metrics"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api_key: str | None = None,
        *,
        timeout: aiohttp.ClientTimeout | None = None,
        stream_timeout: aiohttp.ClientTimeout | None = None,
    ) -> None:
        self._session = session
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout or aiohttp.ClientTimeout(total=300.0, connect=2.0)
        self._stream_timeout = stream_timeout or aiohttp.ClientTimeout(
            total=None, connect=2.0, sock_read=30.0
        )
        self._json = {"Content-Type": "application/json", **self._auth}
        # Inference requests to plain-http replicas go through the lean client (same timeouts
        # and connection cap as the session); anything else through aiohttp.
        limit = session.connector.limit_per_host if session.connector is not None else 0
        self._http1 = Http1Client(
            connect_s=self._timeout.connect or self._stream_timeout.connect or 2.0,
            max_per_host=limit,
            headers=self._auth,
        )

    async def aclose(self) -> None:
        await self._http1.aclose()

    def auth_headers(self) -> dict[str, str]:
        return self._auth

    # ------------------------------------------------------------------ inference

    async def send(
        self, url: str, endpoint: str, body: bytes, request_id: str, *, stream: bool
    ) -> UpstreamResponse:
        if Http1Client.handles(url):
            return await self._send_http1(url, endpoint, body, request_id, stream=stream)
        headers = {**self._json, "X-Request-Id": request_id}
        try:
            return await self._session.post(
                f"{url}/v1/{endpoint}",
                data=body,
                headers=headers,
                timeout=self._stream_timeout if stream else self._timeout,
            )
        except aiohttp.ClientConnectorError as exc:
            raise Retryable(f"cannot connect to replica: {exc}", replica_down=True) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # Often a pooled keep-alive connection the replica had closed: retry, keep it in rotation.
            raise Retryable(f"replica closed the connection: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise Retryable(f"replica request failed: {exc}") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout("replica did not answer in time") from exc

    async def _send_http1(
        self, url: str, endpoint: str, body: bytes, request_id: str, *, stream: bool
    ) -> UpstreamResponse:
        path = f"/v1/{endpoint}"
        try:
            if stream:
                idle = self._stream_timeout.sock_read
                return await self._http1.post(url, path, body, request_id, read_s=idle)
            return await self._http1.post(url, path, body, request_id, total_s=self._timeout.total)
        except ConnectError as exc:
            raise Retryable(f"cannot connect to replica: {exc}", replica_down=True) from exc
        except Disconnected as exc:
            # Often a pooled keep-alive connection the replica had closed: retry, keep it in rotation.
            raise Retryable(f"replica closed the connection: {exc}") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout("replica did not answer in time") from exc
        except OSError as exc:
            raise Retryable(f"replica request failed: {exc}") from exc

    # ------------------------------------------------------------------ control calls

    async def _get(self, url: str, timeout: float, auth: bool) -> tuple[int, bytes]:
        try:
            async with self._session.get(
                url, headers=self._auth if auth else None, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DriverError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    async def _post(self, url: str, payload: dict[str, Any], timeout: float) -> tuple[int, bytes]:
        """POST ``payload`` as JSON; raises aiohttp's errors, ``OSError`` or ``TimeoutError``."""
        async with self._session.post(
            url,
            data=orjson.dumps(payload),
            headers={**self._auth, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            return resp.status, await resp.read()

    async def health(self, url: str, timeout: float) -> bool:
        status, _ = await self._get(f"{url}{self.health_path}", timeout, auth=False)
        return status == 200

    async def metrics_text(self, url: str, timeout: float) -> str:
        if self.metrics_path is None:
            return ""
        status, body = await self._get(f"{url}{self.metrics_path}", timeout, auth=False)
        if status != 200:
            raise DriverError(f"GET {url}{self.metrics_path}: HTTP {status}")
        return body.decode("utf-8", "replace")

    async def unanswered_load(self, url: str, exc: BaseException, timeout: float) -> LoadResult:
        """The failure of a load call that got no answer (``exc``), per the module's table."""
        if isinstance(exc, TimeoutError):
            return LoadResult(False, "timeout", None, f"load timed out after {timeout:.1f}s")
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, aiohttp.ClientConnectorError):
            return LoadResult(False, "replica_down", None, message)
        try:
            alive = await self.health(url, PROBE_S)
        except DriverError:
            alive = False
        if not alive:
            return LoadResult(False, "replica_down", None, f"{message} (and its health check fails)")
        return LoadResult(False, "other", None, f"{message} (the replica is up: another may load it)")


def error_fields(body: bytes) -> tuple[str, str]:
    """(type, message) of an OpenAI-style error body — nested ``{"error": {…}}`` or flat
    ``{"object": "error", …}`` — or FastAPI's ``{"detail": …}`` (type ``"detail"``); ("", text)
    when it is none of those."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", body.decode("utf-8", "replace")[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("type") or ""), str(err.get("message") or "")
        if "detail" in data:
            return "detail", str(data.get("detail"))
        if data.get("object") == "error":
            return str(data.get("type") or ""), str(data.get("message") or "")
    return "", body.decode("utf-8", "replace")[:500]


def parse_model_list(body: bytes, url: str) -> list[dict[str, Any]]:
    """The model cards of a ``/v1/models`` answer (DriverError when it is not a model list)."""
    try:
        cards = orjson.loads(body)["data"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise DriverError(f"GET {url}/v1/models: not a model list") from exc
    if not isinstance(cards, list):
        raise DriverError(f"GET {url}/v1/models: not a model list")
    return [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
