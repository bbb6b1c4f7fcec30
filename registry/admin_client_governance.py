"""The governance calls of :class:`registry.admin_client.AdminClient` (SPEC §14): principals and
their tokens, ``/whoami``, promotion requests, bulk operations, ``approvals_required``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

JSON = dict[str, Any]
BULK_TIMEOUT_S = 900.0  # the answer of a bulk operation (the client's default is 60 s)


def _q(segment: str) -> str:
    return quote(segment, safe="")


class GovernanceCalls:
    """Mixed into ``AdminClient``, which provides :meth:`request` and :meth:`_list_all`."""

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        content: Any = None,
        headers: dict[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> Any:
        raise NotImplementedError

    def _list_all(self, path: str, params: dict[str, Any], limit: int | None = None) -> list[JSON]:
        raise NotImplementedError

    # -- principals ---------------------------------------------------------------------------

    def whoami(self) -> JSON:
        return dict(self.request("GET", "/whoami"))

    def create_principal(self, principal_id: str, role: str, owners: list[str] | None = None) -> JSON:
        body = {"id": principal_id, "role": role, "owners": list(owners or [])}
        return dict(self.request("POST", "/principals", json_body=body))

    def list_principals(self) -> list[JSON]:
        return self._list_all("/principals", {})

    def get_principal(self, principal_id: str) -> JSON:
        return dict(self.request("GET", f"/principals/{_q(principal_id)}"))

    def update_principal(
        self, principal_id: str, *, role: str | None = None, owners: list[str] | None = None
    ) -> JSON:
        body: JSON = {}
        if role is not None:
            body["role"] = role
        if owners is not None:
            body["owners"] = owners
        return dict(self.request("PATCH", f"/principals/{_q(principal_id)}", json_body=body))

    def issue_admin_token(self, principal_id: str) -> JSON:
        """A new ``lpa-…`` token of the principal (the answer is the only place it appears)."""
        return dict(self.request("POST", f"/principals/{_q(principal_id)}/tokens"))

    def revoke_admin_token(self, principal_id: str, token_id: str) -> JSON:
        return dict(self.request("DELETE", f"/principals/{_q(principal_id)}/tokens/{_q(token_id)}"))

    # -- approvals ----------------------------------------------------------------------------

    def update_base_model(self, name: str, *, approvals_required: int) -> JSON:
        body = {"approvals_required": approvals_required}
        return dict(self.request("PATCH", f"/base-models/{_q(name)}", json_body=body))

    def set_adapter_approvals(self, adapter_id: str, approvals_required: int | None) -> JSON:
        """The adapter's own ``approvals_required`` (None: the base model's applies)."""
        body = {"approvals_required": approvals_required}
        return dict(self.request("PATCH", f"/adapters/{_q(adapter_id)}", json_body=body))

    def list_promotions(self, *, status: str | None = None, adapter_id: str | None = None) -> list[JSON]:
        return self._list_all("/promotions", {"status": status, "adapter_id": adapter_id})

    def get_promotion(self, promotion_id: str) -> JSON:
        return dict(self.request("GET", f"/promotions/{_q(promotion_id)}"))

    def approve_promotion(self, promotion_id: str, comment: str | None = None) -> JSON:
        body = {"comment": comment} if comment else None
        return dict(self.request("POST", f"/promotions/{_q(promotion_id)}/approve", json_body=body))

    def reject_promotion(self, promotion_id: str, comment: str | None = None) -> JSON:
        body = {"comment": comment} if comment else None
        return dict(self.request("POST", f"/promotions/{_q(promotion_id)}/reject", json_body=body))

    # -- bulk ---------------------------------------------------------------------------------

    def bulk(self, action: str, selector: JSON, *, dry_run: bool = False, reason: str | None = None) -> JSON:
        """``action``: rollback, disable or enable; ``selector``: one of ``{"adapters": [...]}``,
        ``{"owner"}``, ``{"base_model"}``, ``{"promoted_since"}``."""
        body: JSON = {"selector": selector, "dry_run": dry_run}
        if reason is not None:
            body["reason"] = reason
        # one transaction per adapter: thousands of adapters take minutes on a busy registry
        path = f"/bulk/{_q(action)}"
        return dict(self.request("POST", path, json_body=body, read_timeout=BULK_TIMEOUT_S))
