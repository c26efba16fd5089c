"""``SpiceDBAcl``: permissions kept in SpiceDB (users, groups, folders, inherited viewers), as a ``BatchAcl``.

- The final check (:meth:`SpiceDBAcl.allowed`): CheckBulkPermissions over the distinct documents
  of the nodes, ``batch_size`` items per request, the requests concurrent. Only
  ``PERMISSIONSHIP_HAS_PERMISSION`` admits; a caveated (conditional) result is a denial; an error
  is a :class:`~llama_jev.errors.PermissionsUnavailableError` and no node.
- Pushdown (:meth:`SpiceDBAcl.restriction`): LookupResources for the subject. At most ``max_ids``
  documents -> an id allow-list (:class:`~llama_jev.acl.conditions.Ids`, with the lookup's
  ZedToken); more, a lookup that fails or breaks off -> no pushdown (``Unknown``; the retriever
  widens and the final check decides).
- Consistency: both reads ``at_least_as_fresh`` the ZedToken the app puts in the context's
  ``spicedb_token`` attribute (its last write), else ``fully_consistent``.

A node's document is ``metadata[document_id_key]``, its source ``Document``'s id with
``document_id_key="ref_doc_id"``, or the node id when unset; every chunk of a permitted document
is kept. Needs the ``spicedb`` extra (the official ``authzed`` client).

Example::

    acl = SpiceDBAcl("spicedb.internal:50051", preshared_key=key, document_id_key="ref_doc_id")
    retriever = JevRetriever.from_index(index, selector, acl, top_k=5)
    with runtime_context(RuntimeContext(user_id="alice", attributes={"spicedb_token": last_write_token})):
        nodes = retriever.retrieve("What are the refund conditions?")
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    import grpc
    import grpc.aio
    from authzed.api.v1 import CheckBulkPermissionsResponse, SubjectReference
    from authzed.api.v1.permission_service_pb2_grpc import PermissionsServiceStub
except ImportError as error:  # pragma: no cover - the extra is part of the test install
    raise ImportError('SpiceDBAcl needs the official authzed client: pip install "llama-jev[spicedb]"') from error

from llama_index.core.schema import BaseNode

from llama_jev.acl.conditions import Nothing, Restriction, Unknown
from llama_jev.acl.spicedb.wire import (
    ENGINE,
    LookupPages,
    advice,
    bulk_requests,
    caveat_context,
    check_names,
    check_target,
    consistency,
    is_object_id,
    permitted_documents,
    status_name,
    subject,
    unavailable,
)
from llama_jev.core.identity import RuntimeContext

__all__ = ["SpiceDBAcl"]

logger = logging.getLogger("llama_jev.acl.spicedb")

SOURCE_KEYS = frozenset({"ref_doc_id", "doc_id", "document_id"})
"""Keys LlamaIndex's stores fill with the node's source document id (``node.ref_doc_id``)."""
TOKEN_ATTRIBUTE = "spicedb_token"  # noqa: S105 - an attribute name, not a secret


class _Unset(enum.Enum):
    UNSET = "unset"


_NO_KEY_GIVEN = _Unset.UNSET


class SpiceDBAcl:
    """Who may read a node, as SpiceDB computes it: CheckBulkPermissions, and LookupResources for pushdown.

    Args:
        target: SpiceDB's gRPC address (``"spicedb:50051"``, ``"unix:///run/spicedb.sock"``).
        preshared_key: SpiceDB's ``--grpc-preshared-key``, sent as a bearer token (never logged).
            Required: ``None`` (said explicitly) only for a SpiceDB that takes no key
            (``spicedb serve-testing``, a proxy that adds credentials).
        insecure: plaintext gRPC, for a SpiceDB started without TLS (a sidecar, tests); else TLS
            with the system roots or ``root_certificates``.
        resource_type: the schema's definition of what nodes come from (``"document"``).
        permission: the permission that lets a subject read one (``"view"``).
        subject_type: the definition the caller is (``"user"``); ``subject_relation`` for a
            subject set (rare).
        subject_id: the caller's SpiceDB id from the context (default ``ctx.user_id``). An id
            SpiceDB cannot name (``*``, ``@``, quotes, blanks) reads nothing, with one warning.
        caveat_context: the values the caller brings to caveats (``lambda ctx: {"ip":
            ctx.attributes["ip"]}``), sent with every read. A caveat still missing a value answers
            "conditional", which is a denial.
        document_id_key: where a node's document id is (every chunk of a permitted document is
            kept): a metadata key, or ``"ref_doc_id"`` for the id of the LlamaIndex ``Document``
            the chunk came from (``node.ref_doc_id``, which every vector store writes under
            ``ref_doc_id``, ``doc_id`` and ``document_id``: those three keys always mean it);
            None: the node id is the document id.
        max_ids: the most documents an id allow-list may hold (default 1,000); a subject who may
            read more gets no pushdown (widening and the final check instead).
        batch_size: items per CheckBulkPermissions request (the requests are concurrent).
        timeout: seconds one read (a lookup, or one final check) may take.
        token_attribute: the ``RuntimeContext`` attribute with the app's last ZedToken.

    Raises:
        ValueError: a target that is not ``host:port`` or a gRPC name (``http://...``), no
            ``preshared_key`` given, a name SpiceDB would refuse, or a non-positive limit.

    Example::

        >>> acl = SpiceDBAcl("localhost:50051", preshared_key="key", insecure=True, document_id_key="ref_doc_id")
        >>> acl.engine
        'spicedb'
    """

    engine = ENGINE

    def __init__(
        self,
        target: str,
        *,
        preshared_key: str | _Unset | None = _NO_KEY_GIVEN,
        insecure: bool = False,
        root_certificates: bytes | None = None,
        resource_type: str = "document",
        permission: str = "view",
        subject_type: str = "user",
        subject_relation: str | None = None,
        subject_id: Callable[[RuntimeContext], str] | None = None,
        caveat_context: Callable[[RuntimeContext], Mapping[str, Any]] | None = None,
        document_id_key: str | None = None,
        max_ids: int = 1000,
        batch_size: int = 500,
        timeout: float = 5.0,
        token_attribute: str = TOKEN_ATTRIBUTE,
    ) -> None:
        target = check_target(target)
        if preshared_key is _NO_KEY_GIVEN:
            raise ValueError(
                "SpiceDBAcl needs preshared_key: the key SpiceDB was started with (spicedb serve "
                "--grpc-preshared-key); pass preshared_key=None only for a SpiceDB that takes none "
                "(spicedb serve-testing, or a proxy that adds the credentials)"
            )
        if preshared_key is not None and (not isinstance(preshared_key, str) or not preshared_key.strip()):
            raise ValueError("preshared_key must be a non-blank string (or None for a SpiceDB that takes none)")
        check_names(
            resource_type=resource_type,
            permission=permission,
            subject_type=subject_type,
            subject_relation=subject_relation,
        )
        for name, value in (("max_ids", max_ids), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if document_id_key is not None and (not isinstance(document_id_key, str) or not document_id_key):
            raise ValueError("document_id_key must be a metadata key (a non-empty str) or None for node ids")
        self.target = target
        self.resource_type = resource_type
        self.permission = permission
        self.subject_type = subject_type
        self.subject_relation = subject_relation
        self.document_id_key = document_id_key
        self.max_ids = max_ids
        self.batch_size = batch_size
        self.timeout = float(timeout)
        self.token_attribute = token_attribute
        self._subject_id = subject_id or (lambda ctx: ctx.user_id)
        self._caveat_context = caveat_context
        self._metadata = (("authorization", f"Bearer {preshared_key}"),) if preshared_key else ()
        self._insecure = insecure
        self._root_certificates = root_certificates
        self._lock = threading.Lock()
        self._stub: Any = None
        self._channel: Any = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, Any]] = weakref.WeakKeyDictionary()
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return (
            f"SpiceDBAcl({self.target!r}, resource_type={self.resource_type!r}, permission={self.permission!r}, "
            f"subject_type={self.subject_type!r}, document_id_key={self.document_id_key!r}, max_ids={self.max_ids})"
        )

    # -- the decisions (pure; sync and async share them) --

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message)

    def _who(self, ctx: RuntimeContext) -> SubjectReference | None:
        """The caller as a SpiceDB subject, or None when SpiceDB cannot name it (it can read nothing)."""
        subject_id = self._subject_id(ctx)
        if not is_object_id(subject_id):
            self._warn_once(
                "subject",
                "SpiceDBAcl: a caller's subject id is not a SpiceDB object id (letters, digits, /_|-=+; never *); "
                "such a caller reads nothing. Map your user ids with SpiceDBAcl(subject_id=...)",
            )
            return None
        return subject(self.subject_type, subject_id, self.subject_relation)

    def _context(self, ctx: RuntimeContext) -> Any:
        return None if self._caveat_context is None else caveat_context(self._caveat_context(ctx))

    def _token(self, ctx: RuntimeContext) -> str | None:
        return ctx.attributes.get(self.token_attribute) or None

    def _document_id(self, node: BaseNode) -> object:
        if self.document_id_key is None:
            return node.node_id
        if self.document_id_key in SOURCE_KEYS:
            # What every LlamaIndex vector store writes under these keys (node_to_metadata_dict):
            # the source document's id, whatever the node's own metadata says.
            return node.ref_doc_id
        return node.metadata.get(self.document_id_key)

    def _documents(self, nodes: Sequence[BaseNode]) -> dict[str, list[str]]:
        """Document id -> the node ids of its chunks; a node without a nameable document id is denied."""
        documents: dict[str, list[str]] = {}
        unnamed = 0
        for node in nodes:
            document = self._document_id(node)
            if isinstance(document, str) and is_object_id(document):
                documents.setdefault(document, []).append(node.node_id)
            else:
                unnamed += 1
        if unnamed:
            self._warn_once(
                "document",
                f"SpiceDBAcl: {unnamed} node(s) have no SpiceDB document id under "
                f"{self.document_id_key or 'the node id'} (missing, not a str, or not a SpiceDB object id); "
                "they are denied",
            )
        return documents

    def _lookup(self, ctx: RuntimeContext) -> LookupPages | Restriction:
        who = self._who(ctx)
        if who is None:
            return Nothing()
        return LookupPages(
            resource_type=self.resource_type,
            permission=self.permission,
            who=who,
            read_at=consistency(self._token(ctx)),
            max_ids=self.max_ids,
            key=self.document_id_key,
            context=self._context(ctx),
        )

    def _check(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> tuple[dict[str, list[str]], list[Any]]:
        who = self._who(ctx)
        documents = self._documents(nodes) if who is not None else {}
        if who is None or not documents:
            return {}, []
        requests = bulk_requests(
            sorted(documents),
            resource_type=self.resource_type,
            permission=self.permission,
            who=who,
            read_at=consistency(self._token(ctx)),
            batch_size=self.batch_size,
            context=self._context(ctx),
        )
        return documents, requests

    @staticmethod
    def _nodes(documents: dict[str, list[str]], requests: list[Any], responses: list[Any]) -> set[str]:
        permitted = permitted_documents(requests, responses)
        return {node_id for document in permitted for node_id in documents[document]}

    @property
    def denial_causes(self) -> str:
        """What to check when SpiceDB denies every node asked (said once, by ``llama_jev.acl.diagnostics``)."""
        if self.document_id_key is None:
            where = (
                "document_id_key (unset: each node id is asked as a SpiceDB document id, and LlamaIndex's node "
                "ids are random; document_id_key='ref_doc_id' asks the source Document's id)"
            )
        else:
            where = f"document_id_key={self.document_id_key!r} (which SpiceDB documents the nodes are)"
        return (
            f"{where}, resource_type={self.resource_type!r} and permission={self.permission!r}, subject_type="
            f"{self.subject_type!r} and subject_id (who the caller is), and that the relationships were written"
        )

    def _lookup_failed(self, error: grpc.RpcError) -> Unknown:
        logger.warning(
            "SpiceDBAcl: LookupResources failed or broke off (%s); no pushdown for this query "
            "(the final check decides): %s",
            status_name(error),
            advice(error, target=self.target, insecure=self._insecure),
        )
        return Unknown("the SpiceDB lookup failed or broke off; no pushdown")

    def _failed(self, error: grpc.RpcError) -> Exception:
        return unavailable(error, "CheckBulkPermissions", target=self.target, insecure=self._insecure)

    # -- the I/O edges --

    def _channel_args(self) -> tuple[Any, ...]:
        if self._insecure:
            return ()
        return (grpc.ssl_channel_credentials(root_certificates=self._root_certificates),)

    def _sync_stub(self) -> Any:
        with self._lock:
            if self._stub is None:
                credentials = self._channel_args()
                self._channel = (
                    grpc.secure_channel(self.target, *credentials)
                    if credentials
                    else grpc.insecure_channel(self.target)
                )
                self._stub = PermissionsServiceStub(self._channel)
            return self._stub

    def _async_stub(self) -> Any:
        # A grpc.aio channel belongs to the event loop it was made in: one per loop.
        loop = asyncio.get_running_loop()
        with self._lock:
            # A channel holds its loop, so the weak key never dies by itself: drop closed loops'.
            for closed in [old for old in self._async if old.is_closed()]:
                del self._async[closed]
            made = self._async.get(loop)
            if made is None:
                credentials = self._channel_args()
                channel = (
                    grpc.aio.secure_channel(self.target, *credentials)
                    if credentials
                    else grpc.aio.insecure_channel(self.target)
                )
                made = (channel, PermissionsServiceStub(channel))
                self._async[loop] = made
            return made[1]

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        """What a store may pre-select for ``ctx``: an id allow-list, nothing, or no pushdown.

        Example::

            >>> acl.restriction(RuntimeContext(user_id="alice"))  # doctest: +SKIP
            Ids(ids=frozenset({'handbook', 'refunds'}), key='ref_doc_id', token='GhUKEzE3...')
        """
        pages = self._lookup(ctx)
        if not isinstance(pages, LookupPages):
            return pages
        stub = self._sync_stub()
        deadline = time.monotonic() + self.timeout
        try:
            while (request := pages.request()) is not None:
                call = stub.LookupResources(request, timeout=_remaining(deadline), metadata=self._metadata)
                for response in call:
                    if not pages.read(response):
                        call.cancel()
                        break
                else:
                    pages.page_ended()
        except grpc.RpcError as error:
            return self._lookup_failed(error)
        return pages.restriction()

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        """The async :meth:`restriction` (``grpc.aio``)."""
        pages = self._lookup(ctx)
        if not isinstance(pages, LookupPages):
            return pages
        stub = self._async_stub()
        deadline = time.monotonic() + self.timeout
        try:
            while (request := pages.request()) is not None:
                call = stub.LookupResources(request, timeout=_remaining(deadline), metadata=self._metadata)
                ended = True
                async for response in call:
                    if not pages.read(response):
                        call.cancel()
                        ended = False
                        break
                if ended:
                    pages.page_ended()
        except grpc.RpcError as error:
            return self._lookup_failed(error)
        return pages.restriction()

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The ids of the nodes whose document ``ctx`` has the permission on (CheckBulkPermissions).

        Raises:
            PermissionsUnavailableError: SpiceDB is unreachable, slower than ``timeout``, refused
                the request, or answered something that is not a decision: no node is allowed.
        """
        documents, requests = self._check(ctx, nodes)
        if not requests:
            return set()
        stub = self._sync_stub()
        # Futures: the batches run concurrently on gRPC's own threads, one deadline for all.
        calls = [
            stub.CheckBulkPermissions.future(request, timeout=self.timeout, metadata=self._metadata)
            for request in requests
        ]
        try:
            responses = [call.result() for call in calls]
        except grpc.RpcError as error:
            for call in calls:
                call.cancel()
            raise self._failed(error) from None
        return self._nodes(documents, requests, responses)

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        """The async :meth:`allowed` (``grpc.aio``; the batches concurrent)."""
        documents, requests = self._check(ctx, nodes)
        if not requests:
            return set()
        stub = self._async_stub()
        answers = await asyncio.gather(
            *(
                stub.CheckBulkPermissions(request, timeout=self.timeout, metadata=self._metadata)
                for request in requests
            ),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, grpc.RpcError):
                raise self._failed(answer) from None
            if isinstance(answer, BaseException):
                raise answer
        responses = [answer for answer in answers if isinstance(answer, CheckBulkPermissionsResponse)]
        return self._nodes(documents, requests, responses)

    def close(self) -> None:
        """Close the sync channel (the async ones close with :meth:`aclose` in their loop)."""
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    async def aclose(self) -> None:
        """Close this event loop's channel, and the sync one."""
        with self._lock:
            made = self._async.pop(asyncio.get_running_loop(), None)
        if made is not None:
            await made[0].close()
        self.close()


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)
