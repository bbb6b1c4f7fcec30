"""Simulated behaviours: strict validation, glob lookup, the --behaviours flag and
LORAPLANE_SIM_BEHAVIOURS on real simulator processes, ``loraplane up --sim-behaviours``, and the
conformance key-set checker catching the keys the simulator used to send."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import pytest

from simulator.behaviours import Behaviour, BehaviourError, load_behaviours, parse_behaviours
from simulator.conformance_keys import CHAT_BODY, COMPLETION_BODY, ERROR_BODY, key_diffs, stream_reference
from simulator.procs import simulators

MakeAdapter = Callable[..., str]
REPO = Path(__file__).resolve().parents[2]


def _problems(obj: object) -> list[str]:
    with pytest.raises(BehaviourError) as info:
        parse_behaviours(obj)
    return info.value.problems


def test_every_problem_is_listed() -> None:
    problems = _problems(
        {
            "support@v2-*": {"error_rate": 1.5, "refusal_rate": -0.1, "latency": 2, "stream_error_rate": 2},
            "a[bc": {},
            "b[]": {},
            "": {},
            "c": {"latency_factor": 0.5, "output": "xml"},
            "d": {"error_rate": True, "latency_factor": "fast"},
            "e": "broken",
            " f*": {},
            "g\n": {},
        }
    )
    text = "\n".join(problems)
    for needle in (
        "error_rate must be in [0, 1], got 1.5",
        "refusal_rate must be in [0, 1], got -0.1",
        "stream_error_rate must be in [0, 1], got 2",
        "unknown key(s) ['latency']",
        "'a[bc': '[' at position 1 is never closed",
        "'b[]': '[' at position 1 is never closed",  # fnmatch reads a leading ']' as a member
        "an empty key matches no adapter",
        "latency_factor must be in [1, 1000]",
        "output must be one of ['text', 'json', 'broken_json'], got \"xml\"",
        "error_rate must be a number in [0, 1], got true",
        'latency_factor must be a number, got "fast"',
        '["e"] must be an object',
        "key ' f*' has leading or trailing whitespace",
        "key 'g\\n' holds a control character",
    ):
        assert needle in text, (needle, problems)
    assert len(problems) == 14
    assert _problems([{"x": {}}]) == ["behaviours must be a JSON object (glob -> behaviour), got list"]


def test_defaults_and_lookup_order() -> None:
    rules = parse_behaviours(
        {
            "support@*": {"refusal_rate": 0.5},
            "support@v2-*": {"error_rate": 0.1},
            "support@v2-abc": {"output": "json"},
            "[!x]ase": {"latency_factor": 3},
        }
    )
    assert rules.lookup("support@v2-abc") == Behaviour(output="json")  # an exact key wins
    assert rules.lookup("support@v2-def") == Behaviour(refusal_rate=0.5)  # else the first glob in order
    assert rules.lookup("billing@v1-x") is None
    assert rules.lookup("base") == Behaviour(latency_factor=3.0) and rules.lookup("xase") is None
    assert parse_behaviours({"a": {}}).lookup("a") == Behaviour() and Behaviour().healthy
    assert not parse_behaviours(None) and not load_behaviours("  ")


def test_load_inline_or_file(tmp_path: Path) -> None:
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"x@v1-*": {"error_rate": 0.25}}))
    assert load_behaviours(str(f)).lookup("x@v1-9") == Behaviour(error_rate=0.25)
    assert load_behaviours(' {"y": {"output": "broken_json"}}').lookup("y") == Behaviour(output="broken_json")
    with pytest.raises(BehaviourError, match="cannot read behaviours file"):
        load_behaviours(str(tmp_path / "missing.json"))
    with pytest.raises(BehaviourError, match="not valid JSON"):
        load_behaviours('{"y": ')


def _flat(text: str) -> str:
    """Typer's error box without its frame and line breaks."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _run_sim(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    r = subprocess.run(
        [sys.executable, "-m", "simulator", "--port", "1", *args],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    return r.returncode, _flat(r.stderr)


def test_bad_behaviours_stop_the_simulator_at_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"v2-*": {"error_rate": 2}}))
    rc, err = _run_sim(["--behaviours", str(bad)], {})
    assert rc == 2 and "error_rate must be in [0, 1], got 2" in err
    rc, err = _run_sim([], {"LORAPLANE_SIM_BEHAVIOURS": '{"v2-*": {"output": "yaml"}}'})
    assert rc == 2 and "output must be one of" in err


def _statuses(url: str, model: str, n: int = 20) -> set[int]:
    with httpx.Client(base_url=url, timeout=30) as c:
        return {
            c.post(
                "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2, "seed": s}
            ).status_code
            for s in range(n)
        }


def test_flag_and_env_reach_real_processes(make_adapter: MakeAdapter, tmp_path: Path) -> None:
    a, b = make_adapter("a", seed=1), make_adapter("b", seed=2)
    f = tmp_path / "beh.json"
    f.write_text(json.dumps({"svc@v2-*": {"error_rate": 1}}))
    env = {"LORAPLANE_SIM_BEHAVIOURS": '{"svc@v1-*": {"error_rate": 1}}'}
    with (
        simulators(
            1, extra_args=["--zero-latency", "--behaviours", str(f)], env=env, ready_timeout=60
        ) as flag,
        simulators(1, extra_args=["--zero-latency"], env=env, ready_timeout=60) as from_env,
    ):
        for procs, failing, healthy in ((flag, "svc@v2-x", "svc@v1-x"), (from_env, "svc@v1-x", "svc@v2-x")):
            url = procs[0].url
            for name, path in ((failing, a), (healthy, b)):
                r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
                assert r.status_code == 200, r.text
            assert _statuses(url, failing) == {500}
            assert _statuses(url, healthy) == {200}


def test_up_rejects_bad_sim_behaviours_before_starting(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loraplane.cli", "up", "--data-dir", str(tmp_path / "d"),
         "--sim-behaviours", '{"x": {"refusal_rate": 3}}'],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    err = _flat(r.stderr)
    assert "--sim-behaviours" in err and "refusal_rate must be in [0, 1], got 3" in err, err
    assert not (tmp_path / "d").exists()  # nothing was started or written


def test_key_checker_catches_the_keys_the_simulator_used_to_send() -> None:
    old_chat = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
            "message": {"role": "assistant", "content": "x", "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "tool_calls": [], "reasoning_content": None},
        }],
        "service_tier": None, "system_fingerprint": "f",
        "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1,
                  "prompt_tokens_details": None},
        "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None,
    }  # fmt: skip
    diffs = "\n".join(key_diffs(old_chat, CHAT_BODY))
    assert "<top>: missing ['ec_transfer_params', 'metrics', 'prompt_text']" in diffs
    assert "choices[]: missing ['routed_experts']" in diffs
    assert "choices[].message: missing ['reasoning'], extra ['reasoning_content', 'tool_calls']" in diffs
    assert "usage: missing ['completion_tokens_details']" in diffs
    # a finish chunk without system_fingerprint when no usage chunk follows; a nested object vLLM never sends
    ref = stream_reference(chat=False, include_usage=False, continuous=False)
    finish = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "text": "", "logprobs": {"x": 1}, "finish_reason": "length",
                           "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]}  # fmt: skip
    assert key_diffs(finish, ref["finish"]) == [
        "<top>: missing ['system_fingerprint'], extra []",
        "choices[].logprobs: an object vLLM does not send here (keys ['x'])",
    ]


def test_key_reference_equals_vllms_own_models() -> None:
    """``vllm-0.32-keys.json`` is generated from vLLM 0.32's pydantic models
    (``data/vllm_keys_reference.py``); the conformance script's reference must say the same."""
    want = json.loads((Path(__file__).parent / "data" / "vllm-0.32-keys.json").read_text())

    def as_lists(ref: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
        return {path: sorted(keys) for path, keys in ref.items()}

    ours: dict[str, object] = {
        "chat": as_lists(CHAT_BODY),
        "completion": as_lists(COMPLETION_BODY),
        "error": as_lists(ERROR_BODY),
    }
    for label, (inc, cont) in (
        ("plain", (False, False)),
        ("include_usage", (True, False)),
        ("continuous", (True, True)),
    ):
        for name, chat in (("chat", True), ("completion", False)):
            ref = stream_reference(chat, inc, cont)
            ours[f"{name}_stream_{label}"] = {kind: as_lists(keys) for kind, keys in ref.items()}
    assert ours == want
