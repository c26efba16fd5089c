"""What the examples tell a newcomer to do next, and their ``--help`` (issue 36).

The examples' docstrings are their ``--help`` text; the advice after a run depends on the judge
it used. Real parts only: the example's own commands, in this process, against the System One
test server on 127.0.0.1 (with a key, as TypeSafe's would need).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from examples import agent_search_knowledge
from examples.plain_text import plain
from examples.refund_policy import calibrate as calibrate_example
from examples.refund_policy import ingest, models
from examples.refund_policy import query as query_example
from llama_jev.testing import SystemOneTestServer

_MARKUP = re.compile(r"``|:(class|func|mod|meth|attr):`")

COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "python -m examples.refund_policy": lambda argv: query_example.main(argv, ingest_if_missing=True),
    "python -m examples.refund_policy.query": query_example.main,
    "python -m examples.refund_policy.ingest": ingest.main,
    "python -m examples.refund_policy.calibrate": calibrate_example.main,
    "python -m examples.agent_search_knowledge": agent_search_knowledge.main,
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_shows_plain_text_not_rest_markup(command: str) -> None:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), pytest.raises(SystemExit) as exited:
        COMMANDS[command](["--help"])
    assert exited.value.code == 0
    text = output.getvalue()
    assert text.startswith(f"usage: {command}")
    assert not _MARKUP.search(text), text


def test_the_calibrate_walkthrough_keeps_its_numbered_steps_on_their_own_lines() -> None:
    output = io.StringIO()
    with contextlib.redirect_stdout(output), pytest.raises(SystemExit):
        calibrate_example.main(["--help"])
    lines = output.getvalue().splitlines()
    for step in ("1. SHADOW:", "2. Label:", "3. Calibrate:", "4. ENFORCE"):
        assert any(line.startswith(step) for line in lines), step


def test_plain_turns_roles_and_literals_into_text() -> None:
    assert plain("``python -m x`` and :class:`~llama_jev.JevRetriever`") == "python -m x and JevRetriever"
    assert plain(":func:`llama_jev.calibration.calibrate`") == "llama_jev.calibration.calibrate"
    assert plain(None) == ""


# --- next steps, per judge ------------------------------------------------------------------------

ENVIRONMENTS = {
    "jev": {"TYPESAFE_API_KEY": "sk-test"},
    "keyed-server": {"TYPESAFE_API_KEY": "sk-test", "TYPESAFE_BASE_URL": "http://127.0.0.1:9"},
    "server": {"TYPESAFE_BASE_URL": "http://127.0.0.1:9"},
}


@pytest.mark.parametrize("kind", list(ENVIRONMENTS))
def test_next_steps_never_say_to_set_what_is_set(kind: str) -> None:
    environ = ENVIRONMENTS[kind]
    judge = models.choose_judge(environ=environ)
    assert judge.kind == kind
    advice = query_example.next_steps(judge)
    assert advice.startswith("Next steps:")
    assert "python -m examples.refund_policy.calibrate" in advice
    if "TYPESAFE_API_KEY" in environ:
        assert "Set TYPESAFE_API_KEY" not in advice
    if kind == "jev":
        assert "TYPESAFE" not in advice  # Jev judged: nothing to switch
    if kind == "keyed-server":
        assert "Unset TYPESAFE_BASE_URL" in advice
    if kind == "server":
        assert "Set TYPESAFE_API_KEY and unset TYPESAFE_BASE_URL" in advice


def test_next_steps_for_the_offline_judge_offer_jev_and_the_server() -> None:
    for kind in ("local", "scripted"):
        advice = query_example.next_steps(models.Choice(object(), "a judge", kind=kind))
        assert "Set TYPESAFE_API_KEY to judge with TypeSafe's Jev" in advice
        assert "python -m llama_jev.serve --judge local" in advice


@pytest.mark.slow  # runs the example (ingestion, the embedding model)
def test_against_a_keyed_server_the_walkthrough_does_not_ask_for_the_key_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QDRANT_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with SystemOneTestServer(lambda state, qid, ins: 0.9, api_key="sk-test") as server:
        monkeypatch.setenv("TYPESAFE_API_KEY", "sk-test")
        monkeypatch.setenv("TYPESAFE_BASE_URL", server.base_url)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            status = query_example.main(["--storage", str(tmp_path), "--user", "alice"], ingest_if_missing=True)
        assert server.request_count > 0
    text = output.getvalue()
    assert status == 0, text
    assert f"the System One server at {server.base_url}" in text
    assert "NOT Jev" not in text  # the banner drops the caveat: this is a keyed server
    next_steps = text[text.index("Next steps:") :]
    assert "Set TYPESAFE_API_KEY" not in next_steps
    assert "Unset TYPESAFE_BASE_URL" in next_steps
