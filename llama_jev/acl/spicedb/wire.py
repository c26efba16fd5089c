"""What ``SpiceDBAcl`` sends to SpiceDB and how it reads the answers: pure functions shared by sync and async.

The I/O edges (a gRPC call, sync or async) live in :mod:`llama_jev.acl.spicedb.acl`; everything that
decides lives here once: which consistency a read asks for, which ids SpiceDB can name, how a
LookupResources stream becomes a :class:`~llama_jev.acl.conditions.Restriction` (complete, or
never read as such), and how CheckBulkPermissions' pairs become the permitted documents (only
``PERMISSIONSHIP_HAS_PERMISSION``; a caveated result is a denial; an error is no decision).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from authzed.api.v1 import (
    CheckBulkPermissionsRequest,
    CheckBulkPermissionsRequestItem,
    CheckBulkPermissionsResponse,
    Consistency,
    LookupResourcesRequest,
    LookupResourcesResponse,
    ObjectReference,
    SubjectReference,
    ZedToken,
)
from authzed.api.v1.permission_service_pb2 import CheckPermissionResponse, LookupPermissionship
from google.protobuf.struct_pb2 import Struct

from llama_jev.acl.conditions import Ids, Nothing, Restriction, Unknown
from llama_jev.core.errors import PermissionsUnavailableError

ENGINE = "spicedb"
LOOKUP_PAGE_LIMIT = 1000
"""The most results one LookupResources call may ask for (SpiceDB's ``--max-lookup-resources-limit`` default)."""

# SpiceDB's own patterns (authzed/api v1 validation); an id outside them is refused by SpiceDB,
# so no relationship can name it. "*" is the wildcard subject: never an id of ours.
_OBJECT_ID = re.compile(r"[a-zA-Z0-9/_|\-=+]{1,1024}")
_TYPE_NAME = re.compile(r"(?:[a-z][a-z0-9_]{1,61}[a-z0-9]/)*[a-z][a-z0-9_]{1,62}[a-z0-9]")
_RELATION_NAME = re.compile(r"[a-z][a-z0-9_]{1,62}[a-z0-9]")

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE: "UNREACHABLE",
    grpc.StatusCode.CANCELLED: "UNREACHABLE",
    grpc.StatusCode.ABORTED: "UNREACHABLE",
    grpc.StatusCode.UNKNOWN: "UNREACHABLE",
    grpc.StatusCode.INTERNAL: "UNREACHABLE",
    grpc.StatusCode.DEADLINE_EXCEEDED: "TIMEOUT",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "REFUSED",
}


def is_object_id(value: object) -> bool:
    """Whether SpiceDB can name ``value`` as an object id (a string of its id alphabet, never ``*``)."""
    return isinstance(value, str) and len(value.encode("utf-8")) <= 1024 and _OBJECT_ID.fullmatch(value) is not None


_TARGET_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")
_HOST_PORT = re.compile(r"(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):[0-9]{1,5}")


def check_target(target: object) -> str:
    """``target`` if gRPC can dial it as SpiceDB's address; else a ``ValueError`` saying which forms work.

    ``host:port`` (``"spicedb.internal:50051"``, ``"[::1]:50051"``) or a gRPC name with its scheme
    (``"unix:///run/spicedb.sock"``, ``"dns:///spicedb:50051"``); never a URL (``http://...``).

    Example::

        >>> check_target("localhost:50051")
        'localhost:50051'
    """
    forms = "SpiceDB's gRPC address as host:port ('localhost:50051') or 'unix:///path/to.sock'"
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target must be {forms}")
    if target.startswith(_TARGET_SCHEMES):
        return target
    if "://" in target:
        raise ValueError(
            f"SpiceDBAcl target {target!r} is a URL; give {forms} (no http:// or grpc://: "
            "TLS is the default, insecure=True for plaintext)"
        )
    if _HOST_PORT.fullmatch(target) is None or not 0 < int(target.rsplit(":", 1)[1]) < 65536:
        raise ValueError(f"SpiceDBAcl target {target!r} is not host:port (a port is needed); give {forms}")
    return target


def check_names(*, resource_type: str, permission: str, subject_type: str, subject_relation: str | None) -> None:
    """Refuse a configuration SpiceDB would refuse on every call (a typo'd type), before the first query."""
    for label, value, pattern in (
        ("resource_type", resource_type, _TYPE_NAME),
        ("subject_type", subject_type, _TYPE_NAME),
        ("permission", permission, _RELATION_NAME),
        ("subject_relation", subject_relation, _RELATION_NAME),
    ):
        if value is None and label == "subject_relation":
            continue
        if not isinstance(value, str) or pattern.fullmatch(value) is None:
            raise ValueError(
                f"{label} must be a SpiceDB {'definition' if pattern is _TYPE_NAME else 'relation or permission'} "
                f"name as the schema spells it (lowercase, e.g. 'document', 'view'); got {value!r}"
            )


def consistency(token: str | None) -> Consistency:
    """``at_least_as_fresh(token)`` when the app gave its last write's ZedToken, else ``fully_consistent``.

    Never ``minimize_latency``: its cache may serve a revoked grant for seconds (measured 2.7-4.9 s).
    """
    if token:
        return Consistency(at_least_as_fresh=ZedToken(token=token))
    return Consistency(fully_consistent=True)


def caveat_context(values: Mapping[str, Any] | None) -> Struct | None:
    """The caller's caveat context as SpiceDB takes it (JSON-like values), or None without one.

    Raises:
        TypeError: not a mapping of str to JSON values (str, finite number, bool, None, lists
            and mappings of them); the message names the key, never the value.
    """
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise TypeError(f"caveat_context must return a mapping of caveat parameters, got {type(values).__name__}")
    for key, value in values.items():
        if not isinstance(key, str) or not _json_value(value):
            raise TypeError(
                f"caveat_context: the value for {key!r} is not a JSON value "
                "(str, finite number, bool, None, or lists and mappings of them)"
            )
    context = Struct()
    context.update(dict(values))
    return context


def _json_value(value: object) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_json_value(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and _json_value(item) for key, item in value.items())
    return False


def subject(subject_type: str, subject_id: str, relation: str | None) -> SubjectReference:
    return SubjectReference(
        object=ObjectReference(object_type=subject_type, object_id=subject_id), optional_relation=relation or ""
    )


def status_name(error: grpc.RpcError) -> str:
    """A failed call's gRPC status name (``UNAVAILABLE``): never its details, which may quote an id."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _details(error: grpc.RpcError) -> str:
    # Read to choose the advice, never copied into a message: SpiceDB's details may quote an id or value.
    details = error.details() if callable(getattr(error, "details", None)) else None
    return details if isinstance(details, str) else ""


def advice(error: grpc.RpcError, *, target: str | None = None, insecure: bool = True) -> str:
    """What to check after a failed call, by its status (and SpiceDB's words, read but never quoted).

    ``target`` (SpiceDB's address) is named where the call did not get through; ``insecure``
    says whether the channel was plaintext, so a TLS handshake with a plaintext server says so.
    """
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = _details(error).lower()
    where = f" at {target}" if target else ""
    if "caveat" in details:
        return (
            "a caveat could not be evaluated with the caller's caveat context: check what "
            "SpiceDBAcl(caveat_context=...) returns against the caveat's parameter types (an ipaddress "
            "must be an IP address string, an int an int)"
        )
    if code == grpc.StatusCode.UNAVAILABLE and not insecure and ("handshake" in details or "ssl" in details):
        return f"the TLS handshake with SpiceDB{where} failed: plaintext server? pass insecure=True"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return f"cannot reach SpiceDB{where}: check the target and that SpiceDB runs; retrying may help"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return "SpiceDB did not accept the key: check preshared_key (spicedb serve's --grpc-preshared-key)"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return "the preshared key may not make this call: check preshared_key"
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return (
            "the schema lacks a name asked: check resource_type, permission, subject_type and subject_relation "
            "against the schema (zed schema read)"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return "check the ZedToken in the context's token_attribute and the caveat context"
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return "retrying may help; a lower batch_size or a larger timeout too"
    if isinstance(code, grpc.StatusCode) and _RETRYABLE.get(code) == "UNREACHABLE":
        return "retrying may help"
    return "check the schema (resource_type, permission, subject_type), the preshared key and the ZedToken"


def unavailable(
    error: grpc.RpcError, call: str, *, target: str | None = None, insecure: bool = True
) -> PermissionsUnavailableError:
    """The typed error for a failed call: its gRPC status and advice, never SpiceDB's details (they may quote an id)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    name = status_name(error)
    reason = _RETRYABLE.get(code, "REFUSED") if isinstance(code, grpc.StatusCode) else "UNREACHABLE"
    details = _details(error).lower()
    if reason == "UNREACHABLE" and (
        "caveat" in details or (not insecure and ("handshake" in details or "ssl" in details))
    ):
        reason = "REFUSED"  # the caveat context or the TLS setting, not an outage: asking again fails again
    retryable = reason in ("UNREACHABLE", "TIMEOUT")
    return PermissionsUnavailableError(
        f"SpiceDB {call} failed ({name}); no node is returned ({advice(error, target=target, insecure=insecure)})",
        engine=ENGINE,
        reason=reason,
        retryable=retryable,
    )


class LookupPages:
    """LookupResources for one subject, page by page, read into a restriction only when complete.

    Every page asks the same question (SpiceDB refuses a cursor with other arguments), at most
    ``max_ids + 1`` results in all: more than ``max_ids`` results of any kind is no pushdown. A
    page shorter than its limit ends the lookup; a stream that breaks off never does (the caller
    turns the error into :class:`Unknown`). A conditional (caveated) result is not in the list.
    """

    def __init__(self, *, resource_type: str, permission: str, who: SubjectReference, read_at: Consistency,
                 max_ids: int, key: str | None, context: Struct | None = None) -> None:  # fmt: skip
        self._question = LookupResourcesRequest(
            consistency=read_at,
            resource_object_type=resource_type,
            permission=permission,
            subject=who,
            optional_limit=min(max_ids + 1, LOOKUP_PAGE_LIMIT),
            context=context,
        )
        self._max_ids = max_ids
        self._key = key
        self.permitted: set[str] = set()
        self._seen: set[str] = set()
        self._in_page = 0
        self._cursor: Any = None
        self._token: str | None = None
        self._done = False

    def request(self) -> LookupResourcesRequest | None:
        """The next page's request, or None when the lookup is over (complete or too large)."""
        if self._done:
            return None
        self._in_page = 0
        request = LookupResourcesRequest()
        request.CopyFrom(self._question)
        if self._cursor is not None:
            request.optional_cursor.CopyFrom(self._cursor)
        return request

    def read(self, response: LookupResourcesResponse) -> bool:
        """Take one result; False once more than ``max_ids`` are known (stop reading the stream)."""
        self._in_page += 1
        self._cursor = response.after_result_cursor
        if response.HasField("looked_up_at") and self._token is None:
            self._token = response.looked_up_at.token
        self._seen.add(response.resource_object_id)
        if response.permissionship == LookupPermissionship.LOOKUP_PERMISSIONSHIP_HAS_PERMISSION:
            self.permitted.add(response.resource_object_id)
        if len(self._seen) > self._max_ids:
            self._done = True
            return False
        return True

    def page_ended(self) -> None:
        """The page's stream ended normally: a short page is the last one."""
        if self._in_page < self._question.optional_limit:
            self._done = True

    def restriction(self) -> Restriction:
        if len(self._seen) > self._max_ids:
            return Unknown(f"the subject may read more than max_ids={self._max_ids} documents; no pushdown")
        if not self.permitted:
            return Nothing()
        return Ids(frozenset(self.permitted), key=self._key, token=self._token)


def bulk_requests(documents: Sequence[str], *, resource_type: str, permission: str, who: SubjectReference,
                  read_at: Consistency, batch_size: int,
                  context: Struct | None = None) -> list[CheckBulkPermissionsRequest]:  # fmt: skip
    """One CheckBulkPermissions request per ``batch_size`` documents, each asking one (document, subject) pair."""
    return [
        CheckBulkPermissionsRequest(
            consistency=read_at,
            items=[
                CheckBulkPermissionsRequestItem(
                    resource=ObjectReference(object_type=resource_type, object_id=document),
                    permission=permission,
                    subject=who,
                    context=context,
                )
                for document in documents[start : start + batch_size]
            ],
        )
        for start in range(0, len(documents), batch_size)
    ]


def permitted_documents(requests: Sequence[CheckBulkPermissionsRequest],
                        responses: Sequence[CheckBulkPermissionsResponse]) -> set[str]:  # fmt: skip
    """The documents SpiceDB says the subject has permission on; anything unreadable is no decision.

    Raises:
        PermissionsUnavailableError: a pair carries an error, or the pairs do not answer the
            items asked, one for one and in order (``INVALID_RESPONSE``).
    """
    permitted: set[str] = set()
    for request, response in zip(requests, responses, strict=True):
        if len(response.pairs) != len(request.items):
            raise _invalid(f"answered {len(response.pairs)} pairs for {len(request.items)} items")
        for item, pair in zip(request.items, response.pairs, strict=True):
            if pair.request.resource.object_id != item.resource.object_id:
                raise _invalid("answered pairs out of the order asked")
            if pair.WhichOneof("response") == "error":
                code = grpc.StatusCode.UNKNOWN
                for status in grpc.StatusCode:
                    if status.value[0] == pair.error.code:
                        code = status
                raise unavailable(_PairError(code, pair.error.message), "CheckBulkPermissions")
            if pair.WhichOneof("response") != "item":
                raise _invalid("answered a pair with neither a result nor an error")
            if pair.item.permissionship == CheckPermissionResponse.PERMISSIONSHIP_HAS_PERMISSION:
                permitted.add(item.resource.object_id)
    return permitted


class _PairError(grpc.RpcError):  # type: ignore[misc]
    """A pair's error status, read as a failed call."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _invalid(what: str) -> PermissionsUnavailableError:
    return PermissionsUnavailableError(
        f"SpiceDB CheckBulkPermissions {what}; an answer that does not match the question is not read as a decision",
        engine=ENGINE,
        reason="INVALID_RESPONSE",
    )
