"""``JevRetriever``: wrap any LlamaIndex retriever with the ACL and the relevance judgement."""

from __future__ import annotations

import copy
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from llama_index.core.base import base_retriever
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.base import BaseIndex
from llama_index.core.schema import NodeWithScore, QueryBundle, QueryType
from llama_index_instrumentation import get_dispatcher
from llama_index_instrumentation.dispatcher import DISPATCHER_SPAN_DECORATED_ATTR

from llama_jev import stores
from llama_jev.acl.batch import CallableAcl, batch_acl, checked_restriction
from llama_jev.acl.conditions import Nothing
from llama_jev.acl.diagnostics import warn_engine_matched_nothing, warn_keys_absent
from llama_jev.acl.rules import MetadataAcl
from llama_jev.core.context import RuntimeContext, bind_if_given
from llama_jev.core.records import Mode, RestrictionKindName, RetrievalFacts
from llama_jev.engine.pipeline import AnyAcl, JudgedRetrieval, check_query
from llama_jev.engine.rerank import listening
from llama_jev.engine.selector import MAX_CANDIDATES, RELEVANCE_QUESTION, CandidateSelector
from llama_jev.retrieval.widening import Widening
from llama_jev.stores import KeyCensus, completeness

__all__ = ["JevRetriever"]

dispatcher = get_dispatcher(__name__)
# The dispatcher BaseRetriever.retrieve reports to (its module's): who listens there hears the retriever.
_base_dispatcher = get_dispatcher(base_retriever.__name__)
logger = logging.getLogger(__name__)
_TOP_K_ATTRIBUTE = "similarity_top_k"
# Keyword arguments VectorIndexRetriever takes through **kwargs rather than by name.
_PASS_THROUGH_KWARGS = frozenset({"vector_store_kwargs"})


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _no_own_span(method: _Method) -> _Method:
    """Keep LlamaIndex's mixin from wrapping ``method`` in a dispatcher span of its own.

    ``BaseRetriever.retrieve``, which ``retrieve`` calls and which calls ``_retrieve``, opens the
    retriever's span already. More spans around it would cost a span per retrieval each, repeat
    the nodes in every trace (OpenInference serialises a span's result), and hand the handlers
    ``ctx`` (identity values) as an argument to record. The mixin skips what is marked as spanned.
    """
    setattr(method, DISPATCHER_SPAN_DECORATED_ATTR, True)
    return method


class JevRetriever(BaseRetriever):
    """A retriever that returns only what the caller may read and the judge finds relevant.

    Order of work: upstream recall -> ACL -> one independent judgement per authorized node ->
    order by probability -> ``top_k``. The identity is the bound :class:`RuntimeContext` (or
    ``ctx=`` on :meth:`retrieve`).

    Args:
        retriever: any LlamaIndex retriever (vector store, BM25, fusion, ...). It is never mutated.
        selector: the :class:`CandidateSelector`; its mode decides what happens.
        acl: ``acl(ctx, node) -> bool``, a :class:`MetadataAcl`, or any ``BatchAcl`` (an
            authorization engine such as ``CerbosAcl``): the final check asks it once per batch of
            nodes (awaited on the async path). What it raises, ``PermissionsUnavailableError``
            included, fails the retrieval in every mode, and no node is returned.
        candidate_limit: in ENFORCE, how many candidates to recall for judgement (1..1024).
        top_k: how many nodes to return; defaults to the wrapped retriever's ``similarity_top_k``
            (no limit for retrievers without one).
        prefilter: also push the ACL down into the vector store, so nodes the caller may not
            read never leave the store: they do not crowd authorized ones out of the candidates,
            and the wrapped retriever's own instrumentation events (``RetrievalEndEvent``) carry
            only readable nodes. Per query the ACL is asked ``restriction(ctx)`` once (awaited on
            the async path) and the store's adapter in ``llama_jev.stores`` states it (Qdrant,
            the in-memory ``SimpleVectorStore``, an ``AclPGVectorStore``, Chroma, or one you
            ``register()``), ANDed with the retriever's own filters. ``Nothing`` means no store
            call at all (an empty result); a restriction the adapter cannot state means no
            pushdown for that query (said once). Needs a ``BatchAcl`` that can say what a store may
            pre-select (not a plain callable). The final check stays on. Defaults to ``False``;
            :meth:`from_index` turns it on where it can. Without it, over a plain
            ``PGVectorStore``, the retriever warns once that ``AclPGVectorStore`` would push down.

    Recall and widening: a retriever with a settable ``similarity_top_k`` (VectorIndexRetriever,
    Qdrant, BM25, ...) is asked, per query and on a private shallow copy, for the count wanted:
    ``max(candidate_limit, top_k)`` permitted nodes in ENFORCE, ``top_k`` in OFF / SHADOW (twice
    that at first without pushdown once the final check has dropped nodes of an earlier query).
    When the final check leaves
    fewer and the store returned all it was asked for, it is asked again with a doubled window,
    until the count is met, the store holds no more, or 1,024 candidates were recalled; a node is
    counted once. A shortfall the bound causes is never silent: the record has ``wanted``,
    ``found`` and ``rounds``, and one WARNING per retriever and cause names the cause. A fusion
    retriever is widened through its own ``similarity_top_k``, as far as its sub-retrievers' ``k``
    lets it (an answer shorter than asked reads as "no more"). Any other retriever (one of your
    own without ``similarity_top_k``) is used as it is, in one round: its own limit decides how
    many candidates there are.

    Permissions engines carry their own timeout (``CerbosAcl(timeout=...)``); the judgement's
    ``ExecutionOptions(budget=...)`` starts after the final check and does not bound it.

    Example:
        >>> retriever = JevRetriever(index.as_retriever(similarity_top_k=5), selector, acl)  # doctest: +SKIP
        >>> with runtime_context(RuntimeContext(user_id="u1", tenant_id="acme")):  # doctest: +SKIP
        ...     nodes = retriever.retrieve("What are the refund conditions?")
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        selector: CandidateSelector,
        acl: AnyAcl,
        candidate_limit: int = 20,
        top_k: int | None = None,
        *,
        prefilter: bool = False,
        question: str = RELEVANCE_QUESTION,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError("retriever must be a LlamaIndex BaseRetriever")
        if isinstance(candidate_limit, bool) or not isinstance(candidate_limit, int):
            raise TypeError("candidate_limit must be an integer")
        if not 1 <= candidate_limit <= MAX_CANDIDATES:
            raise ValueError(f"candidate_limit must be between 1 and {MAX_CANDIDATES}, got {candidate_limit}")
        own_top_k = _top_k_of(retriever)
        if top_k is None and own_top_k is not None and own_top_k < 1:
            # The error names what the user wrote: the wrapped retriever's similarity_top_k.
            raise ValueError(
                f"the wrapped retriever's similarity_top_k must be a positive integer, got {own_top_k!r}; "
                "set it when building the retriever (index.as_retriever(similarity_top_k=5)) or pass top_k="
            )
        top_k = own_top_k if top_k is None else top_k
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        self._judged = JudgedRetrieval(selector, acl, question=question, component=self.class_name())
        self._pushdown = stores.pushdown_for(retriever, acl, self._judged.warned) if prefilter else None
        # How a short answer the store said nothing of is read (Pushdown.short_is_complete).
        adapter = stores.adapter_for(retriever)
        self._short_is_complete = adapter.short_is_complete if adapter is not None else True
        self._judged.pushdown = self._pushdown is not None
        # The store is asked once which configured keys no node holds (pushdown or not); a store
        # no adapter speaks cannot be asked, so the nodes that come back are checked instead.
        self._census = stores.adapter_for(retriever) if isinstance(acl, MetadataAcl) else None
        self._keys_checked = self._census is None
        advice = None if prefilter else stores.advice_for(retriever)
        if advice is not None:
            # Once per retriever: said when it is built, not per query.
            logging.getLogger("llama_jev").warning("JevRetriever: %s", advice)
        # Once per retriever (not per process): every retriever over a sync-only store is told.
        self._warned_sync_only = threading.Event()
        # Whether the final check has dropped nodes of a query without pushdown (see Widening).
        self._denials_seen = False
        self.retriever = retriever
        self.candidate_limit = candidate_limit
        self.top_k = top_k
        super().__init__(callback_manager=callback_manager or retriever.callback_manager, verbose=verbose)

    @classmethod
    def from_index(
        cls,
        index: BaseIndex[Any],
        selector: CandidateSelector,
        acl: AnyAcl,
        candidate_limit: int = 20,
        top_k: int = 5,
        *,
        prefilter: bool | None = None,
        question: str = RELEVANCE_QUESTION,
        **retriever_kwargs: Any,
    ) -> JevRetriever:
        """Wrap ``index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)``.

        ``prefilter`` defaults to on for any ACL that can say what a store may pre-select (a
        :class:`MetadataAcl`, an engine such as ``CerbosAcl``; not a plain callable) over a store an adapter of
        ``llama_jev.stores`` speaks (Qdrant, the in-memory store, an ``AclPGVectorStore``,
        Chroma, or one you ``register()``; the store pre-filters, the ACL post-filters again), off
        otherwise (logged once at INFO: then the wrapped retriever's events carry nodes the caller
        may not read; at WARNING where the store could have it in another form: a plain
        ``PGVectorStore``, or Chroma with a filter of the caller's it cannot translate).
        ``question`` is the yes/no question asked per node. A keyword the index's retriever does
        not take is a ``TypeError`` (LlamaIndex would swallow a misspelled one silently).

        Example:
            >>> retriever = JevRetriever.from_index(index, selector, acl, top_k=5)  # doctest: +SKIP
        """
        inner = index.as_retriever(similarity_top_k=top_k, **retriever_kwargs)
        _check_retriever_kwargs(index, inner, retriever_kwargs)
        if prefilter is None:
            # On by default for an ACL that can say what a store may pre-select (not a plain callable),
            # over a store an adapter speaks; the final check still decides every node.
            prefilter = not isinstance(batch_acl(acl), CallableAcl) and stores.adapter_for(inner) is not None
            # A store with advice (a plain PGVectorStore) gets its WARNING from the constructor instead.
            if not prefilter and stores.advice_for(inner) is None:
                logger.info(
                    "JevRetriever.from_index: the ACL is applied after retrieval only (no pushdown for %s with %s); "
                    "the wrapped retriever's RetrievalEndEvent carries nodes the caller may not read",
                    type(inner).__name__,
                    type(acl).__name__,
                )
        return cls(
            inner, selector, acl, candidate_limit=candidate_limit, top_k=top_k, prefilter=prefilter, question=question
        )

    @classmethod
    def class_name(cls) -> str:
        """The component's name in LlamaIndex."""
        return "JevRetriever"

    @property
    def selector(self) -> CandidateSelector:
        """The selector judging the candidates."""
        return self._judged.selector

    @property
    def acl(self) -> AnyAcl:
        """The ACL applied to every candidate."""
        return self._judged.acl

    @property
    def question(self) -> str:
        """The yes/no question asked about every candidate (``RELEVANCE_QUESTION`` unless set)."""
        return self._judged.question

    @property
    def prefilter(self) -> bool:
        """Whether the ACL is also pushed down into the vector store as metadata filters."""
        return self._pushdown is not None

    @property
    def recall_k(self) -> int | None:
        """How many permitted nodes a query wants in the current mode (the store's first window with pushdown).

        ``max(candidate_limit, top_k)`` in ENFORCE, ``top_k`` otherwise; without pushdown the first
        window is twice this once the final check has dropped nodes, and widening doubles it while
        the final check leaves fewer.
        """
        if self._judged.mode is Mode.ENFORCE:
            return max(self.candidate_limit, self.top_k or 0)
        return self.top_k

    @_no_own_span
    def retrieve(self, str_or_query_bundle: QueryType, ctx: RuntimeContext | None = None) -> list[NodeWithScore]:
        """Retrieve for the bound identity, or for ``ctx`` when given."""
        bundle = _bundle(str_or_query_bundle)  # refuses None (or a blank string) before anything runs
        with bind_if_given(ctx):
            if self._traced():
                return super().retrieve(str_or_query_bundle)
            return self._handle_recursive_retrieval(bundle, self._retrieve(bundle))

    @_no_own_span
    async def aretrieve(self, str_or_query_bundle: QueryType, ctx: RuntimeContext | None = None) -> list[NodeWithScore]:
        """Async :meth:`retrieve`."""
        bundle = _bundle(str_or_query_bundle)
        with bind_if_given(ctx):
            if self._traced():
                return await super().aretrieve(str_or_query_bundle)
            return await self._ahandle_recursive_retrieval(bundle, await self._aretrieve(bundle))

    def _traced(self) -> bool:
        """Whether anyone hears this retriever's span, events or callbacks.

        When nobody does, ``BaseRetriever.retrieve``'s span, its start and end events and its
        callback trace would be built for no one: they were most of what this layer cost in OFF
        (a signature bound, four uuid4s, two validated events per retrieval). The wrapped
        retriever keeps its own, as without llama_jev.
        """
        spans, events = listening(_base_dispatcher)
        return spans or events or bool(getattr(self, "callback_manager", None) and self.callback_manager.handlers)

    @_no_own_span
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        check_query(query_bundle.query_str)
        ctx = self._judged.identity(None)
        if not self._keys_checked:
            self._census_taken(self._ask_store())
        query = self._query(ctx, self._judged.batch.restriction(ctx) if self._pushdown is not None else None)
        while (window := query.widening.next_window()) is not None and query.upstream is not None:
            with completeness.listening() as answer:
                returned = query.at(window).retrieve(query_bundle)
            fresh = query.widening.fresh(returned, answer.reads_complete(self._short_is_complete))
            query.widening.add(fresh, self._judged.authorize(fresh, ctx))
        candidates, facts = self._outcome(query)
        return self._judged.judge(query_bundle.query_str, candidates, ctx, self.top_k, facts)

    @_no_own_span
    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        check_query(query_bundle.query_str)
        ctx = self._judged.identity(None)
        if not self._keys_checked:
            self._census_taken(await self._aask_store())
        query = self._query(ctx, await self._judged.batch.arestriction(ctx) if self._pushdown is not None else None)
        while (window := query.widening.next_window()) is not None and query.upstream is not None:
            with completeness.listening() as answer:
                returned = await stores.aretrieve(query.at(window), query_bundle, self._warned_sync_only)
            fresh = query.widening.fresh(returned, answer.reads_complete(self._short_is_complete))
            query.widening.add(fresh, await self._judged.aauthorize(fresh, ctx))
        candidates, facts = self._outcome(query)
        return await self._judged.ajudge(query_bundle.query_str, candidates, ctx, self.top_k, facts)

    def _query(self, ctx: RuntimeContext, restriction: object | None) -> _Query:
        """This query's plan: the store's restriction applied to a private copy, and its widening.

        ``restriction`` is what the ACL answered (``None``: not asked, no pushdown configured).
        ``Nothing`` means no store call at all; an answer that is not a restriction fails closed.
        """
        kind: RestrictionKindName = "none"
        applied = False
        upstream: BaseRetriever | None = self.retriever
        can_widen = self.top_k is not None and _top_k_of(self.retriever) is not None
        if restriction is not None:
            checked = checked_restriction(self._judged.engine, restriction)
            if isinstance(checked, Nothing):
                kind, applied, upstream = "nothing", True, None
                # No store call; a MetadataAcl still says why (a caller without a tenant). No engine
                # call either: nothing is asked about an empty list.
                self._judged.authorize([], ctx)
            else:
                upstream = copy.copy(self.retriever)
                assert self._pushdown is not None  # a restriction is asked only with one
                applied = self._pushdown.apply(upstream, checked, ctx)
                kind = checked.kind if applied else "none"
        wanted = self.recall_k if self.top_k is not None else None
        # Nothing: the store holds nothing this caller may read, so nothing is missing either.
        widening = Widening(wanted, can_widen, applied, self._denials_seen, exhausted=upstream is None)
        return _Query(upstream, widening, applied, kind, owned=upstream is not self.retriever)

    def _outcome(self, query: _Query) -> tuple[list[NodeWithScore], RetrievalFacts]:
        """The candidates of a finished query and what its record says; a shortfall is logged."""
        widening = query.widening
        widening.warn(self._judged.warned, self.class_name())
        if widening.dropped and not query.pushdown:
            # From now on this retriever's first window is wider without pushdown (NO_PUSHDOWN_FACTOR).
            self._denials_seen = True
        retrieved, denied = widening.counts()
        if query.pushdown and retrieved == 0 and query.restriction in ("ids", "conditional"):
            # The engine permits something, yet the store holds none of it: a silent [] otherwise.
            warn_engine_matched_nothing(self._judged.batch, query.restriction)
        candidates = widening.candidates()
        facts = RetrievalFacts(
            retrieved=retrieved,
            denied=denied,
            pushdown=query.pushdown,
            engine=self._judged.engine,
            restriction=query.restriction,
            wanted=widening.wanted,
            found=len(candidates) if widening.wanted is not None else None,
            rounds=widening.rounds,
            shortfall=shortfall[0] if (shortfall := widening.shortfall()) is not None else None,
        )
        return candidates, facts

    def _ask_store(self) -> KeyCensus | None:
        """The store's census of the ACL's keys, or ``None`` when it cannot be asked (or failed to answer)."""
        if self._census is None or not isinstance(self.acl, MetadataAcl):
            return None
        try:
            return self._census.census(self.retriever, self.acl.keys)
        except Exception:
            # A diagnosis never fails a retrieval; a store that is down fails the retrieval itself.
            logger.debug("the %s store could not be asked for the ACL's keys", self._census.name, exc_info=True)
            return None

    async def _aask_store(self) -> KeyCensus | None:
        """The async twin of :meth:`_ask_store`."""
        if self._census is None or not isinstance(self.acl, MetadataAcl):
            return None
        try:
            return await self._census.acensus(self.retriever, self.acl.keys)
        except Exception:
            logger.debug("the %s store could not be asked for the ACL's keys", self._census.name, exc_info=True)
            return None

    def _census_taken(self, census: KeyCensus | None) -> None:
        """Warn about the configured keys no node in the store holds; once a non-empty store answered.

        Once per retriever and key set (``warn_keys_absent`` keeps the retriever's ``seen``). An
        empty store is asked again next time; a store that cannot be asked leaves the check to
        the nodes that come back (``diagnose_denials``).
        """
        if census is not None and census.nodes == 0:
            return
        self._keys_checked = True
        if census is None or not isinstance(self.acl, MetadataAcl):
            return
        self._judged.store_checked = True
        if census.absent:
            warn_keys_absent(self.acl, census.absent, census.where, census.present, seen=self._judged.warned)

    def _handle_recursive_retrieval(self, query_bundle: QueryBundle, nodes: list[NodeWithScore]) -> list[NodeWithScore]:
        # The wrapped retriever already expanded IndexNodes; expanding again here would put
        # objects behind the ACL and the judge into the result.
        return nodes

    async def _ahandle_recursive_retrieval(
        self, query_bundle: QueryBundle, nodes: list[NodeWithScore]
    ) -> list[NodeWithScore]:
        return nodes


def _check_retriever_kwargs(index: BaseIndex[Any], retriever: BaseRetriever, kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither ``index.as_retriever`` nor the retriever's constructor names.

    Both accept ``**kwargs`` and drop what they do not know, so a typo (``similarty_top_k``)
    would otherwise change nothing and say nothing.
    """
    known = set(_PASS_THROUGH_KWARGS)
    for function in (index.as_retriever, type(retriever).__init__):
        known.update(
            name
            for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        )
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"JevRetriever.from_index got keyword argument(s) {', '.join(map(repr, unknown))} that "
            f"{type(index).__name__}.as_retriever / {type(retriever).__name__} do not take; "
            f"known: {', '.join(sorted(known - {'self', 'index'}))}"
        )


@dataclass
class _Query:
    """One query against the store: its private copy of the wrapped retriever and its rounds.

    ``upstream`` is ``None`` when the restriction is ``Nothing`` (no store call at all).
    """

    upstream: BaseRetriever | None
    widening: Widening
    pushdown: bool
    restriction: RestrictionKindName
    # Whether upstream is this query's own copy (else the caller's retriever, never to be changed).
    owned: bool = False

    def at(self, window: int) -> BaseRetriever:
        """The retriever for a round asking ``window`` nodes (``0``: as it is)."""
        assert self.upstream is not None
        if window and _top_k_of(self.upstream) != window:
            if not self.owned:
                # A copy, never a mutation: the caller's retriever may serve other queries concurrently.
                self.upstream, self.owned = copy.copy(self.upstream), True
            setattr(self.upstream, _TOP_K_ATTRIBUTE, window)
        return self.upstream


def _bundle(query: QueryType) -> QueryBundle:
    """What BaseRetriever.retrieve makes of its argument; anything but a non-blank string or a bundle is refused.

    Raises:
        ValueError: ``query`` is neither a ``QueryBundle`` nor a non-blank string (``None``, say),
            as a blank string is refused (one rule: :func:`check_query`).
    """
    if isinstance(query, QueryBundle):
        return query
    check_query(query)
    return QueryBundle(query)


def _top_k_of(retriever: BaseRetriever) -> int | None:
    value = getattr(retriever, _TOP_K_ATTRIBUTE, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
