"""What ``CerbosAcl`` sends to the PDP and how it reads the answers, as plain data (the PDP's JSON shape).

Written once for both transports: the HTTP client sends these shapes as they are, the gRPC client
parses them into the same protobuf messages (``json_format.ParseDict``) and turns the answers back
(``MessageToDict``). Nothing here does I/O, so the sync and async paths share every rule.

Example::

    >>> from llama_jev.core.identity import RuntimeContext
    >>> principal_of(RuntimeContext(user_id="u1", tenant_id="acme"), default_roles=("user",))
    {'id': 'u1', 'roles': ['user'], 'attr': {'tenant': 'acme'}}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llama_index.core.schema import BaseNode

from llama_jev.core.identity import RuntimeContext

__all__ = ["InvalidAnswerError", "allowed_ids", "batches", "principal_of", "resources_of"]

Json = dict[str, Any]


class InvalidAnswerError(ValueError):
    """A CheckResources answer that cannot be read as a decision; the message holds no id or value."""


def principal_of(ctx: RuntimeContext, *, default_roles: Sequence[str]) -> Json:
    """The Cerbos principal for ``ctx``: id = user id, its roles (else ``default_roles``), attributes and ``tenant``."""
    attributes: Json = dict(ctx.attributes)
    if ctx.tenant_id is not None:
        # The context's tenant is authoritative: an attribute named "tenant" never overrides it.
        attributes["tenant"] = ctx.tenant_id
    else:
        attributes.pop("tenant", None)
    return {"id": ctx.user_id, "roles": sorted(ctx.roles or default_roles), "attr": attributes}


def _attributes(metadata: Mapping[str, Any], attribute_keys: Mapping[str, str]) -> Json:
    """A node's metadata as resource attributes, renamed keys mapped."""
    if not attribute_keys:
        return dict(metadata)
    renamed = set(attribute_keys.values())
    attributes = {key: value for key, value in metadata.items() if key not in renamed}
    for name, key in attribute_keys.items():
        attributes.pop(name, None)
        if key in metadata:
            attributes[name] = metadata[key]
    return attributes


def resources_of(
    nodes: Sequence[BaseNode],
    *,
    kind: str,
    attribute_keys: Mapping[str, str],
    document_id_key: str | None,
) -> tuple[list[Json], list[list[str]]]:
    """The distinct resources to check for ``nodes``, and for each the node ids it decides.

    Each node is its own resource (id = node id) unless ``document_id_key`` names the metadata key
    holding its document's id; chunks that agree on id and attributes are asked about once. A node
    whose metadata is not JSON, or lacks a string document id, is asked about by nobody: denied.
    """
    resources: list[Json] = []
    decides: list[list[str]] = []
    seen: dict[str, int] = {}
    for node in nodes:
        resource_id = node.node_id if document_id_key is None else node.metadata.get(document_id_key)
        if not isinstance(resource_id, str) or not resource_id:
            continue
        try:
            # A value JSON cannot carry (a set, bytes, a datetime) would reach the PDP as something else.
            signature = json.dumps(
                [resource_id, _attributes(node.metadata, attribute_keys)], sort_keys=True, allow_nan=False
            )
        except (TypeError, ValueError):
            continue
        if signature in seen:
            decides[seen[signature]].append(node.node_id)
            continue
        seen[signature] = len(resources)
        _, attributes = json.loads(signature)  # as JSON reads it: a tuple is a list, as the PDP will see it
        resources.append({"kind": kind, "id": resource_id, "attr": attributes})
        decides.append([node.node_id])
    return resources, decides


def batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in slices of at most ``size`` (the PDP's ``maxResourcesPerRequest``)."""
    return [items[start : start + size] for start in range(0, len(items), size)]


def allowed_ids(
    answer: Mapping[str, Any], asked: Sequence[Json], decides: Iterable[list[str]], action: str
) -> set[str]:
    """The node ids whose resource the PDP answered ``EFFECT_ALLOW`` for ``action``.

    The answer must hold one result per resource asked, in order and with the same id (Cerbos
    answers in request order), each naming an effect for ``action``; a validation error, a missing
    or extra result, or an effect other than ``EFFECT_ALLOW`` / ``EFFECT_DENY`` is not a decision.

    Raises:
        InvalidAnswerError: the answer cannot be read as above.
    """
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != len(asked):
        raise InvalidAnswerError("the PDP answered a different number of results than resources asked")
    allowed: set[str] = set()
    for result, resource, node_ids in zip(results, asked, decides, strict=True):
        if not isinstance(result, Mapping):
            raise InvalidAnswerError("a result is not an object")
        answered = result.get("resource")
        if not isinstance(answered, Mapping) or answered.get("id") != resource["id"]:
            raise InvalidAnswerError("a result names another resource than the one asked at its place")
        if result.get("validationErrors"):
            raise InvalidAnswerError("the PDP reported validation errors (a resource or principal fails a schema)")
        actions = result.get("actions")
        effect = actions.get(action) if isinstance(actions, Mapping) else None
        if effect == "EFFECT_ALLOW":
            allowed.update(node_ids)
        elif effect != "EFFECT_DENY":
            raise InvalidAnswerError("a result holds no known effect for the action asked")
    return allowed
