"""Contract of DESIGN.md Part 2, "The offline judge", as a user meets it.

``LocalRelevanceJudge()`` with no arguments, used through the selector with its defaults, and
the server ``python -m llama_jev.serve`` builds on the test server.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from typing import Any, NoReturn

import httpx
import pytest

import llama_jev.local.weights
from llama_jev import CandidateSelector, ExecutionOptions, JevClient, Mode, Status
from llama_jev.core import Reason
from llama_jev.engine import RELEVANCE_QUESTION, Candidate
from llama_jev.local import LocalRelevanceJudge
from llama_jev.testing import SystemOneTestServer

pytestmark = pytest.mark.slow  # the local model

pytest.importorskip("onnxruntime")

SHIPPING_QUERY = "How long does shipping to Canada take?"
ANSWER = "Orders to Canada usually arrive within five to eight business days."
OFFICE = "Our office cafeteria serves vegetarian lunch on Fridays."


def test_a_judge_just_constructed_needs_no_model_loading_in_its_first_judgement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Loading the model takes a second or more on a busy machine; inside the first judgement it
    # spent the default 2 s budget and the user's first retrieval timed out.
    judge = LocalRelevanceJudge()

    def no_loading(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("a model was loaded during a judgement")

    monkeypatch.setattr(llama_jev.local.weights, "_session", no_loading)
    monkeypatch.setattr(llama_jev.local.weights, "_tokenizer", no_loading)
    selector = CandidateSelector(judge, ExecutionOptions(mode=Mode.ENFORCE))

    decision = selector.select(
        SHIPPING_QUERY, RELEVANCE_QUESTION, [Candidate("answer", ANSWER), Candidate("office", OFFICE)]
    )

    assert (decision.status, decision.record.reason) == (Status.DECIDED, Reason.CLASSIFIED)
    assert decision.selection is not None
    assert decision.selection.selected == ("answer",)
    assert decision.selection.rejected == ("office",)


def test_a_server_that_keeps_no_requests_still_counts_them() -> None:
    # llama_jev.serve runs for days: it must not hold every request's text and key in memory.
    body = {"state": "q", "questions": {"a": {"type": "noul", "instructions": "passage text"}}}
    with SystemOneTestServer(lambda state, qid, ins: 0.9, keep_requests=False) as server:
        with httpx.Client() as client:
            answered = client.post(server.url, json=body, headers={"Authorization": "Bearer sk-secret"})
            refused = client.post(server.url, content=b"not json", headers={"Content-Type": "application/json"})

        assert (answered.status_code, refused.status_code) == (200, 400)
        assert server.requests == []
        assert "sk-secret" not in server.received_text()
        assert server.request_count == 2


def test_python_m_llama_jev_serve_judges_over_http_and_stops_on_ctrl_c() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_jev.serve", "--judge", "local", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/v1/systemone", banner)
        assert found, banner
        usage = server.stdout.readline()
        # The server asks for no key, and a client of a loopback address needs none (issue 18).
        with JevClient(base_url=found.group(1)) as client:
            selector = CandidateSelector(client, ExecutionOptions(mode=Mode.ENFORCE, budget=60.0))
            decision = selector.select(
                SHIPPING_QUERY, RELEVANCE_QUESTION, [Candidate("answer", ANSWER), Candidate("office", OFFICE)]
            )
        bad = httpx.post(f"{found.group(1)}/v1/systemone", content=b"{}", headers={"Content-Type": "application/json"})
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)  # a guard against a hang, not a measurement
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

    assert decision.selection is not None
    assert decision.selection.selected == ("answer",)
    assert decision.record.model == "local-relevance-v2"
    assert bad.status_code == 422
    assert (server.returncode, err) == (0, "")
    assert "stopped" in out
    # JevClient needs no key for this loopback server: the banner says so.
    assert f"TYPESAFE_BASE_URL={found.group(1)} (no TYPESAFE_API_KEY needed for a loopback address)" in usage
