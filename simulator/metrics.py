"""vLLM's Prometheus metrics (VLLM.md §5) on a per-app ``CollectorRegistry``.

Every engine metric carries ``model_name`` (the base name) and ``engine="0"``. Gauges are read
from the engine at scrape time. ``vllm:lora_requests_info`` keeps every label set ever seen
(value = the Unix time it was last recorded), as vLLM does. Counters and histograms are plain
Python numbers rendered by one collector (no locks on the hot path).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from simulator.engine import EngineModel

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

# vllm/v1/metrics/loggers.py bucket lists
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
_LABELS = ("model_name", "engine")


class Hist:
    """A lock-free histogram (one asyncio thread writes; the scrape reads)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.count += n
        self.total += value * n

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for le, c in zip([*self.bounds, float("inf")], self.counts, strict=True):
            acc += c
            out.append(("+Inf" if le == float("inf") else repr(float(le)), float(acc)))
        return out


_HISTS = {
    "ttft": (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
    ),
    "itl": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    "e2e": (
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        LATENCY_BUCKETS,
    ),
    "queue": (
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        LATENCY_BUCKETS,
    ),
    "prefill": (
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        LATENCY_BUCKETS,
    ),
    "decode": (
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        LATENCY_BUCKETS,
    ),
}


class _Collector(Collector):
    def __init__(self, owner: SimMetrics) -> None:
        self._o = owner

    def collect(self) -> Iterator[Metric]:
        o = self._o
        eng, labels = o.engine, [o.model_name, "0"]
        deferred = eng.waiting_deferred
        gauges = [
            ("vllm:num_requests_running", "Number of requests in model execution batches.", eng.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.waiting),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(labels, value)
            yield g
        g = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            labels=[*_LABELS, "reason"],
        )
        g.add_metric([*labels, "capacity"], eng.waiting - deferred)
        g.add_metric([*labels, "deferred"], deferred)
        yield g
        g = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=_LABELS
        )
        g.add_metric(labels, eng.kv_cache_usage)
        yield g
        o.record_lora_info()
        if o.lora_info:
            g = GaugeMetricFamily(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            )
            for (mx, run, wait), stamp in o.lora_info.items():
                g.add_metric([mx, run, wait], stamp)
            yield g
        counters = [
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", o.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", o.generation_tokens),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", 0),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", 0),
        ]
        for name, doc, total in counters:
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(labels, total)
            yield c
        c = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*_LABELS, "finished_reason"],
        )
        for reason, count in o.success.items():
            c.add_metric([*labels, reason], count)
        yield c
        for key, (name, doc, _b) in _HISTS.items():
            h = o.hists[key]
            hm = HistogramMetricFamily(name, doc, labels=_LABELS)
            hm.add_metric(labels, h.buckets(), h.total)
            yield hm


class SimMetrics:
    """All metrics of one simulated replica."""

    def __init__(self, engine: EngineModel, model_name: str, max_loras: int) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_loras = str(max_loras)
        self.registry = CollectorRegistry(auto_describe=False)
        self.lora_info: dict[tuple[str, str, str], float] = {}
        self._seen_traffic = False
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.hists = {k: Hist(list(b)) for k, (_n, _d, b) in _HISTS.items()}
        self.registry.register(_Collector(self))

    def record_lora_info(self) -> None:
        """One scheduler-stats record: refresh the current label set to the Unix time."""
        if not self._seen_traffic:
            return
        names = ",".join(self.engine.lora_info_adapters)
        self.lora_info[(self.max_loras, names, names)] = time.time()

    def mark_traffic(self) -> None:
        self._seen_traffic = True

    def observe_finished(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        finish_reason: str,
        arrival: float,
        scheduled_at: float,
        first_token_at: float,
        finished_at: float,
    ) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += completion_tokens
        self.success[finish_reason if finish_reason in self.success else "stop"] += 1
        h = self.hists
        h["ttft"].observe(first_token_at - arrival)
        h["e2e"].observe(finished_at - arrival)
        h["queue"].observe(scheduled_at - arrival)
        h["prefill"].observe(first_token_at - scheduled_at)
        h["decode"].observe(finished_at - first_token_at)
        if completion_tokens > 1:
            # one observation per inter-token gap, at the request's mean gap
            h["itl"].observe((finished_at - first_token_at) / (completion_tokens - 1), completion_tokens - 1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
