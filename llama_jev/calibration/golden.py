"""Labelled data before production: a golden set of queries run through a ``JevRetriever`` in SHADOW.

Each golden query names the node ids that are relevant to it. Running it through a SHADOW copy
of your retriever gives one decision record per query, and every candidate the judge saw becomes
a label (relevant when it is in the query's list, irrelevant otherwise), joined by
``decision_id``: records and labels in one step, ready for :func:`calibrate`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llama_jev.core.context import RuntimeContext, runtime_context
from llama_jev.core.records import DecisionRecord, LabelSink, Mode, Observer
from llama_jev.engine.selector import CandidateSelector
from llama_jev.retrieval.retriever import JevRetriever

__all__ = ["Collected", "GoldenQuery", "acollect", "collect"]


@dataclass(frozen=True)
class GoldenQuery:
    """A query and the ids of every node relevant to it (for the identity ``ctx``, if given).

    List every relevant node your retriever could return: a judged node missing from
    ``relevant`` becomes an *irrelevant* label.
    """

    query: str
    relevant: frozenset[str]
    ctx: RuntimeContext | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():
            raise ValueError("a golden query needs non-blank query text")
        if isinstance(self.relevant, str):
            raise TypeError("relevant must be a collection of node ids, not one string")
        object.__setattr__(self, "relevant", frozenset(self.relevant))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GoldenQuery:
        """``{"query": ..., "relevant": [node ids]}``."""
        return cls(query=data["query"], relevant=frozenset(data.get("relevant", ())))


@dataclass
class Collected:
    """Records and labels from a golden run; ``missed`` counts relevant nodes never retrieved."""

    records: list[DecisionRecord] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)
    missed: int = 0

    def write(self, records_path: str | os.PathLike[str], labels_path: str | os.PathLike[str]) -> None:
        """Write both as JSONL, in the formats ``python -m llama_jev.calibrate`` reads."""
        Path(records_path).write_text("".join(record.to_json() + "\n" for record in self.records), encoding="utf-8")
        Path(labels_path).write_text("".join(json.dumps(label) + "\n" for label in self.labels), encoding="utf-8")

    def _add(self, golden: GoldenQuery, records: Sequence[DecisionRecord]) -> None:
        judged: set[str] = set()
        for record in records:
            self.records.append(record)
            for node_id in record.scores:
                judged.add(node_id)
                self.labels.append(
                    {"decision_id": record.decision_id, "node_id": node_id, "relevant": node_id in golden.relevant}
                )
        self.missed += len(golden.relevant - judged)


def _golden(items: Iterable[GoldenQuery | Mapping[str, Any]]) -> list[GoldenQuery]:
    return [item if isinstance(item, GoldenQuery) else GoldenQuery.from_dict(item) for item in items]


def _shadow(retriever: JevRetriever, sink: list[DecisionRecord], sampler: LabelSink | None) -> JevRetriever:
    """A SHADOW twin of ``retriever`` whose records also go to ``sink`` (and to its own observer),
    and whose judged retrievals go to ``sampler`` when one is given (else to its own, if any)."""
    selector = retriever.selector
    original: Observer | None = selector.options.observer

    def observer(ctx: RuntimeContext | None, record: DecisionRecord) -> None:
        sink.append(record)
        if original is not None:
            original(ctx, record)

    options = dataclasses.replace(
        selector.options, mode=Mode.SHADOW, observer=observer, label_sampler=sampler or selector.options.label_sampler
    )
    twin = CandidateSelector(
        selector.judge,
        options,
        selector.reject,
        selector.accept,
        batch_size=selector.batch_size,
        max_request_tokens=selector.max_request_tokens,
        max_concurrency=selector.max_concurrency,
        purpose=selector.purpose,
    )
    return JevRetriever(
        retriever.retriever,
        twin,
        retriever.acl,
        candidate_limit=retriever.candidate_limit,
        top_k=retriever.top_k,
        prefilter=retriever.prefilter,
        question=retriever.question,  # the same question as the original, not the default
    )


def _sampler(samples: str | os.PathLike[str] | None) -> LabelSink | None:
    if samples is None:
        return None
    from llama_jev.calibration.samples import LabelSampler

    return LabelSampler(samples, rate=1.0)


def _progress(items: list[GoldenQuery], show: bool) -> Iterable[GoldenQuery]:
    if not show:
        return items
    from tqdm import tqdm  # type: ignore[import-untyped]  # installed with llama-index-core

    bar: Iterable[GoldenQuery] = tqdm(items, desc="golden queries (SHADOW)", unit="query")
    return bar


def _context(golden: GoldenQuery, ctx: RuntimeContext | None) -> RuntimeContext:
    chosen = golden.ctx or ctx
    if chosen is None:
        raise ValueError("collect needs an identity: pass ctx=RuntimeContext(...) or set GoldenQuery.ctx")
    return chosen


def collect(
    retriever: JevRetriever,
    golden: Iterable[GoldenQuery | Mapping[str, Any]],
    *,
    ctx: RuntimeContext | None = None,
    samples: str | os.PathLike[str] | None = None,
    show_progress: bool = False,
) -> Collected:
    """Run every golden query through a SHADOW copy of ``retriever``; return records and labels.

    The retriever itself is not changed (its mode may be anything); the copy uses the same
    upstream retriever, ACL, judge, thresholds, version and purpose, so the records are what
    SHADOW in production would write. Queries run one after another under their identity
    (``GoldenQuery.ctx``, else ``ctx``). With ``samples`` (a path), every judged retrieval's query
    and authorized passages are appended there too, as a :class:`LabelSampler` at rate 1 writes
    them (mode 0600: it holds text), ready for ``python -m llama_jev.label_sheet --samples``.
    ``show_progress`` shows a progress bar (LlamaIndex's convention; ``tqdm``).

    Example:
        >>> golden = [GoldenQuery("What are the refund conditions?", frozenset({"refund-policy"}))]
        >>> collected = collect(retriever, golden, ctx=RuntimeContext(user_id="qa"))  # doctest: +SKIP
        >>> report = calibrate(collected.records, collected.labels)  # doctest: +SKIP
    """
    collected = Collected()
    sampler = _sampler(samples)
    for item in _progress(_golden(golden), show_progress):
        sink: list[DecisionRecord] = []
        with runtime_context(_context(item, ctx)):
            _shadow(retriever, sink, sampler).retrieve(item.query)
        collected._add(item, sink)
    return collected


async def acollect(
    retriever: JevRetriever,
    golden: Iterable[GoldenQuery | Mapping[str, Any]],
    *,
    ctx: RuntimeContext | None = None,
    samples: str | os.PathLike[str] | None = None,
    show_progress: bool = False,
) -> Collected:
    """:func:`collect` with ``aretrieve`` (for async-only upstream retrievers or clients)."""
    collected = Collected()
    sampler = _sampler(samples)
    for item in _progress(_golden(golden), show_progress):
        sink: list[DecisionRecord] = []
        with runtime_context(_context(item, ctx)):
            await _shadow(retriever, sink, sampler).aretrieve(item.query)
        collected._add(item, sink)
    return collected
