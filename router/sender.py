"""Sender: one inference request to the chosen replica, through the pool's engine driver.

Counts the request in flight on the replica and the adapter (placement reads both) until the
answer or the stream ends, rewrites ``model`` to the client's string, checks the replica
answered for the adapter asked (else an ``adapter.wrong_adapter`` audit event and an error),
and hands streams to ``StreamRelay``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from router.audit import RouterAudit
from router.contract import ForwardRequest, ForwardResult
from router.drivers import Retryable
from router.forwarding import StreamRelay, WrongAdapter, make_rewriter, parse_usage, read_body
from router.metrics import RouterMetrics
from router.store import ReplicaState

log = logging.getLogger("loraplane.router")


class ReplicaHealth(Protocol):
    """Passive outlier detection (``ReplicaStore``): the outcome of each request."""

    def note_success(self, rep: ReplicaState) -> None: ...

    def note_failure(self, rep: ReplicaState, error: str, model: str | None = None) -> None: ...


class Sender:
    def __init__(
        self,
        audit: RouterAudit,
        metrics: RouterMetrics,
        health: ReplicaHealth,
        *,
        ttfb_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._audit = audit
        self._metrics = metrics
        self._health = health
        self._ttfb_s = ttfb_s
        self._clock = clock

    async def send(
        self,
        rep: ReplicaState,
        req: ForwardRequest,
        cold: bool,
        queue_s: float,
        on_end: Callable[[], None],
    ) -> ForwardResult:
        """Send ``req`` to ``rep``; ``on_end`` runs once when the answer or stream is over (or
        failed). Raises ``Retryable`` / ``WrongAdapter`` / ``UpstreamTimeout`` before the first byte."""
        version = req.version
        driver = rep.driver
        fields = driver.request_fields(
            version.lora_name if version else None, version.int_id if version else 0, rep.pool.served_name
        )
        model = fields["model"]
        body = dict(req.body)
        body.update(fields)
        if req.stream and req.want_usage:
            opts = body.get("stream_options")
            body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        name = version.lora_name if version is not None else None
        rep.start(name, self._clock())
        ended = False

        def end() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            rep.finish(name, self._clock())
            on_end()

        task = asyncio.current_task()
        assert task is not None
        rep.pending.add(task)  # aborted (→ Retryable) if the replica leaves rotation meanwhile
        try:
            if req.stream:
                async with asyncio.timeout(self._ttfb_s):
                    result = await self._exchange(rep, req, model, body, cold, queue_s, end)
            else:
                result = await self._exchange(rep, req, model, body, cold, queue_s, end)
        except Retryable as exc:
            # an answer (5xx) is about this model; no answer is about the replica; "adapter
            # missing" is about our records (a restart, a stale listing), not the replica's health
            if not exc.adapter_missing:
                self._health.note_failure(rep, exc.message, model if exc.answered else None)
            raise
        except TimeoutError:  # the stream's first event did not come in time
            self._health.note_failure(rep, "first-byte timeout")
            raise Retryable(f"replica sent nothing within {self._ttfb_s:.0f}s", timeout=True) from None
        except asyncio.CancelledError:
            if task not in rep.aborted:
                raise
            rep.aborted.discard(task)
            task.uncancel()
            raise Retryable("replica left rotation while the request waited for it") from None
        finally:
            rep.pending.discard(task)
            rep.aborted.discard(task)
        self._health.note_success(rep)
        return result

    async def _exchange(
        self,
        rep: ReplicaState,
        req: ForwardRequest,
        model: str,
        body: dict[str, Any],
        cold: bool,
        queue_s: float,
        end: Callable[[], None],
    ) -> ForwardResult:
        """The request and its answer up to the first byte for the client (the stream after that)."""
        driver = rep.driver
        version = req.version
        try:
            resp = await driver.send(
                rep.url, req.endpoint, orjson.dumps(body), req.request_id, stream=req.stream
            )
        except BaseException:
            end()
            raise
        try:
            status = resp.status
            error_body: bytes | None = None
            if status != 200:  # an error's few bytes: what it means is the driver's to say
                error_body = await read_body(resp)
                resp.release()
                kind = driver.classify_answer(status, error_body, adapter=version is not None)
                if kind == "adapter_missing":
                    raise Retryable(f"replica does not know {model}", adapter_missing=True, answered=True)
                if kind != "ok":
                    raise Retryable(f"replica answered HTTP {status}: {error_body[:200]!r}", answered=True)
            rewriter = make_rewriter(model, req.client_model)
            out_headers = {"content-type": resp.headers.get("Content-Type", "application/json")}
            result = ForwardResult(
                status=status, headers=out_headers, replica=rep.url, cold_load=cold, queue_s=queue_s
            )

            async def on_wrong(got: bytes) -> None:
                await self._wrong_adapter(rep, req, model, got)

            if req.stream and status == 200:
                relay = StreamRelay(
                    resp,
                    rewriter,
                    result,
                    client_wants_usage=req.client_wants_usage,
                    on_wrong=on_wrong,
                    on_end=end,
                )
                try:
                    first = await relay.first()
                except BaseException:
                    resp.close()
                    raise
                result.stream = relay.iterate(first)
                return result
            if error_body is not None:
                data = error_body
            else:
                data = await read_body(resp)
                resp.release()
            if status == 200:
                data, wrong = rewriter.rewrite(data)
                if wrong is not None:
                    await on_wrong(wrong)
                    raise WrongAdapter(f"replica answered for model {wrong.decode(errors='replace')!r}")
                result.usage = parse_usage(data)
            result.body = data
            end()
            return result
        except BaseException:
            end()
            if not resp.closed:
                resp.close()
            raise

    async def _wrong_adapter(self, rep: ReplicaState, req: ForwardRequest, asked: str, got: bytes) -> None:
        self._metrics.wrong_adapter.labels(replica=rep.url).inc()
        got_s = got.decode(errors="replace")[:200]
        log.error(
            "replica answered with the wrong adapter",
            extra={"replica": rep.url, "asked": asked, "answered": got_s, "request_id": req.request_id},
        )
        version = req.version
        await self._audit.event(
            "adapter.wrong_adapter",
            version.adapter_id if version else req.base_model,
            {
                "version": version.version if version else None,
                "replica": rep.url,
                "asked": asked,
                "answered": got_s,
                "request_id": req.request_id,
            },
        )
