"""Step 2: reopen the collection and ask as different users. ``python -m examples.refund_policy.query``.

The collection is reopened as it is (``VectorStoreIndex.from_vector_store``: nothing is embedded
but the question). Its retriever is wrapped in a :class:`~llama_jev.JevRetriever` with the
knowledge base's :class:`~llama_jev.MetadataAcl`, and each user asks the question under their own
bound :class:`~llama_jev.RuntimeContext`, first in SHADOW mode (the judge only records its view),
then in ENFORCE mode (only passages the judge accepts are returned). For each, the printout shows
the passages the answer generator (the LLM of a query engine) would receive, and the decision
record the judgement produced. Before each user's answers it prints what the ACL removes for that
user (document keys and node ids, never text). SHADOW and ENFORCE judge different numbers of
candidates on purpose: SHADOW judges the ``top_k`` passages it serves (what OFF would serve),
ENFORCE recalls ``max(candidate_limit, top_k)`` so the judge has more to choose from.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore
from llama_index.vector_stores.qdrant import QdrantVectorStore
from qdrant_client import AsyncQdrantClient, QdrantClient

from examples.plain_text import plain
from examples.refund_policy import kb, postgres, store
from examples.refund_policy.failures import EXIT_EVERY_JUDGEMENT_FAILED, watching_failures
from examples.refund_policy.ingest import ensure_collection
from examples.refund_policy.models import Choice, choose_embedding, choose_judge
from llama_jev import (
    CandidateSelector,
    DecisionRecord,
    ExecutionOptions,
    JevError,
    JevRetriever,
    Judge,
    Mode,
    RetrievalInconclusiveError,
    RetrievalUnavailableError,
    runtime_context,
)
from llama_jev.core import Observer
from llama_jev.engine import PROBABILITY_KEY

TOP_K = 3
CANDIDATE_LIMIT = 20
# Generous: a cold first call of the local model on a slow machine must not read as a judge failure.
BUDGET_SECONDS = 5.0
_RULE = "=" * 78
_WIDTH = 78


class CollectionMissingError(RuntimeError):
    """The collection has not been built yet: run the ingestion step first."""


def open_index(client: QdrantClient, embed_model: BaseEmbedding, *, collection: str | None = None) -> VectorStoreIndex:
    """The existing collection as a ``VectorStoreIndex``, without ingesting anything.

    Raises:
        CollectionMissingError: the collection does not exist (it is never created here).
    """
    name = collection or store.collection_name(embed_model)
    if not client.collection_exists(name):
        raise CollectionMissingError(
            f"collection {name!r} does not exist: run `python -m examples.refund_policy.ingest` first "
            "(or `python -m examples.refund_policy`, which ingests when needed)"
        )
    vector_store = QdrantVectorStore(collection_name=name, client=client)
    return VectorStoreIndex.from_vector_store(vector_store, embed_model=embed_model)


async def aopen_index(
    client: AsyncQdrantClient, embed_model: BaseEmbedding, *, collection: str | None = None
) -> VectorStoreIndex:
    """:func:`open_index` over an async client, for ``aretrieve`` (what agents call)."""
    name = collection or store.collection_name(embed_model)
    if not await client.collection_exists(name):
        raise CollectionMissingError(
            f"collection {name!r} does not exist: run `python -m examples.refund_policy.ingest` first"
        )
    vector_store = QdrantVectorStore(collection_name=name, aclient=client)
    return VectorStoreIndex.from_vector_store(vector_store, embed_model=embed_model)


def open_retriever(
    index: VectorStoreIndex,
    mode: Mode,
    judge: Judge,
    *,
    observer: Observer | None = None,
    top_k: int = TOP_K,
    candidate_limit: int = CANDIDATE_LIMIT,
    prefilter: bool = True,
) -> JevRetriever:
    """Wrap ``index``'s retriever with the ACL and the judge, in ``mode``.

    ``prefilter`` also hands the ACL to Qdrant as a metadata filter, so documents the caller may
    not read never take candidate slots; the in-process ACL check runs either way.
    """
    options = ExecutionOptions(mode=mode, budget=BUDGET_SECONDS, version="refund-policy-example-v1", observer=observer)
    return JevRetriever.from_index(
        index,
        CandidateSelector(judge, options),
        kb.ACL,
        candidate_limit=candidate_limit,
        top_k=top_k,
        prefilter=prefilter,
    )


@dataclass
class Outcome:
    """One user asking in one mode: what came back, the decision records, how long it took."""

    user: kb.User
    mode: Mode
    passages: list[NodeWithScore] = field(default_factory=list)
    records: list[DecisionRecord] = field(default_factory=list)
    error: JevError | None = None
    seconds: float = 0.0

    @property
    def keys(self) -> list[str]:
        """The document keys returned, in order."""
        return [kb.BY_ID[passage.node.node_id].key for passage in self.passages]


def ask(
    index: VectorStoreIndex,
    judge: Judge,
    user: kb.User,
    mode: Mode,
    question: str = kb.QUESTION,
    *,
    prefilter: bool = True,
) -> Outcome:
    """Retrieve for ``user`` in ``mode``, as a query engine or agent would, and keep the records."""
    outcome = Outcome(user=user, mode=mode)
    retriever = open_retriever(
        index, mode, judge, observer=lambda ctx, record: outcome.records.append(record), prefilter=prefilter
    )
    started = time.perf_counter()
    # The identity is bound around the call, never passed in the query: this is what a
    # query engine's or agent's retrieval reads.
    with runtime_context(user.context):
        try:
            outcome.passages = retriever.retrieve(question)
        except (RetrievalInconclusiveError, RetrievalUnavailableError) as error:
            outcome.error = error
    outcome.seconds = time.perf_counter() - started
    return outcome


def walkthrough(
    index: VectorStoreIndex,
    judge: Judge,
    *,
    users: Sequence[kb.User] = kb.USERS,
    modes: Sequence[Mode] = (Mode.SHADOW, Mode.ENFORCE),
    question: str = kb.QUESTION,
    prefilter: bool = True,
) -> list[Outcome]:
    """Every user asks ``question`` in every mode, users in order, modes in order."""
    return [ask(index, judge, user, mode, question, prefilter=prefilter) for user in users for mode in modes]


# --- printing ---------------------------------------------------------------------------

_MODE_LINES = {
    Mode.OFF: "OFF: ACL only, no judge call, no record",
    Mode.SHADOW: "SHADOW: the passages are served as OFF would serve them; the judge's verdict is only recorded",
    Mode.ENFORCE: "ENFORCE: only passages the judge accepts (p >= 0.8) reach the answer generator",
}


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent, subsequent_indent=indent)


def user_heading(user: kb.User) -> str:
    """The line that starts a user's section (tests look for it)."""
    return f"=== user: {user.name} ({user.who}; tenant {user.context.tenant_id}) ==="


def render_acl(user: kb.User, *, prefilter: bool = True, store: str = "Qdrant") -> str:
    """What the ACL removes for ``user``: counts and document keys with node ids, never text.

    ``store`` names the vector store the filter was pushed down into.
    """
    removed = [document for document in kb.DOCUMENTS if document.key not in kb.readable_by(user)]
    where = (
        f"pushed down into {store}, so these never leave the store (the records count only what it returned)"
        if prefilter
        else "removed after retrieval (the records count them as denied)"
    )
    summary = f"ACL: {user.name} may read {len(kb.DOCUMENTS) - len(removed)} of {len(kb.DOCUMENTS)} documents; {where}."
    lines = [textwrap.fill(summary, width=_WIDTH, subsequent_indent="  ")]
    lines.append(f"  removed {len(removed)}:")
    lines += [f"    {document.key} (node {document.node_id[:8]}...)" for document in removed]
    return "\n".join(lines)


def _why_candidates(mode: Mode) -> str:
    # SHADOW must serve exactly what OFF would, so it judges only those; ENFORCE recalls more to choose from.
    if mode is Mode.ENFORCE:
        return f"ENFORCE recalls max(candidate_limit={CANDIDATE_LIMIT}, top_k={TOP_K}) and judges all it gets"
    return f"SHADOW judges only the up to top_k={TOP_K} it serves, exactly what OFF would serve"


def render(outcome: Outcome) -> str:
    """A readable account of one outcome: passages, then the decision record."""
    lines = [f"--- {_MODE_LINES[outcome.mode]}"]
    if outcome.error is not None:
        kind = "INCONCLUSIVE" if isinstance(outcome.error, RetrievalInconclusiveError) else "UNAVAILABLE"
        # The error's own message says it is not an empty result and what to do.
        lines.append(_wrap(f"{kind} (an error; the answer generator gets nothing): {outcome.error}", "  "))
    else:
        count = len(outcome.passages)
        lines.append(f"  The answer generator receives {count} passage{'s' if count != 1 else ''}:")
        if not outcome.passages:
            lines.append("    (none: the judge found no passage relevant, a real 'no evidence')")
        for number, passage in enumerate(outcome.passages, start=1):
            document = kb.BY_ID[passage.node.node_id]
            probability = passage.node.metadata.get(PROBABILITY_KEY)
            judged = f", judge p={probability:.2f}" if probability is not None else ""
            lines.append(f"    {number}. [{document.key}] {document.title} (vector score {passage.score:.3f}{judged})")
            lines.append(_wrap(passage.node.get_content(), "         "))
    timing = f"  retrieval {outcome.seconds * 1000:.0f} ms"
    for record in outcome.records:
        # Compact: the fields a JSONL calibration log holds, ids and probabilities, never any text.
        # With pushdown the store removed what the user may not read before anything came back.
        counted = " (after the store's ACL filter)" if record.pushdown else ""
        summary = (
            f"Record {record.decision_id[:8]}: {record.status.value} / {record.reason.value}; retrieved "
            f"{record.retrieved}{counted}, ACL denied {record.denied}, judged {record.judged} of "
            f"{record.candidates} ({_why_candidates(outcome.mode)}); {record.elapsed_ms:.0f} ms, "
            f"model {record.model or 'unknown (no answer)'}"
        )
        lines.append(textwrap.fill(summary, width=_WIDTH, initial_indent="  ", subsequent_indent="    "))
        verdicts = [("selected", record.selected), ("uncertain", record.uncertain), ("rejected", record.rejected)]
        for verdict, ids in verdicts:
            if ids:
                judged = ", ".join(f"{kb.BY_ID[node_id].key} {record.scores[node_id]:.2f}" for node_id in ids)
                lines.append(_wrap(f"{verdict}: {judged}", "    "))
    if not outcome.records:
        lines.append("  No decision record (no judgement in this mode).")
    lines.append(timing)
    return "\n".join(lines)


def render_header(store_line: str, embedding: Choice, judge: Choice, question: str) -> str:
    """What runs where: the vector store, the embedding, the judge, the ACL, the question."""
    lines = [
        _RULE,
        "llama_jev example: who may read what (ACL), then what is relevant (judge)",
        _RULE,
        f"Vector store : {store_line}",
        f"Embedding    : {embedding.label}",
    ]
    if embedding.note:
        lines.append(_wrap(embedding.note, "               "))
    lines.append(f"Judge        : {judge.label}")
    if judge.note:
        lines.append(_wrap(judge.note, "               "))
    lines.append("ACL          : MetadataAcl over tenant / users / roles / public; it runs before the judge, so")
    lines.append("               text a user may not read is never sent to the judge")
    lines.append(f"Question     : {question}")
    lines.append(_wrap(VERDICTS, "               ").replace(" " * 15, "Verdicts     : ", 1))
    lines.append("")
    lines.append(f"Knowledge base ({len(kb.DOCUMENTS)} documents, two tenants):")
    for document in kb.DOCUMENTS:
        lines.append(f"  [{document.key}] {document.title}: {kb.access_line(document)}")
    return "\n".join(lines)


# What the record's three lists and ENFORCE's outcomes mean, said once before any user's answers.
VERDICTS = (
    "the judge gives each passage a probability p: selected (p >= 0.8), rejected (p <= 0.2) or "
    "uncertain (in between). ENFORCE returns the selected passages, or [] when every passage is "
    "rejected (a real 'no evidence'), or raises an error the app must not answer from: "
    "INCONCLUSIVE (nothing selected, something uncertain) or UNAVAILABLE (the judge failed)."
)


# Advice for every judge, after the judge's own lines.
_NEXT_STEPS = """\
  - Before ENFORCE, calibrate the thresholds for this judge: python -m examples.refund_policy.calibrate.
  - Set QDRANT_URL (and QDRANT_API_KEY if needed) to use a Qdrant server, e.g. docker/docker-compose.yml,
    or DATABASE_URL=postgresql://... to use PostgreSQL + pgvector through AclPGVectorStore (postgres extra).
  - Wrap your own retriever the same way: JevRetriever(retriever, CandidateSelector(judge, options), acl)."""

_OFFLINE_JUDGE_STEPS = """\
  - Set TYPESAFE_API_KEY to judge with TypeSafe's Jev (TYPESAFE_BASE_URL for another System One server).
  - Or serve the offline judge over HTTP: python -m llama_jev.serve --judge local --port 8000, then run
    this with TYPESAFE_BASE_URL=http://127.0.0.1:8000 (the same judge, through JevClient).
"""

_JUDGE_STEPS = {
    "jev": "",  # the key is set and Jev judged: nothing to switch
    "keyed-server": "  - Unset TYPESAFE_BASE_URL to judge with TypeSafe's Jev (your key goes to the server above).\n",
    "server": "  - Set TYPESAFE_API_KEY and unset TYPESAFE_BASE_URL to judge with TypeSafe's Jev (the server above\n"
    "    runs whatever judge it was started with).\n",
}


def next_steps(judge: Choice) -> str:
    """What to try after this run, for the judge it used: never to set what is already set."""
    return f"Next steps:\n{_JUDGE_STEPS.get(judge.kind, _OFFLINE_JUDGE_STEPS)}{_NEXT_STEPS}"


# --- the command ------------------------------------------------------------------------


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--storage", help=store.STORAGE_HELP)
    parser.add_argument("--question", default=kb.QUESTION, help=f"what the users ask (default: {kb.QUESTION!r})")
    parser.add_argument(
        "--user",
        action="append",
        choices=[user.name for user in kb.USERS],
        help="ask only as this user (repeatable; default: all)",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the collection first (with ingestion)")
    return parser


@store.reports_unreachable
def main(argv: list[str] | None = None, *, ingest_if_missing: bool = False) -> int:
    """Run the walkthrough and print it. With ``ingest_if_missing``, build the collection first if needed."""
    prog = "python -m examples.refund_policy" if ingest_if_missing else "python -m examples.refund_policy.query"
    args = _parser(prog).parse_args(argv)
    users = [kb.USER_BY_NAME[name] for name in args.user] if args.user else list(kb.USERS)
    started = time.perf_counter()  # the local judge loads its models when it is built
    embedding = choose_embedding()
    judge = choose_judge()
    database = postgres.database_url()
    where = (
        postgres.describe(database, embedding.component)
        if database
        else store.describe(store.client_options(args.storage))
    )
    print(render_header(where, embedding, judge, args.question))

    print()
    # Once, up front, so the first query's latency is the query's own.
    local_models = [
        part for part in (getattr(embedding.component, "encoder", None), judge.component) if hasattr(part, "load")
    ]
    if local_models:
        for part in local_models:
            part.load()
        print(f"Loaded the local models in {time.perf_counter() - started:.2f} s")

    if database:
        return _run_on_postgres(database, args, users, embedding.component, judge, ingest=ingest_if_missing)

    if ingest_if_missing or args.rebuild:
        # Step 1, with its own client, closed before step 2 reopens the folder (Qdrant local
        # mode allows one client per folder).
        with store.connect(args.storage) as client:
            done = ensure_collection(client, embedding.component, rebuild=args.rebuild)
        if done.built:
            print(f"Ingested {done.points} documents into {done.collection!r} in {done.seconds:.2f} s")
        else:
            print(f"Collection {done.collection!r} already holds {done.points} points: not re-ingested")

    with ExitStack() as stack:
        close = getattr(judge.component, "close", None)
        if callable(close):
            stack.callback(close)
        started = time.perf_counter()
        client = stack.enter_context(store.connect(args.storage))
        try:
            index = open_index(client, embedding.component)
        except CollectionMissingError as error:
            print(f"\n{error}")
            return 2
        points = store.point_count(client, store.collection_name(embedding.component))
        print(f"Reopened {points} points in {time.perf_counter() - started:.2f} s (nothing re-embedded)")

        records: list[DecisionRecord] = []
        with watching_failures() as failures:
            for user in users:
                print(f"\n{user_heading(user)}")
                print(render_acl(user))
                for mode in (Mode.SHADOW, Mode.ENFORCE):
                    outcome = ask(index, judge.component, user, mode, args.question)
                    records += outcome.records
                    if isinstance(outcome.error, RetrievalUnavailableError):
                        failures.add(outcome.error)
                    print(render(outcome))
    print(f"\n{next_steps(judge)}")
    failed = failures.every_judgement_failed(records)
    if failed is not None:
        print(f"\n{failed}", file=sys.stderr)
        return EXIT_EVERY_JUDGEMENT_FAILED
    return 0


def _run_on_postgres(
    database: str, args: argparse.Namespace, users: list[kb.User], embed_model: BaseEmbedding, judge: Choice,
    *, ingest: bool,
) -> int:  # fmt: skip
    """The same walkthrough over PostgreSQL + pgvector (``DATABASE_URL``), through ``AclPGVectorStore``."""
    if ingest or args.rebuild:
        done = postgres.ensure_table(database, embed_model, rebuild=args.rebuild)
        if done.built:
            print(f"Ingested {done.points} documents into {done.collection!r} in {done.seconds:.2f} s")
        else:
            print(f"Table {done.collection!r} already holds {done.points} rows: not re-ingested")
    with ExitStack() as stack:
        close = getattr(judge.component, "close", None)
        if callable(close):
            stack.callback(close)
        started = time.perf_counter()
        index, rows = postgres.open_index(database, embed_model)
        if rows == 0:
            print("\nThe table is empty: run `python -m examples.refund_policy` (it ingests when needed)")
            return 2
        print(f"Reopened {rows} rows in {time.perf_counter() - started:.2f} s (nothing re-embedded)")
        for user in users:
            print(f"\n{user_heading(user)}")
            print(render_acl(user, store="PostgreSQL"))
            for mode in (Mode.SHADOW, Mode.ENFORCE):
                print(render(ask(index, judge.component, user, mode, args.question)))
    print(f"\n{next_steps(judge)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
