"""Replica directories (``registry.replicas.ReplicaDirectory``) for the admin API.

- ``LocalReplicaDirectory(router)``: in-process (``loraplane up``): reads the router's state and
  prewarms through it directly.
- ``RedisReplicaDirectory(redis, prefix)``: for ``loraplane serve --role registry`` in its own
  process. Gateway processes publish their replica records every ``publish_interval_s`` to the
  hash ``<prefix>router:replicas`` (url → record JSON with ``published_at``); prewarm requests
  go onto the list ``<prefix>router:prewarm``, which every gateway's router drains (one of them
  takes each request).

Both also serve the **placement plan** (``plan()``) for the admin API: the document the chore
leader published on the cluster board (``router.cluster.board``: in process, or
``<prefix>cl:plan`` in Redis), joined with the replica records to say where each planned adapter
is now (``plan_view``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import time
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kit.errors import NotFound, Unavailable
from router.cluster.board import Board
from router.cluster.keys import Keys
from router.contract import RouterError
from router.placement.plan import Plan

log = logging.getLogger("loraplane.router.directory")

STALE_AFTER_S = 300.0


class ReplicaSource(Protocol):
    """What a directory needs of the router in its process."""

    def replica_records(self) -> list[dict[str, Any]]: ...

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]: ...


def replicas_key(prefix: str) -> str:
    return f"{prefix}router:replicas"


def prewarm_key(prefix: str) -> str:
    return f"{prefix}router:prewarm"


async def publish_records(
    redis: aioredis.Redis, prefix: str, records: list[dict[str, Any]], ttl_s: float
) -> None:
    if not records:
        return
    now = time.time()
    mapping = {r["url"]: orjson.dumps({**r, "published_at": now}) for r in records}
    key = replicas_key(prefix)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, int(max(ttl_s, 1.0) * 10))
        await pipe.execute()


async def pop_prewarm_requests(redis: aioredis.Redis, prefix: str, limit: int = 16) -> list[dict[str, Any]]:
    raw = await redis.lpop(prewarm_key(prefix), limit)
    out: list[dict[str, Any]] = []
    items = raw if isinstance(raw, list) else []
    for item in items:
        try:
            data = orjson.loads(item)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


PRESENT = ("resident", "loading", "staging")


def _iso(wall: float) -> str:
    at = _dt.datetime.fromtimestamp(wall, tz=_dt.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def plan_view(raw: bytes | None, records: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The published plan document ``raw`` (or None: no plan), for operators: per planned adapter
    version its forecast demand, planned replicas and where it is now (from the replica
    ``records``), busiest first; per pool the desired replicas (the autoscaling signal)."""
    out: dict[str, Any] = {
        "published": False,
        "at": None,
        "age_s": None,
        "desired_replicas": {},
        "overflow": 0,
        "adapters": [],
    }
    if raw is None:
        return out
    try:
        plan = Plan.from_json(orjson.loads(raw))
    except (ValueError, TypeError, KeyError, AssertionError, IndexError, orjson.JSONDecodeError) as exc:
        log.warning("unreadable placement plan: %s", exc, extra={"error": str(exc)})
        return {**out, "problem": "the published plan is unreadable"}
    where: dict[str, list[dict[str, str]]] = {}
    for rec in records:
        for a in rec.get("adapters") or []:
            if a.get("state") in PRESENT and a.get("lora_name"):
                where.setdefault(str(a["lora_name"]), []).append(
                    {"url": str(rec.get("url")), "state": str(a["state"])}
                )
    rows: list[dict[str, Any]] = []
    for name in plan.targets.keys() | plan.adapters.keys():
        adapter, version = plan.adapters.get(name, (name, ""))
        targets = sorted(plan.targets.get(name, ()))
        current = sorted(where.get(name, []), key=lambda c: c["url"])
        held = {c["url"] for c in current}
        rows.append(
            {
                "adapter": adapter,
                "version": version,
                "lora_name": name,
                "demand_rps": round(plan.demand.get(name, 0.0), 6),
                "planned_replicas": len(targets),
                "targets": targets,
                "current": current,
                "missing": [u for u in targets if u not in held],
            }
        )
    rows.sort(key=lambda r: (-r["demand_rps"], r["lora_name"]))
    return {
        **out,
        "published": True,
        "at": _iso(plan.at) if plan.at > 0 else None,
        "age_s": round(max(0.0, now - plan.at), 3) if plan.at > 0 else None,
        "desired_replicas": dict(sorted(plan.desired.items())),
        "overflow": plan.overflow,
        "adapters": rows,
    }


class LocalReplicaDirectory:
    """In process: the router's replica records; the plan from its board (None: no plan)."""

    def __init__(self, source: ReplicaSource, board: Board | None = None) -> None:
        self._source = source
        self._board = board

    async def list_replicas(self) -> list[dict[str, Any]]:
        return self._source.replica_records()

    async def plan(self) -> dict[str, Any]:
        raw = None if self._board is None else await self._board.get_plan()
        return plan_view(raw, self._source.replica_records(), time.time())

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        try:
            return await self._source.request_prewarm(adapter_id, version, replicas)
        except RouterError as exc:
            raise NotFound(exc.message, code="version_not_found") from exc


class DirectoryPublisher:
    """A gateway's side of ``RedisReplicaDirectory``: publishes its replica records every
    ``interval_s`` and serves the prewarm requests queued by the admin API."""

    def __init__(
        self, source: ReplicaSource, redis: aioredis.Redis, prefix: str, *, interval_s: float, ttl_s: float
    ) -> None:
        self._source = source
        self._redis = redis
        self._prefix = prefix
        self._interval = interval_s
        self._ttl = ttl_s

    async def publish_loop(self) -> None:
        while True:
            try:
                await publish_records(self._redis, self._prefix, self._source.replica_records(), self._ttl)
            except RedisError as exc:
                log.warning("cannot publish replica state: %s", exc, extra={"error": str(exc)})
            await asyncio.sleep(self._interval)

    async def prewarm_loop(self) -> None:
        while True:
            try:
                for item in await pop_prewarm_requests(self._redis, self._prefix):
                    with contextlib.suppress(RouterError, KeyError, TypeError, ValueError):
                        await self._source.request_prewarm(
                            str(item["adapter_id"]), str(item["version"]), int(item["replicas"])
                        )
            except RedisError as exc:
                log.warning("cannot read prewarm requests: %s", exc, extra={"error": str(exc)})
            await asyncio.sleep(0.25)


class RedisReplicaDirectory:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix

    async def list_replicas(self) -> list[dict[str, Any]]:
        try:
            raw = await self._redis.hgetall(replicas_key(self._prefix))
        except RedisError as exc:
            raise Unavailable(f"replica state unavailable: {exc}", code="replicas_unavailable") from exc
        now = time.time()
        out: list[dict[str, Any]] = []
        for value in raw.values():
            try:
                rec = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            published = float(rec.pop("published_at", 0.0))
            if now - published > STALE_AFTER_S:
                continue
            out.append(rec)
        out.sort(key=lambda r: str(r.get("url")))
        return out

    async def plan(self) -> dict[str, Any]:
        try:
            raw = await self._redis.get(Keys(self._prefix).plan)
        except RedisError as exc:
            raise Unavailable(f"placement plan unavailable: {exc}", code="replicas_unavailable") from exc
        doc = None if raw is None else raw if isinstance(raw, bytes) else str(raw).encode()
        return plan_view(doc, await self.list_replicas(), time.time())

    async def request_prewarm(self, adapter_id: str, version: str, replicas: int) -> dict[str, Any]:
        item = orjson.dumps(
            {"adapter_id": adapter_id, "version": version, "replicas": replicas, "ts": time.time()}
        )
        try:
            await self._redis.rpush(prewarm_key(self._prefix), item)
        except RedisError as exc:
            raise Unavailable(f"cannot queue prewarm: {exc}", code="replicas_unavailable") from exc
        return {"adapter_id": adapter_id, "version": version, "replicas": replicas, "queued": True}
