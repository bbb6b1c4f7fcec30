"""The registry's admin API (FastAPI), under ``/admin/v1``.

``create_admin_app(settings, *, engine=None, store=None, feed=None, replica_directory=None)``
builds it; modules: ``app`` (factory, error envelope), ``deps`` (state, auth, commit point),
``schemas``, ``routes_adapters``, ``routes_upload``, ``routes_tenants``, ``routes_ops``.
"""

from registry.api.app import create_admin_app

__all__ = ["create_admin_app"]
