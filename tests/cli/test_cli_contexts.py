"""Which token the CLI sends where (issue 24.18, 25.3, 25.6): a saved token goes only to its own
URL, the global options come before the subcommand, a 401 says how to log in.

The "other platform" is a small HTTP server of the test that records every Authorization header
it receives: a token sent to the wrong URL would show up there."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from registry.cli.contexts import (
    ContextError,
    local_up,
    record_local_up,
    resolve,
    same_url,
    save_context,
)

PROD_TOKEN = "lpa-prod-secret-token"


class Recorder:
    """An admin API look-alike that answers every GET with an empty list and records headers."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                recorder.authorizations.append(self.headers.get("Authorization"))
                body = json.dumps({"data": [], "next_cursor": None}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dev() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty CLI config dir and no credentials in the environment."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("LORAPLANE_ADMIN_URL", "LORAPLANE_ADMIN_TOKEN", "LORAPLANE_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "no-up-here"))
    return tmp_path / "config" / "loraplane" / "contexts.json"


def run(*args: str, **env: str) -> Result:
    from loraplane.cli import app

    base = {"COLUMNS": "200", "NO_COLOR": "1"}
    return CliRunner().invoke(app, list(args), env={**base, **env}, catch_exceptions=False)


def test_a_contexts_token_is_never_sent_to_another_url(cfg: Path, dev: Recorder) -> None:
    """A prod context and LORAPLANE_ADMIN_URL pointing at dev: refused before any request (before,
    the prod token went to dev)."""
    save_context("prod", "https://admin.prod.example", PROD_TOKEN)
    res = run("adapters", "list", LORAPLANE_ADMIN_URL=dev.url)
    assert res.exit_code == 1, res.output
    assert f"no saved token for {dev.url}" in res.stderr
    assert "each is only sent to its own URL" in res.stderr and "loraplane login --url" in res.stderr
    assert dev.authorizations == []  # nothing reached dev, least of all the prod token
    res = run("--url", dev.url, "adapters", "list")  # the same with the flag
    assert res.exit_code == 1 and dev.authorizations == []
    res = run("adapters", "list", "--context", "prod", "--url", dev.url)  # named: refused too
    assert res.exit_code == 1 and "context 'prod' holds a token for https://admin.prod.example" in res.stderr
    assert dev.authorizations == []
    # dev's own token, explicitly given, goes to dev (and only it)
    res = run("adapters", "list", "--json", LORAPLANE_ADMIN_URL=dev.url, LORAPLANE_ADMIN_TOKEN="dev-token")
    assert res.exit_code == 0, res.output
    assert dev.authorizations == ["Bearer dev-token"]


def test_the_context_saved_for_a_url_is_the_one_used(cfg: Path, dev: Recorder) -> None:
    save_context("dev", dev.url, "dev-token")
    save_context("prod", "https://admin.prod.example", PROD_TOKEN)  # current
    res = run("adapters", "list", "--json", LORAPLANE_ADMIN_URL=dev.url.replace("127.0.0.1", "localhost"))
    assert res.exit_code == 0, res.output
    assert dev.authorizations == ["Bearer dev-token"]  # dev's context, found by its URL


def test_global_context_before_the_subcommand(cfg: Path, dev: Recorder) -> None:
    """`loraplane --context NAME adapters list`, as the README shows (before: "No such option")."""
    save_context("dev", dev.url, "dev-token")
    save_context("prod", "https://admin.prod.example", PROD_TOKEN)  # current
    res = run("--context", "dev", "adapters", "list", "--json")
    assert res.exit_code == 0, res.output
    assert dev.authorizations == ["Bearer dev-token"]
    res = run("--context", "dev", "--json", "tenants", "list")
    assert (
        res.exit_code == 0 and json.loads(res.stdout) == [] and dev.authorizations[-1] == "Bearer dev-token"
    )
    res = run("--context", "nope", "adapters", "list")
    assert res.exit_code == 1 and "no context 'nope'" in res.stderr
    res = run("--context", "dev", "contexts", "list")
    assert res.exit_code == 0 and "* " not in res.stdout.splitlines()[1]  # dev listed, prod current
    assert [ln.split()[-2:] for ln in res.stdout.splitlines()[1:]] == [
        ["dev", dev.url],
        ["prod", "https://admin.prod.example"],
    ]
    assert PROD_TOKEN not in res.stdout and "dev-token" not in res.stdout
    res = run("contexts", "use", "dev")
    assert res.exit_code == 0 and f"current context: dev ({dev.url})" in res.stdout
    run("adapters", "list")
    assert dev.authorizations[-1] == "Bearer dev-token"


def test_resolution_order_and_url_matching(
    cfg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert same_url("http://localhost:8081/", "http://127.0.0.1:8081")
    assert same_url("https://a.example", "https://A.example:443")
    assert not same_url("http://127.0.0.1:8081", "http://127.0.0.1:18081")
    assert not same_url("http://a.example", "https://a.example")
    with pytest.raises(ContextError, match="not an http"):
        resolve("ftp://x", None, None)
    assert resolve(None, None, None).token is None  # nothing anywhere
    data = tmp_path / "dd3"
    data.mkdir()
    (data / "admin_token").write_text("up-token\n")
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(data))
    # a data dir from an older up (no admin_url): the default URL only
    assert resolve(None, None, None).url == "http://127.0.0.1:8081"
    with pytest.raises(ContextError):
        resolve("http://127.0.0.1:18081", None, None)
    record_local_up(data, "http://127.0.0.1:18081")
    assert local_up() == ("up-token", "http://127.0.0.1:18081", data / "admin_token")
    got = resolve(None, None, None)
    assert (got.url, got.token) == ("http://127.0.0.1:18081", "up-token")
    assert resolve("http://localhost:18081", None, None).token == "up-token"
    save_context("prod", "https://admin.prod.example", PROD_TOKEN)
    assert resolve(None, None, None).token == PROD_TOKEN  # the current context before the data dir
    assert resolve("http://127.0.0.1:18081", None, None).token == "up-token"  # found by its URL
    assert resolve(None, "explicit", None).url == "http://127.0.0.1:8081"  # an explicit token
    monkeypatch.setenv("LORAPLANE_ADMIN_TOKEN", "from-env")
    assert resolve("https://x.example", None, None).token == "from-env"


def test_401_says_how_to_log_in(cfg: Path) -> None:
    """No token anywhere: the 401 line is followed by how to log in (a server that answers 401
    like the admin API without a token; the real one is in test_cli_up_day)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b'{"error": {"code": "unauthorized", "message": "missing bearer token", "details": null}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        res = run("adapters", "list", LORAPLANE_ADMIN_URL=url)
        assert res.exit_code == 1
        lines = res.stderr.strip().splitlines()
        assert lines[0] == "error: 401 unauthorized: missing bearer token"
        assert lines[1].startswith(
            f"hint: no admin token was found for {url}. Log in once with `loraplane login"
        )
        save_context("mine", url, "lpa-revoked")
        res = run("adapters", "list")
        assert "hint: " + url + " refused the token of context mine" in res.stderr
    finally:
        srv.shutdown()
        srv.server_close()
