"""Who is asking: ``RuntimeContext``, the caller's identity as a frozen pydantic model.

It only describes the caller; :mod:`llama_jev.core.context` binds one for a block of work."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, ValidationInfo, field_validator

__all__ = ["FrozenAttributes", "RuntimeContext"]


class FrozenAttributes(Mapping[str, str]):
    """A read-only, hashable ``str -> str`` mapping: the type of ``RuntimeContext.attributes``.

    A frozen model holding a plain ``dict`` could still be changed through that dict
    (``ctx.attributes["team"] = "other"``); this mapping has no mutating methods, and it hashes
    and compares by content so a ``RuntimeContext`` stays hashable.

    Example::

        >>> attrs = FrozenAttributes({"team": "billing"})
        >>> attrs["team"], attrs == {"team": "billing"}
        ('billing', True)
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        # A private copy: later changes to the caller's dict must not show through.
        self._items: dict[str, str] = dict(items) if items is not None else {}

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenAttributes({self._items!r})"


def _freeze(value: Mapping[str, str]) -> Mapping[str, str]:
    return value if isinstance(value, FrozenAttributes) else FrozenAttributes(value)


# Validated as a str -> str mapping (pydantic does not coerce an int to a str), then frozen;
# dumped as a plain dict so model_dump / JSON keep working.
_Attributes = Annotated[Mapping[str, str], AfterValidator(_freeze), PlainSerializer(dict, return_type=dict[str, str])]


def _require_non_blank(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} must not be blank")
    return value


class RuntimeContext(BaseModel):
    """The identity one retrieval runs for. Frozen: it cannot change while work is in flight.

    Attributes:
        user_id: the caller; required and non-blank. It is what ``MetadataAcl``'s users key
            lists and what every decision is made for.
        session_id: an optional conversation or request id, for records and observers.
        tenant_id: the caller's tenant; ``None`` means none (a tenant-checking ACL then denies
            everything).
        roles: the caller's roles, each non-blank.
        attributes: further ``str -> str`` facts for custom ACLs, stored read-only.

    ``None`` means absent; an empty or whitespace-only ``session_id`` / ``tenant_id`` is rejected
    rather than read as a value, since it is almost always an unset variable, and a blank tenant
    could match nodes whose tenant field is blank.

    Example::

        >>> ctx = RuntimeContext(user_id="u1", tenant_id="acme", roles={"support"})
        >>> ctx.roles
        frozenset({'support'})
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    user_id: str = Field(description="The caller. Required, non-blank.")
    session_id: str | None = Field(default=None, description="Conversation or request id, if any.")
    tenant_id: str | None = Field(default=None, description="The caller's tenant, if any.")
    roles: frozenset[str] = Field(default=frozenset(), description="The caller's roles.")
    attributes: _Attributes = Field(
        default_factory=FrozenAttributes,
        description="Further str -> str facts for custom ACLs; read-only.",
    )

    if TYPE_CHECKING:
        # For type checkers only: accept any iterable of roles (a set literal, a list from a
        # token's claims) and any str -> str mapping, which validation turns into a frozenset and
        # a FrozenAttributes. Defined at runtime, a custom __init__ would also run inside
        # model_validate and turn its ValidationErrors into TypeErrors.
        def __init__(
            self,
            *,
            user_id: str,
            session_id: str | None = None,
            tenant_id: str | None = None,
            roles: Iterable[str] = ...,
            attributes: Mapping[str, str] = ...,
        ) -> None: ...

    @field_validator("user_id")
    @classmethod
    def _user_id_not_blank(cls, value: str) -> str:
        return _require_non_blank(value, "user_id")

    @field_validator("session_id", "tenant_id")
    @classmethod
    def _optional_ids_not_blank(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        return _require_non_blank(value, str(info.field_name))

    @field_validator("roles")
    @classmethod
    def _roles_not_blank(cls, value: frozenset[str]) -> frozenset[str]:
        for role in value:
            _require_non_blank(role, "a role")
        return value


# No default: "nothing bound" must be distinguishable from any identity.
