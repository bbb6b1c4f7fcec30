"""How each admin route finds the adapter owners a call acts on (the ``scope`` of
:func:`registry.auth.dependencies.requires`). Each answers ``None`` (defer) when it cannot
tell, so the route answers 404 / 422 as it would for anyone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from kit.errors import LoraplaneError
from registry.repositories import selection
from registry.services import bulk


@dataclass(frozen=True, slots=True)
class _OwnerOfAdapter:
    name: str = "owner of the adapter"
    needs_body: bool = False

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        exists, owner = selection.owner_of(session, path.get("adapter_id", ""))
        return [owner] if exists else None


@dataclass(frozen=True, slots=True)
class _NewAdapterOwner:
    name: str = "owner in the body"
    needs_body: bool = True

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        if not isinstance(body, dict):
            return None
        owner = body.get("owner")
        return [owner] if owner is None or isinstance(owner, str) else None


@dataclass(frozen=True, slots=True)
class _AdapterAndNewOwner:
    name: str = "owner of the adapter, and a new owner"
    needs_body: bool = True

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        exists, owner = selection.owner_of(session, path.get("adapter_id", ""))
        if not exists:
            return None
        out: list[str | None] = [owner]
        if isinstance(body, dict) and "owner" in body:
            new = body["owner"]
            if new is not None and not isinstance(new, str):
                return None
            out.append(new)
        return out


@dataclass(frozen=True, slots=True)
class _OwnerOfPromotion:
    name: str = "owner of the request's adapter"
    needs_body: bool = False

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        exists, owner = selection.owner_of_promotion(session, path.get("promotion_id", ""))
        return [owner] if exists else None


@dataclass(frozen=True, slots=True)
class _SelectedAdapters:
    name: str = "owner of every selected adapter"
    needs_body: bool = True

    def owners(self, session: Session, path: Mapping[str, str], body: Any) -> Sequence[str | None] | None:
        if not isinstance(body, dict):
            return None
        try:
            ids = bulk.select(session, bulk.parse_selector(body.get("selector")))
        except LoraplaneError:
            return None
        return list(selection.owners_of(session, ids).values())


OWNER_OF_ADAPTER = _OwnerOfAdapter()
NEW_ADAPTER_OWNER = _NewAdapterOwner()
ADAPTER_AND_NEW_OWNER = _AdapterAndNewOwner()
OWNER_OF_PROMOTION = _OwnerOfPromotion()
SELECTED_ADAPTERS = _SelectedAdapters()
