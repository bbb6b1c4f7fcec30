"""``loraplane serve --role registry|gateway|all|evaluator``: the production processes, from settings.

PostgreSQL (``LORAPLANE_DATABASE_URL``), S3 (``LORAPLANE_S3_*``), Redis (``LORAPLANE_REDIS_URL``)
and replica pools (``LORAPLANE_POOLS``). Refuses to start on a stale schema ("run `loraplane db
upgrade`"). Never starts simulators: with no pools configured the gateway says so and stays
not-ready (``/readyz`` 503). The gateway's ``/metrics`` and detailed ``/readyz`` are served on its
internal port (``LORAPLANE_GATEWAY_INTERNAL_PORT``), never on the public one (SPEC §19).
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from gateway import Gateway, GatewaySettings
    from gateway.serving import QuietServer

log = logging.getLogger("loraplane.serve")


class Role(StrEnum):
    registry = "registry"
    gateway = "gateway"
    all = "all"
    evaluator = "evaluator"


async def run_serve(role: Role) -> None:
    from gateway import GatewaySettings, build_gateway, create_gateway_app
    from gateway.serving import make_server, serve_all
    from kit.db import make_engine, make_session_factory
    from kit.errors import Unavailable
    from kit.redis_factory import redis_from_settings
    from registry.feed import make_feed
    from registry.migrate import check_schema
    from registry.settings import RegistrySettings

    reg_settings = RegistrySettings()
    engine = make_engine(reg_settings.resolved_database_url(), timeout_s=reg_settings.database_timeout_s)
    try:
        await asyncio.to_thread(check_schema, engine)
    except Unavailable as e:
        engine.dispose()
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None
    feed = make_feed(reg_settings, engine)
    if role is Role.evaluator:  # evaluations only (SPEC §16): no HTTP server
        from registry.quality.standalone import run_evaluator

        try:
            await run_evaluator(engine, feed)
        finally:
            engine.dispose()
        return
    servers: list[QuietServer] = []
    router: Any = None
    audit: Any = None
    redis = redis_from_settings(reg_settings) if reg_settings.redis_url else None
    store: Any = None
    gateway: Any = None
    closers: list[Any] = []  # the console's traffic samplers (daemon threads)
    analyser: Any = None  # canary analysis (SPEC §16), in every gateway process, lease-elected
    if role in (Role.gateway, Role.all):
        from registry.audit_sink import BufferedAuditSink
        from registry.services.audit import DbAuditSink
        from registry.storage.base import make_store
        from router import Router, RouterSettings

        gsettings = GatewaySettings()
        rsettings = RouterSettings()
        if not rsettings.pools:
            log.warning(
                "no replica pools configured (LORAPLANE_POOLS): the gateway stays not-ready; "
                "loraplane serve never starts simulated replicas"
            )
        store = make_store(reg_settings)
        audit = BufferedAuditSink(DbAuditSink(make_session_factory(engine)))  # written out at exit
        router = Router(rsettings, store=store, audit=audit, redis=redis)
        gateway = build_gateway(gsettings, router=router, engine=engine, feed=feed)
        if reg_settings.redis_url:  # the console's traffic page, across processes
            from registry.console.wiring import publish_traffic

            closers.append(
                publish_traffic(reg_settings.redis_url, reg_settings.redis_prefix, gateway.metrics.registry)
            )
        from gateway.canary import MemoryCanaryCounters
        from registry.canary.wiring import start_analyser

        analyser = start_analyser(
            engine,
            promotion_ttl_s=reg_settings.promotion_ttl_s,
            redis=redis,
            redis_prefix=reg_settings.redis_prefix,
            local_counters=gateway.canary if isinstance(gateway.canary, MemoryCanaryCounters) else None,
            feed=feed,
        )
        servers.append(
            make_server(
                create_gateway_app(gateway),
                gsettings.gateway_host,
                gsettings.gateway_port,
                log_level=gsettings.log_level,
            )
        )
        servers += internal_servers(gateway, gsettings)
    if role in (Role.registry, Role.all):
        from registry.api import create_admin_app

        directory: Any = None
        if router is not None:
            directory = router.directory
        elif redis is not None:
            from router.directory import RedisReplicaDirectory

            directory = RedisReplicaDirectory(redis, reg_settings.redis_prefix)
        from registry.quality.settings import EvaluatorSettings

        evaluator = EvaluatorSettings()
        if gateway is not None and not evaluator.eval_gateway_url:  # --role all: our own gateway
            host = "127.0.0.1" if gsettings.gateway_host in ("0.0.0.0", "::", "") else gsettings.gateway_host
            evaluator = EvaluatorSettings(eval_gateway_url=f"http://{host}:{gsettings.gateway_port}")
        admin_app = create_admin_app(
            reg_settings,
            engine=engine,
            store=store,
            feed=feed,
            replica_directory=directory,
            evaluator_settings=evaluator,
        )
        from registry.console.wiring import local_traffic, redis_traffic

        if reg_settings.redis_url:
            closers.append(redis_traffic(admin_app, reg_settings.redis_url, reg_settings.redis_prefix))
        elif gateway is not None:
            closers.append(local_traffic(admin_app, gateway.metrics.registry))
        servers.append(
            make_server(
                admin_app, reg_settings.admin_host, reg_settings.admin_port, log_level=reg_settings.log_level
            )
        )
    try:
        drain = None
        if gateway is not None:
            gw = gateway

            async def drain() -> None:
                await gw.drain(gw.settings.drain_s)

        await serve_all(servers, drain=drain)
    finally:
        if analyser is not None:
            await analyser.stop()
        for closer in closers:
            closer.close()
        if audit is not None:
            await audit.close()
        if redis is not None:
            await redis.aclose()
        engine.dispose()


def internal_servers(gateway: Gateway, settings: GatewaySettings) -> list[QuietServer]:
    """The gateway's internal port (SPEC §19): /metrics and the detailed /readyz, never on the
    public port; none (and a warning) when LORAPLANE_GATEWAY_INTERNAL_PORT is unset."""
    from gateway.internal import create_internal_app
    from gateway.serving import make_server

    if settings.gateway_internal_port is None:
        log.warning(
            "LORAPLANE_GATEWAY_INTERNAL_PORT is not set: /metrics and the detailed /readyz are not "
            "served (the public port never serves them)"
        )
        return []
    host, port = settings.gateway_internal_host, settings.gateway_internal_port
    log.info("internal port (/metrics, /readyz details) on %s:%s", host, port)
    return [
        make_server(create_internal_app(gateway), host, port, log_level=settings.log_level, lifespan="off")
    ]


def serve(
    role: Role = typer.Option(
        Role.all,
        "--role",
        help="registry (admin API), gateway (public API + router), all, or evaluator (runs the "
        "evaluations an admin API with LORAPLANE_EVAL_IN_PROCESS=false records).",
    ),
) -> None:
    """Run the production processes from settings (PostgreSQL, S3, Redis, LORAPLANE_POOLS)."""
    import uvloop

    from kit.logs import setup_logging
    from kit.settings import LoraplaneSettings

    base = LoraplaneSettings()
    setup_logging(base.log_level, base.log_json)
    uvloop.run(run_serve(role))
