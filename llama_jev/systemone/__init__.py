"""Layer 3, the System One client: the wire models, the HTTP client, the client-wide governor
and the ``Judge`` protocol every judge (remote, scripted, offline) speaks.

Names are listed once, in ``__init__.pyi``, and load on first use.
"""

from llama_jev._exports import attach

__getattr__, __dir__, __all__ = attach(__name__, __file__)
