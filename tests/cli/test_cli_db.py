"""``loraplane db upgrade|current`` on a fresh SQLite file (and a PostgreSQL database)."""

from __future__ import annotations

from pathlib import Path

from kit.localservices import temp_pg_database
from registry import migrate
from tests.cli.cli_helpers import run_cli


def test_db_upgrade_then_current_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    res = run_cli(["db", "current", "--database-url", url])
    assert res.exit_code == 1
    assert "run `loraplane db upgrade`" in res.stdout
    res = run_cli(["db", "upgrade"], env={"LORAPLANE_DATABASE_URL": url})
    assert res.exit_code == 0, res.output
    assert f"at revision {migrate.head()} (head)" in res.stdout
    assert migrate.current(url) == migrate.head()
    res = run_cli(["db", "current"], env={"LORAPLANE_DATABASE_URL": url})
    assert res.exit_code == 0, res.output
    assert migrate.head() in res.stdout
    res = run_cli(["db", "upgrade", "--database-url", url])  # idempotent
    assert res.exit_code == 0, res.output


def test_db_default_is_sqlite_in_data_dir(tmp_path: Path) -> None:
    res = run_cli(
        ["db", "upgrade"], env={"LORAPLANE_DATA_DIR": str(tmp_path / "data"), "LORAPLANE_DATABASE_URL": ""}
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "data" / "loraplane.db").is_file()


def test_db_upgrade_on_postgresql_hides_password() -> None:
    with temp_pg_database("cli") as url:
        res = run_cli(["db", "upgrade", "--database-url", url])
        assert res.exit_code == 0, res.output
        assert migrate.current(url) == migrate.head()
        if "@" in url and ":" in url.split("@")[0].split("//")[1]:
            password = url.split("@")[0].split(":")[-1]
            assert password not in res.stdout


def test_db_unreachable_is_one_error_line() -> None:
    res = run_cli(["db", "current", "--database-url", "postgresql+psycopg://u:pw@127.0.0.1:1/x"])
    assert res.exit_code == 1
    assert res.stderr.startswith(
        "error: reading the revision failed on postgresql+psycopg://u:***@127.0.0.1:1/x"
    )
    assert "Traceback" not in res.output
