"""An operator's day with the real CLI against a real `loraplane up` (issue 25.3–25.8, 24.15).

One `up --demo --admin-port P --data-dir dd3` (not the default port, not the default data dir)
started in one directory; every CLI call is a separate `python -m loraplane.cli` process, most of
them from *another* directory, as a newcomer types them:

- `up` saves the CLI context `local` (URL with the right port, file mode 0600) and records its URL
  next to the token in the data dir; the CLI finds the platform from any directory;
- `up` logs in one format, each line once;
- tables at COLUMNS=80 keep ids and versions whole; through a pipe every value is whole;
- the audit log reads newest first: `--limit 8` starts with the rollback just made;
- `push` to an adapter that does not exist fails before uploading, with the `--base` hint;
  `promote` of an adapter no tenant is granted says so and shows `tenants grant`;
- `base-models add --config DIR` reads the module shapes from config.json;
- the global `--context` goes before the subcommand; a 401 says how to log in.

And `up` on a busy port says so in one line; SIGTERM under `up` lets a stream finish within
LORAPLANE_DRAIN_S (before, uvicorn's 5 s graceful timeout cut it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kit.procs import ManagedProcess, free_port, log_ready
from registry.adapter_factory import write_adapter

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-up-day")]


@dataclass
class Platform:
    root: Path
    admin_url: str
    gateway_url: str
    data_dir: Path
    config_dir: Path
    log: Path
    elsewhere: Path
    key: str

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a new shell: no loraplane variables, this test's config dir."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
        env.update({"XDG_CONFIG_HOME": str(self.config_dir), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
        env.pop("COLUMNS", None)
        env.update(extra)
        return env

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``loraplane ARGS`` in a new process, from another directory than up's."""
        return subprocess.run(
            [sys.executable, "-m", "loraplane.cli", *args],
            cwd=self.elsewhere, env=self.env(**env), capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def ok(self, *args: str, **env: str) -> str:
        res = self.cli(*args, **env)
        assert res.returncode == 0, f"{args}: {res.stdout}\n{res.stderr}"
        return res.stdout


def _env_for_up(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    env.update({"XDG_CONFIG_HOME": str(root / "config"), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def plat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    root = tmp_path_factory.mktemp("up-day")
    work, elsewhere = root / "work", root / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--replicas", "1", "--data-dir", "dd3"]
    argv += ["--port", str(port), "--admin-port", str(admin_port)]
    log = root / "up.log"
    proc = ManagedProcess(argv, env=_env_for_up(root), cwd=work, log_path=log, name="loraplane up").start()
    try:
        proc.wait_ready(log_ready(log, "loraplane is up"), 240)
        key = json.loads((work / "dd3" / "demo_key.json").read_text())["key"]
        yield Platform(
            root, f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{port}", work / "dd3",
            root / "config", log, elsewhere, key,
        )  # fmt: skip
    finally:
        proc.stop()


def test_up_saves_a_local_context_the_cli_uses_from_any_directory(plat: Platform) -> None:
    cfg = plat.config_dir / "loraplane" / "contexts.json"
    saved = json.loads(cfg.read_text())
    assert saved["current"] == "local"
    assert saved["contexts"]["local"]["url"] == plat.admin_url  # the --admin-port, not 8081
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert (plat.data_dir / "admin_url").read_text().strip() == plat.admin_url
    assert f"CLI context 'local' saved in {cfg}" in plat.log.read_text()
    # from another directory, nothing set: the adapters of this platform (before: 401)
    out = plat.ok("adapters", "list")
    assert "demo-support" in out and "demo-sql" in out
    me = plat.ok("whoami")
    assert f"you are bootstrap (admin) at {plat.admin_url} (context local)" in me
    # with no saved context, LORAPLANE_DATA_DIR=dd3 finds the token *and* the URL up recorded
    # (before, dd3's token went to port 8081)
    me = plat.ok("whoami", XDG_CONFIG_HOME=str(plat.root / "empty"), LORAPLANE_DATA_DIR=str(plat.data_dir))
    assert f"you are bootstrap (admin) at {plat.admin_url} (local up (" in me


def test_up_logs_in_one_format_each_line_once(plat: Platform) -> None:
    lines = [ln for ln in plat.log.read_text().splitlines() if ln.strip()]
    logs = [ln for ln in lines if ln.startswith("{")]
    assert logs and all(json.loads(ln)["level"] for ln in logs)  # JSON lines …
    assert not [ln for ln in lines if ln.startswith(("INFO:", "WARNING:", "ERROR:"))]  # … never uvicorn's own
    messages = [
        (e["logger"], e["msg"], json.dumps({k: v for k, v in e.items() if k != "ts"}, sort_keys=True))
        for e in map(json.loads, logs)
    ]
    repeated = {m for m in messages if messages.count(m) > 1}
    assert not repeated, repeated  # e.g. "Started server process" once per server before
    banner = [ln for ln in lines if not ln.startswith("{")]  # up's own lines: addresses, token, demo
    assert len(banner) == len(set(banner)), banner
    assert sum("admin API http://" in ln for ln in banner) == 1


def test_tables_fit_80_columns_and_pipes_get_whole_values(plat: Platform) -> None:
    d = write_adapter(plat.root / "long", seed=5, rank=8, target_modules=("q_proj", "v_proj"))
    long_id = "support-assistant-eu-west"
    desc = "Answers support tickets for the EU region, trained on 3 years of tickets"
    plat.ok("adapters", "push", str(d), "--adapter", long_id, "--base", "demo-base", "--description", desc)
    for args in (
        ["adapters", "list"],
        ["adapters", "versions", long_id],
        ["adapters", "audit", "--limit", "5"],
    ):
        out = plat.ok(*args, COLUMNS="80")
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert all(len(ln) <= 80 for ln in lines), "\n".join(lines)
        if args[1] == "list":
            row = next(ln for ln in lines if ln.startswith(long_id))
            assert row.split()[0] == long_id and "…" in row  # id whole, description cut
    piped = plat.ok("adapters", "list")  # stdout is a pipe here, no COLUMNS
    row = next(ln for ln in piped.splitlines() if ln.startswith(long_id))
    assert "trained on 3 years of tickets" in row and "demo-base" in row
    wide = plat.ok("adapters", "list", "--wide", COLUMNS="80")
    assert "trained on 3 years of tickets" in wide
    as_json = json.loads(plat.ok("adapters", "list", "--json", COLUMNS="80"))
    assert long_id in [a["id"] for a in as_json]


def test_audit_newest_first_shows_the_rollback_just_made(plat: Platform) -> None:
    d = write_adapter(plat.root / "v2", seed=9, rank=8, target_modules=("q_proj", "v_proj"))
    plat.ok("adapters", "push", str(d), "--adapter", "demo-sql")
    plat.ok("adapters", "promote", "demo-sql", "v2", "--canary", "10")
    plat.ok("adapters", "promote", "demo-sql", "v2")
    plat.ok("adapters", "rollback", "demo-sql")
    out = plat.ok("adapters", "audit", "--limit", "8")
    rows = [ln for ln in out.splitlines()[2:] if ln.strip()]
    assert len(rows) == 8 and "adapter.rolled_back" in rows[0], out
    events = json.loads(plat.ok("adapters", "audit", "--limit", "8", "--json"))
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
    oldest = json.loads(plat.ok("adapters", "audit", "--limit", "3", "--oldest-first", "--json"))
    assert oldest[0]["action"] == "base_model.created"


def test_push_to_a_missing_adapter_fails_before_uploading(plat: Platform) -> None:
    d = plat.root / "big"
    write_adapter(d, seed=3, rank=64, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    res = plat.cli("adapters", "push", str(d), "--adapter", "nope")
    assert res.returncode == 1
    assert "adapter 'nope' does not exist: nothing was uploaded. Pass --base BASE" in res.stderr
    assert "push nope" not in res.stderr  # no progress bar: not a byte was sent
    events = json.loads(plat.ok("adapters", "audit", "--subject-id", "nope", "--json"))
    assert events == []


def test_promote_says_when_no_tenant_is_granted(plat: Platform) -> None:
    d = write_adapter(plat.root / "fresh", seed=4, rank=8, target_modules=("q_proj", "v_proj"))
    plat.ok("adapters", "push", str(d), "--adapter", "fresh", "--base", "demo-base")
    res = plat.cli("adapters", "promote", "fresh", "v1")
    assert res.returncode == 0, res.stderr
    assert (
        "no tenant is granted fresh yet, so requests for demo-base:fresh get 404 model_not_found"
        in res.stderr
    )
    assert "loraplane tenants grant TENANT fresh" in res.stderr
    plat.ok("tenants", "grant", "demo", "fresh")
    d2 = write_adapter(plat.root / "fresh2", seed=6, rank=8, target_modules=("q_proj", "v_proj"))
    plat.ok("adapters", "push", str(d2), "--adapter", "fresh")
    res = plat.cli("adapters", "promote", "fresh", "v2")
    assert res.returncode == 0 and "no tenant is granted" not in res.stderr
    r = httpx.post(
        f"{plat.gateway_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {plat.key}"},
        json={"model": "demo-base:fresh", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def test_ending_a_canary_and_re_enabling_a_version_through_the_cli_against_up(plat: Platform) -> None:
    """Issue 25.1–2 with the real CLI against a real ``up``: end a canary (active untouched,
    idempotent), rollback while a canary runs keeps the active version, and a disabled version
    comes back to ready; the gateway serves the active version throughout."""
    for i, seed in enumerate((11, 12, 13), start=1):
        d = write_adapter(plat.root / f"life{i}", seed=seed, rank=8, target_modules=("q_proj", "v_proj"))
        plat.ok(
            "adapters", "push", str(d), "--adapter", "lifecli", *(("--base", "demo-base") if i == 1 else ())
        )
    plat.ok("adapters", "promote", "lifecli", "v1")
    plat.ok("tenants", "grant", "demo", "lifecli")
    plat.ok("adapters", "promote", "lifecli", "v2", "--canary", "10")
    assert "lifecli: canary v2 ended; no canary (active v1)" in plat.ok(
        "adapters", "canary", "lifecli", "--clear"
    )
    assert "lifecli: no canary (active v1)" in plat.ok("adapters", "canary", "lifecli", "--clear")
    plat.ok("adapters", "promote", "lifecli", "v3", "--canary", "20")
    assert "lifecli rolled back; active version: v1" in plat.ok("adapters", "rollback", "lifecli")
    plat.ok("adapters", "disable-version", "lifecli", "v2")
    assert "lifecli v2 enabled (ready)" in plat.ok("adapters", "enable-version", "lifecli", "v2")
    shown = json.loads(plat.ok("adapters", "versions", "lifecli", "v2", "--json"))
    assert shown["status"] == "ready"
    deadline = time.monotonic() + 10
    while True:  # the gateway has the grant and serves v1 (no canary left)
        r = httpx.post(
            f"{plat.gateway_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {plat.key}"},
            json={
                "model": "demo-base:lifecli",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            timeout=60,
        )
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200 and r.headers["x-loraplane-adapter-version"] == "v1", r.text


def test_base_models_add_from_config_json(plat: Platform) -> None:
    model = plat.root / "llama-mini"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "_name_or_path": "my-org/llama-mini"})
    )  # fmt: skip
    plat.ok("base-models", "add", "llama-mini", "--config", str(model), "--max-lora-rank", "32")
    shown = json.loads(plat.ok("base-models", "show", "llama-mini", "--json"))
    assert shown["hf_id"] == "my-org/llama-mini" and shown["module_shapes"]["k_proj"] == [512, 256]
    assert shown["module_shapes"]["down_proj"] == [1376, 512] and len(shown["target_modules"]) == 7


def test_global_context_and_the_401_hint(plat: Platform) -> None:
    out = plat.ok("--context", "local", "adapters", "list", "--json")
    assert "demo-support" in out
    res = plat.cli("--context", "prod", "adapters", "list")
    assert res.returncode == 1 and "no context 'prod'" in res.stderr
    # a new shell with nothing saved: the 401 says how to log in
    res = plat.cli(
        "adapters", "list", XDG_CONFIG_HOME=str(plat.root / "nothing"), LORAPLANE_ADMIN_URL=plat.admin_url
    )
    assert res.returncode == 1
    assert res.stderr.splitlines()[0] == "error: 401 unauthorized: missing bearer token"
    assert f"loraplane login --url {plat.admin_url} --token" in res.stderr
    # the prod-like context's token never goes to this platform's URL
    cfg = plat.root / "prodcfg"
    (cfg / "loraplane").mkdir(parents=True)
    (cfg / "loraplane" / "contexts.json").write_text(
        json.dumps(
            {"current": "prod", "contexts": {"prod": {"url": "https://prod.example", "token": "lpa-x"}}}
        )
    )
    res = plat.cli("adapters", "list", XDG_CONFIG_HOME=str(cfg), LORAPLANE_ADMIN_URL=plat.admin_url)
    assert res.returncode == 1 and f"no saved token for {plat.admin_url}" in res.stderr


def test_up_on_a_busy_port_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for flags, flag, what in (
            (["--port", str(port), "--admin-port", str(free_port())], "--port", "gateway"),
            (["--port", str(free_port()), "--admin-port", str(port)], "--admin-port", "admin API"),
        ):
            res = subprocess.run(
                [sys.executable, "-m", "loraplane.cli", "up", "--data-dir", str(tmp_path / "d"), *flags],
                cwd=tmp_path, env=_env_for_up(tmp_path), capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert res.returncode == 1
            assert res.stderr.strip().splitlines() == [
                f"error: port {port} ({what}) on 127.0.0.1 is in use: stop what listens there, or pick "
                f"another port with {flag} N"
            ], res.stderr
            assert "Traceback" not in res.stdout + res.stderr


def test_sigterm_under_up_lets_a_stream_finish_within_drain_s(tmp_path: Path) -> None:
    """LORAPLANE_DRAIN_S=20 and a stream of ~8 s: SIGTERM 1 s in, the stream ends with every token
    and [DONE], /readyz says draining meanwhile, and `up` exits 0 once it is done (before: cut
    5 s after SIGTERM by uvicorn's graceful timeout)."""
    port, admin_port = free_port(), free_port()
    slow = json.dumps({"demo-sql@*": {"latency_factor": 12}})
    argv = [sys.executable, "-m", "loraplane.cli", "up", "--demo", "--replicas", "1", "--data-dir", "d"]
    argv += ["--port", str(port), "--admin-port", str(admin_port), "--sim-behaviours", slow]
    env = _env_for_up(tmp_path, LORAPLANE_DRAIN_S="20")
    log = tmp_path / "up.log"
    proc = ManagedProcess(argv, env=env, cwd=tmp_path, log_path=log, name="loraplane up").start()
    try:
        proc.wait_ready(log_ready(log, "loraplane is up"), 240)
        key = json.loads((tmp_path / "d" / "demo_key.json").read_text())["key"]
        body = {"model": "demo-base:demo-sql", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 60, "stream": True}  # fmt: skip
        chunks: list[str] = []
        url = f"http://127.0.0.1:{port}"
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {key}"}) as r:  # fmt: skip
            assert r.status_code == 200
            lines = r.iter_lines()
            t0 = time.monotonic()
            for line in lines:
                if line.startswith("data: "):
                    chunks.append(line[6:])
                if time.monotonic() - t0 > 1.0:
                    break
            proc.signal(signal.SIGTERM)
            t_term = time.monotonic()
            time.sleep(0.3)
            ready = httpx.get(f"{url}/readyz", timeout=5)
            assert ready.status_code == 503, ready.text
            for line in lines:
                if line.startswith("data: "):
                    chunks.append(line[6:])
        t_done = time.monotonic()
        rc = proc.wait(30)
        t_exit = time.monotonic()
    finally:
        proc.stop()
    assert chunks[-1] == "[DONE]", chunks[-3:]
    events = [json.loads(c) for c in chunks[:-1]]
    assert not [e for e in events if "error" in e], events[-2:]
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    assert len([p for p in pieces if p]) == 60, pieces  # every token of max_tokens
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "length"
    assert t_done - t_term > 5.5, "the stream should have outlived uvicorn's 5 s graceful timeout"
    assert rc == 0 and t_exit - t_term < 25
