"""Each judgement as LlamaIndex instruments a reranker: a dispatcher span holding ``ReRankStartEvent``
and ``ReRankEndEvent``.

OpenInference's LlamaIndex instrumentor (Phoenix, Arize, Langfuse) turns such a span into a
RERANKER span: input documents the authorized candidates, output documents the nodes returned,
the judge's model name. Other handlers (llama-index-observability-otel) see the span and its
events, including ``JevDecisionEvent``, as they see any LlamaIndex component's.

The span is opened by hand rather than with ``@dispatcher.span`` for two reasons: its arguments
(which handlers serialise into the span) are chosen here, so the caller's identity never is one;
and when no handler listens, nothing is built at all.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.schema import NodeWithScore
from llama_index_instrumentation import get_dispatcher
from llama_index_instrumentation.dispatcher import Dispatcher, active_instrument_tags
from llama_index_instrumentation.event_handlers import NullEventHandler
from llama_index_instrumentation.events.span import SpanDropEvent
from llama_index_instrumentation.span import active_span_id
from llama_index_instrumentation.span_handlers import NullSpanHandler

__all__ = ["JudgementSpan", "judge_model_name", "judgement_span", "listening"]

dispatcher = get_dispatcher(__name__)


def _arguments(query: str, top_n: int) -> None:
    """What a handler records as the span's input (OpenInference: ``input.value``)."""


_SIGNATURE = inspect.signature(_arguments)


def listening(source: Dispatcher = dispatcher) -> tuple[bool, bool]:
    """Whether any span handler, and any event handler, hears ``source`` (LlamaIndex's null ones do not)."""
    spans = events = False
    current: Dispatcher | None = source
    while current is not None:
        spans = spans or any(not isinstance(handler, NullSpanHandler) for handler in current.span_handlers)
        events = events or any(not isinstance(handler, NullEventHandler) for handler in current.event_handlers)
        current = current.parent if current.propagate else None
    return spans, events


def judge_model_name(judge: object) -> str:
    """The judge's model as a reranker's ``model_name``: its ``model`` attribute, else its class name."""
    model = getattr(judge, "model", None)
    return model if isinstance(model, str) and model else type(judge).__name__


class JudgementSpan:
    """The open span of one judgement: events sent inside it belong to it."""

    __slots__ = ("events",)

    def __init__(self, events: bool) -> None:
        self.events = events

    def event(self, event: BaseEvent) -> None:
        """Send ``event`` to the handlers, if any listens (building it is the caller's, so check :attr:`events`)."""
        if self.events:
            dispatcher.event(event)

    def returned(self, nodes: list[NodeWithScore]) -> list[NodeWithScore]:
        """Report the nodes the judgement returns (``ReRankEndEvent``) and return them."""
        if self.events:
            dispatcher.event(ReRankEndEvent(nodes=nodes))
        return nodes


_SILENT = JudgementSpan(events=False)


@contextmanager
def judgement_span(
    component: str, query: str, candidates: Sequence[NodeWithScore], top_n: int, judge: object
) -> Iterator[JudgementSpan]:
    """A dispatcher span named ``<component>.judge`` around one judgement; ``ReRankStartEvent`` sent.

    Works alike in sync and async code: the span's id lives in a context variable of the
    caller's context, which a coroutine keeps across its awaits.
    """
    spans, events = listening()
    if not spans and not events:
        yield _SILENT
        return
    span = JudgementSpan(events)
    if not spans:
        # Event handlers only: the events go to whatever span is already active.
        span.event(
            ReRankStartEvent(query=query, nodes=list(candidates), top_n=top_n, model_name=judge_model_name(judge))
        )
        yield span
        return
    id_ = f"{component}.judge-{uuid.uuid4()}"
    bound = _SIGNATURE.bind(query, top_n)
    token = active_span_id.set(id_)
    parent = token.old_value if isinstance(token.old_value, str) else None
    try:
        dispatcher.span_enter(
            id_=id_, bound_args=bound, instance=None, parent_id=parent, tags=active_instrument_tags.get()
        )
        try:
            span.event(
                ReRankStartEvent(query=query, nodes=list(candidates), top_n=top_n, model_name=judge_model_name(judge))
            )
            yield span
        except BaseException as error:
            if events:
                dispatcher.event(SpanDropEvent(span_id=id_, err_str=str(error)))
            dispatcher.span_drop(id_=id_, bound_args=bound, instance=None, err=error)
            raise
        # The nodes are in ReRankEndEvent already: a result here would be serialised a second time.
        dispatcher.span_exit(id_=id_, bound_args=bound, instance=None, result=None)
    finally:
        active_span_id.reset(token)
