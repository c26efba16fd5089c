"""Docstrings as ``--help`` text: the reST markup a terminal would show literally, taken out.

The examples' module docstrings are their ``--help`` descriptions; written for Sphinx, they hold
``double backticks`` and roles such as :class:`~llama_jev.JevRetriever`, which argparse prints as
they are.
"""

from __future__ import annotations

import re

# :class:`~llama_jev.JevRetriever` -> JevRetriever; :func:`llama_jev.calibration.calibrate` -> the full path
_ROLE = re.compile(r":[a-z]+:`(?P<tilde>~?)(?P<target>[^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match["target"]
    return target.rsplit(".", 1)[-1] if match["tilde"] else target


def plain(doc: str | None) -> str:
    """``doc`` with reST roles and ````literals```` turned into plain text, for a terminal.

    Example:
        >>> plain("Run ``python -m x``; see :class:`~llama_jev.JevRetriever`.")
        'Run python -m x; see JevRetriever.'
    """
    text = _ROLE.sub(_role, doc or "")
    return text.replace("``", "")
