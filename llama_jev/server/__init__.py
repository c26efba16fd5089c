"""The judge server: the System One protocol as an ASGI application (:func:`create_app`), which
``python -m llama_jev.serve`` runs on uvicorn and ``llama_jev.testing.SystemOneTestServer`` runs
in a thread (extra ``serve``: starlette, uvicorn, prometheus-client)."""

from llama_jev.server.app import JudgeServer, create_app
from llama_jev.server.exchange import Exchange
from llama_jev.server.uncertain import UncertainElsewhere

__all__ = ["Exchange", "JudgeServer", "UncertainElsewhere", "create_app"]
