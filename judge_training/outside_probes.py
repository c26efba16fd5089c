"""A fit of the offline judge scored outside the labelled sets: what the tests and the example expect of it.

Run: ``python judge_training/outside_probes.py [--fit judge_training/trained/local_judge.json]`` (default: the
shipped fit). A trained fit names its delta by a file beside it. Printed, with the default 0.2/0.8:

- the tests' probes (``tests/test_local.py``, ``tests/test_local_trained.py``): plain short answers that
  must be selected, near misses that must be rejected;
- the example (``examples/refund_policy``): each document's p for its question "What are the refund
  conditions?" (Sam must receive the compensation rule; shipping and office hours are rejected);
- the example's golden set (``golden.json``: 30 questions against its 7 documents, 33 relevant
  pairs): relevant pairs selected, other pairs selected;
- a 2,000-token passage with the answer at its end, read in windows of 96 tokens (selected).

``ok`` says whether each figure holds what a test asserts; a fit that fails one fails that test.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.refund_policy import kb  # noqa: E402
from llama_jev.local.relevance import LocalRelevanceJudge, load_parameters  # noqa: E402

SHIPPING = "How long does shipping take?"
REFUND = "What are the refund conditions?"
OFFICE = "Our office is closed on public holidays. The support hotline opens at 9:00 CET."
FILLER = " ".join(
    [
        "Our office is closed on public holidays and the support hotline opens at nine in the morning.",
        "The warehouse team works in two shifts and the canteen serves lunch from noon.",
        "Parking is available behind the main building; visitors register at the front desk.",
        "The company newsletter is published every month with news from each department.",
    ]
    * 6
)
# (query, passage, what a test asserts: ">= 0.8" or "<= 0.2")
PROBES = [
    (SHIPPING, "Orders arrive within three to five business days.", ">= 0.8"),
    (SHIPPING, "Expect your order at your door two to four days after you buy it.", ">= 0.8"),
    (SHIPPING, "We ship with DHL from our Rotterdam warehouse.", "<= 0.2"),
    (SHIPPING, OFFICE, "<= 0.2"),
    (
        "How much does a swimming lesson for children cost?",
        "A course of ten swimming lessons for children costs 85 euros, including pool entry.",
        "> non-answer",
    ),
    (
        "How much does a swimming lesson for children cost?",
        "Adult swimming lessons cost 120 euros for a course of ten.",
        "<= 0.2",
    ),
    (
        "How do I cancel my newspaper subscription?",
        "Call our reader service or use the online form to end your subscription; it stops at the end of the "
        "current billing month.",
        "> non-answer",
    ),
    (
        "How do I cancel my newspaper subscription?",
        "You can suspend delivery of your newspaper while you are on holiday for up to four weeks.",
        "<= 0.2",
    ),
]


def load_fit(path: Path | None) -> dict[str, Any]:
    if path is None:
        return load_parameters()
    fit: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if "delta" in fit:
        fit["delta"] = {**fit["delta"], "file": str(path.resolve().parent / Path(fit["delta"]["file"]).name)}
    return fit


def holds(p: float, rule: str, other: float | None = None) -> bool:
    if rule == ">= 0.8":
        return p >= 0.8
    if rule == "<= 0.2":
        return p <= 0.2
    return other is not None and p > other


def measure(fit: dict[str, Any], make: Callable[..., Any] = LocalRelevanceJudge) -> dict[str, Any]:
    """The figures above for the judge ``make(parameters=fit)`` (``make(parameters=fit, window_tokens=96)``
    for the long passage): any object with ``probabilities(query, passages)``."""
    judge = make(parameters=fit)
    out: dict[str, Any] = {"model": fit["model"], "probes": []}
    for number, (query, passage, rule) in enumerate(PROBES):
        (p,) = judge.probabilities(query, [passage])
        # "> non-answer": above the near miss that follows it (tests/test_local_trained.py)
        other = judge.probabilities(query, [PROBES[number + 1][1]])[0] if rule == "> non-answer" else None
        row = {"query": query, "passage": passage[:60], "p": round(p, 3), "rule": rule, "ok": holds(p, rule, other)}
        out["probes"].append(row)
    documents = {document.key: document.text for document in kb.DOCUMENTS}
    example = dict(zip(documents, judge.probabilities(REFUND, list(documents.values())), strict=True))
    out["example"] = {key: round(p, 3) for key, p in example.items()}
    out["example_ok"] = {
        "sam receives the compensation rule (>= 0.8)": example["acme/compensation-rule"] >= 0.8,
        "the refund policy is not rejected (> 0.2)": example["acme/refund-policy"] > 0.2,
        "shipping and office hours rejected (<= 0.2)": example["acme/shipping"] <= 0.2
        and example["acme/office-hours"] <= 0.2,
    }
    golden = json.loads((ROOT / "examples" / "refund_policy" / "golden.json").read_text(encoding="utf-8"))
    relevant_selected = relevant = others_selected = others = 0
    for entry in golden:
        for key, p in zip(documents, judge.probabilities(entry["query"], list(documents.values())), strict=True):
            if key in entry["relevant"]:
                relevant += 1
                relevant_selected += p >= 0.8
            else:
                others += 1
                others_selected += p >= 0.8
    out["golden"] = f"{relevant_selected} of {relevant} relevant selected / {others_selected} of {others} others"
    narrow = make(parameters=fit, window_tokens=96)
    (p,) = narrow.probabilities(SHIPPING, [" ".join([FILLER] * 6) + " " + PROBES[0][1]])
    out["2000 tokens, 96-token windows"] = {"p": round(p, 3), "ok": p >= 0.8}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, help="a fit (local_judge.json); default: the shipped one")
    args = parser.parse_args()
    print(json.dumps(measure(load_fit(args.fit)), indent=1))


if __name__ == "__main__":
    main()
