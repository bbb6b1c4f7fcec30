"""Rows that migration upgrade tests seed before upgrading (schema at 0004 or later)."""

from __future__ import annotations

import sqlalchemy as sa


def seed_adapter_rows(conn: sa.Connection, *, owner: str) -> None:
    """Base model ``b``, adapter ``a`` (with ``owner``) and its active version 1."""
    conn.execute(sa.text(
        "INSERT INTO base_models (name, hf_id, max_lora_rank, target_modules, approvals_required, "
        "created_at) VALUES ('b', 'o/b', 8, '[\"q_proj\"]', 0, CURRENT_TIMESTAMP)"
    ))  # fmt: skip
    conn.execute(
        sa.text(
            "INSERT INTO adapters (id, base_model, owner, status, hot, created_at) "
            "VALUES ('a', 'b', :owner, 'active', false, CURRENT_TIMESTAMP)"
        ),
        {"owner": owner},
    )
    conn.execute(sa.text(
        "INSERT INTO versions (adapter_id, number, status, rank, lora_alpha, target_modules, files, "
        "storage_uri, quality_gate, created_by, created_at) VALUES ('a', 1, 'active', 8, 16.0, "
        "'[\"q_proj\"]', '[]', 'file:///x/', 'skipped', 't', CURRENT_TIMESTAMP)"
    ))  # fmt: skip
