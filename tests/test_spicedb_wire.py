"""SpiceDBAcl without a SpiceDB: its configuration refused early, and CheckBulkPermissions' answer read strictly.

The answer reading is a pure function over the ``authzed`` messages (the ones SpiceDB sends), so
the shapes a healthy SpiceDB never sends (pairs missing, out of order, empty) are built here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("authzed")

from authzed.api.v1 import (
    CheckBulkPermissionsPair,
    CheckBulkPermissionsResponse,
    CheckBulkPermissionsResponseItem,
    CheckPermissionResponse,
)
from google.rpc.status_pb2 import Status

from llama_jev.acl import SpiceDBAcl
from llama_jev.acl.spicedb.wire import bulk_requests, consistency, permitted_documents, subject
from llama_jev.errors import PermissionsUnavailableError

# -- configuration --


@pytest.mark.parametrize(
    "options",
    [
        {"resource_type": "Document"},
        {"permission": "view-all"},
        {"subject_type": ""},
        {"subject_relation": "Member"},
        {"max_ids": 0},
        {"max_ids": True},
        {"batch_size": -1},
        {"timeout": 0},
        {"timeout": float("nan")},
        {"document_id_key": ""},
    ],
)
def test_a_configuration_spicedb_would_refuse_is_a_value_error(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        SpiceDBAcl("localhost:50051", preshared_key="key", **options)


def test_an_empty_target_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="target"):
        SpiceDBAcl(" ")


# -- reading CheckBulkPermissions' answer (pure) --


def _question(documents: Sequence[str]) -> list[Any]:
    return bulk_requests(
        list(documents),
        resource_type="document",
        permission="view",
        who=subject("user", "alice", None),
        read_at=consistency(None),
        batch_size=10,
    )


def _pair(request_item: Any, permissionship: int | None = None, error_code: int | None = None) -> Any:
    if error_code is not None:
        return CheckBulkPermissionsPair(request=request_item, error=Status(code=error_code))
    return CheckBulkPermissionsPair(
        request=request_item, item=CheckBulkPermissionsResponseItem(permissionship=permissionship)
    )


def test_only_has_permission_admits() -> None:
    requests = _question(["a", "b", "c"])
    items = requests[0].items
    response = CheckBulkPermissionsResponse(
        pairs=[
            _pair(items[0], CheckPermissionResponse.PERMISSIONSHIP_HAS_PERMISSION),
            _pair(items[1], CheckPermissionResponse.PERMISSIONSHIP_CONDITIONAL_PERMISSION),
            _pair(items[2], CheckPermissionResponse.PERMISSIONSHIP_NO_PERMISSION),
        ]
    )
    assert permitted_documents(requests, [response]) == {"a"}


@pytest.mark.parametrize("shape", ["missing-pair", "reordered", "empty-pair"])
def test_an_answer_that_does_not_match_the_question_is_invalid(shape: str) -> None:
    requests = _question(["a", "b"])
    items = requests[0].items
    has = CheckPermissionResponse.PERMISSIONSHIP_HAS_PERMISSION
    pairs = {
        "missing-pair": [_pair(items[0], has)],
        "reordered": [_pair(items[1], has), _pair(items[0], has)],
        "empty-pair": [_pair(items[0], has), CheckBulkPermissionsPair(request=items[1])],
    }[shape]
    with pytest.raises(PermissionsUnavailableError) as raised:
        permitted_documents(requests, [CheckBulkPermissionsResponse(pairs=pairs)])
    assert raised.value.reason == "INVALID_RESPONSE"


def test_a_pair_error_is_no_decision() -> None:
    requests = _question(["a"])
    response = CheckBulkPermissionsResponse(pairs=[_pair(requests[0].items[0], error_code=9)])
    with pytest.raises(PermissionsUnavailableError) as raised:
        permitted_documents(requests, [response])
    assert raised.value.reason == "REFUSED"
