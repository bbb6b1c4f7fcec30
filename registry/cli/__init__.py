"""The registry's CLI command groups, assembled into ``loraplane`` by :mod:`loraplane.cli`.

- ``db_app``          → ``loraplane db upgrade|current``
- ``adapters_app``    → ``loraplane adapters create|update|push|register|import|list|show|versions|
  promote|gate|rollback|disable|enable|disable-version|prewarm|replicas|audit|limits|
  regression-set|quality-policy|eval|eval-show|evals|canary-policy|example``
- ``tenants_app``     → ``loraplane tenants create|list|show|key|revoke|grant|ungrant|limits``
- ``base_models_app`` → ``loraplane base-models add|list|show``
- ``owners_app``      → ``loraplane owners limits|show``
- ``principals_app``  → ``loraplane principals create|list|show|update|token|revoke``
- ``promotions_app``  → ``loraplane promotions list|show|approve|reject``
- ``bulk_app``        → ``loraplane bulk rollback|disable|enable``
- ``replicas_app``    → ``loraplane replicas list|plan``
- ``contexts_app``    → ``loraplane contexts list|use``
- ``login``, ``whoami`` → ``loraplane login --url … --token … [--context NAME]``, ``loraplane whoami``

Everything except ``db`` is a pure HTTP client of the admin API (:mod:`registry.admin_client`).
"""

from registry.cli import ops  # noqa: F401  (registers prewarm, replicas, audit on adapters_app)
from registry.cli.adapters import adapters_app
from registry.cli.base_models import base_models_app
from registry.cli.bulk import bulk_app
from registry.cli.canary import canary_policy  # noqa: F401  (registers `adapters canary-policy`)
from registry.cli.context_cmds import contexts_app
from registry.cli.db import db_app
from registry.cli.example import example  # noqa: F401  (registers `adapters example`)
from registry.cli.governance import login, principals_app, promotions_app, whoami  # also `adapters approvals`
from registry.cli.hf_import import import_version  # noqa: F401  (registers `adapters import`)
from registry.cli.limits import owners_app  # also registers `adapters limits`
from registry.cli.quality import evaluate  # noqa: F401  (registers regression-set, quality-policy, eval…)
from registry.cli.replicas import replicas_app
from registry.cli.tenants import tenants_app

__all__ = [
    "adapters_app",
    "base_models_app",
    "bulk_app",
    "contexts_app",
    "db_app",
    "login",
    "owners_app",
    "principals_app",
    "promotions_app",
    "replicas_app",
    "tenants_app",
    "whoami",
]
