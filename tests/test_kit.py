"""The shared plumbing and the real services the suite runs on."""

from __future__ import annotations

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
    import pytest

    with pytest.raises(botocore.exceptions.ClientError):
        bad.client().put_object(Bucket=s3_bucket, Key="x", Body=b"x")
