"""Milvus pushdown against both real engines: Milvus Lite 2.5 in-process and the ``milvus`` 2.3.5 server.

The adapter-equivalence test over the server is in tests/test_store_adapters.py; here Lite gets
the same hostile corpus and its own claims (it cannot run ``not (...)``), hostile values are
escaped, nodes written through LlamaIndex's store are found by the next search, and an engine
that is down is an error in every mode, never an empty answer.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import QueryBundle, TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
    ScriptedJudge,
)
from llama_jev.acl import And, Condition, Conditional, Equals, IdIn, In, Intersects, ListContains, Not, Or, evaluate
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.stores.milvus import Fields, MilvusPushdown, milvus_expression
from llama_jev.stores.milvus_probe import ProbeHistory, probe_window

from . import test_store_adapters as equivalence
from .milvus_support import ENGINES, closing, milvus_index, uri_for

LITE_REFUSES = {"not-list-contains", "not-intersects", "not-document"}


@pytest.fixture
def lite(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    for index in closing(milvus_index(uri_for("lite", request), equivalence.NODE_SET, dim=8)):
        yield index.as_retriever(similarity_top_k=equivalence.NODES)


def test_lite_admits_exactly_what_the_in_process_acl_allows(lite: BaseRetriever) -> None:
    equivalence.test_every_adapter_admits_exactly_what_the_in_process_acl_allows((MilvusPushdown, lite))


def test_lite_states_every_operator_exactly_but_a_negation_it_cannot_run(
    lite: BaseRetriever, caplog: pytest.LogCaptureFixture
) -> None:
    claims = {name: "refused" if name in LITE_REFUSES else "exact" for name in equivalence.RESTRICTIONS}
    assert equivalence._outcomes(MilvusPushdown, lite, caplog) == claims


HOSTILE = ["acme' OR 1=1 --", '"', "\\", '\\") or true or ("', "Zürich ✓ 東京 😀"]


@pytest.mark.parametrize("engine", ENGINES)
def test_hostile_values_and_ids_are_compared_as_strings_never_read_as_expression(
    engine: str, request: pytest.FixtureRequest
) -> None:
    nodes = [
        TextNode(id_=f"id-{value}", text="t", embedding=[1.0, float(i)], metadata={"tenant": value, "users": [value]})
        for i, value in enumerate(HOSTILE)
    ]
    for index in closing(milvus_index(uri_for(engine, request), nodes, dim=2)):
        retriever = index.as_retriever(similarity_top_k=len(nodes))
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant", users_key="users"), set())
        for node in nodes:
            value = node.metadata["tenant"]
            for condition in (
                Equals("tenant", value),
                ListContains("users", value),
                IdIn(frozenset({node.node_id})),
                And((Equals("tenant", value), IdIn(frozenset({node.node_id, "id-x' or 1=1"})))),
            ):
                upstream = copy.copy(retriever)
                assert pushdown.apply(upstream, Conditional(condition), RuntimeContext(user_id="u"))
                got = [hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))]
                assert got == [node.node_id], (engine, condition)


def test_the_expression_escapes_quotes_and_backslashes_and_refuses_control_characters() -> None:
    with pytest.raises(Exception, match="control character"):
        milvus_expression(Equals("tenant", "a\nb"))  # Lite reads an escaped newline as a backslash and an n
    assert milvus_expression(Equals("tenant", '\\") or true or ("')) == '$meta["tenant"] == "\\\\\\") or true or (\\""'
    assert milvus_expression(Not(ListContains("users", "u1"))).startswith("not (")
    with pytest.raises(Exception, match="Lite"):
        milvus_expression(Not(ListContains("users", "u1")), lite=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_nodes_written_through_llamaindex_are_found_by_the_next_search(
    engine: str, request: pytest.FixtureRequest
) -> None:
    """Written, then searched at once through JevRetriever with the store's default (Session) consistency."""
    acl = MetadataAcl(tenant_key="tenant")
    first = [TextNode(id_=f"a{i}", text="t", embedding=[1.0, i / 100], metadata={"tenant": "acme"}) for i in range(5)]
    for index in closing(milvus_index(uri_for(engine, request), first, dim=2)):
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        retriever = JevRetriever.from_index(index, selector, acl, top_k=10)
        ctx = RuntimeContext(user_id="u", tenant_id="acme")
        assert len(retriever.retrieve(QueryBundle("q", embedding=[1.0, 0.0]), ctx=ctx)) == 5
        more = [TextNode(id_=f"b{i}", text="t", embedding=[1.0, i / 50], metadata={"tenant": "acme"}) for i in range(5)]
        index.insert_nodes(more)
        assert len(retriever.retrieve(QueryBundle("q", embedding=[1.0, 0.0]), ctx=ctx)) == 10


@pytest.mark.slow
async def test_a_server_that_is_down_is_an_error_in_every_mode_never_an_empty_answer() -> None:
    """One server of its own (stopped mid-test), three retrievers: OFF, SHADOW, ENFORCE; sync and async.

    Run apart from the session's server: two 2.3.5 servers starting side by side crashed one here.
    """
    from pymilvus.exceptions import MilvusException

    from llama_jev.testing.milvus import milvus_server

    from .milvus_support import require_milvus

    require_milvus("server")
    nodes = [TextNode(id_=f"n{i}", text="t", embedding=[1.0, i / 10], metadata={"tenant": "acme"}) for i in range(5)]
    ctx = RuntimeContext(user_id="u", tenant_id="acme")
    query = QueryBundle("q", embedding=[1.0, 0.0])
    with milvus_server() as server:
        index = milvus_index(server.uri, nodes, dim=2)
        retrievers = [
            JevRetriever.from_index(
                index,
                CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=mode)),
                MetadataAcl(tenant_key="tenant"),
                top_k=3,
            )
            for mode in (Mode.OFF, Mode.SHADOW, Mode.ENFORCE)
        ]
        for retriever in retrievers:
            assert len(retriever.retrieve(query, ctx=ctx)) == 3
    for retriever in retrievers:
        with pytest.raises(MilvusException):
            retriever.retrieve(query, ctx=ctx)
        with pytest.raises(MilvusException):
            await retriever.aretrieve(query, ctx=ctx)


@pytest.mark.slow  # the server
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_a_selective_caller_over_an_approximate_index_gets_the_exact_top_k(
    request: pytest.FixtureRequest, use_async: bool
) -> None:
    """IVF_FLAT probing 1 of 64 lists; a tenant of 30 spread rows is read and ranked exactly (count(*) <= 2,048).

    (The engine stopping short itself needs sealed, indexed segments of thousands of rows: measured
    in benchmarks/bench_filtered.py, where the 2.3.5 server's HNSW returned 0.5 of 5 at 0.05 %.)
    """
    import random

    rng = random.Random(41)
    nodes = [
        TextNode(
            id_=f"n{i}",
            text="t",
            embedding=[rng.uniform(-1, 1) for _ in range(8)],
            metadata={"tenant": "acme" if i % 20 == 0 else "globex"},
        )
        for i in range(600)
    ]
    store_options = {"index_config": {"index_type": "IVF_FLAT", "nlist": 64}, "search_config": {"nprobe": 1}}
    for index in closing(milvus_index(uri_for("server", request), nodes, dim=8, **store_options)):
        query = QueryBundle("q", embedding=[0.5] * 8)
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        retriever = JevRetriever.from_index(index, selector, MetadataAcl(tenant_key="tenant"), top_k=10)
        ctx = RuntimeContext(user_id="u", tenant_id="acme")
        got = await retriever.aretrieve(query, ctx=ctx) if use_async else retriever.retrieve(query, ctx=ctx)
        permitted = [node for node in nodes if node.metadata["tenant"] == "acme"]
        distance = {node.node_id: sum((a - 0.5) ** 2 for a in node.embedding or []) for node in permitted}
        assert [hit.node.node_id for hit in got] == sorted(distance, key=distance.__getitem__)[:10]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenant_declared_as_a_varchar_schema_field_is_read_as_that_field(
    engine: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """As a partition key must be: a schema field, not a key of the dynamic field."""
    from pymilvus import DataType

    nodes = [
        TextNode(
            id_=f"n{i}", text="t", embedding=[1.0, i / 10], metadata={"tenant": ["acme", "o'brien\\"][i % 2], "n": i}
        )
        for i in range(10)
    ]
    options = {"scalar_field_names": ["tenant", "n"], "scalar_field_types": [DataType.VARCHAR, DataType.INT64]}
    for index in closing(milvus_index(uri_for(engine, request), nodes, dim=2, **options)):
        retriever = index.as_retriever(similarity_top_k=10)
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant"), set())
        for tenant in ("acme", "o'brien\\"):
            upstream = copy.copy(retriever)
            assert pushdown.apply(upstream, Conditional(Equals("tenant", tenant)), RuntimeContext(user_id="u"))
            assert upstream._kwargs["string_expr"].startswith("tenant == ")  # type: ignore[attr-defined]
            got = {hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))}
            assert got == {node.node_id for node in nodes if node.metadata["tenant"] == tenant}
        # An INT64 schema field is not in $meta: refused, never read as "missing" (which would drop every node).
        upstream = copy.copy(retriever)
        assert not pushdown.apply(upstream, Conditional(Equals("n", 3)), RuntimeContext(user_id="u"))


# Over an exact (FLAT) index the cheaper filters are searched first, their rows checked by the ACL's
# own rule: no ACL filter, then the tenant's ``==``, then the whole expression.
PROBE_CASES = {
    # case: (the tenant's rows, of which the caller may read, the tenant near the query?,
    #        the searches made, the searches made when asked again)
    "most rows near are readable: no filter answers": (40, range(40), True, ["none"], ["none"]),
    "the tenant answers": (40, range(40), False, ["none", "tenant"], ["tenant"]),
    "few readable among many: the exact expression, then at once": (
        40, range(0, 40, 13), False, ["none", "tenant", "exact"], ["exact"]),
    "the tenant's every row read: it answers, short": (12, range(0, 12, 3), False, ["none", "tenant"], ["tenant"]),
}  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", PROBE_CASES)
async def test_over_an_exact_index_cheaper_filters_are_searched_first_and_checked(
    engine: str, use_async: bool, case: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer is the exact filtered top k whichever search gives it; the searches are as the case says."""
    import random

    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    size, readable, near, searches, again_searches = PROBE_CASES[case]
    rng = random.Random(7)

    def embedding(close: bool) -> list[float]:  # the query is [1, 0, 0, 0]: near rows come first
        return [1.0 if close else -1.0, *(rng.uniform(-0.3, 0.3) for _ in range(3))]

    nodes = [
        TextNode(
            id_=f"n{i}",
            text="t",
            embedding=embedding((i < size) == near),
            metadata={
                "tenant": "acme" if i < size else "globex",
                "users": ["u1", "u2"] if i < size and i in readable else ["u2"],
                "kind": "faq" if i % 2 == 0 else "manual",
            },
        )
        for i in range(size + 45)
    ]
    made: list[str] = []

    def searched(kwargs: dict[str, object]) -> None:
        expression = str(kwargs.get("string_expr", ""))
        made.append("exact" if '$meta["users"]' in expression else "tenant" if "tenant" in expression else "none")

    for index in closing(milvus_index(uri_for(engine, request), nodes, dim=4)):
        kind = type(index.vector_store)
        query_of, aquery_of = kind.query, kind.aquery

        def spied(self: object, query: object, __query: Any = query_of, **kwargs: object) -> object:
            searched(kwargs)
            return __query(self, query, **kwargs)

        async def aspied(self: object, query: object, __aquery: Any = aquery_of, **kwargs: object) -> object:
            searched(kwargs)
            return await __aquery(self, query, **kwargs)

        monkeypatch.setattr(kind, "query", spied)
        monkeypatch.setattr(kind, "aquery", aspied)
        acl = MetadataAcl(tenant_key="tenant", users_key="users")
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        own = MetadataFilters(filters=[MetadataFilter(key="kind", value="faq")])
        for filters in (None, own):
            retriever = JevRetriever(
                index.as_retriever(similarity_top_k=5, filters=filters), selector, acl, top_k=5, prefilter=True
            )
            query = QueryBundle("q", embedding=[1.0, 0.0, 0.0, 0.0])
            ctx = RuntimeContext(user_id="u1", tenant_id="acme")
            made.clear()
            got = await retriever.aretrieve(query, ctx=ctx) if use_async else retriever.retrieve(query, ctx=ctx)
            permitted = [
                node
                for node in nodes
                if node.metadata["tenant"] == "acme"
                and "u1" in node.metadata["users"]
                and (filters is None or node.metadata["kind"] == "faq")
            ]
            distance = {
                n.node_id: sum((a - b) ** 2 for a, b in zip(n.embedding or [], query.embedding or [], strict=True))
                for n in permitted
            }
            assert [hit.node.node_id for hit in got] == sorted(distance, key=distance.__getitem__)[:5]
            if filters is None:
                assert made == searches
                made.clear()  # asked again: it starts where it was answered
                again = await retriever.aretrieve(query, ctx=ctx) if use_async else retriever.retrieve(query, ctx=ctx)
                assert [hit.node.node_id for hit in again] == [hit.node.node_id for hit in got]
                assert made == again_searches


def test_the_history_starts_where_a_restriction_was_answered_retries_the_cheapest_and_is_bounded() -> None:
    history = ProbeHistory()
    assert history.start("a") == 0
    history.record("a", 2)
    starts = [history.start("a") for _ in range(20)]
    assert [i for i, level in enumerate(starts) if level == 0] == [9, 19]  # every 10th query: the cheapest again
    assert set(starts) == {0, 2}
    history.record("a", 0)
    assert [history.start("a") for _ in range(3)] == [0, 0, 0]
    for i in range(ProbeHistory.SIZE + 5):
        history.record(f"k{i}", 1)
    assert history.start("k0") == 0  # the oldest were forgotten
    assert history.start(f"k{ProbeHistory.SIZE}") == 1


# --- ACL keys declared as schema fields: VARCHAR, ARRAY of VARCHAR, BOOL ---------------------------

TYPED_TENANTS = ["acme", "globex", "o'brien\\"]
TYPED_NODES = [
    TextNode(
        id_=f"t{i}",
        text="t",
        embedding=[1.0, i / 40],
        metadata={
            "tenant": TYPED_TENANTS[i % 3],
            "users": [["u1"], ["u2", "u1"], [], ["acme' OR 1=1 --"], ["u2"]][i % 5],
            "roles": [["staff"], ["admin", "staff"], ["sales"], []][i % 4],
            "public": i % 7 == 0,
            "label": ["x", "y"][i % 2],  # in the dynamic field
        },
    )
    for i in range(40)
]
# name -> (condition, whether Lite refuses it: it cannot run not (...)); every other is stated exactly.
TYPED_CONDITIONS: dict[str, tuple[Condition, bool]] = {
    "tenant": (Equals("tenant", "acme"), False),
    "tenant-hostile": (Equals("tenant", "o'brien\\"), False),
    "tenant-int": (Equals("tenant", 1), False),
    "public-true": (Equals("public", True), False),
    "public-false": (Equals("public", False), False),
    "public-one": (Equals("public", 1), False),
    "public-string": (Equals("public", "true"), False),
    "public-flag": (In("public", ("true", 1, True)), False),
    "users-contains": (ListContains("users", "u1"), False),
    "users-hostile": (ListContains("users", "acme' OR 1=1 --"), False),
    "users-equals": (Equals("users", "u1"), False),
    "roles-intersect": (Intersects("roles", ("admin", "sales")), False),
    "public-contains": (ListContains("public", "u1"), False),
    "grants": (
        And(
            (
                Equals("tenant", "acme"),
                Or((ListContains("users", "u1"), Intersects("roles", ("admin",)), Equals("public", True))),
            )
        ),
        False,
    ),
    "tenant-and-dynamic-grant": (
        And((Equals("tenant", "acme"), Or((Equals("label", "x"), Equals("public", True))))),
        False,
    ),
    "not-public": (Not(Equals("public", True)), False),
    "not-tenant": (Not(Equals("tenant", "acme")), False),
    "not-users": (Not(ListContains("users", "u1")), True),
    "not-roles": (Not(Intersects("roles", ("admin", "sales"))), True),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_acl_keys_declared_as_schema_fields_are_read_as_those_fields_exactly(
    engine: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """Each condition: the nodes retrieved are exactly those ``evaluate`` admits, read from the typed fields."""
    from .milvus_support import typed_acl_collection

    uri = uri_for(engine, request)
    name = typed_acl_collection(uri, dim=2)
    for index in closing(milvus_index(uri, TYPED_NODES, dim=2, name=name, overwrite=False)):
        retriever = index.as_retriever(similarity_top_k=len(TYPED_NODES))
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant"), set())
        stated = 0
        for case, (condition, lite_refuses) in TYPED_CONDITIONS.items():
            upstream = copy.copy(retriever)
            applied = pushdown.apply(upstream, Conditional(condition), RuntimeContext(user_id="u"))
            assert applied == (engine == "server" or not lite_refuses), case
            if not applied:
                continue
            expression = upstream._kwargs["string_expr"]  # type: ignore[attr-defined]
            assert not any(f'$meta["{key}"]' in expression for key in ("tenant", "users", "roles", "public")), case
            got = {hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))}
            want = {node.node_id for node in TYPED_NODES if evaluate(condition, node.node_id, node.metadata)}
            assert got == want, case
            stated += bool(want) and want != {node.node_id for node in TYPED_NODES}
        assert stated >= 10  # most cases select some nodes, not none or all


def test_a_negation_over_a_nullable_field_is_refused() -> None:
    """Milvus's != is false on null where evaluate reads a missing key as not equal: refused, not guessed.

    (Neither engine here has nullable fields, Lite 2.5.1 and the 2.3.5 server refuse them: Milvus 2.5+ does.)
    """
    fields = Fields(varchar=frozenset({"tenant"}), bools=frozenset({"public"}), nullable=frozenset({"public"}))
    assert milvus_expression(Equals("public", True), fields=fields) == "public == true"
    assert milvus_expression(Not(Equals("tenant", "acme")), fields=fields) == 'tenant != "acme"'
    with pytest.raises(UntranslatableFilterError, match="nullable"):
        milvus_expression(Not(Equals("public", True)), fields=fields)


def test_the_history_holds_under_threads_and_stays_bounded() -> None:
    """Lite answers aretrieve in worker threads: one history, many threads, more keys than it keeps."""
    import threading

    history = ProbeHistory()
    failures: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(3 * ProbeHistory.SIZE):
                key = f"{offset}-{i % (ProbeHistory.SIZE + 100)}"
                history.start(key)
                history.record(key, 1 + i % 2)
        except BaseException as error:  # any error in a thread is the failure
            failures.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(history._answered) <= ProbeHistory.SIZE


def test_the_probe_window_is_never_more_than_milvus_searches_for(request: pytest.FixtureRequest) -> None:
    assert [probe_window(k) for k in (1, 10, 100, 4096, 5000)] == [40, 40, 400, 16_384, 16_384]
    nodes = [
        TextNode(id_=f"n{i}", text="t", embedding=[1.0, i / 60], metadata={"tenant": "acme", "users": ["u1"]})
        for i in range(60)
    ]
    for index in closing(milvus_index(uri_for("lite", request), nodes, dim=2)):
        selector = CandidateSelector(ScriptedJudge(lambda *a: 0.9), ExecutionOptions(mode=Mode.OFF))
        acl = MetadataAcl(tenant_key="tenant", users_key="users")
        retriever = JevRetriever.from_index(index, selector, acl, top_k=5000)
        got = retriever.retrieve(
            QueryBundle("q", embedding=[1.0, 0.0]), ctx=RuntimeContext(user_id="u1", tenant_id="acme")
        )
        assert len(got) == 60


def test_a_condition_on_a_document_id_is_left_to_the_exact_expression(request: pytest.FixtureRequest) -> None:
    """LlamaIndex writes ref_doc_id as a field of the row, not in the metadata the probe's rule reads."""
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo

    nodes = []
    for i in range(60):
        users = ["u1"] if 10 <= i < 30 else ["u2"]  # enough for a probe to answer, were it asked
        node = TextNode(id_=f"n{i}", text="t", embedding=[1.0, i / 60], metadata={"tenant": "acme", "users": users})
        node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id="d1" if i == 3 else f"d{i + 100}")
        nodes.append(node)
    condition = And(
        (Equals("tenant", "acme"), Or((IdIn(frozenset({"d1"}), key="ref_doc_id"), ListContains("users", "u1"))))
    )
    for index in closing(milvus_index(uri_for("lite", request), nodes, dim=2)):
        retriever = index.as_retriever(similarity_top_k=5)
        pushdown = MilvusPushdown(retriever, MetadataAcl(tenant_key="tenant"), set())
        upstream = copy.copy(retriever)
        assert pushdown.apply(upstream, Conditional(condition), RuntimeContext(user_id="u1"))
        got = [hit.node.node_id for hit in upstream.retrieve(QueryBundle("q", embedding=[1.0, 0.0]))]
        assert got == ["n3", "n10", "n11", "n12", "n13"]


def test_milvus_scalar_filters_refuse_the_pushdown_since_the_store_would_drop_it(
    request: pytest.FixtureRequest,
) -> None:
    nodes = [TextNode(id_="n0", text="t", embedding=[1.0, 0.0], metadata={"tenant": "acme"})]
    for index in closing(milvus_index(uri_for("lite", request), nodes, dim=2)):
        retriever = index.as_retriever(vector_store_kwargs={"milvus_scalar_filters": 'tenant == "acme"'})
        assert not MilvusPushdown.recognises(retriever)
        assert "string_expr" in str(MilvusPushdown.advice(retriever))


def test_the_docs_typed_collection_runs_as_written_and_reads_its_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/stores-and-pushdown.md's block, pasted into a fresh folder, on Milvus Lite."""
    from llama_index.core import StorageContext, VectorStoreIndex

    from .milvus_support import require_milvus
    from .support import HashEmbedding
    from .test_readme import ROOT, blocks

    require_milvus("lite")
    [block] = [
        block
        for block in blocks(ROOT / "docs" / "stores-and-pushdown.md")
        if 'schema.add_field("public", DataType.BOOL)' in block.code
    ]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_page"}
    exec(compile(block.code, block.name, "exec"), namespace)
    store = namespace["store"]
    try:
        nodes = [
            TextNode(id_=f"n{i}", text=f"passage {i}", metadata={
                "tenant": ["acme", "globex"][i % 2], "users": [f"u{i % 3}"], "roles": ["staff"], "public": i == 4})
            for i in range(12)
        ]  # fmt: skip
        index = VectorStoreIndex(
            nodes,
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=HashEmbedding(dimensions=384),
        )
        acl = MetadataAcl(tenant_key="tenant", users_key="users", public_key="public")
        retriever = index.as_retriever(similarity_top_k=12)
        upstream = copy.copy(retriever)
        ctx = RuntimeContext(user_id="u1", tenant_id="acme")
        assert MilvusPushdown(retriever, acl, set()).apply(upstream, acl.restriction(ctx), ctx)
        assert 'array_contains(users, "u1")' in upstream._kwargs["string_expr"]  # type: ignore[attr-defined]
        got = {hit.node.node_id for hit in upstream.retrieve(QueryBundle("passage"))}
        assert got == {node.node_id for node in nodes if acl.allows(ctx, node.metadata)} == {"n4", "n10"}
    finally:
        store.client.close()
