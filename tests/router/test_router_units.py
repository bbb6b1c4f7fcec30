"""Unit tests of the router's pure parts: vLLM driver parsing/classification, rewrite, usage, names."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from router.drivers.vllm import VllmDriver, classify_load
from router.forwarding import error_event, make_rewriter, parse_usage
from router.settings import PoolConfig, RouterSettings
from router.staging import StagingError, inside
from router.store import parse_lora_name

METRICS = """# HELP vllm:num_requests_running x
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo-base"} 3.0
vllm:num_requests_running{engine="1",model_name="demo-base"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo-base"} 2.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="demo-base",reason="capacity"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="demo-base",reason="deferred"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="demo-base"} 0.25
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="a,b",waiting_lora_adapters="a"} 1.79593529e+09
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.795935295541919e+09
"""


async def test_parse_metrics_takes_latest_lora_sample_and_sums_engines() -> None:
    async with aiohttp.ClientSession() as s:
        m = VllmDriver(s).parse_metrics(METRICS)
    assert m.running == 4
    assert m.waiting == 2
    assert m.waiting_by_reason == {"capacity": 0, "deferred": 2}
    assert m.kv_cache_usage == pytest.approx(0.25)
    # The stale series (older timestamp) listed fs_lora; the latest lists nothing.
    assert m.lora_running == ()
    assert m.lora_waiting == ()
    assert m.max_lora == 1


async def test_parse_metrics_garbage_is_empty() -> None:
    async with aiohttp.ClientSession() as s:
        m = VllmDriver(s).parse_metrics("this is { not prometheus")
    assert m.running == 0 and m.lora_running == ()


@pytest.mark.parametrize(
    ("status", "body", "failure", "elsewhere"),
    [
        (200, b"Success: LoRA adapter 'x' added successfully.", None, False),
        (
            404,
            b'{"error":{"message":"Loading lora x failed: No adapter found for <path>",'
            b'"type":"NotFoundError",'
            b'"param":null,"code":404}}',
            "not_found",
            True,
        ),
        (404, b'{"detail":"Not Found"}', "rejected", True),  # runtime loading off on that replica
        (
            500,
            b'{"error":{"message":"Call to add_lora method failed: LoRA rank 32 is greater than '
            b'max_lora_rank 16.",'
            b'"type":"InternalServerError","param":null,"code":500}}',
            "rejected",
            True,  # another replica may have a larger --max-lora-rank
        ),
        (500, b"Internal Server Error", "other", True),  # not vLLM's answer: a sick replica
        (
            500,
            b'{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}',
            "other",
            True,
        ),
        (
            400,
            b'{"error":{"message":"The lora adapter \'x\' has already been loaded.",'
            b'"type":"InvalidUserInput",'
            b'"param":null,"code":400}}',
            "conflict",
            True,
        ),
        (503, b"", "replica_down", True),
    ],
)
def test_classify_load(status: int, body: bytes, failure: str | None, elsewhere: bool) -> None:
    res = classify_load(status, body)
    assert res.ok == (failure is None)
    assert res.failure == failure
    if failure is not None:
        assert res.retry_elsewhere == elsewhere


def test_rewriter_replaces_model_and_detects_wrong_answer() -> None:
    rw = make_rewriter("acme@v1-0123abcd", 'demo-base:acme "quoted"')
    body = b'{"id":"x","object":"chat.completion","model":"acme@v1-0123abcd","choices":[]}'
    out, wrong = rw.rewrite(body)
    assert wrong is None
    assert out == b'{"id":"x","object":"chat.completion","model":"demo-base:acme \\"quoted\\"","choices":[]}'
    _out2, wrong2 = rw.rewrite(body.replace(b"acme@v1-0123abcd", b"other@v2-ffffffff"))
    assert wrong2 == b"other@v2-ffffffff"
    # content that mentions a model in a string is escaped JSON and is not touched
    tricky = b'{"model":"acme@v1-0123abcd","content":"\\"model\\":\\"zzz\\""}'
    out3, wrong3 = rw.rewrite(tricky)
    assert wrong3 is None and b"zzz" in out3


def test_parse_usage_and_error_event() -> None:
    u = parse_usage(b'{"choices":[],"usage":{"prompt_tokens":17,"total_tokens":20,"completion_tokens":3}}')
    assert u is not None and (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (17, 3, 20)
    assert parse_usage(b'{"choices":[]}') is None
    ev = error_event("boom")
    assert ev.startswith(b'data: {"error":') and ev.endswith(b"data: [DONE]\n\n")


def test_lora_names() -> None:
    assert parse_lora_name("acme@v12-0123abcd") == ("acme", "v12")
    for bad in ("acme", "acme@v1", "../x@v1-0123abcd", "acme@v0-0123abcd", "a..b@v1-0123abcd", "acme@v1-XYZ"):
        assert parse_lora_name(bad) is None


def test_inside_refuses_escapes(tmp_path: Path) -> None:
    root = tmp_path / "staging"
    root.mkdir()
    assert inside(root, root / "a@v1-0123abcd") == (root / "a@v1-0123abcd").resolve()
    for bad in (root / ".." / "x", root, Path("/etc/passwd")):
        with pytest.raises(StagingError):
            inside(root, bad)
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(StagingError):
        inside(root, root / "link" / "x")


def test_settings_pools_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "LORAPLANE_POOLS",
        '[{"name":"p","base_model":"demo-base","urls":["http://127.0.0.1:1/"],"max_loras":2,"max_adapters":1,'
        '"staging":{"mode":"agent","url_template":"http://{host}:9090","token":"s3cret"}}]',
    )
    s = RouterSettings()
    pool = s.pools[0]
    assert pool.urls == ["http://127.0.0.1:1"]
    assert pool.max_adapters == 2  # never below max_loras
    assert pool.served_name == "demo-base"
    assert pool.staging.mode == "agent" and pool.staging.token is not None
    assert pool.staging.token.get_secret_value() == "s3cret"
    with pytest.raises(ValueError):
        PoolConfig(urls=["http://a:1"], dns="b:2")


async def test_outliers_are_replicas_failing_for_more_than_one_model() -> None:
    """One adapter that keeps failing (a bad version, a canary's 5xx) never ejects the replica
    from every other adapter; failures for two models, or without an answer, do."""
    from prometheus_client import CollectorRegistry

    from router.metrics import RouterMetrics
    from router.store import ReplicaState, ReplicaStore

    pool = PoolConfig(name="p", base_model="demo-base", urls=["http://10.0.0.9:8000"])
    settings = RouterSettings(pools=[pool], outlier_failures=3, outlier_cooloff_s=60)
    store = ReplicaStore(
        settings, {}, clock=lambda: 100.0, wall=lambda: 100.0, metrics=RouterMetrics(CollectorRegistry())
    )
    rep = ReplicaState(url="http://10.0.0.9:8000", pool=pool, driver=None, healthy=True)  # type: ignore[arg-type]
    for _ in range(10):
        store.note_failure(rep, "replica answered HTTP 500", "bad@v2-00000000")
    assert rep.healthy
    store.note_failure(rep, "replica answered HTTP 500", "other@v1-00000000")
    assert not rep.healthy and rep.ejected_until == 160.0
    rep.healthy = True
    store.note_success(rep)
    for _ in range(2):
        store.note_failure(rep, "connection reset")
    assert rep.healthy
    store.note_failure(rep, "first-byte timeout")
    assert not rep.healthy


def test_a_poll_answer_asked_before_an_unload_does_not_bring_the_adapter_back() -> None:
    """The soak's phantom residents: a ``/v1/models`` answer asked before an unload and applied
    after it must not re-add the unloaded adapter (requests would go to a replica that lacks it);
    an answer asked after the unload that lists it (loaded by someone else) still does."""
    from prometheus_client import CollectorRegistry

    from router.drivers.base import ModelsInfo
    from router.metrics import RouterMetrics
    from router.store import ReplicaState, ReplicaStore

    now = [100.0]
    pool = PoolConfig(name="p", base_model="demo-base", urls=["http://10.0.0.9:8000"])
    store = ReplicaStore(
        RouterSettings(pools=[pool]),
        {},
        clock=lambda: now[0],
        wall=lambda: now[0],
        metrics=RouterMetrics(CollectorRegistry()),
    )
    rep = ReplicaState(url="http://10.0.0.9:8000", pool=pool, driver=None, healthy=True)  # type: ignore[arg-type]
    name = "x@v1-00000001"
    listing = ModelsInfo(base_names=("demo-base",), adapters={name: "/staging/x"})
    store.reconcile(rep, listing, asked_at=now[0])
    assert rep.residents[name].state == "resident"
    asked = now[0] = 101.0  # a poll asks; the replica still lists x
    now[0] = 101.5
    store.note_gone(rep, name)  # the unload finishes meanwhile
    rep.residents.pop(name)
    now[0] = 102.0
    store.reconcile(rep, listing, asked_at=asked)  # the older answer arrives
    assert name not in rep.residents
    store.reconcile(rep, listing, asked_at=now[0])  # asked after the unload: it really is there
    assert rep.residents[name].state == "resident"
