"""The judge server: the System One protocol as an ASGI application (``create_app``), which
``python -m llama_jev.serve`` runs on uvicorn and ``llama_jev.testing.SystemOneTestServer`` runs
in a thread (extra ``serve``: starlette, uvicorn, prometheus-client).

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
