"""The binding that carries the caller's ``RuntimeContext`` that carries it through a block of work.

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
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from llama_jev.core.errors import MissingRuntimeContextError
from llama_jev.core.identity import FrozenAttributes, RuntimeContext

__all__ = [
    "bind_if_given",
    "FrozenAttributes",
    "RuntimeContext",
    "current_runtime_context",
    "resolve_runtime_context",
    "runtime_context",
]


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


def current_runtime_context(*, needs_tenant: bool = False) -> RuntimeContext:
    """Return the bound ``RuntimeContext``.

    ``needs_tenant``: the caller's ACL checks a tenant, so the error's example binds ``tenant_id`` too.

    Raises:
        MissingRuntimeContextError: nothing is bound in this context.

    Example::

        >>> with runtime_context(RuntimeContext(user_id="u1")):
        ...     current_runtime_context().user_id
        'u1'
    """
    ctx = _CURRENT.get(None)
    if ctx is None:
        # With a tenant-checking ACL, an example without tenant_id would only lead to the next
        # silent failure: a bound identity that every node denies.
        example = "RuntimeContext(user_id=..., tenant_id=...)" if needs_tenant else "RuntimeContext(user_id=...)"
        why = " (the ACL checks a tenant key, so bind tenant_id too)" if needs_tenant else ""
        raise MissingRuntimeContextError(
            f"No RuntimeContext is bound: wrap the call in `with runtime_context({example}):`{why} "
            "or pass ctx= explicitly. "
            "Agents and workflows copy the context when run() is called: bind before calling "
            "agent.run(...), not after it started (for example around awaiting its handler). "
            "A thread started without contextvars.copy_context() does not see the caller's binding."
        )
    return ctx


def resolve_runtime_context(ctx: RuntimeContext | None, *, needs_tenant: bool = False) -> RuntimeContext:
    """Return the identity to act for: ``ctx`` if given, else the bound one.

    ``needs_tenant`` as in :func:`current_runtime_context`.

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
        return current_runtime_context(needs_tenant=needs_tenant)
    if not isinstance(ctx, RuntimeContext):
        raise TypeError(f"ctx must be a RuntimeContext or None, not {type(ctx).__name__}")
    return ctx
