"""Revocation is effective on the next query: on every store, pushdown on and off, every mode, sync and async.

Each case builds one store (memory, Qdrant local, PostgreSQL JSON and JSONB, Chroma) holding a
document of three chunks and one other chunk, grants a user by re-tag, sees them returned in
OFF, SHADOW and ENFORCE, sync and async; revokes by re-tag (by node id or by document) and sees
them never returned in any of the six, while the other reader still gets them.
"""

from __future__ import annotations

import pytest
from llama_index.core import VectorStoreIndex

from llama_jev import CandidateSelector, ExecutionOptions, JevRetriever, Mode, RuntimeContext
from llama_jev.stores import aretag, retag
from llama_jev.systemone.judge import ScriptedJudge

from .retag_support import ACL, KINDS, QUERY, built, chunks

REVOKED = RuntimeContext(user_id="u-revoked", tenant_id="acme")
KEPT = RuntimeContext(user_id="u-kept", tenant_id="acme")
MODES = [Mode.OFF, Mode.SHADOW, Mode.ENFORCE]


async def _returned(index: VectorStoreIndex, prefilter: bool, ctx: RuntimeContext) -> list[set[str]]:
    """The ids returned to ``ctx`` in each mode, sync then async (12 answers)."""
    answers = []
    for mode in MODES:
        selector = CandidateSelector(ScriptedJudge(lambda s, q, i: 0.95), ExecutionOptions(mode=mode))
        retriever = JevRetriever.from_index(index, selector, ACL, candidate_limit=20, top_k=20, prefilter=prefilter)
        assert retriever.prefilter is prefilter
        answers.append({hit.node.node_id for hit in retriever.retrieve(QUERY, ctx=ctx)})
        answers.append({hit.node.node_id for hit in await retriever.aretrieve(QUERY, ctx=ctx)})
    return answers


@pytest.mark.parametrize("by", ["node", "document"])
@pytest.mark.parametrize("prefilter", [True, False], ids=["pushdown", "post-filter"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_revoked_reader_never_gets_the_nodes_on_the_next_query(
    kind: str, prefilter: bool, by: str, request: pytest.FixtureRequest
) -> None:
    document = chunks("doc-a", 3)
    other = chunks("doc-b", 1, start=3)
    with built(kind, [*document, *other], request) as (target, index):
        ids = {node.node_id for node in document}
        select = {"document_ids": ["doc-a"]} if by == "document" else {"node_ids": sorted(ids)}
        granted = retag(target, {"users": ["u-revoked", "u-kept"]}, acl=ACL, **select)
        assert (granted.matched, granted.changed) == (3, 3)
        assert all(answer == ids for answer in await _returned(index, prefilter, REVOKED))

        # Revoked by the async twin for node ids, the sync one for documents: both paths write.
        if by == "node":
            revoked = await aretag(target, {"users": ["u-kept"]}, acl=ACL, **select)
        else:
            revoked = retag(target, {"users": ["u-kept"]}, acl=ACL, **select)
        assert (revoked.matched, revoked.changed) == (3, 3)
        assert all(answer == set() for answer in await _returned(index, prefilter, REVOKED))
        assert all(answer == ids for answer in await _returned(index, prefilter, KEPT))
