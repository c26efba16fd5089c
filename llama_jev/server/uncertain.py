"""``UncertainElsewhere``: a judge that answers what it can and is uncertain on the rest, as
``python -m llama_jev.serve`` serves the offline judge; and why it was uncertain, by cause, so a
request the judge cannot read is seen (log line, metric, response header), never silent."""

from __future__ import annotations

import asyncio
from collections import Counter
from importlib import metadata
from typing import Final

from llama_jev.core.errors import JevBadRequestError
from llama_jev.server.protocol import uniform_answers
from llama_jev.systemone.judge import Judge, answer_request
from llama_jev.systemone.wire import Answer, SystemOneRequest, SystemOneResult, Usage, check_result

__all__ = ["UNCERTAIN_CAUSES", "UncertainElsewhere"]

UNCERTAIN_CAUSES: Final = {
    "state": 'the state is neither the query text nor an object with a "query" text',
    "question": "not a relevance question shaped like the selector's",
}
"""Why a candidate got the uncertain answer: the cause (a metric label, a header value) and what it means."""


def llama_jev_version() -> str:
    """The installed llama_jev's version (``"unknown"`` when run from a tree that is not installed)."""
    try:
        return metadata.version("llama-jev")
    except metadata.PackageNotFoundError:
        return "unknown"


class UncertainElsewhere:
    """A :class:`~llama_jev.Judge` that asks ``judge`` the questions it can answer, and is uncertain on the rest.

    ``judge`` must have ``candidate(question_id, question)`` raising
    :class:`~llama_jev.JevBadRequestError` for a question it cannot answer (as
    :class:`~llama_jev.local.LocalRelevanceJudge` has), and may have ``query(state)`` raising it
    for a state it cannot read (without one, only a text state is read). The other questions get
    0.5 (noul) or a uniform distribution (choice, score): "don't know", not a guess.
    :meth:`uncertain` says, by cause, how many of a request's candidates get that answer.

    Example:
        >>> from llama_jev.local import LocalRelevanceJudge
        >>> served = UncertainElsewhere(LocalRelevanceJudge())  # doctest: +SKIP
    """

    def __init__(self, judge: Judge) -> None:
        if not callable(getattr(judge, "candidate", None)):
            raise TypeError("the judge must say which questions it answers (a candidate() method)")
        self.judge = judge
        self.model = str(getattr(judge, "model", "local"))

    def __repr__(self) -> str:
        return f"UncertainElsewhere({self.judge!r})"

    @property
    def description(self) -> str:
        """What ``GET /v1/models`` says of the model: the judge, its version, and the rule for the rest."""
        return (
            f"{type(self.judge).__name__} {self.model} (llama_jev {llama_jev_version()}): judges the selector's "
            "relevance questions; answers any other question 0.5 (uncertain)"
        )

    def _reads_state(self, request: SystemOneRequest) -> bool:
        query = getattr(self.judge, "query", None)
        if not callable(query):
            return isinstance(request.state, str)
        try:
            query(request.state)
        except JevBadRequestError:
            return False
        return True

    def _causes(self, request: SystemOneRequest) -> dict[str, str | None]:
        """Each question's cause of uncertainty (``None``: the judge answers it)."""
        if not self._reads_state(request):
            return dict.fromkeys(request.questions, "state")
        causes: dict[str, str | None] = {}
        for question_id, question in request.questions.items():
            try:
                self.judge.candidate(question_id, question)  # type: ignore[attr-defined]
            except JevBadRequestError:
                causes[question_id] = "question"
                continue
            causes[question_id] = None
        return causes

    def uncertain(self, request: SystemOneRequest) -> dict[str, int]:
        """How many of ``request``'s candidates get the uncertain answer, by cause (see :data:`UNCERTAIN_CAUSES`).

        Example:
            >>> from llama_jev.local import LocalRelevanceJudge  # doctest: +SKIP
            >>> UncertainElsewhere(LocalRelevanceJudge()).uncertain(request)  # doctest: +SKIP
            {'state': 3}
        """
        return dict(Counter(cause for cause in self._causes(request).values() if cause is not None))

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request``: the judge's questions by the judge, the others uncertain."""
        causes = self._causes(request)
        answerable = [qid for qid, cause in causes.items() if cause is None]
        answers: dict[str, Answer] = {}
        if answerable:
            asked = SystemOneRequest(state=request.state, questions={qid: request.questions[qid] for qid in answerable})
            answers.update(self.judge.system_one(asked, timeout=timeout).answers)
        rest = {qid: question for qid, question in request.questions.items() if causes[qid] is not None}
        if rest:
            uncertain = SystemOneRequest(state=request.state, questions=rest)
            answers.update(answer_request(uncertain, uniform_answers(uncertain), model=self.model).answers)
        result = SystemOneResult(model=self.model, answers=answers, usage=Usage(input_tokens=0, output_tokens=0))
        return check_result(request, result)

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, in a worker thread."""
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)
