"""The whole product in front of the real vLLM replicas, for the end-to-end engine tests.

``start_platform`` runs ``loraplane db upgrade`` then ``loraplane serve --role all`` as a
``kit.procs.ManagedProcess`` (own process group) on PostgreSQL, Redis and the S3 server, with
one pool made of the two real vLLM replicas (local staging directory shared with them),
registers the tiny base model, a tenant and its key, and returns a :class:`Platform`.
``Platform.stop`` stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit import localservices as ls
from kit.procs import ManagedProcess, http_ready
from registry.admin_client import AdminClient
from tests.engine import vllm_env as ve

BASE = ve.SERVED_NAME
TENANT = "engine-e2e"
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_ADAPTERS = 3  # per replica (router), below vLLM's --max-cpu-loras 4


@dataclass
class Platform:
    gateway_url: str
    admin_url: str
    token: str
    key: str
    bucket: str
    s3: ls.S3Server
    replicas: list[ve.VllmReplica]
    proc: ManagedProcess
    log_path: Path
    model_dir: Path
    module_shapes: dict[str, list[int]]
    extra: dict[str, Any] = field(default_factory=dict)
    internal_url: str = ""  # the gateway's internal port: /metrics, the detailed /readyz (SPEC §19)

    def admin(self) -> AdminClient:
        return AdminClient(self.admin_url, self.token, timeout=60.0)

    def log_tail(self, n: int = 4000) -> str:
        return self.proc.log_tail(n)

    def stop(self) -> None:
        self.proc.stop(grace_s=10)


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("loraplane")
    return [str(script)] if script.exists() else [sys.executable, "-m", "loraplane.cli"]


@contextlib.contextmanager
def start_platform(
    *,
    replicas: list[ve.VllmReplica],
    model_dir: Path,
    module_shapes: dict[str, list[int]],
    s3: ls.S3Server,
    redis_url: str,
    workdir: Path,
) -> Iterator[Platform]:
    bucket = s3.create_bucket()
    prefix = ls.unique_redis_prefix("engine")
    staging = workdir / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    token = "engine-admin-token-" + os.urandom(8).hex()
    gw_port, admin_port, internal_port = ls.free_port(), ls.free_port(), ls.free_port()
    pools = [
        {
            "name": "engine",
            "base_model": BASE,
            "served_model": BASE,
            "urls": [r.url for r in replicas],
            "max_loras": ve.MAX_LORAS,
            "max_adapters": MAX_ADAPTERS,
            "staging": {"mode": "local", "dir": str(staging)},
        }
    ]
    with ls.temp_pg_database("engine") as db_url:
        env = {
            **os.environ,
            "LORAPLANE_DATA_DIR": str(workdir / "data"),
            "LORAPLANE_DATABASE_URL": db_url,
            "LORAPLANE_REDIS_URL": redis_url,
            "LORAPLANE_REDIS_PREFIX": prefix,
            "LORAPLANE_ADMIN_TOKEN": token,
            "LORAPLANE_ADMIN_PORT": str(admin_port),
            "LORAPLANE_GATEWAY_PORT": str(gw_port),
            "LORAPLANE_GATEWAY_INTERNAL_PORT": str(internal_port),
            "LORAPLANE_S3_BUCKET": bucket,
            "LORAPLANE_S3_ENDPOINT_URL": s3.endpoint_url,
            "LORAPLANE_S3_ACCESS_KEY_ID": s3.access_key,
            "LORAPLANE_S3_SECRET_ACCESS_KEY": s3.secret_key,
            "LORAPLANE_S3_REGION": s3.region,
            "LORAPLANE_POOLS": json.dumps(pools),
            "LORAPLANE_STAGING_DIR": str(staging),
            "LORAPLANE_POLL_INTERVAL_S": "0.5",
            "LORAPLANE_UNHEALTHY_AFTER": "2",
            # a CPU vLLM busy generating may answer a scrape slowly on a loaded machine; a killed
            # replica still fails at once (connection refused)
            "LORAPLANE_POLL_TIMEOUT_S": "10",
            "LORAPLANE_RECONCILE_INTERVAL_S": "0.5",
            "LORAPLANE_RETIRED_IDLE_UNLOAD_S": "600",
            "LORAPLANE_LOAD_TIMEOUT_S": "60",
        }
        up = subprocess.run([*_cli(), "db", "upgrade"], env=env, capture_output=True, text=True, timeout=600)
        if up.returncode != 0:
            raise RuntimeError(f"loraplane db upgrade failed:\n{up.stdout}\n{up.stderr}")
        log_path = workdir / "serve.log"
        proc = ManagedProcess(
            [*_cli(), "serve", "--role", "all"], env=env, log_path=log_path, name="loraplane serve"
        )
        proc.start()
        platform = Platform(
            gateway_url=f"http://127.0.0.1:{gw_port}",
            admin_url=f"http://127.0.0.1:{admin_port}",
            token=token,
            key="",
            bucket=bucket,
            s3=s3,
            replicas=replicas,
            proc=proc,
            log_path=log_path,
            model_dir=model_dir,
            module_shapes=module_shapes,
            internal_url=f"http://127.0.0.1:{internal_port}",
        )
        try:
            proc.wait_ready(http_ready(f"{platform.gateway_url}/healthz"), 300)
            proc.wait_ready(http_ready(f"{platform.gateway_url}/readyz"), 300)
            with platform.admin() as admin:
                admin.create_base_model(
                    name=BASE,
                    hf_id=f"loraplane/{BASE}",
                    # above the replicas' --max-lora-rank: a rank-32 version passes the registry
                    # and is refused by vLLM itself (the load-failure fallback test)
                    max_lora_rank=2 * ve.MAX_LORA_RANK,
                    target_modules=ALL_MODULES,
                    module_shapes=module_shapes,
                )
                admin.create_tenant(TENANT, base_model_access=True)
                platform.key = str(admin.issue_key(TENANT)["key"])
            yield platform
        finally:
            platform.stop()
            ls.flush_redis_prefix(redis_url, prefix)
