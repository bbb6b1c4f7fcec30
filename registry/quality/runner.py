"""The evaluation runner (SPEC §16): every case of the regression set through the gateway for
each arm (``base``, ``current`` when there is an active version other than the candidate,
``candidate``), ``temperature`` 0 and a fixed ``seed``, at most ``eval_concurrency`` requests in
flight; then the figures of :mod:`registry.quality.results`.

Chat cases (``messages``) go to ``/v1/chat/completions``, ``prompt`` cases to
``/v1/completions``. A request the gateway answers with an error counts as a failed case of that
arm (its error recorded); a gateway that cannot be reached at all aborts the run
(:class:`GatewayUnreachable`), since no figure would mean anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from registry.quality.check_pool import CheckPool
from registry.quality.results import ARMS, Answer, arm_stats, pairwise, verdict
from registry.quality.service import RunPlan


class GatewayUnreachable(Exception):
    """The gateway could not be reached (connection refused, DNS): the run cannot go on."""


class KeyNotAccepted(Exception):
    """The gateway did not accept the run's fresh tenant key in time."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    gateway_url: str
    concurrency: int
    seed: int
    max_tokens: int
    request_timeout_s: float
    key_wait_s: float


Progress = Callable[[int], Awaitable[None]]


def _error_text(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error") or {}
        return (
            f"{resp.status_code} {err.get('code') or err.get('type') or 'error'}: {err.get('message', '')}"[
                :500
            ]
        )
    except (ValueError, AttributeError):
        return f"{resp.status_code}: {resp.text[:200]}"


def _output_of(body: Any, chat: bool) -> str | None:
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        return None
    return text if isinstance(text, str) else ""


async def wait_for_key(client: httpx.AsyncClient, cfg: RunConfig, key: str) -> None:
    """Until the gateway accepts ``key`` (it learns of new keys through the change feed)."""
    deadline = time.monotonic() + cfg.key_wait_s
    last = ""
    while True:
        try:
            resp = await client.get(
                f"{cfg.gateway_url}/v1/models", headers={"authorization": f"Bearer {key}"}
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise GatewayUnreachable(
                f"cannot reach the gateway at {cfg.gateway_url}: {e or type(e).__name__}"
            ) from e
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
        else:
            if resp.status_code == 200:
                return
            last = _error_text(resp)
        if time.monotonic() > deadline:
            raise KeyNotAccepted(
                f"the gateway at {cfg.gateway_url} did not accept the evaluator's key: {last}"
            )
        await asyncio.sleep(0.2)


async def ask(
    client: httpx.AsyncClient, cfg: RunConfig, key: str, model: str, case: dict[str, Any]
) -> Answer:
    chat = "messages" in case
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": case.get("max_tokens") or cfg.max_tokens,
        "temperature": 0,
        "seed": cfg.seed,
    }
    if chat:
        body["messages"] = case["messages"]
    else:
        body["prompt"] = case["prompt"]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.perf_counter()
    try:
        resp = await client.post(
            f"{cfg.gateway_url}{path}", json=body, headers={"authorization": f"Bearer {key}"}
        )
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise GatewayUnreachable(
            f"cannot reach the gateway at {cfg.gateway_url}: {e or type(e).__name__}"
        ) from e
    except httpx.TimeoutException:
        return Answer(None, None, f"timed out after {cfg.request_timeout_s:g} s")
    except httpx.HTTPError as e:
        return Answer(None, None, f"{type(e).__name__}: {e}"[:500])
    latency = (time.perf_counter() - t0) * 1000
    if resp.status_code != 200:
        return Answer(None, latency, _error_text(resp))
    try:
        output = _output_of(resp.json(), chat)
    except ValueError:
        output = None
    if output is None:
        return Answer(None, latency, "the gateway's answer has no choices[0] text")
    return Answer(output, latency, None)


async def run_arms(
    client: httpx.AsyncClient,
    cfg: RunConfig,
    key: str,
    plan: RunPlan,
    progress: Progress,
    checks: CheckPool,
) -> dict[str, list[Answer]]:
    """Every case for every arm that has a model; ``progress(done)`` after each request."""
    arms = [a for a in ARMS if plan.models.get(a)]
    out: dict[str, list[Answer]] = {a: [Answer(None, None, "not run")] * len(plan.cases) for a in arms}
    gate = asyncio.Semaphore(cfg.concurrency)
    done = 0

    async def one(arm: str, i: int) -> None:
        nonlocal done
        case = plan.cases[i]
        model = plan.models[arm]
        assert model is not None
        async with gate:
            ans = await ask(client, cfg, key, model, case)
        # in a worker process, bounded by the pool's deadline per answer
        ans.checks = await checks.run(case.get("checks", []), ans.output)
        out[arm][i] = ans
        done += 1
        await progress(done)

    tasks = [asyncio.create_task(one(arm, i)) for i in range(len(plan.cases)) for arm in arms]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


def build_result(plan: RunPlan, answers: dict[str, list[Answer]], cfg: RunConfig) -> dict[str, Any]:
    arms: dict[str, dict[str, Any] | None] = {
        a: arm_stats(str(plan.models[a]), answers[a]) if a in answers else None for a in ARMS
    }
    cand = answers["candidate"]
    cases = []
    for i, case in enumerate(plan.cases):
        per_arm = {a: answers[a][i].to_json() if a in answers else None for a in ARMS}
        entry: dict[str, Any] = {
            "id": case["id"],
            "check_types": [c["type"] for c in case.get("checks", [])],
            "expected": case.get("expected"),
            "arms": per_arm,
            "changed_vs_current": (cand[i].output != answers["current"][i].output)
            if "current" in answers
            else None,
            "changed_vs_base": cand[i].output != answers["base"][i].output,
        }
        cases.append(entry)
    return {
        "regression_set": plan.regression_set,
        "models": plan.models,
        "request": {"temperature": 0, "seed": cfg.seed, "concurrency": cfg.concurrency},
        "arms": arms,
        "pairwise": {
            "candidate_vs_current": pairwise(cand, answers["current"]) if "current" in answers else None,
            "candidate_vs_base": pairwise(cand, answers["base"]),
        },
        "verdict": verdict(arms, plan.policy),
        "cases": cases,
    }


async def evaluate(
    client: httpx.AsyncClient,
    cfg: RunConfig,
    key: str,
    plan: RunPlan,
    progress: Progress,
    checks: CheckPool,
) -> dict[str, Any]:
    await wait_for_key(client, cfg, key)
    answers = await run_arms(client, cfg, key, plan, progress, checks)
    return build_result(plan, answers, cfg)
