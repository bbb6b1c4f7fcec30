"""The shared plumbing and the real services the suite runs on."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from kit import localservices as ls
from kit.db import make_engine
from kit.ids import is_slug, lora_name, version_number


def test_slugs() -> None:
    assert is_slug("support-ticket")
    assert is_slug("a.b_c-1")
    assert not is_slug("Upper")
    assert not is_slug("a..b")
    assert not is_slug("-lead")
    assert not is_slug("x" * 64)
    assert version_number("v12") == 12
    assert version_number("v0") is None
    assert lora_name("ad", "v2", "abcdef0123456789") == "ad@v2-abcdef01"


def test_postgres_database_is_real(pg_url: str) -> None:
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("select 1")).scalar() == 1
        assert engine.dialect.name == "postgresql"
    engine.dispose()


def test_sqlite_behaves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path}/x.db")
    with engine.begin() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_s3_server_is_real(s3_server: ls.S3Server, s3_bucket: str) -> None:
    c = s3_server.client()
    c.put_object(Bucket=s3_bucket, Key="a/b", Body=b"hello")
    assert c.get_object(Bucket=s3_bucket, Key="a/b")["Body"].read() == b"hello"
    bad = ls.S3Server(s3_server.endpoint_url, s3_server.access_key, "wrong", "us-east-1", None, None)
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError):
        bad.client().put_object(Bucket=s3_bucket, Key="x", Body=b"x")


def test_empty_setting_strings_count_as_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A manifest's `LORAPLANE_S3_ENDPOINT_URL: ""` means AWS's default endpoint, not ''."""
    from registry.settings import RegistrySettings
    from registry.storage.s3 import make_s3_client

    monkeypatch.setenv("LORAPLANE_S3_ENDPOINT_URL", "")
    monkeypatch.setenv("LORAPLANE_S3_REGION", "eu-west-1")
    monkeypatch.setenv("LORAPLANE_S3_BUCKET", "b")
    monkeypatch.setenv("LORAPLANE_DATABASE_URL", "")
    monkeypatch.setenv("LORAPLANE_S3_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("LORAPLANE_S3_SECRET_ACCESS_KEY", "secret")
    settings = RegistrySettings()
    assert settings.s3_endpoint_url is None
    assert settings.resolved_database_url().startswith("sqlite:///")
    client = make_s3_client(settings)
    assert client.meta.endpoint_url == "https://s3.eu-west-1.amazonaws.com"
    assert client.meta.config.s3 == {"payload_signing_enabled": False}  # virtual-host style on AWS

    # the same in a config file: an empty string is not a value
    cfg = tmp_path / "lp.toml"
    cfg.write_text('s3_endpoint_url = ""\ns3_region = "us-east-2"\n')
    monkeypatch.delenv("LORAPLANE_S3_ENDPOINT_URL")
    monkeypatch.delenv("LORAPLANE_S3_REGION")
    monkeypatch.setenv("LORAPLANE_CONFIG", str(cfg))
    settings = RegistrySettings()
    assert settings.s3_endpoint_url is None and settings.s3_region == "us-east-2"
    assert make_s3_client(settings).meta.endpoint_url == "https://s3.us-east-2.amazonaws.com"

    # a real value still wins
    monkeypatch.setenv("LORAPLANE_S3_ENDPOINT_URL", "http://seaweedfs:8333")
    client = make_s3_client(RegistrySettings())
    assert client.meta.endpoint_url == "http://seaweedfs:8333"


def test_own_services_from_wheels_when_the_machine_ones_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """LORAPLANE_TEST_OWN_SERVICES=1 (a fresh machine): PostgreSQL and Redis from PyPI wheels."""
    import redis

    monkeypatch.delenv("LORAPLANE_TEST_PG_URL", raising=False)
    monkeypatch.delenv("LORAPLANE_TEST_REDIS_URL", raising=False)
    monkeypatch.setenv(ls.OWN_SERVICES_ENV, "1")
    base = ls.pg_server_url()
    assert not base.endswith(":5432") and ls.pg_server_url() == base  # started once per process
    with ls.temp_pg_database("own") as url:
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("show server_version")).scalar()
                assert conn.execute(sa.text("show fsync")).scalar() == "off"  # a throwaway server
        finally:
            engine.dispose()
    rurl = ls.redis_server_url()
    assert not rurl.startswith("redis://127.0.0.1:6379")
    client = redis.Redis.from_url(rurl)
    try:
        client.set("lp:own", "1")
        assert client.get("lp:own") == b"1"
    finally:
        client.close()
