"""The calibration contract as an outsider reads it (DESIGN Part 2 "Calibration"): found by an
independent audit, each test names the behaviour a user relies on."""

from __future__ import annotations

import re
from pathlib import Path

from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from llama_jev import (
    CandidateSelector,
    ExecutionOptions,
    JevClient,
    JevRetriever,
    MetadataAcl,
    Mode,
    RuntimeContext,
)
from llama_jev.calibration import GoldenQuery, calibrate, collect
from llama_jev.testing import SystemOneTestServer

from .calibration_support import overconfident_log
from .conftest import API_KEY
from .support import HashEmbedding, marked

ACL = MetadataAcl(tenant_key="tenant")
USER = RuntimeContext(user_id="qa", tenant_id="acme")


def test_collect_asks_the_question_the_retriever_was_built_with(
    jev_server: SystemOneTestServer, tmp_path: Path
) -> None:
    question = "Does this passage say how refunds are paid?"
    index = VectorStoreIndex(
        [TextNode(id_=f"doc{i}", text=marked(0.9, f"passage {i}"), metadata={"tenant": "acme"}) for i in range(3)],
        embed_model=HashEmbedding(),
    )
    judge = JevClient(api_key=API_KEY, base_url=jev_server.base_url)
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE))
    retriever = JevRetriever.from_index(index, selector, ACL, top_k=3, question=question)
    assert retriever.question == question

    collect(retriever, [GoldenQuery("how are refunds paid?", {"doc0"})], ctx=USER)

    asked = {
        item["instructions"]["question"]
        for request in jev_server.requests
        if request.json is not None
        for item in request.json["questions"].values()
    }
    assert asked == {question}


def test_report_html_holds_no_url_at_all() -> None:
    records, labels = overconfident_log(60, seed=5)
    page = calibrate(records, labels).to_html()
    assert "<svg" in page
    assert "<script" not in page.lower()
    assert re.search(r"https?://", page) is None  # not even an xmlns: nothing a strict checker could fetch
