"""The vLLM driver parses only the metric families placement reads (``wanted_lines``): the same
values as parsing a replica's whole ``/metrics``, on the simulator's full exposition."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from router.drivers.vllm import VllmDriver, wanted_lines
from simulator.engine import EngineModel
from simulator.metrics import SimMetrics
from simulator.timing import TimingParams

WANTED = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
}

EXTRA = """# HELP vllm:num_requests_running_extra a family whose name starts like a wanted one
# TYPE vllm:num_requests_running_extra gauge
vllm:num_requests_running_extra{engine="0"} 99.0
# TYPE vllm:kv_cache_usage_perc_total counter
vllm:kv_cache_usage_perc_total{engine="0"} 7.0
"""


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
        if f.name in WANTED
    }


def exposition() -> str:
    m = SimMetrics(EngineModel(TimingParams.zero()), "demo-base", 4)
    m.mark_traffic()
    for i in range(3):
        m.observe_finished(
            prompt_tokens=10 + i, completion_tokens=5, finish_reason="stop", arrival=0.0,
            scheduled_at=0.01, first_token_at=0.02, finished_at=0.05, max_tokens=16,
        )  # fmt: skip
    m.lora_info[("4", "a,b", "c")] = 3.0e9  # later than any record of the real clock
    m.lora_info[("4", "b", "")] = 3.1e9
    return m.render().decode() + EXTRA


async def test_filtered_parse_equals_the_whole_parse_on_the_simulators_exposition() -> None:
    text = exposition()
    assert text.count("\n") > 300  # the whole exposition: histograms and all
    kept = wanted_lines(text)
    assert kept.count("\n") < 25
    whole = families(text)
    assert set(whole) == WANTED
    assert families(kept) == whole
    async with aiohttp.ClientSession() as s:
        sample = VllmDriver(s).parse_metrics(text)
    assert sample.lora_running == ("b",) and sample.max_lora == 4  # the latest lora_requests_info
    assert sample.waiting_by_reason == {"capacity": 0, "deferred": 0}


async def test_a_malformed_family_placement_does_not_read_is_ignored() -> None:
    text = exposition() + "vllm:something_else{oops 1\n"
    async with aiohttp.ClientSession() as s:
        sample = VllmDriver(s).parse_metrics(text)
    assert sample.max_lora == 4
