"""ACL engines for the retrieval tests: real ``BatchAcl`` implementations with a programmable verdict.

Not mocks of our code: each is an ACL a user could write (the protocol's five members), deciding
from an allow-list of ids, failing the way an engine that is down fails, or answering nonsense.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Sequence

from llama_index.core.schema import BaseNode

from llama_jev.acl import Everything, Restriction, Unknown
from llama_jev.core import RuntimeContext
from llama_jev.errors import PermissionsUnavailableError


class AllowListAcl:
    """Allows the node ids in ``allowed``; counts the calls per path, so a test sees which one ran."""

    engine = "allow-list"

    def __init__(self, allowed: Iterable[str], restriction: Restriction | None = None) -> None:
        self.ids = frozenset(allowed)
        self.answer = restriction or Unknown("the allow-list is not pushed down")
        self.sync_calls = 0
        self.async_calls = 0
        self.restriction_calls = 0
        self.asked: list[int] = []

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        self.sync_calls += 1
        self.asked.append(len(nodes))
        return {node.node_id for node in nodes if node.node_id in self.ids}

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        self.async_calls += 1
        self.asked.append(len(nodes))
        await asyncio.sleep(0)  # a real engine awaits its transport here
        return {node.node_id for node in nodes if node.node_id in self.ids}

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        self.restriction_calls += 1
        return self.answer

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        self.restriction_calls += 1
        await asyncio.sleep(0)
        return self.answer


class DownAcl:
    """An engine that cannot be reached: every question raises ``PermissionsUnavailableError``."""

    engine = "down"

    def __init__(self, *, in_restriction: bool = False) -> None:
        self.error = PermissionsUnavailableError(
            "the down engine is unreachable", engine="down", reason="UNREACHABLE", retryable=True
        )
        self.in_restriction = in_restriction

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        raise self.error

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        raise self.error

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        if self.in_restriction:
            raise self.error
        return Everything()

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        return self.restriction(ctx)


class GarbageAcl:
    """An engine whose answers cannot be read as a decision: ``answer(nodes)`` says what it returns."""

    engine = "garbage"

    def __init__(self, answer: Callable[[Sequence[BaseNode]], object]) -> None:
        self.answer = answer

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        return self.answer(nodes)  # type: ignore[return-value]

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        return self.answer(nodes)  # type: ignore[return-value]

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        return Unknown("garbage")

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        return Unknown("garbage")


def random_denial(fraction: float, seed: int) -> Callable[[RuntimeContext, BaseNode], bool]:
    """A plain callable ACL denying about ``fraction`` of the node ids, fixed per id for ``seed``."""

    def acl(ctx: RuntimeContext, node: BaseNode) -> bool:
        return random.Random(f"{seed}/{node.node_id}").random() >= fraction

    return acl
