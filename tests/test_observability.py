"""What a traced app sees: RERANKER spans (OpenInference), ``llama_jev.*`` attributes, span events
(llama-index-observability-otel) and OpenTelemetry metrics; and that none of it carries a secret.

Real parts only: the OpenTelemetry SDK's in-memory exporter and metric reader, OpenInference's
LlamaIndex instrumentor and llama-index-observability-otel's handlers, a real LlamaIndex index,
``JevClient`` over HTTP to the System One test server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("openinference.instrumentation.llama_index")

from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevClient,
    JevNodePostprocessor,
    JevRetriever,
    MetadataAcl,
    Mode,
    RetrievalUnavailableError,
    RetryPolicy,
    RuntimeContext,
    ScriptedJudge,
    runtime_context,
)
from llama_jev.calibration import CalibratedJudge, PlattMapping
from llama_jev.core import telemetry
from llama_jev.engine import JevDecisionEvent
from llama_jev.engine.rerank import judge_model_name
from llama_jev.systemone import SystemOneRequest, SystemOneResult
from llama_jev.testing import Fault, SystemOneTestServer

from .conftest import API_KEY
from .support import HashEmbedding, marked, marked_answer

# Planted where a careless implementation would copy them: the caller's identity values, the
# query, the node text. None may reach a llama_jev attribute or a metric; the identity values
# and the key reach no exported span, event or metric at all.
SECRET_USER = "user-4f1d-PLANTED-SECRET"
SECRET_SESSION = "session-9a2b-PLANTED-SECRET"
SECRET_ROLE = "role-77c3-PLANTED-SECRET"
SECRET_QUERY = "What is the refund policy QUERY-PLANTED-8e1f?"
SECRET_TEXT = "NODE-TEXT-PLANTED-51aa"
CTX = RuntimeContext(user_id=SECRET_USER, tenant_id="acme", session_id=SECRET_SESSION, roles=(SECRET_ROLE,))
MODEL = "jev-observed-model"

_reader: InMemoryMetricReader | None = None


def metric_reader() -> InMemoryMetricReader:
    """The process's meter provider is set once; every test reads it and compares before/after."""
    global _reader
    if _reader is None:
        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """Every point by metric name: (attributes, value), the value a sum or a histogram's count."""
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    found.setdefault(metric.name, []).append(
                        (dict(point.attributes or {}), value if value is not None else point.count)
                    )
    return found


def total(found: dict[str, list[tuple[dict[str, Any], float]]], name: str, **labels: Any) -> float:
    return sum(
        value
        for attributes, value in found.get(name, [])
        if all(attributes.get(f"llama_jev.{key}") == wanted for key, wanted in labels.items())
    )


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """OpenInference's LlamaIndex instrumentor, exporting to memory (what Phoenix and Langfuse read)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield memory
    finally:
        instrumentor.uninstrument()


# llama-index-observability-otel 0.7 (the newest) pins llama-index-instrumentation < 0.6, which
# llama-index-core 0.14's users get as 0.6: it is the `test-otel` extra, not part of `test`, so the
# suite runs on what `example` installs. CI runs this module a second time with it
# (.ci/run; LLAMA_JEV_TEST_OTEL=1 turns its skip into a failure there).
@pytest.fixture
def otel_events() -> Iterator[InMemorySpanExporter]:
    """llama-index-observability-otel's span and event handlers on the root dispatcher, exporting to memory."""
    try:
        from llama_index.observability.otel.base import OTelCompatibleEventHandler, OTelCompatibleSpanHandler
    except ImportError:
        if os.environ.get("LLAMA_JEV_TEST_OTEL"):
            pytest.fail(
                'LLAMA_JEV_TEST_OTEL is set, llama-index-observability-otel is missing: pip install -e ".[test-otel]"'
            )
        pytest.skip('llama-index-observability-otel is the test-otel extra: pip install -e ".[test-otel]"')
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    spans = OTelCompatibleSpanHandler(tracer=provider.get_tracer("test"))
    events = OTelCompatibleEventHandler(span_handler=spans)
    root = get_dispatcher()
    root.add_span_handler(spans)
    root.add_event_handler(events)
    try:
        yield memory
    finally:
        root.span_handlers.remove(spans)
        root.event_handlers.remove(events)


@pytest.fixture
def server() -> Iterator[SystemOneTestServer]:
    with SystemOneTestServer(marked_answer, api_key=API_KEY, model=MODEL) as running:
        yield running


def client(server: SystemOneTestServer, **kwargs: Any) -> JevClient:
    return JevClient(
        api_key=API_KEY, base_url=server.base_url, model=MODEL, retry=RetryPolicy(initial_backoff=0.01), **kwargs
    )


def corpus() -> list[TextNode]:
    """Six nodes of the caller's tenant (three relevant, one uncertain, two not) and two of another."""
    texts = [
        (0.95, "acme", "Refunds are paid within seven days."),
        (0.9, "acme", "Refund requests need the receipt."),
        (0.85, "acme", "Opened items are refunded at 80 percent."),
        (0.5, "acme", "Vouchers can sometimes replace a refund."),
        (0.05, "acme", "Shipping takes three days."),
        (0.05, "acme", "The office closes at five."),
        (0.95, "globex", "Globex refunds everything."),
        (0.95, "globex", "Globex refund desk."),
    ]
    return [
        TextNode(id_=f"n{i}", text=marked(p, f"{text} {SECRET_TEXT}"), metadata={"tenant": tenant})
        for i, (p, tenant, text) in enumerate(texts)
    ]


def jev_retriever(server: SystemOneTestServer, mode: Mode, top_k: int = 3) -> JevRetriever:
    index = VectorStoreIndex(corpus(), embed_model=HashEmbedding(dimensions=32))
    selector = CandidateSelector(client(server), ExecutionOptions(mode=mode))
    return JevRetriever(
        index.as_retriever(similarity_top_k=8),
        selector,
        MetadataAcl(tenant_key="tenant"),
        candidate_limit=8,
        top_k=top_k,
    )


def postprocessor(server: SystemOneTestServer, mode: Mode) -> JevNodePostprocessor:
    selector = CandidateSelector(client(server), ExecutionOptions(mode=mode))
    return JevNodePostprocessor(selector, MetadataAcl(tenant_key="tenant"), top_n=3)


def retrieved_nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=node, score=1.0 - i / 10) for i, node in enumerate(corpus())]


def kind(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get("openinference.span.kind")


def rerankers(memory: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in memory.get_finished_spans() if kind(span) == "RERANKER"]


def documents(span: ReadableSpan, side: str) -> list[dict[str, Any]]:
    """OpenInference's flattened ``reranker.<side>_documents.N.document.*`` attributes, in order."""
    attributes = span.attributes or {}
    found: list[dict[str, Any]] = []
    index = 0
    while f"reranker.{side}_documents.{index}.document.id" in attributes:
        prefix = f"reranker.{side}_documents.{index}.document."
        found.append({key[len(prefix) :]: value for key, value in attributes.items() if key.startswith(prefix)})
        index += 1
    return found


async def run_component(component: str, server: SystemOneTestServer, mode: Mode, sync: bool) -> list[NodeWithScore]:
    with runtime_context(CTX):
        if component == "retriever":
            # OFF and SHADOW recall top_k, ENFORCE candidate_limit: each sees all eight nodes.
            retriever = jev_retriever(server, mode, top_k=3 if mode is Mode.ENFORCE else 8)
            return retriever.retrieve(SECRET_QUERY) if sync else await retriever.aretrieve(SECRET_QUERY)
        processor = postprocessor(server, mode)
        bundle = QueryBundle(SECRET_QUERY)
        if sync:
            return processor.postprocess_nodes(retrieved_nodes(), bundle)
        return await processor.apostprocess_nodes(retrieved_nodes(), bundle)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("component", ["retriever", "postprocessor"])
async def test_each_judgement_is_a_reranker_span_whose_output_is_the_nodes_returned(
    component: str, sync: bool, server: SystemOneTestServer, exporter: InMemorySpanExporter
) -> None:
    returned = await run_component(component, server, Mode.ENFORCE, sync)

    (span,) = rerankers(exporter)
    owner = "JevRetriever" if component == "retriever" else "JevNodePostprocessor"
    assert span.name == f"{owner}.judge"
    attributes = span.attributes or {}
    assert attributes["reranker.model_name"] == MODEL
    assert attributes["reranker.top_k"] == 3
    # In: the six nodes the ACL let through (never globex's); out: exactly what the caller got.
    inputs = documents(span, "input")
    assert sorted(document["id"] for document in inputs) == [f"n{i}" for i in range(6)]
    outputs = documents(span, "output")
    assert [document["id"] for document in outputs] == [node.node.node_id for node in returned]
    assert [document["id"] for document in outputs] == ["n0", "n1", "n2"]
    for document, node in zip(outputs, returned, strict=True):
        assert document["score"] == node.score  # the retriever's score, not p
        assert json.loads(document["metadata"])["jev_probability"] == node.node.metadata["jev_probability"]
    assert attributes["llama_jev.status"] == "decided"
    assert span.status.status_code is StatusCode.OK


async def test_the_reranker_span_sits_inside_the_retrievers_span(
    server: SystemOneTestServer, exporter: InMemorySpanExporter
) -> None:
    await run_component("retriever", server, Mode.ENFORCE, sync=True)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    judge, retrieve = spans["JevRetriever.judge"], spans["JevRetriever.retrieve"]
    assert judge.parent is not None
    assert judge.parent.span_id == retrieve.context.span_id
    assert kind(retrieve) == "RETRIEVER"
    # One span per retrieval for the wrapper, not one per overridden method.
    assert [span.name for span in exporter.get_finished_spans()].count("JevRetriever.retrieve") == 1
    assert "JevRetriever._retrieve" not in spans


@pytest.mark.parametrize(
    ("mode", "status", "selected", "uncertain", "rejected"),
    [(Mode.ENFORCE, "decided", 3, 1, 2), (Mode.SHADOW, "decided", 3, 1, 2)],
)
def test_the_decision_is_written_as_llama_jev_attributes(
    mode: Mode,
    status: str,
    selected: int,
    uncertain: int,
    rejected: int,
    server: SystemOneTestServer,
    exporter: InMemorySpanExporter,
) -> None:
    # SHADOW recalls top_k, ENFORCE candidate_limit: both see all eight nodes here.
    with runtime_context(CTX):
        jev_retriever(server, mode, top_k=8 if mode is Mode.SHADOW else 3).retrieve(SECRET_QUERY)

    (span,) = rerankers(exporter)
    attributes = span.attributes or {}
    assert attributes["llama_jev.mode"] == mode.value
    assert attributes["llama_jev.status"] == status
    assert attributes["llama_jev.reason"] == "CLASSIFIED"
    assert attributes["llama_jev.retrieved"] == 8
    assert attributes["llama_jev.denied"] == 2
    assert attributes["llama_jev.candidates"] == 6
    assert attributes["llama_jev.judged"] == 6
    assert (attributes["llama_jev.selected"], attributes["llama_jev.uncertain"], attributes["llama_jev.rejected"]) == (
        selected,
        uncertain,
        rejected,
    )
    assert attributes["llama_jev.requests"] == 1
    assert attributes["llama_jev.model"] == MODEL
    assert len(str(attributes["llama_jev.decision_id"])) == 32


_global_spans: InMemorySpanExporter | None = None


def global_span_exporter() -> InMemorySpanExporter:
    """The process's tracer provider (what Phoenix's ``register()`` sets), set once, exporting to memory."""
    global _global_spans
    if _global_spans is None:
        _global_spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_global_spans))
        trace.set_tracer_provider(provider)
    _global_spans.clear()
    return _global_spans


def test_a_reranker_span_full_of_documents_keeps_the_decision_in_a_child_span(server: SystemOneTestServer) -> None:
    """OpenInference writes four attributes per document when the RERANKER span ends; 20 in and 20
    out pass the SDK's default limit of 128 and the oldest (ours) are dropped. The decision also goes
    on a child span of its own, ``llama_jev.decision``, which nothing crowds out."""
    memory = global_span_exporter()
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
    nodes = [
        TextNode(id_=f"d{i}", text=marked(0.9, f"refund rule {i}"), metadata={"tenant": "acme"}) for i in range(24)
    ]
    index = VectorStoreIndex(nodes, embed_model=HashEmbedding(dimensions=32))
    selector = CandidateSelector(client(server), ExecutionOptions(mode=Mode.ENFORCE))
    retriever = JevRetriever(
        index.as_retriever(similarity_top_k=20),
        selector,
        MetadataAcl(tenant_key="tenant"),
        candidate_limit=20,
        top_k=20,
    )
    try:
        with runtime_context(CTX):
            returned = retriever.retrieve(SECRET_QUERY)
    finally:
        instrumentor.uninstrument()

    (reranker,) = rerankers(memory)
    (decision,) = [span for span in memory.get_finished_spans() if span.name == "llama_jev.decision"]
    attributes = decision.attributes or {}
    assert len(returned) == 20
    assert decision.parent is not None
    assert decision.parent.span_id == reranker.context.span_id
    assert (attributes["llama_jev.mode"], attributes["llama_jev.status"], attributes["llama_jev.selected"]) == (
        "enforce",
        "decided",
        20,
    )
    assert attributes["llama_jev.candidates"] == 20
    assert all(key.startswith("llama_jev.") for key in attributes)
    planted = (SECRET_QUERY, SECRET_USER, SECRET_SESSION, SECRET_ROLE, "refund rule")
    assert not [value for value in attributes.values() for secret in planted if secret in str(value)]


def test_off_is_described_on_the_retrievers_span_with_no_reranker(
    server: SystemOneTestServer, exporter: InMemorySpanExporter
) -> None:
    with runtime_context(CTX):
        returned = jev_retriever(server, Mode.OFF, top_k=8).retrieve(SECRET_QUERY)

    assert len(returned) == 6
    assert rerankers(exporter) == []
    (span,) = [span for span in exporter.get_finished_spans() if span.name == "JevRetriever.retrieve"]
    attributes = span.attributes or {}
    assert (attributes["llama_jev.mode"], attributes["llama_jev.status"], attributes["llama_jev.reason"]) == (
        "off",
        "skipped",
        "MODE_OFF",
    )
    assert (attributes["llama_jev.retrieved"], attributes["llama_jev.denied"]) == (8, 2)
    assert server.requests == []


def test_a_failed_judgement_is_an_error_span_that_says_why(
    server: SystemOneTestServer, exporter: InMemorySpanExporter
) -> None:
    server.inject_always(Fault.status(401))

    with runtime_context(CTX), pytest.raises(RetrievalUnavailableError):
        jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY)

    (span,) = rerankers(exporter)
    attributes = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert attributes["llama_jev.status"] == "error"
    assert attributes["llama_jev.reason"] == "CALL_OR_RESPONSE_ERROR"
    assert attributes["llama_jev.error_type"] == "JevAuthenticationError"
    assert attributes["llama_jev.status_code"] == 401
    assert attributes["llama_jev.retryable"] is False


def test_with_no_llamaindex_handler_the_attributes_land_on_the_apps_current_span(server: SystemOneTestServer) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    retriever = jev_retriever(server, Mode.ENFORCE)

    with provider.get_tracer("app").start_as_current_span("request"), runtime_context(CTX):
        retriever.retrieve(SECRET_QUERY)

    (span,) = memory.get_finished_spans()
    assert (span.attributes or {})["llama_jev.status"] == "decided"
    assert (span.attributes or {})["llama_jev.selected"] == 3


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_the_decision_event_stays_a_span_event_for_observability_otel(
    sync: bool, server: SystemOneTestServer, otel_events: InMemorySpanExporter
) -> None:
    returned = await run_component("retriever", server, Mode.ENFORCE, sync)

    (judge,) = [span for span in otel_events.get_finished_spans() if span.name == "JevRetriever.judge"]
    names = [event.name for event in judge.events]
    assert names == ["ReRankStartEvent", "JevDecisionEvent", "ReRankEndEvent"]
    decision = judge.events[1].attributes or {}
    assert decision["record.status"] == "decided"
    assert decision["record.selected"] == tuple(node.node.node_id for node in returned)
    assert (judge.attributes or {})["llama_jev.mode"] == "enforce"


def test_a_decision_event_handler_without_span_handlers_still_gets_the_record(server: SystemOneTestServer) -> None:
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    seen: list[Any] = []

    class Collect(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            seen.append(event)

    collector = Collect()
    root = get_dispatcher()
    root.add_event_handler(collector)
    try:
        with runtime_context(CTX):
            jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY)
    finally:
        root.event_handlers.remove(collector)
    names = [type(event).__name__ for event in seen]
    assert names.index("ReRankStartEvent") < names.index("JevDecisionEvent") < names.index("ReRankEndEvent")
    decision = next(event for event in seen if isinstance(event, JevDecisionEvent))
    assert decision.record.status.value == "decided"


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_metric_points_are_counted_per_mode(sync: bool, server: SystemOneTestServer) -> None:
    reader = metric_reader()
    before = points(reader)

    for mode in (Mode.OFF, Mode.SHADOW, Mode.ENFORCE, Mode.ENFORCE):
        await run_component("retriever", server, mode, sync)

    after = points(reader)

    def delta(name: str, **labels: Any) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta(telemetry.DECISIONS, mode="off", status="skipped", reason="MODE_OFF") == 1
    assert delta(telemetry.DECISIONS, mode="shadow", status="decided", reason="CLASSIFIED") == 1
    assert delta(telemetry.DECISIONS, mode="enforce", status="decided", reason="CLASSIFIED") == 2
    assert delta(telemetry.JUDGEMENT_DURATION, mode="enforce", status="decided") == 2
    assert delta(telemetry.JUDGEMENT_DURATION, mode="off") == 0
    assert delta(telemetry.CANDIDATES, mode="enforce", outcome="denied") == 4
    assert delta(telemetry.CANDIDATES, mode="enforce", outcome="selected") == 6
    assert delta(telemetry.CANDIDATES, mode="enforce", outcome="uncertain") == 2
    assert delta(telemetry.CANDIDATES, mode="enforce", outcome="rejected") == 4
    assert delta(telemetry.CANDIDATES, mode="off", outcome="denied") == 2


def test_client_retries_and_429s_are_counted(server: SystemOneTestServer) -> None:
    reader = metric_reader()
    before = points(reader)
    server.inject(Fault.rate_limited(retry_after=0), Fault.status(503))

    with runtime_context(CTX):
        jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY)

    after = points(reader)
    retries = by_status(before, after, telemetry.CLIENT_RETRIES)
    assert (retries.get(429), retries.get(503)) == (1, 1)
    limited = by_status(before, after, telemetry.CLIENT_RATE_LIMITED)
    assert (limited.get(429), limited.get(529, 0)) == (1, 0)


def by_status(
    before: dict[str, list[tuple[dict[str, Any], float]]],
    after: dict[str, list[tuple[dict[str, Any], float]]],
    name: str,
) -> dict[Any, float]:
    """How much each ``http.response.status_code`` point of ``name`` grew between two readings."""
    grown: dict[Any, float] = {}
    for labels, value in after.get(name, []):
        earlier = sum(old for old_labels, old in before.get(name, []) if old_labels == labels)
        status = labels.get("http.response.status_code")
        grown[status] = grown.get(status, 0) + value - earlier
    return grown


@pytest.mark.parametrize("handlers", ["exporter", "otel_events"], ids=["openinference", "observability-otel"])
async def test_nothing_secret_in_any_span_event_or_metric(
    handlers: str, server: SystemOneTestServer, request: pytest.FixtureRequest
) -> None:
    # One tracing integration at a time, as an app runs it (two handlers attaching OpenTelemetry
    # contexts around the same spans interleave their resets).
    memory: InMemorySpanExporter = request.getfixturevalue(handlers)
    reader = metric_reader()
    server.inject(Fault.rate_limited(retry_after=0))
    for mode in (Mode.OFF, Mode.SHADOW, Mode.ENFORCE):
        for component in ("retriever", "postprocessor"):
            await run_component(component, server, mode, sync=True)
            await run_component(component, server, mode, sync=False)
    # The identity passed as an argument, where a span handler records arguments.
    jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY, ctx=CTX)
    await jev_retriever(server, Mode.ENFORCE).aretrieve(SECRET_QUERY, ctx=CTX)
    postprocessor(server, Mode.ENFORCE).postprocess_nodes(retrieved_nodes(), QueryBundle(SECRET_QUERY), ctx=CTX)
    server.inject_always(Fault.status(500))
    with runtime_context(CTX), pytest.raises(RetrievalUnavailableError):
        jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY)

    spans = list(memory.get_finished_spans())
    assert any(span.name == "JevRetriever.judge" for span in spans), "the run must have produced judge spans"
    everything = "\n".join(span.to_json() for span in spans)
    metrics_json = reader.get_metrics_data().to_json()
    assert "llama_jev.decisions" in metrics_json
    for secret in (SECRET_USER, SECRET_SESSION, SECRET_ROLE, API_KEY):
        assert secret not in everything
        assert secret not in metrics_json
    # The query and the node text are LlamaIndex's own events' business (retrieval and rerank
    # documents); never in a llama_jev attribute or a metric.
    ours = json.dumps(
        [
            {key: value for key, value in (span.attributes or {}).items() if key.startswith("llama_jev.")}
            for span in spans
        ],
        default=str,
    )
    assert '"llama_jev.mode"' in ours
    for secret in (SECRET_QUERY, "QUERY-PLANTED", SECRET_TEXT):
        assert secret not in ours
        assert secret not in metrics_json


def test_without_the_opentelemetry_api_every_telemetry_call_is_a_no_op(
    server: SystemOneTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if opentelemetry-api were not installed (None in sys.modules makes its import fail).
    for name in ("opentelemetry", "opentelemetry.metrics", "opentelemetry.trace"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(telemetry, "_loaded", False)
    monkeypatch.setattr(telemetry, "_instruments", None)

    with runtime_context(CTX):
        returned = jev_retriever(server, Mode.ENFORCE).retrieve(SECRET_QUERY)
    telemetry.count_retry("JevServerError", 503)
    telemetry.count_rate_limited(429)

    assert [node.node.node_id for node in returned] == ["n0", "n1", "n2"]
    assert telemetry._telemetry() is None


def test_the_reranker_is_named_by_the_judges_model_as_its_records_name_it() -> None:
    client = JevClient(base_url="http://127.0.0.1:9", model="jev-2")

    assert judge_model_name(ScriptedJudge(lambda state, qid, ins: 0.5, model="scripted-demo")) == "scripted-demo"
    assert judge_model_name(client) == "jev-2"
    assert judge_model_name(CalibratedJudge(client, PlattMapping(slope=1.0, intercept=0.0))) == "jev-2+platt"
    # A judge that names no model: its class name.
    assert judge_model_name(CalibratedJudge(Nameless(), PlattMapping(slope=1.0, intercept=0.0))) == "CalibratedJudge"


class Nameless:
    """A judge with no ``model`` attribute."""

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        raise NotImplementedError

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        raise NotImplementedError
