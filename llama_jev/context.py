"""Who is asking: ``RuntimeContext`` and the binding that carries it through a block of work.

The identity is bound in a :class:`contextvars.ContextVar`, so it follows asyncio tasks (each
task starts from a copy of its creator's context) and work handed to threads through
:func:`contextvars.copy_context`. A thread started without such a copy starts empty and sees no
identity: there is never an implicit or inherited-by-accident caller.

Example::

    from llama_jev import RuntimeContext, runtime_context

    with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme", roles={"support"})):
        response = query_engine.query("What are the refund conditions?")
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, ValidationInfo, field_validator

from llama_jev.errors import MissingRuntimeContextError

__all__ = [
    "bind_if_given",
    "FrozenAttributes",
    "RuntimeContext",
    "current_runtime_context",
    "resolve_runtime_context",
    "runtime_context",
]


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
_CURRENT: contextvars.ContextVar[RuntimeContext] = contextvars.ContextVar("llama_jev_runtime_context")


@contextmanager
def _bind(ctx: RuntimeContext) -> Iterator[RuntimeContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        # reset(token), not set(previous): restores exactly the outer binding, or none at all.
        _CURRENT.reset(token)


def runtime_context(ctx: RuntimeContext) -> AbstractContextManager[RuntimeContext]:
    """Bind ``ctx`` as the caller for the ``with`` block; the previous binding returns on exit.

    Bindings nest: an inner block's identity lasts until its end, then the outer one is back.
    Asyncio tasks created inside the block, and functions run in threads through
    ``contextvars.copy_context().run``, see ``ctx``; a plain ``threading.Thread`` does not.

    Raises:
        TypeError: ``ctx`` is not a ``RuntimeContext`` (checked at once, not at ``with``).

    Example::

        >>> with runtime_context(RuntimeContext(user_id="u1")) as ctx:
        ...     current_runtime_context() is ctx
        True
    """
    if not isinstance(ctx, RuntimeContext):
        raise TypeError(f"runtime_context() takes a RuntimeContext, not {type(ctx).__name__}")
    return _bind(ctx)


def bind_if_given(ctx: RuntimeContext | None) -> AbstractContextManager[RuntimeContext | None]:
    """``runtime_context(ctx)`` for an explicit ``ctx=``; with ``None``, the current binding stays."""
    return nullcontext() if ctx is None else runtime_context(ctx)


def current_runtime_context() -> RuntimeContext:
    """Return the bound ``RuntimeContext``.

    Raises:
        MissingRuntimeContextError: nothing is bound in this context.

    Example::

        >>> with runtime_context(RuntimeContext(user_id="u1")):
        ...     current_runtime_context().user_id
        'u1'
    """
    ctx = _CURRENT.get(None)
    if ctx is None:
        raise MissingRuntimeContextError(
            "No RuntimeContext is bound: wrap the call in "
            "`with runtime_context(RuntimeContext(user_id=...)):` or pass ctx= explicitly. "
            "Agents and workflows copy the context when run() is called: bind before calling "
            "agent.run(...), not after it started (for example around awaiting its handler). "
            "A thread started without contextvars.copy_context() does not see the caller's binding."
        )
    return ctx


def resolve_runtime_context(ctx: RuntimeContext | None) -> RuntimeContext:
    """Return the identity to act for: ``ctx`` if given, else the bound one.

    Raises:
        TypeError: ``ctx`` is neither ``None`` nor a ``RuntimeContext``.
        MissingRuntimeContextError: ``ctx`` is ``None`` and nothing is bound.

    Example::

        >>> explicit = RuntimeContext(user_id="u2")
        >>> with runtime_context(RuntimeContext(user_id="u1")):
        ...     resolve_runtime_context(explicit).user_id, resolve_runtime_context(None).user_id
        ('u2', 'u1')
    """
    if ctx is None:
        return current_runtime_context()
    if not isinstance(ctx, RuntimeContext):
        raise TypeError(f"ctx must be a RuntimeContext or None, not {type(ctx).__name__}")
    return ctx
