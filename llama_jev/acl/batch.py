"""The engine-neutral ACL protocol: a final check for many nodes at once, and what a store may pre-select.

Beside the plain ``acl(ctx, node) -> bool`` callable, an ACL object may offer (:class:`BatchAcl`):

- ``allowed(ctx, nodes) -> set[str]`` (and ``aallowed``): the final check, batched; the ids of
  the nodes ``ctx`` may read. Every chunk of a permitted document is kept: chunks share their
  document's id, and each chunk's node id is in the answer.
- ``restriction(ctx)`` (and ``arestriction``): what a store may pre-select (see
  :mod:`llama_jev.acl.conditions`).
- ``engine``: the engine's name for records and spans (``"metadata"``, ``"cerbos"``, ...).

An engine that cannot decide raises :class:`~llama_jev.errors.PermissionsUnavailableError`; it
never answers with a guess. :func:`batch_acl` turns any ACL the package accepts into one, and
:func:`checked_allowed` / :func:`acheck_allowed` ask it, refusing an answer that is not a set of
the ids asked about; an engine that denied every node asked is said once
(:func:`~llama_jev.acl.diagnostics.warn_engine_denied_all`).

Example::

    >>> from llama_index.core.schema import TextNode
    >>> from llama_jev.core.identity import RuntimeContext
    >>> owner = batch_acl(lambda ctx, node: node.metadata.get("owner") == ctx.user_id)
    >>> nodes = [TextNode(id_="a", text="...", metadata={"owner": "u1"}), TextNode(id_="b", text="...")]
    >>> sorted(checked_allowed(owner, RuntimeContext(user_id="u1"), nodes))
    ['a']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from llama_index.core.schema import BaseNode

from llama_jev.acl.conditions import Conditional, Everything, Ids, Nothing, Restriction, Unknown
from llama_jev.acl.diagnostics import warn_engine_denied_all
from llama_jev.acl.rules import check_acl
from llama_jev.core.errors import PermissionsUnavailableError
from llama_jev.core.identity import RuntimeContext

__all__ = ["BatchAcl", "CallableAcl", "acheck_allowed", "batch_acl", "checked_allowed", "checked_restriction"]


@runtime_checkable
class BatchAcl(Protocol):
    """An ACL that answers for many nodes at once and can say what a store may pre-select.

    ``MetadataAcl``, ``CerbosAcl`` and ``SpiceDBAcl`` are ones; a plain callable becomes one
    through :func:`batch_acl`. Implement all five members to bring your own engine.
    """

    @property
    def engine(self) -> str:
        """The engine's name in records, spans and messages (``"cerbos"``); never an identity value."""
        ...

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The node ids among ``nodes`` that ``ctx`` may read (every chunk of a permitted document)."""
        ...

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The async :meth:`allowed`."""
        ...

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        """What a store may pre-select for ``ctx`` (a superset of what :meth:`allowed` admits)."""
        ...

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        """The async :meth:`restriction`."""
        ...


class CallableAcl:
    """A plain ``acl(ctx, node) -> bool`` as a :class:`BatchAcl`: one call per node, no pushdown.

    Its restriction is always :class:`~llama_jev.acl.conditions.Unknown` (a function cannot be
    read as a store filter), so only the final check applies it; a non-bool answer is a
    ``TypeError`` and whatever the function raises fails the retrieval (``check_acl``).
    """

    engine = "callable"

    def __init__(self, acl: Callable[[RuntimeContext, BaseNode], bool]) -> None:
        if not callable(acl):
            raise TypeError("acl must be callable as acl(ctx, node) -> bool (for example a MetadataAcl)")
        self.acl = acl

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The ids of the nodes for which the function answers ``True``."""
        return {node.node_id for node in nodes if check_acl(self.acl, ctx, node)}

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """:meth:`allowed`: the function is sync and in-process, so it runs on the event loop."""
        return self.allowed(ctx, nodes)

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        """Always :class:`Unknown`: a function cannot be pushed into a store."""
        return Unknown("a callable ACL cannot be stated as a store filter")

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        """The async :meth:`restriction`."""
        return self.restriction(ctx)


def batch_acl(acl: BatchAcl | Callable[[RuntimeContext, BaseNode], bool]) -> BatchAcl:
    """``acl`` as a :class:`BatchAcl`: itself when it is one (``MetadataAcl``, an engine), else a :class:`CallableAcl`.

    Raises:
        TypeError: ``acl`` is neither a :class:`BatchAcl` nor callable.
    """
    if isinstance(acl, BatchAcl):
        return acl
    return CallableAcl(acl)


def _checked(acl: BatchAcl, nodes: Sequence[BaseNode], answer: object) -> set[str]:
    """The engine's answer, if it is a set of ids asked about; anything else fails closed, loudly."""
    asked = {node.node_id for node in nodes}
    # Every item a str: the usual answer is checked in C (its types), any other item one by one.
    if not isinstance(answer, (set, frozenset)) or not (
        set(map(type, answer)) <= {str} or all(isinstance(item, str) for item in answer)
    ):
        raise PermissionsUnavailableError(
            f"the {acl.engine} ACL answered {type(answer).__name__} to allowed(); it must return a set of "
            "node ids (no node is returned for an answer that cannot be read)",
            engine=acl.engine,
            reason="INVALID_RESPONSE",
        )
    if not answer <= asked:
        raise PermissionsUnavailableError(
            f"the {acl.engine} ACL allowed {len(answer - asked)} node id(s) it was not asked about; "
            "an answer that does not match the question is not read as a decision",
            engine=acl.engine,
            reason="INVALID_RESPONSE",
        )
    return set(answer)


def checked_allowed(acl: BatchAcl, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
    """Ask ``acl`` which of ``nodes`` ``ctx`` may read; an unreadable answer is a ``PermissionsUnavailableError``.

    What the ACL raises propagates unchanged (an engine raises ``PermissionsUnavailableError``
    itself; a buggy callable fails the retrieval with its own error).
    """
    if not nodes:
        return set()
    allowed = _checked(acl, nodes, acl.allowed(ctx, nodes))
    warn_engine_denied_all(acl, len(nodes), len(allowed))
    return allowed


async def acheck_allowed(acl: BatchAcl, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
    """The async :func:`checked_allowed`."""
    if not nodes:
        return set()
    allowed = _checked(acl, nodes, await acl.aallowed(ctx, nodes))
    warn_engine_denied_all(acl, len(nodes), len(allowed))
    return allowed


def checked_restriction(engine: str, answer: object) -> Restriction:
    """An ACL's ``restriction(ctx)`` answer, if it is one of the kinds; anything else fails closed, loudly.

    The twin of :func:`checked_allowed` for the other question: ``engine`` names the ACL in the
    message (never an identity value).

    Raises:
        PermissionsUnavailableError: ``answer`` is not ``Everything``, ``Nothing``, ``Ids``,
            ``Conditional`` or ``Unknown`` (reason ``INVALID_RESPONSE``).
    """
    if isinstance(answer, (Everything, Nothing, Ids, Conditional, Unknown)):
        return answer
    raise PermissionsUnavailableError(
        f"the {engine} ACL answered {type(answer).__name__} to restriction(); it must return Everything, "
        "Nothing, Ids, Conditional or Unknown (no node is returned for an answer that cannot be read)",
        engine=engine,
        reason="INVALID_RESPONSE",
    )
