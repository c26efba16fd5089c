"""``CerbosAcl``: permissions kept in a Cerbos policy decision point (PDP), pushed down and checked.

The caller's bound :class:`~llama_jev.core.identity.RuntimeContext` is the Cerbos principal (id =
user id, its roles or ``default_roles``, attributes = the context's attributes plus ``tenant`` =
its tenant id); each node is a resource of ``resource_kind`` (id = node id, attributes = its
metadata as stored; node text is never sent). Two calls:

- :meth:`CerbosAcl.restriction` asks PlanResources once per query and reads the plan as a store
  filter (:mod:`llama_jev.acl.cerbos.plan`): always-allowed, always-denied, a condition, or
  unknown when the plan uses an operator no store states;
- :meth:`CerbosAcl.allowed` asks CheckResources for the nodes retrieved, ``batch_size`` resources
  per request (the PDP's ``maxResourcesPerRequest``, 50 by default), the batches at once; only
  ``EFFECT_ALLOW`` keeps a node.

It fails closed: a PDP that is down, slower than ``timeout``, or answers something unreadable
raises :class:`~llama_jev.errors.PermissionsUnavailableError` and no node is returned; nothing
is cached. The HTTP API needs nothing beyond llama_jev (httpx); the gRPC API, faster for many
nodes, needs the ``cerbos`` extra (``pip install "llama-jev[cerbos]"``, the official SDK).

Example::

    from llama_jev import JevRetriever, Mode
    from llama_jev.acl import CerbosAcl

    acl = CerbosAcl("http://127.0.0.1:3592")            # or the gRPC "127.0.0.1:3593"
    retriever = JevRetriever.from_index(index, selector, acl, top_k=5, mode=Mode.OFF)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from llama_index.core.schema import BaseNode

from llama_jev.acl.cerbos.client import (
    ENGINE,
    Transport,
    async_transport,
    checked_url,
    failures,
    is_http,
    transport,
)
from llama_jev.acl.cerbos.plan import InvalidPlanError, restriction_from_plan
from llama_jev.acl.cerbos.wire import InvalidAnswerError, allowed_ids, batches, principal_of, resources_of
from llama_jev.acl.conditions import Nothing, Restriction, Unknown
from llama_jev.acl.diagnostics import warn_engine_once
from llama_jev.core.errors import PermissionsUnavailableError
from llama_jev.core.identity import RuntimeContext

__all__ = ["CerbosAcl"]

Json = dict[str, Any]
logger = logging.getLogger("llama_jev")


def _unreadable(error: Exception) -> PermissionsUnavailableError:
    # The reader's messages hold no id or value, so they can be passed on.
    return PermissionsUnavailableError(f"Cerbos PDP: {error}", engine=ENGINE, reason="INVALID_RESPONSE")


class CerbosAcl:
    """An ACL decided by a Cerbos PDP: pushdown from PlanResources, the final check by CheckResources.

    Args:
        url: the PDP's HTTP address (``"http://127.0.0.1:3592"``) or its gRPC ``host:port``
            (``"127.0.0.1:3593"``, plaintext; needs the ``cerbos`` extra).
        resource_kind: the Cerbos resource kind of a node (the policy's ``resource``).
        action: the action a retrieval needs (``"view"``).
        default_roles: the roles of a caller whose context has none (Cerbos needs at least one).
        attribute_keys: Cerbos attribute name -> node metadata key, for metadata stored under
            other names (``{"tenant": "org_id"}``); other keys are sent as they are.
        document_id_key: the metadata key holding a chunk's document id, when the policy decides
            documents (``R.id`` = the document id) rather than nodes (``R.id`` = the node id).
        batch_size: resources per CheckResources request (the PDP's ``maxResourcesPerRequest``).
        max_concurrency: CheckResources requests in flight at once for one ``allowed`` call.
        timeout: seconds one request to the PDP may take before the call fails with ``TIMEOUT``.

    Raises:
        ImportError: a gRPC ``url`` without the ``cerbos`` extra installed.
        ValueError: an option is out of range (the message says which).

    Example::

        acl = CerbosAcl("http://127.0.0.1:3592", resource_kind="document", action="view")
        acl.restriction(RuntimeContext(user_id="u1", tenant_id="acme"))   # Conditional(...)
    """

    engine = ENGINE

    def __init__(
        self,
        url: str,
        *,
        resource_kind: str = "document",
        action: str = "view",
        default_roles: Sequence[str] = ("user",),
        attribute_keys: Mapping[str, str] | None = None,
        document_id_key: str | None = None,
        batch_size: int = 50,
        max_concurrency: int = 4,
        timeout: float = 2.0,
    ) -> None:
        url = checked_url(url)
        if not is_http(url):
            try:
                import cerbos.svc.v1.svc_pb2_grpc  # noqa: F401  (checked here: a missing extra says so now)
            except ImportError as error:
                raise ImportError(
                    'CerbosAcl over gRPC needs the official Cerbos SDK: pip install "llama-jev[cerbos]" '
                    "(or give the PDP's HTTP address, http://host:3592, which needs nothing more)"
                ) from error
        for name, value in (("resource_kind", resource_kind), ("action", action)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-blank string")
        roles = tuple(default_roles)
        if not roles or not all(isinstance(role, str) and role.strip() for role in roles):
            raise ValueError("default_roles must hold at least one non-blank role (Cerbos needs one per principal)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size must be an int >= 1 (the PDP's maxResourcesPerRequest, 50 by default)")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError("max_concurrency must be an int >= 1")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError("timeout must be a number of seconds > 0")
        self.url = url
        self.resource_kind = resource_kind
        self.action = action
        self.default_roles = roles
        self.attribute_keys: dict[str, str] = dict(attribute_keys or {})
        self.document_id_key = document_id_key
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self._transport: Transport | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"CerbosAcl({self.url!r}, resource_kind={self.resource_kind!r}, action={self.action!r})"

    @property
    def denial_causes(self) -> str:
        """What to check when the PDP denies every node asked (said once, by ``llama_jev.acl.diagnostics``)."""
        return (
            f"resource_kind={self.resource_kind!r} and action={self.action!r} (the policy's resource and actions), "
            "the node metadata the policy reads (attribute_keys for keys stored under other names; a string "
            "'true' is not the boolean true), "
            + ("document_id_key (R.id is the document id)" if self.document_id_key else "R.id (the node id)")
            + " and the caller's roles and tenant"
        )

    # -- the shared, I/O-free parts --------------------------------------------------------

    def _principal(self, ctx: RuntimeContext) -> Json:
        return principal_of(ctx, default_roles=self.default_roles)

    def _metadata_key(self, name: str) -> str:
        return self.attribute_keys.get(name, name)

    def _restriction(self, plan: Json) -> Restriction:
        try:
            restriction = restriction_from_plan(plan, self._metadata_key, self.document_id_key)
        except InvalidPlanError as error:
            raise _unreadable(error) from error
        meta = plan.get("meta")
        if isinstance(restriction, Nothing) and isinstance(meta, dict) and meta.get("filterDebug") == "NO_MATCH":
            # No rule of any policy covers this kind and action: every caller is denied everything.
            warn_engine_once(
                self,
                "no-policy",
                "CerbosAcl: no policy rule of the PDP covers resource_kind=%r with action=%r, so every caller "
                "is denied every node; check resource_kind and action against the policy's resource and actions",
                self.resource_kind,
                self.action,
            )
        if isinstance(restriction, Unknown) and restriction.reason not in self._warned:
            # Once per ACL and operator: the policy, not the caller, decides which operators a plan holds.
            self._warned.add(restriction.reason)
            logger.warning(
                "CerbosAcl: %s; no pushdown for callers whose plan holds it (CheckResources decides every node)",
                restriction.reason,
            )
        return restriction

    def _resources(self, nodes: Sequence[BaseNode]) -> tuple[list[Json], list[list[str]]]:
        return resources_of(
            nodes, kind=self.resource_kind, attribute_keys=self.attribute_keys, document_id_key=self.document_id_key
        )

    def _read(self, answers: Sequence[Json], asked: Sequence[Sequence[Json]], decides: list[list[str]]) -> set[str]:
        allowed: set[str] = set()
        start = 0
        try:
            for answer, batch in zip(answers, asked, strict=True):
                allowed |= allowed_ids(answer, batch, decides[start : start + len(batch)], self.action)
                start += len(batch)
        except InvalidAnswerError as error:
            raise _unreadable(error) from error
        return allowed

    # -- sync ---------------------------------------------------------------------------------

    def _client(self) -> Transport:
        with self._lock:
            if self._transport is None:
                with failures("connecting", self.url):
                    self._transport = transport(self.url, self.timeout)
            return self._transport

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        """What a store may pre-select for ``ctx``, from one PlanResources call.

        Returns ``Everything`` (always allowed), ``Nothing`` (always denied), ``Conditional``
        (the plan as a condition) or ``Unknown`` naming an operator no store filter states.

        Raises:
            PermissionsUnavailableError: the PDP is unreachable, too slow, or its plan unreadable.
        """
        return self._restriction(self._client().plan(self._principal(ctx), self.resource_kind, self.action))

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The ids of ``nodes`` the PDP allows ``ctx`` to ``action``, by CheckResources in concurrent batches.

        Raises:
            PermissionsUnavailableError: any batch failed or came back unreadable (no partial answer).
        """
        resources, decides = self._resources(nodes)
        if not resources:
            return set()
        principal, client = self._principal(ctx), self._client()
        asked = batches(resources, self.batch_size)

        def check(batch: Sequence[Json]) -> Json:
            return client.check(principal, list(batch), self.resource_kind, self.action)

        if len(asked) == 1:
            answers = [check(asked[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(len(asked), self.max_concurrency)) as pool:
                answers = list(pool.map(check, asked))
        return self._read(answers, asked, decides)

    def close(self) -> None:
        """Close the sync connection to the PDP (a later call opens a new one)."""
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    def __enter__(self) -> CerbosAcl:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- async: the same parts, an async client made per call (it belongs to the running loop) --

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        """The async :meth:`restriction`."""
        with failures("connecting", self.url):
            client = async_transport(self.url, self.timeout)
        try:
            plan = await client.plan(self._principal(ctx), self.resource_kind, self.action)
        finally:
            await client.close()
        return self._restriction(plan)

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The async :meth:`allowed`: the batches gathered on the event loop, at most ``max_concurrency`` at once."""
        resources, decides = self._resources(nodes)
        if not resources:
            return set()
        principal = self._principal(ctx)
        asked = batches(resources, self.batch_size)
        with failures("connecting", self.url):
            client = async_transport(self.url, self.timeout)
        gate = asyncio.Semaphore(self.max_concurrency)

        async def check(batch: Sequence[Json]) -> Json:
            async with gate:
                return await client.check(principal, list(batch), self.resource_kind, self.action)

        tasks = [asyncio.ensure_future(check(batch)) for batch in asked]
        try:
            answers = await asyncio.gather(*tasks)
        except BaseException:
            # One batch failed: stop the others before the client closes under them.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            await client.close()
        return self._read(answers, asked, decides)
