"""The labelling page (``python -m llama_jev.label``) in a real headless Chromium: a person's keys,
a server killed mid-way, a restart that resumes with nothing lost or duplicated."""

from __future__ import annotations

import csv
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llama_jev.calibration import load_labels
from llama_jev.calibration.labelling import LabellingSession, StalePageError, read_sheet

from .browser import Browser, LabelServer, Page, answer, find_chromium, open_page

pytestmark = pytest.mark.slow  # a headless browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="Chromium is not installed (.ci/run installs it)"
)

PAIRS = [
    ("d1", "refund", "What are the refund conditions?", "Refunds are paid within 14 days if the item is unused."),
    ("d1", "holidays", "What are the refund conditions?", "The office is closed on public holidays."),
    ("d2", "shipping", "How long does shipping to Norway take?", "Delivery to Norway takes 3 to 5 working days."),
    (
        "d2",
        "refund",
        "How long does shipping to Norway take?",
        "Refunds are paid within 14 days if the item is unused.",
    ),
    ("d3", "address", "Can I change my delivery address?", "Change the address under Orders until it ships."),
    ("d3", "cookies", "Can I change my delivery address?", "We use cookies to remember your language."),
    ("d4", "warranty", "How long is the warranty?", "Every device carries a two-year warranty."),
    ("d4", "shipping", "How long is the warranty?", "Delivery to Norway takes 3 to 5 working days."),
]


def write_sheet(path: Path, *, delimiter: str = ";") -> Path:
    """A sheet as a spreadsheet in a European locale saves it: ';'-separated, with a BOM."""
    with path.open("w", encoding="utf-8-sig", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(["decision_id", "node_id", "question", "passage", "relevant"])
        writer.writerows([*row, ""] for row in PAIRS)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("CI needs Chromium: .ci/run installs Debian's chromium")
    opened = Browser(CHROMIUM)
    try:
        yield opened
    finally:
        opened.close()


def shown(page: Page) -> tuple[str, str, str]:
    return (
        page.evaluate("document.getElementById('count').textContent"),
        page.evaluate("document.getElementById('question').textContent"),
        page.evaluate("document.getElementById('passage').textContent"),
    )


@needs_chromium
def test_a_person_labels_with_keys_survives_a_killed_server_and_resumes(browser: Browser, tmp_path: Path) -> None:
    sheet, out = write_sheet(tmp_path / "sheet.csv"), tmp_path / "labels.jsonl"
    page = browser.page()
    server = LabelServer(sheet, out)
    try:
        open_page(page, server.url)
        assert shown(page) == ("0 / 8", PAIRS[0][2], PAIRS[0][3])
        for key in "yns":
            answer(page, key)
        answer(page, "b")  # back to the skipped pair ...
        assert "you skipped it" in page.text()
        answer(page, "n")  # ... and answered after all
        assert shown(page) == ("3 / 8", PAIRS[3][2], PAIRS[3][3])
        server.kill()  # no goodbye: a crash, a closed laptop

        server = LabelServer(sheet, out)
        assert "3 of 8 pairs done" in server.banner
        open_page(page, server.url)
        assert shown(page) == ("3 / 8", PAIRS[3][2], PAIRS[3][3])  # where it stopped
        for key in "nyny":
            answer(page, key)
        answer(page, "y")
        assert page.evaluate("document.getElementById('done').hidden") is False
        text = page.text()
        assert "All pairs labelled" in text
        command = page.evaluate("document.getElementById('next').textContent").replace("\\\n    ", "")
        # no --records given: a placeholder in capitals, and the page says what it stands for
        assert command == f"python -m llama_jev.calibrate --records DECISIONS.jsonl --labels {out} --report report.html"
        assert "start the labelling app with --records PATH" in page.text()
    finally:
        server.stop()

    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    # one line per answer, one correction (the skip turned into an answer): nothing lost or doubled
    assert len(lines) == 9
    assert all(line["labeller"] == "ana" for line in lines)
    labels, unlabelled = load_labels(out)
    got = {(label.decision_id, label.node_id): label.relevant for label in labels}
    assert got == {
        ("d1", "refund"): True,
        ("d1", "holidays"): False,
        ("d2", "shipping"): False,  # the skip, replaced
        ("d2", "refund"): False,
        ("d3", "address"): True,
        ("d3", "cookies"): False,
        ("d4", "warranty"): True,
        ("d4", "shipping"): True,
    }
    assert unlabelled == 0
    assert "0." not in out.read_text()  # no p anywhere near the labeller


@needs_chromium
def test_the_page_never_shows_p_and_keeps_the_question_in_view(browser: Browser, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.csv"
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["decision_id", "node_id", "question", "passage", "relevant", "p"])
        writer.writerow(["d1", "long", "What are the refund conditions?", "A long passage. " * 400, "", "0.8731"])
    page = browser.page()
    server = LabelServer(sheet, tmp_path / "labels.jsonl")
    try:
        open_page(page, server.url)
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        assert "0.8731" not in page.evaluate("document.documentElement.outerHTML")
        top = page.evaluate("document.getElementById('question').getBoundingClientRect().top")
        assert 0 <= top < 900  # scrolled to the end of a long passage, the question is still on screen
    finally:
        server.stop()


def test_a_line_cut_by_a_crash_is_dropped_on_restart(tmp_path: Path) -> None:
    sheet, out = write_sheet(tmp_path / "sheet.csv", delimiter="\t"), tmp_path / "labels.jsonl"
    session = LabellingSession(read_sheet(sheet), out, "ana")
    session.answer(0, session.pairs[0].key, True)
    session.close()
    with out.open("a", encoding="utf-8") as handle:
        handle.write('{"decision_id": "d1", "node_id": "holi')  # the power went mid-write
    resumed = LabellingSession(read_sheet(sheet), out, "ana")
    assert resumed.state()["labelled"] == 1
    assert resumed.position == 1
    resumed.close()
    assert load_labels(out).unlabelled == 0


def test_an_answer_from_a_stale_page_is_refused(tmp_path: Path) -> None:
    session = LabellingSession(read_sheet(write_sheet(tmp_path / "sheet.csv")), tmp_path / "labels.jsonl", "ana")
    session.answer(0, session.pairs[0].key, False)
    with pytest.raises(StalePageError):
        session.answer(0, session.pairs[0].key, True)  # a second tab still showing the first pair
    session.close()


def test_two_labellers_share_a_file_and_each_resumes_on_their_own(tmp_path: Path) -> None:
    sheet, out = write_sheet(tmp_path / "sheet.csv"), tmp_path / "labels.jsonl"
    ana = LabellingSession(read_sheet(sheet), out, "ana")
    for pair in ana.pairs[:3]:
        ana.answer(ana.position, pair.key, True)
    ana.close()
    ben = LabellingSession(read_sheet(sheet), out, "ben")
    assert ben.position == 0
    ben.close()


def test_the_server_answers_only_to_its_own_address(tmp_path: Path) -> None:
    import http.client

    from llama_jev.label import serve

    session = LabellingSession(read_sheet(write_sheet(tmp_path / "sheet.csv")), tmp_path / "labels.jsonl", "ana")
    server = serve(session)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        for host, status in ((f"127.0.0.1:{port}", 200), (f"evil.example:{port}", 403)):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/api/state", headers={"Host": host})
            response = connection.getresponse()
            body = response.read()
            connection.close()
            assert response.status == status, body
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/api/answer", body="position=0", headers={"Content-Type": "text/plain"})
        assert connection.getresponse().status == 415  # a cross-site form cannot post an answer
        connection.close()
    finally:
        server.shutdown()
        server.server_close()
        session.close()
    assert server.server_address[0] == "127.0.0.1"


@needs_chromium
def test_on_a_phone_the_header_stays_one_line_and_the_keys_cover_nothing(browser: Browser, tmp_path: Path) -> None:
    sheet = tmp_path / "sheet.csv"
    with sheet.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["decision_id", "node_id", "question", "passage", "relevant"])
        writer.writerow(["d1", "long", "What are the refund conditions for the winter sale?", "Unused. " * 300, ""])
    records = tmp_path / "my log" / "decisions 2024.jsonl"
    page = browser.page(width=390, height=844)
    server = LabelServer(sheet, tmp_path / "labels.jsonl", "ana-with-a-long-name", "--records", str(records))
    try:
        open_page(page, server.url)
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        box = "document.querySelector({!r}).getBoundingClientRect()"
        line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('.count')).lineHeight)")
        assert page.evaluate(box.format(".top") + ".height") < 1.5 * line  # one line: nothing wraps
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing runs off the side
        # scrolled to the end, the question under the passage sits above the keys, not under them
        ask_bottom = page.evaluate(box.format("#pair .ask") + ".bottom")
        keys_top = page.evaluate(box.format("footer") + ".top")
        assert ask_bottom <= keys_top
        assert keys_top < 844  # and the keys are on screen
        answer(page, "y")
        command = page.evaluate("document.getElementById('next').textContent").replace("\\\n    ", "")
        assert f"--records '{records}'" in command  # the file given, quoted for the shell
        assert page.evaluate("document.getElementById('records-note').hidden") is True
        assert page.evaluate(box.format("#done pre") + ".right") <= 390
    finally:
        server.stop()


@needs_chromium
@pytest.mark.parametrize("width", [390, 1280])
def test_a_short_labeller_name_is_shown_whole_at_any_width(browser: Browser, tmp_path: Path, width: int) -> None:
    # issue 36: at 390 px the header cut "ana" to "a…" while the title kept its room
    page = browser.page(width=width, height=844)
    server = LabelServer(write_sheet(tmp_path / "sheet.csv"), tmp_path / "labels.jsonl", "ana")
    try:
        open_page(page, server.url)
        who = "document.getElementById('who')"
        assert page.evaluate(f"{who}.textContent") == "· ana"
        text = page.evaluate(f"(() => {{ const r = document.createRange(); r.selectNodeContents({who}); "
                             "return r.getBoundingClientRect().width; })()")  # fmt: skip
        assert page.evaluate(f"{who}.getBoundingClientRect().width") >= text - 0.01  # no ellipsis
        line = page.evaluate("parseFloat(getComputedStyle(document.querySelector('.count')).lineHeight)")
        assert page.evaluate("document.querySelector('.top').getBoundingClientRect().height") < 1.5 * line
    finally:
        server.stop()
