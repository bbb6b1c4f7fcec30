"""The fault suite's harness (SPEC §18): services of the test's own that it may stop, hang and
restart, the whole platform on them, and steady mixed traffic that accounts for every request.

Every scenario runs :class:`Traffic` (streaming and non-streaming chat completions, round-robin
over the gateways) through its fault and asserts on its :class:`Report`: every request sent is
either a success or a *designed* error (SPEC §13's codes for the fault at hand); zero streams
that end without ``[DONE]`` (silently truncated), zero requests past the time bound (hangs),
zero 500s, zero refused connections to a live gateway.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import redis

from kit import localservices as ls
from kit.procs import ready_when
from tests.gateway.gw_platform import Platform

MSG = [{"role": "user", "content": "hello"}]

# The codes a fault may produce by design (SPEC §13, §18), by HTTP status.
DESIGNED: dict[int, frozenset[str]] = {
    429: frozenset({"rate_limit_exceeded"}),
    502: frozenset({"upstream_error"}),
    503: frozenset(
        {"no_capacity", "adapter_load_failed", "rate_limiter_unavailable", "draining", "not_ready"}
    ),
    504: frozenset({"upstream_timeout"}),
}
# A stream that started and then failed ends with an error event carrying one of these codes.
STREAM_DESIGNED = frozenset({"upstream_error", "upstream_timeout", "engine_error"})

GOOD = ("ok", "designed", "stream_error")
BAD = ("undesigned", "truncated", "hang", "conn_error")


# --------------------------------------------------------------------------- own services


class OwnService:
    """A PostgreSQL or Redis server this test started: stop, start (same port, same data), hang
    (SIGSTOP) and resume (SIGCONT)."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind = kind
        self.server = server
        self.url: str = server.url

    @property
    def process(self) -> Any:
        return self.server.process

    def _accepts(self) -> bool:
        if self.kind == "postgres":
            dsn = self.url.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
            with psycopg.connect(dsn, connect_timeout=2):
                return True
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def stop(self) -> None:
        """A clean stop (PostgreSQL: fast shutdown; Redis: SIGTERM), waited for."""
        if self.kind == "postgres":
            self.process.signal(signal.SIGINT)
        self.process.stop(grace_s=15)
        assert not self.process.alive()

    def kill(self) -> None:
        self.process.kill()

    def start(self, timeout: float = 60) -> float:
        """Start it again on the same port; return the seconds until it accepts connections."""
        self.process.start()
        return float(self.process.wait_ready(ready_when(f"{self.kind} accepts", self._accepts), timeout))

    def pause(self) -> None:
        """Hang it: SIGSTOP to its whole process group (connections stay open, nothing answers)."""
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.signal(signal.SIGCONT)

    def hang(self) -> None:
        """Hang all of it: SIGSTOP to its process group and to every descendant. PostgreSQL's
        backends are session leaders of their own (``pause`` leaves them answering on the
        connections they hold); after this nothing answers, new connections or old."""
        self.process.signal(signal.SIGSTOP)  # first: the postmaster forks no more backends
        for pid in _descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def unhang(self) -> None:
        for pid in _descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.process.signal(signal.SIGCONT)

    def ensure_up(self) -> None:
        """Resumed and running (a test's way out of its fault, whatever happened in between)."""
        if self.process.alive():
            self.unhang()
        else:
            self.start()

    def close(self) -> None:
        self.resume()
        self.server.stop()


def _descendants(pid: int | None) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    todo = [pid] if pid is not None else []
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


@contextlib.contextmanager
def own_postgres() -> Iterator[OwnService]:
    svc = OwnService("postgres", ls.start_postgres_server())
    try:
        yield svc
    finally:
        svc.close()


@contextlib.contextmanager
def own_redis() -> Iterator[OwnService]:
    svc = OwnService("redis", ls.start_redis_server())
    try:
        yield svc
    finally:
        svc.close()


# --------------------------------------------------------------------------- the platform's content


def seed(
    p: Platform, adapters: int = 4, tenant: str = "acme", limits: dict[str, int | None] | None = None
) -> list[str]:
    """``adapters`` promoted adapters granted to ``tenant`` (with generous limits unless given), its
    key in ``p.keys[tenant]``; returns the model names."""
    a = p.admin
    a.create_tenant(tenant, limits=limits or {"rpm": 1_000_000, "tpm": 1_000_000_000})
    models = []
    for i in range(adapters):
        name = f"fa{i}"
        p.adapter(name)
        a.put_grant(tenant, name)
        models.append(f"demo-base:{name}")
    p.keys[tenant] = a.issue_key(tenant)["key"]
    return models


def wait_served(p: Platform, key: str, models: Sequence[str], timeout: float = 30) -> None:
    """Every gateway answers 200 for every model (the table reached them; first loads done)."""
    deadline = time.monotonic() + timeout
    pending = [(g, m) for g in p.gateway_urls for m in models]
    with httpx.Client(timeout=10) as c:
        while pending:
            g, m = pending[0]
            r = c.post(
                f"{g}/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"model": m, "messages": MSG, "max_tokens": 2},
            )
            if r.status_code == 200:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"{g} {m}: {r.status_code} {r.text[:300]}")
            time.sleep(0.2)


# --------------------------------------------------------------------------- traffic


@dataclass
class Outcome:
    t0: float
    t1: float
    gateway: str
    model: str
    stream: bool
    kind: str  # ok | designed | stream_error | undesigned | truncated | hang | conn_error
    status: int | None = None
    code: str | None = None
    detail: str = ""
    retry_after: str | None = None  # the Retry-After header of an error answer

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


@dataclass(repr=False)
class Report:
    outcomes: list[Outcome] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Report({self.summary()})"

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    def count(self, *kinds: str) -> int:
        return sum(1 for o in self.outcomes if o.kind in kinds)

    def kinds(self) -> Counter[str]:
        return Counter(o.kind for o in self.outcomes)

    def codes(self) -> Counter[str]:
        return Counter(f"{o.status}:{o.code}" for o in self.outcomes if o.kind != "ok")

    def between(self, t_from: float, t_to: float = float("inf")) -> Report:
        """The requests that started in ``[t_from, t_to)``."""
        return Report([o for o in self.outcomes if t_from <= o.t0 < t_to])

    def ended_before(self, t: float) -> Report:
        return Report([o for o in self.outcomes if o.t1 < t])

    def where(self, *, stream: bool | None = None, gateway: str | None = None) -> Report:
        return Report(
            [
                o
                for o in self.outcomes
                if (stream is None or o.stream == stream) and (gateway is None or o.gateway == gateway)
            ]
        )

    def summary(self) -> str:
        bad = [o for o in self.outcomes if o.kind in BAD][:8]
        return (
            f"sent={self.sent} kinds={dict(self.kinds())} codes={dict(self.codes())} "
            f"slowest={max((o.seconds for o in self.outcomes), default=0):.2f}s bad={bad}"
        )

    def assert_accounted(self, allowed: Collection[str] | None = None, *, min_sent: int = 1) -> None:
        """sent = succeeded + failed with a designed error (restricted to ``allowed`` codes if
        given); no truncated stream, no hang, no undesigned answer, no refused connection."""
        assert self.sent >= min_sent, self.summary()
        assert self.count(*GOOD) == self.sent, self.summary()
        assert self.count(*BAD) == 0, self.summary()
        if allowed is not None:
            seen = {o.code for o in self.outcomes if o.kind in ("designed", "stream_error")}
            assert seen <= set(allowed), f"codes {seen - set(allowed)} not expected here: {self.summary()}"


def _error_code(text: str | bytes) -> str | None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        err = orjson.loads(text)["error"]
        return str(err.get("code")) if isinstance(err, dict) else None
    return None


class Traffic:
    """``workers`` threads, each sending one request after another, alternating streaming and
    non-streaming, round-robin over ``gateways`` (changeable while running: :meth:`use`) and
    ``models``; every request is classified into an :class:`Outcome`. A request that takes
    longer than ``bound_s`` in all is a hang."""

    def __init__(
        self,
        gateways: Sequence[str],
        key: str,
        models: Sequence[str],
        *,
        workers: int = 4,
        bound_s: float = 30.0,
        max_tokens: int = 8,
        pause_s: float = 0.02,
    ) -> None:
        self._gateways = list(gateways)
        self.key = key
        self.models = list(models)
        self.workers = workers
        self.bound_s = bound_s
        self.max_tokens = max_tokens
        self.pause_s = pause_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []
        self._threads: list[threading.Thread] = []
        self._n = 0

    def use(self, gateways: Sequence[str]) -> None:
        """Send new requests only to ``gateways`` from now on (before a gateway is stopped)."""
        with self._lock:
            self._gateways = list(gateways)

    def _next(self) -> tuple[str, str, bool]:
        with self._lock:
            n = self._n
            self._n += 1
            # every gateway gets both kinds and every model (n % 2 alone would send only
            # non-streaming requests to the first of two gateways)
            g, rest = n % len(self._gateways), n // len(self._gateways)
            return self._gateways[g], self.models[(rest // 2) % len(self.models)], rest % 2 == 1

    def start(self) -> Traffic:
        for i in range(self.workers):
            t = threading.Thread(target=self._run, name=f"traffic-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> Report:
        self._stop.set()
        for t in self._threads:
            t.join(self.bound_s + 30)
            assert not t.is_alive(), "a traffic thread is stuck past the bound"
        return self.report()

    def report(self) -> Report:
        with self._lock:
            return Report(list(self._outcomes))

    def __enter__(self) -> Traffic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        timeout = httpx.Timeout(self.bound_s, connect=5.0)
        with httpx.Client(timeout=timeout) as client:
            while not self._stop.is_set():
                gateway, model, stream = self._next()
                out = self.one(client, gateway, model, stream)
                with self._lock:
                    self._outcomes.append(out)
                time.sleep(self.pause_s)

    def one(self, client: httpx.Client, gateway: str, model: str, stream: bool) -> Outcome:
        body: dict[str, Any] = {"model": model, "messages": MSG, "max_tokens": self.max_tokens}
        if stream:
            body["stream"] = True
        out = Outcome(time.monotonic(), 0.0, gateway, model, stream, "undesigned")
        try:
            with client.stream(
                "POST",
                f"{gateway}/v1/chat/completions",
                headers={"authorization": f"Bearer {self.key}"},
                json=body,
            ) as r:
                out.status = r.status_code
                if r.status_code != 200:
                    out.code = _error_code(r.read())
                    out.retry_after = r.headers.get("retry-after")
                    ok = out.code in DESIGNED.get(r.status_code, frozenset())
                    out.kind = "designed" if ok else "undesigned"
                    out.detail = r.text[:300]
                elif stream:
                    self._classify_stream(r, out)
                else:
                    data = orjson.loads(r.read())
                    out.kind = "ok" if data.get("choices") else "undesigned"
        except httpx.ConnectError as e:
            out.kind, out.detail = "conn_error", repr(e)
        except httpx.TimeoutException as e:
            out.kind, out.detail = "hang", repr(e)
        except (httpx.HTTPError, ValueError) as e:  # the connection dropped mid-answer
            out.kind, out.detail = ("truncated" if stream else "undesigned"), repr(e)
        out.t1 = time.monotonic()
        if out.seconds > self.bound_s and out.kind in GOOD:
            out.kind, out.detail = "hang", f"took {out.seconds:.1f}s"
        return out

    @staticmethod
    def _classify_stream(r: httpx.Response, out: Outcome) -> None:
        data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        if not data or data[-1] != "[DONE]":
            out.kind, out.detail = "truncated", f"last lines {data[-2:]}"
            return
        errors = [d for d in data[:-1] if d.startswith('{"error"')]
        if not errors:
            out.kind = "ok" if len(data) > 1 else "truncated"
            return
        out.code = _error_code(errors[0])
        out.kind = "stream_error" if out.code in STREAM_DESIGNED else "undesigned"
        out.detail = errors[0][:300]


def metric_sum(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples on ``url``/metrics whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_until(pred: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> float:
    """Poll ``pred`` until it is true; the seconds it took (AssertionError after ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s")


def sim_faults(sim_url: str, **faults: Any) -> None:
    """Set the simulator's fault injection (``reset=True`` clears it)."""
    r = httpx.post(f"{sim_url}/_sim/faults", json=faults, timeout=5)
    r.raise_for_status()


class ColdTraffic(Traffic):
    """Like :class:`Traffic`, but each model is asked for once (a stream of fresh adapters: every
    request is a cold load); its workers stop by themselves when the models run out
    (:meth:`wait`)."""

    def __init__(self, gateways: Sequence[str], key: str, models: Sequence[str], **kw: Any) -> None:
        super().__init__(gateways, key, models, **kw)
        self._left = list(models)

    def start(self) -> ColdTraffic:
        super().start()
        return self

    def _next(self) -> tuple[str, str, bool]:
        with self._lock:
            if not self._left:
                raise IndexError("no fresh model left")
            n = self._n
            self._n += 1
            return self._gateways[n % len(self._gateways)], self._left.pop(0), n % 2 == 1

    def _run(self) -> None:
        timeout = httpx.Timeout(self.bound_s, connect=5.0)
        with httpx.Client(timeout=timeout) as client:
            while not self._stop.is_set():
                try:
                    gateway, model, stream = self._next()
                except IndexError:
                    return
                out = self.one(client, gateway, model, stream)
                with self._lock:
                    self._outcomes.append(out)
                time.sleep(self.pause_s)

    def wait(self, timeout: float) -> Report:
        """Wait until every model was asked for once (or ``timeout``), then stop."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.stop()


def sim_state(sim_url: str) -> dict[str, Any]:
    """The simulator's ``/_sim/state``: load calls, loads that succeeded, registered adapters."""
    r = httpx.get(f"{sim_url}/_sim/state", timeout=5)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def loaded_on(sim_url: str) -> set[str]:
    """The adapters the simulator has registered (its own ``/v1/models``)."""
    r = httpx.get(f"{sim_url}/v1/models", timeout=5)
    r.raise_for_status()
    return {m["id"] for m in r.json()["data"] if m.get("parent")}


def readyz(gateway_url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{gateway_url}/readyz", timeout=5).json()
    return data
