"""Offline checks of ``deploy/`` and ``docker-compose.yml``: everything parses, references are
consistent, env var names are real settings, PromQL names real metrics, vLLM flags are right."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"

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
    out = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


def _settings_fields() -> set[str]:
    import importlib

    fields: set[str] = set()
    for mod, cls in (
        ("kit.settings", "LoraplaneSettings"),
        ("registry.settings", "RegistrySettings"),
        ("router.settings", "RouterSettings"),
        ("gateway.settings", "GatewaySettings"),
    ):
        try:
            klass = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):  # a package still being written: its fields are unknown
            continue
        fields |= {f"LORAPLANE_{name.upper()}" for name in klass.model_fields}
    return fields


def _code_metric_names() -> set[str]:
    names: set[str] = set()
    for pkg in ("gateway", "router"):
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
    for needed in ("postgres", "redis", "minio", "create-bucket", "registry", "gateway"):
        assert needed in services


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
        assert agent["network_mode"] == f"service:{n}"
        staging = [v for v in svc["volumes"] if v.endswith(":/shared/staging")]
        assert staging and staging[0] in agent["volumes"], f"{n} and its agent must share staging"
    assert len(gpus) == 2, "each replica gets its own GPU"
    assert pools[0]["staging"]["mode"] == "agent" and pools[0]["staging"]["dir"] == "/shared/staging"


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
    cm = next(d for _, d in _k8s_docs() if d["kind"] == "ConfigMap" and "LORAPLANE_POOLS" in d["data"])
    k8s_pools = json.loads(cm["data"]["LORAPLANE_POOLS"])
    for raw in (*compose_pools, *k8s_pools):
        pool = PoolConfig.model_validate(raw)
        assert pool.max_loras == 4 and pool.max_adapters == 8
        assert pool.staging.mode == "agent"
    assert k8s_pools[0]["dns"].startswith("vllm.")


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed here (docker CLI without `compose`)",
)
def test_docker_compose_config_is_valid() -> None:
    env = {**os.environ, **{k: "dummy-secret" for k in REQUIRED_SECRETS}}
    res = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    env.pop("VLLM_API_KEY")
    res = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"], env=env, capture_output=True, text=True
    )
    assert res.returncode != 0 and "VLLM_API_KEY" in res.stderr


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
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (DEPLOY / "k8s" / res).is_file()
    assert "secret.template.yaml" not in kust["resources"]


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
    assert all(any(r.startswith("loraplane_") for r in _metric_refs(e)) for e in exprs)
    _check_metric_names(exprs)
    for p in dash["panels"]:
        assert {"h", "w", "x", "y"} <= p["gridPos"].keys()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_prometheus_config_and_alert_rules() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    for rf in prom["rule_files"]:
        assert (DEPLOY / "prometheus" / Path(rf).name).is_file()
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


# -- image ---------------------------------------------------------------------------------------


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.startswith("# syntax=")
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(f == "python:3.11-slim" for f in froms)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0"))
    assert re.search(r"^HEALTHCHECK ", text, re.M)
    assert re.search(r'^ENTRYPOINT \["loraplane"\]', text, re.M)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    sources = [src for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for src in line.split()[:-1]]
    assert {"pyproject.toml", "alembic.ini", "migrations", "registry"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), f"COPY of missing {src}"
        assert f"!{src}" in ignore or f"!{src}/**" in ignore, f"{src} is excluded from the build context"


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
