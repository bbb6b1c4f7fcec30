"""The admin API application: ``create_admin_app(settings, *, engine, store, feed, replica_directory)``.

Everything under ``/admin/v1``; a bearer admin token on every route except ``/healthz`` and the
OpenAPI document / docs, and the permission each route declares (SPEC §14, ``registry.auth``).
Every error, FastAPI's own included, is rendered as ``{"error": {"code", "message", "details"}}``;
bad input is never a 500.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from kit.db import make_engine, make_session_factory, session_scope
from kit.errors import LoraplaneError
from kit.inputs import InputGuard
from registry.api import (
    routes_adapters,
    routes_bulk,
    routes_governance,
    routes_ops,
    routes_owners,
    routes_plan,
    routes_quality,
    routes_tenants,
    routes_upload,
)
from registry.api.deps import AdminState
from registry.api.inputs import safe_path_params
from registry.api.schemas import ErrorOut
from registry.auth.dependencies import AuthConfig, guard
from registry.feed import ChangeFeed, make_feed
from registry.migrate import check_schema
from registry.quality.settings import EvaluatorSettings
from registry.replicas import ReplicaDirectory
from registry.repositories import artifacts as artifacts_repo
from registry.settings import RegistrySettings
from registry.storage.sweeper import OrphanSweeper

log = logging.getLogger("loraplane.registry.api")

PREFIX = "/admin/v1"

# Every admin route, in one place: the app mounts these under PREFIX and the README's permission
# table is generated from them (registry.auth.table).
ADMIN_ROUTERS = (
    routes_adapters.router,
    routes_upload.router,
    routes_tenants.router,
    routes_owners.router,
    routes_ops.router,
    routes_plan.router,
    routes_governance.router,
    routes_bulk.router,
    routes_quality.router,
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


def _error(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"code": code, "message": message, "details": details}},
        headers=headers,
    )


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        out.append(
            {
                "loc": [str(p) for p in err.get("loc", ())],
                "msg": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
        )
    return out


def _guard_error(status: int, code: str, message: str, field: str) -> bytes:
    envelope = {"error": {"code": code, "message": message, "details": {"field": field}}}
    return json.dumps(envelope, separators=(",", ":")).encode()


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LoraplaneError)
    async def _loraplane(_req: Request, exc: LoraplaneError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.code, exc.message, exc.details, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        details = _validation_details(exc)
        if any(d["type"] == "json_invalid" for d in details):
            message = "request body is not valid JSON"
        else:
            message = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details[:5]) or "invalid request"
        return _error(422, "invalid_request", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = str(exc.detail) if exc.detail else code.replace("_", " ")
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route"
        return _error(exc.status_code, code, message, None, dict(exc.headers or {}) or None)

    @app.exception_handler(IntegrityError)
    async def _integrity(_req: Request, exc: IntegrityError) -> JSONResponse:
        log.warning("integrity error", extra={"error": str(exc.orig)})
        return _error(409, "conflict", "the change conflicts with the current state; retry")

    @app.exception_handler(DataError)
    async def _data(_req: Request, exc: DataError) -> JSONResponse:
        # A value the schemas let through but the database refuses (out of range, too long):
        # still bad input, never a 500. The schemas (kit.inputs types) should catch it first.
        log.warning("database refused a value", extra={"error": str(exc.orig)})
        return _error(422, "invalid_request", "a value is out of range or too long for its field")

    @app.exception_handler(OperationalError)
    async def _operational(_req: Request, exc: OperationalError) -> JSONResponse:
        log.error("database unavailable", extra={"error": str(exc.orig)})
        return _error(503, "database_unavailable", "the registry database is unavailable")

    @app.exception_handler(PoolTimeout)
    async def _pool_timeout(_req: Request, exc: PoolTimeout) -> JSONResponse:
        # every pooled connection is busy past database_timeout_s (a hung or overloaded database)
        log.error("no database connection free", extra={"error": str(exc)})
        return _error(503, "database_unavailable", "the registry database is unavailable")

    @app.exception_handler(SQLAlchemyError)
    async def _sqlalchemy(_req: Request, exc: SQLAlchemyError) -> JSONResponse:
        log.exception("database error")
        return _error(500, "internal_error", "internal database error")

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, "internal_error", "internal error")


def start_orphan_sweeper(st: AdminState) -> OrphanSweeper | None:
    """The artifact store's orphan sweeper (registry.storage.sweeper), unless turned off."""
    if st.store is None or st.settings.storage_sweep_interval_s <= 0:
        return None

    def referenced(uris: list[str]) -> set[str]:
        with session_scope(st.factory, read_only=True) as session:
            return artifacts_repo.referenced_storage_uris(session, uris)

    return OrphanSweeper(
        st.store,
        referenced,
        interval_s=st.settings.storage_sweep_interval_s,
        older_than_s=st.settings.storage_orphan_age_s,
    ).start()


def create_admin_app(
    settings: RegistrySettings,
    *,
    engine: Engine | None = None,
    store: Any = None,
    feed: ChangeFeed | None = None,
    replica_directory: ReplicaDirectory | None = None,
    evaluator_settings: EvaluatorSettings | None = None,
) -> FastAPI:
    """Build the admin API. Builds what is None from ``settings`` (engine, artifact store, change
    feed) and refuses a database whose schema is not at head (``Unavailable("stale_schema")``).
    ``evaluator_settings``: the evaluation worker's (default: from the environment)."""
    if engine is None:
        engine = make_engine(settings.resolved_database_url(), timeout_s=settings.database_timeout_s)
    check_schema(engine)
    if store is None:
        from registry.storage.base import make_store

        store = make_store(settings)
    if feed is None:
        feed = make_feed(settings, engine)
    token = settings.admin_token.get_secret_value() if settings.admin_token is not None else None
    if not token:
        log.warning("LORAPLANE_ADMIN_TOKEN is not set: every admin request is refused")
        token = None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweeper = start_orphan_sweeper(app.state.admin)  # under a server (or a TestClient context)
        evaluator.start()  # evaluations (SPEC §16); fails runs a killed process left running
        try:
            yield
        finally:
            evaluator.stop()
            if sweeper is not None:
                sweeper.stop()

    app = FastAPI(
        lifespan=lifespan,
        dependencies=[Depends(safe_path_params)],  # every route, the console's too
        title="loraplane admin API",
        version="1",
        description="Adapters, versions, promote / canary / rollback, tenants, keys, grants, audit.",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
        responses={
            401: {"model": ErrorOut},
            403: {"model": ErrorOut},
            404: {"model": ErrorOut},
            409: {"model": ErrorOut},
            422: {"model": ErrorOut},
            503: {"model": ErrorOut},
        },
    )
    app.state.admin = AdminState(
        settings=settings,
        engine=engine,
        factory=make_session_factory(engine),
        store=store,
        feed=feed,
        replica_directory=replica_directory,
        admin_token=token,
    )
    evaluator = routes_quality.attach_evaluator(app, app.state.admin, evaluator_settings)
    app.state.auth = AuthConfig(factory=app.state.admin.factory, bootstrap_token=token)
    _install_error_handlers(app)
    # Control characters in the query, and oversized / too deep / unsafe JSON bodies, never reach
    # a route (kit.inputs; SPEC §18); path parameters: safe_path_params above.
    app.add_middleware(InputGuard, render=_guard_error)

    @app.get(f"{PREFIX}/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # Each route declares its permission (registry.auth.dependencies.requires); the guard makes
    # a route that declares none admin-only.
    auth = [Depends(guard)]
    for router in ADMIN_ROUTERS:
        app.include_router(router, prefix=PREFIX, dependencies=auth)
    from registry.console import install_console  # here: the console builds on registry.api.deps

    install_console(app)  # the admin console at /admin/ui/ (its own sign-in)
    return app
