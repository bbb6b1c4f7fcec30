"""Regenerate ``vllm-0.32-metrics.txt``: the ``vllm:`` part of a real vLLM's ``/metrics`` at start-up.

Run with the interpreter of an environment that has vLLM installed (the engine tier's venv), not
the project's own::

    ~/.cache/loraplane/engine/vllm-venv/bin/python tests/simulator/data/vllm_metrics_reference.py \\
        > tests/simulator/data/vllm-0.32-metrics.txt

It builds vLLM's own ``PrometheusStatLogger`` (what ``vllm serve --enable-lora`` registers: no
speculative decoding, no KV connector, no watermark, default observability flags) with served
name ``demo-base``, ``--max-model-len 8192`` and ``--max-loras 4`` (the simulator's defaults),
records one empty scheduler-stats update (so ``vllm:lora_requests_info`` appears, as after the
first request) and prints prometheus_client's text exposition. No server, no model, no GPU.
``vllm:cache_config_info`` shows the CacheConfig before engine start-up (``num_gpu_blocks`` etc.
are still None there).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace as NS

from prometheus_client import REGISTRY, generate_latest
from vllm.config import CacheConfig
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import SchedulerStats


def main() -> None:
    cfg = NS(
        observability_config=NS(
            show_hidden_metrics=False,
            kv_cache_metrics=False,
            custom_histogram_buckets=None,
            enable_mfu_metrics=False,
        ),
        model_config=NS(served_model_name="demo-base", max_model_len=8192, is_diffusion=False),
        speculative_config=None,
        kv_transfer_config=None,
        ec_transfer_config=None,
        watermark_config=None,
        lora_config=NS(max_loras=4),
        cache_config=CacheConfig(),
    )
    logger = PrometheusStatLogger(cfg, [0])  # type: ignore[arg-type]
    logger.log_engine_initialized()
    logger.record(SchedulerStats(), None)
    text = generate_latest(REGISTRY).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
