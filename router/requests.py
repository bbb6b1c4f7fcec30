"""The request loop: one request from placement to the first byte, with one retry elsewhere.

The planner's decision (``router.planner``) → an in-flight mark on (replica, version) in the
cluster state (refused while another process unloads it there: place again a moment later) →
the loader's singleflight verified load if needed (evicting the decision's victims first) →
the sender through the pool's engine driver. One retry on another replica after a load failure
that may succeed elsewhere or an error before the first byte; while no GPU slot is free for it
(or only those kept for hot adapters), a cold request waits (bounded by the load timeout) in the
process's fair queue (``router.fairness``): when a slot frees, the tenant that received the
least service goes first. Each answer is charged to its tenant's virtual counter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from router.cluster import ClusterState
from router.contract import (
    AdapterLoadFailed,
    ForwardRequest,
    ForwardResult,
    NoCapacity,
    UpstreamError,
    UpstreamTimeout,
)
from router.drivers import Retryable
from router.errors import LoadError
from router.fairness import Charge, FairQueue, VirtualCounters, Waiter, set_tenant
from router.hotness import HotSet
from router.loader import Loader
from router.planner import ColdSlotsFull, Planner, SlotsInUse
from router.prefix import CHARS_PER_TOKEN, prompt_text
from router.sender import Sender
from router.store import ReplicaState, ReplicaStore

log = logging.getLogger("loraplane.router")

MARK_RETRY_S = 0.05  # wait between tries while the chosen replica unloads the adapter
MARK_TRIES = 40
COLD_SLOT_RETRY_S = 0.05  # period of the fair queue's rounds: requests waiting for a slot try again


class RequestLoop:
    def __init__(
        self,
        store: ReplicaStore,
        planner: Planner,
        cluster: ClusterState,
        loader: Loader,
        sender: Sender,
        hot: HotSet,
        *,
        load_timeout_s: float,
        clock: Callable[[], float],
        fair: FairQueue | None = None,
    ) -> None:
        self._store = store
        self._planner = planner
        self._cluster = cluster
        self._loader = loader
        self._sender = sender
        self._hot = hot
        self._load_timeout_s = load_timeout_s
        self._clock = clock
        self._fair = fair if fair is not None else FairQueue(VirtualCounters(), poll_s=COLD_SLOT_RETRY_S)

    async def forward(self, req: ForwardRequest) -> ForwardResult:
        t0 = self._clock()
        store = self._store
        if not store.serves(req.base_model):
            raise NoCapacity(f"no replicas serve base model {req.base_model}", retry_after=5)
        version = req.version
        name = version.lora_name if version is not None else None
        if name is not None:
            self._hot.note_request(name)
        excluded: set[str] = set()
        cold = False
        last: Exception | None = None
        attempts = refused = 0
        set_tenant(req.tenant_id)  # the loads this request starts wait for a slot as its tenant's
        fair = self._fair
        waiter: Waiter | None = None  # its place in the fair queue, once it had to wait for a slot
        wait = False
        try:
            while attempts < 2:
                if wait:  # a bounded, fairly ordered queue: wait for a turn at a slot that freed
                    waiter = waiter or fair.waiter(req.tenant_id)
                    await waiter.turn(self._load_timeout_s - (self._clock() - t0))  # False: one last try
                    wait = False
                try:
                    rep, decision = self._planner.place(req, excluded)
                except (ColdSlotsFull, SlotsInUse):
                    if self._clock() - t0 > self._load_timeout_s:
                        raise
                    wait = True
                    continue
                except NoCapacity:
                    if last is None:
                        raise
                    break  # nowhere left to retry: the first failure is the answer
                if waiter is None and fair.waiting and decision.action in ("load", "replicate"):
                    wait = True  # a slot freed, but others of this process wait for one: queue behind
                    continue
                if waiter is not None:
                    waiter.leave()
                if name is not None and not await self._cluster.mark(rep.url, name):
                    refused += 1  # another process is unloading it there right now
                    if refused >= MARK_TRIES:
                        excluded.add(rep.url)
                    await asyncio.sleep(MARK_RETRY_S)
                    continue
                release = self._releaser(rep.url, name)
                try:
                    if version is not None:
                        here = rep.residents.get(version.lora_name)
                        if here is not None and here.state == "resident" and await self._gone(rep, name):
                            here = None  # unloaded by another process: load it again, counted
                        if here is None or here.state != "resident":  # a hit needs no load, no victims
                            cands = self._planner.candidates(
                                rep, decision, version.lora_name, strict_hot=False
                            )
                            cold = await self._loader.ensure_loaded(rep, version, cands) or cold
                    return await self._send(rep, req, cold, self._clock() - t0, release)
                except LoadError as exc:
                    release()
                    last = exc
                    if exc.failure == "no_room" and self._clock() - t0 < self._load_timeout_s:
                        # every adapter there is serving a request: a bounded wait for one to finish,
                        # then place again (anywhere), as for a busy cold slot
                        wait = True
                        continue
                    if not exc.retry_elsewhere:
                        break
                    excluded.add(rep.url)
                except Retryable as exc:
                    release()
                    last = exc
                    await self._after_retryable(rep, req, exc, excluded)
                except BaseException:
                    release()
                    raise
                attempts += 1
                log.info(
                    "retrying on another replica",
                    extra={
                        "request_id": req.request_id,
                        "replica": rep.url,
                        "error": str(last),
                        "attempt": attempts,
                    },
                )
        finally:
            if waiter is not None:
                waiter.leave()
        if isinstance(last, LoadError):
            raise AdapterLoadFailed(
                f"adapter {req.client_model} could not be loaded: {last.message}",
                retry_after=5 if last.retry_elsewhere else 30,
            )
        if isinstance(last, Retryable) and last.timeout:  # SPEC §18: a first-byte timeout is a 504
            raise UpstreamTimeout(f"replica did not answer in time: {last}")
        raise UpstreamError(f"replica error: {last}")

    async def _send(
        self, rep: ReplicaState, req: ForwardRequest, cold: bool, queue_s: float, release: Callable[[], None]
    ) -> ForwardResult:
        """Send, charging the tenant's virtual counter: the prompt's estimate now, the usage the
        replica reports once the answer or stream has ended (nothing when no answer came)."""
        charge = Charge(self._fair.counters, req.tenant_id, len(prompt_text(req.body)) // CHARS_PER_TOKEN)
        sent: list[ForwardResult] = []

        def end() -> None:
            release()
            if sent:
                _settle(charge, sent[0])

        try:
            result = await self._sender.send(rep, req, cold, queue_s, end)
        except BaseException:
            charge.settle(0, 0)
            raise
        sent.append(result)
        if result.stream is None:
            _settle(charge, result)
        return result

    async def _gone(self, rep: ReplicaState, name: str | None) -> bool:
        """An engine that reloads a name it has seen by itself (SGLang) and lists what it holds:
        before a hit there, the cluster's record must still say resident. Another process may
        have unloaded it since this process last looked; a request sent now would bring it back
        behind the plane's back, one more than ``max_adapters``. (Asked after the request's mark,
        which keeps any other process from starting an unload meanwhile.) Such a stale entry is
        forgotten here, and the request loads the adapter through a claim like any miss."""
        caps = rep.driver.capabilities
        if name is None or not (caps.implicit_reload and caps.lists_adapters) or not self._cluster.shared:
            return False
        rec = await self._cluster.record(rep.url, name)
        if rec is not None and rec.state == "resident":
            return False
        rep.residents.pop(name, None)
        return True

    def _releaser(self, url: str, name: str | None) -> Callable[[], None]:
        done = False

        def release() -> None:
            nonlocal done
            if not done and name is not None:
                done = True
                self._cluster.unmark(url, name)
                self._fair.kick()  # an adapter in use may have become idle (evictable)

        return release

    async def _after_retryable(
        self, rep: ReplicaState, req: ForwardRequest, exc: Retryable, excluded: set[str]
    ) -> None:
        store = self._store
        if exc.replica_down:  # connection refused: out of rotation until a poll succeeds
            store.mark_failure(rep, exc.message, immediate=True)
        version = req.version
        if exc.adapter_missing and version is not None:
            # The replica lost the adapter (restart): forget it, reload on the retry.
            rep.residents.pop(version.lora_name, None)
            store.note_gone(rep, version.lora_name)
            await self._cluster.drop(rep.url, version.lora_name)
        elif any(
            r.healthy and r.url != rep.url and r.url not in excluded for r in store.for_base(req.base_model)
        ):
            excluded.add(rep.url)  # else: retry the same one (e.g. a stale pooled connection)


def _settle(charge: Charge, result: ForwardResult) -> None:
    u = result.usage
    if u is not None:
        charge.settle(u.prompt_tokens, u.completion_tokens)
