"""Adapter load faults (SPEC §8, §15, §18; issue 13 findings 1 and 6) under steady mixed traffic
through two gateway processes: registry, two gateways, three simulator replicas, PostgreSQL, Redis
and the S3 server, all real processes. Fresh (never loaded) adapters are asked for once each
(``ColdTraffic``) while warm ones are served all along (``Traffic``).

a. one replica answers 500 to every load: fresh adapters load on the two others (a refused load
   is retried once elsewhere), the refusing replica gets a few loads per gateway and then none
   (passive outlier detection; loads paused there), and once fixed it takes loads again;
b. a replica whose loads outlast ``LORAPLANE_LOAD_TIMEOUT_S``: every cold request ends within
   about twice the load timeout, loaded elsewhere or with a designed 503; the slow replica gets
   a few loads per gateway, then none;
c. the staging directory's filesystem full (a 4 MB tmpfs, filled): cold loads 503
   ``adapter_load_failed`` (they were a 500), nothing half-written left, a log line naming the
   cause; once space is freed they load, without a restart;
d. a version's weights object overwritten in S3: 503 ``adapter_load_failed``, an
   ``adapter.hash_mismatch`` audit event per request at most (never retried elsewhere), nothing
   reaches an engine;
e. S3 (a server of this test's own) stopped: cold loads 503 ``adapter_load_failed`` at once,
   and they load once S3 is back.

In every one the warm adapters keep serving, and every request sent is counted: sent =
succeeded + failed with a designed error; no truncated stream, no hang, no 500.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kit import localservices as ls
from tests.filesystems import small_filesystem
from tests.gateway.gw_platform import Platform, run_platform

from .harness import ColdTraffic, Traffic, loaded_on, readyz, seed, sim_faults, sim_state, wait_served
from .test_fault_s3 import own_s3, restart_s3, stop_s3  # noqa: F401  (own_s3: the fixture)

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults-loads")]

BOUND_S = 20.0
SIM_ARGS = ("--enable-fault-control", "--load-fixed-s", "0.05", "--decode-base-s", "0.02")
LOAD_DESIGNED = {"adapter_load_failed", "no_capacity"}


@contextlib.contextmanager
def platform(s3: ls.S3Server, redis_url: str, env: Mapping[str, str]) -> Iterator[Platform]:
    with run_platform(s3, redis_url, gateways=2, sims=3, sim_args=SIM_ARGS, env=dict(env)) as p:
        yield p


def roomiest(p: Platform) -> str:
    """The replica with the fewest adapters: fresh adapters are placed there first."""
    return min(p.sim_urls, key=lambda u: len(loaded_on(u)))


def wait_until(pred: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


# --------------------------------------------------------------------------- a: loads refused

COOLOFF_S = 12.0
OUTLIER_FAILURES = 3


def test_replica_refusing_loads_gets_no_new_adapters_and_takes_loads_once_fixed(
    s3_server: ls.S3Server, redis_url: str
) -> None:
    env = {
        "LORAPLANE_OUTLIER_COOLOFF_S": str(COOLOFF_S),
        "LORAPLANE_OUTLIER_FAILURES": str(OUTLIER_FAILURES),
        "LORAPLANE_LOAD_TIMEOUT_S": "10",
    }
    with platform(s3_server, redis_url, env) as p:
        models = seed(p, adapters=3 + 16 + 4)
        key = p.keys["acme"]
        warm, fresh, later = models[:3], models[3:19], models[19:]
        wait_served(p, key, warm)
        bad = roomiest(p)  # where fresh adapters go first
        before = sim_state(bad)
        sim_faults(bad, fail_loads=1_000_000, fail_load_status=500)
        traffic = Traffic(p.gateway_urls, key, warm, workers=3, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            t_fault = time.monotonic()
            cold = ColdTraffic(p.gateway_urls, key, fresh, workers=2, bound_s=BOUND_S).start().wait(60)
            window = time.monotonic() - t_fault
            during = sim_state(bad)
            # fixed: once its loads are no longer paused, it takes fresh adapters again
            sim_faults(bad, reset=True)
            wait_until(  # its cool-off over: back in rotation, loads no longer paused
                lambda: all(readyz(g)["replicas_healthy"] == 3 for g in p.gateway_urls),
                COOLOFF_S + 10,
                "the replica back on both gateways",
            )
            time.sleep(0.5)
            after = ColdTraffic(p.gateway_urls, key, later, workers=1, bound_s=BOUND_S).start().wait(60)
            fixed = sim_state(bad)
            time.sleep(1.0)
        report = traffic.stop()
        logs = "".join(proc.log_tail(200_000) for proc in p.procs[1:])

    refused = during["load_calls"] - before["load_calls"]
    report.assert_accounted(set(), min_sent=30)  # loaded adapters never noticed
    cold.assert_accounted(LOAD_DESIGNED, min_sent=len(fresh))
    # every fresh adapter is served by a healthy replica (one retry elsewhere after a refusal)
    assert cold.count("ok") >= 0.95 * cold.sent, cold.summary()
    # a few refused loads per gateway (per pause), then no fresh adapter is placed there
    pauses = 1 + int(window // COOLOFF_S)
    assert refused <= len(p.gateway_urls) * (OUTLIER_FAILURES + 1) * pauses, (refused, window)
    assert "replica refuses loads" in logs
    assert refused >= OUTLIER_FAILURES, refused  # (the fault was met)
    # once fixed it takes loads again
    after.assert_accounted(set(), min_sent=len(later))
    assert fixed["loads_ok"] > during["loads_ok"], "the fixed replica took no load"


# --------------------------------------------------------------------------- b: loads time out

LOAD_TIMEOUT_S = 2.0


def test_replica_whose_loads_time_out_is_bounded_and_cold_adapters_load_elsewhere(
    s3_server: ls.S3Server, redis_url: str
) -> None:
    env = {
        "LORAPLANE_LOAD_TIMEOUT_S": str(LOAD_TIMEOUT_S),
        "LORAPLANE_OUTLIER_COOLOFF_S": "30",
        "LORAPLANE_OUTLIER_FAILURES": str(OUTLIER_FAILURES),
    }
    with platform(s3_server, redis_url, env) as p:
        models = seed(p, adapters=3 + 12)
        key = p.keys["acme"]
        warm, fresh = models[:3], models[3:]
        wait_served(p, key, warm)
        slow = roomiest(p)
        before = sim_state(slow)["load_calls"]
        sim_faults(slow, slow_load_s=LOAD_TIMEOUT_S * 3)
        traffic = Traffic(p.gateway_urls, key, warm, workers=3, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            cold = ColdTraffic(p.gateway_urls, key, fresh, workers=2, bound_s=BOUND_S).start()
            cold_report = cold.wait(60)
            calls = sim_state(slow)["load_calls"] - before
        report = traffic.stop()
    report.assert_accounted(LOAD_DESIGNED, min_sent=20)
    assert report.count("ok") == report.sent, report.summary()
    cold_report.assert_accounted(LOAD_DESIGNED, min_sent=len(fresh))
    # each cold request: at most one load timeout, then the load elsewhere (or a designed 503)
    assert max(o.seconds for o in cold_report.outcomes) <= 2 * LOAD_TIMEOUT_S + 4.0, cold_report.summary()
    # the slow replica got a few loads per gateway, then no more (out of rotation / loads paused)
    assert 1 <= calls <= len(p.gateway_urls) * (OUTLIER_FAILURES + 1), calls
    # the others loaded most fresh adapters; the rest waited behind a stuck load: 503 no_capacity
    assert cold_report.count("ok") >= 0.5 * cold_report.sent, cold_report.summary()


# --------------------------------------------------------------------------- c: staging full


def fill(fs: Path) -> Path:
    """Fill the filesystem at ``fs`` up to the last byte; returns the filler file."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for block in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while f.write(b"\0" * block):
                    pass
    assert shutil.disk_usage(fs).free < 8192, shutil.disk_usage(fs)
    return filler


def test_staging_directory_full_fails_cold_loads_with_503_and_recovers(
    s3_server: ls.S3Server, redis_url: str, tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "staging", "4m") as staging:
        env = {"LORAPLANE_STAGING_DIR": str(staging), "LORAPLANE_LOAD_TIMEOUT_S": "10"}
        with platform(s3_server, redis_url, env) as p:
            models = seed(p, adapters=3 + 6 + 3)
            key = p.keys["acme"]
            warm, fresh, later = models[:3], models[3:9], models[9:]
            wait_served(p, key, warm)
            staged_before = sorted(x.name for x in staging.iterdir())
            filler = fill(staging)
            traffic = Traffic(p.gateway_urls, key, warm, workers=3, bound_s=BOUND_S, max_tokens=12)
            with traffic:
                time.sleep(1.0)
                full = ColdTraffic(p.gateway_urls, key, fresh, workers=2, bound_s=BOUND_S).start().wait(60)
                left = sorted(x.name for x in staging.iterdir())
                loaded = set().union(*(loaded_on(u) for u in p.sim_urls))  # while the disk is full
                filler.unlink()  # space freed: cold loads work again, without a restart
                after = ColdTraffic(p.gateway_urls, key, later, workers=1, bound_s=BOUND_S).start().wait(60)
                time.sleep(1.0)
            report = traffic.stop()
            logs = "".join(proc.log_tail(200_000) for proc in p.procs[1:])
    report.assert_accounted(set(), min_sent=20)  # warm adapters never noticed
    full.assert_accounted({"adapter_load_failed"}, min_sent=len(fresh))
    assert full.count("designed") == full.sent, full.summary()  # every cold load: 503
    # nothing half-written stays behind: no temporary directory, no staged copy of a cold one
    assert left == [*staged_before, "filler"], left
    assert not any(m.split(":")[1] + "@" in n for m in fresh for n in loaded), loaded
    assert "No space left on device" in logs
    after.assert_accounted(set(), min_sent=len(later))


# --------------------------------------------------------------------------- d: tampered object


def test_tampered_object_is_503_hash_mismatch_not_retried_and_others_keep_serving(
    s3_server: ls.S3Server, redis_url: str
) -> None:
    with platform(s3_server, redis_url, {"LORAPLANE_LOAD_TIMEOUT_S": "10"}) as p:
        models = seed(p, adapters=4)
        key = p.keys["acme"]
        warm, victim = models[:3], models[3]
        adapter_id = victim.split(":")[1]
        wait_served(p, key, warm)
        uri = p.admin.get_version(adapter_id, "v1")["storage_uri"]
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        s3_server.client().put_object(
            Bucket=bucket, Key=f"{prefix.rstrip('/')}/adapter_model.safetensors", Body=b"not the weights"
        )
        calls0 = [sim_state(u)["load_calls"] for u in p.sim_urls]
        traffic = Traffic(p.gateway_urls, key, warm, workers=3, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(1.0)
            tampered = (
                ColdTraffic(p.gateway_urls, key, [victim] * 4, workers=1, bound_s=BOUND_S).start().wait(60)
            )
            time.sleep(1.0)
        report = traffic.stop()
        calls = [sim_state(u)["load_calls"] for u in p.sim_urls]
        loaded = set().union(*(loaded_on(u) for u in p.sim_urls))

        def events() -> list[dict[str, Any]]:
            return p.admin.list_audit(action="adapter.hash_mismatch", subject_id=adapter_id)

        wait_until(lambda: len(events()) >= 1, 10, "the hash-mismatch audit event")
        time.sleep(0.5)
        mismatches = events()
    report.assert_accounted(set(), min_sent=20)  # the other adapters kept serving
    tampered.assert_accounted({"adapter_load_failed"}, min_sent=4)
    assert [o.status for o in tampered.outcomes] == [503] * 4, tampered.summary()
    assert calls == calls0  # nothing reached any engine
    assert not any(n.startswith(f"{adapter_id}@") for n in loaded), loaded
    # one verification per request at most: a mismatch is never retried on another replica
    assert 1 <= len(mismatches) <= tampered.sent, mismatches
    assert {e["details"]["file"] for e in mismatches} == {"adapter_model.safetensors"}


# --------------------------------------------------------------------------- e: S3 down, cold loads


@pytest.fixture
def s3_of_our_own(request: pytest.FixtureRequest) -> ls.S3Server:
    """``test_fault_s3``'s own S3 server (one this test may stop), never the suite's shared one."""
    server: ls.S3Server = request.getfixturevalue("own_s3")
    return server


def test_s3_stopped_during_cold_loads_under_traffic(s3_of_our_own: ls.S3Server, redis_url: str) -> None:
    s3 = s3_of_our_own
    with platform(s3, redis_url, {"LORAPLANE_LOAD_TIMEOUT_S": "10"}) as p:
        models = seed(p, adapters=3 + 4 + 3)
        key = p.keys["acme"]
        warm, fresh, later = models[:3], models[3:7], models[7:]
        wait_served(p, key, warm)
        bucket = p.admin.get_version(warm[0].split(":")[1], "v1")["storage_uri"].removeprefix("s3://")
        bucket = bucket.split("/", 1)[0]
        traffic = Traffic(p.gateway_urls, key, warm, workers=3, bound_s=BOUND_S, max_tokens=12)
        with traffic:
            time.sleep(1.0)
            stop_s3(s3)
            down = ColdTraffic(p.gateway_urls, key, fresh, workers=2, bound_s=BOUND_S).start().wait(90)
            restart_s3(s3, bucket)
            back = ColdTraffic(p.gateway_urls, key, later, workers=1, bound_s=BOUND_S).start().wait(60)
            time.sleep(1.0)
        report = traffic.stop()
    report.assert_accounted(set(), min_sent=20)  # what is loaded keeps serving throughout
    down.assert_accounted({"adapter_load_failed"}, min_sent=len(fresh))
    assert down.count("designed") == down.sent, down.summary()  # S3 down: every cold load 503
    assert max(o.seconds for o in down.outcomes) < 15.0, down.summary()  # within the S3 client's retries
    back.assert_accounted(set(), min_sent=len(later))  # S3 back: they load, no restart
