"""Issue 26 on the rendered Kustomize overlays (``kubectl kustomize``), docker-compose.yml, the
Prometheus/Alertmanager files and docs/deployment.md: the public surface is the OpenAI API only,
each pod gets only its own Secret keys, the Ingress/HTTPRoute carry TLS for the gateway alone,
one ``images:`` line retargets every pod, GPU scheduling, the setup Jobs, the evaluator's gateway
URL, monitoring fixes, rollout hygiene, and every command of the deployment guide."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import yaml

from tests.cli.test_deploy import (
    COMPOSE,
    DEPLOY,
    K8S,
    ROOT,
    _code_metric_names,
    _compose,
    _containers,
    _render,
    _run,
    _tool,
)
from tests.registry.core_support import (  # noqa: F401 - fixtures of the evaluation test
    AUTH,
    add_versions,
    db_url,
    engine,
    factory,
    make_settings,
    pg_migrated,
    seed_adapter,
    sqlite_template,
)
from tests.registry.quality_support import json_cases, jsonl

T = TypeVar("T")
DOC = ROOT / "docs" / "deployment.md"
OPERATIONS = ROOT / "docs" / "operations.md"
PROM = DEPLOY / "prometheus"
PUBLIC_PORT, INTERNAL_PORT = 8080, 9464
Docs = dict[tuple[str, str], dict[str, Any]]


def _docs(overlay: str) -> Docs:
    return {(d["kind"], d["metadata"]["name"]): d for d in _render(overlay)}


@pytest.fixture(scope="module")
def dev() -> Docs:
    return _docs("dev")


@pytest.fixture(scope="module")
def prod() -> Docs:
    return _docs("prod")


@pytest.fixture(scope="module")
def prod_gateway_api() -> Docs:
    return _docs("prod-gateway-api")


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in _containers(doc) if c["name"] == name)


def _workloads(docs: Docs) -> dict[str, dict[str, Any]]:
    return {n: d for (k, n), d in docs.items() if k in ("Deployment", "StatefulSet", "Job")}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- 1. the public surface is the OpenAI API only ----------------------------------------------


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_gateway_metrics_only_on_the_internal_port(overlay: str) -> None:
    from gateway.settings import GatewaySettings

    docs = _docs(overlay)
    gw = docs[("Deployment", "loraplane-gateway")]
    c = _container(gw, "gateway")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": PUBLIC_PORT, "internal": INTERNAL_PORT}
    env = _env(c)
    settings = GatewaySettings.model_validate(
        {
            k.removeprefix("LORAPLANE_").lower(): v
            for k, v in env.items()
            if k.startswith("LORAPLANE_GATEWAY_")
        }
    )
    assert (settings.gateway_port, settings.gateway_internal_port) == (PUBLIC_PORT, INTERNAL_PORT)
    assert settings.gateway_internal_host == "0.0.0.0"  # reachable by Prometheus, fenced by the policy
    assert _pod(gw)["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gw["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(INTERNAL_PORT)
    # the public Service exposes the public port only; the internal one only the metrics port
    public = docs[("Service", "loraplane-gateway")]["spec"]["ports"]
    internal = docs[("Service", "loraplane-gateway-internal")]["spec"]["ports"]
    assert [p["targetPort"] for p in public] == ["http"]
    assert [p["targetPort"] for p in internal] == ["internal"] and internal[0]["port"] == INTERNAL_PORT
    # NetworkPolicy: 8080 from anywhere, 9464 only from the monitoring namespace
    pol = docs[("NetworkPolicy", "gateway-public-and-metrics")]["spec"]
    assert pol["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "loraplane-gateway"}
    for rule in pol["ingress"]:
        ports_ = {p["port"] for p in rule["ports"]}
        if INTERNAL_PORT in ports_:
            assert ports_ == {INTERNAL_PORT}
            assert rule["from"] == [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
            ]
        else:
            assert ports_ == {PUBLIC_PORT} and "from" not in rule
    if overlay == "prod":  # Prometheus scrapes the internal Service's internal port
        sm = docs[("ServiceMonitor", "loraplane-gateway")]["spec"]
        svc = docs[("Service", "loraplane-gateway-internal")]
        assert sm["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert (
            not sm["selector"]["matchLabels"].items()
            <= docs[("Service", "loraplane-gateway")]["metadata"]["labels"].items()
        )
        assert [e["port"] for e in sm["endpoints"]] == ["internal"]


def test_compose_gateway_metrics_internal_and_scraped_there() -> None:
    gw = _compose()["services"]["gateway"]
    env = gw["environment"]
    assert env["LORAPLANE_GATEWAY_INTERNAL_PORT"] == str(INTERNAL_PORT)
    assert [p.rsplit(":", 1)[1] for p in gw["ports"]] == [str(PUBLIC_PORT)], (
        "only the public port is published"
    )
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "loraplane-gateway")
    assert job["static_configs"][0]["targets"] == [f"gateway:{INTERNAL_PORT}"]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"LORAPLANE_GATEWAY_INTERNAL_PORT={INTERNAL_PORT}" in dockerfile  # settings.md: "the image sets"


@pytest.mark.parametrize("overlay", ["dev", "prod", "prod-gateway-api"])
def test_gateway_pools_expand_every_variable(overlay: str) -> None:
    """The kubelet expands ``$(VAR)`` in LORAPLANE_POOLS from envFrom and the env entries before
    it; the overlays' patches move LORAPLANE_POOLS to the front, so envFrom must define them."""
    from router.settings import PoolConfig

    docs = _docs(overlay)
    secrets = {
        d["metadata"]["name"]: d["stringData"]
        for d in yaml.safe_load_all((K8S / "base" / "secret.template.yaml").read_text())
        if d
    }
    gw = _container(docs[("Deployment", "loraplane-gateway")], "gateway")
    known: dict[str, str] = {}
    for ref in gw["envFrom"]:
        if "configMapRef" in ref:
            known |= docs[("ConfigMap", ref["configMapRef"]["name"])]["data"]
        else:
            known |= {k: f"<{k}>" for k in secrets[ref["secretRef"]["name"]]}
    raw = ""
    for e in gw["env"]:
        if e["name"] == "LORAPLANE_POOLS":
            raw = e["value"]
            break
        known[e["name"]] = e.get("value", f"<{e['name']}>")
    refs = set(re.findall(r"\$\((\w+)\)", raw))
    assert refs == {"VLLM_API_KEY", "LORAPLANE_AGENT_TOKEN"}
    assert refs <= known.keys(), f"unexpanded in LORAPLANE_POOLS: {sorted(refs - known.keys())}"
    pools = json.loads(re.sub(r"\$\((\w+)\)", lambda m: known[m.group(1)], raw))
    pool = PoolConfig.model_validate(pools[0])
    assert pool.api_key is not None and pool.api_key.get_secret_value() == "<VLLM_API_KEY>"


# -- 2. least privilege for secrets -----------------------------------------------------------


def _template_secrets() -> dict[str, set[str]]:
    path = K8S / "base" / "secret.template.yaml"
    return {d["metadata"]["name"]: set(d["stringData"]) for d in yaml.safe_load_all(path.read_text()) if d}


def _secret_keys(pod: dict[str, Any], container: dict[str, Any], secrets: dict[str, set[str]]) -> set[str]:
    keys: set[str] = set()
    for ref in container.get("envFrom", []):
        if "secretRef" in ref:
            keys |= secrets[ref["secretRef"]["name"]]
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in secrets[ref["name"]], ref
            keys.add(ref["key"])
    mounted = {m["name"] for m in container.get("volumeMounts", [])}
    for v in pod.get("volumes", []):
        if "secret" in v and v["name"] in mounted:
            keys |= secrets[v["secret"]["secretName"]]
    return keys


BACKENDS = {
    "LORAPLANE_DATABASE_URL", "LORAPLANE_REDIS_URL", "LORAPLANE_S3_ACCESS_KEY_ID",
    "LORAPLANE_S3_SECRET_ACCESS_KEY",
}  # fmt: skip
EXPECTED_KEYS = {
    ("loraplane-registry", "db-upgrade"): {"LORAPLANE_DATABASE_URL"},
    ("loraplane-registry", "registry"): BACKENDS | {"LORAPLANE_ADMIN_TOKEN"},
    ("loraplane-gateway", "gateway"): BACKENDS | {"VLLM_API_KEY", "LORAPLANE_AGENT_TOKEN"},
    ("vllm", "vllm"): {"VLLM_API_KEY", "HF_TOKEN"},
    ("vllm", "agent"): {"LORAPLANE_AGENT_TOKEN"},
    ("loraplane-bucket-init", "bucket-init"): {
        "LORAPLANE_S3_ACCESS_KEY_ID",
        "LORAPLANE_S3_SECRET_ACCESS_KEY",
    },
    ("loraplane-model-download", "model-download"): {"HF_TOKEN"},
    ("loraplane-register-base-model", "register-base-model"): {"LORAPLANE_ADMIN_TOKEN"},
}


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_each_pod_reads_only_its_secret_keys(overlay: str) -> None:
    docs = _docs(overlay)
    secrets = _template_secrets()
    assert not [k for k in docs if k[0] == "Secret"], "Secrets are created out of band, never rendered"
    seen = {}
    for name, w in _workloads(docs).items():
        pod = _pod(w)
        assert pod.get("automountServiceAccountToken") is False, f"{name}: no API token in the pod"
        for c in _containers(w):
            seen[(name, c["name"])] = _secret_keys(pod, c, secrets)
    assert seen == EXPECTED_KEYS
    admin_readers = {k for k, keys in seen.items() if "LORAPLANE_ADMIN_TOKEN" in keys}
    assert admin_readers == {("loraplane-registry", "registry"), ("loraplane-register-base-model",
                                                                   "register-base-model")}  # fmt: skip


# -- 3. Ingress / HTTPRoute: TLS, the gateway only ---------------------------------------------


def test_prod_ingress_is_tls_to_the_gateway_api_only(prod: Docs, dev: Docs) -> None:
    ingresses = [d for (k, _), d in prod.items() if k == "Ingress"]
    assert len(ingresses) == 1
    spec = ingresses[0]["spec"]
    tls_hosts = {h for t in spec["tls"] for h in t["hosts"]}
    assert all(t["secretName"] for t in spec["tls"])
    for rule in spec["rules"]:
        assert rule["host"] in tls_hosts, "every routed host is served over TLS"
        for path in rule["http"]["paths"]:
            assert (path["path"], path["pathType"]) == ("/v1", "Prefix")
            assert path["backend"]["service"] == {"name": "loraplane-gateway", "port": {"name": "http"}}
    assert not [k for k in dev if k[0] in ("Ingress", "HTTPRoute")], "dev publishes nothing"
    for docs in (dev, prod):
        reg = docs[("Service", "loraplane-registry")]["spec"]
        assert reg.get("type", "ClusterIP") == "ClusterIP"
        assert not any(d["spec"].get("type") in ("LoadBalancer", "NodePort") for (k, _), d in docs.items()
                       if k == "Service")  # fmt: skip
        pol = docs[("NetworkPolicy", "registry-only-from-operators")]["spec"]
        assert pol["ingress"][0]["from"][0] == {
            "podSelector": {"matchLabels": {"loraplane.io/admin-client": "true"}}
        }


def test_gateway_api_alternative(prod_gateway_api: Docs) -> None:
    docs = prod_gateway_api
    assert not [k for k in docs if k[0] == "Ingress"], "the component replaces the Ingress"
    gw = docs[("Gateway", "loraplane-public")]["spec"]
    listeners = gw["listeners"]
    assert [(li["protocol"], li["port"]) for li in listeners] == [("HTTPS", 443)]
    assert listeners[0]["tls"]["mode"] == "Terminate" and listeners[0]["tls"]["certificateRefs"]
    route = docs[("HTTPRoute", "loraplane-gateway")]["spec"]
    assert route["parentRefs"] == [{"name": "loraplane-public", "sectionName": "https"}]
    for rule in route["rules"]:
        assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
        assert rule["backendRefs"] == [{"name": "loraplane-gateway", "port": 80}]
    assert docs[("Service", "loraplane-gateway")]["spec"]["ports"][0]["port"] == 80


# -- 4. images: one line retargets every pod ---------------------------------------------------


def _loraplane_images(docs: Docs) -> set[str]:
    return {c["image"] for w in _workloads(docs).values() for c in _containers(w) if "vllm" not in c["image"]}


def test_one_images_line_retargets_every_pod(prod: Docs, tmp_path: Path) -> None:
    kust = yaml.safe_load((K8S / "overlays" / "prod" / "kustomization.yaml").read_text())
    entry = next(i for i in kust["images"] if i["name"] == "loraplane")
    assert _loraplane_images(prod) == {f"{entry['newName']}:{entry['newTag']}"}
    assert sum(len(_containers(w)) for w in _workloads(prod).values()) == 8
    # the operator edits that one line (newName) in a copy of the tree: every loraplane container moves
    import shutil

    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    kpath = tree / "overlays" / "prod" / "kustomization.yaml"
    before = kpath.read_text()
    after = before.replace(f"newName: {entry['newName']}", "newName: reg.acme.io/lp")
    assert sum(a != b for a, b in zip(before.splitlines(), after.splitlines(), strict=True)) == 1
    kpath.write_text(after)
    res = _run([_tool("kubectl"), "kustomize", str(tree / "overlays" / "prod")])
    assert res.returncode == 0, res.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(res.stdout) if d}
    assert _loraplane_images(docs) == {f"reg.acme.io/lp:{entry['newTag']}"}
    text = DOC.read_text()
    assert "No loraplane image is published" in text


def test_build_image_push_takes_a_reference(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(0o755)
    record = tmp_path / "args"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "RECORD": str(record)}
    full = "reg.example.com:5000/acme/loraplane:1.2.3"
    for ref, tag in ((full, full), ("reg.example.com:5000/acme/loraplane", None)):
        res = _run(["bash", str(DEPLOY / "build-image.sh"), "--push", ref], env=env)
        assert res.returncode == 0, res.stderr
        args = record.read_text().splitlines()
        assert args[:2] == ["buildx", "build"] and "--push" in args and ref not in args[-1:]
        got = args[args.index("--tag") + 1]
        if tag:
            assert got == tag
        else:
            assert got.startswith(ref + ":") and got != ref + ":"


# -- 5. GPU nodes ------------------------------------------------------------------------------


def test_prod_vllm_on_gpu_nodes(prod: Docs) -> None:
    sts = prod[("StatefulSet", "vllm")]
    pod = _pod(sts)
    vllm = _container(sts, "vllm")
    res = vllm["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == 2
    vcm = prod[("ConfigMap", "loraplane-vllm")]["data"]
    assert int(vcm["TENSOR_PARALLEL_SIZE"]) == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
    shm = vols[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"] == "16Gi"
    probe = vllm["startupProbe"]
    assert probe["httpGet"]["path"] == "/health"
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 30 * 60, "slow model loads"
    weights = mounts["/models"]
    assert weights["readOnly"] is True
    claim = vols[weights["name"]]["persistentVolumeClaim"]
    pvc = prod[("PersistentVolumeClaim", claim["claimName"])]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], "replicas on several nodes share the weights"
    assert vllm["args"][0] == "/models/$(SERVED_MODEL_NAME)"
    assert _env(vllm)["HF_HUB_OFFLINE"] == "1"
    sc = vllm["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    # nothing else asks for a GPU, and only vLLM runs on the GPU nodes
    for name, w in _workloads(prod).items():
        if name != "vllm":
            assert "nodeSelector" not in _pod(w) and "tolerations" not in _pod(w)
            for c in _containers(w):
                assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))
    text = DOC.read_text()
    assert "NVIDIA device plugin" in text and "GPU Operator" in text


def test_dev_vllm_gpu_request_equals_limit(dev: Docs) -> None:
    vllm = _container(dev[("StatefulSet", "vllm")], "vllm")
    assert (
        vllm["resources"]["requests"]["nvidia.com/gpu"] == vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    )


# -- 6. setup Jobs -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_setup_jobs(overlay: str) -> None:
    docs = _docs(overlay)
    jobs = {n for (k, n) in docs if k == "Job"}
    assert jobs == {"loraplane-bucket-init", "loraplane-model-download", "loraplane-register-base-model"}
    for name in jobs:
        job = docs[("Job", name)]
        assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "setup"
        assert _pod(job)["restartPolicy"] == "OnFailure"
    reg = docs[("Job", "loraplane-register-base-model")]
    assert (
        _pod(reg)["containers"][0]["image"]
        == _pod(docs[("Deployment", "loraplane-registry")])["containers"][0]["image"]
    )
    labels = reg["spec"]["template"]["metadata"]["labels"]
    assert labels["loraplane.io/admin-client"] == "true", "the registry's NetworkPolicy must admit it"
    env = _env(_pod(reg)["containers"][0])
    url = urlsplit(env["LORAPLANE_ADMIN_URL"])
    svc = docs[("Service", "loraplane-registry")]
    assert url.hostname == f"{svc['metadata']['name']}.loraplane.svc.cluster.local"
    assert url.port == svc["spec"]["ports"][0]["port"]
    # the model-download Job writes the volume the replicas and the register Job read
    claims = {
        n: {v["persistentVolumeClaim"]["claimName"] for v in _pod(docs[(k, n)])["volumes"]
            if "persistentVolumeClaim" in v}
        for k, n in (("Job", "loraplane-model-download"), ("Job", "loraplane-register-base-model"),
                     ("StatefulSet", "vllm"))
    }  # fmt: skip
    assert len(set.union(*claims.values())) == 1 and all(claims.values())


def _job_script(overlay: str, name: str) -> str:
    job = _docs(overlay)[("Job", name)]
    return str(_pod(job)["containers"][0]["args"][0])


def test_bucket_init_job_is_idempotent_on_a_real_s3(s3_server: Any) -> None:
    """The Job's script, run twice against SeaweedFS: creates the bucket, then finds it."""
    script = _job_script("prod", "loraplane-bucket-init")
    bucket = f"lp-init-{os.getpid()}-{int(time.time())}"
    env = {
        **os.environ,
        "LORAPLANE_S3_BUCKET": bucket,
        "LORAPLANE_S3_ENDPOINT_URL": s3_server.endpoint_url,
        "LORAPLANE_S3_REGION": s3_server.region,
        "LORAPLANE_S3_ACCESS_KEY_ID": s3_server.access_key,
        "LORAPLANE_S3_SECRET_ACCESS_KEY": s3_server.secret_key,
    }
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert first.returncode == 0 and "created" in first.stdout, first.stderr
    s3_server.client().head_bucket(Bucket=bucket)
    second = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0 and "exists" in second.stdout, second.stderr


def test_register_base_model_job_uses_the_real_cli(tmp_path: Path) -> None:
    script = _job_script("prod", "loraplane-register-base-model")
    assert "loraplane base-models list --json" in script
    add = re.search(r"loraplane base-models add (.+?)(?<!\\)$", script.replace("\\\n", " "), re.M)
    assert add, script
    argv = shlex.split(add.group(1))
    opts = {a for a in argv if a.startswith("--")}
    assert opts == {"--config", "--max-lora-rank", "--hf-id"}
    assert argv[argv.index("--config") + 1] == "$dir" or "/models/" in script
    res = _run([sys.executable, "-m", "loraplane.cli", "base-models", "add", "--help"])
    assert res.returncode == 0, res.stderr
    for opt in opts:
        assert opt in res.stdout
    # the "already registered" check reads both list shapes
    check = re.search(r"python -c '(.+?)'", script, re.S)
    assert check
    for listing, rc in (
        ([{"name": "qwen2.5-14b-instruct"}], 0),
        ({"items": [{"name": "other"}]}, 1),
        ([], 1),
    ):
        listing_file = tmp_path / "base-models.json"
        listing_file.write_text(json.dumps(listing))
        code = check.group(1).replace("/tmp/base-models.json", str(listing_file))
        env = {**os.environ, "SERVED_MODEL_NAME": "qwen2.5-14b-instruct"}
        got = subprocess.run([sys.executable, "-c", code], env=env, timeout=30).returncode
        assert got == rc, listing


# -- 7. evaluations run in the deployments ----------------------------------------------------


def _evaluation_config(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What starting an evaluation needs first: the registry's EvaluationWorker's RunConfig,
    from settings read out of the deployment's environment (it raised before the fix)."""
    from registry.quality.settings import EvaluatorSettings
    from registry.quality.worker import EvaluationWorker

    for key in [k for k in os.environ if k.startswith("LORAPLANE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = EvaluatorSettings()
    assert settings.eval_in_process is True

    def no_writes(fn: Callable[[Any], T]) -> T:
        raise AssertionError("reading the configuration writes nothing")

    worker = EvaluationWorker(settings, no_writes)
    return worker.config()


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_k8s_registry_can_start_an_evaluation(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(overlay)
    reg = _container(docs[("Deployment", "loraplane-registry")], "registry")
    env = {k: v for k, v in _env(reg).items() if isinstance(v, str)}
    env |= docs[("ConfigMap", "loraplane-config")]["data"]
    cfg = _evaluation_config(env, monkeypatch)
    url = urlsplit(cfg.gateway_url)
    svc = docs[("Service", "loraplane-gateway")]
    assert url.scheme == "http" and url.hostname == "loraplane-gateway.loraplane.svc.cluster.local"
    port = next(p for p in svc["spec"]["ports"] if p["port"] == url.port)
    assert port["targetPort"] == "http", "the evaluator goes through the public OpenAI port"
    pol = docs[("NetworkPolicy", "gateway-public-and-metrics")]["spec"]["ingress"]
    assert any(r["ports"] == [{"port": PUBLIC_PORT, "protocol": "TCP"}] and "from" not in r for r in pol)


def test_compose_registry_can_start_an_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose()["services"]
    env = {k: str(v) for k, v in services["registry"]["environment"].items()}
    cfg = _evaluation_config(env, monkeypatch)
    url = urlsplit(cfg.gateway_url)
    assert url.hostname in services and url.hostname == "gateway"
    assert str(url.port) == services["gateway"]["environment"]["LORAPLANE_GATEWAY_PORT"]
    shared = set(services["registry"]["networks"]) & set(services["gateway"]["networks"])
    assert shared, "the registry reaches the gateway on a shared network"


def _deployment_eval_env(source: str) -> dict[str, str]:
    if source == "compose":
        return {k: str(v) for k, v in _compose()["services"]["registry"]["environment"].items()}
    docs = _docs("prod")
    reg = _container(docs[("Deployment", "loraplane-registry")], "registry")
    return {k: v for k, v in _env(reg).items() if isinstance(v, str)}


@pytest.mark.parametrize("source", ["compose", "k8s"])
def test_an_evaluation_starts_with_the_deployment_settings(
    source: str,
    tmp_path: Path,
    db_url: str,  # noqa: F811 - the fixture imported above
    engine: Any,  # noqa: F811
    factory: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The admin API built with the evaluator settings read from the deployment's registry
    environment starts an evaluation (202, running) and runs it against the deployment's gateway
    URL; that host does not resolve here, so the run then fails naming it — instead of the
    "no gateway is configured" refusal a registry without LORAPLANE_EVAL_GATEWAY_URL gives."""
    from fastapi.testclient import TestClient

    from registry.api import create_admin_app
    from registry.quality.settings import EvaluatorSettings

    env = {k: v for k, v in _deployment_eval_env(source).items() if k.startswith("LORAPLANE_EVAL_")}
    for key in [k for k in os.environ if k.startswith("LORAPLANE_EVAL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = EvaluatorSettings(eval_request_timeout_s=5)
    url = settings.gateway_url()
    assert url == env["LORAPLANE_EVAL_GATEWAY_URL"].rstrip("/")
    app = create_admin_app(make_settings(tmp_path, db_url), engine=engine, evaluator_settings=settings)
    v1 = "/admin/v1"
    with TestClient(app, headers=AUTH) as c:
        seed_adapter(c, "shop")
        (version,) = add_versions(factory, "shop", 1)
        r = c.put(f"{v1}/adapters/shop/regression-set", content=jsonl(json_cases(2)),
                  headers={"content-type": "application/jsonl"})  # fmt: skip
        assert r.status_code in (200, 201), r.text
        r = c.post(f"{v1}/adapters/shop/versions/{version}/evaluations")
        assert r.status_code == 202, r.text
        started = r.json()
        assert started["status"] == "running"
        deadline = time.monotonic() + 90
        while True:
            ev = c.get(f"{v1}/adapters/shop/versions/{version}/evaluations/{started['id']}").json()
            if ev["status"] != "running":
                break
            assert time.monotonic() < deadline, ev
            time.sleep(0.2)
    assert ev["status"] == "failed"
    assert f"cannot reach the gateway at {url}" in ev["error"], ev["error"]
    assert "no gateway is configured" not in ev["error"]


# -- 8. monitoring -----------------------------------------------------------------------------


def test_inhibit_rule_is_per_pool_and_targets_carry_pool() -> None:
    cfg = yaml.safe_load((PROM / "alertmanager.example.yml").read_text())
    rules = yaml.safe_load((PROM / "loraplane-alerts.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert cfg["inhibit_rules"]
    for rule in cfg["inhibit_rules"]:
        assert rule["equal"] == ["pool"]
        target = re.search(r'alertname=~"(.+)"', rule["target_matchers"][0])
        assert target
        for name in target.group(1).split("|"):
            expr = alerts[name]["expr"]
            # a target without a pool label is never inhibited by a pool-scoped source
            assert "by (pool)" in expr or 'job="vllm"' in expr, name
    # vLLM scrape targets (LoraplaneReplicaDown's `up`) carry `pool`, in compose and on Kubernetes
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    vllm = next(j for j in prom["scrape_configs"] if j["job_name"] == "vllm")
    assert all(sc["labels"]["pool"] for sc in vllm["static_configs"])
    sm = next(d for d in yaml.safe_load_all((K8S / "monitoring" / "servicemonitor.yaml").read_text())
              if d and d["metadata"]["name"] == "vllm")  # fmt: skip
    relabel = sm["spec"]["endpoints"][0]["relabelings"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_loraplane_io_pool"],
        "targetLabel": "pool",
    } in relabel
    sts = yaml.safe_load_all((K8S / "base" / "vllm.yaml").read_text())
    pod_labels = next(d for d in sts if d["kind"] == "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["loraplane.io/pool"] == "gpu"


def test_alertmanager_inhibits_only_the_same_pool(tmp_path: Path) -> None:
    """A real Alertmanager with the example config: pool a's outage mutes pool a's replica-down,
    not pool b's."""
    amtool = _tool("amtool")
    binary = Path(amtool).with_name("prometheus-alertmanager")
    if not binary.exists():
        found = _tool("alertmanager")
        binary = Path(found)
    from kit.localservices import free_port

    port, cport = free_port(), free_port()
    proc = subprocess.Popen(
        [str(binary), f"--config.file={PROM / 'alertmanager.example.yml'}", f"--storage.path={tmp_path}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
         f"--cluster.advertise-address=127.0.0.1:{cport}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    import httpx

    base = f"http://127.0.0.1:{port}/api/v2"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{base}/status", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        alerts = [
            {"labels": {"alertname": "LoraplaneReplicasUnhealthy", "pool": "a", "severity": "critical"}},
            {
                "labels": {
                    "alertname": "LoraplaneReplicaDown",
                    "pool": "a",
                    "instance": "a-0",
                    "severity": "critical",
                }
            },
            {
                "labels": {
                    "alertname": "LoraplaneReplicaDown",
                    "pool": "b",
                    "instance": "b-0",
                    "severity": "critical",
                }
            },
        ]
        assert httpx.post(f"{base}/alerts", json=alerts, timeout=5).status_code == 200
        state: dict[str, list[str]] = {}
        for _ in range(50):
            got = httpx.get(f"{base}/alerts", timeout=5).json()
            state = {a["labels"].get("instance", "source"): a["status"]["inhibitedBy"] for a in got}
            if len(state) == 3 and state["a-0"]:
                break
            time.sleep(0.2)
        assert state["a-0"], "pool a's replica-down is inhibited by pool a's outage"
        assert state["b-0"] == [], "pool b's replica-down is not"
        assert state["source"] == []
    finally:
        proc.terminate()
        proc.wait(10)


def _panel(pid: int) -> dict[str, Any]:
    dash = json.loads((DEPLOY / "grafana" / "loraplane-dashboard.json").read_text())
    return next(p for p in dash["panels"] if p["id"] == pid)


def test_panel_24_shows_running_and_waiting_promtool(tmp_path: Path) -> None:
    """promtool evaluates panel 24's queries on two replicas: both series come back for each
    (an `or` of two `sum by (instance)` returned only the running ones)."""
    promtool = _tool("promtool")
    targets = _panel(24)["targets"]
    assert not any(" or " in t["expr"] for t in targets)
    exprs = {t["legendFormat"]: t["expr"] for t in targets}
    assert set(exprs) == {"{{instance}} running", "{{instance}} waiting"}
    series = {"running": {"r0": 3, "r1": 1}, "waiting": {"r0": 7, "r1": 0}}
    input_series = [
        {"series": f'vllm:num_requests_{kind}{{job="vllm", instance="{inst}"}}', "values": f"{v}x5"}
        for kind, by in series.items()
        for inst, v in by.items()
    ]
    tests = [{"expr": e, "eval_time": "2m",
              "exp_samples": [{"labels": f'{{instance="{inst}"}}', "value": v}
                              for inst, v in series[legend.split()[1]].items()]}
             for legend, e in exprs.items()]  # fmt: skip
    broken = 'sum by (instance) (vllm:num_requests_running{job="vllm"}) or sum by (instance) (vllm:num_requests_waiting{job="vllm"})'  # noqa: E501
    tests.append({"expr": broken, "eval_time": "2m",  # what the old query showed: no waiting series at all
                  "exp_samples": [{"labels": f'{{instance="{i}"}}', "value": v} for i, v in series["running"].items()]})  # fmt: skip  # noqa: E501
    path = tmp_path / "panel24.test.yml"
    path.write_text(yaml.safe_dump({"tests": [{"interval": "1m", "input_series": input_series,
                                                "promql_expr_test": tests}]}))  # fmt: skip
    res = _run([promtool, "test", "rules", str(path)])
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_operations_doc_names_only_exported_metrics() -> None:
    defined = _code_metric_names()
    names = set(re.findall(r"\b(loraplane_[a-z0-9_]+)", OPERATIONS.read_text()))
    assert names
    missing = {n for n in names if re.sub(r"_(total|bucket|sum|count|created)$", "", n) not in defined}
    assert not missing, f"docs/operations.md names metrics the code does not export: {sorted(missing)}"


def test_every_alert_has_a_firing_promtool_test() -> None:
    rules = yaml.safe_load((PROM / "loraplane-alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((PROM / "tests" / "loraplane-alerts.test.yml").read_text())["tests"]
    firing = {
        case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")
    }
    assert alerts - firing == set(), f"alerts without a firing test: {sorted(alerts - firing)}"


# -- 9. rollout hygiene ------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["dev", "prod", "prod-gateway-api"])
def test_no_replicas_under_an_hpa_and_migrations_in_the_registry(overlay: str) -> None:
    docs = _docs(overlay)
    for (kind, _), hpa in docs.items():
        if kind == "HorizontalPodAutoscaler":
            ref = hpa["spec"]["scaleTargetRef"]
            assert "replicas" not in docs[(ref["kind"], ref["name"])]["spec"], ref["name"]
    migrators = [
        (n, c["name"])
        for n, w in _workloads(docs).items()
        for c in _containers(w)
        if c.get("args") == ["db", "upgrade"]
    ]
    assert migrators == [("loraplane-registry", "db-upgrade")]
    reg = _pod(docs[("Deployment", "loraplane-registry")])
    assert reg["initContainers"][0]["name"] == "db-upgrade"
    assert "advisory lock" in DOC.read_text()


# -- the deployment guide: every command real --------------------------------------------------


def _doc_commands() -> list[str]:
    """Every command line of the guide's ```bash blocks (continuations joined, comments dropped)."""
    text = DOC.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_deployment_guide_walks_in_order() -> None:
    whole = DOC.read_text()
    text = whole[whole.index("## Kubernetes: from an empty GPU cluster") :]
    steps = [
        "NVIDIA device plugin", "deploy/build-image.sh --push",
        "kubectl apply -f deploy/k8s/base/namespace.yaml",
        "kubectl apply -f /tmp/loraplane-secrets.yaml", "kubectl apply -k deploy/k8s/overlays/prod",
        "job/loraplane-register-base-model", "port-forward", "loraplane tenants key", "/v1/chat/completions",
    ]  # fmt: skip
    positions = [text.find(s) for s in steps]
    assert all(p >= 0 for p in positions), [s for s, p in zip(steps, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "the guide's steps are out of order"
    for needed in (
        "enforc",
        "Prometheus Operator",
        "monitoring` namespace",
        "No loraplane image is published",
    ):
        assert needed in whole, needed


def test_deployment_guide_commands_are_real() -> None:
    """kubectl kustomize/apply -k targets render, files exist, `loraplane …` commands parse."""
    kubectl = _tool("kubectl")
    commands = _doc_commands()
    assert len(commands) >= 15
    rendered: set[str] = set()
    cli_checked = 0
    for cmd in commands:
        for part in re.split(r"\s*(?:&&|\|)\s*", cmd):
            part = re.sub(r"^\w+=\$\(", "", part).rstrip(")")  # KEY=$(loraplane … | tail -n 1)
            try:
                argv = shlex.split(part)
            except ValueError:
                continue
            while len(argv) > 1 and re.match(r"^[A-Z_]+=", argv[0]):  # VAR=value command …
                argv = argv[1:]
            if not argv:
                continue
            for arg in argv:  # every repository path named exists
                path = arg.split("=", 1)[-1]
                if path.startswith(("deploy/", "docs/")) and not any(ch in path for ch in "$*<>"):
                    assert (ROOT / path).exists(), f"{cmd}: {path} does not exist"
            if argv[0] == "kubectl" and ("-k" in argv or argv[1:2] == ["kustomize"]):
                target = argv[argv.index("-k") + 1] if "-k" in argv else argv[2]
                if target not in rendered:
                    res = _run([kubectl, "kustomize", str(ROOT / target)])
                    assert res.returncode == 0, f"{cmd}: {res.stderr}"
                    rendered.add(target)
            if argv[0] == "kubectl" and "-f" in argv:
                target = argv[argv.index("-f") + 1]
                if target.startswith("deploy/"):
                    assert yaml.safe_load_all((ROOT / target).read_text())
            if argv[0] == "loraplane":
                words = [a for a in argv[1:] if not a.startswith("-")][:2]
                group = [words[0]] if words and words[0] in ("db",) else words
                res = _run([sys.executable, "-m", "loraplane.cli", *group, "--help"])
                assert res.returncode == 0, f"{cmd}: {res.stdout}{res.stderr}"
                for opt in (a.split("=")[0] for a in argv if a.startswith("--")):
                    assert opt in res.stdout, f"{cmd}: {opt} is not an option"
                cli_checked += 1
            if argv[0].startswith("deploy/"):
                assert os.access(ROOT / argv[0], os.X_OK), argv[0]
    assert {"deploy/k8s/overlays/prod"} <= rendered
    assert cli_checked >= 3
    assert COMPOSE.is_file()
