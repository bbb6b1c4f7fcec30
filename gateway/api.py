"""The OpenAI-compatible public API as a lean ASGI app (SPEC §6, §7, §13).

A completion request reads top to bottom in :meth:`GatewayApp.completion`:
auth → parse → resolve model → admit (rate limits) → ``router.forward`` → answer (JSON, or SSE
passed through chunk by chunk) → settle limits, metrics, one JSON log line.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /healthz``, ``GET /readyz`` (reason codes only: ``gateway.readiness``), ``GET /openapi.json``
(``gateway.openapi``). ``/metrics`` and the detailed ``/readyz`` are on the internal port
(``gateway.internal``); with ``local=True`` (``loraplane up``, loopback) this app serves them too.
Every answer carries ``x-request-id``
(the client's, echoed, when it is sane); adapter answers carry ``x-loraplane-adapter-version``;
the completion endpoints carry the ``x-ratelimit-*`` headers for an authenticated tenant.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.asgi import Receive, Scope, Send, header_map, read_body, send_bytes, stream_out
from gateway.coalesce import DISCONNECT_HOOK, GONE
from gateway.errors import GatewayError, error_body
from gateway.internal import InternalApp
from gateway.openapi import OPENAPI_JSON
from gateway.parse import Endpoint, estimate_tokens, parse_request
from gateway.ratelimit import (
    AdmitResult,
    Lease,
    LimiterUnavailable,
    make_plan,
    rate_limit_headers,
    rejection_message,
    retry_after,
)
from gateway.readiness import public_body, readiness
from gateway.resolve import Resolution, resolve
from gateway.service import Gateway
from kit.ids import new_id
from kit.logs import log_record
from registry.snapshot import RoutingSnapshot, TenantInfo
from router.contract import ForwardRequest, ForwardResult, RouterError

log = logging.getLogger("loraplane.gateway.access")

_COMPLETIONS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
}
_SSE = b"text/event-stream; charset=utf-8"
_SSE_END = b"data: [DONE]\n\n"  # a stream's last event (after an error event too)
_NO_HOOK = object()  # the ASGI server has no disconnect hook in its scopes


def _request_id(headers: dict[bytes, bytes]) -> bytes:
    rid = headers.get(b"x-request-id")
    if rid and len(rid) <= 200 and all(0x21 <= c <= 0x7E for c in rid):
        return rid
    return new_id().encode()


@dataclass(slots=True)
class _Ctx:
    """What the request's log line and metrics need, filled in as the request goes."""

    request_id: bytes
    endpoint: str
    t0: float
    tenant: str = ""
    model: str = ""
    adapter: str = ""
    version: str = ""
    replica: str = ""
    status: int = 0
    error: str = ""
    stream: bool = False
    cold_load: bool = False
    queue_s: float = 0.0
    ttft_s: float | None = None
    chunks: int = 0
    t_first: float = 0.0
    t_last: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    canary: bool = False  # the adapter had a canary: the outcome feeds canary analysis (SPEC §16)
    # what answered (SPEC §15): ``version`` unless a load-failure fallback served another one or
    # the base model (``base``); "" while nothing answered. ``fallback``: that fallback's kind.
    served_version: str = ""
    fallback: str = ""
    answer: bytes | None = None  # the non-streamed body, kept only while ``canary`` (format checks)


class GatewayApp:
    """ASGI callable. ``manage_lifecycle`` starts/stops the gateway on ASGI lifespan events;
    ``local`` also answers the internal port's routes (``/metrics``, the detailed ``/readyz``)."""

    def __init__(self, gateway: Gateway, *, manage_lifecycle: bool = True, local: bool = False) -> None:
        self.gw = gateway
        self.manage_lifecycle = manage_lifecycle
        self.internal = InternalApp(gateway) if local else None
        self._get_routes = ("/v1/models", "/healthz", "/readyz", "/openapi.json") + (
            ("/metrics",) if local else ()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    if self.manage_lifecycle:
                        await self.gw.start()
                except Exception as e:  # reported to the server, which exits
                    await send({"type": "lifespan.startup.failed", "message": f"{type(e).__name__}: {e}"})
                    return
                from gateway.serving import settle_heap

                settle_heap()  # a serving process from here on: GC tuned for it
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self.manage_lifecycle:
                    await self.gw.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        headers = header_map(scope)
        endpoint = _COMPLETIONS.get(path)
        if endpoint is not None:
            if method != "POST":
                return await self._plain_error(
                    send, headers, GatewayError(405, "method_not_allowed", "use POST")
                )
            gw = self.gw
            if gw.draining:  # SIGTERM: nothing new is admitted; requests in flight finish
                return await self._plain_error(
                    send,
                    headers,
                    GatewayError(503, "draining", "This gateway is shutting down; retry.", retry_after=1),
                )
            gw.active += 1
            try:
                return await self.completion(endpoint, scope, receive, send, headers)
            finally:
                gw.active -= 1
        if method not in ("GET", "HEAD"):
            if path in self._get_routes:
                return await self._plain_error(
                    send, headers, GatewayError(405, "method_not_allowed", "use GET")
                )
            return await self._plain_error(send, headers, GatewayError(404, "not_found", f"no route {path}"))
        if path == "/v1/models":
            return await self.models(send, headers)
        if path == "/healthz":
            return await send_bytes(send, 200, b'{"status":"ok"}', [(b"x-request-id", _request_id(headers))])
        if self.internal is not None and path in ("/readyz", "/metrics"):
            return await self.internal.route(path, send, [(b"x-request-id", _request_id(headers))])
        if path == "/readyz":
            return await self.readyz(send, headers)
        if path == "/openapi.json":
            return await send_bytes(send, 200, OPENAPI_JSON, [(b"x-request-id", _request_id(headers))])
        return await self._plain_error(send, headers, GatewayError(404, "not_found", f"no route {path}"))

    async def _plain_error(self, send: Send, headers: dict[bytes, bytes], err: GatewayError) -> None:
        out = [(b"x-request-id", _request_id(headers))]
        if err.retry_after is not None:
            out.append((b"retry-after", str(err.retry_after).encode()))
        await send_bytes(send, err.status, err.body(), out)

    # ------------------------------------------------------------------ completions

    async def completion(
        self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]
    ) -> None:
        gw = self.gw
        ctx = _Ctx(_request_id(headers), endpoint, time.perf_counter())
        tenant: TenantInfo | None = None
        lease: Lease | None = None
        try:
            raw = await read_body(receive, headers, gw.settings.max_body_bytes)
            snap = self._snapshot()
            auth = headers.get(b"authorization")
            tenant = gw.auth.authenticate(snap, auth.decode("latin-1") if auth else None)
            ctx.tenant = tenant.id
            try:
                req = parse_request(raw, endpoint)
                ctx.model, ctx.stream = req.model, req.stream
                res = resolve(snap, tenant, req.model, user=req.user, rand=gw.rand)
            except GatewayError:
                await self._peek_headers(ctx, tenant)
                raise
            if res.version is not None:
                ctx.adapter, ctx.version = res.version.adapter_id, res.version.version
                ctx.canary = res.adapter is not None and res.adapter.canary_version is not None
            est = estimate_tokens(
                req,
                default_max_tokens=gw.settings.default_max_tokens,
                chars_per_token=gw.settings.chars_per_token,
            )
            lease = await self._admit(ctx, snap, tenant, res, est)
            fwd = ForwardRequest(
                request_id=ctx.request_id.decode(),
                tenant_id=tenant.id,
                base_model=res.base_model,
                version=res.version,
                endpoint=endpoint,
                body=req.body,
                client_model=req.model,
                stream=req.stream,
                client_wants_usage=req.include_usage,
                want_usage=True,
                pinned=res.pinned,
            )
            result = await self._forward(fwd, res, tenant, scope, receive)
        except GatewayError as e:
            if lease is not None:
                await self._settle(lease, 0)
            return await self._error(send, ctx, e)
        except BaseException:
            if lease is not None:
                await asyncio.shield(self._settle(lease, 0))
            raise
        ctx.replica, ctx.cold_load, ctx.queue_s = result.replica, result.cold_load, result.queue_s
        out_headers = [(b"x-request-id", ctx.request_id), *ctx.headers]
        if result.fallback is not None and result.served_version is not None:  # SPEC §15
            ctx.fallback, ctx.served_version = result.fallback, result.served_version
            out_headers.append((b"x-loraplane-fallback", result.fallback.encode()))
            out_headers.append((b"x-loraplane-adapter-version", result.served_version.encode()))
        else:
            ctx.served_version = ctx.version
            if res.version is not None:
                out_headers.append((b"x-loraplane-adapter-version", res.version.version.encode()))
        if result.status >= 400:
            return await self._upstream_error(send, ctx, result, lease, out_headers)
        if result.stream is not None and req.stream:
            return await self._stream(receive, send, ctx, result, lease, out_headers)
        body = result.body or b""
        ctx.status = result.status
        if ctx.canary:
            ctx.answer = body
        self._usage(ctx, result)
        # Settled before the answer leaves: a client's next request, at any gateway, finds its slot free.
        await self._settle(lease, self._total(ctx))
        try:
            await send_bytes(send, result.status, body, out_headers, _content_type(result))
        finally:
            self._finish(ctx)

    def _snapshot(self) -> RoutingSnapshot:
        snap = self.gw.table.snapshot
        if snap is None:
            raise GatewayError(503, "not_ready", "The routing table is not loaded yet.", retry_after=1)
        return snap

    async def _peek_headers(self, ctx: _Ctx, tenant: TenantInfo) -> None:
        """Rate-limit headers for an answer that was not admitted (nothing consumed)."""
        lim = tenant.limits
        if lim.rpm is None and lim.tpm is None:
            return
        plan = make_plan(
            tenant_id=tenant.id, rpm=lim.rpm, tpm=lim.tpm, max_concurrency=None, estimated_tokens=0
        )
        try:
            ctx.headers = rate_limit_headers(await self.gw.limiter.peek(plan))
        except LimiterUnavailable:
            self.gw.limiter_failed(True)

    async def _admit(
        self, ctx: _Ctx, snap: RoutingSnapshot, tenant: TenantInfo, res: Resolution, est: int
    ) -> Lease | None:
        """Every level's limits (tenant, grant, adapter, owner) in one atomic admission."""
        gw = self.gw
        lim = tenant.limits
        grant = res.grant
        adapter = res.adapter
        owner = adapter.owner if adapter is not None else None
        plan = make_plan(
            tenant_id=tenant.id, rpm=lim.rpm, tpm=lim.tpm, max_concurrency=lim.max_concurrency,
            estimated_tokens=est, adapter_id=adapter.id if adapter else None,
            grant_rpm=grant.rpm if grant else None, grant_tpm=grant.tpm if grant else None,
            adapter_limits=adapter.limits if adapter else None,
            owner=owner, owner_limits=snap.owners.get(owner) if owner is not None else None,
        )  # fmt: skip
        if not plan.buckets and not plan.slots:
            return None
        try:
            adm: AdmitResult = await gw.limiter.admit(plan)
        except LimiterUnavailable:
            gw.limiter_failed(True)
            gw.metrics.limiter_errors.labels(gw.settings.ratelimit_on_error).inc()
            if gw.settings.ratelimit_on_error == "open":
                return None
            raise GatewayError(
                503, "rate_limiter_unavailable",
                "The rate-limit store is unreachable and the gateway is configured to fail closed "
                "(LORAPLANE_RATELIMIT_ON_ERROR=closed).", retry_after=1,
            ) from None  # fmt: skip
        if gw.limiter_down:
            gw.limiter_failed(False)
        ctx.headers = rate_limit_headers(adm.states)
        if not adm.admitted:
            gw.metrics.ratelimited.labels(
                gw.metrics.tenant(tenant.id), adm.rejected_kind or "", adm.rejected_scope or ""
            ).inc()
            raise GatewayError(
                429,
                "rate_limit_exceeded",
                rejection_message(adm),
                retry_after=retry_after(adm),
                details=adm.details(),
            )
        return adm.lease

    async def _forward(
        self, fwd: ForwardRequest, res: Resolution, tenant: TenantInfo, scope: Scope, receive: Receive
    ) -> ForwardResult:
        gw = self.gw
        # asyncio.timeout(request_timeout_s) without its context-manager object: one loop timer
        # that cancels this task, and that one cancellation turned into the 504.
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        expired: list[bool] = []
        loop = asyncio.get_running_loop()
        timer = loop.call_later(gw.settings.request_timeout_s, _expire, task, expired)
        # A client that goes away before the answer starts (cold or warm, streamed or not) cancels
        # the router's work at once: the replica sees the connection close and stops generating,
        # a cold-waiter place (SPEC §15) and the concurrency slot are freed, the log says 499.
        # Our uvicorn protocol calls a hook in the scope (no task per request); under another
        # ASGI server a task waits for ``http.disconnect``.
        gone: list[bool] = []
        watcher: asyncio.Task[None] | None = None
        hook = scope.get(DISCONNECT_HOOK, _NO_HOOK)
        if hook is None:
            scope[DISCONNECT_HOOK] = functools.partial(_disconnected, task, gone)
        elif hook is _NO_HOOK:
            watcher = loop.create_task(_cancel_on_disconnect(receive, task, gone))
        else:  # GONE: the connection dropped while the request was being admitted
            timer.cancel()
            raise GatewayError(499, "client_disconnected", "The client went away.")
        try:
            with gw.cold.enter(res.version, tenant):
                result = await gw.router.forward(fwd)
        except RouterError as e:
            raise GatewayError(e.status, e.code, e.message, retry_after=e.retry_after) from None
        except TimeoutError:
            raise GatewayError(504, "upstream_timeout", "The replica did not answer in time.") from None
        except asyncio.CancelledError:
            if expired and task.uncancel() <= cancelling:
                raise GatewayError(504, "upstream_timeout", "The replica did not answer in time.") from None
            if gone and task.uncancel() <= cancelling:
                raise GatewayError(499, "client_disconnected", "The client went away.") from None
            raise
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
            elif scope[DISCONNECT_HOOK] is not GONE:
                scope[DISCONNECT_HOOK] = None
        if result.cold_load and res.version is not None:
            gw.metrics.cold_wait.labels(res.version.adapter_id, res.version.version).observe(result.queue_s)
        return result

    async def _settle(self, lease: Lease | None, actual_tokens: int | None) -> None:
        if lease is None:
            return
        try:
            await self.gw.limiter.settle(lease, actual_tokens)
        except LimiterUnavailable:
            self.gw.limiter_failed(True)
        except Exception:  # settlement must never break an answer
            log.exception("rate-limit settlement failed")

    @staticmethod
    def _usage(ctx: _Ctx, result: ForwardResult) -> None:
        if result.usage is not None:
            ctx.prompt_tokens = result.usage.prompt_tokens
            ctx.completion_tokens = result.usage.completion_tokens

    @staticmethod
    def _total(ctx: _Ctx) -> int | None:
        if ctx.prompt_tokens is None:
            return None
        return ctx.prompt_tokens + (ctx.completion_tokens or 0)

    async def _stream(
        self, receive: Receive, send: Send, ctx: _Ctx, result: ForwardResult, lease: Lease | None,
        headers: list[tuple[bytes, bytes]],
    ) -> None:  # fmt: skip
        assert result.stream is not None
        ctx.status = result.status
        headers = [(b"content-type", _SSE), (b"cache-control", b"no-cache"), *headers]

        def on_chunk() -> None:
            now = time.perf_counter()
            if ctx.chunks == 0:
                ctx.t_first = now
                ctx.ttft_s = now - ctx.t0
            ctx.t_last = now
            ctx.chunks += 1

        async def before_end() -> None:
            # Like a whole answer: settled before the client can see the stream's end (its usage
            # is known by then), so the client's next request finds its slot free.
            self._usage(ctx, result)
            await self._settle(lease, self._total(ctx))

        async def finalize(disconnected: bool) -> None:
            aclose = getattr(result.stream, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # closing a broken upstream is best effort
                    log.debug("closing the upstream stream failed", exc_info=True)
            if disconnected:
                ctx.error = "client_disconnected"
                ctx.status = 499
            elif result.stream_error is not None:  # ended with an error event, not the replica's [DONE]
                ctx.error = result.stream_error
                ctx.status = 504 if result.stream_error == "upstream_timeout" else 502
            self._usage(ctx, result)
            # a no-op when before_end has settled (settling is idempotent); else the stream ended,
            # or the client left, before the last event
            await self._settle(lease, self._total(ctx))
            self._finish(ctx)

        await stream_out(
            receive, send, result.status, headers, result.stream, on_chunk, finalize,
            end_marker=_SSE_END, before_end=before_end,
        )  # fmt: skip

    async def _upstream_error(
        self, send: Send, ctx: _Ctx, result: ForwardResult, lease: Lease | None,
        headers: list[tuple[bytes, bytes]],
    ) -> None:  # fmt: skip
        """A replica's own error answer, in our error shape (400 stays 400; others become 502)."""
        body = result.body or b""
        if result.stream is not None:
            parts: list[bytes] = []
            try:
                async for chunk in result.stream:
                    parts.append(chunk)
                    if sum(map(len, parts)) > 65536:
                        break
            finally:
                aclose = getattr(result.stream, "aclose", None)
                if aclose is not None:
                    await aclose()
            body = b"".join(parts)
        message = "the replica refused the request"
        try:
            data = orjson.loads(body)
            err = data.get("error", data) if isinstance(data, dict) else None
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                message = err["message"]
            elif isinstance(data, dict) and isinstance(data.get("detail"), str):
                message = data["detail"]
        except orjson.JSONDecodeError:
            pass
        await self._settle(lease, 0)
        if result.status in (400, 413, 422):
            status, code = 400, "invalid_request"
        else:
            status, code = 502, "upstream_error"
            message = f"replica error {result.status}: {message}"
        ctx.status, ctx.error = status, code
        try:
            await send_bytes(send, status, error_body(status, code, message), headers)
        finally:
            self._finish(ctx)

    async def _error(self, send: Send, ctx: _Ctx, err: GatewayError) -> None:
        ctx.status, ctx.error = err.status, err.code
        headers = [(b"x-request-id", ctx.request_id), *ctx.headers]
        if err.retry_after is not None:
            headers.append((b"retry-after", str(err.retry_after).encode()))
        try:
            await send_bytes(send, err.status, err.body(), headers)
        finally:
            self._finish(ctx)

    def _finish(self, ctx: _Ctx) -> None:
        """Metrics and the one structured log line of this request."""
        m = self.gw.metrics
        now = time.perf_counter()
        latency = now - ctx.t0
        tenant = m.tenant(ctx.tenant)
        m.count(tenant, ctx.adapter, ctx.version, ctx.endpoint, ctx.status, ctx.error, ctx.served_version)
        if not ctx.error and ctx.status < 400:
            s = m.series(tenant, ctx.adapter, ctx.version)
            s.latency.observe(latency)
            s.queue.observe(ctx.queue_s)
            if ctx.ttft_s is not None:
                s.ttft.observe(ctx.ttft_s)
                if ctx.chunks > 2:
                    s.itl.observe((ctx.t_last - ctx.t_first) / (ctx.chunks - 1))
            if ctx.prompt_tokens is not None:
                s.prompt_tokens.inc(ctx.prompt_tokens)
                s.completion_tokens.inc(ctx.completion_tokens or 0)
        if ctx.canary:  # batched, never a round trip here (gateway.canary)
            # a wait for a cold load is no property of the version: no TTFT sample then
            first_byte = None if ctx.cold_load else ctx.ttft_s if ctx.ttft_s is not None else latency
            self.gw.canary.record(
                ctx.adapter,
                ctx.version,
                ctx.status,
                first_byte,
                other_version=bool(ctx.fallback),
                answer=ctx.answer,
            )
        if log.isEnabledFor(logging.INFO):
            log_record(
                log,
                logging.INFO,
                "request",
                {
                    "request_id": ctx.request_id.decode(),
                    "endpoint": ctx.endpoint,
                    "tenant": ctx.tenant or None,
                    "model": ctx.model or None,
                    "adapter": ctx.adapter or None,
                    "version": ctx.version or None,
                    "served_version": ctx.served_version or None,
                    "fallback": ctx.fallback or None,
                    "replica": ctx.replica or None,
                    "status": ctx.status,
                    "error": ctx.error or None,
                    "stream": ctx.stream,
                    "latency_ms": round(latency * 1000, 3),
                    "ttft_ms": round(ctx.ttft_s * 1000, 3) if ctx.ttft_s is not None else None,
                    "queue_ms": round(ctx.queue_s * 1000, 3),
                    "prompt_tokens": ctx.prompt_tokens,
                    "completion_tokens": ctx.completion_tokens,
                    "cold_load": ctx.cold_load,
                },
            )

    # ------------------------------------------------------------------ other routes

    async def models(self, send: Send, headers: dict[bytes, bytes]) -> None:
        rid = _request_id(headers)
        try:
            snap = self._snapshot()
            auth = headers.get(b"authorization")
            tenant = self.gw.auth.authenticate(snap, auth.decode("latin-1") if auth else None)
        except GatewayError as e:
            return await send_bytes(send, e.status, e.body(), [(b"x-request-id", rid)])
        await send_bytes(send, 200, orjson.dumps(list_models(snap, tenant)), [(b"x-request-id", rid)])

    async def readyz(self, send: Send, headers: dict[bytes, bytes]) -> None:
        """SPEC §17/§19: ready unless this gateway cannot serve at all; reason codes only (the
        messages, the routing table's last error and the backend are on the internal port)."""
        r = await readiness(self.gw)
        await send_bytes(
            send, r.status, orjson.dumps(public_body(r)), [(b"x-request-id", _request_id(headers))]
        )


def list_models(snap: RoutingSnapshot, tenant: TenantInfo) -> dict[str, Any]:
    """OpenAI's model list: granted, enabled adapters with an active version; bases with access."""
    data: list[dict[str, Any]] = []
    if tenant.base_model_access:
        for name in sorted(snap.base_models):
            data.append({"id": name, "object": "model", "created": 0, "owned_by": "loraplane"})
    for adapter_id in sorted(tenant.grants):
        a = snap.adapters.get(adapter_id)
        if (
            a is None
            or a.status != "active"
            or a.active_version is None
            or a.active_version not in a.versions
        ):
            continue
        data.append(
            {
                "id": f"{a.base_model}:{a.id}",
                "object": "model",
                "created": 0,
                "owned_by": "loraplane",
                "root": a.base_model,
                "parent": a.base_model,
            }
        )
    return {"object": "list", "data": data}


def _expire(task: asyncio.Task[Any], expired: list[bool]) -> None:
    expired.append(True)
    task.cancel()


def _disconnected(task: asyncio.Task[Any], gone: list[bool]) -> None:
    """The server's disconnect hook (``gateway.coalesce.DISCONNECT_HOOK``) while a request waits."""
    gone.append(True)
    task.cancel()


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any], gone: list[bool]) -> None:
    """Cancel ``task`` when the client disconnects (the request body was read already)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a broken receive channel: stop watching, the request goes on
        log.debug("watching for a disconnect failed", exc_info=True)
        return
    gone.append(True)
    task.cancel()


def _content_type(result: ForwardResult) -> bytes:
    for k, v in result.headers.items():
        if k.lower() == "content-type":
            return v.encode()
    return b"application/json"


def create_gateway_app(gateway: Gateway, *, manage_lifecycle: bool = True, local: bool = False) -> GatewayApp:
    """The public ASGI app serving ``gateway`` (lifespan events start/stop it when
    ``manage_lifecycle``). ``local``: also ``/metrics`` and the detailed ``/readyz`` on this port
    (``loraplane up`` on loopback, SPEC §19); production serves them on the internal port
    (:func:`gateway.internal.create_internal_app`)."""
    return GatewayApp(gateway, manage_lifecycle=manage_lifecycle, local=local)
