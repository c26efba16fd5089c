"""``UncertainElsewhere``: a judge that answers what it can and is uncertain on the rest, as
``python -m llama_jev.serve`` serves the offline judge."""

from __future__ import annotations

import asyncio

from llama_jev.core.errors import JevBadRequestError
from llama_jev.server.protocol import uniform_answers
from llama_jev.systemone.judge import Judge, answer_request
from llama_jev.systemone.wire import Answer, SystemOneRequest, SystemOneResult, Usage, check_result

__all__ = ["UncertainElsewhere"]


class UncertainElsewhere:
    """A :class:`~llama_jev.Judge` that asks ``judge`` the questions it can answer, and is uncertain on the rest.

    ``judge`` must have ``candidate(question_id, question)`` raising
    :class:`~llama_jev.JevBadRequestError` for a question it cannot answer (as
    :class:`~llama_jev.local.LocalRelevanceJudge` has). The other questions get 0.5 (noul) or a
    uniform distribution (choice, score): "don't know", not a guess. A request whose state is
    not text gets only such answers.

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

    def _answerable(self, request: SystemOneRequest) -> set[str]:
        if not isinstance(request.state, str):
            return set()
        answerable = set()
        for question_id, question in request.questions.items():
            try:
                self.judge.candidate(question_id, question)  # type: ignore[attr-defined]
            except JevBadRequestError:
                continue
            answerable.add(question_id)
        return answerable

    def system_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Answer ``request``: the judge's questions by the judge, the others uncertain."""
        answerable = self._answerable(request)
        answers: dict[str, Answer] = {}
        if answerable:
            asked = SystemOneRequest(state=request.state, questions={qid: request.questions[qid] for qid in answerable})
            answers.update(self.judge.system_one(asked, timeout=timeout).answers)
        rest = {qid: question for qid, question in request.questions.items() if qid not in answerable}
        if rest:
            uncertain = SystemOneRequest(state=request.state, questions=rest)
            answers.update(answer_request(uncertain, uniform_answers(uncertain), model=self.model).answers)
        result = SystemOneResult(model=self.model, answers=answers, usage=Usage(input_tokens=0, output_tokens=0))
        return check_result(request, result)

    async def asystem_one(self, request: SystemOneRequest, *, timeout: float | None = None) -> SystemOneResult:
        """Same as :meth:`system_one`, in a worker thread."""
        return await asyncio.to_thread(self.system_one, request, timeout=timeout)
