"""Schemathesis over an OpenAPI document, bounded and reproducible, collecting every 5xx.

``fuzz(schema, send, known=...)`` runs every operation of ``schema`` in both of Schemathesis'
generation modes — positive (data the document allows) and negative (data it forbids) — with a
fixed seed and ``max_examples`` cases per operation and mode. Each case is sent with ``send`` (a
real HTTP client against a live app or process) and every answer of 500 or more is collected as
a :class:`Finding`, so one run reports all of them (not just the first) with the request that
caused it. ``known`` maps path-parameter names to ids that exist (seeded before the run): every
other case uses them, so the fuzzer reaches past the 404s into the routes' real work.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Err
from schemathesis.schemas import APIOperation, BaseSchema

SEED = 1313
# what httpx.Client.request takes of Schemathesis' requests-style keyword arguments
_KWARGS = ("method", "url", "headers", "params", "json", "data", "files", "content", "cookies")


class Answer(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...


Send = Callable[[dict[str, Any]], Answer]
Client = httpx.Client | TestClient


@dataclass
class Finding:
    method: str
    path: str
    mode: str
    status: int
    body: str
    request: dict[str, Any]

    def __str__(self) -> str:
        req = {k: v for k, v in self.request.items() if k != "headers"}
        return f"{self.method.upper()} {self.path} [{self.mode}] → {self.status} {self.body[:300]} ← {req}"


@dataclass
class Report:
    findings: list[Finding]
    requests: int
    operations: int
    statuses: dict[int, int]


def client_sender(client: Client, auth: Mapping[str, str]) -> Send:
    """``send`` for an httpx client (or Starlette's TestClient, which is one); ``auth`` replaces the
    random credentials Schemathesis makes up for the document's security scheme."""

    def send(kwargs: dict[str, Any]) -> Answer:
        kw = {k: v for k, v in kwargs.items() if k in _KWARGS}
        headers = {k: v for k, v in (kw.get("headers") or {}).items() if k.lower() != "authorization"}
        kw["headers"] = {**headers, **auth}
        if not kw.get("cookies"):
            kw.pop("cookies", None)
        if isinstance(kw.get("data"), bytes | str):  # requests' raw body is httpx's content
            kw["content"] = kw.pop("data")
        if kw.get("files"):
            kw["files"] = [(name, _part(value)) for name, value in kw["files"]]
        return client.request(**kw)

    return send


def _part(value: Any) -> Any:
    """A multipart part as httpx can send it: requests-style data (numbers, strings with lone
    surrogates) as bytes — else the client itself fails, inside the ASGI transport."""
    if not isinstance(value, tuple) or len(value) < 2:
        return value
    content = value[1]
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    elif isinstance(content, int | float):
        content = str(content).encode()
    return (value[0], content, *value[2:])


def fuzz(
    schema: BaseSchema,
    send: Send,
    *,
    base_url: str,
    max_examples: int,
    known: Mapping[str, str] | None = None,
    body: Callable[[APIOperation, Any, int], Any] | None = None,
) -> Report:
    """Run the whole document; ``body(operation, generated_body, n)`` may rewrite a body (e.g. to
    name a model that exists in every other case)."""
    findings: list[Finding] = []
    statuses: dict[int, int] = {}
    counter = itertools.count()
    operations: list[APIOperation] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # the document itself is broken: that is a finding too
            raise result.err()
        operations.append(result.ok())

    def one(op: APIOperation, mode: GenerationMode) -> None:
        @seed(SEED)
        @settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            n = next(counter)
            if known and n % 2 == 0 and case.path_parameters:
                for name in case.path_parameters:
                    if name in known:
                        case.path_parameters[name] = known[name]
            if body is not None and case.body is not None:
                case.body = body(op, case.body, n)
            kwargs = case.as_transport_kwargs(base_url=base_url)
            r = send(kwargs)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                findings.append(Finding(op.method, op.path, mode.value, r.status_code, r.text, kwargs))

        with contextlib.suppress(Unsatisfiable):  # nothing to generate (negative data for a bare GET)
            run()

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            one(op, mode)
    return Report(findings, sum(statuses.values()), len(operations), statuses)
