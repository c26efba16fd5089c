"""The final check: which of the retrieved nodes the caller may read, asked of the ACL in batches.

``allowed`` answers with node ids, so nodes sharing an id (two stores fused) go into batches of
their own; every answer is checked (:func:`~llama_jev.acl.checked_allowed`) before it is read.
``JudgedRetrieval`` (``pipeline.py``) calls it on the sync and the async path alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from llama_index.core.schema import BaseNode, NodeWithScore

from llama_jev.acl.batch import BatchAcl, acheck_allowed, batch_acl, checked_allowed
from llama_jev.acl.rules import Acl
from llama_jev.core.context import RuntimeContext

__all__ = ["AnyAcl", "aauthorize_batch", "authorize", "authorize_batch"]

AnyAcl: TypeAlias = Acl | BatchAcl
"""What the LlamaIndex components accept as an ACL: ``acl(ctx, node) -> bool`` or a :class:`~llama_jev.acl.BatchAcl`."""


def authorize(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, acl: AnyAcl) -> list[NodeWithScore]:
    """The nodes ``ctx`` may read, in their order. An ACL that raises fails the whole retrieval.

    ``acl`` is a plain ``acl(ctx, node) -> bool`` or any :class:`~llama_jev.acl.BatchAcl`
    (``MetadataAcl``, an engine), asked through :func:`~llama_jev.acl.checked_allowed`.
    """
    return authorize_batch(nodes, ctx, batch_acl(acl))


def authorize_batch(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, batch: BatchAcl) -> list[NodeWithScore]:
    """:func:`authorize` for an ACL already read as a :class:`~llama_jev.acl.BatchAcl` (``batch_acl``).

    ``JudgedRetrieval`` reads its ACL once, when it is built: the protocol's ``isinstance`` check
    is a structural one, about as costly as the whole check of 20 nodes.
    """
    plan = _asking(nodes)
    return _kept(nodes, plan, [checked_allowed(batch, ctx, asked) for asked in plan.asked])


async def aauthorize_batch(nodes: Sequence[NodeWithScore], ctx: RuntimeContext, batch: BatchAcl) -> list[NodeWithScore]:
    """The async :func:`authorize_batch`: the engine is awaited, the event loop never blocked by it."""
    plan = _asking(nodes)
    return _kept(nodes, plan, [await acheck_allowed(batch, ctx, asked) for asked in plan.asked])


def _asking(nodes: Sequence[NodeWithScore]) -> _Asking:
    """What to ask the ACL about ``nodes``: one batch, or one per repeat of an id.

    ``allowed`` answers with ids, so two different nodes sharing an id (two stores fused, say)
    cannot be told apart in one answer; each repeat goes into a batch of its own, so every node
    is decided on its own metadata, as a per-node check would.
    """
    ids = [node.node.node_id for node in nodes]
    if len(set(ids)) == len(ids):  # the usual case: one batch
        return _Asking(ids=ids, rounds=None, asked=[[node.node for node in nodes]])
    rounds: list[list[int]] = []
    repeats: dict[str, int] = {}
    for index, node_id in enumerate(ids):
        count = repeats.get(node_id, 0)
        repeats[node_id] = count + 1
        if count == len(rounds):
            rounds.append([])
        rounds[count].append(index)
    return _Asking(ids=ids, rounds=rounds, asked=[[nodes[index].node for index in indices] for indices in rounds])


@dataclass(frozen=True)
class _Asking:
    ids: list[str]  # each node's id, in order (read once: node_id is a property)
    rounds: list[list[int]] | None  # the indices of each batch; None: one batch of every node
    asked: list[list[BaseNode]]


def _kept(nodes: Sequence[NodeWithScore], plan: _Asking, answers: Sequence[set[str]]) -> list[NodeWithScore]:
    """The nodes whose id the ACL's answer for their batch holds, in their order."""
    if plan.rounds is None:
        (allowed,) = answers
        return [node for node, node_id in zip(nodes, plan.ids, strict=True) if node_id in allowed]
    keep = [False] * len(nodes)
    for indices, allowed in zip(plan.rounds, answers, strict=True):
        for index in indices:
            keep[index] = plan.ids[index] in allowed
    return [node for node, kept in zip(nodes, keep, strict=True) if kept]
