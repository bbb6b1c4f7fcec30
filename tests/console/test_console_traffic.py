"""Traffic ring and page rows, fed by the gateway's and router's real Prometheus metrics objects."""

from __future__ import annotations

import math

import redis
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from registry.console.stats import sparkline, summarize
from registry.console.traffic import Counters, Sample, quantile, read_registries
from registry.console.traffic_redis import KEEP_S, RedisTraffic, TrafficPublisher, decode, encode, traffic_key
from registry.console.traffic_ring import RingTraffic
from router.metrics import RouterMetrics


def _serve(m: GatewayMetrics, adapter: str, version: str, n: int, ttft: float, tokens: int = 10) -> None:
    for _ in range(n):
        m.count("t1", adapter, version, "chat", 200, "")
        s = m.series("t1", adapter, version)
        s.ttft.observe(ttft)
        s.itl.observe(ttft / 10)
        s.completion_tokens.inc(tokens)


def test_ring_reads_gateway_and_router_metrics_per_adapter_version() -> None:
    gw = GatewayMetrics()
    router_reg = CollectorRegistry()
    rm = RouterMetrics(router_reg)
    now = [1000.0]
    ring = RingTraffic([gw.registry, router_reg], clock=lambda: now[0])
    ring.sample()  # the baseline: no interval yet
    _serve(gw, "support", "v1", 8, ttft=0.02)
    _serve(gw, "support", "v2", 2, ttft=0.4)
    gw.count("t2", "support", "v1", "chat", 429, "rate_limit_exceeded")  # designed: not an error
    gw.count("t2", "support", "v1", "chat", 429, "rate_limit_exceeded")
    gw.count("t1", "support", "v1", "chat", 503, "no_capacity")  # a failure
    gw.count("t1", "support", "v2", "chat", 200, "")  # a non-streamed answer: latency, no TTFT
    gw.series("t1", "support", "v2").latency.observe(0.04)
    gw.count("t1", "", "", "chat", 200, "")  # bare base model: no adapter row
    rm.loads.labels("http://r1", "support", "v2", "ok").inc()
    rm.loads.labels("http://r1", "support", "v2", "timeout").inc()
    rm.cold_wait.labels("support", "v2").observe(0.3)
    now[0] += 10
    ring.sample()

    w = ring.window()
    assert w.seconds == 10
    rows, total = summarize(w)
    assert total == 2
    v1, v2 = rows  # busiest first
    assert (v1.adapter, v1.version, v1.requests, v1.errors, v1.rate_limited) == ("support", "v1", 11, 1, 2)
    assert (v2.requests, v2.errors, v2.rate_limited, v2.loads, v2.cold_waits) == (3, 0, 0, 1, 1)
    assert v2.latency_p50 is not None and 0.025 < v2.latency_p50 <= 0.05  # the non-streamed answer
    assert v1.latency_p50 is None  # _serve records TTFT only
    assert v1.tokens_per_s == 8.0  # 80 completion tokens in 10 s
    assert v1.ttft_p50 is not None and 0.01 < v1.ttft_p50 <= 0.025  # inside the 10–25 ms bucket
    assert v2.ttft_p99 is not None and 0.25 < v2.ttft_p99 <= 0.5
    assert v1.itl_p50 is not None and v1.itl_p50 <= 0.0025
    assert v1.requests_series == [11.0]


def test_counter_reset_costs_one_interval_and_old_intervals_leave_the_totals() -> None:
    now = [0.0]
    ring = RingTraffic([], capacity=3, clock=lambda: now[0])

    def at(ts: float, requests: float) -> Sample:
        buckets = {0.1: requests, math.inf: requests}
        return Sample(ts, {("a", "v1"): Counters(requests=requests, ttft=buckets)})

    ring.add(at(0, 100))  # baseline
    ring.add(at(10, 110))  # +10
    ring.add(at(20, 5))  # the gateway restarted: counts from 0 → +5
    ring.add(at(30, 25))  # +20
    w = ring.window()
    assert w.totals[("a", "v1")].requests == 35
    ring.add(at(40, 26))  # +1; the first interval (+10) leaves the ring
    w = ring.window()
    assert w.totals[("a", "v1")].requests == 26
    assert (w.start, w.end) == (10, 40)
    rows, _ = summarize(w)
    assert rows[0].requests_series == [5.0, 20.0, 1.0]
    ring.add(at(50, 26))
    ring.add(at(60, 26))
    ring.add(at(70, 26))  # a quiet hour later the series is gone
    assert ring.window().totals == {}
    assert summarize(ring.window()) == ([], 0)


def test_quantile_matches_prometheus_histogram_quantile() -> None:
    buckets = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == 0.1
    assert quantile(0.7, buckets) == 0.1 + 0.4 * (20 / 40)
    assert quantile(0.99, buckets) == 0.5 + 0.5 * (9 / 10)
    assert quantile(0.5, {math.inf: 4.0, 1.0: 0.0}) == 1.0  # all above the last bound
    assert quantile(0.5, {}) is None and quantile(0.5, {math.inf: 0.0}) is None


def test_rows_are_paged_and_charts_downsampled() -> None:
    ring = RingTraffic([], capacity=400)
    for t in range(361):
        series = {(f"a{k:03d}", "v1"): Counters(requests=float(t * (k + 1))) for k in range(120)}
        ring.add(Sample(t * 10.0, series))
    rows, total = summarize(ring.window(), limit=50, offset=50)
    assert total == 120 and len(rows) == 50
    assert rows[0].adapter == "a069"  # 51st busiest
    assert len(rows[0].requests_series) == 60 and sum(rows[0].requests_series) == 360 * 70
    points = sparkline(rows[0].requests_series).split()
    assert len(points) == 60 and points[0].startswith("0.0,")
    assert read_registries([]) == {}


def test_gateways_publish_to_redis_and_the_admin_api_sums_their_intervals(
    redis_url: str, redis_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    now = [5000.0]
    gw_a, gw_b = GatewayMetrics(), GatewayMetrics()
    pub_a = TrafficPublisher(client, redis_prefix, [gw_a.registry], gateway_id="gw-a", clock=lambda: now[0])
    pub_b = TrafficPublisher(client, redis_prefix, [gw_b.registry], gateway_id="gw-b", clock=lambda: now[0])
    source = RedisTraffic(client, redis_prefix, clock=lambda: now[0])

    def pub_b_clock() -> float:
        return now[0]

    try:
        _serve(gw_a, "support", "v1", 5, ttft=0.02)  # before the baseline: not in the window
        pub_a.publish()
        pub_b.publish()
        source.read()  # baseline of both gateways

        _serve(gw_a, "support", "v1", 3, ttft=0.02)
        _serve(gw_b, "support", "v1", 4, ttft=0.02)
        _serve(gw_b, "sql", "v2", 1, ttft=0.2)
        now[0] += 10
        pub_a.publish()
        pub_b.publish()
        source.read()
        now[0] += 10
        source.read()  # no new readings: an empty interval, nothing counted twice

        gw_b2 = GatewayMetrics()  # gateway b restarted: its counters start again from zero
        _serve(gw_b2, "support", "v1", 2, ttft=0.02)
        pub_b2 = TrafficPublisher(
            client, redis_prefix, [gw_b2.registry], gateway_id="gw-b", clock=lambda: now[0]
        )
        now[0] += 10
        pub_b2.publish()
        source.read()

        rows, total = summarize(source.window())
        assert total == 2
        support, sql = rows
        assert (support.adapter, support.requests) == ("support", 3 + 4 + 2)
        assert support.requests_series == [7.0, 0.0, 2.0]
        assert (sql.adapter, sql.version, sql.requests) == ("sql", "v2", 1)
        assert sql.ttft_p50 is not None and 0.1 < sql.ttft_p50 <= 0.25
        assert source.window().seconds == 30
        # a reading older than an hour is a stopped gateway: dropped from Redis
        now[0] += KEEP_S + 60
        source.read()
        assert client.hlen(traffic_key(redis_prefix)) == 0
        client.hset(traffic_key(redis_prefix), "junk", "not json")
        source.read()  # ignored, never an error
    finally:
        client.close()


def test_readings_round_trip_through_their_wire_format() -> None:
    series = {
        ("a", "v1"): Counters(
            requests=3, errors=1, tokens=9, ttft={0.1: 2.0, math.inf: 3.0}, rate_limited=2,
            latency={0.05: 1.0, math.inf: 1.0},
        )
    }  # fmt: skip
    ts, back = decode(encode(12.5, series)) or (0.0, {})
    assert ts == 12.5 and back == series
    # a gateway not yet upgraded publishes version 1: read, with no 429s and no latency
    v1 = '{"v": 1, "ts": 2, "series": [["a", "v1", 3, 1, 9, 0, 0, [["0.1", 2]], []]]}'
    assert decode(v1) == (2.0, {("a", "v1"): Counters(requests=3, errors=1, tokens=9, ttft={0.1: 2.0})})
    assert decode('{"v": 3, "ts": 1, "series": []}') is None
    assert decode(b"[]") is None
