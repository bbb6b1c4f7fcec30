"""The quality calls of :class:`registry.admin_client.AdminClient` (SPEC §16): regression sets,
quality policies, evaluations."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

JSON = dict[str, Any]


def _q(segment: str) -> str:
    return quote(segment, safe="")


class QualityCalls:
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

    def put_regression_set(self, adapter_id: str, body: bytes | str) -> JSON:
        """Upload a regression set: JSON Lines or a JSON array, sent as is."""
        data = body.encode() if isinstance(body, str) else body
        kind = "application/json" if data.lstrip().startswith(b"[") else "application/jsonl"
        return dict(
            self.request(
                "PUT",
                f"/adapters/{_q(adapter_id)}/regression-set",
                content=data,
                headers={"content-type": kind},
            )
        )

    def get_regression_set(self, adapter_id: str, version: int | None = None) -> JSON:
        return dict(
            self.request("GET", f"/adapters/{_q(adapter_id)}/regression-set", params={"version": version})
        )

    def put_quality_policy(self, adapter_id: str, policy: dict[str, float | None]) -> JSON:
        return dict(self.request("PUT", f"/adapters/{_q(adapter_id)}/quality-policy", json_body=policy))

    def get_quality_policy(self, adapter_id: str) -> JSON:
        return dict(self.request("GET", f"/adapters/{_q(adapter_id)}/quality-policy"))

    def start_evaluation(self, adapter_id: str, version: str) -> JSON:
        return dict(self.request("POST", f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/evaluations"))

    def get_evaluation(self, adapter_id: str, version: str, eval_id: str) -> JSON:
        path = f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/evaluations/{_q(eval_id)}"
        return dict(self.request("GET", path))

    def list_evaluations(self, adapter_id: str, version: str | None = None) -> list[JSON]:
        if version is None:
            return self._list_all(f"/adapters/{_q(adapter_id)}/evaluations", {})
        return self._list_all(f"/adapters/{_q(adapter_id)}/versions/{_q(version)}/evaluations", {})
