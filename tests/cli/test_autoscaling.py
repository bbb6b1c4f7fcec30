"""The autoscaling examples of issue 28 (``deploy/autoscaling/``), checked offline: the
HorizontalPodAutoscaler and prometheus-adapter's ConfigMap validate strictly against the
Kubernetes schemas (kubernetes-validate); the KEDA ScaledObject (a CRD without a schema there)
has the fields KEDA requires; all three scale the vLLM StatefulSet of ``deploy/k8s`` on the
pool the gateway configures, and every metric they name is one ``router/metrics.py`` defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
AUTO = ROOT / "deploy" / "autoscaling"
SIGNAL = "loraplane_pool_desired_replicas"


def _doc(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((AUTO / name).read_text()) if d is not None]
    assert len(docs) == 1, name
    doc: dict[str, Any] = docs[0]
    return doc


def _statefulset() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "base" / "vllm.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "StatefulSet")


def _pool_names() -> set[str]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "k8s" / "base" / "gateway.yaml").read_text())
    for d in docs:
        if not d or d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                if env["name"] == "LORAPLANE_POOLS":
                    return {p["name"] for p in json.loads(env["value"])}
    raise AssertionError("no LORAPLANE_POOLS on the gateway Deployment")


def _defined_metrics() -> set[str]:
    return set(re.findall(r'"(loraplane_[a-z0-9_]+)"', (ROOT / "router" / "metrics.py").read_text()))


@pytest.mark.parametrize("name", ["hpa-external.yaml", "prometheus-adapter-rules.yaml"])
def test_manifests_validate_strictly_against_the_kubernetes_schemas(name: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    doc = _doc(name)
    kv.validate(doc, kv.latest_version(), strict=True)  # raises ValidationError on any problem


def test_the_hpa_scales_the_vllm_statefulset_to_the_desired_replicas() -> None:
    hpa, sts = _doc("hpa-external.yaml"), _statefulset()
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("StatefulSet", sts["metadata"]["name"])
    assert hpa["metadata"]["namespace"] == sts["metadata"]["namespace"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == SIGNAL
    assert metric["external"]["metric"]["selector"]["matchLabels"]["pool"] in _pool_names()
    # the metric is a replica count: an average of 1 per replica makes the HPA follow it
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300  # adapters leave with a replica: slowly


def test_prometheus_adapter_serves_the_signal_aggregated_with_max() -> None:
    cm = _doc("prometheus-adapter-rules.yaml")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    rules = {r["name"]["as"]: r for r in config["externalRules"]}
    assert SIGNAL in rules
    for served, rule in rules.items():
        assert re.fullmatch(rule["name"]["matches"], served)
        assert served in rule["seriesQuery"]
        assert rule["metricsQuery"].startswith("max by (")  # every gateway exports the cluster's value
        assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
        assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    assert "by (pool)" in rules[SIGNAL]["metricsQuery"]


def test_keda_scaled_object_has_the_fields_keda_requires() -> None:
    so, sts, hpa = _doc("keda-scaledobject.yaml"), _statefulset(), _doc("hpa-external.yaml")
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert so["metadata"]["name"] and so["metadata"]["namespace"] == sts["metadata"]["namespace"]
    spec = so["spec"]
    assert spec["scaleTargetRef"] == hpa["spec"]["scaleTargetRef"]
    assert spec["scaleTargetRef"]["name"] == sts["metadata"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert spec["pollingInterval"] > 0 and spec["cooldownPeriod"] > 0
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] in ("AverageValue", "Value")
    meta = trigger["metadata"]
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's trigger metadata is string → string
    assert meta["serverAddress"].startswith("http")
    assert float(meta["threshold"]) == 1.0
    query = meta["query"]
    assert query.startswith(f"max({SIGNAL}{{") and query.count("(") == query.count(")")
    pool = re.search(r'pool="([^"]+)"', query)
    assert pool is not None and pool.group(1) in _pool_names()


def test_every_metric_the_examples_name_is_defined_by_the_router() -> None:
    defined = _defined_metrics()
    assert {SIGNAL, "loraplane_adapter_demand_rps", "loraplane_adapter_planned_replicas"} <= defined
    named: set[str] = set()
    for path in AUTO.glob("*.yaml"):
        named |= set(re.findall(r"\bloraplane_[a-z0-9_]+", path.read_text()))
    assert SIGNAL in named
    assert named <= defined, named - defined
    readme = (ROOT / "router" / "placement" / "README.md").read_text()
    for path in AUTO.glob("*.yaml"):
        assert f"`{path.name}`" in readme  # each file is documented
