"""Registry services: the rules (SPEC §4, §13). One transaction per change, with its audit event
and a revision bump; callers own the transaction (``kit.db.session_scope`` or the admin API's
request-scoped session). Services return plain dataclass records (``records``), never ORM rows.

Modules: ``records``, ``audit`` (change recording, audit queries, ``DbAuditSink``),
``base_models``, ``adapters``, ``lifecycle`` (promote / canary / end canary / rollback / disable /
enable version), ``rollback_chain`` (which version a rollback restores), ``gates``,
``promotions`` and ``staleness`` (approvals), ``versions``, ``tenants``, ``snapshot``,
``bootstrap``. Callers commit through :class:`registry.writer.ChangeWriter`, so every change
reaches the gateways' change feed.
"""
