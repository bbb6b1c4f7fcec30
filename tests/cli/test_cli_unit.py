"""Unit tests of the registry CLI against an ``httpx.MockTransport`` admin API: error lines and
exit codes, JSON mode, global options, pagination, the streamed multipart upload, PATCH bodies."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

import registry.cli._common as common
from kit.localservices import free_port
from registry.adapter_factory import write_adapter
from registry.admin_client import AdminAPIError, AdminClient, MultipartUpload
from registry.cli import adapters_app, base_models_app, tenants_app
from tests.cli.cli_helpers import parse_multipart, run_cli

Handler = Callable[[httpx.Request], httpx.Response]


class FakeAPI:
    """Records requests and answers from a route table ``(method, path) → handler``."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []
        self.routes: dict[tuple[str, str], Handler] = {}

    def on(self, method: str, path: str, status: int = 200, body: Any = None) -> None:
        self.routes[(method, "/admin/v1" + path)] = lambda req: httpx.Response(status, json=body)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.read())
        self.requests.append(request)
        handler = self.routes.get((request.method, request.url.path))
        if handler is None:
            return httpx.Response(
                404, json={"error": {"code": "not_found", "message": "no route", "details": None}}
            )
        return handler(request)

    def sent(self, method: str, path: str) -> list[httpx.Request]:
        """The requests sent to ``method path`` (path under /admin/v1, query left out)."""
        return [r for r in self.requests if r.method == method and r.url.path == "/admin/v1" + path]

    def body(self, method: str, path: str) -> bytes:
        """The body of the last request sent to ``method path``."""
        return self.sent(method, path)[-1].content


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPI]:
    fake = FakeAPI()

    def _client(url: str, token: str | None = None, **kw: Any) -> AdminClient:
        return AdminClient(url, token, transport=httpx.MockTransport(fake))

    monkeypatch.setattr(common, "AdminClient", _client)
    yield fake


ADAPTER = {
    "id": "support-bot",
    "base_model": "demo-base",
    "owner": "ml-team",
    "description": None,
    "status": "active",
    "active_version": "v1",
    "canary_version": None,
    "canary_weight": None,
    "created_at": "2026-11-29T08:00:00Z",
}


def test_api_error_prints_one_line_and_exits_1(api: FakeAPI) -> None:
    api.on(
        "POST",
        "/adapters/support-bot/rollback",
        409,
        {
            "error": {
                "code": "no_rollback_target",
                "message": "adapter 'support-bot' has nothing to roll back to",
            }
        },
    )
    res = run_cli(["adapters", "rollback", "support-bot"])
    assert res.exit_code == 1
    assert (
        res.stderr.strip()
        == "error: 409 no_rollback_target: adapter 'support-bot' has nothing to roll back to"
    )
    assert res.stdout == ""
    assert "Traceback" not in res.output


def test_invalid_adapter_lists_each_problem(api: FakeAPI, tmp_path: Path) -> None:
    write_adapter(tmp_path / "a")
    api.on("GET", "/adapters/bot", 200, {**ADAPTER, "id": "bot"})
    problems = ["r=128 is above the base model's max_lora_rank 64", "use_dora: true is not supported by vLLM"]
    api.on(
        "POST",
        "/adapters/bot/versions",
        422,
        {
            "error": {
                "code": "invalid_adapter",
                "message": "adapter failed validation",
                "details": {"problems": problems},
            }
        },
    )
    res = run_cli(["adapters", "push", str(tmp_path / "a"), "--adapter", "bot"])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert "error: 422 invalid_adapter: adapter failed validation" in lines
    assert lines[-2:] == [f"  - {p}" for p in problems]


def test_non_json_error_answer_is_still_one_line(api: FakeAPI) -> None:
    api.routes[("GET", "/admin/v1/adapters/x")] = lambda req: httpx.Response(502, text="Bad Gateway")
    res = run_cli(["adapters", "show", "x"])
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: 502 http_502: Bad Gateway"


def test_unreachable_admin_api_exits_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = run_cli(["adapters", "list", "--url", url])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: cannot reach the admin API at {url} (is it running?)"
    # the env var is honoured too
    res = run_cli(["tenants", "list"], env={"LORAPLANE_ADMIN_URL": url})
    assert res.exit_code == 2
    assert url in res.stderr


def test_token_url_and_json_options(api: FakeAPI) -> None:
    api.on("GET", "/adapters/support-bot", 200, {**ADAPTER, "versions": []})
    res = run_cli(
        ["adapters", "show", "support-bot", "--json"],
        env={"LORAPLANE_ADMIN_TOKEN": "s3cret", "LORAPLANE_ADMIN_URL": "http://admin.test:9"},
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["id"] == "support-bot"
    req = api.requests[-1]
    assert req.headers["authorization"] == "Bearer s3cret"
    assert str(req.url) == "http://admin.test:9/admin/v1/adapters/support-bot"
    # group-level options, command-level token wins over the env var
    res = run_cli(
        ["adapters", "--json", "--url", "http://other.test", "show", "support-bot", "--token", "cmd"],
        env={"LORAPLANE_ADMIN_TOKEN": "s3cret"},
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["active_version"] == "v1"
    assert api.requests[-1].headers["authorization"] == "Bearer cmd"
    assert api.requests[-1].url.host == "other.test"


def test_list_follows_next_cursor(api: FakeAPI) -> None:
    pages = {
        None: {"data": [{**ADAPTER, "id": "a1"}], "next_cursor": "c2"},
        "c2": {"data": [{**ADAPTER, "id": "a2"}], "next_cursor": "c3"},
        "c3": {
            "data": [{**ADAPTER, "id": "a3", "canary_version": "v2", "canary_weight": 10}],
            "next_cursor": None,
        },
    }
    api.routes[("GET", "/admin/v1/adapters")] = lambda req: httpx.Response(
        200, json=pages[req.url.params.get("cursor")]
    )
    res = run_cli(["adapters", "list", "--base-model", "demo-base", "--json"])
    assert res.exit_code == 0, res.output
    assert [a["id"] for a in json.loads(res.stdout)] == ["a1", "a2", "a3"]
    assert all(r.url.params["base_model"] == "demo-base" for r in api.requests)
    assert "owner" not in api.requests[0].url.params
    res = run_cli(["adapters", "list"])
    assert res.exit_code == 0
    for word in ("a1", "a2", "a3", "v2 (10%)", "demo-base"):
        assert word in res.stdout


def test_push_streams_every_visible_file_as_files_parts(api: FakeAPI, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "ad", rank=4)
    (d / "README.md").write_text("hello")
    (d / ".DS_Store").write_bytes(b"junk")
    (d / "sub").mkdir()
    (d / "sub" / "x.bin").write_bytes(b"nested")
    version = {
        "adapter_id": "bot",
        "version": "v1",
        "status": "ready",
        "rank": 4,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "files": [{"name": "adapter_config.json", "size": 10, "sha256": "ab" * 32}],
        "storage_uri": "file:///x",
        "rollback_to": None,
        "quality_gate": "pending",
        "created_by": "admin",
        "created_at": "2026-11-29T08:00:00Z",
    }
    api.on(
        "GET", "/adapters/bot", 404, {"error": {"code": "adapter_not_found", "message": "no adapter 'bot'"}}
    )
    api.on("POST", "/adapters", 201, {**ADAPTER, "id": "bot"})
    api.on("POST", "/adapters/bot/versions", 201, version)
    res = run_cli(
        ["adapters", "push", str(d), "-a", "bot", "--base", "demo-base", "--create", "--owner", "me"]
    )
    assert res.exit_code == 0, res.output
    assert "uploaded bot v1" in res.stdout
    assert "created adapter bot" in res.stderr
    assert "push bot (3 files)" in res.stderr  # the progress bar goes to stderr, stdout stays clean
    create_body = json.loads(api.bodies[1])
    assert create_body == {"id": "bot", "base_model": "demo-base", "owner": "me"}
    upload = api.requests[2]
    body = api.bodies[2]
    assert int(upload.headers["content-length"]) == len(body)
    parts = parse_multipart(body, upload.headers["content-type"])
    assert [(n, f) for n, f, _ in parts] == [
        ("files", "README.md"),
        ("files", "adapter_config.json"),
        ("files", "adapter_model.safetensors"),
    ]
    for _, fname, content in parts:
        assert content == (d / fname).read_bytes()


def test_push_without_base_to_missing_adapter_says_how(api: FakeAPI, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "ad")
    api.on("GET", "/adapters/bot", 404, {"error": {"code": "adapter_not_found", "message": "no adapter"}})
    res = run_cli(["adapters", "push", str(d), "-a", "bot", "--create"])
    assert res.exit_code == 1
    assert "--create needs --base" in res.stderr
    # a base mismatch with an existing adapter is refused before uploading
    api.on("GET", "/adapters/bot", 200, {**ADAPTER, "id": "bot", "base_model": "llama"})
    res = run_cli(["adapters", "push", str(d), "-a", "bot", "--base", "demo-base"])
    assert res.exit_code == 1
    assert "belongs to base model 'llama'" in res.stderr
    assert not any(r.method == "POST" for r in api.requests)


def test_multipart_upload_reads_in_chunks_and_reports_progress(tmp_path: Path) -> None:
    f = tmp_path / "big.bin"
    f.write_bytes(b"x" * 10_000)
    seen: list[int] = []
    body = MultipartUpload([f], progress=seen.append, chunk_bytes=4096)
    chunks = list(body)
    assert sum(seen) == 10_000 and max(seen) <= 4096 and len(seen) == 3
    assert len(b"".join(chunks)) == len(body)


def test_promote_canary_and_version_normalisation(api: FakeAPI) -> None:
    api.on(
        "POST",
        "/adapters/bot/versions/v3/promote",
        200,
        {**ADAPTER, "id": "bot", "canary_version": "v3", "canary_weight": 10},
    )
    res = run_cli(["adapters", "promote", "bot", "3", "--canary", "10"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.body("POST", "/adapters/bot/versions/v3/promote")) == {"canary_weight": 10}
    assert "bot v3 is now canary at 10%" in res.stdout
    res = run_cli(["adapters", "promote", "bot", "v3", "--canary", "100"])
    assert res.exit_code == 2  # out of range, refused locally
    assert len(api.sent("POST", "/adapters/bot/versions/v3/promote")) == 1


def test_tenant_limits_patch_body(api: FakeAPI) -> None:
    tenant = {
        "id": "acme",
        "name": "acme",
        "limits": {"rpm": None, "tpm": 1000, "max_concurrency": 4},
        "base_model_access": False,
        "created_at": "2026-11-29T08:00:00Z",
    }
    api.on("PATCH", "/tenants/acme", 200, tenant)
    res = run_cli(["tenants", "limits", "acme", "--rpm", "none", "--tpm", "1000", "--no-base-model-access"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"limits": {"rpm": None, "tpm": 1000}, "base_model_access": False}
    assert "unlimited" in res.stdout
    res = run_cli(["tenants", "limits", "acme"])
    assert res.exit_code == 2  # nothing to change
    res = run_cli(["tenants", "limits", "acme", "--rpm", "-3"])
    assert res.exit_code == 2


def test_tenant_max_cold_waiters_flags(api: FakeAPI) -> None:
    tenant = {
        "id": "acme",
        "name": "acme",
        "limits": {"rpm": None, "tpm": None, "max_concurrency": None, "max_cold_waiters": 2},
        "base_model_access": False,
        "created_at": "2026-11-29T08:00:00Z",
    }
    api.on("POST", "/tenants", 201, tenant)
    res = run_cli(["tenants", "create", "acme", "--max-cold-waiters", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1])["limits"]["max_cold_waiters"] == 2
    assert "max_cold_waiters" in res.stdout
    res = run_cli(["tenants", "create", "acme"])  # left out: not sent (unlimited)
    assert res.exit_code == 0, res.output
    assert "max_cold_waiters" not in json.loads(api.bodies[-1])["limits"]
    api.on("PATCH", "/tenants/acme", 200, tenant)
    res = run_cli(["tenants", "limits", "acme", "--max-cold-waiters", "3"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"limits": {"max_cold_waiters": 3}}
    res = run_cli(["tenants", "limits", "acme", "--max-cold-waiters", "none"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"limits": {"max_cold_waiters": None}}
    n = len(api.requests)
    assert run_cli(["tenants", "limits", "acme", "--max-cold-waiters", "-1"]).exit_code == 2
    assert run_cli(["tenants", "create", "acme", "--max-cold-waiters", "-1"]).exit_code == 2
    assert len(api.requests) == n  # refused locally


def test_adapter_update_and_create_bodies(api: FakeAPI) -> None:
    api.on("PATCH", "/adapters/bot", 200, {**ADAPTER, "id": "bot", "hot": True})
    res = run_cli(["adapters", "update", "bot", "--hot"])
    assert res.exit_code == 0, res.output
    assert api.requests[-1].method == "PATCH" and json.loads(api.bodies[-1]) == {"hot": True}
    assert "updated bot: marked hot" in res.stdout
    res = run_cli(["adapters", "update", "bot", "--no-hot", "--description", "[b]x[/]", "--owner", "me"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"description": "[b]x[/]", "owner": "me", "hot": False}
    n = len(api.requests)
    assert run_cli(["adapters", "update", "bot"]).exit_code == 2  # nothing to change
    assert len(api.requests) == n
    api.on("POST", "/adapters", 201, {**ADAPTER, "id": "bot", "hot": True})
    res = run_cli(["adapters", "create", "bot", "--base", "demo-base", "--hot", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"id": "bot", "base_model": "demo-base", "hot": True}
    assert json.loads(res.stdout)["hot"] is True
    run_cli(["adapters", "create", "bot", "--base", "demo-base"])
    assert json.loads(api.bodies[-1]) == {"id": "bot", "base_model": "demo-base"}
    run_cli(["adapters", "create", "bot", "--base", "demo-base", "--on-load-failure", "previous_version"])
    assert json.loads(api.bodies[-1]) == {
        "id": "bot",
        "base_model": "demo-base",
        "on_load_failure": "previous_version",
    }
    res = run_cli(["adapters", "update", "bot", "--on-load-failure", "base_model"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"on_load_failure": "base_model"}


def test_tenant_key_prints_key_once_with_warning(api: FakeAPI) -> None:
    api.on(
        "POST",
        "/tenants/acme/keys",
        201,
        {
            "key_id": "k1",
            "key": "lp_live_abcdef",
            "prefix": "lp_live_ab",
            "created_at": "2026-11-29T08:00:00Z",
        },
    )
    res = run_cli(["tenants", "key", "acme"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().splitlines()[-1] == "lp_live_abcdef"
    assert "shown only now" in res.stderr
    res = run_cli(["tenants", "key", "acme", "--json"])
    assert json.loads(res.stdout)["key"] == "lp_live_abcdef"


def test_base_models_add_with_shapes_file(api: FakeAPI, tmp_path: Path) -> None:
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"q_proj": [256, 256]}))
    api.on(
        "POST",
        "/base-models",
        201,
        {"name": "m", "hf_id": "org/m", "max_lora_rank": 16, "target_modules": ["q_proj", "v_proj"]},
    )
    res = run_cli(
        [
            "base-models",
            "add",
            "m",
            "--hf-id",
            "org/m",
            "--max-lora-rank",
            "16",
            "--target-modules",
            "q_proj, v_proj",
            "--module-shapes",
            f"@{shapes}",
        ]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {
        "name": "m",
        "hf_id": "org/m",
        "max_lora_rank": 16,
        "target_modules": ["q_proj", "v_proj"],
        "module_shapes": {"q_proj": [256, 256]},
    }
    res = run_cli(
        [
            "base-models",
            "add",
            "m",
            "--hf-id",
            "o/m",
            "--max-lora-rank",
            "16",
            "--target-modules",
            "q_proj",
            "--module-shapes",
            "{bad",
        ]
    )
    assert res.exit_code == 2
    assert len(api.requests) == 1


def test_client_error_object() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(
            422,
            json={"error": {"code": "invalid_adapter", "message": "m", "details": {"problems": ["a", "b"]}}},
        )

    with (
        AdminClient("http://x", transport=httpx.MockTransport(handler)) as c,
        pytest.raises(AdminAPIError) as ei,
    ):
        c.get_adapter("a/../b")
    assert (ei.value.status, ei.value.code, ei.value.problems) == (422, "invalid_adapter", ["a", "b"])


class _HashingTransport(httpx.BaseTransport):
    """Consumes the request body chunk by chunk (like a server would), keeping only a hash."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.size = 0
        self.max_chunk = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for chunk in request.stream:  # type: ignore[union-attr]
            self.sha.update(chunk)
            self.size += len(chunk)
            self.max_chunk = max(self.max_chunk, len(chunk))
        return httpx.Response(201, json={"adapter_id": "big", "version": "v1"})


def test_upload_streams_without_holding_files_in_memory(tmp_path: Path) -> None:
    d = tmp_path / "big"
    d.mkdir()
    with open(d / "adapter_model.safetensors", "wb") as f:
        block = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(48):
            f.write(block)
    (d / "adapter_config.json").write_text("{}")
    transport = _HashingTransport()
    progress: list[int] = []
    tracemalloc.start()
    try:
        with AdminClient("http://admin.test", "t", transport=transport) as c:
            c.upload_version("big", d, progress=progress.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = 48 * 1024 * 1024 + 2
    assert sum(progress) == total
    assert transport.size > total and transport.max_chunk <= 1024 * 1024
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes: the upload was buffered"


def test_groups_are_mounted_in_the_loraplane_cli() -> None:
    from typer.testing import CliRunner

    from loraplane.cli import app

    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for group in ("db", "adapters", "tenants", "base-models"):
        assert group in res.output
    res = CliRunner().invoke(app, ["adapters", "--help"], env={"COLUMNS": "200"})
    for cmd in ("create", "update", "push", "promote", "rollback", "disable-version", "prewarm", "replicas",
                "audit"):  # fmt: skip
        assert cmd in res.output


def test_no_help_text_shows_restructuredtext_double_backticks() -> None:
    """Typer prints help as written: a docstring's ``x`` (reST) would show both backticks."""
    import typer
    from typer.core import TyperArgument, TyperGroup, TyperOption
    from typer.testing import CliRunner

    from loraplane.cli import app

    seen: list[str] = []
    bad: list[tuple[str, str]] = []

    def walk(cmd: typer.core.TyperCommand | TyperGroup, path: str) -> None:
        seen.append(path)
        texts = [cmd.help or ""]
        texts += [p.help or "" for p in cmd.params if isinstance(p, TyperOption | TyperArgument)]
        bad.extend((path, t) for t in texts if "``" in t)
        if isinstance(cmd, TyperGroup):
            for name, sub in cmd.commands.items():
                assert isinstance(sub, typer.core.TyperCommand | TyperGroup)
                walk(sub, f"{path} {name}")

    top = typer.main.get_command(app)
    assert isinstance(top, TyperGroup)
    walk(top, "loraplane")
    assert {"loraplane up", "loraplane adapters create", "loraplane tenants create"} <= set(seen)
    assert bad == []
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "`--engine vllm --model DIR`" in res.output and "``" not in res.output


def test_every_admin_command_takes_the_shared_options_last() -> None:
    """``admin_command`` appends the shared options after each command's own, with their help."""
    shared = {
        "url": (["--url"], "Admin API base URL (env LORAPLANE_ADMIN_URL; default http://127.0.0.1:8081)."),
        "token": (["--token"], "Admin bearer token (env LORAPLANE_ADMIN_TOKEN)."),
        "as_json": (["--json"], "Print the raw JSON answer instead of tables."),
        "context": (
            ["--context"],
            "Credentials saved by `loraplane login --context NAME` (or `up`: 'local') "
            "(env LORAPLANE_CONTEXT).",
        ),
        "wide": (["--wide"], "Tables: never cut or leave out a column, whatever the width."),
    }
    for group, sub_app in (
        ("adapters", adapters_app),
        ("tenants", tenants_app),
        ("base-models", base_models_app),
    ):
        commands = typer.main.get_command(sub_app)
        assert isinstance(commands, typer.core.TyperGroup)
        for name, cmd in commands.commands.items():
            last = cmd.params[-len(shared) :]
            assert [p.name for p in last] == list(shared), f"{group} {name}"
            for p in last:
                assert (p.opts, getattr(p, "help", None)) == shared[p.name], f"{group} {name} {p.name}"
            assert "ctx" not in [p.name for p in cmd.params] and "opts" not in [p.name for p in cmd.params]


def test_table_cells() -> None:
    assert common.fmt("2026-11-29T08:40:06.167690Z") == "2026-11-29 08:40:06Z"
    assert common.fmt(None) == "-" and common.fmt(True) == "yes"
    assert common.fmt(["q_proj", "v_proj"]) == "q_proj, v_proj"
    assert common.fmt({"rpm": 1}) == '{"rpm":1}'
    assert common.human_bytes(34_200) == "33.4 KiB"
    assert common.normalise_version("3") == "v3" and common.normalise_version("v12") == "v12"


def test_register_by_reference_sends_source_uri(api: FakeAPI) -> None:
    api.on("POST", "/adapters/bot/versions", 201, {"adapter_id": "bot", "version": "v4", "files": []})
    res = run_cli(["adapters", "register", "bot", "s3://models/bot/v4/"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"source_uri": "s3://models/bot/v4/"}
    assert api.requests[-1].headers["content-type"] == "application/json"
    assert "registered bot v4 from s3://models/bot/v4/" in res.stdout
    api.on(
        "POST",
        "/adapters/bot/versions",
        422,
        {"error": {"code": "invalid_request", "message": "source_uri is outside LORAPLANE_ALLOWED_SOURCES"}},
    )
    res = run_cli(["adapters", "register", "bot", "s3://elsewhere/x/"])
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: 422 invalid_request: source_uri is outside LORAPLANE_ALLOWED_SOURCES"


VERSION = {
    "adapter_id": "bot",
    "version": "v2",
    "status": "ready",
    "rank": 4,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "v_proj"],
    "files": [],
    "storage_uri": "file:///x",
    "rollback_to": None,
    "quality_gate": "passed",
    "quality_gate_details": {"accuracy": 0.91},
    "created_by": "admin",
    "created_at": "2026-11-29T08:00:00Z",
}


def test_gate_sends_status_and_details(api: FakeAPI, tmp_path: Path) -> None:
    api.on("POST", "/adapters/bot/versions/v2/quality-gate", 200, VERSION)
    res = run_cli(["adapters", "gate", "bot", "2", "--status", "passed", "--details", '{"accuracy": 0.91}'])
    assert res.exit_code == 0, res.output
    assert api.requests[-1].url.path == "/admin/v1/adapters/bot/versions/v2/quality-gate"
    assert json.loads(api.bodies[-1]) == {"status": "passed", "details": {"accuracy": 0.91}}
    assert "bot v2 quality gate: passed" in res.stdout and "quality_gate_details" in res.stdout
    # details from a file; none at all; --json prints the version record
    report = tmp_path / "eval.json"
    report.write_text(json.dumps({"suite": "support", "scores": {"f1": 0.8}}))
    res = run_cli(["adapters", "gate", "bot", "v2", "--status", "failed", "--details", f"@{report}"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {
        "status": "failed",
        "details": {"suite": "support", "scores": {"f1": 0.8}},
    }
    res = run_cli(["adapters", "gate", "bot", "v2", "--status", "pending", "--json"])
    assert json.loads(api.bodies[-1]) == {"status": "pending"}
    assert json.loads(res.stdout) == VERSION
    # refused locally, nothing sent: bad status, missing status, details not a JSON object / unreadable
    n = len(api.requests)
    for args in (
        ["--status", "great"],
        [],
        ["--status", "passed", "--details", "[1, 2]"],
        ["--status", "passed", "--details", "{nope"],
        ["--status", "passed", "--details", f"@{tmp_path / 'missing.json'}"],
    ):
        res = run_cli(["adapters", "gate", "bot", "v2", *args])
        assert res.exit_code == 2, (args, res.output)
    assert len(api.requests) == n
    # an API error is one line, exit 1
    api.on(
        "POST",
        "/adapters/bot/versions/v9/quality-gate",
        404,
        {"error": {"code": "version_not_found", "message": "version v9 of adapter 'bot' not found"}},
    )
    res = run_cli(["adapters", "gate", "bot", "v9", "--status", "passed"])
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: 404 version_not_found: version v9 of adapter 'bot' not found"


def test_promote_force_and_gate_refusal(api: FakeAPI) -> None:
    api.on("POST", "/adapters/bot/versions/v3/promote", 200, {**ADAPTER, "id": "bot", "active_version": "v3"})
    promote = ("POST", "/adapters/bot/versions/v3/promote")
    res = run_cli(["adapters", "promote", "bot", "v3", "--force"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.body(*promote)) == {"force": True}
    assert "bot v3 is now active" in res.stdout
    run_cli(["adapters", "promote", "bot", "v3", "--canary", "10", "--force"])
    assert json.loads(api.body(*promote)) == {"canary_weight": 10, "force": True}
    run_cli(["adapters", "promote", "bot", "v3"])
    assert api.body(*promote) == b""  # no body, as before
    message = "version v3 has not passed its quality gate yet: record the result or promote with force"
    api.on(
        "POST",
        "/adapters/bot/versions/v3/promote",
        409,
        {
            "error": {
                "code": "quality_gate_pending",
                "message": message,
                "details": {"quality_gate": "pending"},
            }
        },
    )
    res = run_cli(["adapters", "promote", "bot", "v3"])
    assert res.exit_code == 1
    assert res.stderr.strip() == f"error: 409 quality_gate_pending: {message}"


def test_push_and_register_with_quality_gate(api: FakeAPI, tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "ad", rank=4)
    api.on("GET", "/adapters/bot", 200, {**ADAPTER, "id": "bot"})
    api.on("POST", "/adapters/bot/versions", 201, {**VERSION, "quality_gate": "pending"})
    res = run_cli(["adapters", "push", str(d), "-a", "bot", "--quality-gate", "pending"])
    assert res.exit_code == 0, res.output
    upload, body = api.requests[-1], api.bodies[-1]
    assert int(upload.headers["content-length"]) == len(body)
    parts = parse_multipart(body, upload.headers["content-type"])
    assert [(n, f) for n, f, _ in parts] == [
        ("quality_gate", ""),  # the text field goes first, before the files
        ("files", "adapter_config.json"),
        ("files", "adapter_model.safetensors"),
    ]
    assert parts[0][2] == b"pending"
    res = run_cli(["adapters", "push", str(d), "-a", "bot", "--quality-gate", "passed"])
    assert res.exit_code == 2  # only pending or skipped at upload, refused locally
    res = run_cli(["adapters", "register", "bot", "s3://models/bot/v4/", "--quality-gate", "pending"])
    assert res.exit_code == 0, res.output
    assert json.loads(api.bodies[-1]) == {"source_uri": "s3://models/bot/v4/", "quality_gate": "pending"}
    # the client without a gate sends no field
    api.on("POST", "/adapters/bot/versions/v2/quality-gate", 200, VERSION)
    with AdminClient("http://x", transport=httpx.MockTransport(api)) as admin:
        admin.upload_version("bot", d)
        parts = parse_multipart(api.bodies[-1], api.requests[-1].headers["content-type"])
        assert [n for n, _, _ in parts] == ["files", "files"]
        admin.set_quality_gate("bot", "v2", "passed", details={"accuracy": 1.0})
        assert json.loads(api.bodies[-1]) == {"status": "passed", "details": {"accuracy": 1.0}}
