from __future__ import annotations

from collections.abc import Iterator

import pytest

from llama_jev.testing import SystemOneTestServer

from .support import marked_answer

API_KEY = "sk-test-7f3a9c2e-secret"


@pytest.fixture
def jev_server() -> Iterator[SystemOneTestServer]:
    """A System One test server on 127.0.0.1 answering from ``[p=...]`` marks, key-protected."""
    with SystemOneTestServer(marked_answer, api_key=API_KEY) as server:
        yield server
