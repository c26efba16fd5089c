"""When every judgement of a run failed, the example says why and exits 1.

SHADOW keeps serving when the judge fails (a wrong key, a server that is not running), so a run
whose every judgement failed still prints passages and would exit 0: it looks fine unless one
reads the warnings. The examples watch the judge failures the package reports (the SHADOW
warning's fields on the ``llama_jev`` logger, ENFORCE's ``RetrievalUnavailableError``) and the
decision records, and end with one line on stderr and exit status 1 when nothing was judged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from llama_jev import DecisionRecord, RetrievalUnavailableError, Status
from llama_jev.engine.pipeline import JudgeFailure

__all__ = ["EXIT_EVERY_JUDGEMENT_FAILED", "FailureWatch", "watching_failures"]

EXIT_EVERY_JUDGEMENT_FAILED = 1


class FailureWatch(logging.Handler):
    """Collects the facts of each judge failure (reason, error class, status; never text)."""

    def __init__(self, *, echo: bool = False) -> None:
        super().__init__(level=logging.WARNING)
        self.failures: list[JudgeFailure] = []
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        if self.echo and logging.lastResort is not None:
            # Python prints warnings to stderr only while no handler exists; this one must not
            # silence them.
            logging.lastResort.handle(record)
        reason = getattr(record, "jev_reason", None)
        if isinstance(reason, str):
            self.failures.append(
                JudgeFailure(
                    reason=reason,
                    error_type=str(getattr(record, "jev_error_type", "unknown error")),
                    status_code=getattr(record, "jev_status_code", None),
                    retryable=bool(getattr(record, "jev_retryable", False)),
                )
            )

    def add(self, error: RetrievalUnavailableError) -> None:
        """An ENFORCE failure, from the error the retriever raised."""
        self.failures.append(
            JudgeFailure(
                reason=error.reason,
                error_type=error.error_type or "unknown error",
                status_code=error.status_code,
                retryable=error.retryable,
            )
        )

    def every_judgement_failed(self, records: Iterable[DecisionRecord], errors: Iterable[str] = ()) -> str | None:
        """The line to print when the run judged nothing at all, else ``None``.

        Every judgement failed when there were decision records and each one is an ``ERROR``
        (a run with no judgement at all, mode OFF, is not a failure). ``errors``: failure messages
        the example saw itself (an agent's tool error), used when no failure was reported here.
        """
        records = list(records)
        if not records or any(record.status is not Status.ERROR for record in records):
            return None
        if self.failures:
            # The error's message names the failure, then what to do; the summary already names it.
            advice = self.failures[0].message().split("searched to a conclusion. ", 1)[-1]
            why = "; ".join(dict.fromkeys(failure.summary for failure in self.failures)) + f". {advice}"
        else:
            seen = list(dict.fromkeys(errors))
            why = seen[0] if seen else ", ".join(sorted({record.reason.value for record in records}))
        return (
            f"Every judgement failed ({len(records)} of {len(records)} decision records are errors), so nothing "
            f"above was judged: {why}"
        )


@contextmanager
def watching_failures() -> Iterator[FailureWatch]:
    """Collect the judge failures the package reports while the block runs."""
    watch = FailureWatch(echo=not logging.getLogger().handlers)
    logger = logging.getLogger("llama_jev")
    logger.addHandler(watch)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)
