"""vLLM's Prometheus metrics (as vLLM 0.32 does) on a per-app ``CollectorRegistry``.

The families, names, types, label names, help texts and histogram buckets are vLLM 0.32's
``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``, ``buckets.py``, ``perf.py``), emitted in
the same order. As with prometheus_client's own ``Counter``/``Histogram``, every counter and
histogram child also has a ``_created`` sample (the Unix time the metrics were set up).

Every engine metric carries ``model_name`` (the base name) and ``engine="0"``;
``vllm:admission_rejections`` carries ``model_name`` and ``reason`` only, ``vllm:lora_requests_info``
only its three LoRA labels. Gauges are read from the engine at scrape time.
``vllm:lora_requests_info`` keeps every label set ever seen (value = the Unix time it was last
recorded), as vLLM does. Counters and histograms are plain Python numbers rendered by one
collector (no locks on the hot path).

What the simulator has no counterpart for stays 0, as on a default text-only vLLM without those
features: prefix-cache hits (every prompt token is a query, none hits), external (KV connector)
and multi-modal caches, admission rejections (no queue limits), preemptions, and the
``estimated_*_per_gpu`` counters (vLLM fills them only with ``--enable-mfu-metrics``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from simulator.engine import EngineModel

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

# vllm/v1/metrics/buckets.py
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
ITERATION_TOKENS_BUCKETS = [
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
]
REQUEST_PARAMS_N_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0]
REQUEST_NUM_PREEMPTIONS_BUCKETS = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0]


def request_tokens_buckets(max_model_len: int) -> list[float]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, … ≤ ``max_model_len``."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(float(m * scale))
        scale *= 10


# vllm.v1.engine.FINISH_REASON_STRINGS; every child exists from the start
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# PromptTokenStats.ALL_SOURCES / CacheHitSource / ADMISSION_REASONS / sleep states
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
_LABELS = ("model_name", "engine")


class Hist:
    """A lock-free histogram (one asyncio thread writes; the scrape reads)."""

    __slots__ = ("bounds", "count", "counts", "les", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.les = [*(floatToGoString(b) for b in bounds), "+Inf"]
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
        for le, c in zip(self.les, self.counts, strict=True):
            acc += c
            out.append((le, float(acc)))
        return out


# key → (name, help, bucket family); vLLM's registration order. ``request_prefill_kv_computed_tokens``
# (prompt minus cached tokens) is rendered from ``prompt`` (no prefix cache: nothing is cached) and
# ``request_num_preemptions`` from the finished count (never preempted: every value is 0).
_HISTS: list[tuple[str, str, str, str]] = [
    ("prompt", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "request_tokens"),
    (
        "generation",
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        "request_tokens",
    ),
    (
        "iteration",
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        "iteration",
    ),
    (
        "max_gen",
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        "request_tokens",
    ),
    ("n", "vllm:request_params_n", "Histogram of the n request parameter.", "n"),
    (
        "max_tokens",
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        "request_tokens",
    ),
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    (
        "tpot",
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        "itl",
    ),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "latency"),
    (
        "queue",
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        "latency",
    ),
    (
        "inference",
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        "latency",
    ),
    (
        "prefill",
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        "latency",
    ),
    (
        "decode",
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        "latency",
    ),
    (
        "preemptions",
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        "preemptions",
    ),
    (
        "prefill_kv",
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "request_tokens",
    ),
]


def _buckets(family: str, max_model_len: int) -> list[float]:
    fixed = {
        "latency": LATENCY_BUCKETS,
        "ttft": TTFT_BUCKETS,
        "itl": ITL_BUCKETS,
        "iteration": ITERATION_TOKENS_BUCKETS,
        "n": REQUEST_PARAMS_N_BUCKETS,
        "preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
    }
    return list(fixed[family]) if family in fixed else request_tokens_buckets(max_model_len)


def cache_config_labels(kv_cache_tokens: int, max_model_len: int) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels: ``CacheConfig.metrics_info()`` (every field, ``str()``ed,
    in declaration order) as the frontend holds it after start-up, plus ``engine``."""
    blocks = kv_cache_tokens // BLOCK_SIZE
    return {
        "block_size": str(BLOCK_SIZE),
        "user_specified_block_size": "False",
        "kv_cache_layout": "None",
        "prefix_match_unit": "None",
        "gpu_memory_utilization": "0.92",
        "cache_dtype": "auto",
        "is_attention_free": "False",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "enable_prefix_caching": "True",
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": "0",
        "kv_cache_dtype_skip_layers": "[]",
        "mamba_page_size_padded": "None",
        "skip_page_size_padded": "None",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "replayssm_buffer_len": "16",
        "use_replayssm": "False",
        "use_kda_recoverssm": "False",
        "num_gpu_blocks": str(blocks),
        "num_cpu_blocks": "None",
        "effective_attention_block_size": str(BLOCK_SIZE),
        "kv_cache_size_tokens": str(blocks * BLOCK_SIZE),
        "kv_cache_max_concurrency": str(blocks * BLOCK_SIZE / max(1, max_model_len)),
        "hash_block_size": "None",
        "cache_hit_alignment_tokens": "None",
        "kv_sharing_fast_prefill": "False",
        "swa_bounded_replay": "True",
        "kv_cache_memory_bytes": "None",
        "kv_offloading_size": "None",
        "kv_offloading_backend": "native",
        "_block_size_resolved": "True",
        "engine": "0",
    }


def _counter(
    name: str,
    doc: str,
    labelnames: tuple[str, ...],
    rows: Sequence[tuple[Sequence[str], float]],
    created: float,
) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=labelnames)
    for labels, value in rows:
        c.add_metric(labels, value, created=created)
    return c


class _Collector(Collector):
    def __init__(self, owner: SimMetrics) -> None:
        self._o = owner

    def collect(self) -> Iterator[Metric]:
        o = self._o
        eng, labels, t0 = o.engine, [o.model_name, "0"], o.created
        for name, what in (("flops", "floating point operations"), ("read_bytes", "bytes read from memory")):
            yield _counter(
                f"vllm:estimated_{name}_per_gpu_total",
                f"Estimated number of {what} per GPU (for Model Flops Utilization calculations).",
                _LABELS,
                [(labels, 0)],
                t0,
            )
        yield _counter(
            "vllm:estimated_write_bytes_per_gpu_total",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
            _LABELS,
            [(labels, 0)],
            t0,
        )
        deferred = eng.waiting_deferred
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", eng.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", eng.waiting),
        ):
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(labels, value)
            yield g
        g = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=[*_LABELS, "reason"],
        )
        g.add_metric([*labels, "capacity"], eng.waiting - deferred)
        g.add_metric([*labels, "deferred"], deferred)
        yield g
        g = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=[*_LABELS, "sleep_state"],
        )
        for state in SLEEP_STATES:  # the simulator never sleeps
            g.add_metric([*labels, state], 1 if state == "awake" else 0)
        yield g
        g = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=_LABELS
        )
        g.add_metric(labels, eng.kv_cache_usage)
        yield g
        prompt = o.prompt_tokens
        one = [(labels, 0)]
        for name, doc, rows in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                [(labels, prompt)],
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", one),
            (
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, in terms "
                "of number of queried tokens.",
                one,
            ),
            (
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
                "number of cached tokens.",
                one,
            ),
            (
                "vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.",
                one,
            ),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", one),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", one),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", [(labels, prompt)]),
        ):
            yield _counter(name, doc, _LABELS, rows, t0)
        yield _counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            (*_LABELS, "source"),
            [([*labels, s], prompt if s == "local_compute" else 0) for s in PROMPT_SOURCES],
            t0,
        )
        yield _counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            _LABELS,
            one,
            t0,
        )
        yield _counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
            "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            (*_LABELS, "source"),
            [([*labels, s], 0) for s in CACHE_HIT_SOURCES],
            t0,
        )
        yield _counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            _LABELS,
            [(labels, o.generation_tokens)],
            t0,
        )
        yield _counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"),
            [([*labels, r], o.success[r]) for r in FINISH_REASONS],
            t0,
        )
        yield _counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ("model_name", "reason"),
            [([o.model_name, r], 0) for r in ADMISSION_REASONS],
            t0,
        )
        hists = o.hists
        for key, name, doc, _family in _HISTS:
            h = hists[key]
            hm = HistogramMetricFamily(name, doc, labels=_LABELS)
            if key == "prefill_kv":  # same buckets as request_prompt_tokens
                h = hists["prompt"]
            if key == "preemptions":  # every finished request was preempted 0 times
                finished = float(hists["e2e"].count)
                hm.add_metric(labels, [(le, finished) for le in h.les], 0.0)
            else:
                hm.add_metric(labels, h.buckets(), h.total)
            hm.samples.append(Sample(name + "_created", dict(zip(_LABELS, labels, strict=True)), t0, None))
            yield hm
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
        g = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(o.cache_config)
        )
        g.add_metric(list(o.cache_config.values()), 1)
        yield g


class SimMetrics:
    """All metrics of one simulated replica."""

    def __init__(
        self, engine: EngineModel, model_name: str, max_loras: int, max_model_len: int = 8192
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_loras = str(max_loras)
        self.created = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        self.lora_info: dict[tuple[str, str, str], float] = {}
        self._seen_traffic = False
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.hists = {key: Hist(_buckets(family, max_model_len)) for key, _n, _d, family in _HISTS}
        self.cache_config = cache_config_labels(engine.params.kv_cache_tokens, max_model_len)
        engine.on_iteration = self.hists["iteration"].observe
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
        max_tokens: int | None = None,
    ) -> None:
        """One finished (child) request, as vLLM's ``update_from_finished_request``."""
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += completion_tokens
        self.success[finish_reason if finish_reason in self.success else "stop"] += 1
        h = self.hists
        decode = finished_at - first_token_at
        h["ttft"].observe(first_token_at - arrival)
        h["e2e"].observe(finished_at - arrival)
        h["queue"].observe(scheduled_at - arrival)
        h["inference"].observe(finished_at - scheduled_at)
        h["prefill"].observe(first_token_at - scheduled_at)
        h["decode"].observe(decode)
        h["prompt"].observe(prompt_tokens)
        h["generation"].observe(completion_tokens)
        if completion_tokens > 1:
            # one observation per inter-token gap, at the request's mean gap
            tpot = decode / (completion_tokens - 1)
            h["itl"].observe(tpot, completion_tokens - 1)
            h["tpot"].observe(tpot)
        else:
            h["tpot"].observe(0.0)
        if max_tokens:
            h["max_tokens"].observe(max_tokens)

    def observe_parent(self, n: int, max_generation_tokens: int) -> None:
        """All ``n`` choices of one prompt finished (vLLM's ``ParentRequest.observe_finished_request``)."""
        h = self.hists
        h["n"].observe(n)
        h["max_gen"].observe(max_generation_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
