"""Spans say which engine decided, what it denied, the restriction kind and the widening: never an id or value.

The ``llama_jev.*`` attributes of a judged retrieval (on its span, as Phoenix and Langfuse read
it) and of an OFF retrieval (``observe_unjudged``) carry ``llama_jev.engine``,
``llama_jev.restriction``, ``llama_jev.wanted``, ``llama_jev.found`` and ``llama_jev.rounds``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("openinference.instrumentation.llama_index")

from llama_index.core import VectorStoreIndex
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llama_jev import CandidateSelector, ExecutionOptions, JevRetriever, MetadataAcl, Mode, runtime_context
from llama_jev.testing import SystemOneTestServer

from .acl_support import AllowListAcl
from .support import HashEmbedding
from .test_observability import CTX, SECRET_QUERY, client, corpus, exporter, rerankers, server

__all__ = ["exporter", "server"]  # the fixtures, used by name

NEW_ATTRIBUTES = ("engine", "restriction", "wanted", "found", "rounds")


def _retriever(server: SystemOneTestServer, mode: Mode, acl: Any, *, prefilter: bool) -> JevRetriever:
    index = VectorStoreIndex(corpus(), embed_model=HashEmbedding(dimensions=32))
    selector = CandidateSelector(client(server), ExecutionOptions(mode=mode))
    return JevRetriever.from_index(index, selector, acl, top_k=3, candidate_limit=4, prefilter=prefilter)


def _llama_jev(attributes: Any) -> dict[str, Any]:
    return {key: value for key, value in dict(attributes or {}).items() if key.startswith("llama_jev.")}


@pytest.mark.parametrize(
    ("acl", "prefilter", "engine", "restriction"),
    [
        (MetadataAcl(tenant_key="tenant"), True, "metadata", "condition"),
        (MetadataAcl(tenant_key="tenant"), False, "metadata", "none"),
        (AllowListAcl({"n0", "n1", "n2", "n3"}), False, "allow-list", "none"),
    ],
    ids=["metadata-pushdown", "metadata-post-filter", "engine"],
)
def test_a_judged_retrieval_names_its_engine_restriction_and_widening(
    acl: Any,
    prefilter: bool,
    engine: str,
    restriction: str,
    server: SystemOneTestServer,
    exporter: InMemorySpanExporter,
) -> None:
    with runtime_context(CTX):
        _retriever(server, Mode.ENFORCE, acl, prefilter=prefilter).retrieve(SECRET_QUERY)
    (span,) = rerankers(exporter)
    attributes = _llama_jev(span.attributes)
    assert (attributes["llama_jev.engine"], attributes["llama_jev.restriction"]) == (engine, restriction)
    assert (attributes["llama_jev.wanted"], attributes["llama_jev.found"]) == (4, 4)
    assert attributes["llama_jev.rounds"] >= 1
    assert attributes["llama_jev.pushdown"] is prefilter


def test_off_names_them_on_the_retrievers_span_too(server: SystemOneTestServer, exporter: InMemorySpanExporter) -> None:
    with runtime_context(CTX):
        _retriever(server, Mode.OFF, MetadataAcl(tenant_key="tenant"), prefilter=True).retrieve(SECRET_QUERY)
    (span,) = [span for span in exporter.get_finished_spans() if span.name == "JevRetriever.retrieve"]
    attributes = _llama_jev(span.attributes)
    assert {f"llama_jev.{name}" for name in NEW_ATTRIBUTES} <= set(attributes)
    assert (attributes["llama_jev.engine"], attributes["llama_jev.restriction"]) == ("metadata", "condition")
    assert (attributes["llama_jev.wanted"], attributes["llama_jev.found"], attributes["llama_jev.rounds"]) == (3, 3, 1)


@pytest.mark.parametrize("mode", [Mode.OFF, Mode.SHADOW, Mode.ENFORCE])
def test_no_id_or_identity_value_is_in_any_llama_jev_attribute(
    mode: Mode, server: SystemOneTestServer, exporter: InMemorySpanExporter
) -> None:
    with runtime_context(CTX):
        _retriever(server, mode, MetadataAcl(tenant_key="tenant"), prefilter=True).retrieve(SECRET_QUERY)
    forbidden = [node.node_id for node in corpus()] + [CTX.user_id, "acme", *CTX.roles]
    values = [
        str(value)
        for span in exporter.get_finished_spans()
        for key, value in _llama_jev(span.attributes).items()
        if key != "llama_jev.decision_id"
    ]
    assert values
    assert [value for value in values if any(secret in value for secret in forbidden)] == []
