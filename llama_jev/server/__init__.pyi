"""The judge server: the System One protocol as an ASGI application, run on uvicorn by
``python -m llama_jev.serve``."""

from llama_jev.server.app import JudgeServer as JudgeServer
from llama_jev.server.app import create_app as create_app
from llama_jev.server.exchange import Exchange as Exchange
from llama_jev.server.uncertain import UncertainElsewhere as UncertainElsewhere
