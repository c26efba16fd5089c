"""``JsonlObserver``: append one decision record per line to a calibration log."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from llama_jev.core.records import DecisionRecord

if TYPE_CHECKING:
    from llama_jev.core.identity import RuntimeContext

__all__ = ["JsonlObserver"]

try:  # POSIX: serialise writers across processes too
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class JsonlObserver:
    """An observer that appends each :class:`DecisionRecord` as one JSON line to ``path``.

    Safe under concurrent writers: each record is written with a single ``write`` on a file opened
    in append mode, under a thread lock and (on POSIX) an exclusive ``flock``, so lines from
    threads or processes never interleave. Records hold ids and probabilities only, so the log can
    be kept wherever node ids may be. Pass ``include_user=True`` to add the caller's ``user_id``
    and ``tenant_id`` (never other context attributes).

    Example:
        >>> options = ExecutionOptions(mode=Mode.SHADOW, observer=JsonlObserver("decisions.jsonl"))  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str], *, include_user: bool = False) -> None:
        self.path = Path(path)
        self.include_user = include_user
        self._lock = threading.Lock()

    def __call__(self, ctx: RuntimeContext | None, record: DecisionRecord) -> None:
        """Append ``record`` (one line)."""
        entry = record.model_dump(mode="json")
        if self.include_user and ctx is not None:
            entry.update(user_id=ctx.user_id, tenant_id=ctx.tenant_id)
        data = (json.dumps(entry, allow_nan=False) + "\n").encode("utf-8")
        with self._lock:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if fcntl is not None:
                    fcntl.flock(descriptor, fcntl.LOCK_EX)
                os.write(descriptor, data)
            finally:
                os.close(descriptor)  # closing the descriptor releases the flock

    def read(self) -> list[DecisionRecord]:
        """The records written so far, oldest first (identity fields, if any, are left out)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                entry.pop("user_id", None)
                entry.pop("tenant_id", None)
                records.append(DecisionRecord.model_validate(entry))
        return records
