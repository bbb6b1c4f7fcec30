"""vLLM's Prometheus metrics (VLLM.md §5) on a per-app ``CollectorRegistry``.

Every engine metric carries ``model_name`` (the base name) and ``engine="0"``. Gauges are read
from the engine at scrape time. ``vllm:lora_requests_info`` keeps every label set ever seen
(value = the Unix time it was last recorded), as vLLM does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
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


class _EngineGauges(Collector):
    def __init__(self, owner: SimMetrics) -> None:
        self._o = owner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        eng, labels = self._o.engine, [self._o.model_name, "0"]
        deferred = eng.waiting_deferred
        g = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=_LABELS
        )
        g.add_metric(labels, eng.running)
        yield g
        g = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=_LABELS
        )
        g.add_metric(labels, eng.waiting)
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
        self._o.record_lora_info()
        if self._o.lora_info:
            g = GaugeMetricFamily(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            )
            for (mx, run, wait), value in self._o.lora_info.items():
                g.add_metric([mx, run, wait], value)
            yield g


class SimMetrics:
    """All metrics of one simulated replica."""

    def __init__(self, engine: EngineModel, model_name: str, max_loras: int) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_loras = str(max_loras)
        self.registry = CollectorRegistry(auto_describe=False)
        self.lora_info: dict[tuple[str, str, str], float] = {}
        self._seen_traffic = False
        lab = (model_name, "0")
        reg = self.registry
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", _LABELS, registry=reg
        ).labels(*lab)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", _LABELS, registry=reg
        ).labels(*lab)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*_LABELS, "finished_reason"],
            registry=reg,
        )
        self.success = {r: self._success.labels(*lab, r) for r in ("stop", "length", "abort")}
        self.num_preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", _LABELS, registry=reg
        ).labels(*lab)
        Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _LABELS,
            registry=reg,
        ).labels(*lab)
        Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            _LABELS,
            registry=reg,
        ).labels(*lab)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(*lab)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _LABELS,
            buckets=ITL_BUCKETS,
            registry=reg,
        ).labels(*lab)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(*lab)
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LABELS,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(*lab)
        self.prefill = Histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _LABELS,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(*lab)
        self.decode = Histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _LABELS,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(*lab)
        reg.register(_EngineGauges(self))

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
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.success.get(finish_reason, self.success["stop"]).inc()
        self.ttft.observe(first_token_at - arrival)
        self.e2e.observe(finished_at - arrival)
        self.queue.observe(scheduled_at - arrival)
        self.prefill.observe(first_token_at - scheduled_at)
        self.decode.observe(finished_at - first_token_at)
        if completion_tokens > 1:
            itl = (finished_at - first_token_at) / (completion_tokens - 1)
            for _ in range(min(completion_tokens - 1, 64)):
                self.itl.observe(itl)

    def render(self) -> bytes:
        return generate_latest(self.registry)
