"""Pushdown into Milvus (LlamaIndex's ``MilvusVectorStore``): the ACL AND the caller's filters as one expression.

LlamaIndex's own filter translation drops a ``NOT`` (``NOT [tenant == acme]`` became
``tenant == 'acme'``) and pastes values unescaped, and none of these engines take bound filter
parameters. So this adapter writes the whole boolean expression itself, per query, on a private
copy of the retriever, and passes it as the store's ``string_expr`` (``vector_store_kwargs``):
the ACL's restriction (:func:`milvus_expression`) AND the caller's own ``filters``, ``node_ids``
and ``doc_ids`` (:func:`filters_expression`), each value a JSON string literal (quotes,
backslashes and control characters escaped; tested with ``acme' OR 1=1 --``, ``"``, ``\\``).

Metadata LlamaIndex writes sits in the dynamic field, read as ``$meta["key"]`` (any key, dots
and quotes included); a key declared as a schema field is read as that field, by its type
(:class:`Fields`): ``VARCHAR`` (a partition key on the tenant, say), ``ARRAY`` of ``VARCHAR``
(``array_contains``, ``array_contains_any``), ``BOOL``; any other type is refused. Comparisons are
type-exact as :func:`~llama_jev.acl.evaluate` is (``1`` matches ``1.0``, never ``true`` or
``"1"``), and a missing key compares false.

Operator by operator, measured on Milvus Lite 2.5.1 and the ``milvus`` 2.3.5 standalone server
(tests/test_store_milvus.py and the equivalence test in tests/test_store_adapters.py):

================  ==========================================  ===================  ==========
operator          expression                                  server 2.3.5 / 2.4+  Lite 2.5
================  ==========================================  ===================  ==========
equals            ``$meta[k] == v``                           exact                exact
in                ``==`` OR-ed (one type per ``in`` list)     exact                exact
list-contains     ``== v or json_contains($meta[k], v)``      exact                exact
intersects        ``in [..] or json_contains_any(.., [..])``  exact                exact
id-in (node ids)  ``id in [..]``                              exact                exact
id-in (a key)     ``$meta[k] in [..]``                        exact                exact
and / or          ``(..) and (..)`` / ``(..) or (..)``        exact                exact
not               pushed inward: ``!=``; ``not (..)`` else    exact                refused*
================  ==========================================  ===================  ==========

\\* Lite 2.5 answers ``not (...)`` with "unsupported expr proto node": a negated ``equals`` or
``in`` is stated as ``!=`` (which admits a missing key, as ``evaluate`` does), any other negated
operator refuses pushdown there (one warning; the final check decides).

A filtered HNSW search may return fewer than its limit while more rows match (the engine's
"fewer than topk" class), so over an approximate index the store is first asked the filter's
``count(*)``: at most 2,048 matching rows are read and ranked exactly
(:mod:`llama_jev.stores.milvus_answer`; the 2.3.5 server's filtered HNSW returned 0 of 5 for a
caller reading 5 of 10,000 rows, at every window); more, a short answer is complete only when it
holds every match (:func:`~llama_jev.stores.completeness.report_complete`), else widening asks
again. A FLAT index (Milvus Lite's) is exact: its answer is complete as it is, and cheaper
filters are searched first there, their rows checked by the ACL's rule
(:mod:`llama_jev.stores.milvus_probe`: each comparison on the dynamic field costs Lite a pass
over every row's JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from llama_index.core.base.base_retriever import BaseRetriever

from llama_jev.acl.batch import BatchAcl
from llama_jev.acl.conditions import (
    And,
    Condition,
    Equals,
    Everything,
    IdIn,
    In,
    Not,
    Or,
    Restriction,
    Unknown,
    evaluate,
)
from llama_jev.core.errors import UntranslatableFilterError
from llama_jev.core.identity import RuntimeContext
from llama_jev.stores.base import (
    CannotState,
    Pushdown,
    Seen,
    condition_of,
    vector_store_of,
)
from llama_jev.stores.grants import RESERVED_KEYS
from llama_jev.stores.milvus_answer import CountedStore
from llama_jev.stores.milvus_expression import Dialect, Fields, filters_expression, group, milvus_expression
from llama_jev.stores.milvus_probe import ProbeHistory, Probes

__all__ = ["Fields", "MilvusPushdown", "filters_expression", "is_milvus", "milvus_expression"]
# An expression no row satisfies, on both engines (Lite fails on `id in []` and on `!=` over the primary key).
_NOTHING = '($meta["llama_jev_match_nothing"] == 1 and $meta["llama_jev_match_nothing"] != 1)'


def _store_of(retriever: BaseRetriever) -> Any:
    store = vector_store_of(retriever)
    return store._store if isinstance(store, CountedStore) else store  # a query's copy reads it through CountedStore


def is_milvus(retriever: BaseRetriever) -> bool:
    """Whether ``retriever`` reads LlamaIndex's ``MilvusVectorStore`` (or a subclass)."""
    store = _store_of(retriever)
    return store is not None and any(
        cls.__name__ == "MilvusVectorStore" and cls.__module__.startswith("llama_index.vector_stores.milvus")
        for cls in type(store).__mro__
    )


def _flat(store: Any) -> bool:
    """Whether the store's dense field has a FLAT index (exact search); ``False`` when it cannot be told."""
    try:
        described = store.client.describe_index(store.collection_name, index_name=store.embedding_field)
    except Exception:
        return False
    return str((described or {}).get("index_type", "")).upper() == "FLAT"


def _schema(store: Any) -> tuple[bool, Fields]:
    """Whether ``store`` is Milvus Lite, and its schema fields by type (the primary key excluded)."""
    client = store.client
    uri = str(getattr(getattr(client, "_config", None), "uri", ""))
    # pymilvus starts Milvus Lite for a local path ending in .db and talks to it over a unix socket.
    lite = uri.endswith(".db") or (uri.startswith("unix:") and ".db" in uri)
    described = client.describe_collection(store.collection_name)
    fields = [field for field in described.get("fields", []) if not field.get("is_primary")]

    def named(kind: str, element: str | None = None) -> frozenset[str]:
        # pymilvus gives a DataType enum (str() of it is "21"): compared by name.
        return frozenset(
            field["name"]
            for field in fields
            if getattr(field.get("type"), "name", None) == kind
            and (element is None or getattr(field.get("element_type"), "name", None) == element)
        )

    varchar, bools, arrays = named("VARCHAR"), named("BOOL"), named("ARRAY", "VARCHAR")
    nullable = frozenset(field["name"] for field in fields if field.get("nullable"))
    other = frozenset(field["name"] for field in fields) - varchar - bools - arrays
    return lite, Fields(varchar=varchar, bools=bools, arrays=arrays, nullable=nullable, other=other)


class MilvusPushdown(Pushdown):
    """The ACL AND the caller's own filters as one escaped expression, for a retriever over ``MilvusVectorStore``."""

    name: ClassVar[str] = "milvus"
    short_is_complete: ClassVar[bool] = False  # a filtered HNSW search may stop short (see the module docstring)

    def __init__(self, retriever: BaseRetriever, acl: BatchAcl, seen: Seen) -> None:
        super().__init__(retriever, acl, seen)
        store = vector_store_of(retriever)
        self._lite, self._fields = _schema(store)
        self._exact_index = _flat(store)
        self._history = ProbeHistory()
        self._own = _own_expression(retriever, self._fields)  # fails now, not on the first query

    @classmethod
    def recognises(cls, retriever: BaseRetriever) -> bool:
        return is_milvus(retriever) and hasattr(retriever, "_filters") and cls._untranslatable(retriever) is None

    @classmethod
    def advice(cls, retriever: BaseRetriever) -> str | None:
        if not is_milvus(retriever):
            return None
        problem = cls._untranslatable(retriever)
        if problem is None:
            return None
        return (
            f"no pushdown into Milvus: {problem} of the wrapped retriever cannot be stated exactly as a Milvus "
            "expression, so the ACL is applied after retrieval only (denied nodes take top-k slots). Use ==, !=, <, "
            "<=, >, >=, in or nin filters over scalars to have the ACL pushed down with them."
        )

    @classmethod
    def _untranslatable(cls, retriever: BaseRetriever) -> str | None:
        try:
            _own_expression(retriever, Fields())
        except UntranslatableFilterError as error:
            return str(error)
        return None

    @classmethod
    def in_thread(cls, retriever: BaseRetriever) -> tuple[bool, str | None]:
        """For a store built with ``use_async_client=False`` (Milvus Lite, say): its ``aquery`` has no client."""
        if is_milvus(retriever) and getattr(_store_of(retriever), "aclient", True) is None:
            return True, None
        return False, None

    def apply(self, upstream: BaseRetriever, restriction: Restriction, ctx: RuntimeContext) -> bool:
        """``restriction`` AND the caller's own filters as the query's ``string_expr``."""
        if isinstance(restriction, Unknown):
            return False
        dialect = Dialect(lite=self._lite, fields=self._fields)
        try:
            condition = None if isinstance(restriction, Everything) else condition_of(restriction)
            stated: str | bool = (
                True
                if condition is None and isinstance(restriction, Everything)
                else False
                if condition is None
                else dialect.stated(condition)
            )
        except CannotState as refused:
            return self.refuse(refused.operator, refused.why)
        own = [self._own] if self._own else []
        expression = group([stated, *own], True)
        # True: no filter (an empty expression); False: one no row satisfies (Lite fails on an empty in-list).
        text = "" if expression is True else _NOTHING if expression is False else str(expression)
        exact = self._exact_index and isinstance(expression, str)
        probes = _probes(dialect, condition, own, self._history, text) if exact else None
        kwargs = dict(getattr(self.retriever, "_kwargs", None) or {})
        kwargs["string_expr"] = text
        # Everything is in string_expr now: the store ignores it beside filters, node ids or doc ids.
        upstream._filters = None  # type: ignore[attr-defined]
        upstream._node_ids = None  # type: ignore[attr-defined]
        upstream._doc_ids = None  # type: ignore[attr-defined]
        upstream._kwargs = kwargs  # type: ignore[attr-defined]
        upstream._vector_store = CountedStore(  # type: ignore[attr-defined]
            _store_of(self.retriever), text, exact_index=self._exact_index, probes=probes
        )
        return True


def _probes(
    dialect: Dialect, condition: Condition | None, own: list[str], history: ProbeHistory, key: str
) -> Probes | None:
    """Cheaper filters to search first over an exact index (:mod:`~llama_jev.stores.milvus_probe`); ``None``: none.

    When the condition has a costly term: no ACL filter at all (your own filters only), then, for
    an ``and``, its cheap terms. Cheap: a term reading schema fields only, or one comparison on
    one dynamic-field key (an ``equals``, an id allow-list, an ``in`` of strings: ``==`` on one key
    joined by ``or``, measured as cheap as one ``==``). Costly: a group of grants over
    dynamic-field keys, or a mixed-type ``in`` (one comparison per type: 47 ms for the public
    flag's three over 100,000 rows on Lite).
    """
    if condition is None or _keys(condition) & RESERVED_KEYS:
        # LlamaIndex writes doc_id / ref_doc_id as fields of the row, not in the node's metadata that
        # the rule reads here: such a condition is left to the exact expression.
        return None
    fields = dialect.fields
    typed = fields.varchar | fields.bools | fields.arrays

    def cheap(term: Condition) -> bool:
        if _keys(term) <= typed:
            return True
        return isinstance(term, (Equals, IdIn)) or (
            isinstance(term, In) and all(isinstance(value, str) for value in term.values)
        )

    terms = condition.terms if isinstance(condition, And) else (condition,)
    chosen = [term for term in terms if cheap(term)]
    if len(chosen) == len(terms):
        return None  # the exact expression is as cheap as any
    unfiltered = group(own, True)
    expressions = ["" if unfiltered is True else str(unfiltered)]
    if chosen:  # stated already, as part of the whole expression
        narrowed = group([*(dialect.stated(term) for term in chosen), *own], True)
        if isinstance(narrowed, str):
            expressions.append(narrowed)
    return Probes(tuple(expressions), lambda node_id, metadata: evaluate(condition, node_id, metadata), history, key)


def _keys(condition: Condition) -> frozenset[str]:
    """The metadata keys ``condition`` reads (an id allow-list on node ids reads the primary key: none)."""
    if isinstance(condition, (And, Or)):
        return frozenset().union(*(_keys(term) for term in condition.terms))
    if isinstance(condition, Not):
        return _keys(condition.term)
    key = getattr(condition, "key", None)
    return frozenset() if key is None else frozenset((key,))


def _own_expression(retriever: BaseRetriever, fields: Fields) -> str | None:
    """The caller's own restriction: its ``filters``, ``node_ids``, ``doc_ids`` and ``string_expr``."""
    store = vector_store_of(retriever)
    own = filters_expression(
        getattr(retriever, "_filters", None),
        fields=fields,
        node_ids=getattr(retriever, "_node_ids", None),
        doc_ids=getattr(retriever, "_doc_ids", None),
        doc_id_field=str(getattr(store, "doc_id_field", "doc_id")),
    )
    kwargs: Mapping[str, Any] = getattr(retriever, "_kwargs", None) or {}
    if "milvus_scalar_filters" in kwargs:
        # LlamaIndex's store then ignores string_expr, the expression the ACL is pushed down by.
        raise UntranslatableFilterError(
            "milvus_scalar_filters in vector_store_kwargs (pass that filter as string_expr instead)"
        )
    custom = kwargs.get("string_expr")
    parts = [part for part in (own, f"({custom})" if custom else None) if part]
    return None if not parts else " and ".join(parts)
