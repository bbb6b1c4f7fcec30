"""Container health check: GET ``$HEALTHCHECK_URL`` (default the gateway's /healthz); exit 0 on 2xx.

Used by the Dockerfile's HEALTHCHECK; each compose/k8s service points HEALTHCHECK_URL at its own
port (gateway 8080 /healthz, registry 8081, agent 9090 /healthz).
"""

import os
import sys
import urllib.error
import urllib.request

url = os.environ.get("HEALTHCHECK_URL", "http://127.0.0.1:8080/healthz")
try:
    with urllib.request.urlopen(url, timeout=2) as resp:
        sys.exit(0 if 200 <= resp.status < 300 else 1)
except (urllib.error.URLError, OSError) as exc:
    print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
