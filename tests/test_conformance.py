"""Cross-checks against jevcompat, an independent conformance suite for System One servers.

The test server must pass the whole spec; JevClient must parse what a spec-exact server (the
jevcompat mock) answers and refuse every answer that breaks the spec's response rules.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llama_jev import JevClient, JevError, RetryPolicy
from llama_jev.errors import JevInvalidResponseError
from llama_jev.systemone import ChoiceQuestion, NoulQuestion, ScoreQuestion, SystemOneRequest
from llama_jev.testing import SystemOneTestServer

JEVCOMPAT = shutil.which("jevcompat", path=str(Path(sys.executable).parent)) or shutil.which("jevcompat")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(JEVCOMPAT is None, reason="jevcompat is part of the test extra")]

REQUEST = SystemOneRequest(
    state="I was charged twice for order 1042 and want my money back.",
    questions={
        "refund": NoulQuestion(instructions="Does the customer ask for a refund?"),
        "topic": ChoiceQuestion(instructions="What is it about?", criteria={"Billing": None, "Shipping": "Delivery"}),
        "urgency": ScoreQuestion(instructions="How urgent?", criteria=["Can wait", "This week", "Today"]),
    },
)


def test_the_test_server_is_conformant(tmp_path: Path) -> None:
    with SystemOneTestServer() as server:
        run = subprocess.run(
            [str(JEVCOMPAT), "test", server.base_url, "--json", str(tmp_path / "report.json")],
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert run.returncode == 0, run.stdout[-4000:]
    assert "MUST 32/32" in run.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def mock(request: pytest.FixtureRequest) -> Iterator[str]:
    """A jevcompat mock server on 127.0.0.1, with the faults the test names (``indirect``)."""
    faults = getattr(request, "param", ())
    port = _free_port()
    command = [str(JEVCOMPAT), "mock", "--host", "127.0.0.1", "--port", str(port)]
    for fault in faults:
        command += ["--fault", fault]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the jevcompat mock did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def _client(base_url: str) -> JevClient:
    return JevClient(api_key="conformance", base_url=base_url, retry=RetryPolicy(max_retries=0))


def test_client_parses_every_answer_type_of_a_spec_exact_server(mock: str) -> None:
    with _client(mock) as client:
        result = client.system_one(REQUEST)
    assert 0.0 <= result.noul("refund") <= 1.0
    assert result.answers["topic"].type == "choice"
    assert result.answers["urgency"].type == "score"


@pytest.mark.parametrize(
    "mock",
    [
        ("xssi-200",),
        ("first-question-only",),
        ("extra-answer",),
        ("boolean-type",),
        ("noul-range",),
        ("no-usage",),
        ("float-usage",),
        ("choice-no-confidence",),
        ("choice-key-case",),
        ("choice-sum",),
        ("choice-second",),
        ("score-no-legend",),
        ("legend-1-based",),
        ("score-keys-1-based",),
        ("score-sum",),
        ("score-argmax",),
        ("confidence-over",),
    ],
    indirect=True,
    ids=lambda faults: faults[0],
)
def test_client_refuses_answers_that_break_the_spec(mock: str) -> None:
    with _client(mock) as client, pytest.raises(JevInvalidResponseError):
        client.system_one(REQUEST)


@pytest.mark.parametrize("mock", [("forbid-extra",), ("reject-array-state",)], indirect=True, ids=lambda f: f[0])
def test_client_requests_pass_strict_servers(mock: str) -> None:
    # Our requests carry no unknown fields, so a server that forbids them still answers.
    with _client(mock) as client:
        try:
            client.system_one(REQUEST)
        except JevError as error:  # pragma: no cover - a failure message worth reading
            pytest.fail(f"a spec-exact request was refused: {error}")
