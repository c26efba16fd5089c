"""Every registered store adapter admits exactly what the in-process ACL allows, on the same hostile data.

One equivalence test over all of them: 160 nodes with hostile ACL metadata (operators and quotes
as values, look-alike public flags, tenants that are not strings, users and roles as strings and
lists of strings), 60 hostile callers, every ACL configuration. Each adapter restricts a query's
copy of a real retriever over its real store, as ``JevRetriever`` does; k is the whole store, so
the answer is the set of nodes the restriction admits, and it must equal ``MetadataAcl.allows``
node by node. A new adapter in ``llama_jev.stores`` fails this test until it has a store here.
Also: ``register()``, the public way for a store outside the package.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import BaseNode, QueryBundle, TextNode
from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from llama_jev import MetadataAcl, RuntimeContext
from llama_jev.acl import (
    And,
    CallableAcl,
    Condition,
    Conditional,
    Equals,
    Everything,
    IdIn,
    Ids,
    In,
    Intersects,
    ListContains,
    Not,
    Nothing,
    Or,
    Restriction,
    Unknown,
    evaluate,
)
from llama_jev.stores import Pushdown, adapter_for, adapters, aretrieve, pushdown_for, register
from llama_jev.stores.base import CannotState, checked_condition
from llama_jev.testing.postgres import PostgresServer

from .store_data import ACLS, acl_metadata, callers, condition_metadata, embedding
from .support import HashEmbedding

NODES = 160
CALLERS = callers(60, seed=5)
QUERY = "refund policy"


def hostile_nodes() -> list[TextNode]:
    """Data inside every adapter's exact domain (see tests/store_data.py), the same for every store.

    Beside the ACL's keys, the fields the condition tests read (``doc``, ``level``, ``label``),
    drawn from their own generator so the ACL's data stays the same.
    """
    rng, more = random.Random(23), random.Random(29)
    return [
        TextNode(
            id_=f"00000000-0000-4000-8000-{i:012d}",  # a UUID: Qdrant takes no other string ids
            text=f"refund policy {i}",
            embedding=embedding(rng),
            metadata={**acl_metadata(rng, list_flags=False), **condition_metadata(more, i)},
        )
        for i in range(NODES)
    ]


NODE_SET = hostile_nodes()

Builder = Callable[[pytest.FixtureRequest], Iterator[BaseRetriever]]


def _memory(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    yield VectorStoreIndex(NODE_SET, embed_model=HashEmbedding(dimensions=8)).as_retriever(similarity_top_k=NODES)


def _index_over(store: Any) -> VectorStoreIndex:
    return VectorStoreIndex(
        NODE_SET,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=HashEmbedding(dimensions=8),
    )


def _qdrant(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    try:
        yield _index_over(QdrantVectorStore(client=client, collection_name="equivalence")).as_retriever(
            similarity_top_k=NODES
        )
    finally:
        client.close()


def _postgres(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    pytest.importorskip("llama_index.vector_stores.postgres")
    from llama_jev.stores.postgres import AclPGVectorStore

    from .postgres_support import store_kwargs

    server: PostgresServer = request.getfixturevalue("postgres_server")
    store = AclPGVectorStore(**store_kwargs(server, f"equivalence_{random.randrange(10**9)}", embed_dim=8))
    try:
        yield _index_over(store).as_retriever(similarity_top_k=NODES)
    finally:
        assert store._engine is not None
        store._engine.dispose()


def _chroma(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    pytest.importorskip("llama_index.vector_stores.chroma")
    import chromadb
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.EphemeralClient().create_collection(
        f"equivalence-{random.randrange(10**9)}", embedding_function=None
    )
    # Written natively: LlamaIndex's Chroma store refuses the list values.
    collection.add(
        ids=[node.node_id for node in NODE_SET],
        embeddings=[node.get_embedding() for node in NODE_SET],
        documents=[node.text for node in NODE_SET],
        metadatas=[node.metadata for node in NODE_SET],
    )
    store = ChromaVectorStore(chroma_collection=collection)
    yield VectorStoreIndex.from_vector_store(store, embed_model=HashEmbedding(dimensions=8)).as_retriever(
        similarity_top_k=NODES
    )


def _milvus(request: pytest.FixtureRequest) -> Iterator[BaseRetriever]:
    # The standalone server (Milvus Lite, which refuses some negations, runs in tests/test_store_milvus.py).
    from .milvus_support import closing, milvus_index, uri_for

    for index in closing(milvus_index(uri_for("server", request), NODE_SET, dim=8)):
        yield index.as_retriever(similarity_top_k=NODES)


# Every adapter of the package, by name: a store to run it over.
BUILDERS: dict[str, Builder] = {
    "memory": _memory,
    "qdrant": _qdrant,
    "postgres": _postgres,
    "chroma": _chroma,
    "milvus": _milvus,
}
SERVERS = ("postgres", "milvus")  # adapters whose store here is a server the session starts
BUILT_IN = [adapter for adapter in adapters() if adapter.__module__.startswith("llama_jev.stores.")]


def test_every_registered_adapter_of_the_package_has_a_store_here() -> None:
    assert {adapter.name for adapter in BUILT_IN} == set(BUILDERS)


@pytest.fixture(
    params=[
        pytest.param(adapter, id=adapter.name, marks=[pytest.mark.slow] if adapter.name in SERVERS else [])
        for adapter in BUILT_IN
    ]
)
def restricted(request: pytest.FixtureRequest) -> Iterator[tuple[type[Pushdown], BaseRetriever]]:
    adapter: type[Pushdown] = request.param
    yield from ((adapter, retriever) for retriever in BUILDERS[adapter.name](request))


def test_every_adapter_admits_exactly_what_the_in_process_acl_allows(
    restricted: tuple[type[Pushdown], BaseRetriever],
) -> None:
    adapter, retriever = restricted
    assert adapter_for(retriever) is adapter
    leaks = misses = 0
    for acl in ACLS:
        pushdown = adapter(retriever, acl, set())
        for ctx in CALLERS:
            upstream = copy.copy(retriever)
            pushdown.restrict(upstream, ctx)
            got = {node.node.node_id for node in upstream.retrieve(QueryBundle(QUERY))}
            want = {node.node_id for node in NODE_SET if acl.allows(ctx, node.metadata)}
            leaks += len(got - want)
            misses += len(want - got)
    assert (leaks, misses) == (0, 0)
    readable = sum(1 for ctx in CALLERS for node in NODE_SET if ACLS[0].allows(ctx, node.metadata))
    assert readable > 20  # the data grants something under the full ACL


# --- every operator of the condition language, every restriction kind -------------------------------

ID_SAMPLE = frozenset(node.node_id for node in NODE_SET[::3]) | {"not-a-uuid", "acme' OR 1=1 --"}
DOC_SAMPLE = frozenset({"doc-1", "doc-5", "doc-17", "acme' OR 1=1 --", "%"})
MATCH_ALL = And(())

# name -> (condition, the stores that state it only as a superset, the stores that refuse it).
# Every other store claims it exactly. Each claim is in docs/stores-and-pushdown.md's table.
CONDITIONS: dict[str, tuple[Condition, frozenset[str], frozenset[str]]] = {
    "equals-str": (Equals("tenant", "acme"), frozenset(), frozenset()),
    "equals-sql-injection": (Equals("label", "acme' OR 1=1 --"), frozenset({"qdrant"}), frozenset()),
    "equals-operator": (Equals("label", "$ne"), frozenset({"qdrant"}), frozenset()),
    "equals-percent": (Equals("label", "%"), frozenset({"qdrant"}), frozenset()),
    "equals-underscore": (Equals("label", "_"), frozenset({"qdrant"}), frozenset()),
    "equals-quotes": (Equals("label", '"quoted"'), frozenset({"qdrant"}), frozenset()),
    "equals-unicode": (Equals("label", "Zürich ✓ 東京"), frozenset({"qdrant"}), frozenset()),
    "equals-int": (Equals("level", 1), frozenset(), frozenset()),
    "equals-bool": (Equals("level", True), frozenset(), frozenset()),
    "equals-false": (Equals("level", False), frozenset(), frozenset()),
    "equals-float": (Equals("level", 1.5), frozenset({"chroma"}), frozenset()),
    "equals-string-one": (Equals("level", "1"), frozenset(), frozenset()),
    "equals-dotted-key": (Equals("org.unit", "x"), frozenset(), frozenset()),
    "equals-quoted-key": (Equals('say "hi"', "x"), frozenset(), frozenset({"qdrant"})),
    "in-mixed-types": (In("level", (1, "1", False, "acme' OR 1=1 --")), frozenset(), frozenset()),
    "in-empty": (In("level", ()), frozenset(), frozenset()),
    "list-contains": (ListContains("users", "u1"), frozenset(), frozenset()),
    "list-contains-hostile": (ListContains("label", "%"), frozenset(), frozenset()),
    "intersects": (Intersects("roles", ("admin", "$ne", "o'brien")), frozenset(), frozenset()),
    "intersects-labels": (Intersects("label", ("_", "a_b", "Zürich ✓ 東京")), frozenset(), frozenset()),
    "intersects-empty": (Intersects("roles", ()), frozenset(), frozenset()),
    "id-in-node-ids": (IdIn(ID_SAMPLE), frozenset(), frozenset()),
    "id-in-node-ids-empty": (IdIn(frozenset()), frozenset(), frozenset()),
    "id-in-document": (IdIn(DOC_SAMPLE, key="doc"), frozenset(), frozenset()),
    "and-empty": (MATCH_ALL, frozenset(), frozenset()),
    "or-empty": (Or(()), frozenset(), frozenset()),
    "acl-shaped": (
        And(
            (
                Equals("tenant", "acme"),
                Or((ListContains("users", "u1"), Intersects("roles", ("admin",)), In("public", ("true", 1, True)))),
            )
        ),
        frozenset(),
        frozenset(),
    ),
    "ids-and-condition": (And((IdIn(ID_SAMPLE), Equals("topic", "refund"))), frozenset(), frozenset()),
    "ids-inside-or": (Or((IdIn(ID_SAMPLE), Equals("topic", "$ne"))), frozenset(), frozenset({"qdrant", "chroma"})),
    "not-equals": (Not(Equals("label", "%")), frozenset(), frozenset({"qdrant"})),
    "not-equals-int": (Not(Equals("level", 1)), frozenset(), frozenset({"qdrant"})),
    "not-equals-float": (Not(Equals("level", 1.5)), frozenset(), frozenset({"qdrant", "chroma"})),
    "not-list-contains": (
        Or((Not(ListContains("users", "u1")), Equals("level", 2))),
        frozenset(),
        frozenset({"qdrant"}),
    ),
    "not-intersects": (Not(Intersects("label", ("%", "plain"))), frozenset(), frozenset({"qdrant"})),
    "not-document": (Not(IdIn(DOC_SAMPLE, key="doc")), frozenset(), frozenset({"qdrant"})),
    "not-nested": (
        Not(And((Equals("tenant", "acme"), Not(In("level", (1, True)))))),
        frozenset(),
        frozenset({"qdrant"}),
    ),
    "not-empty-or": (Not(Or(())), frozenset(), frozenset({"qdrant"})),
}

RESTRICTIONS: dict[str, tuple[Restriction, frozenset[str], frozenset[str]]] = {
    "everything": (Everything(), frozenset(), frozenset()),
    "nothing": (Nothing(), frozenset(), frozenset()),
    "ids": (Ids(ID_SAMPLE), frozenset(), frozenset()),
    "ids-by-document": (Ids(DOC_SAMPLE, key="doc", token="zed-1"), frozenset(), frozenset()),
    **{name: (Conditional(condition), loose, refused) for name, (condition, loose, refused) in CONDITIONS.items()},
}
CALLER = RuntimeContext(user_id="u1", tenant_id="acme", roles=frozenset({"admin"}))


def _admits(restriction: Restriction, node: TextNode) -> bool:
    if isinstance(restriction, Everything):
        return True
    if isinstance(restriction, Nothing):
        return False
    condition = restriction.condition
    return evaluate(condition, node.node_id, node.metadata)


class _Engine:
    """A ``BatchAcl`` that is not a ``MetadataAcl``: its restriction is whatever the test sets."""

    engine = "test-engine"

    def __init__(self) -> None:
        self.answer: Restriction = Everything()

    def allowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        return {node.node_id for node in nodes if _admits(self.answer, node)}  # type: ignore[arg-type]

    async def aallowed(self, ctx: RuntimeContext, nodes: Sequence[BaseNode]) -> set[str]:
        return self.allowed(ctx, nodes)

    def restriction(self, ctx: RuntimeContext) -> Restriction:
        return self.answer

    async def arestriction(self, ctx: RuntimeContext) -> Restriction:
        return self.answer


def test_the_condition_cases_are_not_vacuous() -> None:
    # Each case selects some nodes and leaves others out (bar the ones about nothing / everything),
    # so a store that admits everything, or nothing, fails somewhere.
    for name, (restriction, _, _) in RESTRICTIONS.items():
        admitted = sum(_admits(restriction, node) for node in NODE_SET)
        if name in ("everything", "and-empty", "not-empty-or"):
            assert admitted == NODES, name
        elif name in ("nothing", "in-empty", "intersects-empty", "id-in-node-ids-empty", "or-empty"):
            assert admitted == 0, name
        else:
            assert 0 < admitted < NODES, name


def test_every_adapter_states_every_operator_exactly_or_as_a_superset_or_refuses_it_loudly(
    restricted: tuple[type[Pushdown], BaseRetriever], caplog: pytest.LogCaptureFixture
) -> None:
    adapter, retriever = restricted
    assert type(pushdown_for(retriever, _Engine(), set())) is adapter
    assert _outcomes(adapter, retriever, caplog) == _claims(adapter.name)


@pytest.mark.slow
def test_postgres_over_a_jsonb_column_states_every_operator_exactly(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("llama_index.vector_stores.postgres")
    from llama_jev.stores.postgres import AclPGVectorStore, PostgresPushdown

    from .postgres_support import store_kwargs

    table = f"equivalence_jsonb_{random.randrange(10**9)}"
    store = AclPGVectorStore(**store_kwargs(postgres_server, table, embed_dim=8, use_jsonb=True))
    try:
        retriever = _index_over(store).as_retriever(similarity_top_k=NODES)
        assert _outcomes(PostgresPushdown, retriever, caplog) == _claims("postgres")
    finally:
        assert store._engine is not None
        store._engine.dispose()


def _claims(store: str) -> dict[str, str]:
    return {
        name: "refused" if store in refused else "superset" if store in loose else "exact"
        for name, (_, loose, refused) in RESTRICTIONS.items()
    }


def _outcomes(adapter: type[Pushdown], retriever: BaseRetriever, caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """Each restriction applied to a copy of ``retriever``: ``exact``, ``superset`` or ``refused`` (never a subset)."""
    outcome: dict[str, str] = {}
    for name, (restriction, _, _) in RESTRICTIONS.items():
        engine = _Engine()
        engine.answer = restriction
        upstream = copy.copy(retriever)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="llama_jev"):
            applied = adapter(retriever, engine, set()).apply(upstream, restriction, CALLER)
        want = {node.node_id for node in NODE_SET if _admits(restriction, node)}
        got = {node.node.node_id for node in upstream.retrieve(QueryBundle(QUERY))}
        # Refused, the retriever runs as the caller built it (every node here); applied, never a subset.
        assert got >= want, f"{adapter.name} dropped {len(want - got)} node(s) {name} admits"
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        if applied:
            assert warnings == [], name
            outcome[name] = "exact" if got == want else "superset"
        else:
            assert len(warnings) == 1, name
            assert f"no pushdown into {adapter.name}" in warnings[0]
            outcome[name] = "refused"
    return outcome


def test_a_refused_operator_is_one_warning_per_retriever_naming_it_never_a_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    retriever = next(_qdrant_retriever())
    seen: set[tuple[str, ...]] = set()
    pushdown = pushdown_for(retriever, _Engine(), seen)
    hostile = Conditional(Not(Equals("label", "acme' OR 1=1 --")))
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        assert pushdown.apply(copy.copy(retriever), hostile, CALLER) is False
        assert pushdown.apply(copy.copy(retriever), hostile, CALLER) is False
    [record] = caplog.records
    message = record.getMessage()
    assert "'not'" in message
    assert "qdrant" in message
    assert "acme" not in message  # the value
    assert "label" not in message  # nor even the key: the operator says what the store cannot state
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        assert pushdown.apply(copy.copy(retriever), Conditional(Equals("level", [1])), CALLER) is False  # type: ignore[arg-type]
    assert "a value of type list" in caplog.records[-1].getMessage()
    assert pushdown.apply(copy.copy(retriever), Unknown(), CALLER) is False
    assert len(caplog.records) == 2  # Unknown is no warning: nothing was asked of the store


def _qdrant_retriever() -> Iterator[BaseRetriever]:
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient

    yield _index_over(
        QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="refusal")
    ).as_retriever(similarity_top_k=NODES)


@pytest.mark.parametrize("name", ["acl-shaped", "not-equals", "id-in-document", "ids-and-condition"])
def test_a_restriction_is_anded_with_the_callers_own_filters(
    restricted: tuple[type[Pushdown], BaseRetriever], name: str
) -> None:
    adapter, retriever = restricted
    own = copy.copy(retriever)
    own._filters = MetadataFilters(filters=[MetadataFilter(key="topic", operator=FilterOperator.EQ, value="refund")])  # type: ignore[attr-defined]
    restriction, _, refused = RESTRICTIONS[name]
    upstream = copy.copy(own)
    applied = adapter(own, _Engine(), set()).apply(upstream, restriction, CALLER)
    assert applied is (adapter.name not in refused)
    got = {node.node.node_id for node in upstream.retrieve(QueryBundle(QUERY))}
    want = {node.node_id for node in NODE_SET if _admits(restriction, node) and node.metadata.get("topic") == "refund"}
    assert got >= want
    assert all(NODE_BY_ID[node_id].metadata.get("topic") == "refund" for node_id in got)
    if applied:
        assert got == want  # every case here is stated exactly where it is stated


NODE_BY_ID = {node.node_id: node for node in NODE_SET}


async def test_an_applied_restriction_holds_on_the_async_path(restricted: tuple[type[Pushdown], BaseRetriever]) -> None:
    adapter, retriever = restricted
    restriction = RESTRICTIONS["ids-and-condition"][0]
    upstream = copy.copy(retriever)
    assert adapter(retriever, _Engine(), set()).apply(upstream, restriction, CALLER)
    got = {node.node.node_id for node in await aretrieve(upstream, QueryBundle(QUERY), threading.Event())}
    assert got == {node.node_id for node in NODE_SET if _admits(restriction, node)}


@pytest.mark.parametrize(
    ("condition", "why"),
    [
        (Equals("level", float("nan")), "a non-finite float value"),
        (In("level", (1, None)), "a value of type NoneType"),  # type: ignore[arg-type]
        (ListContains("users", 3), "a value of type int where a string is compared"),  # type: ignore[arg-type]
        (Intersects(7, ("a",)), "a metadata key of type int"),  # type: ignore[arg-type]
        (Equals("", "x"), "a metadata key of type str"),
        (IdIn(frozenset({1})), "a value of type int"),  # type: ignore[arg-type]
    ],
)
def test_a_value_no_store_compares_is_refused_before_any_store_is_asked(condition: Condition, why: str) -> None:
    for adapter_name in ("qdrant", "chroma"):
        retriever = next(BUILDERS[adapter_name](None))  # type: ignore[arg-type]  # no fixture needed
        upstream = copy.copy(retriever)
        assert (
            adapter_for(retriever)(retriever, _Engine(), set()).apply(upstream, Conditional(condition), CALLER) is False
        )  # type: ignore[misc]
    with pytest.raises(CannotState, match=why):
        checked_condition(condition)


def test_something_that_is_not_a_restriction_is_a_type_error_not_a_guess() -> None:
    for retriever in (next(_memory(None)), next(_qdrant_retriever())):  # type: ignore[arg-type]
        pushdown = pushdown_for(retriever, _Engine(), set())
        with pytest.raises(TypeError, match="a restriction must be"):
            pushdown.apply(copy.copy(retriever), Equals("tenant", "acme"), CALLER)  # type: ignore[arg-type]


# --- 0.2's adapters, and what pushdown_for accepts ------------------------------------------------


def test_an_adapter_written_for_0_2_keeps_working_for_a_metadata_acl_and_declines_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Legacy(Pushdown):
        name = f"legacy-{random.randrange(10**9)}"

        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return False

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            upstream.restricted_for = ctx.tenant_id  # type: ignore[attr-defined]

    assert register(Legacy) is Legacy
    acl = MetadataAcl(tenant_key="tenant")
    legacy = Legacy(_Anywhere(), acl, set())
    upstream = copy.copy(legacy.retriever)
    assert legacy.apply(upstream, acl.restriction(CALLER), CALLER) is True
    assert upstream.restricted_for == "acme"  # type: ignore[attr-defined]
    assert legacy.apply(copy.copy(legacy.retriever), Everything(), CALLER) is True
    with caplog.at_level(logging.WARNING, logger="llama_jev"):
        assert legacy.apply(copy.copy(legacy.retriever), Ids(frozenset({"a"})), CALLER) is False
    assert "implement apply()" in caplog.records[-1].getMessage()


def test_an_adapter_implementing_apply_serves_0_2s_restrict() -> None:
    retriever = next(_qdrant_retriever())
    acl = MetadataAcl(tenant_key="tenant")
    upstream = copy.copy(retriever)
    adapter_for(retriever)(retriever, acl, set()).restrict(upstream, CALLER)  # type: ignore[misc]
    got = {node.node.node_id for node in upstream.retrieve(QueryBundle(QUERY))}
    assert got == {node.node_id for node in NODE_SET if acl.allows(CALLER, node.metadata)}


def test_pushdown_for_takes_any_batch_acl_but_not_a_plain_callable() -> None:
    retriever = next(_qdrant_retriever())
    assert pushdown_for(retriever, _Engine(), set()).acl.engine == "test-engine"
    assert isinstance(pushdown_for(retriever, MetadataAcl(tenant_key="tenant"), set()).acl, MetadataAcl)
    with pytest.raises(TypeError, match="prefilter needs a MetadataAcl"):
        pushdown_for(retriever, lambda ctx, node: True, set())
    with pytest.raises(TypeError, match="prefilter needs a MetadataAcl"):
        pushdown_for(retriever, CallableAcl(lambda ctx, node: True), set())


# --- register(): a store outside the package --------------------------------------------------


class _Anywhere(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[Any]:
        return []


def test_register_refuses_what_is_not_a_complete_adapter() -> None:
    class NoName(Pushdown):
        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return False

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            pass

    class Incomplete(Pushdown):
        name = "incomplete"

    with pytest.raises(TypeError, match="Pushdown subclass"):
        register(object)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not implement recognises, restrict"):
        register(Incomplete)
    with pytest.raises(TypeError, match="name"):
        register(NoName)
    assert NoName not in adapters()


def test_register_refuses_a_name_taken_and_is_idempotent() -> None:
    class Twin(Pushdown):
        name = "chroma"

        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return False

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            pass

    with pytest.raises(ValueError, match="'chroma' is already registered"):
        register(Twin)
    first = adapters()[0]
    assert register(first) is first
    assert adapters().count(first) == 1


def test_a_registered_adapter_is_asked_after_the_built_in_ones_and_pushes_down() -> None:
    class Anywhere(Pushdown):
        name = f"anywhere-{random.randrange(10**9)}"

        @classmethod
        def recognises(cls, retriever: BaseRetriever) -> bool:
            return isinstance(retriever, _Anywhere)

        def restrict(self, upstream: BaseRetriever, ctx: RuntimeContext) -> None:
            upstream.restricted_for = ctx.tenant_id  # type: ignore[attr-defined]

    retriever = _Anywhere()
    assert adapter_for(retriever) is None
    assert register(Anywhere) is Anywhere
    assert adapters()[-1] is Anywhere
    assert adapter_for(retriever) is Anywhere
    acl = MetadataAcl(tenant_key="tenant")
    upstream = copy.copy(retriever)
    Anywhere(retriever, acl, set()).restrict(upstream, RuntimeContext(user_id="u1", tenant_id="acme"))
    assert upstream.restricted_for == "acme"  # type: ignore[attr-defined]
